-- Turnstile PostgreSQL schema, version 6: callback grants.
--
-- A waiter may wait with a callback (a Step Functions task token, an HTTP URL: the JSON text
-- of turnstile._core.callbacks.encode) instead of a connection (lock_machine.py, "Callback
-- waiters"). Its grant is written by whichever step makes it (acquire, release, set_limit,
-- a deliverer's take, a refused delivery), in that same transaction, claimed at once for
-- the full ttl and with a pending delivery on the holder row; it is never NOTIFYed (nobody
-- listens for it). A deliverer claims pending deliveries (take_deliveries, with a claim
-- lease of its own: claimed_until) and settles them (settle_delivery: delivered, refused,
-- which releases the grant and grants the next in line, or retry later). Nobody polls for a
-- callback waiter, so expiries on a name with callbacks are acted on by take_deliveries.
--
-- Safe on a populated schema: the new columns are NULL or have a constant default (no table
-- rewrite), the two new indexes are partial and start empty (no row has a callback yet),
-- and the functions of the lock hot path keep their text but for _promote, which gains one
-- branch. A callback's text is a credential (a task token): status shows its kind only.
--
-- Compatibility: status gains two output columns (the callback kinds), so it is dropped and
-- made again; a client of the previous release selects its four columns by name and never
-- sees the new ones.

ALTER TABLE __SCHEMA__.holders
    ADD COLUMN callback text,
    ADD COLUMN pending boolean NOT NULL DEFAULT false,
    ADD COLUMN claimed_until timestamptz NOT NULL DEFAULT '-infinity',
    ADD COLUMN attempts integer NOT NULL DEFAULT 0;

ALTER TABLE __SCHEMA__.waiters ADD COLUMN callback text;

-- Pending deliveries by the end of their claim: the deliverer's poll asks for those whose
-- claim is free (claimed_until <= now), an empty range of an empty index when none is.
CREATE INDEX holders_pending ON __SCHEMA__.holders (claimed_until) WHERE pending;

-- Names with callback waiters. Keyed on name_id only (the predicate column, callback, is
-- never updated by the lock operations), so a waiter that keeps its place (an UPDATE of
-- expires_at) is still a HOT update.
CREATE INDEX waiters_callbacks ON __SCHEMA__.waiters (name_id) WHERE callback IS NOT NULL;

-- lock_machine.promote, as in version 3, plus callback waiters: granted claimed for their
-- full ttl with a pending delivery (claimed_until -infinity: nobody's claim), never woken.
CREATE OR REPLACE FUNCTION __SCHEMA__._promote(
    p_id bigint, p_name text, p_limit integer, p_now timestamptz, p_last bigint,
    p_quiet text, p_holders integer DEFAULT NULL, OUT o_last bigint, OUT o_holders integer)
LANGUAGE plpgsql
AS $$
DECLARE
    w record;
    v_exp timestamptz;
BEGIN
    o_last := p_last;
    o_holders := p_holders;
    IF o_holders IS NULL THEN
        SELECT count(*) INTO o_holders FROM __SCHEMA__.holders h WHERE h.name_id = p_id;
    END IF;
    WHILE o_holders < p_limit LOOP
        DELETE FROM __SCHEMA__.waiters d
        WHERE d.seq = (SELECT f.seq FROM __SCHEMA__.waiters f WHERE f.name_id = p_id
                       ORDER BY f.seq LIMIT 1)
        RETURNING d.seq, d.holder, d.ttl, d.wait_ttl, d.expires_at, d.channel, d.wake,
                  d.callback INTO w;
        EXIT WHEN NOT FOUND;
        CONTINUE WHEN w.expires_at <= p_now;
        o_last := greatest(o_last + 1, floor(extract(epoch FROM p_now) * 1000000)::bigint);
        o_holders := o_holders + 1;
        IF w.callback IS NOT NULL THEN
            -- Nobody to wake and nobody to claim it: claimed for its full ttl, its delivery
            -- pending, in this very transaction.
            INSERT INTO __SCHEMA__.holders
                (name_id, holder, token, acquired_at, expires_at, claimed, callback, pending)
            VALUES (p_id, w.holder, o_last, p_now, p_now + w.ttl * interval '1 second', true,
                    w.callback, true);
            CONTINUE;
        END IF;
        v_exp := p_now + least(w.ttl, w.wait_ttl) * interval '1 second';
        -- A holder is never also waiting (acquire returns early for a holder), so this
        -- insert cannot conflict.
        INSERT INTO __SCHEMA__.holders (name_id, holder, token, acquired_at, expires_at, claimed)
        VALUES (p_id, w.holder, o_last, p_now, v_exp, false);
        IF w.holder IS DISTINCT FROM p_quiet THEN
            IF w.channel IS NULL THEN
                PERFORM pg_notify(__CHANNEL__, __SCHEMA__.wake_key(p_name, w.holder));
            ELSIF w.channel <> '' THEN
                PERFORM pg_notify(w.channel, concat_ws(' ', w.wake, w.seq, o_last,
                    extract(epoch FROM p_now), extract(epoch FROM v_exp)));
            END IF;
        END IF;
    END LOOP;
END
$$;

-- lock_machine.acquire with a callback (always enqueue): the acquire above, with no wake
-- channel (''), then, in the same transaction and under the name's row lock that it took,
-- the callback recorded: on the caller's waiting entry, or, if it holds, on its grant,
-- whose delivery becomes pending unless it was already for this very callback (an ask
-- repeated is harmless; a new callback gets the current grant delivered there).
CREATE FUNCTION __SCHEMA__.acquire_callback(
    p_name text, p_holder text, p_limit integer, p_ttl double precision,
    p_wait_ttl double precision, p_now timestamptz, p_callback text,
    OUT granted boolean, OUT token bigint, OUT acquired_at double precision,
    OUT expires_at double precision, OUT queue_position integer, OUT now double precision,
    OUT retry_after double precision)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
BEGIN
    IF p_callback IS NULL OR p_callback = '' THEN
        RAISE EXCEPTION 'turnstile: acquire_callback needs a callback'
            USING ERRCODE = '22023';
    END IF;
    SELECT a.granted, a.token, a.acquired_at, a.expires_at, a.queue_position, a.now,
           a.retry_after
    INTO granted, token, acquired_at, expires_at, queue_position, now, retry_after
    FROM __SCHEMA__.acquire(p_name, p_holder, p_limit, p_ttl, p_wait_ttl, true, p_now,
                            ''::text, NULL::text) a;
    SELECT n.id INTO v_id
    FROM __SCHEMA__.names n WHERE n.key = sha256(convert_to(p_name, 'UTF8'));
    IF granted THEN
        UPDATE __SCHEMA__.holders h
        SET callback = p_callback, pending = true, claimed_until = '-infinity', attempts = 0
        WHERE h.name_id = v_id AND h.holder = p_holder
          AND h.callback IS DISTINCT FROM p_callback;
    ELSE
        UPDATE __SCHEMA__.waiters w SET callback = p_callback
        WHERE w.name_id = v_id AND w.holder = p_holder
          AND w.callback IS DISTINCT FROM p_callback;
    END IF;
END
$$;

-- lock_machine.due and take_deliveries on one name whose row the caller has locked: drop
-- what expired (an undelivered grant with it), grant what that freed (callback waiters
-- with a pending delivery, others woken), claim up to p_max pending deliveries whose claim
-- is free for p_lease seconds, oldest grant first. Nothing at all unless the name has
-- callbacks (a callback waiter or a pending delivery) and something is due.
CREATE FUNCTION __SCHEMA__._take_name(
    p_id bigint, p_name text, p_lim integer, p_last bigint, p_lease double precision,
    p_max integer, p_now timestamptz)
RETURNS TABLE (o_holder text, o_token bigint, o_acquired_at double precision,
               o_expires_at double precision, o_callback text, o_attempts integer)
LANGUAGE plpgsql
AS $$
DECLARE
    v_last bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM __SCHEMA__.waiters w
                   WHERE w.name_id = p_id AND w.callback IS NOT NULL)
       AND NOT EXISTS (SELECT 1 FROM __SCHEMA__.holders h
                       WHERE h.name_id = p_id AND h.pending) THEN
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM __SCHEMA__.holders h
                   WHERE h.name_id = p_id
                     AND (h.expires_at <= p_now OR (h.pending AND h.claimed_until <= p_now)))
       AND NOT EXISTS (SELECT 1 FROM __SCHEMA__.waiters w
                       WHERE w.name_id = p_id AND w.expires_at <= p_now) THEN
        RETURN;
    END IF;
    DELETE FROM __SCHEMA__.holders h WHERE h.name_id = p_id AND h.expires_at <= p_now;
    DELETE FROM __SCHEMA__.waiters w WHERE w.name_id = p_id AND w.expires_at <= p_now;
    SELECT p.o_last INTO v_last
    FROM __SCHEMA__._promote(p_id, p_name, p_lim, p_now, p_last, NULL) p;
    PERFORM __SCHEMA__._settle(p_id, p_now, v_last, p_lim);
    IF p_max <= 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH taken AS (
        UPDATE __SCHEMA__.holders h
        SET claimed_until = p_now + p_lease * interval '1 second', attempts = h.attempts + 1
        WHERE h.name_id = p_id
          AND h.holder IN (SELECT c.holder FROM __SCHEMA__.holders c
                           WHERE c.name_id = p_id AND c.pending AND c.claimed_until <= p_now
                           ORDER BY c.token LIMIT p_max)
        RETURNING h.holder, h.token, h.acquired_at, h.expires_at, h.callback, h.attempts)
    SELECT k.holder, k.token, extract(epoch FROM k.acquired_at)::float8,
           extract(epoch FROM k.expires_at)::float8, k.callback, k.attempts
    FROM taken k ORDER BY k.token;
