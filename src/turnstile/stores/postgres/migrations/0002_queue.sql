-- Turnstile PostgreSQL schema, version 2: keyed FIFO queues (turnstile/_core/queue_model.py).
--
-- Every queue operation is one call of a function below, in its own (autocommit)
-- transaction. It first locks the queue's row in `queues` (SELECT ... FOR UPDATE), so the
-- operations of one queue are serialised: that is what makes the global in-flight cap exact,
-- keeps wake-ups from being missed (a consumer registers as a waiter inside the claim that
-- found nothing; a put that commits later sees it, a put that committed earlier is seen by
-- the claim), and makes every step follow the model. Different queues never wait for each
-- other. The clock is read after the lock (clock_timestamp()). A wake-up is one NOTIFY on the
-- schema's channel whose payload names the one waiter woken (queue_wake_key).

CREATE TABLE __SCHEMA__.queues (
    id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key  bytea NOT NULL UNIQUE,          -- sha256 of the name (names may be up to 4 KiB)
    name text COLLATE "C" NOT NULL
);

-- Every message not yet acked; seq (an identity, never going back) is the arrival order.
-- state: 0 ready (due at available_at), 1 in flight (until deadline, with receipt), 2 dead.
-- kind: 0 JSON text, 1 raw bytes.
CREATE TABLE __SCHEMA__.queue_messages (
    seq          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue_id     bigint NOT NULL,
    id           text COLLATE "C" NOT NULL,
    key          text COLLATE "C",
    body         bytea NOT NULL,
    kind         smallint NOT NULL,
    enqueued_at  timestamptz NOT NULL,
    available_at timestamptz NOT NULL,
    attempts     integer NOT NULL,
    max_attempts integer NOT NULL,
    state        smallint NOT NULL,
    receipt      text COLLATE "C",
    deadline     timestamptz,
    error        text,
    died_at      timestamptz,
    UNIQUE (queue_id, id)
);
CREATE INDEX queue_messages_by_state ON __SCHEMA__.queue_messages (queue_id, state, seq);
CREATE INDEX queue_messages_by_key ON __SCHEMA__.queue_messages (queue_id, key, seq)
    WHERE state < 2;
CREATE INDEX queue_messages_by_deadline ON __SCHEMA__.queue_messages (queue_id, deadline)
    WHERE state = 1;
CREATE INDEX queue_messages_by_due ON __SCHEMA__.queue_messages (queue_id, available_at)
    WHERE state = 0;

CREATE TABLE __SCHEMA__.queue_dedup (
    queue_id   bigint NOT NULL,
    dedup_id   text COLLATE "C" NOT NULL,
    id         text COLLATE "C" NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (queue_id, dedup_id)
);
CREATE INDEX queue_dedup_expiry ON __SCHEMA__.queue_dedup (queue_id, expires_at);

-- Blocked consumers, oldest first.
CREATE TABLE __SCHEMA__.queue_waiters (
    seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue_id   bigint NOT NULL,
    waiter     text COLLATE "C" NOT NULL,
    expires_at timestamptz NOT NULL,
    UNIQUE (queue_id, waiter)
);

