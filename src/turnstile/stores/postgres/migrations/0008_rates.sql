-- Turnstile PostgreSQL schema, version 8: rate limits whose callers wait in line
-- (turnstile/_core/rate_machine.py: GCRA with emission interval T = per / rate, tolerance
-- tau = (burst - 1) * T and tat, the theoretical arrival time of the next admission; a FIFO
-- line whose k-th entry (0 = next) is due at max(now, tat - tau) + k * T and lasts until
-- grace after that slot).
--
-- Three new tables and four new functions; nothing existing changes. A rate limit is its
-- own namespace (a lock and a rate limit may share a name). Every operation is one call of
-- a function below that locks the name's row in `rates` first (SELECT ... FOR UPDATE, the
-- row made by the first acquire), reads the clock after the lock, and follows
-- rate_machine step for step, in double precision epoch seconds: the reference's own
-- arithmetic, operation for operation. An idle rate limit (nobody in line, tat past, no
-- admission in the last `per`) keeps no rows: rate_leave deletes them when it makes the name
-- idle, an acquire on an idle name reuses its row, and a new name's acquire forgets a few
-- abandoned ones (_rate_forget_idle).
--
-- A busy name has one rate: an acquire naming another raises SQLSTATE TSL02 with DETAIL
-- "rate per burst" of the name (the client answers rate_machine.rate_conflict).

