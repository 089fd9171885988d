-- Turnstile PostgreSQL schema, version 9: priorities (turnstile/_core/ranking.py).
--
-- Every line (waiters, rate_waiters) is kept in order of rank, then seq: rank = stamp -
-- lead, where stamp is the arrival time in integer microseconds on the database clock,
-- made strictly increasing per line (max(clock, newest stamp in line + 1), under the
-- name's row lock) and lead = priority * level is computed by the client
-- (ranking.lead(priority, ageing)) and passed as p_lead. A new waiting entry goes behind
-- every entry of its rank or better; one asking again keeps its rank. A rate-limit
-- newcomer that would stand first in line and whose slot has come is admitted at once.
--
-- Entries already in line rank by their arrival time in microseconds (priority 0), made
-- strictly increasing in seq order within each line, so they keep their order among
-- themselves and relative to those who join after them; joined_at is moved to that stamp
-- (by a microsecond or so at most, and only where two entries of one line shared a
-- microsecond or the clock had stepped back).
--
-- acquire, acquire_callback and rate_acquire gain a last parameter p_lead bigint DEFAULT
-- 0. The functions of the previous signatures are dropped, not kept beside the new ones:
-- a call with the old number of arguments (a client of the previous release, during an
-- upgrade) then resolves to the new function with p_lead = 0; were both kept, such a call
-- would match both and PostgreSQL would refuse it as ambiguous. The 7-argument acquire of
-- version 2 is kept, calling the new one.

ALTER TABLE __SCHEMA__.names ADD COLUMN newest_stamp bigint NOT NULL DEFAULT 0;

ALTER TABLE __SCHEMA__.waiters ADD COLUMN rank bigint;
-- s_i = max(a_i, s_(i-1) + 1) in seq order, i.e. r_i + max over j <= i of (a_j - r_j).
WITH a AS (
    SELECT w.seq, w.name_id,
           floor(extract(epoch FROM w.joined_at) * 1000000)::bigint AS at,
           row_number() OVER (PARTITION BY w.name_id ORDER BY w.seq) AS r
    FROM __SCHEMA__.waiters w),
s AS (
    SELECT a.seq, a.at,
           a.r + max(a.at - a.r) OVER (PARTITION BY a.name_id ORDER BY a.seq) AS stamp
    FROM a)
UPDATE __SCHEMA__.waiters w
SET rank = s.stamp, joined_at = w.joined_at + (s.stamp - s.at) * interval '1 microsecond'
FROM s WHERE w.seq = s.seq;
ALTER TABLE __SCHEMA__.waiters ALTER COLUMN rank SET NOT NULL;
UPDATE __SCHEMA__.names n SET newest_stamp = m.stamp
FROM (SELECT w.name_id, max(w.rank) AS stamp FROM __SCHEMA__.waiters w GROUP BY w.name_id) m
WHERE n.id = m.name_id;
DROP INDEX __SCHEMA__.waiters_line;
CREATE INDEX waiters_line ON __SCHEMA__.waiters (name_id, rank, seq);

ALTER TABLE __SCHEMA__.rate_waiters ADD COLUMN rank bigint;
WITH a AS (
    SELECT w.seq, w.rate_id, round(w.joined_at * 1000000)::bigint AS at,
           row_number() OVER (PARTITION BY w.rate_id ORDER BY w.seq) AS r
    FROM __SCHEMA__.rate_waiters w),
s AS (
    SELECT a.seq, a.at,
           a.r + max(a.at - a.r) OVER (PARTITION BY a.rate_id ORDER BY a.seq) AS stamp
    FROM a)
UPDATE __SCHEMA__.rate_waiters w
SET rank = s.stamp,
    joined_at = CASE WHEN s.stamp = s.at THEN w.joined_at
                     ELSE s.stamp::double precision / 1000000 END
FROM s WHERE w.seq = s.seq;
ALTER TABLE __SCHEMA__.rate_waiters ALTER COLUMN rank SET NOT NULL;
DROP INDEX __SCHEMA__.rate_waiters_line;
CREATE INDEX rate_waiters_line ON __SCHEMA__.rate_waiters (rate_id, rank, seq);

-- The front of the line is the least (rank, seq).
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

-- acquire with p_lead; the version-2 (7-argument) acquire calls it.
DROP FUNCTION __SCHEMA__.acquire(text, text, integer, double precision, double precision,
                                 boolean, timestamptz, text, text);

CREATE FUNCTION __SCHEMA__.acquire(
    p_name text, p_holder text, p_limit integer, p_ttl double precision,
    p_wait_ttl double precision, p_enqueue boolean, p_now timestamptz, p_channel text,
    p_wake text, p_lead bigint DEFAULT 0,
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

    SELECT n.id, n.last_token, n.lim, n.newest_stamp INTO v_id, v_last, v_lim, v_newest
    FROM __SCHEMA__.names n WHERE n.key = sha256(convert_to(p_name, 'UTF8'))
    FOR UPDATE;
    IF NOT FOUND THEN
        -- a new name (or one being forgotten right now): create its row (v_newest stays
        -- NULL: unknown)
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
        RETURNING w.seq, w.rank INTO v_seq, v_rank;
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
                     rank)
                VALUES (v_id, p_holder, p_ttl, p_wait_ttl,
                        v_now + (v_stamp - v_at) * interval '1 microsecond',
                        v_now + p_wait_ttl * interval '1 second', p_channel, p_wake,
                        v_stamp - p_lead)
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
    SET last_token = v_last, lim = v_lim, idle_since = NULL,
        newest_stamp = greatest(n.newest_stamp, v_stamp)
    WHERE n.id = v_id
      AND (n.last_token <> v_last OR n.lim <> v_lim OR n.idle_since IS NOT NULL
           OR n.newest_stamp < v_stamp);
END
$$;

CREATE OR REPLACE FUNCTION __SCHEMA__.acquire(
    p_name text, p_holder text, p_limit integer, p_ttl double precision,
    p_wait_ttl double precision, p_enqueue boolean, p_now timestamptz DEFAULT NULL,
    OUT granted boolean, OUT token bigint, OUT acquired_at double precision,
    OUT expires_at double precision, OUT queue_position integer, OUT now double precision,
    OUT retry_after double precision)
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT a.granted, a.token, a.acquired_at, a.expires_at, a.queue_position, a.now,
           a.retry_after
    FROM __SCHEMA__.acquire(p_name, p_holder, p_limit, p_ttl, p_wait_ttl, p_enqueue, p_now,
                            NULL::text, NULL::text, 0::bigint) a
$$;

DROP FUNCTION __SCHEMA__.acquire_callback(text, text, integer, double precision,
                                          double precision, timestamptz, text);

CREATE FUNCTION __SCHEMA__.acquire_callback(
    p_name text, p_holder text, p_limit integer, p_ttl double precision,
    p_wait_ttl double precision, p_now timestamptz, p_callback text, p_lead bigint DEFAULT 0,
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
                            ''::text, NULL::text, p_lead) a;
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

-- The line shown in order of (rank, seq).
CREATE OR REPLACE FUNCTION __SCHEMA__.status(
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
                             ORDER BY w.rank, w.seq), '[]'),
           coalesce(json_agg(__SCHEMA__._callback_kind(w.callback) ORDER BY w.rank, w.seq),
                    '[]')
    INTO waiters, waiter_callbacks
    FROM __SCHEMA__.waiters w WHERE w.name_id = v_id AND w.expires_at > v_now;
