-- Turnstile PostgreSQL schema, version 11: the operations of one queue no longer wait for
-- one another on the queue's row.
--
-- Before: every queue function began by locking the queue's row in `queues` (FOR UPDATE),
-- so all the puts, claims and acks of one queue ran one at a time, each holding the row
-- until its commit; and every step swept the in-flight messages for time-outs with a
-- statement whose plan, on a table without statistics, scanned every pending message of
-- the queue.
--
-- Now the row is only read (its id); what the row lock guaranteed is kept by narrower means:
--
-- * Claims run side by side: a claim takes the first deliverable message in seq order
--   FOR UPDATE SKIP LOCKED. Only claims lock a ready message, so a message a claim skips is
--   being handed out by another claim. A message heads its key when no earlier message of
--   the key is pending (ready or in flight); a key's messages only leave (acked, dead), and
--   a new one always comes later in seq order, so a claim that sees a key blocked on an old
--   snapshot was at worst early, and two claims can never both take messages of one key.
-- * Puts (and requeue, which gives messages a new seq, and purge_dead) take the queue's put
--   lock: seq order is commit order, so no claim can see a later message of a key (or of the queue) before
--   an earlier one is committed; FIFO and dedup stay exact.
-- * A capped claim (p_concurrency set) counts the messages in flight holding the queue's cap
--   lock: two capped claims never both see room for one.
-- * No missed wake-up: a step that wakes waiters takes the queue's waiter lock shared, as its
--   last lock, just before it looks for waiters; a claim that found nothing and is going to
--   register looks again holding that lock exclusively. Either the waking step committed
--   before that second look (which then sees its message), or it looks for waiters after
--   the registration committed.
-- * Time-outs (_queue_purge): one probe of the in-flight messages' deadline index; the rows
--   past their deadline are locked SKIP LOCKED (a row another step holds is being purged or
--   settled by it), so two steps never both count one time-out. Expired waiters and dedup
--   entries are ignored where they would matter (a wake-up, a dedup check, a registration)
--   and deleted by the put and the registering claim.
--
-- The locks are transaction-scoped advisory locks (released at COMMIT: safe through a
-- transaction pooler), keyed by _queue_lock_key. A step never waits for a row while holding
-- the waiter lock, and a waiter-lock holder waits for nothing, so they cannot deadlock.
--
-- The signatures and answers of every queue function are unchanged (queue_claim's two
-- signatures included). New: queue_ack_claim, the worker loop's step between two messages
-- (ack one, claim the next, one transaction), and the helpers _queue_id, _queue_lock_key and
-- _queue_claim; _queue_wake takes the step's time and a waiter to leave out; _queue_lock goes.

-- The id of queue p_name's row, making the row on first use. Not locked.
CREATE FUNCTION __SCHEMA__._queue_id(p_name text) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key bytea := sha256(convert_to(p_name, 'UTF8'));
    v_id bigint;
BEGIN
    SELECT q.id INTO v_id FROM __SCHEMA__.queues q WHERE q.key = v_key;
    IF v_id IS NULL THEN
        INSERT INTO __SCHEMA__.queues (key, name) VALUES (v_key, p_name)
        ON CONFLICT DO NOTHING
        RETURNING id INTO v_id;
        IF v_id IS NULL THEN  -- made meanwhile (ON CONFLICT waited for its commit)
            SELECT q.id INTO v_id FROM __SCHEMA__.queues q WHERE q.key = v_key;
        END IF;
    END IF;
    RETURN v_id;
END
$$;

-- The advisory lock p_kind of queue p_qid (transaction-scoped): 1 its puts, 2 its capped
-- claims, 3 its waiters. Seeded with the schema's channel, so schemas do not share them.
CREATE FUNCTION __SCHEMA__._queue_lock_key(p_qid bigint, p_kind integer) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
    SELECT hashtextextended(__CHANNEL__, p_qid * 4 + p_kind)
