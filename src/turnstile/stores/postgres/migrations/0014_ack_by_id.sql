-- Turnstile PostgreSQL schema, version 14: an ack finds its message by id in the unique
-- index, whatever else is in flight.
--
-- Version 13 wrote the ack's DELETE (queue_ack, queue_ack_claim) as one statement on
-- (queue_id, id, state = 1, receipt, deadline > now). The partial deadline index (queue_id,
-- deadline) WHERE state = 1 serves that condition too, and with statistics taken while
-- few messages were in flight the plan chose it: an ack then walked the deadline index past
-- every message in flight whose deadline had not passed (3,000 in flight: 0.9 ms of server
-- time per ack, against 0.01 ms). The DELETE now takes the message's seq from the unique
-- index on (queue_id, id), as nack and extend already did, and checks the rest on that
-- row.
--
-- Safe on a populated schema (functions only). Compatibility: the signatures and answers
-- of queue_ack and queue_ack_claim are unchanged.

CREATE OR REPLACE FUNCTION __SCHEMA__.queue_ack_claim(
    p_name text, p_id text, p_ack_receipt text, p_receipt text,
    p_visibility double precision, p_concurrency integer, p_max_attempts integer,
    p_waiter text, p_now timestamptz, p_channel text,
    OUT o_acked boolean,
    OUT o_found boolean, OUT o_id text, OUT o_key text, OUT o_body bytea, OUT o_kind smallint,
    OUT o_attempt integer, OUT o_enqueued_at double precision, OUT o_deadline double precision,
    OUT o_now double precision, OUT o_retry_after double precision)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_qid bigint;
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_deadline timestamptz := v_now + p_visibility * interval '1 second';
    v_expired boolean;
    v_wake integer := 0;
    v_claim_wake integer;
BEGIN
    -- The queue's id and whether a message in flight is past its deadline, in one look.
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
    -- The message by its id alone (the unique index), then checked: a condition the
    -- deadline index could also serve would let the plan walk every message in flight.
    DELETE FROM __SCHEMA__.queue_messages m
    WHERE m.seq = (SELECT s.seq FROM __SCHEMA__.queue_messages s
                   WHERE s.queue_id = v_qid AND s.id = p_id)
      AND m.state = 1 AND m.receipt = p_ack_receipt AND m.deadline > v_now;
    o_acked := FOUND;
    IF o_acked THEN
        v_wake := v_wake + 1;
    END IF;
    -- _queue_claim's common case inline: no cap, and a message to hand out.
    o_found := false;
    IF p_concurrency IS NULL THEN
        UPDATE __SCHEMA__.queue_messages m
        SET state = 1, attempts = m.attempts + 1, max_attempts = p_max_attempts,
            receipt = p_receipt, deadline = v_deadline
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
        RETURNING true, m.id, m.key, m.body, m.kind, m.attempts,
                  extract(epoch FROM m.enqueued_at)
        INTO o_found, o_id, o_key, o_body, o_kind, o_attempt, o_enqueued_at;
        o_found := FOUND;
    END IF;
    IF o_found THEN
        IF p_waiter IS NOT NULL THEN
            DELETE FROM __SCHEMA__.queue_waiters w
            WHERE w.queue_id = v_qid AND w.waiter = p_waiter;
        END IF;
        o_deadline := extract(epoch FROM v_deadline);
        v_claim_wake := -1;
    ELSE
        SELECT c.o_found, c.o_id, c.o_key, c.o_body, c.o_kind, c.o_attempt, c.o_enqueued_at,
               c.o_deadline, c.o_retry_after, c.o_wake
        INTO o_found, o_id, o_key, o_body, o_kind, o_attempt, o_enqueued_at, o_deadline,
             o_retry_after, v_claim_wake
        FROM __SCHEMA__._queue_claim(v_qid, p_receipt, p_visibility, p_concurrency,
                                     p_max_attempts, p_waiter, v_now, p_channel, true) c;
    END IF;
    v_wake := v_wake + greatest(v_claim_wake, 0);
    IF v_wake > 0 THEN
        -- _queue_wake's lock, then a look whether anyone waits at all (mostly nobody does
        -- while consumers keep up: the call is spared).
        PERFORM pg_advisory_xact_lock_shared(__SCHEMA__._queue_lock_key(v_qid, 3));
        IF EXISTS (SELECT 1 FROM __SCHEMA__.queue_waiters w WHERE w.queue_id = v_qid) THEN
            PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_wake, v_now, p_waiter);
        END IF;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION __SCHEMA__.queue_ack(
    p_name text, p_id text, p_receipt text, p_now timestamptz DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_qid bigint;
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_expired boolean;
    v_wake integer := 0;
    v_acked boolean;
BEGIN
    -- The queue's id and whether a message in flight is past its deadline, in one look.
    SELECT q.id, EXISTS (SELECT 1 FROM __SCHEMA__.queue_messages m
                         WHERE m.queue_id = q.id AND m.state = 1 AND m.deadline <= v_now)
    INTO v_qid, v_expired
    FROM __SCHEMA__.queues q WHERE q.key = sha256(convert_to(p_name, 'UTF8'));
    IF v_qid IS NULL THEN
        v_qid := __SCHEMA__._queue_id(p_name);  -- a new queue: nothing in flight
    ELSIF v_expired THEN
        v_wake := __SCHEMA__._queue_purge(v_qid, v_now);
    END IF;
    -- The message by its id alone (the unique index), then checked: a condition the
    -- deadline index could also serve would let the plan walk every message in flight.
    DELETE FROM __SCHEMA__.queue_messages m
    WHERE m.seq = (SELECT s.seq FROM __SCHEMA__.queue_messages s
                   WHERE s.queue_id = v_qid AND s.id = p_id)
      AND m.state = 1 AND m.receipt = p_receipt AND m.deadline > v_now;
    v_acked := FOUND;
    IF v_acked THEN
        v_wake := v_wake + 1;
    END IF;
    IF v_wake > 0 THEN
        -- _queue_wake's lock, then a look whether anyone waits at all (mostly nobody does
        -- while consumers keep up: the call is spared).
        PERFORM pg_advisory_xact_lock_shared(__SCHEMA__._queue_lock_key(v_qid, 3));
        IF EXISTS (SELECT 1 FROM __SCHEMA__.queue_waiters w WHERE w.queue_id = v_qid) THEN
            PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_wake, v_now, NULL);
        END IF;
    END IF;
    RETURN v_acked;
END
$$;