END
$$;

DROP FUNCTION __SCHEMA__.rate_acquire(text, text, integer, double precision, integer,
                                      boolean, double precision, timestamptz);

CREATE FUNCTION __SCHEMA__.rate_acquire(
    p_name text, p_holder text, p_rate integer, p_per double precision, p_burst integer,
    p_enqueue boolean, p_grace double precision, p_now timestamptz, p_lead bigint DEFAULT 0,
    OUT admitted boolean, OUT queue_position integer, OUT now double precision,
    OUT retry_after double precision, OUT tat double precision)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key bytea := sha256(convert_to(p_name, 'UTF8'));
    v_id bigint;
    v_rate integer;
    v_per double precision;
    v_burst integer;
    v_tat double precision;
    v_last double precision;
    v_waiting integer;
    v_recent integer;
    v_quiet double precision;
    v_live integer := 0;
    v_index integer;
    v_seq bigint;
    v_interval double precision;
    v_tolerance double precision;
    v_due double precision;
    v_exp double precision;
    v_need double precision;
    v_raise boolean;
    v_cutoff double precision;
    v_conforms boolean;
    v_at bigint;
    v_newest bigint;
    v_ahead integer := 0;
BEGIN
    SELECT r.id, r.rate, r.per, r.burst, r.tat, r.last_at, r.waiting, r.recent, r.quiet_at
    INTO v_id, v_rate, v_per, v_burst, v_tat, v_last, v_waiting, v_recent, v_quiet
    FROM __SCHEMA__.rates r WHERE r.key = v_key
    FOR UPDATE;
    IF NOT FOUND THEN
        -- A new name (or one made idle and forgotten right now): make its row. A concurrent
        -- first acquire may make it first; then lock that one.
        FOR attempt IN 1..50 LOOP
            INSERT INTO __SCHEMA__.rates AS r (key, name, rate, per, burst, tat, quiet_at)
            VALUES (v_key, p_name, p_rate, p_per, p_burst, 0, 0)
            ON CONFLICT DO NOTHING
            RETURNING r.id, r.rate, r.per, r.burst, r.tat, r.last_at, r.waiting, r.recent,
                      r.quiet_at
            INTO v_id, v_rate, v_per, v_burst, v_tat, v_last, v_waiting, v_recent, v_quiet;
            IF FOUND THEN
                PERFORM __SCHEMA__._rate_forget_idle(
                    extract(epoch FROM coalesce(p_now, clock_timestamp())), v_id);
                EXIT;
            END IF;
            SELECT r.id, r.rate, r.per, r.burst, r.tat, r.last_at, r.waiting, r.recent,
                   r.quiet_at
            INTO v_id, v_rate, v_per, v_burst, v_tat, v_last, v_waiting, v_recent, v_quiet
            FROM __SCHEMA__.rates r WHERE r.key = v_key
            FOR UPDATE;
            EXIT WHEN FOUND;
        END LOOP;
        IF v_id IS NULL THEN
            RAISE EXCEPTION 'turnstile: could not lock the row of a rate limit'
                USING ERRCODE = '55P03';
        END IF;
    END IF;
    now := extract(epoch FROM coalesce(p_now, clock_timestamp()));
    -- A newcomer's arrival stamp (ranking.stamp): the clock in microseconds, above the
    -- newest stamp in line (v_newest, read with the line).
    v_at := floor(now * 1000000)::bigint;

    -- purge: expired places go; the live line, and our place in it (none when the line has
    -- no rows at all: nothing to read); its newest stamp, and how many a newcomer would
    -- stand behind (every entry of its rank or better).
    IF v_waiting > 0 THEN
        WITH gone AS (
            DELETE FROM __SCHEMA__.rate_waiters w
            WHERE w.rate_id = v_id AND w.expires_at <= now),
        line AS (
            SELECT w.seq, w.holder, w.rank, round(w.joined_at * 1000000)::bigint AS stamp,
                   (row_number() OVER (ORDER BY w.rank, w.seq) - 1)::integer AS pos
            FROM __SCHEMA__.rate_waiters w
            WHERE w.rate_id = v_id AND w.expires_at > now),
        newest AS (
            SELECT max(l.stamp) AS stamp FROM line l)
        SELECT count(*)::integer, max(l.pos) FILTER (WHERE l.holder = p_holder),
               max(l.seq) FILTER (WHERE l.holder = p_holder), max(s.stamp),
               count(*) FILTER (WHERE l.rank <= greatest(v_at, s.stamp + 1) - p_lead)::integer
        INTO v_live, v_index, v_seq, v_newest, v_ahead
        FROM line l, newest s;
    END IF;

    -- One rate per busy name; an idle one (or one with nobody in line and tat past) takes
    -- the caller's.
    v_cutoff := now - v_per;  -- purge by the rate the admissions were made under
    IF v_live = 0 AND v_tat <= now THEN
        v_rate := p_rate;
        v_per := p_per;
        v_burst := p_burst;
    ELSIF (v_rate, v_per, v_burst) IS DISTINCT FROM (p_rate, p_per, p_burst) THEN
        RAISE EXCEPTION 'turnstile: rate limit % is in use with another rate', p_name
            USING ERRCODE = 'TSL02', DETAIL = format('%s %s %s', v_rate, v_per, v_burst);
    END IF;
    v_interval := v_per / v_rate;
    v_tolerance := (v_burst - 1) * v_interval;
    v_conforms := now >= v_tat - v_tolerance;
    admitted := false;

    IF v_conforms AND (v_index = 0 OR (v_index IS NULL AND v_live = 0)) THEN
        -- first in line, or nobody in line, and the slot has come: admitted
        IF v_index = 0 THEN
            DELETE FROM __SCHEMA__.rate_waiters w WHERE w.seq = v_seq;
            v_live := v_live - 1;
        END IF;
        v_tat := greatest(v_tat, now) + v_interval;
        admitted := true;
        retry_after := 0;
    ELSIF v_index IS NULL AND NOT p_enqueue THEN
        retry_after := greatest(now, v_tat - v_tolerance) + v_live * v_interval - now;
    ELSIF v_index IS NULL AND v_ahead = 0 AND v_conforms THEN
        -- a newcomer that ranks ahead of everyone in line and whose slot has come: admitted
        -- at once (its place, taken and given up in the same step, is never written)
        v_tat := greatest(v_tat, now) + v_interval;
        admitted := true;
        retry_after := 0;
    ELSE
        -- a newcomer joins behind the v_ahead entries of its rank or better (those it
        -- passes get later slots: they learn them when they come back at their old one);
        -- one in line keeps its place
        v_index := coalesce(v_index, v_ahead);
        v_due := greatest(now, v_tat - v_tolerance) + v_index * v_interval;
        v_exp := v_due + p_grace;
        IF v_seq IS NULL THEN
            v_at := greatest(v_at, v_newest + 1);
            INSERT INTO __SCHEMA__.rate_waiters (rate_id, holder, joined_at, expires_at, rank)
            VALUES (v_id, p_holder, v_at::double precision / 1000000, v_exp, v_at - p_lead);
            v_live := v_live + 1;
        ELSE
            UPDATE __SCHEMA__.rate_waiters w SET expires_at = v_exp WHERE w.seq = v_seq;
        END IF;
        queue_position := v_index;
        retry_after := greatest(0, v_due - now);
    END IF;
    tat := v_tat;

    -- Write back. quiet_at is raised (by a minute more than needed) only when it must be.
    v_need := greatest(v_tat, v_exp, CASE WHEN admitted THEN now ELSE v_last END + v_per);
    v_raise := v_need > v_quiet;
    IF v_raise THEN
        v_quiet := v_need + greatest(v_per, 60);
    END IF;
    IF admitted THEN
        -- rate_machine.purge of the admissions, then this one recorded.
        WITH gone AS (
            DELETE FROM __SCHEMA__.rate_admissions a
            WHERE a.rate_id = v_id AND a.at <= v_cutoff
            RETURNING 1),
        added AS (
            INSERT INTO __SCHEMA__.rate_admissions (rate_id, at) VALUES (v_id, now))
        UPDATE __SCHEMA__.rates r
        SET rate = p_rate, per = p_per, burst = p_burst, tat = v_tat, last_at = now,
            waiting = v_live, recent = r.recent + 1 - (SELECT count(*) FROM gone),
            quiet_at = v_quiet
        WHERE r.id = v_id
        RETURNING r.recent INTO v_recent;
        IF v_recent > 10000 THEN  -- rate_machine.MAX_RECENT: the oldest go
            DELETE FROM __SCHEMA__.rate_admissions a
            WHERE a.ctid IN (SELECT o.ctid FROM __SCHEMA__.rate_admissions o
                             WHERE o.rate_id = v_id ORDER BY o.at LIMIT v_recent - 10000);
            UPDATE __SCHEMA__.rates r SET recent = 10000 WHERE r.id = v_id;
        END IF;
    ELSIF v_live <> v_waiting OR v_raise THEN
        UPDATE __SCHEMA__.rates r SET waiting = v_live, quiet_at = v_quiet WHERE r.id = v_id;
    END IF;
