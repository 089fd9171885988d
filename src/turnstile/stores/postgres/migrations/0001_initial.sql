-- Turnstile PostgreSQL schema, version 1.
--
-- Applied once per schema by the migration runner (turnstile.backends.postgres_sql), inside
-- one transaction that holds a transaction-scoped advisory lock, so many processes starting
-- at once apply it exactly once. __SCHEMA__ is replaced by the quoted schema name and
-- __CHANNEL__ by the quoted NOTIFY channel of that schema; nothing outside the schema is
-- created or changed.
--
-- Every operation is one call of a function below, in its own (autocommit) transaction: it
-- locks the name's row in `names` (SELECT ... FOR UPDATE), reads the clock *after* taking
-- the lock (clock_timestamp(), so time never runs backwards between serialised operations)
-- and follows turnstile/_core/model.py step for step. Nothing relies on session state, so
-- the functions work through a transaction pooler.

-- One row per name that has been used recently. The row is the name's lock (every operation
-- on the name locks it first) and its fencing-token counter.
CREATE TABLE __SCHEMA__.names (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- sha256 of the name: names may be up to 4 KiB, longer than a btree entry may be.
    key         bytea NOT NULL UNIQUE,
    name        text COLLATE "C" NOT NULL,
    -- The limit last asked for (semaphores; 1 for locks).
    lim         integer NOT NULL,
    -- The last fencing token issued on this name. The next is
    -- max(last_token + 1, clock in microseconds) (model.clock_token).
    last_token  bigint NOT NULL DEFAULT 0,
    -- When the name last became idle (no holders, no waiters); NULL while in use. Idle rows
    -- are forgotten a day later (see _forget_idle), when the clock has moved far past
    -- last_token, so a recreated row still never repeats a token.
    idle_since  timestamptz
) WITH (fillfactor = 70);
CREATE INDEX names_idle ON __SCHEMA__.names (idle_since) WHERE idle_since IS NOT NULL;

-- Leases. claimed = false: handed over to a waiter that has not picked it up yet; such a
-- grant lasts min(ttl, wait_ttl) until the waiter's next acquire claims it for its ttl.
CREATE TABLE __SCHEMA__.holders (
    name_id     bigint NOT NULL,
    holder      text COLLATE "C" NOT NULL,
    token       bigint NOT NULL,
    acquired_at timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    claimed     boolean NOT NULL,
    PRIMARY KEY (name_id, holder)
) WITH (fillfactor = 70);

-- The line, in arrival order: seq comes from an identity sequence, which never goes back.
CREATE TABLE __SCHEMA__.waiters (
    seq         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name_id     bigint NOT NULL,
    holder      text COLLATE "C" NOT NULL,
    ttl         double precision NOT NULL,
    wait_ttl    double precision NOT NULL,
    joined_at   timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    UNIQUE (name_id, holder)
);
CREATE INDEX waiters_line ON __SCHEMA__.waiters (name_id, seq);

