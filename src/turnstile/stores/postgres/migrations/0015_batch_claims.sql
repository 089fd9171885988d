-- Turnstile PostgreSQL schema, version 15: batch claims for the worker loop.
--
-- New: queue_ack_claim_many, Queue.work's step between two batches when it prefetches
-- (prefetch > 1): it acks the messages of the batch just handled and claims up to the
-- next batch, in one transaction, so the commit (and its WAL flush) and the round trip are
-- paid once per batch rather than once per message. Each claim of the step is the claim
-- of queue_claim (the same order, per-key rule and cap), made after the ones before it.
--
-- Safe on a populated schema (one new function). Compatibility: nothing else changes; a
-- client of an earlier release never calls the new function.

-- queue_machine.ack of each (p_ids[i], p_ack_receipts[i]), then up to
-- array_length(p_receipts) claims (the i-th with p_receipts[i]), stopping at the first that
-- finds nothing, at one time in one transaction: the worker loop's step between two batches
-- (Queue.work with prefetch). The messages a step claims head distinct keys (each claim sees
-- the ones before it in flight) and count against p_concurrency. p_waiter (new, as for
-- queue_ack_claim) is registered only if the step claims nothing. o_acked[i] answers the
-- i-th ack; o_ids .. o_enqueued_at the claimed messages in claim order (empty arrays:
-- nothing claimed, and o_retry_after says when to look again); o_deadline is theirs.
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
    v_found boolean;
    v_id text;
    v_key text;
    v_body bytea;
    v_kind smallint;
    v_attempt integer;
    v_enqueued_at double precision;
    v_ignored integer;
BEGIN
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
    FOR i IN 1..coalesce(array_length(p_ids, 1), 0) LOOP
        DELETE FROM __SCHEMA__.queue_messages m
        WHERE m.seq = (SELECT s.seq FROM __SCHEMA__.queue_messages s
                       WHERE s.queue_id = v_qid AND s.id = p_ids[i])
          AND m.state = 1 AND m.receipt = p_ack_receipts[i] AND m.deadline > v_now;
        v_found := FOUND;
        o_acked := o_acked || v_found;
        IF v_found THEN
            v_wake := v_wake + 1;
        END IF;
    END LOOP;
    o_ids := '{}';
    o_keys := '{}';
    o_bodies := '{}';
    o_kinds := '{}';
    o_attempts := '{}';
    o_enqueued_at := '{}';
    FOR i IN 1..coalesce(array_length(p_receipts, 1), 0) LOOP
        v_found := false;
        IF p_concurrency IS NULL THEN  -- _queue_claim's common case inline, as in queue_claim
            UPDATE __SCHEMA__.queue_messages m
            SET state = 1, attempts = m.attempts + 1, max_attempts = p_max_attempts,
                receipt = p_receipts[i], deadline = v_deadline
            WHERE m.seq = (
                SELECT r.seq FROM __SCHEMA__.queue_messages r
                WHERE r.queue_id = v_qid AND r.state = 0 AND r.available_at <= v_now
                  AND (r.key IS NULL OR NOT EXISTS (
                      SELECT 1 FROM __SCHEMA__.queue_messages o
                      WHERE o.queue_id = v_qid AND o.key = r.key AND o.state < 2
                        AND o.seq < r.seq))
                ORDER BY r.seq
                LIMIT 1
                FOR UPDATE OF r SKIP LOCKED)
            RETURNING m.id, m.key, m.body, m.kind, m.attempts, extract(epoch FROM m.enqueued_at)
            INTO v_id, v_key, v_body, v_kind, v_attempt, v_enqueued_at;
            v_found := FOUND;
        END IF;
        IF NOT v_found AND (p_concurrency IS NOT NULL OR i = 1) THEN
            -- The general step: under a cap, or to register p_waiter when the step would
            -- claim nothing at all (and say when to look again).
            SELECT c.o_found, c.o_id, c.o_key, c.o_body, c.o_kind, c.o_attempt,
                   c.o_enqueued_at, c.o_retry_after, c.o_wake
            INTO v_found, v_id, v_key, v_body, v_kind, v_attempt, v_enqueued_at,
                 o_retry_after, v_ignored
            FROM __SCHEMA__._queue_claim(v_qid, p_receipts[i], p_visibility, p_concurrency,
                                         p_max_attempts, CASE WHEN i = 1 THEN p_waiter END,
                                         v_now, p_channel, true) c;
        END IF;
        EXIT WHEN NOT v_found;
        o_ids := o_ids || v_id;
        o_keys := o_keys || v_key;
        o_bodies := o_bodies || v_body;
        o_kinds := o_kinds || v_kind;
        o_attempts := o_attempts || v_attempt;
        o_enqueued_at := o_enqueued_at || v_enqueued_at;
    END LOOP;
    IF cardinality(o_ids) > 0 THEN
        o_retry_after := NULL;
        o_deadline := extract(epoch FROM v_deadline);
        IF p_waiter IS NOT NULL THEN
            DELETE FROM __SCHEMA__.queue_waiters w
            WHERE w.queue_id = v_qid AND w.waiter = p_waiter;
        END IF;
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
