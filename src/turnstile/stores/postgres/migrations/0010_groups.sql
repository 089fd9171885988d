-- Turnstile PostgreSQL schema, version 10: semaphore groups (turnstile/_core/lock_machine.py).
--
-- A name with per_key (names.per_key; NULL: a plain semaphore or lock) is a semaphore group:
-- every holder and waiter names a key (holders.group_key, waiters.group_key), and the name's
-- limit is the total: at most per_key holders per key and at most lim in all. _promote then
-- grants, in line order ((rank, seq)), every waiter whose key has room while the total has
-- room, skipping waiters whose key is full: a busy key never holds up the keys behind it.
-- A newcomer is granted at once when its key and the total have room, whoever waits (those
-- in line are waiting for full keys).
--
-- One shape per busy name: the acquire that finds a name idle sets its limit and per_key; a
-- newcomer naming another limit or another per_key (a group where the name is a plain
-- semaphore, or the other way round) is refused with SQLSTATE TSL01 as before. Its DETAIL
-- is the name's limit, followed by a space and its per_key when the name is a group (the
-- client builds lock_machine.group_conflict or limit_conflict from it); a refusal on a plain
-- name is unchanged.
--
-- The plain path (per_key NULL) keeps its statements: the name's per_key is read in the
-- statements that already read its limit, and the group's steps (the per-key counts, the
-- scan of the line) run only for groups.
--
-- Safe on a populated schema: the new columns are NULL (no table rewrite), and every name,
-- holder and waiter there is plain.
--
-- Compatibility: acquire and acquire_callback gain two last parameters, p_key text DEFAULT
-- NULL and p_per_key integer DEFAULT NULL; as in version 9 the previous functions are
-- dropped, not kept beside them, so a call with the previous number of arguments (a client
-- of the previous release, during an upgrade) resolves to the new function, a plain name.
-- status gains three output columns (per_key, holder_keys, waiter_keys): dropped and made
-- again; a previous client selects its columns by name and never sees them. _lock_name
-- (an output column more), _promote and _take_name (a parameter more) are internal.

ALTER TABLE __SCHEMA__.names ADD COLUMN per_key integer;
ALTER TABLE __SCHEMA__.holders ADD COLUMN group_key text COLLATE "C";
ALTER TABLE __SCHEMA__.waiters ADD COLUMN group_key text COLLATE "C";

DROP FUNCTION __SCHEMA__._lock_name(text, integer, timestamptz);

CREATE FUNCTION __SCHEMA__._lock_name(
    p_name text, p_limit integer, p_now timestamptz,
    OUT o_id bigint, OUT o_lim integer, OUT o_last bigint, OUT o_per_key integer)
LANGUAGE plpgsql
AS $$
DECLARE
    v_key bytea := sha256(convert_to(p_name, 'UTF8'));
    v_inserted integer;
BEGIN
    -- A concurrent _forget_idle may delete the row between our INSERT ... DO NOTHING and
    -- the SELECT; then we go round again. Bounded, though twice is already rare.
    FOR attempt IN 1..50 LOOP
        SELECT n.id, n.lim, n.last_token, n.per_key INTO o_id, o_lim, o_last, o_per_key
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

DROP FUNCTION __SCHEMA__._promote(bigint, text, integer, timestamptz, bigint, text, integer);

CREATE FUNCTION __SCHEMA__._promote(
    p_id bigint, p_name text, p_limit integer, p_now timestamptz, p_last bigint,
    p_quiet text, p_holders integer DEFAULT NULL, p_per_key integer DEFAULT NULL,
    OUT o_last bigint, OUT o_holders integer)
LANGUAGE plpgsql
AS $$
DECLARE
    w record;
    g record;
    v_exp timestamptz;
    v_keys text[];
    v_counts integer[];
    v_full text[];
    v_i integer;
