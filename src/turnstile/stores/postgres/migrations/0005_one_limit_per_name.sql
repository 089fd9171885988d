-- Turnstile PostgreSQL schema, version 5: a name has one limit.
--
-- Before: every acquire wrote its own limit into names.lim, so a semaphore's limit was
-- whatever the last caller asked for: a limit=3 acquire on a name held under limit 1 was
-- granted a second lease (a lock and a semaphore sharing a name by mistake both held it).
--
-- Now the limit is part of the name's state while it has holders or waiters: it is set by
-- the acquire that finds the name idle and changed only by set_limit (new). An acquire by a
-- newcomer that names another limit raises SQLSTATE TSL01 with the name's limit as DETAIL
-- (the client answers InvalidArgument); holders and waiters already there are served under
-- the name's limit whatever they ask with (a waiter keeps its place across a set_limit).
--
-- Compatibility: the version-2 acquire (7 arguments) calls this one and refuses the same
-- way; a client of the previous release running during an upgrade gets an error for a
-- conflicting limit instead of a silent extra grant.

-- lock_machine.acquire as in version 3, plus one limit per name: a newcomer naming another
-- limit than a busy name's is refused with SQLSTATE TSL01 (DETAIL: the name's limit), and
-- the name's limit (not the caller's) governs the grants of those already in line.
CREATE OR REPLACE FUNCTION __SCHEMA__.acquire(
    p_name text, p_holder text, p_limit integer, p_ttl double precision,
    p_wait_ttl double precision, p_enqueue boolean, p_now timestamptz, p_channel text,
    p_wake text,
    OUT granted boolean, OUT token bigint, OUT acquired_at double precision,
    OUT expires_at double precision, OUT queue_position integer, OUT now double precision,
    OUT retry_after double precision, OUT wait_id bigint)
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
    v_live integer;
    v_mine boolean;
BEGIN
    SELECT n.id, n.last_token INTO v_id, v_last
    FROM __SCHEMA__.names n WHERE n.key = sha256(convert_to(p_name, 'UTF8'))
    FOR UPDATE;
    IF NOT FOUND THEN
        -- a new name (or one being forgotten right now): create its row
        SELECT l.o_id, l.o_last INTO v_id, v_last
        FROM __SCHEMA__._lock_name(p_name, p_limit, p_now) l;
    END IF;
    v_now := coalesce(p_now, clock_timestamp());
    now := extract(epoch FROM v_now);
    granted := false;

    -- Fast path, the common case of a free name: nobody in line (not even an expired entry)
    -- and a free slot that is not already ours. Then model.acquire purges expired leases,
    -- has nobody to promote, and grants the caller at once: do just that, in five
    -- statements (with the row lock above) instead of about twelve. (The outer count sees
    -- the rows as they were before the DELETE.)
    WITH gone AS (
        DELETE FROM __SCHEMA__.holders h WHERE h.name_id = v_id AND h.expires_at <= v_now
        RETURNING 1)
    SELECT (SELECT count(*) FROM __SCHEMA__.holders h WHERE h.name_id = v_id) - count(*),
           EXISTS (SELECT 1 FROM __SCHEMA__.holders h
                   WHERE h.name_id = v_id AND h.holder = p_holder)
    INTO v_live, v_mine FROM gone;
    IF v_live < p_limit AND NOT v_mine
       AND NOT EXISTS (SELECT 1 FROM __SCHEMA__.waiters w WHERE w.name_id = v_id) THEN
        v_last := greatest(v_last + 1, floor(extract(epoch FROM v_now) * 1000000)::bigint);
        INSERT INTO __SCHEMA__.holders (name_id, holder, token, acquired_at, expires_at, claimed)
        VALUES (v_id, p_holder, v_last, v_now, v_now + p_ttl * interval '1 second', true);
        UPDATE __SCHEMA__.names n SET last_token = v_last, lim = p_limit, idle_since = NULL
        WHERE n.id = v_id;
        granted := true;
        token := v_last;
        acquired_at := now;
        expires_at := extract(epoch FROM v_now + p_ttl * interval '1 second');
        RETURN;
    END IF;

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
            expires_at = v_now + p_wait_ttl * interval '1 second',
            channel = p_channel, wake = p_wake
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
                    (name_id, holder, ttl, wait_ttl, joined_at, expires_at, channel, wake)
                VALUES (v_id, p_holder, p_ttl, p_wait_ttl, v_now,
                        v_now + p_wait_ttl * interval '1 second', p_channel, p_wake)
                RETURNING seq INTO v_seq;
            END IF;
        END IF;
    END IF;

    IF granted THEN
        token := v_token;
        acquired_at := extract(epoch FROM v_acq);
        expires_at := extract(epoch FROM v_exp);
    ELSE
        wait_id := v_seq;
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
CREATE OR REPLACE FUNCTION __SCHEMA__.acquire(
    p_name text, p_holder text, p_limit integer, p_ttl double precision,
    p_wait_ttl double precision, p_enqueue boolean, p_now timestamptz, p_channel text,
    p_wake text,
    OUT granted boolean, OUT token bigint, OUT acquired_at double precision,
    OUT expires_at double precision, OUT queue_position integer, OUT now double precision,
    OUT retry_after double precision, OUT wait_id bigint)
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
    v_live integer;
    v_mine boolean;
    v_lim integer;
