-- Turnstile PostgreSQL schema, version 7: a shorter hot path for acquire and release.
--
-- No table changes; acquire (the 9-argument one) and release are replaced, same state
-- machine (lock_machine.py), fewer statements in the common cases:
--
-- - acquire on an idle name (idle_since set: no holders and nobody in line, which every
--   step keeps true under the name's row lock) locks the row and grants the caller in one
--   statement (an UPDATE of the name that checks idle_since again on the row as it is once
--   locked, and the INSERT of the lease), instead of five;
-- - release with a token, when nobody is in line: the lease dropped, the holders left
--   counted and the name's idleness written in one statement after the row lock, with no
--   call of _promote (nobody to promote); with a line, the promotion as before.
--
-- Safe on a populated schema and during an upgrade: same signatures, same results.

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
    -- Fastest path, an idle name (idle_since set: no holders and nobody in line, which every
    -- step keeps true under the row lock): the row locked and the caller granted in one
    -- statement. The UPDATE waits for the row lock and checks idle_since again on the row as
    -- it is then; the clock is read after the lock (the token in SET, the times in RETURNING).
    WITH g AS (
        UPDATE __SCHEMA__.names n
        SET last_token = greatest(n.last_token + 1, floor(extract(epoch FROM
                coalesce(p_now, clock_timestamp())) * 1000000)::bigint),
            lim = p_limit, idle_since = NULL
        WHERE n.key = sha256(convert_to(p_name, 'UTF8')) AND n.idle_since IS NOT NULL
        RETURNING n.id, n.last_token, coalesce(p_now, clock_timestamp()) AS t)
    INSERT INTO __SCHEMA__.holders AS h
        (name_id, holder, token, acquired_at, expires_at, claimed)
    SELECT g.id, p_holder, g.last_token, g.t, g.t + p_ttl * interval '1 second', true FROM g
    RETURNING h.token, h.acquired_at, h.expires_at INTO v_token, v_acq, v_exp;
    IF FOUND THEN
        granted := true;
        token := v_token;
        now := extract(epoch FROM v_acq);
        acquired_at := now;
        expires_at := extract(epoch FROM v_exp);
        RETURN;
    END IF;

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

CREATE OR REPLACE FUNCTION __SCHEMA__.release(
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
    v_mine integer;
    v_waiting integer := 0;
    v_holders integer;
    v_line boolean;
BEGIN
    -- A row deleted meanwhile by _forget_idle is skipped: the name is idle, nothing to do.
    SELECT n.id, n.lim, n.last_token INTO v_id, v_lim, v_last
    FROM __SCHEMA__.names n WHERE n.key = sha256(convert_to(p_name, 'UTF8'))
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    v_now := coalesce(p_now, clock_timestamp());
    IF p_token IS NOT NULL THEN
        -- The common case, in one statement: expired leases and ours (counted as released
        -- only if it had not expired) dropped, the holders left counted (the outer count
        -- sees the rows as they were before the DELETE), and, when nobody is in line, the
        -- name's idleness written as the promotion below would find it (it has nobody to
        -- promote); with a line, on to the promotion.
        WITH gone AS (
            DELETE FROM __SCHEMA__.holders h
            WHERE h.name_id = v_id
              AND (h.expires_at <= v_now OR (h.holder = p_holder AND h.token = p_token))
            RETURNING h.holder, h.expires_at),
        c AS (
            SELECT count(*) FILTER (WHERE g.holder = p_holder AND g.expires_at > v_now) AS mine,
                   (SELECT count(*) FROM __SCHEMA__.holders h WHERE h.name_id = v_id)
                   - count(*) AS left_,
                   EXISTS (SELECT 1 FROM __SCHEMA__.waiters w WHERE w.name_id = v_id) AS line
            FROM gone g),
        idle AS (
            UPDATE __SCHEMA__.names n
            SET idle_since = CASE WHEN c.left_ = 0 THEN coalesce(n.idle_since, v_now) END
            FROM c
            WHERE n.id = v_id AND NOT c.line AND (n.idle_since IS NULL) = (c.left_ = 0)
            RETURNING 1)
        SELECT c.mine, c.left_, c.line INTO v_mine, v_holders, v_line FROM c;
        IF NOT v_line THEN
            RETURN v_mine > 0;
        END IF;
    ELSE
        -- Without a token: expired leases go, ours too (counted as released only if it had
        -- not expired), and our own place in line (if it had not expired).
        WITH gone AS (
            DELETE FROM __SCHEMA__.holders h
            WHERE h.name_id = v_id AND (h.expires_at <= v_now OR h.holder = p_holder)
            RETURNING h.holder, h.expires_at)
        SELECT count(*) FILTER (WHERE g.holder = p_holder AND g.expires_at > v_now),
               (SELECT count(*) FROM __SCHEMA__.holders h WHERE h.name_id = v_id) - count(*)
        INTO v_mine, v_holders FROM gone g;
        DELETE FROM __SCHEMA__.waiters w
        WHERE w.name_id = v_id AND w.holder = p_holder AND w.expires_at > v_now;
        GET DIAGNOSTICS v_waiting = ROW_COUNT;
    END IF;
    SELECT p.o_last, p.o_holders INTO v_last, v_holders
    FROM __SCHEMA__._promote(v_id, p_name, v_lim, v_now, v_last, NULL, v_holders) p;
    -- No holder after promoting means nobody waits either (the limit is at least 1): idle.
    UPDATE __SCHEMA__.names n
    SET last_token = v_last,
        idle_since = CASE WHEN v_holders = 0 THEN coalesce(n.idle_since, v_now) END
    WHERE n.id = v_id
      AND (n.last_token <> v_last OR (n.idle_since IS NULL) = (v_holders = 0));
    RETURN v_mine > 0 OR v_waiting > 0;
END
$$;
