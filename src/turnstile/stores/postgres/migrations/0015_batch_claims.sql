-- Turnstile PostgreSQL schema, version 15: batch claims for the worker loop.
--
-- New: queue_ack_claim_many, Queue.work's step between two batches when it prefetches
-- (prefetch > 1): it acks the messages of the batch just handled and claims up to the
-- next batch, in one transaction, so the commit (and its WAL flush) and the round trip are
-- paid once per batch rather than once per message. The claims of the step are the ones
-- queue_claim would make one after another (the same order, per-key rule and cap), taken
-- in one statement.
--
-- Safe on a populated schema (one new function). Compatibility: nothing else changes; a
-- client of an earlier release never calls the new function.

-- queue_machine.ack of each (p_ids[i], p_ack_receipts[i]), then up to
-- cardinality(p_receipts) claims, at one time in one transaction: the worker loop's step
-- between two batches (Queue.work with prefetch). The claims are the ones queue_claim would
-- make one after another, taken in one statement: the oldest ready, due messages that head
-- their keys (so of distinct keys), no more than p_concurrency leaves room for, the i-th
-- oldest with p_receipts[i]. p_waiter (new, as for queue_ack_claim) is registered only if
-- the step claims nothing. o_acked[i] answers the i-th ack; o_ids .. o_enqueued_at are the
-- claimed messages, oldest first (empty: nothing claimed, and o_retry_after says when to
-- look again); o_deadline is theirs.
CREATE FUNCTION __SCHEMA__.queue_ack_claim_many(
    p_name text, p_ids text[], p_ack_receipts text[], p_receipts text[],
    p_visibility double precision, p_concurrency integer, p_max_attempts integer,
    p_waiter text, p_now timestamptz, p_channel text,
    OUT o_acked boolean[],
    OUT o_ids text[], OUT o_keys text[], OUT o_bodies bytea[], OUT o_kinds smallint[],
    OUT o_attempts integer[], OUT o_enqueued_at double precision[],
    OUT o_deadline double precision, OUT o_now double precision,
    OUT o_retry_after double precision)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_qid bigint;
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_deadline timestamptz := v_now + p_visibility * interval '1 second';
    v_expired boolean;
    v_wake integer := 0;
    v_room integer := coalesce(cardinality(p_receipts), 0);
    v_acked boolean;
    c record;
