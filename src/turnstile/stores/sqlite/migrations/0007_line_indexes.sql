-- Turnstile SQLite schema, version 7: a step reads only the rows of a line it needs
-- (stores/sqlite/lock_store.py, StoredName), so what it asks of the line goes through
-- indexes: the expired entries (a purge) and the newest stamp (a join), besides the holder
-- (UNIQUE (name, holder)) and the line's order (turnstile_waiters_by_name).
-- Applied inside BEGIN IMMEDIATE by the migration runner, which then sets PRAGMA user_version.

CREATE INDEX turnstile_waiters_by_expiry ON turnstile_waiters (name, expires_at);
CREATE INDEX turnstile_waiters_by_stamp ON turnstile_waiters (name, joined_at);