BEGIN
    o_last := p_last;
    o_holders := p_holders;
    IF p_per_key IS NOT NULL THEN
        -- A semaphore group: the holders counted per key (p_holders is not enough), then
        -- the line scanned in order, granting every waiter whose key has room while the
        -- total has room and skipping those whose key is full. Keys full from the start
        -- are left out of the scan; an expired entry met is dropped (as the plain loop
        -- below drops those it meets at the front), so a scan that ends with no holder has
        -- left no row in line.
        SELECT coalesce(sum(c.n), 0)::integer, coalesce(array_agg(c.k), '{}'),
               coalesce(array_agg(c.n), '{}'),
               coalesce(array_agg(c.k) FILTER (WHERE c.n >= p_per_key), '{}')
        INTO o_holders, v_keys, v_counts, v_full
        FROM (SELECT h.group_key AS k, count(*)::integer AS n
              FROM __SCHEMA__.holders h WHERE h.name_id = p_id
              GROUP BY h.group_key) c;
        IF o_holders >= p_limit THEN
            RETURN;
        END IF;
        FOR g IN
            SELECT f.seq, f.holder, f.ttl, f.wait_ttl, f.expires_at, f.channel, f.wake,
                   f.callback, f.group_key
            FROM __SCHEMA__.waiters f
            WHERE f.name_id = p_id AND array_position(v_full, f.group_key) IS NULL
            ORDER BY f.rank, f.seq
        LOOP
            IF g.expires_at <= p_now THEN
                DELETE FROM __SCHEMA__.waiters d WHERE d.seq = g.seq;
                CONTINUE;
            END IF;
            -- array_position compares with IS NOT DISTINCT FROM: a NULL key is a key.
            v_i := array_position(v_keys, g.group_key);
            IF v_i IS NULL THEN
                v_keys := array_append(v_keys, g.group_key);
                v_counts := array_append(v_counts, 0);
                v_i := cardinality(v_keys);
            END IF;
            CONTINUE WHEN v_counts[v_i] >= p_per_key;  -- its key is full: the line goes on
            v_counts[v_i] := v_counts[v_i] + 1;
            DELETE FROM __SCHEMA__.waiters d WHERE d.seq = g.seq;
            o_last := greatest(o_last + 1, floor(extract(epoch FROM p_now) * 1000000)::bigint);
            o_holders := o_holders + 1;
            IF g.callback IS NOT NULL THEN
                INSERT INTO __SCHEMA__.holders
                    (name_id, holder, token, acquired_at, expires_at, claimed, callback,
                     pending, group_key)
                VALUES (p_id, g.holder, o_last, p_now, p_now + g.ttl * interval '1 second',
                        true, g.callback, true, g.group_key);
            ELSE
                v_exp := p_now + least(g.ttl, g.wait_ttl) * interval '1 second';
                INSERT INTO __SCHEMA__.holders
                    (name_id, holder, token, acquired_at, expires_at, claimed, group_key)
                VALUES (p_id, g.holder, o_last, p_now, v_exp, false, g.group_key);
                IF g.holder IS DISTINCT FROM p_quiet THEN
                    IF g.channel IS NULL THEN
                        PERFORM pg_notify(__CHANNEL__, __SCHEMA__.wake_key(p_name, g.holder));
                    ELSIF g.channel <> '' THEN
                        PERFORM pg_notify(g.channel, concat_ws(' ', g.wake, g.seq, o_last,
                            extract(epoch FROM p_now), extract(epoch FROM v_exp)));
                    END IF;
                END IF;
            END IF;
            EXIT WHEN o_holders >= p_limit;
        END LOOP;
        RETURN;
    END IF;
    IF o_holders IS NULL THEN
        SELECT count(*) INTO o_holders FROM __SCHEMA__.holders h WHERE h.name_id = p_id;
    END IF;
    WHILE o_holders < p_limit LOOP
        DELETE FROM __SCHEMA__.waiters d
        WHERE d.seq = (SELECT f.seq FROM __SCHEMA__.waiters f WHERE f.name_id = p_id
                       ORDER BY f.rank, f.seq LIMIT 1)
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

DROP FUNCTION __SCHEMA__.acquire(text, text, integer, double precision, double precision,
                                 boolean, timestamptz, text, text, bigint);