-- The NOTIFY payload that wakes one waiter: 128 bits of sha256(name NUL holder), hex.
-- Names and holders never contain NUL, so the encoding is unambiguous; the client computes
-- the same key (turnstile.backends.postgres_sql.wake_key) to find the waiter to wake.
CREATE FUNCTION __SCHEMA__.wake_key(p_name text, p_holder text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
    SELECT left(encode(sha256(convert_to(p_name, 'UTF8') || '\x00'::bytea
                              || convert_to(p_holder, 'UTF8')), 'hex'), 32)
$$;

-- Forget a few names idle for more than a day (bounded work, never waits for a lock).
CREATE FUNCTION __SCHEMA__._forget_idle(p_now timestamptz) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_horizon timestamptz := p_now - interval '1 day';
BEGIN
    DELETE FROM __SCHEMA__.names n
    WHERE n.id IN (
        SELECT i.id FROM __SCHEMA__.names i
        WHERE i.idle_since IS NOT NULL AND i.idle_since < v_horizon
          AND i.last_token < floor(extract(epoch FROM v_horizon) * 1000000)::bigint
        ORDER BY i.idle_since
        LIMIT 8
        FOR UPDATE SKIP LOCKED);
END
$$;

-- Lock the row of p_name, creating it (with limit p_limit) unless p_limit is NULL.
-- o_id is NULL when the row does not exist and was not to be created. p_now: see acquire.
CREATE FUNCTION __SCHEMA__._lock_name(
    p_name text, p_limit integer, p_now timestamptz,
    OUT o_id bigint, OUT o_lim integer, OUT o_last bigint)
LANGUAGE plpgsql
AS $$
DECLARE
    v_key bytea := sha256(convert_to(p_name, 'UTF8'));
    v_inserted integer;
BEGIN
    -- A concurrent _forget_idle may delete the row between our INSERT ... DO NOTHING and
    -- the SELECT; then we go round again. Bounded, though twice is already rare.
    FOR attempt IN 1..50 LOOP
        SELECT n.id, n.lim, n.last_token INTO o_id, o_lim, o_last
        FROM __SCHEMA__.names n WHERE n.key = v_key
        FOR UPDATE;
        IF FOUND OR p_limit IS NULL THEN
            RETURN;
        END IF;
        INSERT INTO __SCHEMA__.names (key, name, lim) VALUES (v_key, p_name, p_limit)
        ON CONFLICT DO NOTHING;
        GET DIAGNOSTICS v_inserted = ROW_COUNT;
        IF v_inserted > 0 THEN
            -- A new name: keep the table from growing without bound.
            PERFORM __SCHEMA__._forget_idle(coalesce(p_now, clock_timestamp()));
        END IF;
    END LOOP;
    RAISE EXCEPTION 'turnstile: could not lock the row of a name' USING ERRCODE = '55P03';
END
$$;

-- model.promote on others' behalf: grant free slots to waiters from the front of the line.
-- Each gets an unclaimed grant lasting min(ttl, wait_ttl) and is woken by one NOTIFY
-- (delivered when the transaction commits), unless it is p_quiet (the caller of an acquire,
-- which claims its grant in the same call). Returns the new last token and the number of
-- holders afterwards. (model.promote with the caller as claimant is done inline in acquire.)
CREATE FUNCTION __SCHEMA__._promote(
    p_id bigint, p_name text, p_limit integer, p_now timestamptz, p_last bigint,
    p_quiet text, OUT o_last bigint, OUT o_holders integer)
LANGUAGE plpgsql
AS $$
DECLARE
    w record;
BEGIN
    o_last := p_last;
    SELECT count(*) INTO o_holders FROM __SCHEMA__.holders h WHERE h.name_id = p_id;
    WHILE o_holders < p_limit LOOP
        DELETE FROM __SCHEMA__.waiters d
        WHERE d.seq = (SELECT f.seq FROM __SCHEMA__.waiters f WHERE f.name_id = p_id
                       ORDER BY f.seq LIMIT 1)
        RETURNING d.holder, d.ttl, d.wait_ttl INTO w;
        EXIT WHEN NOT FOUND;
        o_last := greatest(o_last + 1, floor(extract(epoch FROM p_now) * 1000000)::bigint);
        -- A holder is never also waiting (acquire returns early for a holder), so this
        -- insert cannot conflict.
        INSERT INTO __SCHEMA__.holders (name_id, holder, token, acquired_at, expires_at, claimed)
        VALUES (p_id, w.holder, o_last, p_now,
                p_now + least(w.ttl, w.wait_ttl) * interval '1 second', false);
        IF w.holder IS DISTINCT FROM p_quiet THEN
            PERFORM pg_notify(__CHANNEL__, __SCHEMA__.wake_key(p_name, w.holder));
        END IF;
        o_holders := o_holders + 1;
    END LOOP;
END
$$;

-- Write back the name's counter and limit, and note when it became idle.
CREATE FUNCTION __SCHEMA__._settle(
    p_id bigint, p_now timestamptz, p_last bigint, p_limit integer) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_idle boolean;
BEGIN
    v_idle := NOT EXISTS (SELECT 1 FROM __SCHEMA__.holders h WHERE h.name_id = p_id)
          AND NOT EXISTS (SELECT 1 FROM __SCHEMA__.waiters w WHERE w.name_id = p_id);
    UPDATE __SCHEMA__.names n
    SET last_token = p_last,
        lim = p_limit,
        idle_since = CASE WHEN v_idle THEN coalesce(n.idle_since, p_now) END
    WHERE n.id = p_id
      AND (n.last_token <> p_last OR n.lim <> p_limit
           OR (n.idle_since IS NULL) = v_idle);
END
$$;

-- model.acquire: hold, join the line, or keep one's place; idempotent per holder.
-- p_now is for tests only (a virtual clock); NULL means clock_timestamp() after the lock.
--
-- model.acquire promotes twice: for others (expiries, a changed limit), then with the caller
-- as claimant. After the first, either no slot is free or nobody waits, so the second can
-- only ever grant the caller, and only when it has just joined an empty line with a slot
-- free: that case is done directly (same token, same lease) instead of insert-then-promote.
CREATE FUNCTION __SCHEMA__.acquire(
    p_name text, p_holder text, p_limit integer, p_ttl double precision,
    p_wait_ttl double precision, p_enqueue boolean, p_now timestamptz DEFAULT NULL,
    OUT granted boolean, OUT token bigint, OUT acquired_at double precision,
    OUT expires_at double precision, OUT queue_position integer, OUT now double precision,
    OUT retry_after double precision)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
    v_last bigint;
    v_holders integer;
    v_now timestamptz;
    v_token bigint;
    v_acq timestamptz;
    v_exp timestamptz;
    v_claimed boolean;
    v_seq bigint;
    v_min timestamptz;
BEGIN
    SELECT l.o_id, l.o_last INTO v_id, v_last FROM __SCHEMA__._lock_name(p_name, p_limit, p_now) l;
    v_now := coalesce(p_now, clock_timestamp());
    now := extract(epoch FROM v_now);
    granted := false;

    DELETE FROM __SCHEMA__.holders h WHERE h.name_id = v_id AND h.expires_at <= v_now;
    DELETE FROM __SCHEMA__.waiters w WHERE w.name_id = v_id AND w.expires_at <= v_now;
    SELECT p.o_last, p.o_holders INTO v_last, v_holders
    FROM __SCHEMA__._promote(v_id, p_name, p_limit, v_now, v_last, p_holder) p;

    SELECT h.token, h.acquired_at, h.expires_at, h.claimed
    INTO v_token, v_acq, v_exp, v_claimed
    FROM __SCHEMA__.holders h WHERE h.name_id = v_id AND h.holder = p_holder;
    IF FOUND THEN
        granted := true;
        IF NOT v_claimed THEN
            -- our own grant, handed over while we waited: claim it for the full ttl
            v_exp := v_now + p_ttl * interval '1 second';
            UPDATE __SCHEMA__.holders h SET claimed = true, expires_at = v_exp
            WHERE h.name_id = v_id AND h.holder = p_holder;
        END IF;
    ELSE
        -- keep our place
        UPDATE __SCHEMA__.waiters w
        SET ttl = p_ttl, wait_ttl = p_wait_ttl,
            expires_at = v_now + p_wait_ttl * interval '1 second'
        WHERE w.name_id = v_id AND w.holder = p_holder
        RETURNING w.seq INTO v_seq;
        IF NOT FOUND THEN
            IF v_holders < p_limit
               AND NOT EXISTS (SELECT 1 FROM __SCHEMA__.waiters w WHERE w.name_id = v_id) THEN
                -- an empty line and a free slot: ours at once, claimed
                granted := true;
                v_last := greatest(v_last + 1, floor(extract(epoch FROM v_now) * 1000000)::bigint);
                v_token := v_last;
                v_acq := v_now;
                v_exp := v_now + p_ttl * interval '1 second';
                INSERT INTO __SCHEMA__.holders
                    (name_id, holder, token, acquired_at, expires_at, claimed)
                VALUES (v_id, p_holder, v_token, v_acq, v_exp, true);
            ELSIF p_enqueue THEN
                INSERT INTO __SCHEMA__.waiters
                    (name_id, holder, ttl, wait_ttl, joined_at, expires_at)
                VALUES (v_id, p_holder, p_ttl, p_wait_ttl, v_now,
                        v_now + p_wait_ttl * interval '1 second')
                RETURNING seq INTO v_seq;
            END IF;
        END IF;
    END IF;

    IF granted THEN
        token := v_token;
        acquired_at := extract(epoch FROM v_acq);
        expires_at := extract(epoch FROM v_exp);
    ELSE
        IF v_seq IS NOT NULL THEN
            SELECT count(*) INTO queue_position
            FROM __SCHEMA__.waiters w WHERE w.name_id = v_id AND w.seq < v_seq;
        END IF;
        SELECT min(h.expires_at) INTO v_min FROM __SCHEMA__.holders h WHERE h.name_id = v_id;
        IF v_min IS NOT NULL THEN
            retry_after := greatest(0, extract(epoch FROM v_min) - extract(epoch FROM v_now));
        END IF;
    END IF;
    -- Never idle after an acquire: it holds, waits, or found the name busy.
    UPDATE __SCHEMA__.names n SET last_token = v_last, lim = p_limit, idle_since = NULL
    WHERE n.id = v_id
      AND (n.last_token <> v_last OR n.lim <> p_limit OR n.idle_since IS NOT NULL);
END
$$;

-- model.release: drop holder's lease (only the one with p_token, if given) and, without a
-- token, its place in line; then hand freed slots to the front of the line.
CREATE FUNCTION __SCHEMA__.release(
    p_name text, p_holder text, p_token bigint, p_now timestamptz DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
    v_lim integer;
    v_last bigint;
    v_now timestamptz;
    v_released boolean;
BEGIN
    SELECT l.o_id, l.o_lim, l.o_last INTO v_id, v_lim, v_last
    FROM __SCHEMA__._lock_name(p_name, NULL, p_now) l;
    IF v_id IS NULL THEN
        RETURN false;
    END IF;
    v_now := coalesce(p_now, clock_timestamp());
    DELETE FROM __SCHEMA__.holders h WHERE h.name_id = v_id AND h.expires_at <= v_now;
    DELETE FROM __SCHEMA__.waiters w WHERE w.name_id = v_id AND w.expires_at <= v_now;
    DELETE FROM __SCHEMA__.holders h
    WHERE h.name_id = v_id AND h.holder = p_holder AND (p_token IS NULL OR h.token = p_token);
    v_released := FOUND;
    IF p_token IS NULL THEN
        DELETE FROM __SCHEMA__.waiters w WHERE w.name_id = v_id AND w.holder = p_holder;
        v_released := v_released OR FOUND;
    END IF;
    SELECT p.o_last INTO v_last
    FROM __SCHEMA__._promote(v_id, p_name, v_lim, v_now, v_last, NULL) p;
    PERFORM __SCHEMA__._settle(v_id, v_now, v_last, v_lim);
    RETURN v_released;
END
$$;

-- model.renew: extend (holder, token) to now + ttl; renewed = false means it is gone.
CREATE FUNCTION __SCHEMA__.renew(
    p_name text, p_holder text, p_token bigint, p_ttl double precision,
    p_now timestamptz DEFAULT NULL,
    OUT renewed boolean, OUT acquired_at double precision, OUT expires_at double precision)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
    v_now timestamptz;
    v_acq timestamptz;
    v_exp timestamptz;
BEGIN
    renewed := false;
    SELECT l.o_id INTO v_id FROM __SCHEMA__._lock_name(p_name, NULL, p_now) l;
    IF v_id IS NULL THEN
        RETURN;
    END IF;
    v_now := coalesce(p_now, clock_timestamp());
    UPDATE __SCHEMA__.holders h
    SET expires_at = v_now + p_ttl * interval '1 second', claimed = true
    WHERE h.name_id = v_id AND h.holder = p_holder AND h.token = p_token
      AND h.expires_at > v_now
    RETURNING h.acquired_at, h.expires_at INTO v_acq, v_exp;
    IF FOUND THEN
        renewed := true;
        acquired_at := extract(epoch FROM v_acq);
        expires_at := extract(epoch FROM v_exp);
    END IF;
END
$$;

-- model.status: a consistent snapshot (STABLE: one snapshot for the whole call).
-- lim is NULL when the name has no rows at all.
CREATE FUNCTION __SCHEMA__.status(
    p_name text, p_now timestamptz DEFAULT NULL,
    OUT lim integer, OUT now double precision, OUT holders json, OUT waiters json)
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
                             ORDER BY h.token), '[]')
    INTO holders
    FROM __SCHEMA__.holders h WHERE h.name_id = v_id AND h.expires_at > v_now;
    SELECT coalesce(json_agg(json_build_array(w.holder, extract(epoch FROM w.joined_at),
                                              extract(epoch FROM w.expires_at))
                             ORDER BY w.seq), '[]')
    INTO waiters
    FROM __SCHEMA__.waiters w WHERE w.name_id = v_id AND w.expires_at > v_now;
END
$$;

-- Names with an unexpired holder or waiter, in code-point order (COLLATE "C").
CREATE FUNCTION __SCHEMA__.names_in_use(
    p_prefix text, p_max integer, p_now timestamptz DEFAULT NULL)
RETURNS SETOF text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT n.name FROM __SCHEMA__.names n
    WHERE n.id IN (
        SELECT h.name_id FROM __SCHEMA__.holders h
        WHERE h.expires_at > coalesce(p_now, clock_timestamp())
        UNION
        SELECT w.name_id FROM __SCHEMA__.waiters w
        WHERE w.expires_at > coalesce(p_now, clock_timestamp()))
      AND starts_with(n.name, p_prefix)
    ORDER BY n.name
    LIMIT p_max
$$;
