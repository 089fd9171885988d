-- The named queries of the PostgreSQL backend. Each block starts with "-- name: NAME"; the
-- text up to the next block is the query. __SCHEMA__ is replaced by the quoted schema name.
-- A block headed "-- part: NAME" is shared text, not a query: __NAME__ in a query stands for
-- it (sql.py). Parameters are passed as data (%(param)s), never spliced in. Each query is
-- one statement, run in autocommit mode: one transaction, no session state (works through
-- PgBouncer in transaction mode). With prepare=on (the default) each is prepared under a
-- name hashed from its text (stores/postgres/prepared.py), which keeps that safe through a
-- pooler.
-- The answers of the fast paths give times as date_part('epoch', t): a float8 computed as
-- one division, the same value as extract(epoch FROM t)::float8 (both the nearest double
-- to the exact seconds), without extract's numeric (about 6 us of server CPU per
-- acquire + release, scratch).
-- %(name_key)s is sha256 of the name's UTF-8 bytes, computed by the client (the names row's
-- key; hashing it in SQL cost about 5 us of server time per statement); the statements
-- that find a row by it also check the row's name, so a wrong key can only miss (and the
-- function, which hashes the name itself, then does the step).

-- part: FAST_TIMES
-- A fast grant's token and times, set on the name's row n: the token max(last + 1, now in us)
-- and the lease from one clock reading (again if the statement waited for a change of the
-- row). In FAST_GRANT and in acquire_fresh's ON CONFLICT branch.
(last_token, h_acquired, h_expires) = (
        SELECT c.token, c.t, c.t + %(ttl)s::float8 * interval '1 second'
        FROM (SELECT greatest(n.last_token + 1,
                              floor(extract(epoch FROM k.t) * 1000000)::bigint) AS token,
                     k.t
              FROM (SELECT coalesce(%(now)s::timestamptz, clock_timestamp()) AS t) k) c)

-- part: FAST_GRANT
-- The fast grant (acquire_fast, acquire_idle): on an idle name, the caller becomes its holder
-- in its row, the token max(last + 1, now in us) and the times from one clock reading (again
-- if the UPDATE waited for a change of the row). Ends in its WHERE clause, for a statement
-- to add to it; the statement says what it returns.
UPDATE __SCHEMA__.names n
SET __FAST_TIMES__,
    lim = %(limit)s::integer, per_key = %(per_key)s::integer, busy = true,
    h_holder = %(holder)s::text, h_key = %(key)s::text
WHERE n.key = %(name_key)s::bytea AND n.name = %(name)s::text AND NOT n.busy

-- part: FAST_FREE
-- The fast release (release_fast, release_idle): when the caller is the name's fast holder
-- (so nobody else holds or waits), its row frees the name. Ends in its WHERE clause, as
-- FAST_GRANT. The statements' RETURNING starts with __UNFLUSHED__: unless durability=strict,
-- a set_config that lets the transaction commit without waiting for the disk, evaluated
-- only for the row the UPDATE freed (never when the release function runs instead, which
-- may grant a waiter): such a release grants nobody, and a crash that forgot it leaves the
-- name held by the releasing holder until its lease runs out (sql.py, UNFLUSHED_MARK).
UPDATE __SCHEMA__.names n
SET busy = false, h_holder = NULL,
    idle_since = coalesce(n.idle_since, coalesce(%(now)s::timestamptz, clock_timestamp()))
WHERE n.key = %(name_key)s::bytea AND n.name = %(name)s::text
  AND n.h_holder = %(holder)s::text AND n.last_token = %(token)s::bigint

-- part: FAST_ROW
-- The head of acquire_fast's and acquire_fresh's answer: the fast grant of the CTE fast as
-- a grant row (a statement may add a filter before ACQUIRE_FALLBACK).
SELECT r.granted, r.token, r.acquired_at, r.expires_at, r.queue_position, r.now, r.retry_after,
       r.wait_id, r.fast