BEGIN
    SELECT n.id, n.last_token, n.lim INTO v_id, v_last, v_lim
    FROM __SCHEMA__.names n WHERE n.key = sha256(convert_to(p_name, 'UTF8'))
    FOR UPDATE;
    IF NOT FOUND THEN
        -- a new name (or one being forgotten right now): create its row
        SELECT l.o_id, l.o_last, l.o_lim INTO v_id, v_last, v_lim
        FROM __SCHEMA__._lock_name(p_name, p_limit, p_now) l;
    END IF;
    v_now := coalesce(p_now, clock_timestamp());
    now := extract(epoch FROM v_now);
    granted := false;

    -- Fast path, the common case of a free name: nobody in line (not even an expired entry)
    -- and a free slot that is not already ours. Then model.acquire purges expired leases,
    -- has nobody to promote, and grants the caller at once: do just that, in five
    -- statements (with the row lock above) instead of about twelve. (The outer count sees
    -- the rows as they were before the DELETE.)
    WITH gone AS (
        DELETE FROM __SCHEMA__.holders h WHERE h.name_id = v_id AND h.expires_at <= v_now
        RETURNING 1)
    SELECT (SELECT count(*) FROM __SCHEMA__.holders h WHERE h.name_id = v_id) - count(*),
           EXISTS (SELECT 1 FROM __SCHEMA__.holders h
                   WHERE h.name_id = v_id AND h.holder = p_holder)
    INTO v_live, v_mine FROM gone;
    -- One limit per name (lock_machine.acquire): an idle name takes the caller's; on a busy
    -- one a newcomer naming another limit is refused (the transaction is rolled back), and
    -- whoever already holds or waits is served under the name's.
    IF v_lim <> p_limit THEN
        DELETE FROM __SCHEMA__.waiters w WHERE w.name_id = v_id AND w.expires_at <= v_now;
        IF v_live = 0
           AND NOT EXISTS (SELECT 1 FROM __SCHEMA__.waiters w WHERE w.name_id = v_id) THEN
            v_lim := p_limit;
        ELSIF NOT EXISTS (SELECT 1 FROM __SCHEMA__.holders h
                          WHERE h.name_id = v_id AND h.holder = p_holder)
           AND NOT EXISTS (SELECT 1 FROM __SCHEMA__.waiters w
                           WHERE w.name_id = v_id AND w.holder = p_holder) THEN
            RAISE EXCEPTION 'turnstile: the name has another limit' USING
                ERRCODE = 'TSL01', DETAIL = v_lim::text;
        END IF;
    END IF;
    IF v_live < v_lim AND NOT v_mine
       AND NOT EXISTS (SELECT 1 FROM __SCHEMA__.waiters w WHERE w.name_id = v_id) THEN
        v_last := greatest(v_last + 1, floor(extract(epoch FROM v_now) * 1000000)::bigint);
        INSERT INTO __SCHEMA__.holders (name_id, holder, token, acquired_at, expires_at, claimed)
        VALUES (v_id, p_holder, v_last, v_now, v_now + p_ttl * interval '1 second', true);
        UPDATE __SCHEMA__.names n SET last_token = v_last, lim = v_lim, idle_since = NULL
        WHERE n.id = v_id;
        granted := true;
        token := v_last;
        acquired_at := now;
        expires_at := extract(epoch FROM v_now + p_ttl * interval '1 second');
        RETURN;
    END IF;

    DELETE FROM __SCHEMA__.holders h WHERE h.name_id = v_id AND h.expires_at <= v_now;
    DELETE FROM __SCHEMA__.waiters w WHERE w.name_id = v_id AND w.expires_at <= v_now;
    SELECT p.o_last, p.o_holders INTO v_last, v_holders
    FROM __SCHEMA__._promote(v_id, p_name, v_lim, v_now, v_last, p_holder) p;

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
            expires_at = v_now + p_wait_ttl * interval '1 second',
            channel = p_channel, wake = p_wake
        WHERE w.name_id = v_id AND w.holder = p_holder
        RETURNING w.seq INTO v_seq;
        IF NOT FOUND THEN
            IF v_holders < v_lim
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
                    (name_id, holder, ttl, wait_ttl, joined_at, expires_at, channel, wake)
                VALUES (v_id, p_holder, p_ttl, p_wait_ttl, v_now,
                        v_now + p_wait_ttl * interval '1 second', p_channel, p_wake)
                RETURNING seq INTO v_seq;
            END IF;
        END IF;
    END IF;

    IF granted THEN
        token := v_token;
        acquired_at := extract(epoch FROM v_acq);
        expires_at := extract(epoch FROM v_exp);
    ELSE
        wait_id := v_seq;
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
    UPDATE __SCHEMA__.names n SET last_token = v_last, lim = v_lim, idle_since = NULL
    WHERE n.id = v_id
      AND (n.last_token <> v_last OR n.lim <> v_lim OR n.idle_since IS NOT NULL);
