-- Turnstile PostgreSQL schema, version 16: expired waiting entries found through an index,
-- and a plain grant keeps its waiting entry's key.
--
-- Every lock step first drops the name's expired waiting entries (DELETE FROM waiters WHERE
-- name_id = ... AND expires_at <= now). Without an index on expires_at that statement read
-- every entry of the name's line: the claim of a grant cost 0.6 ms with 2 waiters and
-- 1.9 ms with 10,000 (benchmarks/results/scale.md). With waiters_expiry it reads only the
-- expired ones.
--
-- The price: a waiter that keeps its place (an UPDATE of expires_at, once every wait_ttl/3
-- for a blocked acquire) is no longer a HOT update, so each such step also writes new
-- entries in the table's indexes.
--
-- Also: _promote's plain loop (a semaphore without per_key) keeps the key a waiting entry
-- named on the grant it makes, as lock_machine.promote does; it dropped it, so a holder
-- granted from the line showed no key where one granted at once showed its key (found by
-- the model-equivalence test with more seeds). The public API names a key only with
-- per_key, so only direct callers of the functions could see the difference.
--
-- Safe on a populated schema: one index on the waiters table, which holds only the entries
-- waiting now (it is locked against writes while the index builds, a moment for any
-- realistic line), and one function replaced with the same signature.

CREATE INDEX waiters_expiry ON __SCHEMA__.waiters (name_id, expires_at);

-- lock_machine.promote, as in version 3, plus callback waiters: granted claimed for their
-- full ttl with a pending delivery (claimed_until -infinity: nobody's claim), never woken;
-- the front of the line is the least (rank, seq) (version 9). With p_per_key (version 10), a
-- semaphore group's promotion: every waiter in line order whose key has fewer than
-- p_per_key holders, while the total has room; waiters of full keys are skipped.
-- A grant keeps the key its waiting entry named, in a plain semaphore too, as the
-- state machine does (version 16; before, the plain loop dropped it).
CREATE OR REPLACE FUNCTION __SCHEMA__._promote(
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
                  d.callback, d.group_key INTO w;
        EXIT WHEN NOT FOUND;
        CONTINUE WHEN w.expires_at <= p_now;
        o_last := greatest(o_last + 1, floor(extract(epoch FROM p_now) * 1000000)::bigint);
        o_holders := o_holders + 1;
        IF w.callback IS NOT NULL THEN
            -- Nobody to wake and nobody to claim it: claimed for its full ttl, its delivery
            -- pending, in this very transaction.
            INSERT INTO __SCHEMA__.holders
                (name_id, holder, token, acquired_at, expires_at, claimed, callback, pending,
                 group_key)
            VALUES (p_id, w.holder, o_last, p_now, p_now + w.ttl * interval '1 second', true,
                    w.callback, true, w.group_key);
            CONTINUE;
        END IF;
        v_exp := p_now + least(w.ttl, w.wait_ttl) * interval '1 second';
        -- A holder is never also waiting (acquire returns early for a holder), so this
        -- insert cannot conflict.
        INSERT INTO __SCHEMA__.holders
            (name_id, holder, token, acquired_at, expires_at, claimed, group_key)
        VALUES (p_id, w.holder, o_last, p_now, v_exp, false, w.group_key);
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