FROM (SELECT true AS granted, f.last_token AS token,
             date_part('epoch', f.h_acquired) AS acquired_at,
             date_part('epoch', f.h_expires) AS expires_at,
             NULL::integer AS queue_position, date_part('epoch', f.h_acquired) AS now,
             NULL::float8 AS retry_after, NULL::bigint AS wait_id, true AS fast
      FROM fast f

-- part: ACQUIRE_FALLBACK
-- The rest of that answer: when fast granted nothing, the acquire function's, called once
-- (see acquire_fast); the row is r.
      UNION ALL
      SELECT (s.a).granted, (s.a).token, (s.a).acquired_at, (s.a).expires_at,
             (s.a).queue_position, (s.a).now, (s.a).retry_after, (s.a).wait_id, false
      FROM (SELECT __SCHEMA__.acquire(%(name)s::text, %(holder)s::text, %(limit)s::integer,
                                      %(ttl)s::float8, %(wait_ttl)s::float8,
                                      %(enqueue)s::boolean, %(now)s::timestamptz,
                                      %(channel)s::text, %(wake)s::text, %(lead)s::bigint,
                                      %(key)s::text, %(per_key)s::integer) AS a
            WHERE NOT EXISTS (SELECT 1 FROM fast) OFFSET 0) s) r

-- name: acquire
SELECT granted, token, acquired_at, expires_at, queue_position, now, retry_after, wait_id
FROM __SCHEMA__.acquire(%(name)s::text, %(holder)s::text, %(limit)s::integer,
                        %(ttl)s::float8, %(wait_ttl)s::float8, %(enqueue)s::boolean,
                        %(now)s::timestamptz, %(channel)s::text, %(wake)s::text,
                        %(lead)s::bigint, %(key)s::text, %(per_key)s::integer)

-- name: release
SELECT __SCHEMA__.release(%(name)s::text, %(holder)s::text, %(token)s::bigint,
                          %(now)s::timestamptz)

-- name: acquire_fast
-- With prepare=on (the default; planned once per connection): acquire as one plain
-- statement (schema version 12), acquire's fastest path inline: on an idle name, one UPDATE
-- of its row grants the caller there (a fast grant; the clock read once for the token and
-- the times, again if the UPDATE waited for a change of the row); on a busy one (the UPDATE
-- changed nothing) the acquire function, the full state machine: called in a select list
-- behind a one-time filter (OFFSET 0 keeps it to one call for its composite result), which
-- the executor sets up for less than a function scan in FROM (117 us of execution on an idle
-- name against 153, EXPLAIN ANALYZE, scratch). The last column, fast, says
-- which answered (true: the fast grant), which the client keeps as its hint for the name's
-- next acquire (acquire_idle). __RELAXED__: "true", or with durability=relaxed the
-- set_config that lets this transaction commit without waiting for the disk (a filter on
-- the one row returned, so evaluated once).
WITH fast AS (
__FAST_GRANT__
    RETURNING n.last_token, n.h_acquired, n.h_expires)
__FAST_ROW__
__ACQUIRE_FALLBACK__
WHERE __RELAXED__

-- name: acquire_idle
-- With prepare=on: acquire_fast's UPDATE alone, for a name whose last acquire by this client
-- was a fast grant (the client's hint, see the backend's _known): on an idle name it grants
-- the caller there and returns the grant; on a busy or missing one it changes nothing and
-- returns no row, and the client then sends acquire (the function). Without acquire_fast's
-- WITH and UNION ALL, whose plan (a CTE scan and a function scan set up at every call) cost
-- more server time than the UPDATE itself: on an idle name this is the cheapest statement
-- that grants; on a busy one it costs a round trip more, so the client sends it only where
-- its last acquire found the name idle. It returns only what a fast grant does not already
-- say (the token and the lease's times; the client fills in the rest of a grant's row):
-- each column is an expression set up at every execution. __RELAXED__: see acquire_fast;
-- here in the RETURNING, evaluated once for the row the UPDATE changed (in the WHERE clause
-- it would be evaluated for every idle row a sequential scan of a small table reads).
__FAST_GRANT__
RETURNING n.last_token AS token, date_part('epoch', n.h_acquired) AS acquired_at,
          date_part('epoch', n.h_expires) AS expires_at, __RELAXED__ AS relaxed

