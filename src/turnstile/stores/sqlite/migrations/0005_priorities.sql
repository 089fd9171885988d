-- Turnstile SQLite schema, version 5: priorities. Every line is kept in order of rank
-- (turnstile/_core/ranking.py: the arrival stamp in microseconds minus priority times a
-- level), then seq. Entries from before have rank = their arrival stamp (priority 0).
-- Applied inside BEGIN IMMEDIATE by the migration runner, which then sets PRAGMA user_version.

ALTER TABLE turnstile_waiters ADD COLUMN rank INTEGER NOT NULL DEFAULT 0;
UPDATE turnstile_waiters SET rank = CAST(round(joined_at * 1000000) AS INTEGER);
DROP INDEX turnstile_waiters_by_name;
CREATE INDEX turnstile_waiters_by_name ON turnstile_waiters (name, rank, seq);

ALTER TABLE turnstile_rate_waiters ADD COLUMN rank INTEGER NOT NULL DEFAULT 0;
UPDATE turnstile_rate_waiters SET rank = CAST(round(joined_at * 1000000) AS INTEGER);
DROP INDEX turnstile_rate_waiters_by_name;
CREATE INDEX turnstile_rate_waiters_by_name ON turnstile_rate_waiters (name, rank, seq);