END
$$;

-- A deliverer's poll (lock_machine.take_deliveries over every name of the schema): the
-- names that may be due are found from the two partial indexes (names with callback
-- waiters, pending deliveries), so a poll with nothing due reads a few index entries and
-- writes nothing. Each candidate's row is locked as every operation locks it, skipping one
-- another transaction holds (a concurrent deliverer, a busy name: the next poll takes it),
-- and checked again under the lock: two deliverers never claim the same delivery. Names
-- where an expiry is due come first, then by their oldest claimable delivery. The row
-- locks are held to the end of this transaction (one statement, autocommit), so a poll
-- does a bounded amount: every name where an expiry is due, and up to p_max deliveries.
CREATE FUNCTION __SCHEMA__.take_deliveries(
    p_lease double precision, p_max integer, p_now timestamptz DEFAULT NULL)
RETURNS TABLE (o_name text, o_holder text, o_token bigint, o_acquired_at double precision,
               o_expires_at double precision, o_limit integer, o_callback text,
               o_attempts integer)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    c record;
    n record;
    t record;
    v_taken integer := 0;
BEGIN
    FOR c IN
        WITH RECURSIVE waiting(name_id) AS (
            -- distinct names with callback waiters, one index probe each
            (SELECT w.name_id FROM __SCHEMA__.waiters w WHERE w.callback IS NOT NULL
             ORDER BY w.name_id LIMIT 1)
            UNION ALL
            SELECT (SELECT w.name_id FROM __SCHEMA__.waiters w
                    WHERE w.callback IS NOT NULL AND w.name_id > s.name_id
                    ORDER BY w.name_id LIMIT 1)
            FROM waiting s WHERE s.name_id IS NOT NULL),
        pending AS (
            SELECT h.name_id, min(h.token) FILTER (WHERE h.claimed_until <= v_now) AS first
            FROM __SCHEMA__.holders h WHERE h.pending
            GROUP BY h.name_id),
        candidates AS (
            SELECT coalesce(p.name_id, s.name_id) AS name_id, p.first
            FROM (SELECT s.name_id FROM waiting s WHERE s.name_id IS NOT NULL) s
            FULL JOIN pending p ON p.name_id = s.name_id)
        SELECT d.name_id, d.first,
               EXISTS (SELECT 1 FROM __SCHEMA__.holders h
                       WHERE h.name_id = d.name_id AND h.expires_at <= v_now) AS expired
        FROM candidates d
        ORDER BY 3 DESC, d.first NULLS LAST
    LOOP
        CONTINUE WHEN NOT c.expired AND (c.first IS NULL OR v_taken >= p_max);
        SELECT k.id, k.name, k.lim, k.last_token INTO n
        FROM __SCHEMA__.names k WHERE k.id = c.name_id
        FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        v_now := coalesce(p_now, clock_timestamp());  -- read after the lock, as everywhere
        FOR t IN
            SELECT * FROM __SCHEMA__._take_name(n.id, n.name, n.lim, n.last_token, p_lease,
                                                p_max - v_taken, v_now)
        LOOP
            v_taken := v_taken + 1;
            o_name := n.name;
            o_holder := t.o_holder;
            o_token := t.o_token;
            o_acquired_at := t.o_acquired_at;
            o_expires_at := t.o_expires_at;
            o_limit := n.lim;
            o_callback := t.o_callback;
            o_attempts := t.o_attempts;
            RETURN NEXT;
        END LOOP;
    END LOOP;