-- The NOTIFY payload that wakes one queue waiter: 128 bits of
-- sha256(NUL "queue" NUL name NUL waiter), hex (lock names never start with NUL, so it never
-- equals a lock's wake_key). turnstile.backends.postgres_queue_sql.wake_key computes the same.
CREATE FUNCTION __SCHEMA__.queue_wake_key(p_name text, p_waiter text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
    SELECT left(encode(sha256('\x00'::bytea || convert_to('queue', 'UTF8') || '\x00'::bytea
                              || convert_to(p_name, 'UTF8') || '\x00'::bytea
                              || convert_to(p_waiter, 'UTF8')), 'hex'), 32)
$$;

-- Lock the row of queue p_name (creating it); every queue operation starts here.
CREATE FUNCTION __SCHEMA__._queue_lock(p_name text) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key bytea := sha256(convert_to(p_name, 'UTF8'));
    v_id bigint;
BEGIN
    FOR attempt IN 1..50 LOOP
        SELECT q.id INTO v_id FROM __SCHEMA__.queues q WHERE q.key = v_key FOR UPDATE;
        IF FOUND THEN
            RETURN v_id;
        END IF;
        INSERT INTO __SCHEMA__.queues (key, name) VALUES (v_key, p_name) ON CONFLICT DO NOTHING;
    END LOOP;
    RAISE EXCEPTION 'turnstile: could not lock the row of a queue' USING ERRCODE = '55P03';
END
$$;

-- queue_model.purge: time out in-flight messages past their deadline (dead letter after
-- max_attempts), drop expired dedup entries and waiters. Returns how many left flight.
CREATE FUNCTION __SCHEMA__._queue_purge(p_qid bigint, p_now timestamptz) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_dead integer;
    v_back integer;
BEGIN
    UPDATE __SCHEMA__.queue_messages m
    SET state = 2, died_at = m.deadline, receipt = NULL,
        error = 'visibility timeout passed before ack'
    WHERE m.queue_id = p_qid AND m.state = 1 AND m.deadline <= p_now
      AND m.attempts >= m.max_attempts;
    GET DIAGNOSTICS v_dead = ROW_COUNT;
    UPDATE __SCHEMA__.queue_messages m
    SET state = 0, available_at = m.deadline, receipt = NULL,
        error = 'visibility timeout passed before ack'
    WHERE m.queue_id = p_qid AND m.state = 1 AND m.deadline <= p_now;
    GET DIAGNOSTICS v_back = ROW_COUNT;
    DELETE FROM __SCHEMA__.queue_dedup d WHERE d.queue_id = p_qid AND d.expires_at <= p_now;
    DELETE FROM __SCHEMA__.queue_waiters w WHERE w.queue_id = p_qid AND w.expires_at <= p_now;
    RETURN v_dead + v_back;
END
$$;

-- queue_model.take_waiters: wake the p_count oldest waiters, one NOTIFY each (delivered at
-- commit).
CREATE FUNCTION __SCHEMA__._queue_wake(p_qid bigint, p_name text, p_count integer)
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
    FOR w IN
        DELETE FROM __SCHEMA__.queue_waiters d
        WHERE d.seq IN (SELECT f.seq FROM __SCHEMA__.queue_waiters f WHERE f.queue_id = p_qid
                        ORDER BY f.seq LIMIT p_count)
        RETURNING d.waiter
    LOOP
        PERFORM pg_notify(__CHANNEL__, __SCHEMA__.queue_wake_key(p_name, w.waiter));
    END LOOP;
END
$$;

CREATE FUNCTION __SCHEMA__.queue_put(
    p_name text, p_id text, p_key text, p_body bytea, p_kind smallint,
    p_delay double precision, p_dedup_id text, p_max_attempts integer,
    p_dedup_window double precision, p_now timestamptz DEFAULT NULL,
    OUT o_id text, OUT o_created boolean, OUT o_now double precision)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_qid bigint := __SCHEMA__._queue_lock(p_name);
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_freed integer := __SCHEMA__._queue_purge(v_qid, v_now);
BEGIN
    o_now := extract(epoch FROM v_now);
    o_created := false;
    IF p_dedup_id IS NOT NULL THEN
        SELECT d.id INTO o_id FROM __SCHEMA__.queue_dedup d
        WHERE d.queue_id = v_qid AND d.dedup_id = p_dedup_id;
        IF FOUND THEN
            PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed);
            RETURN;
        END IF;
    END IF;
    o_id := p_id;
    IF EXISTS (SELECT 1 FROM __SCHEMA__.queue_messages m
               WHERE m.queue_id = v_qid AND m.id = p_id) THEN
        PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed);
        RETURN;
    END IF;
    INSERT INTO __SCHEMA__.queue_messages (queue_id, id, key, body, kind, enqueued_at,
        available_at, attempts, max_attempts, state)
    VALUES (v_qid, p_id, p_key, p_body, p_kind, v_now,
            v_now + p_delay * interval '1 second', 0, p_max_attempts, 0);
    IF p_dedup_id IS NOT NULL THEN
        INSERT INTO __SCHEMA__.queue_dedup (queue_id, dedup_id, id, expires_at)
        VALUES (v_qid, p_dedup_id, p_id, v_now + p_dedup_window * interval '1 second');
    END IF;
    o_created := true;
    PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed + 1);
END
$$;

-- queue_model.claim: hand out the ready, due message with the smallest seq that heads its
-- key (no earlier pending message of the key), unless p_concurrency are in flight; else
-- register p_waiter (if given) and say when to look again.
CREATE FUNCTION __SCHEMA__.queue_claim(
    p_name text, p_receipt text, p_visibility double precision, p_concurrency integer,
    p_max_attempts integer, p_waiter text, p_now timestamptz DEFAULT NULL,
    OUT o_found boolean, OUT o_id text, OUT o_key text, OUT o_body bytea, OUT o_kind smallint,
    OUT o_attempt integer, OUT o_enqueued_at double precision, OUT o_deadline double precision,
    OUT o_now double precision, OUT o_retry_after double precision)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_qid bigint := __SCHEMA__._queue_lock(p_name);
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_freed integer := __SCHEMA__._queue_purge(v_qid, v_now);
    v_seq bigint;
    v_deadline timestamptz;
    v_next timestamptz;
