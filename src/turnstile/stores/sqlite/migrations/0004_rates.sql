-- Turnstile SQLite schema, version 4: rate limits whose callers wait in line
-- (see turnstile/_core/rate_machine.py). Applied inside BEGIN IMMEDIATE by the migration
-- runner, which then sets PRAGMA user_version.

-- A rate limit in use: its rate and GCRA's theoretical arrival time (deleted when idle).
CREATE TABLE turnstile_rates (
    name  TEXT PRIMARY KEY,
    rate  INTEGER NOT NULL,
    per   REAL NOT NULL,
    burst INTEGER NOT NULL,
    tat   REAL NOT NULL
) WITHOUT ROWID;

-- The line. AUTOINCREMENT: seq order is arrival order.
CREATE TABLE turnstile_rate_waiters (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    name       TEXT NOT NULL,
    holder     TEXT NOT NULL,
    joined_at  REAL NOT NULL,
    expires_at REAL NOT NULL,
    UNIQUE (name, holder)
);
CREATE INDEX turnstile_rate_waiters_by_name ON turnstile_rate_waiters (name, seq);

-- Admissions of the last `per` seconds (what status shows; older ones are deleted).
CREATE TABLE turnstile_rate_admissions (
    name TEXT NOT NULL,
    at   REAL NOT NULL
);
CREATE INDEX turnstile_rate_admissions_by_name ON turnstile_rate_admissions (name, at);
