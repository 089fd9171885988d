-- Turnstile SQLite schema, version 1.
-- Applied inside BEGIN IMMEDIATE by the migration runner, which then sets PRAGMA user_version.

-- Counters that must survive every restart. 'last_token' is the last fencing token issued on
-- any name (tokens are global, hence strictly increasing per name too).
CREATE TABLE turnstile_meta (
    key   TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO turnstile_meta (key, value) VALUES ('last_token', 0);

-- The limit last asked for, per name that has holders or waiters (deleted when idle).
CREATE TABLE turnstile_names (
    name TEXT PRIMARY KEY,
    lim  INTEGER NOT NULL
) WITHOUT ROWID;

-- Leases. claimed = 0: handed to a waiter that has not picked it up yet.
CREATE TABLE turnstile_holders (
    name        TEXT NOT NULL,
    holder      TEXT NOT NULL,
    token       INTEGER NOT NULL,
    acquired_at REAL NOT NULL,
    expires_at  REAL NOT NULL,
    claimed     INTEGER NOT NULL,
    PRIMARY KEY (name, holder)
) WITHOUT ROWID;

-- The line. AUTOINCREMENT so a sequence number is never reused: seq order is arrival order.
CREATE TABLE turnstile_waiters (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    name       TEXT NOT NULL,
    holder     TEXT NOT NULL,
    ttl        REAL NOT NULL,
    wait_ttl   REAL NOT NULL,
    joined_at  REAL NOT NULL,
    expires_at REAL NOT NULL,
    UNIQUE (name, holder)
);
CREATE INDEX turnstile_waiters_by_name ON turnstile_waiters (name, seq);