END
$$;

-- The line shown in order of (rank, seq).
CREATE OR REPLACE FUNCTION __SCHEMA__.rate_status(
    p_name text, p_now timestamptz DEFAULT NULL,
    OUT rate integer, OUT per double precision, OUT burst integer, OUT now double precision,
    OUT next_slot double precision, OUT holders text[], OUT joined double precision[],
    OUT slots double precision[], OUT admitted double precision[])
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
    v_rate integer;
    v_per double precision;
    v_burst integer;
    v_tat double precision;
    v_interval double precision;
    v_next double precision;
BEGIN
    now := extract(epoch FROM coalesce(p_now, clock_timestamp()));
    next_slot := now;
    holders := '{}';
    joined := '{}';
    slots := '{}';
    admitted := '{}';
    SELECT r.id, r.rate, r.per, r.burst, r.tat INTO v_id, v_rate, v_per, v_burst, v_tat
    FROM __SCHEMA__.rates r WHERE r.key = sha256(convert_to(p_name, 'UTF8'));
    IF NOT FOUND THEN
        RETURN;
    END IF;
    v_interval := v_per / v_rate;
    v_next := greatest(now, v_tat - (v_burst - 1) * v_interval);
    SELECT coalesce(array_agg(l.holder ORDER BY l.pos), '{}'),
           coalesce(array_agg(l.joined_at ORDER BY l.pos), '{}'),
           coalesce(array_agg(v_next + l.pos * v_interval ORDER BY l.pos), '{}')
    INTO holders, joined, slots
    FROM (SELECT w.holder, w.joined_at,
                 row_number() OVER (ORDER BY w.rank, w.seq) - 1 AS pos
          FROM __SCHEMA__.rate_waiters w
          WHERE w.rate_id = v_id AND w.expires_at > now) l;
    SELECT coalesce(array_agg(a.at ORDER BY a.at), '{}') INTO admitted
    FROM __SCHEMA__.rate_admissions a WHERE a.rate_id = v_id AND a.at > now - v_per;
    IF cardinality(holders) > 0 OR v_tat > now OR cardinality(admitted) > 0 THEN
        rate := v_rate;
        per := v_per;
        burst := v_burst;
        next_slot := v_next + 0 * v_interval;
    END IF;
END
$$;