BEGIN
    o_now := extract(epoch FROM v_now);
    o_found := false;
    IF p_concurrency IS NULL OR (SELECT count(*) FROM __SCHEMA__.queue_messages m
                                 WHERE m.queue_id = v_qid AND m.state = 1) < p_concurrency THEN
        SELECT m.seq INTO v_seq FROM __SCHEMA__.queue_messages m
        WHERE m.queue_id = v_qid AND m.state = 0 AND m.available_at <= v_now
          AND (m.key IS NULL OR NOT EXISTS (
              SELECT 1 FROM __SCHEMA__.queue_messages o
              WHERE o.queue_id = v_qid AND o.key = m.key AND o.state < 2 AND o.seq < m.seq))
        ORDER BY m.seq
        LIMIT 1;
    END IF;
    IF v_seq IS NULL THEN
        IF p_waiter IS NOT NULL THEN
            INSERT INTO __SCHEMA__.queue_waiters (queue_id, waiter, expires_at)
            VALUES (v_qid, p_waiter, v_now + interval '6 seconds')  -- queue_model.WAITER_TTL
            ON CONFLICT (queue_id, waiter) DO UPDATE SET expires_at = excluded.expires_at;
        END IF;
        SELECT least(
            (SELECT min(m.available_at) FROM __SCHEMA__.queue_messages m
             WHERE m.queue_id = v_qid AND m.state = 0 AND m.available_at > v_now),
            (SELECT min(m.deadline) FROM __SCHEMA__.queue_messages m
             WHERE m.queue_id = v_qid AND m.state = 1)) INTO v_next;
        IF v_next IS NOT NULL THEN
            o_retry_after := greatest(0, extract(epoch FROM v_next) - extract(epoch FROM v_now));
        END IF;
        PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed);
        RETURN;
    END IF;
    IF p_waiter IS NOT NULL THEN
        DELETE FROM __SCHEMA__.queue_waiters w WHERE w.queue_id = v_qid AND w.waiter = p_waiter;
    END IF;
    v_deadline := v_now + p_visibility * interval '1 second';
    UPDATE __SCHEMA__.queue_messages m
    SET state = 1, attempts = m.attempts + 1, max_attempts = p_max_attempts,
        receipt = p_receipt, deadline = v_deadline
    WHERE m.seq = v_seq
    RETURNING m.id, m.key, m.body, m.kind, m.attempts, extract(epoch FROM m.enqueued_at)
    INTO o_id, o_key, o_body, o_kind, o_attempt, o_enqueued_at;
    o_found := true;
    o_deadline := extract(epoch FROM v_deadline);
    PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed - 1);
END
$$;

CREATE FUNCTION __SCHEMA__.queue_ack(
    p_name text, p_id text, p_receipt text, p_now timestamptz DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_qid bigint := __SCHEMA__._queue_lock(p_name);
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_freed integer := __SCHEMA__._queue_purge(v_qid, v_now);
BEGIN
    DELETE FROM __SCHEMA__.queue_messages m
    WHERE m.queue_id = v_qid AND m.id = p_id AND m.state = 1 AND m.receipt = p_receipt;
    IF FOUND THEN
        PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed + 1);
        RETURN true;
    END IF;
    PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed);
    RETURN false;
END
$$;

CREATE FUNCTION __SCHEMA__.queue_nack(
    p_name text, p_id text, p_receipt text, p_delay double precision, p_error text,
    p_now timestamptz DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_qid bigint := __SCHEMA__._queue_lock(p_name);
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_freed integer := __SCHEMA__._queue_purge(v_qid, v_now);
BEGIN
    UPDATE __SCHEMA__.queue_messages m
    SET receipt = NULL, error = coalesce(p_error, 'nacked'),
        state = CASE WHEN m.attempts >= m.max_attempts THEN 2 ELSE 0 END,
        died_at = CASE WHEN m.attempts >= m.max_attempts THEN v_now ELSE m.died_at END,
        available_at = CASE WHEN m.attempts >= m.max_attempts THEN m.available_at
                            ELSE v_now + p_delay * interval '1 second' END
    WHERE m.queue_id = v_qid AND m.id = p_id AND m.state = 1 AND m.receipt = p_receipt;
    IF FOUND THEN
        PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed + 1);
        RETURN true;
    END IF;
    PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed);
    RETURN false;
