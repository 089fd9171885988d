-- Turnstile SQLite schema, version 3: callback waiters and their deliveries
-- (see turnstile/_core/lock_machine.py, "Callback waiters").
-- Applied inside BEGIN IMMEDIATE by the migration runner, which then sets PRAGMA user_version.

-- A callback waiter: the callback text (JSON; it holds a task token, a secret) instead of a
-- connection that asks again.
ALTER TABLE turnstile_waiters ADD COLUMN callback TEXT;
-- A callback grant: its callback, whether its delivery is pending, a deliverer's claim on
-- it (until claimed_until) and how many takes it had.
ALTER TABLE turnstile_holders ADD COLUMN callback TEXT;
ALTER TABLE turnstile_holders ADD COLUMN pending INTEGER NOT NULL DEFAULT 0;
ALTER TABLE turnstile_holders ADD COLUMN claimed_until REAL NOT NULL DEFAULT 0;
ALTER TABLE turnstile_holders ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
-- What a deliverer looks at: names with callback waiters, and pending deliveries.
CREATE INDEX turnstile_waiters_with_callback ON turnstile_waiters (name)
    WHERE callback IS NOT NULL;
CREATE INDEX turnstile_holders_pending ON turnstile_holders (name)
    WHERE pending = 1;