END
$$;

-- lock_machine.set_limit: change a busy name's limit for the next grants; a raised limit
-- grants (and wakes) waiters from the front at once, a lowered one revokes nothing. Returns
-- the limit replaced, or NULL when the name is idle (nothing changed).
CREATE FUNCTION __SCHEMA__.set_limit(
    p_name text, p_limit integer, p_now timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
    v_lim integer;
    v_last bigint;
    v_now timestamptz;
BEGIN
    SELECT l.o_id, l.o_lim, l.o_last INTO v_id, v_lim, v_last
    FROM __SCHEMA__._lock_name(p_name, NULL, p_now) l;
    IF v_id IS NULL THEN
        RETURN NULL;
    END IF;
    v_now := coalesce(p_now, clock_timestamp());
    DELETE FROM __SCHEMA__.holders h WHERE h.name_id = v_id AND h.expires_at <= v_now;
    DELETE FROM __SCHEMA__.waiters w WHERE w.name_id = v_id AND w.expires_at <= v_now;
    IF NOT EXISTS (SELECT 1 FROM __SCHEMA__.holders h WHERE h.name_id = v_id)
       AND NOT EXISTS (SELECT 1 FROM __SCHEMA__.waiters w WHERE w.name_id = v_id) THEN
        PERFORM __SCHEMA__._settle(v_id, v_now, v_last, v_lim);
        RETURN NULL;
    END IF;
    SELECT p.o_last INTO v_last
    FROM __SCHEMA__._promote(v_id, p_name, p_limit, v_now, v_last, NULL) p;
    PERFORM __SCHEMA__._settle(v_id, v_now, v_last, p_limit);
    RETURN v_lim;
END
$$;