END
$$;

CREATE FUNCTION __SCHEMA__.queue_extend(
    p_name text, p_id text, p_receipt text, p_seconds double precision,
    p_now timestamptz DEFAULT NULL)
RETURNS double precision
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_qid bigint := __SCHEMA__._queue_lock(p_name);
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_freed integer := __SCHEMA__._queue_purge(v_qid, v_now);
    v_deadline timestamptz := v_now + p_seconds * interval '1 second';
    v_count integer;
BEGIN
    UPDATE __SCHEMA__.queue_messages m SET deadline = v_deadline
    WHERE m.queue_id = v_qid AND m.id = p_id AND m.state = 1 AND m.receipt = p_receipt;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed);
    IF v_count > 0 THEN
        RETURN extract(epoch FROM v_deadline);
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION __SCHEMA__.queue_stats(
    p_name text, p_top integer, p_now timestamptz DEFAULT NULL,
    OUT o_ready bigint, OUT o_delayed bigint, OUT o_in_flight bigint, OUT o_dead bigint,
    OUT o_oldest double precision, OUT o_now double precision, OUT o_keys text[],
    OUT o_counts bigint[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_qid bigint := __SCHEMA__._queue_lock(p_name);
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
    PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed);
END
$$;

CREATE FUNCTION __SCHEMA__.queue_dead(
    p_name text, p_limit integer, p_now timestamptz DEFAULT NULL)
RETURNS TABLE (o_id text, o_key text, o_body bytea, o_kind smallint, o_attempts integer,
               o_enqueued_at double precision, o_died_at double precision, o_error text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_qid bigint := __SCHEMA__._queue_lock(p_name);
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_freed integer := __SCHEMA__._queue_purge(v_qid, v_now);
BEGIN
    PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed);
    RETURN QUERY
    SELECT m.id, m.key, m.body, m.kind, m.attempts, extract(epoch FROM m.enqueued_at)::float8,
           extract(epoch FROM m.died_at)::float8, m.error
    FROM __SCHEMA__.queue_messages m
    WHERE m.queue_id = v_qid AND m.state = 2
    ORDER BY m.seq LIMIT p_limit;
END
$$;

-- queue_model.requeue: dead letters (p_ids, or all when NULL) back at the end of the queue
-- (a new seq), due now, attempts reset, enqueued_at kept.
CREATE FUNCTION __SCHEMA__.queue_requeue(
    p_name text, p_ids text[], p_now timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_qid bigint := __SCHEMA__._queue_lock(p_name);
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_freed integer := __SCHEMA__._queue_purge(v_qid, v_now);
    v_count integer;
BEGIN
    WITH gone AS (
        DELETE FROM __SCHEMA__.queue_messages m
        WHERE m.queue_id = v_qid AND m.state = 2 AND (p_ids IS NULL OR m.id = ANY (p_ids))
        RETURNING m.seq, m.id, m.key, m.body, m.kind, m.enqueued_at, m.max_attempts)
    INSERT INTO __SCHEMA__.queue_messages (queue_id, id, key, body, kind, enqueued_at,
        available_at, attempts, max_attempts, state)
    SELECT v_qid, g.id, g.key, g.body, g.kind, g.enqueued_at, v_now, 0, g.max_attempts, 0
    FROM gone g ORDER BY g.seq;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed + v_count);
    RETURN v_count;
END
$$;

CREATE FUNCTION __SCHEMA__.queue_purge_dead(
    p_name text, p_ids text[], p_now timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_qid bigint := __SCHEMA__._queue_lock(p_name);
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_freed integer := __SCHEMA__._queue_purge(v_qid, v_now);
    v_count integer;
BEGIN
    DELETE FROM __SCHEMA__.queue_messages m
    WHERE m.queue_id = v_qid AND m.state = 2 AND (p_ids IS NULL OR m.id = ANY (p_ids));
    GET DIAGNOSTICS v_count = ROW_COUNT;
    PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed);
    RETURN v_count;
END
$$;

CREATE FUNCTION __SCHEMA__.queue_unregister(p_name text, p_waiter text) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM __SCHEMA__.queue_waiters w
    WHERE w.queue_id = (SELECT q.id FROM __SCHEMA__.queues q
                        WHERE q.key = sha256(convert_to(p_name, 'UTF8')))
      AND w.waiter = p_waiter;
END
$$;
