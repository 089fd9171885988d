-- Turnstile SQLite schema, version 8: a rate limit's step reads only the rows of its line it
-- needs (stores/sqlite/rate_store.py, StoredRate), as a lock's does since version 7: the
-- expired entries (a purge) and the newest stamp (a join) go through indexes, besides the
-- holder (UNIQUE (name, holder)) and the line's order (turnstile_rate_waiters_by_name).
-- Applied inside BEGIN IMMEDIATE by the migration runner, which then sets PRAGMA user_version.

CREATE INDEX turnstile_rate_waiters_by_expiry ON turnstile_rate_waiters (name, expires_at);
CREATE INDEX turnstile_rate_waiters_by_stamp ON turnstile_rate_waiters (name, joined_at);
