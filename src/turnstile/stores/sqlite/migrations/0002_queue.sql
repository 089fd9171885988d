-- Turnstile SQLite schema, version 2: keyed FIFO queues (see turnstile/_core/queue_model.py).
-- Applied inside BEGIN IMMEDIATE by the migration runner, which then sets PRAGMA user_version.

-- Every message not yet acked. seq (AUTOINCREMENT: never reused) is the arrival order.
-- state: 0 ready (due at available_at), 1 in flight (until deadline, settled with receipt),
-- 2 dead letter. kind: 0 JSON text, 1 raw bytes.
CREATE TABLE turnstile_queue_messages (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    queue        TEXT NOT NULL,
    id           TEXT NOT NULL,
    key          TEXT,
    body         BLOB NOT NULL,
    kind         INTEGER NOT NULL,
    enqueued_at  REAL NOT NULL,
    available_at REAL NOT NULL,
    attempts     INTEGER NOT NULL,
    max_attempts INTEGER NOT NULL,
    state        INTEGER NOT NULL,
    receipt      TEXT,
    deadline     REAL,
    error        TEXT,
    died_at      REAL,
    UNIQUE (queue, id)
);
-- Ready messages in arrival order; dead letters in arrival order.
CREATE INDEX turnstile_queue_by_state ON turnstile_queue_messages (queue, state, seq);
-- The head of a key: its pending message with the smallest seq.
CREATE INDEX turnstile_queue_by_key ON turnstile_queue_messages (queue, key, seq)
    WHERE state < 2;
-- In-flight messages by deadline (timeouts), ready ones by due time (delays).
CREATE INDEX turnstile_queue_by_time ON turnstile_queue_messages (queue, state, deadline)
    WHERE state = 1;
CREATE INDEX turnstile_queue_by_due ON turnstile_queue_messages (queue, state, available_at)
    WHERE state = 0;

-- dedup_id -> the message it stored, remembered until expires_at (put time + dedup window).
CREATE TABLE turnstile_queue_dedup (
    queue      TEXT NOT NULL,
    dedup_id   TEXT NOT NULL,
    id         TEXT NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (queue, dedup_id)
) WITHOUT ROWID;
CREATE INDEX turnstile_queue_dedup_expiry ON turnstile_queue_dedup (queue, expires_at);

-- Blocked consumers, oldest first; each is woken by one datagram (see sqlite_queue.py).
CREATE TABLE turnstile_queue_waiters (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    queue      TEXT NOT NULL,
    waiter     TEXT NOT NULL,
    expires_at REAL NOT NULL,
    UNIQUE (queue, waiter)
);
