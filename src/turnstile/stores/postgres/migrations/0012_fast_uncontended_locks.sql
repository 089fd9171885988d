-- Turnstile PostgreSQL schema, version 12: the uncontended lock in one HOT update of the
-- name's row each way.
--
-- A fast grant lives in the name's row (names.h_holder, h_acquired, h_expires, h_key; its
-- token is names.last_token): acquire's fastest path, on an idle name, is now one UPDATE of
-- that row granting the caller there (it inserted into holders and updated the row), and
-- release's new fastest path, when the caller is that fast holder, is one UPDATE freeing
-- the name (it locked the row, deleted from holders and updated the row). Every other step
-- that locks a name's row first moves a fast grant into holders (_spill: from _lock_name,
-- acquire, release and settle_delivery; acquire_callback moves its own, to carry its
-- callback), so a fast grant exists only while nothing else happened on the name since it
-- was made: no other holder, nobody in line. That is what lets release free the name from
-- its row alone, and the check is made on the row the UPDATE locks, again on its newest
-- version if it had to wait for the lock. status and names_in_use show a fast grant as a
-- holder. With prepare=on the client sends the same
-- two fastest paths as plain statements (queries.sql: acquire_fast, release_fast) that
-- call acquire() or release() only when they do not apply.
--
-- names.busy (not indexed) replaces idle_since as the idle flag (no holders, nobody in
-- line): changing the indexed idle_since made every grant and release of an idle name a
-- non-HOT update, with new entries in all three indexes of names. idle_since is now a hint
-- for _forget_idle, set when a name becomes idle if it was NULL and otherwise left alone;
-- _forget_idle forgets a name when it is idle and its last token is more than a day old (as
-- before: a recreated name never repeats a token), and moves a candidate that is not yet
-- forgettable out of its way (bounded work, as before).
--
-- Safe on a populated schema: busy is derived from idle_since, the fast-grant columns are
-- NULL. Compatibility: no signature changes; a client of the previous release calls the
-- same functions, which handle fast grants.

ALTER TABLE __SCHEMA__.names
    ADD COLUMN busy boolean NOT NULL DEFAULT true,
    ADD COLUMN h_holder text COLLATE "C",
    ADD COLUMN h_acquired timestamptz,
    ADD COLUMN h_expires timestamptz,
    ADD COLUMN h_key text COLLATE "C";
UPDATE __SCHEMA__.names SET busy = false WHERE idle_since IS NOT NULL;

CREATE OR REPLACE FUNCTION __SCHEMA__._forget_idle(p_now timestamptz) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_horizon timestamptz := p_now - interval '1 day';
    v_old bigint := floor(extract(epoch FROM v_horizon) * 1000000)::bigint;
BEGIN
    -- The 8 oldest candidates: forgotten if idle with no grant for a day, else moved out of
    -- the way (idle_since is a hint the fast paths leave as it is, see names.busy).
    WITH c AS (
        SELECT i.id, i.busy, i.last_token < v_old AS old FROM __SCHEMA__.names i
        WHERE i.idle_since IS NOT NULL AND i.idle_since < v_horizon
        ORDER BY i.idle_since
        LIMIT 8
        FOR UPDATE SKIP LOCKED),
    gone AS (
        DELETE FROM __SCHEMA__.names n USING c
        WHERE n.id = c.id AND NOT c.busy AND c.old)
    UPDATE __SCHEMA__.names n
    SET idle_since = CASE WHEN c.busy THEN NULL
                          ELSE to_timestamp(n.last_token / 1000000.0) END
    FROM c
    WHERE n.id = c.id AND (c.busy OR NOT c.old);
END
$$;

CREATE OR REPLACE FUNCTION __SCHEMA__._lock_name(
    p_name text, p_limit integer, p_now timestamptz,
    OUT o_id bigint, OUT o_lim integer, OUT o_last bigint, OUT o_per_key integer)
LANGUAGE plpgsql
AS $$
DECLARE
    v_key bytea := sha256(convert_to(p_name, 'UTF8'));
    v_inserted integer;
    v_inline text;
BEGIN
    -- A concurrent _forget_idle may delete the row between our INSERT ... DO NOTHING and
    -- the SELECT; then we go round again. Bounded, though twice is already rare.
    FOR attempt IN 1..50 LOOP
        SELECT n.id, n.lim, n.last_token, n.per_key, n.h_holder
        INTO o_id, o_lim, o_last, o_per_key, v_inline
        FROM __SCHEMA__.names n WHERE n.key = v_key
        FOR UPDATE;
        IF FOUND THEN
            IF v_inline IS NOT NULL THEN
                PERFORM __SCHEMA__._spill(o_id);  -- a fast grant, into holders (version 12)
            END IF;
            RETURN;
        END IF;
        IF p_limit IS NULL THEN
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

