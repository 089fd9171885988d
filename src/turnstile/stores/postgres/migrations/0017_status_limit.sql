-- Turnstile PostgreSQL schema, version 17: release drops expired waiting entries first, as
-- every other step does, and status reports a name's limit only while it has an unexpired
-- holder or waiter.
--
-- release dropped the expired entries it met at the front of the line only when it had room
-- to grant. With a full name they stayed, and the deliverer's sweep (take_deliveries) then
-- took an expired callback waiter's row for a reason to step on the name, granting from the
-- line sooner than the state machine does (lock_machine.release purges first). Found by the
-- model-equivalence test with more seeds (seed 12).
--
-- Before, status reported the limit (and per_key) whenever the name had any holder or
-- waiting row, expired or not. Rows that expired stay until a step on the name (or the
-- deliverer's sweep) purges them, so the answer for a name whose only lease had expired
-- depended on whether something had purged it yet: the limit if not, None if so. The
-- state machine (lock_machine.status), the Redis status script and SQLite now all report
-- the limit only while someone holds or waits (found by the model-equivalence test with
-- more seeds: seed 47).
--
-- Safe on a populated schema: two functions replaced with the same signatures.

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
    -- The limit is the name's while someone holds or waits (version 17): expired rows that
    -- no step has purged yet do not count, as in lock_machine.status.
    IF json_array_length(holders) > 0 OR json_array_length(waiters) > 0 THEN
        lim := v_lim;
        per_key := v_per_key;
    END IF;
END
$$;

-- lock_machine.release, as in version 1, in fewer statements (see the top of this file): the row
-- locked inline; expired leases and ours dropped in one statement, which also counts the
-- holders left for the promotion; expired waiting entries dropped in the same statement
-- (version 17, found through the waiters_expiry index of version 16, so without reading the
-- rest of the line), as lock_machine.release purges first; idle known from the promotion's
-- count.
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
        purged AS (  -- expired waiting entries too, as every step does first (version 17)
            DELETE FROM __SCHEMA__.waiters w
            WHERE w.name_id = v_id AND w.expires_at <= v_now),
        c AS (
            SELECT count(*) FILTER (WHERE g.holder = p_holder AND g.expires_at > v_now) AS mine,
                   (SELECT count(*) FROM __SCHEMA__.holders h WHERE h.name_id = v_id)
                   - count(*) AS left_,
                   EXISTS (SELECT 1 FROM __SCHEMA__.waiters w
                           WHERE w.name_id = v_id AND w.expires_at > v_now) AS line
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
        -- Expired waiting entries too (version 17), and ours (counted only if it had not
        -- expired), in one statement as the leases above.
        WITH gone AS (
            DELETE FROM __SCHEMA__.waiters w
            WHERE w.name_id = v_id AND (w.expires_at <= v_now OR w.holder = p_holder)
            RETURNING w.holder, w.expires_at)
        SELECT count(*) FILTER (WHERE g.holder = p_holder AND g.expires_at > v_now)
        INTO v_waiting FROM gone g;
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