END
$$;

-- lock_machine.settle_delivery: the pending delivery of grant p_token on p_name, settled
-- as delivered (done), refused (the grant released and the next in line granted, and woken,
-- in this transaction) or retry (its claim freed p_retry_in seconds from now). False,
-- changing nothing, when the grant is gone or was settled already.
CREATE FUNCTION __SCHEMA__.settle_delivery(
    p_name text, p_token bigint, p_outcome text, p_retry_in double precision,
    p_now timestamptz DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
    v_lim integer;
    v_last bigint;
    v_now timestamptz;
    v_count integer;
BEGIN
    IF p_outcome NOT IN ('delivered', 'refused', 'retry') THEN
        RAISE EXCEPTION 'turnstile: unknown delivery outcome %', p_outcome
            USING ERRCODE = '22023';
    END IF;
    SELECT n.id, n.lim, n.last_token INTO v_id, v_lim, v_last
    FROM __SCHEMA__.names n WHERE n.key = sha256(convert_to(p_name, 'UTF8'))
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    v_now := coalesce(p_now, clock_timestamp());
    DELETE FROM __SCHEMA__.holders h WHERE h.name_id = v_id AND h.expires_at <= v_now;
    DELETE FROM __SCHEMA__.waiters w WHERE w.name_id = v_id AND w.expires_at <= v_now;
    IF p_outcome = 'delivered' THEN
        UPDATE __SCHEMA__.holders h SET pending = false, claimed_until = '-infinity'
        WHERE h.name_id = v_id AND h.token = p_token AND h.pending;
    ELSIF p_outcome = 'refused' THEN
        DELETE FROM __SCHEMA__.holders h
        WHERE h.name_id = v_id AND h.token = p_token AND h.pending;
    ELSE
        UPDATE __SCHEMA__.holders h
        SET claimed_until = v_now + p_retry_in * interval '1 second'
        WHERE h.name_id = v_id AND h.token = p_token AND h.pending;
    END IF;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    SELECT p.o_last INTO v_last
    FROM __SCHEMA__._promote(v_id, p_name, v_lim, v_now, v_last, NULL) p;
    PERFORM __SCHEMA__._settle(v_id, v_now, v_last, v_lim);
    RETURN v_count > 0;
END
$$;

-- The kind of a stored callback ("sfn", "http"; "unknown" for text that is not what
-- callbacks.encode makes), read off its start without parsing it: never its text.
CREATE FUNCTION __SCHEMA__._callback_kind(p_callback text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_callback IS NULL THEN NULL
                ELSE coalesce(substring(p_callback FROM '^\{"kind":"(sfn|http)",'), 'unknown')
           END
$$;

-- lock_machine.status, as in version 1, plus the callbacks' kinds (never their text, a
-- credential): holder_callbacks has one entry per entry of holders, in the same order,
-- NULL or [kind, pending]; waiter_callbacks likewise NULL or the kind.
DROP FUNCTION __SCHEMA__.status(text, timestamptz);
CREATE FUNCTION __SCHEMA__.status(
    p_name text, p_now timestamptz DEFAULT NULL,
    OUT lim integer, OUT now double precision, OUT holders json, OUT waiters json,
    OUT holder_callbacks json, OUT waiter_callbacks json)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
    v_lim integer;
    v_now timestamptz := coalesce(p_now, clock_timestamp());
BEGIN
    now := extract(epoch FROM v_now);
    holders := '[]';
    waiters := '[]';
    holder_callbacks := '[]';
    waiter_callbacks := '[]';
    SELECT n.id, n.lim INTO v_id, v_lim
    FROM __SCHEMA__.names n WHERE n.key = sha256(convert_to(p_name, 'UTF8'));
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM __SCHEMA__.holders h WHERE h.name_id = v_id)
       OR EXISTS (SELECT 1 FROM __SCHEMA__.waiters w WHERE w.name_id = v_id) THEN
        lim := v_lim;
    END IF;
    SELECT coalesce(json_agg(json_build_array(h.holder, h.token, extract(epoch FROM h.acquired_at),
                                              extract(epoch FROM h.expires_at))
                             ORDER BY h.token), '[]'),
           coalesce(json_agg(CASE WHEN h.callback IS NOT NULL THEN
                                 json_build_array(__SCHEMA__._callback_kind(h.callback),
                                                  h.pending) END
                             ORDER BY h.token), '[]')
    INTO holders, holder_callbacks
    FROM __SCHEMA__.holders h WHERE h.name_id = v_id AND h.expires_at > v_now;
    SELECT coalesce(json_agg(json_build_array(w.holder, extract(epoch FROM w.joined_at),
                                              extract(epoch FROM w.expires_at))
                             ORDER BY w.seq), '[]'),
           coalesce(json_agg(__SCHEMA__._callback_kind(w.callback) ORDER BY w.seq), '[]')
    INTO waiters, waiter_callbacks
    FROM __SCHEMA__.waiters w WHERE w.name_id = v_id AND w.expires_at > v_now;
END
$$;