$$;

-- queue_machine.purge of the messages: in-flight messages past their deadline are ready
-- again (due at their deadline) or, after max_attempts, dead. Returns how many this step
-- took out of flight.
CREATE OR REPLACE FUNCTION __SCHEMA__._queue_purge(p_qid bigint, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_first timestamptz;
    v_count integer;
BEGIN
    SELECT m.deadline INTO v_first FROM __SCHEMA__.queue_messages m
    WHERE m.queue_id = p_qid AND m.state = 1
    ORDER BY m.deadline
    LIMIT 1;
    IF v_first IS NULL OR v_first > p_now THEN
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

-- queue_machine.take_waiters: wake the p_count oldest live waiters but p_except, each on its
-- own channel where it named one. Holds the queue's waiter lock shared until the commit (see above).
CREATE FUNCTION __SCHEMA__._queue_wake(p_qid bigint, p_name text, p_count integer,
                                       p_now timestamptz, p_except text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    w record;
BEGIN
    IF p_count <= 0 THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(__SCHEMA__._queue_lock_key(p_qid, 3));
    FOR w IN
        DELETE FROM __SCHEMA__.queue_waiters d
        WHERE d.seq IN (SELECT f.seq FROM __SCHEMA__.queue_waiters f
                        WHERE f.queue_id = p_qid AND f.expires_at > p_now
                          AND f.waiter IS DISTINCT FROM p_except
                        ORDER BY f.seq
                        LIMIT p_count
                        FOR UPDATE SKIP LOCKED)
        RETURNING d.waiter, d.channel
    LOOP
        PERFORM pg_notify(coalesce(nullif(w.channel, ''), __CHANNEL__),
                          __SCHEMA__.queue_wake_key(p_name, w.waiter));
    END LOOP;
END
$$;

DROP FUNCTION __SCHEMA__._queue_wake(bigint, text, integer);

CREATE OR REPLACE FUNCTION __SCHEMA__.queue_put(
    p_name text, p_id text, p_key text, p_body bytea, p_kind smallint,
    p_delay double precision, p_dedup_id text, p_max_attempts integer,
    p_dedup_window double precision, p_now timestamptz DEFAULT NULL,
    OUT o_id text, OUT o_created boolean, OUT o_now double precision)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_qid bigint := __SCHEMA__._queue_id(p_name);
    v_now timestamptz;
    v_freed integer;
BEGIN
    PERFORM pg_advisory_xact_lock(__SCHEMA__._queue_lock_key(v_qid, 1));
    v_now := coalesce(p_now, clock_timestamp());
    v_freed := __SCHEMA__._queue_purge(v_qid, v_now);
    o_now := extract(epoch FROM v_now);
    o_created := false;
    DELETE FROM __SCHEMA__.queue_dedup d WHERE d.queue_id = v_qid AND d.expires_at <= v_now;
    IF p_dedup_id IS NOT NULL THEN
        SELECT d.id INTO o_id FROM __SCHEMA__.queue_dedup d
        WHERE d.queue_id = v_qid AND d.dedup_id = p_dedup_id;
        IF FOUND THEN
            PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed, v_now, NULL);
            RETURN;
        END IF;
    END IF;
    o_id := p_id;
    INSERT INTO __SCHEMA__.queue_messages (queue_id, id, key, body, kind, enqueued_at,
        available_at, attempts, max_attempts, state)
    VALUES (v_qid, p_id, p_key, p_body, p_kind, v_now,
            v_now + p_delay * interval '1 second', 0, p_max_attempts, 0)
    ON CONFLICT (queue_id, id) DO NOTHING;
    IF NOT FOUND THEN  -- a client retrying the very same put
        PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed, v_now, NULL);
        RETURN;
    END IF;
    IF p_dedup_id IS NOT NULL THEN
        INSERT INTO __SCHEMA__.queue_dedup (queue_id, dedup_id, id, expires_at)
        VALUES (v_qid, p_dedup_id, p_id, v_now + p_dedup_window * interval '1 second');
    END IF;
    o_created := true;
    PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed + 1, v_now, NULL);