BEGIN
    IF v_room = 0 THEN
        RAISE EXCEPTION 'queue_ack_claim_many needs at least one receipt'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT q.id, EXISTS (SELECT 1 FROM __SCHEMA__.queue_messages m
                         WHERE m.queue_id = q.id AND m.state = 1 AND m.deadline <= v_now)
    INTO v_qid, v_expired
    FROM __SCHEMA__.queues q WHERE q.key = sha256(convert_to(p_name, 'UTF8'));
    IF v_qid IS NULL THEN
        v_qid := __SCHEMA__._queue_id(p_name);  -- a new queue: nothing in flight
    ELSIF v_expired THEN
        v_wake := __SCHEMA__._queue_purge(v_qid, v_now);
    END IF;
    o_now := extract(epoch FROM v_now);
    o_acked := '{}';
    IF coalesce(cardinality(p_ids), 0) > 0 THEN
        -- One statement per ack, each finding its message by id alone (the unique index)
        -- and checking the rest on that row, as queue_ack does: one statement for them all
        -- would join the ids to the messages, and the plan may then walk the deadline index
        -- past every message in flight (see version 14).
        FOR i IN 1..cardinality(p_ids) LOOP
            DELETE FROM __SCHEMA__.queue_messages m
            WHERE m.seq = (SELECT s.seq FROM __SCHEMA__.queue_messages s
                           WHERE s.queue_id = v_qid AND s.id = p_ids[i])
              AND m.state = 1 AND m.receipt = p_ack_receipts[i] AND m.deadline > v_now;
            v_acked := FOUND;
            o_acked := o_acked || v_acked;
            IF v_acked THEN
                v_wake := v_wake + 1;
            END IF;
        END LOOP;
    END IF;
    IF p_concurrency IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(__SCHEMA__._queue_lock_key(v_qid, 2));
        v_room := least(v_room, p_concurrency - (SELECT count(*) FROM __SCHEMA__.queue_messages m
                                                 WHERE m.queue_id = v_qid AND m.state = 1));
    END IF;
    IF v_room > 0 THEN
        WITH picked AS (
            SELECT r.seq FROM __SCHEMA__.queue_messages r
            WHERE r.queue_id = v_qid AND r.state = 0 AND r.available_at <= v_now
              AND (r.key IS NULL OR NOT EXISTS (
                  SELECT 1 FROM __SCHEMA__.queue_messages o
                  WHERE o.queue_id = v_qid AND o.key = r.key AND o.state < 2
                    AND o.seq < r.seq))
            ORDER BY r.seq
            LIMIT v_room
            FOR UPDATE OF r SKIP LOCKED),
        ranked AS (
            SELECT p.seq, row_number() OVER (ORDER BY p.seq) AS n FROM picked p),
        claimed AS (
            UPDATE __SCHEMA__.queue_messages m
            SET state = 1, attempts = m.attempts + 1, max_attempts = p_max_attempts,
                receipt = p_receipts[k.n], deadline = v_deadline
            FROM ranked k
            WHERE m.seq = k.seq
            RETURNING k.n, m.id, m.key, m.body, m.kind, m.attempts,
                      extract(epoch FROM m.enqueued_at) AS enqueued_at)
        SELECT array_agg(d.id ORDER BY d.n), array_agg(d.key ORDER BY d.n),
               array_agg(d.body ORDER BY d.n), array_agg(d.kind ORDER BY d.n),
               array_agg(d.attempts ORDER BY d.n), array_agg(d.enqueued_at ORDER BY d.n)
        INTO o_ids, o_keys, o_bodies, o_kinds, o_attempts, o_enqueued_at
        FROM claimed d;
    END IF;
    IF o_ids IS NULL THEN
        -- Nothing claimed: the general step, to register p_waiter (and say when to look
        -- again) holding the waiter lock, which may still find one.
        SELECT * INTO c
        FROM __SCHEMA__._queue_claim(v_qid, p_receipts[1], p_visibility, p_concurrency,
                                     p_max_attempts, p_waiter, v_now, p_channel, true);
        IF c.o_found THEN
            o_ids := ARRAY[c.o_id];
            o_keys := ARRAY[c.o_key];
            o_bodies := ARRAY[c.o_body];
            o_kinds := ARRAY[c.o_kind];
            o_attempts := ARRAY[c.o_attempt];
            o_enqueued_at := ARRAY[c.o_enqueued_at];
        ELSE
            o_ids := '{}';
            o_keys := '{}';
            o_bodies := '{}';
            o_kinds := '{}';
            o_attempts := '{}';
            o_enqueued_at := '{}';
            o_retry_after := c.o_retry_after;
        END IF;
    ELSIF p_waiter IS NOT NULL THEN
        DELETE FROM __SCHEMA__.queue_waiters w WHERE w.queue_id = v_qid AND w.waiter = p_waiter;
    END IF;
    IF cardinality(o_ids) > 0 THEN
        o_deadline := extract(epoch FROM v_deadline);
        -- Without an ack, the time-outs purged are the first claim's, which takes one of
        -- them, as queue_claim counts (with one, the first ack's, as queue_ack_claim does).
        IF coalesce(cardinality(p_ids), 0) = 0 THEN
            v_wake := v_wake - 1;
        END IF;
    END IF;
    IF v_wake > 0 THEN
        -- As queue_ack_claim: _queue_wake's lock, then a look whether anyone waits at all.
        PERFORM pg_advisory_xact_lock_shared(__SCHEMA__._queue_lock_key(v_qid, 3));
        IF EXISTS (SELECT 1 FROM __SCHEMA__.queue_waiters w WHERE w.queue_id = v_qid) THEN
            PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_wake, v_now, p_waiter);
        END IF;
    END IF;
END
$$;
