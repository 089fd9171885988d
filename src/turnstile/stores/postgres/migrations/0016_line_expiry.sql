-- Turnstile PostgreSQL schema, version 16: expired waiting entries found through an index.
--
-- Every lock step first drops the name's expired waiting entries (DELETE FROM waiters WHERE
-- name_id = ... AND expires_at <= now). Without an index on expires_at that statement read
-- every entry of the name's line: the claim of a grant cost 0.6 ms with 2 waiters and
-- 1.9 ms with 10,000 (benchmarks/results/scale.md). With waiters_expiry it reads only the
-- expired ones.
--
-- The price: a waiter that keeps its place (an UPDATE of expires_at, once every wait_ttl/3
-- for a blocked acquire) is no longer a HOT update, so each such step also writes new
-- entries in the table's indexes.
--
-- Safe on a populated schema: one index on the waiters table, which holds only the entries
-- waiting now (it is locked against writes while the index builds, a moment for any
-- realistic line). Compatibility: no function changes.

CREATE INDEX waiters_expiry ON __SCHEMA__.waiters (name_id, expires_at);