END
$$;

-- queue_machine.claim on queue p_qid at p_now (the caller's clock), without its wake-ups:
-- hand out the ready, due message with the smallest seq that heads its key (no earlier
-- pending message of the key), unless p_concurrency are in flight; else register p_waiter
-- (if given; woken on p_channel, NULL: the schema's channel) and say when to look again.
-- o_wake: how many waiters the step wakes (the caller wakes them, see queue_claim).
CREATE FUNCTION __SCHEMA__._queue_claim(
    p_qid bigint, p_receipt text, p_visibility double precision, p_concurrency integer,
    p_max_attempts integer, p_waiter text, p_now timestamptz, p_channel text,
    OUT o_found boolean, OUT o_id text, OUT o_key text, OUT o_body bytea, OUT o_kind smallint,
    OUT o_attempt integer, OUT o_enqueued_at double precision, OUT o_deadline double precision,
    OUT o_retry_after double precision, OUT o_wake integer)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_first timestamptz;
    v_freed integer := 0;
    v_seq bigint;
    v_deadline timestamptz;
    v_next timestamptz;
BEGIN
    o_found := false;
    SELECT m.deadline INTO v_first FROM __SCHEMA__.queue_messages m
    WHERE m.queue_id = p_qid AND m.state = 1
    ORDER BY m.deadline
    LIMIT 1;
    IF v_first <= p_now THEN
        v_freed := __SCHEMA__._queue_purge(p_qid, p_now);
    END IF;
    IF p_concurrency IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(__SCHEMA__._queue_lock_key(p_qid, 2));
    END IF;
    FOR v_look IN 1..2 LOOP
        IF p_concurrency IS NULL OR (SELECT count(*) FROM __SCHEMA__.queue_messages m
                                     WHERE m.queue_id = p_qid AND m.state = 1) < p_concurrency
        THEN
            SELECT m.seq INTO v_seq FROM __SCHEMA__.queue_messages m
            WHERE m.queue_id = p_qid AND m.state = 0 AND m.available_at <= p_now
              AND (m.key IS NULL OR NOT EXISTS (
                  SELECT 1 FROM __SCHEMA__.queue_messages o
                  WHERE o.queue_id = p_qid AND o.key = m.key AND o.state < 2 AND o.seq < m.seq))
            ORDER BY m.seq
            LIMIT 1
            FOR UPDATE OF m SKIP LOCKED;
        END IF;
        EXIT WHEN v_seq IS NOT NULL OR p_waiter IS NULL OR v_look = 2;
        -- Nothing for a consumer that will wait: look again holding the waiter lock.
        PERFORM pg_advisory_xact_lock(__SCHEMA__._queue_lock_key(p_qid, 3));
    END LOOP;
    IF v_seq IS NULL THEN
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
    v_deadline := p_now + p_visibility * interval '1 second';
    UPDATE __SCHEMA__.queue_messages m
    SET state = 1, attempts = m.attempts + 1, max_attempts = p_max_attempts,
        receipt = p_receipt, deadline = v_deadline
    WHERE m.seq = v_seq
    RETURNING m.id, m.key, m.body, m.kind, m.attempts, extract(epoch FROM m.enqueued_at)
    INTO o_id, o_key, o_body, o_kind, o_attempt, o_enqueued_at;
    o_found := true;
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
    v_wake integer;
BEGIN
    SELECT q.id INTO v_qid FROM __SCHEMA__.queues q
    WHERE q.key = sha256(convert_to(p_name, 'UTF8'));
    IF v_qid IS NULL THEN
        v_qid := __SCHEMA__._queue_id(p_name);
    END IF;
    o_now := extract(epoch FROM v_now);
    SELECT c.o_found, c.o_id, c.o_key, c.o_body, c.o_kind, c.o_attempt, c.o_enqueued_at,
           c.o_deadline, c.o_retry_after, c.o_wake
    INTO o_found, o_id, o_key, o_body, o_kind, o_attempt, o_enqueued_at, o_deadline,
         o_retry_after, v_wake
    FROM __SCHEMA__._queue_claim(v_qid, p_receipt, p_visibility, p_concurrency,
                                 p_max_attempts, p_waiter, v_now, p_channel) c;
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
CREATE FUNCTION __SCHEMA__.queue_ack_claim(
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
    v_first timestamptz;
    v_wake integer := 0;
    v_claim_wake integer;
BEGIN
    SELECT q.id INTO v_qid FROM __SCHEMA__.queues q
    WHERE q.key = sha256(convert_to(p_name, 'UTF8'));
    IF v_qid IS NULL THEN
        v_qid := __SCHEMA__._queue_id(p_name);
    END IF;
    o_now := extract(epoch FROM v_now);
    SELECT m.deadline INTO v_first FROM __SCHEMA__.queue_messages m
    WHERE m.queue_id = v_qid AND m.state = 1
    ORDER BY m.deadline
    LIMIT 1;
    IF v_first <= v_now THEN
        v_wake := __SCHEMA__._queue_purge(v_qid, v_now);
    END IF;
    DELETE FROM __SCHEMA__.queue_messages m
    WHERE m.seq = (SELECT s.seq FROM __SCHEMA__.queue_messages s
                   WHERE s.queue_id = v_qid AND s.id = p_id)
      AND m.state = 1 AND m.receipt = p_ack_receipt AND m.deadline > v_now;
    o_acked := FOUND;
    IF o_acked THEN
        v_wake := v_wake + 1;
    END IF;
    SELECT c.o_found, c.o_id, c.o_key, c.o_body, c.o_kind, c.o_attempt, c.o_enqueued_at,
           c.o_deadline, c.o_retry_after, c.o_wake
    INTO o_found, o_id, o_key, o_body, o_kind, o_attempt, o_enqueued_at, o_deadline,
         o_retry_after, v_claim_wake
    FROM __SCHEMA__._queue_claim(v_qid, p_receipt, p_visibility, p_concurrency,
                                 p_max_attempts, p_waiter, v_now, p_channel) c;
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

-- The version-2 signature (no channel: woken on the schema's channel), kept for clients of
-- an older release during an upgrade.
CREATE OR REPLACE FUNCTION __SCHEMA__.queue_claim(
    p_name text, p_receipt text, p_visibility double precision, p_concurrency integer,
    p_max_attempts integer, p_waiter text, p_now timestamptz DEFAULT NULL,
    OUT o_found boolean, OUT o_id text, OUT o_key text, OUT o_body bytea, OUT o_kind smallint,
    OUT o_attempt integer, OUT o_enqueued_at double precision, OUT o_deadline double precision,
    OUT o_now double precision, OUT o_retry_after double precision)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    SELECT c.o_found, c.o_id, c.o_key, c.o_body, c.o_kind, c.o_attempt, c.o_enqueued_at,
           c.o_deadline, c.o_now, c.o_retry_after
    INTO o_found, o_id, o_key, o_body, o_kind, o_attempt, o_enqueued_at, o_deadline, o_now,
         o_retry_after
    FROM __SCHEMA__.queue_claim(p_name, p_receipt, p_visibility, p_concurrency,
                                p_max_attempts, p_waiter, p_now, NULL::text) c;
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
    v_first timestamptz;
    v_wake integer := 0;
    v_acked boolean;
BEGIN
    SELECT q.id INTO v_qid FROM __SCHEMA__.queues q
    WHERE q.key = sha256(convert_to(p_name, 'UTF8'));
    IF v_qid IS NULL THEN
        v_qid := __SCHEMA__._queue_id(p_name);
    END IF;
    SELECT m.deadline INTO v_first FROM __SCHEMA__.queue_messages m
    WHERE m.queue_id = v_qid AND m.state = 1
    ORDER BY m.deadline
    LIMIT 1;
    IF v_first <= v_now THEN
        v_wake := __SCHEMA__._queue_purge(v_qid, v_now);
    END IF;
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

CREATE OR REPLACE FUNCTION __SCHEMA__.queue_nack(
    p_name text, p_id text, p_receipt text, p_delay double precision, p_error text,
    p_now timestamptz DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_qid bigint := __SCHEMA__._queue_id(p_name);
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_freed integer := __SCHEMA__._queue_purge(v_qid, v_now);
BEGIN
    UPDATE __SCHEMA__.queue_messages m
    SET receipt = NULL, error = coalesce(p_error, 'nacked'),
        state = CASE WHEN m.attempts >= m.max_attempts THEN 2 ELSE 0 END,
        died_at = CASE WHEN m.attempts >= m.max_attempts THEN v_now ELSE m.died_at END,
        available_at = CASE WHEN m.attempts >= m.max_attempts THEN m.available_at
                            ELSE v_now + p_delay * interval '1 second' END
    WHERE m.seq = (SELECT s.seq FROM __SCHEMA__.queue_messages s
                   WHERE s.queue_id = v_qid AND s.id = p_id)
      AND m.state = 1 AND m.receipt = p_receipt AND m.deadline > v_now;
    IF FOUND THEN
        PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed + 1, v_now, NULL);
        RETURN true;
    END IF;
    PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed, v_now, NULL);
    RETURN false;
END
$$;

CREATE OR REPLACE FUNCTION __SCHEMA__.queue_extend(
    p_name text, p_id text, p_receipt text, p_seconds double precision,
    p_now timestamptz DEFAULT NULL)
RETURNS double precision
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_qid bigint := __SCHEMA__._queue_id(p_name);
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_freed integer := __SCHEMA__._queue_purge(v_qid, v_now);
    v_deadline timestamptz := v_now + p_seconds * interval '1 second';
    v_count integer;
BEGIN
    UPDATE __SCHEMA__.queue_messages m SET deadline = v_deadline
    WHERE m.seq = (SELECT s.seq FROM __SCHEMA__.queue_messages s
                   WHERE s.queue_id = v_qid AND s.id = p_id)
      AND m.state = 1 AND m.receipt = p_receipt AND m.deadline > v_now;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed, v_now, NULL);
    IF v_count > 0 THEN
        RETURN extract(epoch FROM v_deadline);
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION __SCHEMA__.queue_stats(
    p_name text, p_top integer, p_now timestamptz DEFAULT NULL,
    OUT o_ready bigint, OUT o_delayed bigint, OUT o_in_flight bigint, OUT o_dead bigint,
    OUT o_oldest double precision, OUT o_now double precision, OUT o_keys text[],
    OUT o_counts bigint[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_qid bigint := __SCHEMA__._queue_id(p_name);
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_freed integer := __SCHEMA__._queue_purge(v_qid, v_now);
BEGIN
    o_now := extract(epoch FROM v_now);
    SELECT count(*) FILTER (WHERE m.state = 0 AND m.available_at <= v_now),
           count(*) FILTER (WHERE m.state = 0 AND m.available_at > v_now),
           count(*) FILTER (WHERE m.state = 1),
           count(*) FILTER (WHERE m.state = 2),
           extract(epoch FROM min(m.enqueued_at) FILTER (WHERE m.state < 2))
    INTO o_ready, o_delayed, o_in_flight, o_dead, o_oldest
    FROM __SCHEMA__.queue_messages m WHERE m.queue_id = v_qid;
    SELECT coalesce(array_agg(d.key ORDER BY d.n DESC, d.key), '{}'),
           coalesce(array_agg(d.n ORDER BY d.n DESC, d.key), '{}')
    INTO o_keys, o_counts
    FROM (SELECT m.key, count(*) AS n FROM __SCHEMA__.queue_messages m
          WHERE m.queue_id = v_qid AND m.state < 2 AND m.key IS NOT NULL
          GROUP BY m.key ORDER BY n DESC, m.key LIMIT p_top) d;
    PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed, v_now, NULL);
END
$$;

CREATE OR REPLACE FUNCTION __SCHEMA__.queue_dead(
    p_name text, p_limit integer, p_now timestamptz DEFAULT NULL)
RETURNS TABLE (o_id text, o_key text, o_body bytea, o_kind smallint, o_attempts integer,
               o_enqueued_at double precision, o_died_at double precision, o_error text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_qid bigint := __SCHEMA__._queue_id(p_name);
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_freed integer := __SCHEMA__._queue_purge(v_qid, v_now);
BEGIN
    PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed, v_now, NULL);
    RETURN QUERY
    SELECT m.id, m.key, m.body, m.kind, m.attempts, extract(epoch FROM m.enqueued_at)::float8,
           extract(epoch FROM m.died_at)::float8, m.error
    FROM __SCHEMA__.queue_messages m
    WHERE m.queue_id = v_qid AND m.state = 2
    ORDER BY m.seq LIMIT p_limit;
END
$$;

-- queue_machine.requeue: dead letters (p_ids, or all when NULL) back at the end of the queue
-- (a new seq: under the put lock), due now, attempts reset, enqueued_at kept.
CREATE OR REPLACE FUNCTION __SCHEMA__.queue_requeue(
    p_name text, p_ids text[], p_now timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_qid bigint := __SCHEMA__._queue_id(p_name);
    v_now timestamptz;
    v_freed integer;
    v_count integer;
BEGIN
    PERFORM pg_advisory_xact_lock(__SCHEMA__._queue_lock_key(v_qid, 1));
    v_now := coalesce(p_now, clock_timestamp());
    v_freed := __SCHEMA__._queue_purge(v_qid, v_now);
    WITH gone AS (
        DELETE FROM __SCHEMA__.queue_messages m
        WHERE m.queue_id = v_qid AND m.state = 2 AND (p_ids IS NULL OR m.id = ANY (p_ids))
        RETURNING m.seq, m.id, m.key, m.body, m.kind, m.enqueued_at, m.max_attempts)
    INSERT INTO __SCHEMA__.queue_messages (queue_id, id, key, body, kind, enqueued_at,
        available_at, attempts, max_attempts, state)
    SELECT v_qid, g.id, g.key, g.body, g.kind, g.enqueued_at, v_now, 0, g.max_attempts, 0
    FROM gone g ORDER BY g.seq;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed + v_count, v_now, NULL);
    RETURN v_count;
END
$$;

CREATE OR REPLACE FUNCTION __SCHEMA__.queue_purge_dead(
    p_name text, p_ids text[], p_now timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_qid bigint := __SCHEMA__._queue_id(p_name);
    v_now timestamptz;
    v_freed integer;
    v_count integer;
BEGIN
    -- The put lock too: a requeue and a purge of the same dead letters never wait for each
    -- other's rows in opposite orders.
    PERFORM pg_advisory_xact_lock(__SCHEMA__._queue_lock_key(v_qid, 1));
    v_now := coalesce(p_now, clock_timestamp());
    v_freed := __SCHEMA__._queue_purge(v_qid, v_now);
    DELETE FROM __SCHEMA__.queue_messages m
    WHERE m.queue_id = v_qid AND m.state = 2 AND (p_ids IS NULL OR m.id = ANY (p_ids));
    GET DIAGNOSTICS v_count = ROW_COUNT;
    PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed, v_now, NULL);
    RETURN v_count;
END
$$;

DROP FUNCTION __SCHEMA__._queue_lock(text);
