-- Turnstile PostgreSQL schema, version 3: a hand-over's NOTIFY carries the grant, on the
-- waiting client's own channel.
--
-- Before: every hand-over sent one NOTIFY on the schema's channel, which every client's
-- LISTEN connection received (each looked at the payload and all but one ignored it), and
-- the woken waiter then ran an acquire to claim its grant: two durable commits and a wake-up
-- of every listening process per hand-over.
--
-- Now a waiter joins the line naming the channel its client LISTENs on (one random channel
-- per client) and its wake key (wake_key(name, holder), computed by the client), and the
-- release that grants it notifies that channel only, with the grant in the payload:
--
--     <wake_key> <seq> <token> <acquired_at> <expires_at>
--
-- (space-separated; seq is the waiting entry the grant was made for, the times are epoch
-- seconds on the database clock). The waiter starts its critical section on receipt; the
-- grant is durable (NOTIFY is delivered after COMMIT) and lasts min(ttl, wait_ttl) until
-- the waiter's renewal claims it for its full ttl, off the hand-over's path.
--
-- The release, on every hand-over's path, is also leaner (six statements and one call for a
-- hand-over instead of about ten statements and three calls, see release below). Same answers and wake-ups (the model-equivalence
-- test holds it to turnstile/_core/model.py as before).
--
-- Compatibility: waiting entries without a channel (joined through the version-2 acquire,
-- which stays, by a client of the previous release still running during an upgrade) are
-- woken as before, on the schema channel with the bare wake key. A channel of '' means the
-- client does not listen (listen=off): no NOTIFY at all.

ALTER TABLE __SCHEMA__.waiters ADD COLUMN channel text, ADD COLUMN wake text;

-- model.promote on others' behalf, as in version 1, plus: the wake-up goes to the waiter's
-- own channel with the grant in it (see above); p_holders, when the caller already knows how
-- many holders are left, saves counting them; and an expired entry met at the front is
-- dropped and skipped, so a caller need not sweep the whole line first (release does not).
DROP FUNCTION __SCHEMA__._promote(bigint, text, integer, timestamptz, bigint, text);
CREATE FUNCTION __SCHEMA__._promote(
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
        RETURNING d.seq, d.holder, d.ttl, d.wait_ttl, d.expires_at, d.channel, d.wake INTO w;
        EXIT WHEN NOT FOUND;
        CONTINUE WHEN w.expires_at <= p_now;
        o_last := greatest(o_last + 1, floor(extract(epoch FROM p_now) * 1000000)::bigint);
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
        o_holders := o_holders + 1;
    END LOOP;
END
$$;

-- model.acquire, as in version 1, plus: p_channel and p_wake (where to send this waiter's
-- wake-up and the key naming it there, see above; required, so a call of the version-2
-- signature never matches this one) and the output wait_id (the seq of the caller's waiting
-- entry, which a wake-up names).
CREATE FUNCTION __SCHEMA__.acquire(
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

-- model.release, as in version 1, in fewer statements (see the top of this file): the row
-- locked inline; expired leases and ours dropped in one statement, which also counts the
-- holders left for the promotion; no sweep of the whole line (the promotion drops expired
-- waiting entries as it meets them at the front; one further back is never granted,
-- counted or shown, and the next acquire sweeps it); idle known from the promotion's count.
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
BEGIN
    -- A row deleted meanwhile by _forget_idle is skipped: the name is idle, nothing to do.
    SELECT n.id, n.lim, n.last_token INTO v_id, v_lim, v_last
    FROM __SCHEMA__.names n WHERE n.key = sha256(convert_to(p_name, 'UTF8'))
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    v_now := coalesce(p_now, clock_timestamp());
    -- Expired leases go; ours (with p_token, if given) too, and counts as released only if
    -- it had not expired. The outer count sees the rows as they were before the DELETE.
    WITH gone AS (
        DELETE FROM __SCHEMA__.holders h
        WHERE h.name_id = v_id
          AND (h.expires_at <= v_now
               OR (h.holder = p_holder AND (p_token IS NULL OR h.token = p_token)))
        RETURNING h.holder, h.expires_at)
    SELECT count(*) FILTER (WHERE g.holder = p_holder AND g.expires_at > v_now),
           (SELECT count(*) FROM __SCHEMA__.holders h WHERE h.name_id = v_id) - count(*)
    INTO v_mine, v_holders FROM gone g;
    IF p_token IS NULL THEN
        -- Without a token, our own place in line goes too (if it had not expired).
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

-- The version-2 acquire (7 arguments), still called by a client of the previous release
-- running during an upgrade: the same state machine, so it is the function above with no
-- wake channel (NULL: such a waiter is woken on the schema's channel, as before).
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
                            NULL::text, NULL::text) a
$$;