-- name: acquire_fresh
-- With prepare=on: acquire_fast for a name this client has not acquired lately (it may have
-- no row yet: each order of a webhook feed is a new name). One INSERT makes the row of a new
-- name with the caller's fast grant in it; on a name that has a row, ON CONFLICT does what
-- acquire_fast's UPDATE does (a fast grant on an idle name, the row locked and checked on
-- its newest version; the clock read after the lock); on a busy one (nothing inserted or
-- updated) the acquire function, as there. A new row also forgets a few names idle for a
-- day (_forget_idle), as the function does when it makes one. acquire_fast is the cheaper
-- statement on a name that has its row (no INSERT tried, no identity value drawn), so the
-- client sends this one only for names it has not seen (see the backend's _known).
WITH fast AS (
    INSERT INTO __SCHEMA__.names AS n
        (key, name, lim, last_token, per_key, busy, h_holder, h_acquired, h_expires, h_key)
    SELECT sha256(convert_to(%(name)s::text, 'UTF8')), %(name)s::text, %(limit)s::integer,
           greatest(1, floor(extract(epoch FROM k.t) * 1000000)::bigint),
           %(per_key)s::integer, true, %(holder)s::text, k.t,
           k.t + %(ttl)s::float8 * interval '1 second', %(key)s::text
    FROM (SELECT coalesce(%(now)s::timestamptz, clock_timestamp()) AS t) k
    ON CONFLICT (key) DO UPDATE
    SET __FAST_TIMES__,
        lim = excluded.lim, per_key = excluded.per_key, busy = true,
        h_holder = excluded.h_holder, h_key = excluded.h_key
    WHERE NOT n.busy
    RETURNING n.last_token, n.h_acquired, n.h_expires, n.xmax = 0 AS inserted)
__FAST_ROW__
      WHERE NOT f.inserted
         OR (SELECT count(*) FROM __SCHEMA__._forget_idle(f.h_acquired)) >= 0
__ACQUIRE_FALLBACK__
WHERE __RELAXED__

-- name: release_fast
-- With prepare=on (the default): release as one plain statement (schema version 12),
-- release's fastest path inline: when the caller is the name's fast holder (so nobody else
-- holds or waits), one UPDATE of its row frees the name (released: the lease had not
-- expired); otherwise the release function. The check is on the row the UPDATE locks, made
-- again on its newest version if it waited for the lock. __RELAXED__: see acquire.
WITH fast AS (
__FAST_FREE__
    RETURNING __UNFLUSHED__ n.h_expires > coalesce(%(now)s::timestamptz, clock_timestamp())
              AS released)
SELECT r.released
FROM (SELECT f.released FROM fast f
      UNION ALL
      SELECT __SCHEMA__.release(%(name)s::text, %(holder)s::text, %(token)s::bigint,
                                %(now)s::timestamptz)
      WHERE NOT EXISTS (SELECT 1 FROM fast)) r
WHERE __RELAXED__

-- name: release_idle
-- With prepare=on: release_fast's UPDATE alone, for a lease granted on a name idle at its
-- last acquires by this client (the same hint as acquire_idle): frees the name when the
-- caller is its fast holder and returns released; otherwise changes nothing and returns no
-- row, and the client then calls release (the function). Without release_fast's WITH and
-- UNION ALL, which cost more server time than the UPDATE. With durability=relaxed, the
-- __UNFLUSHED__ setting in the RETURNING is the relaxed one (no filter in the WHERE clause,
-- which a sequential scan would evaluate for every row it reads).
__FAST_FREE__
RETURNING __UNFLUSHED__ n.h_expires > coalesce(%(now)s::timestamptz, clock_timestamp())
          AS released

-- name: renew
SELECT renewed, acquired_at, expires_at
FROM __SCHEMA__.renew(%(name)s::text, %(holder)s::text, %(token)s::bigint, %(ttl)s::float8,
                      %(now)s::timestamptz)

-- name: set_limit
SELECT __SCHEMA__.set_limit(%(name)s::text, %(limit)s::integer, %(now)s::timestamptz)

-- name: status
SELECT lim, now, holders, waiters, holder_callbacks, waiter_callbacks, per_key, holder_keys,
       waiter_keys
FROM __SCHEMA__.status(%(name)s::text, %(now)s::timestamptz)

-- name: names
SELECT name FROM __SCHEMA__.names_in_use(%(prefix)s::text, %(max_count)s::integer,
                                         %(now)s::timestamptz) AS name

-- Callback grants (schema version 6). Never relaxed (sql.RELAXABLE): see docs/postgres.md.

-- name: acquire_callback
SELECT granted, token, acquired_at, expires_at, queue_position, now, retry_after
FROM __SCHEMA__.acquire_callback(%(name)s::text, %(holder)s::text, %(limit)s::integer,
                                 %(ttl)s::float8, %(wait_ttl)s::float8,
                                 %(now)s::timestamptz, %(callback)s::text, %(lead)s::bigint,
                                 %(key)s::text, %(per_key)s::integer)

-- name: take_deliveries
SELECT o_name, o_holder, o_token, o_acquired_at, o_expires_at, o_limit, o_callback,
       o_attempts
FROM __SCHEMA__.take_deliveries(%(lease)s::float8, %(max_count)s::integer,
                                %(now)s::timestamptz)

-- name: settle_delivery
SELECT __SCHEMA__.settle_delivery(%(name)s::text, %(token)s::bigint, %(outcome)s::text,
                                  %(retry_in)s::float8, %(now)s::timestamptz)

-- name: pending_deliveries
-- A plain read (the partial index holders_pending): grants whose delivery is pending.
SELECT count(*) FROM __SCHEMA__.holders h
WHERE h.pending AND h.expires_at > coalesce(%(now)s::timestamptz, clock_timestamp())

-- Rate limits (schema version 8). rate_acquire and rate_leave may be relaxed (sql.RELAXABLE):
-- an admission a crash forgot is missing from the count, as a relaxed grant may be.

-- name: rate_acquire
SELECT admitted, queue_position, now, retry_after, tat
FROM __SCHEMA__.rate_acquire(%(name)s::text, %(holder)s::text, %(rate)s::integer,
                             %(per)s::float8, %(burst)s::integer, %(enqueue)s::boolean,
                             %(grace)s::float8, %(now)s::timestamptz, %(lead)s::bigint)

-- name: rate_leave
SELECT __SCHEMA__.rate_leave(%(name)s::text, %(holder)s::text, %(now)s::timestamptz)

-- name: rate_status
SELECT rate, per, burst, now, next_slot, holders, joined, slots, admitted
FROM __SCHEMA__.rate_status(%(name)s::text, %(now)s::timestamptz)

-- name: relaxed
-- durability=relaxed: a lock or rate-limit operation (__QUERY__, one of sql.RELAXABLE) whose
-- transaction commits without waiting for its WAL to reach disk. set_config(..., true) is local to this
-- one autocommit transaction and synchronous_commit is read when it commits; the subquery
-- in FROM is always evaluated (a volatile function), each side yields one row.
SELECT op.* FROM (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed,
                 (__QUERY__) AS op

-- name: ping
SELECT 1

-- name: listen
-- On the LISTEN connection, once per channel: the client's own and the schema's.
-- __CHANNEL_NAME__ is replaced by the quoted channel name (an identifier, not a value).
LISTEN __CHANNEL_NAME__

-- name: server_info
SELECT current_setting('server_encoding'), current_setting('server_version_num')::integer

-- name: version_table_exists
SELECT to_regclass(%(version_table)s) IS NOT NULL

-- name: migrate_lock
-- Serialises migrations of one schema across every process (transaction-scoped: it is
-- released at COMMIT, so it is safe through a transaction pooler).
SELECT pg_advisory_xact_lock(%(key)s::bigint)

-- name: schema_exists
SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = %(schema)s

-- name: create_schema
CREATE SCHEMA IF NOT EXISTS __SCHEMA__

-- name: create_version_table
CREATE TABLE IF NOT EXISTS __SCHEMA__.schema_version (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)

-- name: applied_version
SELECT coalesce(max(version), 0) FROM __SCHEMA__.schema_version

-- name: record_version
INSERT INTO __SCHEMA__.schema_version (version, name) VALUES (%(version)s, %(name)s)

-- Queues: one function per operation (see schema.sql), and one plain read.

-- name: queue_put
SELECT o_id, o_created, o_now
FROM __SCHEMA__.queue_put(%(name)s::text, %(id)s::text, %(key)s::text, %(body)s::bytea,
                          %(kind)s::smallint, %(delay)s::float8, %(dedup)s::text,
                          %(max)s::integer, %(window)s::float8, %(now)s::timestamptz)

-- name: queue_claim
SELECT o_found, o_id, o_key, o_body, o_kind, o_attempt, o_enqueued_at, o_deadline, o_now,
       o_retry_after
FROM __SCHEMA__.queue_claim(%(name)s::text, %(receipt)s::text, %(vt)s::float8,
                            %(cap)s::integer, %(max)s::integer, %(waiter)s::text,
                            %(now)s::timestamptz, %(channel)s::text)

-- name: queue_ack_claim
-- The worker loop (schema version 11): ack the message it handled and claim the next, in one
-- transaction.
SELECT o_acked, o_found, o_id, o_key, o_body, o_kind, o_attempt, o_enqueued_at, o_deadline,
       o_now, o_retry_after
FROM __SCHEMA__.queue_ack_claim(%(name)s::text, %(id)s::text, %(ack_receipt)s::text,
                                %(receipt)s::text, %(vt)s::float8, %(cap)s::integer,
                                %(max)s::integer, %(waiter)s::text, %(now)s::timestamptz,
                                %(channel)s::text)

-- name: queue_ack_claim_many
-- The worker loop with prefetch (schema version 15): ack the batch it handled and claim up
-- to the next, in one transaction.
SELECT o_acked, o_ids, o_keys, o_bodies, o_kinds, o_attempts, o_enqueued_at, o_deadline,
       o_now, o_retry_after
FROM __SCHEMA__.queue_ack_claim_many(%(name)s::text, %(ids)s::text[], %(ack_receipts)s::text[],
                                     %(receipts)s::text[], %(vt)s::float8, %(cap)s::integer,
                                     %(max)s::integer, %(waiter)s::text, %(now)s::timestamptz,
                                     %(channel)s::text)

-- name: queue_ack
SELECT __SCHEMA__.queue_ack(%(name)s::text, %(id)s::text, %(receipt)s::text,
                            %(now)s::timestamptz)

-- name: queue_nack
SELECT __SCHEMA__.queue_nack(%(name)s::text, %(id)s::text, %(receipt)s::text,
                             %(delay)s::float8, %(error)s::text, %(now)s::timestamptz)

-- name: queue_extend
SELECT __SCHEMA__.queue_extend(%(name)s::text, %(id)s::text, %(receipt)s::text,
                               %(seconds)s::float8, %(now)s::timestamptz)

-- name: queue_stats
SELECT o_ready, o_delayed, o_in_flight, o_dead, o_oldest, o_now, o_keys, o_counts
FROM __SCHEMA__.queue_stats(%(name)s::text, %(top)s::integer, %(now)s::timestamptz)

-- name: queue_dead
SELECT o_id, o_key, o_body, o_kind, o_attempts, o_enqueued_at, o_died_at, o_error
FROM __SCHEMA__.queue_dead(%(name)s::text, %(limit)s::integer, %(now)s::timestamptz)

-- name: queue_requeue
SELECT __SCHEMA__.queue_requeue(%(name)s::text, %(ids)s::text[], %(now)s::timestamptz)

-- name: queue_purge
SELECT __SCHEMA__.queue_purge_dead(%(name)s::text, %(ids)s::text[], %(now)s::timestamptz)

-- name: queue_unregister
SELECT __SCHEMA__.queue_unregister(%(name)s::text, %(waiter)s::text)

-- name: queue_names
-- A plain read (no function: it changes nothing and needs no migration).
SELECT q.name FROM __SCHEMA__.queues q
WHERE starts_with(q.name, %(prefix)s::text)
  AND EXISTS (SELECT 1 FROM __SCHEMA__.queue_messages m WHERE m.queue_id = q.id)
ORDER BY q.name LIMIT %(max)s::integer