-- A rate limit in use. The row is the name's lock. `waiting` counts the rows of the line
-- (live or expired, not yet deleted: 0 means the line is empty, so an admission need not
-- look at it); `recent` counts the rows of rate_admissions; `last_at` is the newest
-- admission. `quiet_at` is a time after which the name is surely idle if nobody asks
-- (>= tat, last_at + per and every waiting entry's expiry), raised by at least a minute
-- whenever it must be, so that most steps leave it (and stay HOT updates).
CREATE TABLE __SCHEMA__.rates (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- sha256 of the name: names may be up to 4 KiB, longer than a btree entry may be.
    key       bytea NOT NULL UNIQUE,
    name      text COLLATE "C" NOT NULL,
    rate      integer NOT NULL,
    per       double precision NOT NULL,
    burst     integer NOT NULL,
    tat       double precision NOT NULL,
    last_at   double precision,
    waiting   integer NOT NULL DEFAULT 0,
    recent    integer NOT NULL DEFAULT 0,
    quiet_at  double precision NOT NULL
) WITH (fillfactor = 70);
CREATE INDEX rates_quiet ON __SCHEMA__.rates (quiet_at);

-- The line, in arrival order (seq, an identity, never goes back).
CREATE TABLE __SCHEMA__.rate_waiters (
    seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rate_id    bigint NOT NULL,
    holder     text COLLATE "C" NOT NULL,
    joined_at  double precision NOT NULL,
    expires_at double precision NOT NULL,
    UNIQUE (rate_id, holder)
) WITH (fillfactor = 70);
CREATE INDEX rate_waiters_line ON __SCHEMA__.rate_waiters (rate_id, seq);

-- Admission times of the last `per` seconds, at most 10000 (rate_machine.MAX_RECENT) per
-- name: what rate_status shows. Older ones are deleted by the next admission.
CREATE TABLE __SCHEMA__.rate_admissions (
    rate_id bigint NOT NULL,
    at      double precision NOT NULL
);
CREATE INDEX rate_admissions_by_time ON __SCHEMA__.rate_admissions (rate_id, at);

-- Forget a few rate limits surely idle but p_keep's (bounded work, never waits for a lock).
CREATE FUNCTION __SCHEMA__._rate_forget_idle(p_now double precision, p_keep bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    WITH gone AS (
        DELETE FROM __SCHEMA__.rates r
        WHERE r.id IN (SELECT i.id FROM __SCHEMA__.rates i
                       WHERE i.quiet_at < p_now AND i.id <> p_keep
                       ORDER BY i.quiet_at
                       LIMIT 4
                       FOR UPDATE SKIP LOCKED)
        RETURNING r.id),
    line AS (
        DELETE FROM __SCHEMA__.rate_waiters w USING gone g WHERE w.rate_id = g.id)
    DELETE FROM __SCHEMA__.rate_admissions a USING gone g WHERE a.rate_id = g.id;
END
$$;

-- rate_machine.acquire: admit (admitted), or join / keep a place in line (queue_position,
-- 0 = next; NULL with p_enqueue false: not joined) and answer retry_after, the seconds
-- until the caller's slot. tat: the name's tat after the step. p_grace: how long the
-- caller's place lasts past its slot. p_now: a virtual clock (tests), else the database's.
-- An admission with nobody in line is two statements: the row lock, and one statement
-- that trims old admissions, records this one and writes the row.
CREATE FUNCTION __SCHEMA__.rate_acquire(
    p_name text, p_holder text, p_rate integer, p_per double precision, p_burst integer,
    p_enqueue boolean, p_grace double precision, p_now timestamptz,
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

    -- purge: expired places go; the live line, and our place in it (none when the line has
    -- no rows at all: nothing to read).
    IF v_waiting > 0 THEN
        WITH gone AS (
            DELETE FROM __SCHEMA__.rate_waiters w
            WHERE w.rate_id = v_id AND w.expires_at <= now),
        line AS (
            SELECT w.seq, w.holder, (row_number() OVER (ORDER BY w.seq) - 1)::integer AS pos
            FROM __SCHEMA__.rate_waiters w
            WHERE w.rate_id = v_id AND w.expires_at > now)
        SELECT count(*)::integer, max(l.pos) FILTER (WHERE l.holder = p_holder),
               max(l.seq) FILTER (WHERE l.holder = p_holder)
        INTO v_live, v_index, v_seq
        FROM line l;
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
    admitted := false;

    IF now >= v_tat - v_tolerance AND (v_index = 0 OR (v_index IS NULL AND v_live = 0)) THEN
        IF v_index = 0 THEN
            DELETE FROM __SCHEMA__.rate_waiters w WHERE w.seq = v_seq;
            v_live := v_live - 1;
        END IF;
        v_tat := greatest(v_tat, now) + v_interval;
        admitted := true;
        retry_after := 0;
    ELSE
        IF v_index IS NULL AND NOT p_enqueue THEN
            retry_after := greatest(now, v_tat - v_tolerance) + v_live * v_interval - now;
        ELSE
            v_due := greatest(now, v_tat - v_tolerance)
                     + coalesce(v_index, v_live) * v_interval;
            v_exp := v_due + p_grace;
            IF v_index IS NULL THEN
                INSERT INTO __SCHEMA__.rate_waiters (rate_id, holder, joined_at, expires_at)
                VALUES (v_id, p_holder, now, v_exp);
                v_index := v_live;
                v_live := v_live + 1;
            ELSE
                UPDATE __SCHEMA__.rate_waiters w SET expires_at = v_exp WHERE w.seq = v_seq;
            END IF;
            queue_position := v_index;
            retry_after := greatest(0, v_due - now);
        END IF;
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

-- rate_machine.leave: give up a place in line (a caller that timed out); false if it had
-- none (or only an expired one). A name this leaves idle keeps no rows.
CREATE FUNCTION __SCHEMA__.rate_leave(p_name text, p_holder text, p_now timestamptz)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
    v_per double precision;
    v_tat double precision;
    v_last double precision;
    v_waiting integer;
    v_now double precision;
    v_left boolean := false;
    v_gone boolean := false;
BEGIN
    SELECT r.id, r.per, r.tat, r.last_at, r.waiting
    INTO v_id, v_per, v_tat, v_last, v_waiting
    FROM __SCHEMA__.rates r WHERE r.key = sha256(convert_to(p_name, 'UTF8'))
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    v_now := extract(epoch FROM coalesce(p_now, clock_timestamp()));
    IF v_waiting > 0 THEN
        DELETE FROM __SCHEMA__.rate_waiters w WHERE w.rate_id = v_id AND w.holder = p_holder
        RETURNING w.expires_at > v_now INTO v_left;
        v_gone := FOUND;
        v_left := coalesce(v_left, false);
        IF v_gone THEN
            v_waiting := v_waiting - 1;
        END IF;
    END IF;
    IF v_tat <= v_now AND (v_last IS NULL OR v_last <= v_now - v_per) THEN
        IF v_waiting = 0 OR NOT EXISTS (
            SELECT 1 FROM __SCHEMA__.rate_waiters w
            WHERE w.rate_id = v_id AND w.expires_at > v_now)
        THEN
            -- idle: nothing of it is kept
            DELETE FROM __SCHEMA__.rate_waiters w WHERE w.rate_id = v_id;
            DELETE FROM __SCHEMA__.rate_admissions a WHERE a.rate_id = v_id;
            DELETE FROM __SCHEMA__.rates r WHERE r.id = v_id;
            RETURN v_left;
        END IF;
    END IF;
    IF v_gone THEN
        UPDATE __SCHEMA__.rates r SET waiting = v_waiting WHERE r.id = v_id;
    END IF;
    RETURN v_left;
END
$$;

-- rate_machine.status, read only: the rate (NULL while idle), the live line in order
-- (holders, joined, slots: one entry per waiter), the admissions of the last `per` seconds
-- in order, and next_slot (now while idle).
CREATE FUNCTION __SCHEMA__.rate_status(
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
    SELECT coalesce(array_agg(l.holder ORDER BY l.seq), '{}'),
           coalesce(array_agg(l.joined_at ORDER BY l.seq), '{}'),
           coalesce(array_agg(v_next + l.pos * v_interval ORDER BY l.seq), '{}')
    INTO holders, joined, slots
    FROM (SELECT w.seq, w.holder, w.joined_at, row_number() OVER (ORDER BY w.seq) - 1 AS pos
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