CREATE FUNCTION __SCHEMA__.acquire(
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
BEGIN
    -- Fastest path, an idle name (idle_since set: no holders and nobody in line, which every
    -- step keeps true under the row lock): the row locked and the caller granted in one
    -- statement. The UPDATE waits for the row lock and checks idle_since again on the row as
    -- it is then; the clock is read after the lock (the token in SET, the times in RETURNING).
    -- The name takes the caller's shape (limit, per_key).
    WITH g AS (
        UPDATE __SCHEMA__.names n
        SET last_token = greatest(n.last_token + 1, floor(extract(epoch FROM
                coalesce(p_now, clock_timestamp())) * 1000000)::bigint),
            lim = p_limit, per_key = p_per_key, idle_since = NULL
        WHERE n.key = sha256(convert_to(p_name, 'UTF8')) AND n.idle_since IS NOT NULL
        RETURNING n.id, n.last_token, coalesce(p_now, clock_timestamp()) AS t)
    INSERT INTO __SCHEMA__.holders AS h
        (name_id, holder, token, acquired_at, expires_at, claimed, group_key)
    SELECT g.id, p_holder, g.last_token, g.t, g.t + p_ttl * interval '1 second', true, p_key
    FROM g
    RETURNING h.token, h.acquired_at, h.expires_at INTO v_token, v_acq, v_exp;
    IF FOUND THEN
        granted := true;
        token := v_token;
        now := extract(epoch FROM v_acq);
        acquired_at := now;
        expires_at := extract(epoch FROM v_exp);
        RETURN;
    END IF;

    SELECT n.id, n.last_token, n.lim, n.newest_stamp, n.per_key
    INTO v_id, v_last, v_lim, v_newest, v_per_key
    FROM __SCHEMA__.names n WHERE n.key = sha256(convert_to(p_name, 'UTF8'))
    FOR UPDATE;
    IF NOT FOUND THEN
        -- a new name (or one being forgotten right now): create its row (v_newest stays
        -- NULL: unknown)
        SELECT l.o_id, l.o_last, l.o_lim, l.o_per_key INTO v_id, v_last, v_lim, v_per_key
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
        SET last_token = v_last, lim = v_lim, per_key = v_per_key, idle_since = NULL
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
    SET last_token = v_last, lim = v_lim, per_key = v_per_key, idle_since = NULL,
        newest_stamp = greatest(n.newest_stamp, v_stamp)
    WHERE n.id = v_id
      AND (n.last_token <> v_last OR n.lim <> v_lim OR n.per_key IS DISTINCT FROM v_per_key
           OR n.idle_since IS NOT NULL OR n.newest_stamp < v_stamp);
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
BEGIN
    -- A row deleted meanwhile by _forget_idle is skipped: the name is idle, nothing to do.
    SELECT n.id, n.lim, n.last_token, n.per_key INTO v_id, v_lim, v_last, v_per_key
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
    FROM __SCHEMA__._promote(v_id, p_name, v_lim, v_now, v_last, NULL, v_holders, v_per_key) p;
    -- No holder after promoting means nobody waits either (the limit is at least 1, and in
    -- a group every key has room then): idle.
    UPDATE __SCHEMA__.names n
    SET last_token = v_last,
        idle_since = CASE WHEN v_holders = 0 THEN coalesce(n.idle_since, v_now) END
    WHERE n.id = v_id
      AND (n.last_token <> v_last OR (n.idle_since IS NULL) = (v_holders = 0));
    RETURN v_mine > 0 OR v_waiting > 0;
END
$$;

-- set_limit changes the total of a group; its per_key stays.
CREATE OR REPLACE FUNCTION __SCHEMA__.set_limit(
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
    v_per_key integer;
BEGIN
    SELECT l.o_id, l.o_lim, l.o_last, l.o_per_key INTO v_id, v_lim, v_last, v_per_key
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
    FROM __SCHEMA__._promote(v_id, p_name, p_limit, v_now, v_last, NULL, NULL, v_per_key) p;
    PERFORM __SCHEMA__._settle(v_id, v_now, v_last, p_limit);
    RETURN v_lim;
END
$$;

DROP FUNCTION __SCHEMA__.acquire_callback(text, text, integer, double precision,
                                          double precision, timestamptz, text, bigint);

CREATE FUNCTION __SCHEMA__.acquire_callback(
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

DROP FUNCTION __SCHEMA__._take_name(bigint, text, integer, bigint, double precision, integer,
                                    timestamptz);

-- (lock_machine.due also counts a waiter that could be granted with nothing expired: a
-- refused acquire's purge in the model. Here a refused acquire is rolled back whole and
-- every other step promotes, so no such state is ever committed.)
CREATE FUNCTION __SCHEMA__._take_name(
    p_id bigint, p_name text, p_lim integer, p_last bigint, p_lease double precision,
    p_max integer, p_now timestamptz, p_per_key integer)
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
    FROM __SCHEMA__._promote(p_id, p_name, p_lim, p_now, p_last, NULL, NULL, p_per_key) p;
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

CREATE OR REPLACE FUNCTION __SCHEMA__.take_deliveries(
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
        SELECT k.id, k.name, k.lim, k.last_token, k.per_key INTO n
        FROM __SCHEMA__.names k WHERE k.id = c.name_id
        FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        v_now := coalesce(p_now, clock_timestamp());  -- read after the lock, as everywhere
        FOR t IN
            SELECT * FROM __SCHEMA__._take_name(n.id, n.name, n.lim, n.last_token, p_lease,
                                                p_max - v_taken, v_now, n.per_key)
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
BEGIN
    IF p_outcome NOT IN ('delivered', 'refused', 'retry') THEN
        RAISE EXCEPTION 'turnstile: unknown delivery outcome %', p_outcome
            USING ERRCODE = '22023';
    END IF;
    SELECT n.id, n.lim, n.last_token, n.per_key INTO v_id, v_lim, v_last, v_per_key
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
    FROM __SCHEMA__._promote(v_id, p_name, v_lim, v_now, v_last, NULL, NULL, v_per_key) p;
    PERFORM __SCHEMA__._settle(v_id, v_now, v_last, v_lim);
    RETURN v_count > 0;
END
$$;

DROP FUNCTION __SCHEMA__.status(text, timestamptz);

CREATE FUNCTION __SCHEMA__.status(
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
    v_now timestamptz := coalesce(p_now, clock_timestamp());
BEGIN
    now := extract(epoch FROM v_now);
    holders := '[]';
    waiters := '[]';
    holder_callbacks := '[]';
    waiter_callbacks := '[]';
    holder_keys := '[]';
    waiter_keys := '[]';
    SELECT n.id, n.lim, n.per_key INTO v_id, v_lim, v_per_key
    FROM __SCHEMA__.names n WHERE n.key = sha256(convert_to(p_name, 'UTF8'));
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM __SCHEMA__.holders h WHERE h.name_id = v_id)
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
    FROM __SCHEMA__.holders h WHERE h.name_id = v_id AND h.expires_at > v_now;
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