CREATE FUNCTION __SCHEMA__._spill(p_id bigint) RETURNS void
LANGUAGE sql
AS $$
    WITH o AS (
        SELECT n.id, n.h_holder, n.last_token, n.h_acquired, n.h_expires, n.h_key
        FROM __SCHEMA__.names n WHERE n.id = p_id AND n.h_holder IS NOT NULL),
    cleared AS (
        UPDATE __SCHEMA__.names n SET h_holder = NULL FROM o WHERE n.id = o.id)
    INSERT INTO __SCHEMA__.holders
        (name_id, holder, token, acquired_at, expires_at, claimed, group_key)
    SELECT o.id, o.h_holder, o.last_token, o.h_acquired, o.h_expires, true, o.h_key FROM o
$$;

CREATE OR REPLACE FUNCTION __SCHEMA__._settle(
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
        busy = NOT v_idle,
        idle_since = CASE WHEN v_idle THEN coalesce(n.idle_since, p_now) ELSE n.idle_since END
    WHERE n.id = p_id
      AND (n.last_token <> p_last OR n.lim <> p_limit OR n.busy = v_idle);
END
$$;

CREATE OR REPLACE FUNCTION __SCHEMA__.acquire(
    p_name text, p_holder text, p_limit integer, p_ttl double precision,
    p_wait_ttl double precision, p_enqueue boolean, p_now timestamptz, p_channel text,
    p_wake text, p_lead bigint DEFAULT 0, p_key text DEFAULT NULL,
    p_per_key integer DEFAULT NULL,
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
    v_newest bigint;
    v_at bigint;
    v_stamp bigint;
    v_rank bigint;
    v_per_key integer;
    v_inline text;
BEGIN
    -- Fastest path, an idle name (not busy: no holders and nobody in line, which every
    -- step keeps true under the row lock): the row locked and the caller granted in one
    -- statement, a fast grant kept in the row (version 12, see names.h_holder), a HOT
    -- update. The UPDATE waits for the row lock and checks busy again on the row as it is
    -- then; the clock is read once for the token and the times. The name takes the
    -- caller's shape (limit, per_key).
    UPDATE __SCHEMA__.names n
    SET (last_token, h_acquired, h_expires) = (
            SELECT c.token, c.t, c.t + p_ttl * interval '1 second'
            FROM (SELECT greatest(n.last_token + 1,
                                  floor(extract(epoch FROM k.t) * 1000000)::bigint) AS token,
                         k.t
                  FROM (SELECT coalesce(p_now, clock_timestamp()) AS t) k) c),
        lim = p_limit, per_key = p_per_key, busy = true, h_holder = p_holder, h_key = p_key
    WHERE n.key = sha256(convert_to(p_name, 'UTF8')) AND NOT n.busy
    RETURNING n.last_token, n.h_acquired, n.h_expires INTO v_token, v_acq, v_exp;
    IF FOUND THEN
        granted := true;
        token := v_token;
        now := extract(epoch FROM v_acq);
        acquired_at := now;
        expires_at := extract(epoch FROM v_exp);
        RETURN;
    END IF;

    SELECT n.id, n.last_token, n.lim, n.newest_stamp, n.per_key, n.h_holder
    INTO v_id, v_last, v_lim, v_newest, v_per_key, v_inline
    FROM __SCHEMA__.names n WHERE n.key = sha256(convert_to(p_name, 'UTF8'))
    FOR UPDATE;
    IF NOT FOUND THEN
        -- a new name (or one being forgotten right now): create its row (v_newest stays
        -- NULL: unknown)
        SELECT l.o_id, l.o_last, l.o_lim, l.o_per_key INTO v_id, v_last, v_lim, v_per_key
        FROM __SCHEMA__._lock_name(p_name, p_limit, p_now) l;
    ELSIF v_inline IS NOT NULL THEN
        PERFORM __SCHEMA__._spill(v_id);  -- a fast grant, into holders (version 12)
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
    -- One shape per name (lock_machine.acquire): an idle name takes the caller's limit and
    -- per_key; on a busy one a newcomer naming another limit or per_key is refused (the
    -- transaction is rolled back; DETAIL: the name's limit, then its per_key if it has
    -- one), and whoever already holds or waits is served under the name's.
    IF v_lim <> p_limit OR v_per_key IS DISTINCT FROM p_per_key THEN
        DELETE FROM __SCHEMA__.waiters w WHERE w.name_id = v_id AND w.expires_at <= v_now;
        IF v_live = 0
           AND NOT EXISTS (SELECT 1 FROM __SCHEMA__.waiters w WHERE w.name_id = v_id) THEN
            v_lim := p_limit;
            v_per_key := p_per_key;
        ELSIF NOT EXISTS (SELECT 1 FROM __SCHEMA__.holders h
                          WHERE h.name_id = v_id AND h.holder = p_holder)
           AND NOT EXISTS (SELECT 1 FROM __SCHEMA__.waiters w
                           WHERE w.name_id = v_id AND w.holder = p_holder) THEN
            RAISE EXCEPTION 'turnstile: the name has another limit' USING
                ERRCODE = 'TSL01', DETAIL = concat_ws(' ', v_lim, v_per_key);
        END IF;
    END IF;
    -- (In a group, the caller's key must have room too.)
    IF v_live < v_lim AND NOT v_mine
       AND (v_per_key IS NULL
            OR (SELECT count(*) FROM __SCHEMA__.holders h
                WHERE h.name_id = v_id AND h.group_key IS NOT DISTINCT FROM p_key) < v_per_key)
       AND NOT EXISTS (SELECT 1 FROM __SCHEMA__.waiters w WHERE w.name_id = v_id) THEN
        v_last := greatest(v_last + 1, floor(extract(epoch FROM v_now) * 1000000)::bigint);
        INSERT INTO __SCHEMA__.holders
            (name_id, holder, token, acquired_at, expires_at, claimed, group_key)
        VALUES (v_id, p_holder, v_last, v_now, v_now + p_ttl * interval '1 second', true, p_key);
        UPDATE __SCHEMA__.names n
        SET last_token = v_last, lim = v_lim, per_key = v_per_key, busy = true
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
    FROM __SCHEMA__._promote(v_id, p_name, v_lim, v_now, v_last, p_holder, NULL, v_per_key) p;

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
        -- keep our place (and the key we joined with)
        UPDATE __SCHEMA__.waiters w
        SET ttl = p_ttl, wait_ttl = p_wait_ttl,
            expires_at = v_now + p_wait_ttl * interval '1 second',
            channel = p_channel, wake = p_wake
        WHERE w.name_id = v_id AND w.holder = p_holder
        RETURNING w.seq, w.rank INTO v_seq, v_rank;
        IF NOT FOUND THEN
            -- Room for us, ours at once, claimed: a free slot and an empty line (the
            -- promotion above leaves a free slot only when the line is empty) or, in a
            -- group, a free slot and room for our key (those in line wait for full keys:
            -- the promotion above granted every waiter whose key has room).
            IF v_holders < v_lim
               AND (CASE WHEN v_per_key IS NULL
                         THEN NOT EXISTS (SELECT 1 FROM __SCHEMA__.waiters w
                                          WHERE w.name_id = v_id)
                         ELSE (SELECT count(*) FROM __SCHEMA__.holders h
                               WHERE h.name_id = v_id
                                 AND h.group_key IS NOT DISTINCT FROM p_key) < v_per_key
                    END) THEN
                granted := true;
                v_last := greatest(v_last + 1, floor(extract(epoch FROM v_now) * 1000000)::bigint);
                v_token := v_last;
                v_acq := v_now;
                v_exp := v_now + p_ttl * interval '1 second';
                INSERT INTO __SCHEMA__.holders
                    (name_id, holder, token, acquired_at, expires_at, claimed, group_key)
                VALUES (v_id, p_holder, v_token, v_acq, v_exp, true, p_key);
            ELSIF p_enqueue THEN
                -- lock_machine.join: stamped above every entry in line (ranking.stamp; the
                -- line is read only when the clock has not passed the name's newest_stamp),
                -- ranked p_lead ahead of that; (rank, seq) puts it behind every entry of its
                -- rank or better.
                v_at := floor(extract(epoch FROM v_now) * 1000000)::bigint;
                v_stamp := v_at;
                IF v_newest IS NULL OR v_newest >= v_at THEN
                    SELECT greatest(v_at, max(floor(extract(epoch FROM w.joined_at)
                                                    * 1000000)::bigint) + 1)
                    INTO v_stamp
                    FROM __SCHEMA__.waiters w WHERE w.name_id = v_id;
                END IF;
                INSERT INTO __SCHEMA__.waiters AS w
                    (name_id, holder, ttl, wait_ttl, joined_at, expires_at, channel, wake,
                     rank, group_key)
                VALUES (v_id, p_holder, p_ttl, p_wait_ttl,
                        v_now + (v_stamp - v_at) * interval '1 microsecond',
                        v_now + p_wait_ttl * interval '1 second', p_channel, p_wake,
                        v_stamp - p_lead, p_key)
                RETURNING w.seq, w.rank INTO v_seq, v_rank;
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
            FROM __SCHEMA__.waiters w
            WHERE w.name_id = v_id AND (w.rank, w.seq) < (v_rank, v_seq);
        END IF;
        SELECT min(h.expires_at) INTO v_min FROM __SCHEMA__.holders h WHERE h.name_id = v_id;
        IF v_min IS NOT NULL THEN
            retry_after := greatest(0, extract(epoch FROM v_min) - extract(epoch FROM v_now));
        END IF;
    END IF;
    -- Never idle after an acquire: it holds, waits, or found the name busy. A new waiting
    -- entry's stamp raises newest_stamp.
    UPDATE __SCHEMA__.names n
    SET last_token = v_last, lim = v_lim, per_key = v_per_key, busy = true,
        newest_stamp = greatest(n.newest_stamp, v_stamp)
    WHERE n.id = v_id
      AND (n.last_token <> v_last OR n.lim <> v_lim OR n.per_key IS DISTINCT FROM v_per_key
           OR NOT n.busy OR n.newest_stamp < v_stamp);
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
    v_per_key integer;
    v_inline text;
BEGIN
    -- Fastest path (version 12): the caller is the name's fast holder (so nobody else holds
    -- or waits): the name freed in one statement, a HOT update, the check made on the row
    -- as it is once locked. Released: the lease had not expired.
    UPDATE __SCHEMA__.names n
    SET busy = false, h_holder = NULL,
        idle_since = coalesce(n.idle_since, coalesce(p_now, clock_timestamp()))
    WHERE n.key = sha256(convert_to(p_name, 'UTF8'))
      AND n.h_holder = p_holder AND n.last_token = p_token
    RETURNING n.h_expires > coalesce(p_now, clock_timestamp()) INTO v_line;
    IF FOUND THEN
        RETURN v_line;
    END IF;
    -- A row deleted meanwhile by _forget_idle is skipped: the name is idle, nothing to do.
    SELECT n.id, n.lim, n.last_token, n.per_key, n.h_holder
    INTO v_id, v_lim, v_last, v_per_key, v_inline
    FROM __SCHEMA__.names n WHERE n.key = sha256(convert_to(p_name, 'UTF8'))
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF v_inline IS NOT NULL THEN
        PERFORM __SCHEMA__._spill(v_id);  -- a fast grant, into holders (version 12)
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
            SET busy = c.left_ <> 0,
                idle_since = CASE WHEN c.left_ = 0 THEN coalesce(n.idle_since, v_now)
                                  ELSE n.idle_since END
            FROM c
            WHERE n.id = v_id AND NOT c.line AND n.busy = (c.left_ = 0)
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
    FROM __SCHEMA__._promote(v_id, p_name, v_lim, v_now, v_last, NULL, v_holders, v_per_key) p;
    -- No holder after promoting means nobody waits either (the limit is at least 1, and in
    -- a group every key has room then): idle.
    UPDATE __SCHEMA__.names n
    SET last_token = v_last,
        busy = v_holders <> 0,
        idle_since = CASE WHEN v_holders = 0 THEN coalesce(n.idle_since, v_now)
                          ELSE n.idle_since END
    WHERE n.id = v_id
      AND (n.last_token <> v_last OR n.busy = (v_holders = 0));
    RETURN v_mine > 0 OR v_waiting > 0;
END
$$;

CREATE OR REPLACE FUNCTION __SCHEMA__.settle_delivery(
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
    v_per_key integer;
    v_inline text;
BEGIN
    IF p_outcome NOT IN ('delivered', 'refused', 'retry') THEN
        RAISE EXCEPTION 'turnstile: unknown delivery outcome %', p_outcome
            USING ERRCODE = '22023';
    END IF;
    SELECT n.id, n.lim, n.last_token, n.per_key, n.h_holder
    INTO v_id, v_lim, v_last, v_per_key, v_inline
    FROM __SCHEMA__.names n WHERE n.key = sha256(convert_to(p_name, 'UTF8'))
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF v_inline IS NOT NULL THEN
        PERFORM __SCHEMA__._spill(v_id);  -- a fast grant, into holders (version 12)
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
    FROM __SCHEMA__._promote(v_id, p_name, v_lim, v_now, v_last, NULL, NULL, v_per_key) p;
    PERFORM __SCHEMA__._settle(v_id, v_now, v_last, v_lim);
    RETURN v_count > 0;
END
$$;

CREATE OR REPLACE FUNCTION __SCHEMA__.status(
    p_name text, p_now timestamptz DEFAULT NULL,
    OUT lim integer, OUT now double precision, OUT holders json, OUT waiters json,
    OUT holder_callbacks json, OUT waiter_callbacks json, OUT per_key integer,
    OUT holder_keys json, OUT waiter_keys json)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
    v_lim integer;
    v_per_key integer;
    v_inline text;
    v_now timestamptz := coalesce(p_now, clock_timestamp());
BEGIN
    now := extract(epoch FROM v_now);
    holders := '[]';
    waiters := '[]';
    holder_callbacks := '[]';
    waiter_callbacks := '[]';
    holder_keys := '[]';
    waiter_keys := '[]';
    SELECT n.id, n.lim, n.per_key, n.h_holder INTO v_id, v_lim, v_per_key, v_inline
    FROM __SCHEMA__.names n WHERE n.key = sha256(convert_to(p_name, 'UTF8'));
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_inline IS NOT NULL
       OR EXISTS (SELECT 1 FROM __SCHEMA__.holders h WHERE h.name_id = v_id)
       OR EXISTS (SELECT 1 FROM __SCHEMA__.waiters w WHERE w.name_id = v_id) THEN
        lim := v_lim;
        per_key := v_per_key;
    END IF;
    SELECT coalesce(json_agg(json_build_array(h.holder, h.token, extract(epoch FROM h.acquired_at),
                                              extract(epoch FROM h.expires_at))
                             ORDER BY h.token), '[]'),
           coalesce(json_agg(CASE WHEN h.callback IS NOT NULL THEN
                                 json_build_array(__SCHEMA__._callback_kind(h.callback),
                                                  h.pending) END
                             ORDER BY h.token), '[]'),
           coalesce(json_agg(h.group_key ORDER BY h.token), '[]')
    INTO holders, holder_callbacks, holder_keys
    FROM (SELECT k.holder, k.token, k.acquired_at, k.expires_at, k.callback, k.pending,
                 k.group_key
          FROM __SCHEMA__.holders k WHERE k.name_id = v_id
          UNION ALL  -- a fast grant (version 12)
          SELECT i.h_holder, i.last_token, i.h_acquired, i.h_expires, NULL, false, i.h_key
          FROM __SCHEMA__.names i WHERE i.id = v_id AND i.h_holder IS NOT NULL) h
    WHERE h.expires_at > v_now;
    SELECT coalesce(json_agg(json_build_array(w.holder, extract(epoch FROM w.joined_at),
                                              extract(epoch FROM w.expires_at))
                             ORDER BY w.rank, w.seq), '[]'),
           coalesce(json_agg(__SCHEMA__._callback_kind(w.callback) ORDER BY w.rank, w.seq),
                    '[]'),
           coalesce(json_agg(w.group_key ORDER BY w.rank, w.seq), '[]')
    INTO waiters, waiter_callbacks, waiter_keys
    FROM __SCHEMA__.waiters w WHERE w.name_id = v_id AND w.expires_at > v_now;
END
$$;

CREATE OR REPLACE FUNCTION __SCHEMA__.names_in_use(
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
        WHERE w.expires_at > coalesce(p_now, clock_timestamp())
        UNION
        SELECT i.id FROM __SCHEMA__.names i  -- fast grants (version 12)
        WHERE i.h_holder IS NOT NULL AND i.h_expires > coalesce(p_now, clock_timestamp()))
      AND starts_with(n.name, p_prefix)
    ORDER BY n.name
    LIMIT p_max
$$;

CREATE OR REPLACE FUNCTION __SCHEMA__.acquire_callback(
    p_name text, p_holder text, p_limit integer, p_ttl double precision,
    p_wait_ttl double precision, p_now timestamptz, p_callback text, p_lead bigint DEFAULT 0,
    p_key text DEFAULT NULL, p_per_key integer DEFAULT NULL,
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
                            ''::text, NULL::text, p_lead, p_key, p_per_key) a;
    SELECT n.id INTO v_id
    FROM __SCHEMA__.names n WHERE n.key = sha256(convert_to(p_name, 'UTF8'));
    IF granted THEN
        -- A fast grant (version 12) goes into holders to carry its callback (the row is
        -- locked since acquire).
        PERFORM __SCHEMA__._spill(v_id);
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
