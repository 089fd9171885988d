-- Turnstile PostgreSQL schema, version 13: fewer statements and index entries per message
-- in a queue's claim and ack.
--
-- * A claim's UPDATE wrote a new entry into five of the six indexes of queue_messages. The
--   index on (queue_id, state, seq) is replaced by two partial ones on (queue_id, seq): the
--   ready messages (state 0, what a claim scans in seq order) and the dead ones (state 2,
--   what queue_dead, requeue and purge_dead read); the in-flight ones are counted on the
--   deadline index. The key index leaves out the messages without a key. A claim of a
--   message without a key now writes three index entries (the primary key, (queue_id, id)
--   and the deadline index), one with a key four.
-- * The time-out probe of every step (is an in-flight message past its deadline?) read the
--   smallest deadline of the in-flight messages, walking the deadline index from its start
--   over the entries of messages acked since the last vacuum (their deadlines are in the
--   future); it now asks for an in-flight message with deadline <= now, a range that ends
--   at now.
-- * A claim locks and updates its message in one statement; ack and queue_ack_claim find
--   the message by (queue_id, id) in one index look-up; queue_ack_claim probes for
--   time-outs once, not again in its claim (_queue_claim's new argument p_purged), and
--   queue_claim, queue_ack and queue_ack_claim look the queue up and probe for time-outs
--   in one statement. queue_claim and queue_ack_claim claim a message themselves when the
--   queue has no cap, and call _queue_claim only when it has one or nothing was found (its
--   own look follows; then it registers the waiter as before).
--
-- Safe on a populated schema (only indexes change; CREATE INDEX locks queue_messages
-- against writes while it builds). Compatibility: the signatures and answers of the queue_* functions are unchanged.

DROP INDEX __SCHEMA__.queue_messages_by_state;

CREATE INDEX queue_messages_ready ON __SCHEMA__.queue_messages (queue_id, seq)
    WHERE state = 0;

CREATE INDEX queue_messages_dead ON __SCHEMA__.queue_messages (queue_id, seq)
    WHERE state = 2;

DROP INDEX __SCHEMA__.queue_messages_by_key;

CREATE INDEX queue_messages_by_key ON __SCHEMA__.queue_messages (queue_id, key, seq)
    WHERE state < 2 AND key IS NOT NULL;

-- queue_machine.purge of the messages: in-flight messages past their deadline are ready
-- again (due at their deadline) or, after max_attempts, dead. Returns how many this step
-- took out of flight.
CREATE OR REPLACE FUNCTION __SCHEMA__._queue_purge(p_qid bigint, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_count integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM __SCHEMA__.queue_messages m
                   WHERE m.queue_id = p_qid AND m.state = 1 AND m.deadline <= p_now) THEN
        RETURN 0;
    END IF;
    UPDATE __SCHEMA__.queue_messages m
    SET state = CASE WHEN m.attempts >= m.max_attempts THEN 2 ELSE 0 END,
        died_at = CASE WHEN m.attempts >= m.max_attempts THEN m.deadline ELSE m.died_at END,
        available_at = CASE WHEN m.attempts >= m.max_attempts THEN m.available_at
                            ELSE m.deadline END,
        receipt = NULL, error = 'visibility timeout passed before ack'
    WHERE m.seq IN (SELECT e.seq FROM __SCHEMA__.queue_messages e
                    WHERE e.queue_id = p_qid AND e.state = 1 AND e.deadline <= p_now
                    ORDER BY e.deadline
                    FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;

DROP FUNCTION __SCHEMA__._queue_claim(bigint, text, double precision, integer, integer, text,
                                      timestamptz, text);

-- queue_machine.claim on queue p_qid at p_now (the caller's clock), without its wake-ups:
-- hand out the ready, due message with the smallest seq that heads its key (no earlier
-- pending message of the key), unless p_concurrency are in flight; else register p_waiter
-- (if given; woken on p_channel, NULL: the schema's channel) and say when to look again.
-- o_wake: how many waiters the step wakes (the caller wakes them, see queue_claim).
-- p_purged: the caller purged the time-outs at p_now already.
CREATE FUNCTION __SCHEMA__._queue_claim(
    p_qid bigint, p_receipt text, p_visibility double precision, p_concurrency integer,
    p_max_attempts integer, p_waiter text, p_now timestamptz, p_channel text,
    p_purged boolean DEFAULT false,
    OUT o_found boolean, OUT o_id text, OUT o_key text, OUT o_body bytea, OUT o_kind smallint,
    OUT o_attempt integer, OUT o_enqueued_at double precision, OUT o_deadline double precision,
    OUT o_retry_after double precision, OUT o_wake integer)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_freed integer := 0;
    v_deadline timestamptz := p_now + p_visibility * interval '1 second';
    v_next timestamptz;
BEGIN
    o_found := false;
    IF NOT p_purged AND EXISTS (
            SELECT 1 FROM __SCHEMA__.queue_messages m
            WHERE m.queue_id = p_qid AND m.state = 1 AND m.deadline <= p_now) THEN
        v_freed := __SCHEMA__._queue_purge(p_qid, p_now);
    END IF;
    IF p_concurrency IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(__SCHEMA__._queue_lock_key(p_qid, 2));
    END IF;
    FOR v_look IN 1..2 LOOP
        IF p_concurrency IS NULL OR (SELECT count(*) FROM __SCHEMA__.queue_messages m
                                     WHERE m.queue_id = p_qid AND m.state = 1) < p_concurrency
        THEN
            UPDATE __SCHEMA__.queue_messages m
            SET state = 1, attempts = m.attempts + 1, max_attempts = p_max_attempts,
                receipt = p_receipt, deadline = v_deadline
            WHERE m.seq = (
                SELECT r.seq FROM __SCHEMA__.queue_messages r
                WHERE r.queue_id = p_qid AND r.state = 0 AND r.available_at <= p_now
                  AND (r.key IS NULL OR NOT EXISTS (
                      SELECT 1 FROM __SCHEMA__.queue_messages o
                      WHERE o.queue_id = p_qid AND o.key = r.key AND o.state < 2
                        AND o.seq < r.seq))
                ORDER BY r.seq
                LIMIT 1
                FOR UPDATE OF r SKIP LOCKED)
            RETURNING true, m.id, m.key, m.body, m.kind, m.attempts,
                      extract(epoch FROM m.enqueued_at)
            INTO o_found, o_id, o_key, o_body, o_kind, o_attempt, o_enqueued_at;
            o_found := FOUND;
        END IF;
        EXIT WHEN o_found OR p_waiter IS NULL OR v_look = 2;
        -- Nothing for a consumer that will wait: look again holding the waiter lock.
        PERFORM pg_advisory_xact_lock(__SCHEMA__._queue_lock_key(p_qid, 3));
    END LOOP;
    IF NOT o_found THEN
        IF p_waiter IS NOT NULL THEN
            -- A lapsed registration is forgotten: this one joins at the end.
            DELETE FROM __SCHEMA__.queue_waiters w
            WHERE w.queue_id = p_qid AND w.expires_at <= p_now;
            INSERT INTO __SCHEMA__.queue_waiters (queue_id, waiter, expires_at, channel)
            VALUES (p_qid, p_waiter, p_now + interval '6 seconds', p_channel)  -- queue_model.WAITER_TTL
            ON CONFLICT (queue_id, waiter) DO UPDATE
            SET expires_at = excluded.expires_at,
                channel = coalesce(excluded.channel, __SCHEMA__.queue_waiters.channel);
        END IF;
        SELECT least(
            (SELECT min(m.available_at) FROM __SCHEMA__.queue_messages m
             WHERE m.queue_id = p_qid AND m.state = 0 AND m.available_at > p_now),
            (SELECT min(m.deadline) FROM __SCHEMA__.queue_messages m
             WHERE m.queue_id = p_qid AND m.state = 1)) INTO v_next;
        IF v_next IS NOT NULL THEN
            o_retry_after := greatest(0, extract(epoch FROM v_next) - extract(epoch FROM p_now));
        END IF;
        o_wake := v_freed;
        RETURN;
    END IF;
    IF p_waiter IS NOT NULL THEN
        DELETE FROM __SCHEMA__.queue_waiters w WHERE w.queue_id = p_qid AND w.waiter = p_waiter;
    END IF;
    o_deadline := extract(epoch FROM v_deadline);
    o_wake := v_freed - 1;
END
$$;

CREATE OR REPLACE FUNCTION __SCHEMA__.queue_claim(
    p_name text, p_receipt text, p_visibility double precision, p_concurrency integer,
    p_max_attempts integer, p_waiter text, p_now timestamptz, p_channel text,
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
    v_wake := v_wake + v_claim_wake;  -- a delivery takes one of the freed messages
    IF v_wake > 0 THEN
        PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_wake, v_now, NULL);
    END IF;
END
$$;

-- queue_machine.ack of (p_id, p_ack_receipt), then queue_machine.claim, at one time in one
-- transaction (the worker loop: settle a message and take the next in one round trip).
-- p_waiter must be new (not registered before this call): then the waiters this wakes are
-- exactly those the ack then the claim would wake (never p_waiter itself: the ack came
-- before its registration).
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
    DELETE FROM __SCHEMA__.queue_messages m
    WHERE m.queue_id = v_qid AND m.id = p_id
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

-- ack, nack and extend find the message by its id (the unique index), then act only if it
-- is in flight with this receipt and its deadline has not passed.
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
    DELETE FROM __SCHEMA__.queue_messages m
    WHERE m.queue_id = v_qid AND m.id = p_id
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
