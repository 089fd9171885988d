-- Turnstile SQLite schema, version 6: semaphore groups (turnstile/_core/lock_machine.py):
-- a name with per_key keeps at most per_key holders per key (lim is then the total).
-- Applied inside BEGIN IMMEDIATE by the migration runner, which then sets PRAGMA user_version.

ALTER TABLE turnstile_names ADD COLUMN per_key INTEGER;
ALTER TABLE turnstile_holders ADD COLUMN group_key TEXT;
ALTER TABLE turnstile_waiters ADD COLUMN group_key TEXT;
