-- Turnstile's PostgreSQL schema as it is now (version 19): every table, index and function,
-- each in its current version. Read this file to see what a schema holds; the migrations
-- (migrations/0001..0019) are how a schema gets there and stay as deployed databases applied
-- them. A new schema is still made by running the migrations in order (see sql.py), and
-- tests/stores/postgres/test_schema.py checks that this file makes exactly the same schema
-- (tables, columns, indexes, constraints and the text of every function).
--
-- __SCHEMA__ is replaced by the quoted schema name and __CHANNEL__ by the quoted NOTIFY
-- channel of that schema.
--
-- Every operation is one call of a function below, in its own (autocommit) transaction: it
-- locks the name's row first (SELECT ... FOR UPDATE), reads the clock after
-- taking the lock (clock_timestamp()) and follows turnstile/_core/lock_machine.py (queues:
-- queue_machine.py, rate limits: rate_machine.py) step for step. Nothing relies on session state, so the functions work
-- through a transaction pooler. Queues (version 11) do not lock their row: their steps run
-- side by side under narrower locks (see migrations/0011_parallel_queue.sql and "Queues"
-- below).
--
-- Wake-ups: a lock waiter joins the line naming the channel its client LISTENs on (one
-- random channel per client) and its wake key (wake_key(name, holder), computed by the
-- client); the release that grants it notifies that channel only, with the grant in the
-- payload:
--
--     <wake_key> <seq> <token> <acquired_at> <expires_at>
--
-- (seq: the waiting entry the grant was made for; times: epoch seconds on the database
-- clock). A blocked queue consumer is woken the same way with queue_wake_key(name, waiter).
-- Entries without a channel (joined through the 7-argument acquire or queue_claim, kept for
-- clients of an older release during an upgrade) are woken on the schema's channel with the
-- bare wake key. A channel of '' means the client does not listen (listen=off): no NOTIFY.
--
-- Callback grants (version 6): a waiter may wait with a callback (waiters.callback: the JSON
-- text of turnstile._core.callbacks.encode, a Step Functions task token or an HTTP URL)
-- instead of a connection. Whichever step grants it (acquire, release, set_limit,
-- take_deliveries, a refused delivery) writes the grant claimed for the full ttl with a
-- pending delivery (holders.callback, pending) in the same transaction and NOTIFYs nobody.
-- A deliverer polls take_deliveries, which acts on the expiries of names with callbacks
-- (nobody else polls for them) and claims pending deliveries for a lease of its own
-- (holders.claimed_until, attempts), and settles each with settle_delivery. The callback's
-- text is a credential: status shows its kind only.
--
-- Priorities (version 9): every line (waiters, rate_waiters) is kept in order of rank, then
-- seq (turnstile/_core/ranking.py): rank = stamp - lead, where stamp is the arrival time in
-- integer microseconds on the database clock, made strictly increasing per line
-- (max(clock, newest stamp in line + 1), under the name's row lock), and lead = priority *
-- level, computed by the client (ranking.lead) and passed as p_lead. A new waiting entry
-- goes behind every entry of its rank or better; one asking again keeps its rank.
--
-- Semaphore groups (version 10): a name with per_key (NULL: a plain semaphore or lock) keeps
-- at most per_key holders per key (holders.group_key, waiters.group_key) and lim in all;
-- _promote grants, in line order, every waiter whose key has room while the total has room,
-- skipping waiters whose key is full (no head-of-line blocking), and a newcomer whose key
-- and the total have room is granted at once whoever waits. A busy name has one shape
-- (lim, per_key): a newcomer naming another is refused (SQLSTATE TSL01, DETAIL "lim" or
-- "lim per_key"). The plain path reads per_key with lim and runs none of the group's steps.
--
-- The uncontended lock (version 12): acquire on an idle name grants the caller in the name's
-- row (a fast grant: names.h_holder, token last_token), and release by that fast holder
-- frees the name there, each one UPDATE (a HOT update: busy, not the indexed idle_since, is
-- the idle flag); the client may send the same two steps as plain statements (queries.sql)
-- that call acquire() or release() only when they do not apply. Every other step that locks
-- the row first moves a fast grant into holders (_spill), so one exists only while nothing
-- else happened on the name since: no other holder, nobody in line.

-- == Tables ====================================================================================

-- One row per name that has been used recently. The row is the name's lock (every operation
-- on the name locks it first) and its fencing-token counter.
CREATE TABLE __SCHEMA__.names (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- sha256 of the name: names may be up to 4 KiB, longer than a btree entry may be.
    key         bytea NOT NULL UNIQUE,
    name        text COLLATE "C" NOT NULL,
    -- The name's limit while it has holders or waiters: set by the acquire that found it
    -- idle, changed by set_limit (1 for locks).
    lim         integer NOT NULL,
    -- The last fencing token issued on this name. The next is
    -- max(last_token + 1, clock in microseconds) (lock_machine.clock_token).
    last_token  bigint NOT NULL DEFAULT 0,
    -- A hint for _forget_idle (version 12): set when the name becomes idle if it was NULL,
    -- otherwise left as it is (so that a grant and release of an idle name are HOT updates).
    -- An idle row whose last token is more than a day old is forgotten (see _forget_idle):
    -- the clock has then moved far past last_token, so a recreated row never repeats a token.
    idle_since  timestamptz,
    -- At least the newest arrival stamp (microseconds, _core/ranking.py) of the name's
    -- waiting entries: a joining entry whose clock is past it needs no look at the line to
    -- be stamped above every entry in it (when not, acquire reads the line's newest).
    newest_stamp bigint NOT NULL DEFAULT 0,
    -- A semaphore group (version 10): at most per_key holders per key (lim is then the
    -- total), set with lim by the acquire that found the name idle; NULL: not a group.
    per_key     integer,
    -- Version 11. Whether the name has holders or waiters (false: idle), the flag every step
    -- keeps true under the row lock; not indexed, so changing it keeps updates HOT.
    busy        boolean NOT NULL DEFAULT true,
    -- A fast grant (version 12): the holder granted by acquire's fastest path on an idle
    -- name, kept here rather than in holders, with its times and key; its token is
    -- last_token. Moved into holders (_spill) by any other step that locks the row, so it
    -- exists only while the name has no other holder and nobody in line.
    h_holder    text COLLATE "C",
    h_acquired  timestamptz,
    h_expires   timestamptz,
    h_key       text COLLATE "C"
    -- Version 19: the file keeps at least ~25 pages (migrations/0019_names_pages.sql wrote and
    -- deleted padding rows, and VACUUM does not truncate it), so that the planner looks a key
    -- up through its index however few names the table holds.
) WITH (fillfactor = 70, vacuum_truncate = false);

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
    -- A callback grant: the callback it is (or was) delivered to; pending until a deliverer
    -- settles it; claimed_until: the end of a deliverer's claim on the delivery
    -- (-infinity: nobody's); attempts: the deliverers' takes.
    callback      text,
    pending       boolean NOT NULL DEFAULT false,
    claimed_until timestamptz NOT NULL DEFAULT '-infinity',
    attempts      integer NOT NULL DEFAULT 0,
    group_key     text COLLATE "C",  -- a semaphore group's: the key held (version 10)
    PRIMARY KEY (name_id, holder)
) WITH (fillfactor = 70);

-- Pending deliveries by the end of their claim: the deliverer's poll asks for those whose
-- claim is free (claimed_until <= now), an empty range of an empty index when none is.
CREATE INDEX holders_pending ON __SCHEMA__.holders (claimed_until) WHERE pending;

-- The line, in order of rank (see the top of this file), then seq (an identity sequence,
-- which never goes back: arrival order within a rank). joined_at is the arrival stamp.
CREATE TABLE __SCHEMA__.waiters (
    seq         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name_id     bigint NOT NULL,
    holder      text COLLATE "C" NOT NULL,
    ttl         double precision NOT NULL,
    wait_ttl    double precision NOT NULL,
    joined_at   timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    channel     text,  -- the waiting client's LISTEN channel ('' none; NULL: the schema's)
    wake        text,  -- its wake key there (wake_key(name, holder))
    callback    text,  -- a callback waiter: its callback (see the top of this file)
    rank        bigint NOT NULL,  -- stamp - lead, in microseconds (_core/ranking.py)
    group_key   text COLLATE "C",  -- a semaphore group's: the key waited for (version 10)
    UNIQUE (name_id, holder)
);

CREATE INDEX waiters_line ON __SCHEMA__.waiters (name_id, rank, seq);

-- Names with callback waiters. Keyed on name_id only (the predicate column, callback, is
-- never updated by the lock operations).
CREATE INDEX waiters_callbacks ON __SCHEMA__.waiters (name_id) WHERE callback IS NOT NULL;

-- A name's expired entries, which every lock step drops first: found without reading the
-- rest of the line (version 16). So a waiter keeping its place (an UPDATE of expires_at)
-- is not a HOT update.
CREATE INDEX waiters_expiry ON __SCHEMA__.waiters (name_id, expires_at);

CREATE TABLE __SCHEMA__.queues (
    id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key  bytea NOT NULL UNIQUE,          -- sha256 of the name (names may be up to 4 KiB)
    name text COLLATE "C" NOT NULL
);

-- Every message not yet acked; seq (an identity, never going back) is the arrival order.
-- state: 0 ready (due at available_at), 1 in flight (until deadline, with receipt), 2 dead.
-- kind: 0 JSON text, 1 raw bytes.
CREATE TABLE __SCHEMA__.queue_messages (
    seq          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue_id     bigint NOT NULL,
    id           text COLLATE "C" NOT NULL,
    key          text COLLATE "C",
    body         bytea NOT NULL,
    kind         smallint NOT NULL,
    enqueued_at  timestamptz NOT NULL,
    available_at timestamptz NOT NULL,
    attempts     integer NOT NULL,
    max_attempts integer NOT NULL,
    state        smallint NOT NULL,
    receipt      text COLLATE "C",
    deadline     timestamptz,
    error        text,
    died_at      timestamptz,
    UNIQUE (queue_id, id)
);

CREATE INDEX queue_messages_ready ON __SCHEMA__.queue_messages (queue_id, seq)
    WHERE state = 0;

CREATE INDEX queue_messages_dead ON __SCHEMA__.queue_messages (queue_id, seq)
    WHERE state = 2;

CREATE INDEX queue_messages_by_key ON __SCHEMA__.queue_messages (queue_id, key, seq)
    WHERE state < 2 AND key IS NOT NULL;

CREATE INDEX queue_messages_by_deadline ON __SCHEMA__.queue_messages (queue_id, deadline)
    WHERE state = 1;

CREATE INDEX queue_messages_by_due ON __SCHEMA__.queue_messages (queue_id, available_at)
    WHERE state = 0;

CREATE TABLE __SCHEMA__.queue_dedup (
    queue_id   bigint NOT NULL,
    dedup_id   text COLLATE "C" NOT NULL,
    id         text COLLATE "C" NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (queue_id, dedup_id)
);

CREATE INDEX queue_dedup_expiry ON __SCHEMA__.queue_dedup (queue_id, expires_at);

-- Blocked consumers, oldest first.
CREATE TABLE __SCHEMA__.queue_waiters (
    seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue_id   bigint NOT NULL,
    waiter     text COLLATE "C" NOT NULL,
    expires_at timestamptz NOT NULL,
    channel    text,  -- the consumer's client's LISTEN channel (NULL: the schema's)
    UNIQUE (queue_id, waiter)
);

-- Rate limits (version 8; rate_machine.py): one row per rate limit in use, its line and its
-- recent admissions. Times are epoch seconds (double precision) on the database clock.
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

-- The line, in order of rank, then seq (an identity, never goes back: arrival order within
-- a rank). joined_at is the arrival stamp in seconds (stamp / 1e6).
CREATE TABLE __SCHEMA__.rate_waiters (
    seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rate_id    bigint NOT NULL,
    holder     text COLLATE "C" NOT NULL,
    joined_at  double precision NOT NULL,
    expires_at double precision NOT NULL,
    rank       bigint NOT NULL,  -- stamp - lead, in microseconds (_core/ranking.py)
    UNIQUE (rate_id, holder)
) WITH (fillfactor = 70);
CREATE INDEX rate_waiters_line ON __SCHEMA__.rate_waiters (rate_id, rank, seq);

-- Admission times of the last `per` seconds, at most 10000 (rate_machine.MAX_RECENT) per
-- name: what rate_status shows. Older ones are deleted by the next admission.
CREATE TABLE __SCHEMA__.rate_admissions (
    rate_id bigint NOT NULL,
    at      double precision NOT NULL
);
CREATE INDEX rate_admissions_by_time ON __SCHEMA__.rate_admissions (rate_id, at);

-- == Locks ======================================================================================

-- The NOTIFY payload that wakes one waiter: 128 bits of sha256(name NUL holder), hex.
-- Names and holders never contain NUL, so the encoding is unambiguous; the client computes
-- the same key (turnstile.stores.postgres.sql.wake_key) to find the waiter to wake.
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

-- Lock the row of p_name, creating it (with limit p_limit) unless p_limit is NULL.
-- o_id is NULL when the row does not exist and was not to be created. p_now: see acquire.
-- o_per_key: the name's per_key (version 10).
CREATE FUNCTION __SCHEMA__._lock_name(
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

-- Move a fast grant (version 12: kept in the name's row by the client's acquire
-- statement, see queries.sql) into holders; the caller has locked the row.
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

-- lock_machine.promote, as in version 3, plus callback waiters: granted claimed for their
-- full ttl with a pending delivery (claimed_until -infinity: nobody's claim), never woken;
-- the front of the line is the least (rank, seq) (version 9). With p_per_key (version 10), a
-- semaphore group's promotion: every waiter in line order whose key has fewer than
-- p_per_key holders, while the total has room; waiters of full keys are skipped.
-- A grant keeps the key its waiting entry named, in a plain semaphore too, as the
-- state machine does (version 16; before, the plain loop dropped it).
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
        busy = NOT v_idle,
        idle_since = CASE WHEN v_idle THEN coalesce(n.idle_since, p_now) ELSE n.idle_since END
    WHERE n.id = p_id
      AND (n.last_token <> p_last OR n.lim <> p_limit OR n.busy = v_idle);
END
$$;

-- lock_machine.acquire (version 3: the wake-up carries the grant; see above), plus one limit per name: a newcomer naming another
-- limit than a busy name's is refused with SQLSTATE TSL01 (DETAIL: the name's limit), and
-- the name's limit (not the caller's) governs the grants of those already in line.
-- p_channel and p_wake say where to send this waiter's wake-up and the key naming it there
-- (required, so a call of the version-2 signature never matches this one); the output
-- wait_id is the seq of the caller's waiting entry, which a wake-up names. p_lead (version
-- 9): how far ahead of its arrival a new waiting entry ranks, in microseconds
-- (ranking.lead(priority, ageing)); its default, 0, serves a client of the previous
-- release, which calls with nine arguments (the nine-argument function is gone, so such a
-- call resolves here: there is no other candidate). p_key, p_per_key (version 10): a
-- semaphore group's key and per-key limit (p_limit is then the total); a name has one shape
-- (limit and per_key) while busy, and a newcomer naming another is refused with TSL01, whose
-- DETAIL is then the name's limit followed by its per_key if it has one. Their defaults
-- serve a client of the previous release (ten arguments; the ten-argument function is gone).
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
SET plan_cache_mode = force_generic_plan
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

-- The version-2 acquire (7 arguments), still called by a client of the previous release
-- running during an upgrade: the same state machine, so it is the function above with no
-- wake channel (NULL: such a waiter is woken on the schema's channel, as before).
CREATE FUNCTION __SCHEMA__.acquire(
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

-- lock_machine.release, as in version 1, in fewer statements (see the top of this file): the row
-- locked inline; expired leases and ours dropped in one statement, which also counts the
-- holders left for the promotion; expired waiting entries dropped in the same statement
-- (version 17, found through the waiters_expiry index of version 16, so without reading the
-- rest of the line), as lock_machine.release purges first; idle known from the promotion's
-- count.
CREATE FUNCTION __SCHEMA__.release(
    p_name text, p_holder text, p_token bigint, p_now timestamptz DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
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

-- lock_machine.renew: extend (holder, token) to now + ttl; renewed = false means it is gone.
CREATE FUNCTION __SCHEMA__.renew(
    p_name text, p_holder text, p_token bigint, p_ttl double precision,
    p_now timestamptz DEFAULT NULL,
    OUT renewed boolean, OUT acquired_at double precision, OUT expires_at double precision)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
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

-- lock_machine.set_limit: change a busy name's limit for the next grants; a raised limit
-- grants (and wakes) waiters from the front at once, a lowered one revokes nothing. Returns
-- the limit replaced, or NULL when the name is idle (nothing changed). A group's total is
-- its limit; its per_key stays.
CREATE FUNCTION __SCHEMA__.set_limit(
    p_name text, p_limit integer, p_now timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
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

-- lock_machine.acquire with a callback (always enqueue): the acquire above, with no wake
-- channel (''), then, in the same transaction and under the name's row lock that it took,
-- the callback recorded: on the caller's waiting entry, or, if it holds, on its grant,
-- whose delivery becomes pending unless it was already for this very callback (an ask
-- repeated is harmless; a new callback gets the current grant delivered there). p_lead:
-- see acquire (version 9; its default serves a client of the previous release); p_key,
-- p_per_key: a semaphore group's (version 10), passed on to acquire.
CREATE FUNCTION __SCHEMA__.acquire_callback(
    p_name text, p_holder text, p_limit integer, p_ttl double precision,
    p_wait_ttl double precision, p_now timestamptz, p_callback text, p_lead bigint DEFAULT 0,
    p_key text DEFAULT NULL, p_per_key integer DEFAULT NULL,
    OUT granted boolean, OUT token bigint, OUT acquired_at double precision,
    OUT expires_at double precision, OUT queue_position integer, OUT now double precision,
    OUT retry_after double precision)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
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

-- lock_machine.due and take_deliveries on one name whose row the caller has locked: drop
-- what expired (an undelivered grant with it), grant what that freed (callback waiters
-- with a pending delivery, others woken), claim up to p_max pending deliveries whose claim
-- is free for p_lease seconds, oldest grant first. Nothing at all unless the name has
-- callbacks (a callback waiter or a pending delivery) and something is due. p_per_key: the
-- name's (version 10), for the promotion. (lock_machine.due also counts a waiter that could
-- be granted with nothing expired: a refused acquire's purge in the model. Here a refused
-- acquire is rolled back whole and every other step promotes, so no such state is ever
-- committed.)
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

-- A deliverer's poll (lock_machine.take_deliveries over every name of the schema): the
-- names that may be due are found from the two partial indexes (names with callback
-- waiters, pending deliveries), so a poll with nothing due reads a few index entries and
-- writes nothing. Each candidate's row is locked as every operation locks it, skipping one
-- another transaction holds (a concurrent deliverer, a busy name: the next poll takes it),
-- and checked again under the lock: two deliverers never claim the same delivery. Names
-- where an expiry is due come first, then by their oldest claimable delivery. The row
-- locks are held to the end of this transaction (one statement, autocommit), so a poll
-- does a bounded amount: every name where an expiry is due, and up to p_max deliveries.
CREATE FUNCTION __SCHEMA__.take_deliveries(
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

-- lock_machine.settle_delivery: the pending delivery of grant p_token on p_name, settled
-- as delivered (done), refused (the grant released and the next in line granted, and woken,
-- in this transaction) or retry (its claim freed p_retry_in seconds from now). False,
-- changing nothing, when the grant is gone or was settled already.
CREATE FUNCTION __SCHEMA__.settle_delivery(
    p_name text, p_token bigint, p_outcome text, p_retry_in double precision,
    p_now timestamptz DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
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

-- The kind of a stored callback ("sfn", "http"; "unknown" for text that is not what
-- callbacks.encode makes), read off its start without parsing it: never its text.
CREATE FUNCTION __SCHEMA__._callback_kind(p_callback text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_callback IS NULL THEN NULL
                ELSE coalesce(substring(p_callback FROM '^\{"kind":"(sfn|http)",'), 'unknown')
           END
$$;

-- lock_machine.status, as in version 1, plus the callbacks' kinds (never their text, a
-- credential): holder_callbacks has one entry per entry of holders, in the same order,
-- NULL or [kind, pending]; waiter_callbacks likewise NULL or the kind. The line in order of
-- (rank, seq) (version 9). A semaphore group's per_key, and each holder's and waiter's key
-- (holder_keys, waiter_keys: one entry per entry of holders, waiters; NULL when plain)
-- (version 10).
CREATE FUNCTION __SCHEMA__.status(
    p_name text, p_now timestamptz DEFAULT NULL,
    OUT lim integer, OUT now double precision, OUT holders json, OUT waiters json,
    OUT holder_callbacks json, OUT waiter_callbacks json, OUT per_key integer,
    OUT holder_keys json, OUT waiter_keys json)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
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
        WHERE w.expires_at > coalesce(p_now, clock_timestamp())
        UNION
        SELECT i.id FROM __SCHEMA__.names i  -- fast grants (version 12)
        WHERE i.h_holder IS NOT NULL AND i.h_expires > coalesce(p_now, clock_timestamp()))
      AND starts_with(n.name, p_prefix)
    ORDER BY n.name
    LIMIT p_max
$$;

-- == Queues =====================================================================================

-- Version 11: claims run side by side (FOR UPDATE SKIP LOCKED over the ready messages; only
-- claims lock a ready message), puts and requeues take the queue's put lock (seq order is
-- commit order), capped claims its cap lock, and a claim about to register a waiter looks
-- again holding the waiter lock that every waking step takes shared, last (no missed
-- wake-up). The locks are transaction-scoped advisory locks (_queue_lock_key).

-- The NOTIFY payload that wakes one queue waiter: 128 bits of
-- sha256(NUL "queue" NUL name NUL waiter), hex (lock names never start with NUL, so it never
-- equals a lock's wake_key). turnstile.stores.postgres.sql.wake_key(..., queue=True) computes
-- the same.
CREATE FUNCTION __SCHEMA__.queue_wake_key(p_name text, p_waiter text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
    SELECT left(encode(sha256('\x00'::bytea || convert_to('queue', 'UTF8') || '\x00'::bytea
                              || convert_to(p_name, 'UTF8') || '\x00'::bytea
                              || convert_to(p_waiter, 'UTF8')), 'hex'), 32)
$$;

-- The id of queue p_name's row, making the row on first use. Not locked.
CREATE FUNCTION __SCHEMA__._queue_id(p_name text) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key bytea := sha256(convert_to(p_name, 'UTF8'));
    v_id bigint;
BEGIN
    SELECT q.id INTO v_id FROM __SCHEMA__.queues q WHERE q.key = v_key;
    IF v_id IS NULL THEN
        INSERT INTO __SCHEMA__.queues (key, name) VALUES (v_key, p_name)
        ON CONFLICT DO NOTHING
        RETURNING id INTO v_id;
        IF v_id IS NULL THEN  -- made meanwhile (ON CONFLICT waited for its commit)
            SELECT q.id INTO v_id FROM __SCHEMA__.queues q WHERE q.key = v_key;
        END IF;
    END IF;
    RETURN v_id;
END
$$;

-- The advisory lock p_kind of queue p_qid (transaction-scoped): 1 its puts, 2 its capped
-- claims, 3 its waiters. Seeded with the schema's channel, so schemas do not share them.
CREATE FUNCTION __SCHEMA__._queue_lock_key(p_qid bigint, p_kind integer) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
    SELECT hashtextextended(__CHANNEL__, p_qid * 4 + p_kind)
$$;

-- queue_machine.purge of the messages: in-flight messages past their deadline are ready
-- again (due at their deadline) or, after max_attempts, dead. Returns how many this step
-- took out of flight.
CREATE FUNCTION __SCHEMA__._queue_purge(p_qid bigint, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_count integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM __SCHEMA__.queue_messages m
                   WHERE m.queue_id = p_qid AND m.state = 1 AND m.deadline <= p_now) THEN
        RETURN 0;
    END IF;
    UPDATE __SCHEMA__.queue_messages m
    SET state = CASE WHEN m.attempts >= m.max_attempts THEN 2 ELSE 0 END,
        died_at = CASE WHEN m.attempts >= m.max_attempts THEN m.deadline ELSE m.died_at END,
        available_at = CASE WHEN m.attempts >= m.max_attempts THEN m.available_at
                            ELSE m.deadline END,
        receipt = NULL, error = 'visibility timeout passed before ack'
    WHERE m.seq IN (SELECT e.seq FROM __SCHEMA__.queue_messages e
                    WHERE e.queue_id = p_qid AND e.state = 1 AND e.deadline <= p_now
                    ORDER BY e.deadline
                    FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;

-- queue_machine.take_waiters: wake the p_count oldest live waiters but p_except, each on its
-- own channel where it named one. Holds the queue's waiter lock shared until the commit (see above).
CREATE FUNCTION __SCHEMA__._queue_wake(p_qid bigint, p_name text, p_count integer,
                                       p_now timestamptz, p_except text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    w record;
BEGIN
    IF p_count <= 0 THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(__SCHEMA__._queue_lock_key(p_qid, 3));
    FOR w IN
        DELETE FROM __SCHEMA__.queue_waiters d
        WHERE d.seq IN (SELECT f.seq FROM __SCHEMA__.queue_waiters f
                        WHERE f.queue_id = p_qid AND f.expires_at > p_now
                          AND f.waiter IS DISTINCT FROM p_except
                        ORDER BY f.seq
                        LIMIT p_count
                        FOR UPDATE SKIP LOCKED)
        RETURNING d.waiter, d.channel
    LOOP
        PERFORM pg_notify(coalesce(nullif(w.channel, ''), __CHANNEL__),
                          __SCHEMA__.queue_wake_key(p_name, w.waiter));
    END LOOP;
END
$$;

CREATE FUNCTION __SCHEMA__.queue_put(
    p_name text, p_id text, p_key text, p_body bytea, p_kind smallint,
    p_delay double precision, p_dedup_id text, p_max_attempts integer,
    p_dedup_window double precision, p_now timestamptz DEFAULT NULL,
    OUT o_id text, OUT o_created boolean, OUT o_now double precision)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_qid bigint := __SCHEMA__._queue_id(p_name);
    v_now timestamptz;
    v_freed integer;
BEGIN
    PERFORM pg_advisory_xact_lock(__SCHEMA__._queue_lock_key(v_qid, 1));
    v_now := coalesce(p_now, clock_timestamp());
    v_freed := __SCHEMA__._queue_purge(v_qid, v_now);
    o_now := extract(epoch FROM v_now);
    o_created := false;
    DELETE FROM __SCHEMA__.queue_dedup d WHERE d.queue_id = v_qid AND d.expires_at <= v_now;
    IF p_dedup_id IS NOT NULL THEN
        SELECT d.id INTO o_id FROM __SCHEMA__.queue_dedup d
        WHERE d.queue_id = v_qid AND d.dedup_id = p_dedup_id;
        IF FOUND THEN
            PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed, v_now, NULL);
            RETURN;
        END IF;
    END IF;
    o_id := p_id;
    INSERT INTO __SCHEMA__.queue_messages (queue_id, id, key, body, kind, enqueued_at,
        available_at, attempts, max_attempts, state)
    VALUES (v_qid, p_id, p_key, p_body, p_kind, v_now,
            v_now + p_delay * interval '1 second', 0, p_max_attempts, 0)
    ON CONFLICT (queue_id, id) DO NOTHING;
    IF NOT FOUND THEN  -- a client retrying the very same put
        PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed, v_now, NULL);
        RETURN;
    END IF;
    IF p_dedup_id IS NOT NULL THEN
        INSERT INTO __SCHEMA__.queue_dedup (queue_id, dedup_id, id, expires_at)
        VALUES (v_qid, p_dedup_id, p_id, v_now + p_dedup_window * interval '1 second');
    END IF;
    o_created := true;
    PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed + 1, v_now, NULL);
END
$$;

-- queue_machine.claim on queue p_qid at p_now (the caller's clock), without its wake-ups:
-- hand out the ready, due message with the smallest seq that heads its key (no earlier
-- pending message of the key), unless p_concurrency are in flight; else register p_waiter
-- (if given; woken on p_channel, NULL: the schema's channel) and say when to look again.
-- o_wake: how many waiters the step wakes (the caller wakes them, see queue_claim).
-- p_purged: the caller purged the time-outs at p_now already.
CREATE FUNCTION __SCHEMA__._queue_claim(
    p_qid bigint, p_receipt text, p_visibility double precision, p_concurrency integer,
    p_max_attempts integer, p_waiter text, p_now timestamptz, p_channel text,
    p_purged boolean DEFAULT false,
    OUT o_found boolean, OUT o_id text, OUT o_key text, OUT o_body bytea, OUT o_kind smallint,
    OUT o_attempt integer, OUT o_enqueued_at double precision, OUT o_deadline double precision,
    OUT o_retry_after double precision, OUT o_wake integer)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_freed integer := 0;
    v_deadline timestamptz := p_now + p_visibility * interval '1 second';
    v_next timestamptz;
BEGIN
    o_found := false;
    IF NOT p_purged AND EXISTS (
            SELECT 1 FROM __SCHEMA__.queue_messages m
            WHERE m.queue_id = p_qid AND m.state = 1 AND m.deadline <= p_now) THEN
        v_freed := __SCHEMA__._queue_purge(p_qid, p_now);
    END IF;
    IF p_concurrency IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(__SCHEMA__._queue_lock_key(p_qid, 2));
    END IF;
    FOR v_look IN 1..2 LOOP
        IF p_concurrency IS NULL OR (SELECT count(*) FROM __SCHEMA__.queue_messages m
                                     WHERE m.queue_id = p_qid AND m.state = 1) < p_concurrency
        THEN
            UPDATE __SCHEMA__.queue_messages m
            SET state = 1, attempts = m.attempts + 1, max_attempts = p_max_attempts,
                receipt = p_receipt, deadline = v_deadline
            WHERE m.seq = (
                SELECT r.seq FROM __SCHEMA__.queue_messages r
                WHERE r.queue_id = p_qid AND r.state = 0 AND r.available_at <= p_now
                  AND (r.key IS NULL OR NOT EXISTS (
                      SELECT 1 FROM __SCHEMA__.queue_messages o
                      WHERE o.queue_id = p_qid AND o.key = r.key AND o.state < 2
                        AND o.seq < r.seq))
                ORDER BY r.seq
                LIMIT 1
                FOR UPDATE OF r SKIP LOCKED)
            RETURNING true, m.id, m.key, m.body, m.kind, m.attempts,
                      extract(epoch FROM m.enqueued_at)
            INTO o_found, o_id, o_key, o_body, o_kind, o_attempt, o_enqueued_at;
            o_found := FOUND;
        END IF;
        EXIT WHEN o_found OR p_waiter IS NULL OR v_look = 2;
        -- Nothing for a consumer that will wait: look again holding the waiter lock.
        PERFORM pg_advisory_xact_lock(__SCHEMA__._queue_lock_key(p_qid, 3));
    END LOOP;
    IF NOT o_found THEN
        IF p_waiter IS NOT NULL THEN
            -- A lapsed registration is forgotten: this one joins at the end.
            DELETE FROM __SCHEMA__.queue_waiters w
            WHERE w.queue_id = p_qid AND w.expires_at <= p_now;
            INSERT INTO __SCHEMA__.queue_waiters (queue_id, waiter, expires_at, channel)
            VALUES (p_qid, p_waiter, p_now + interval '6 seconds', p_channel)  -- queue_model.WAITER_TTL
            ON CONFLICT (queue_id, waiter) DO UPDATE
            SET expires_at = excluded.expires_at,
                channel = coalesce(excluded.channel, __SCHEMA__.queue_waiters.channel);
        END IF;
        SELECT least(
            (SELECT min(m.available_at) FROM __SCHEMA__.queue_messages m
             WHERE m.queue_id = p_qid AND m.state = 0 AND m.available_at > p_now),
            (SELECT min(m.deadline) FROM __SCHEMA__.queue_messages m
             WHERE m.queue_id = p_qid AND m.state = 1)) INTO v_next;
        IF v_next IS NOT NULL THEN
            o_retry_after := greatest(0, extract(epoch FROM v_next) - extract(epoch FROM p_now));
        END IF;
        o_wake := v_freed;
        RETURN;
    END IF;
    IF p_waiter IS NOT NULL THEN
        DELETE FROM __SCHEMA__.queue_waiters w WHERE w.queue_id = p_qid AND w.waiter = p_waiter;
    END IF;
    o_deadline := extract(epoch FROM v_deadline);
    o_wake := v_freed - 1;
END
$$;

CREATE FUNCTION __SCHEMA__.queue_claim(
    p_name text, p_receipt text, p_visibility double precision, p_concurrency integer,
    p_max_attempts integer, p_waiter text, p_now timestamptz, p_channel text,
    OUT o_found boolean, OUT o_id text, OUT o_key text, OUT o_body bytea, OUT o_kind smallint,
    OUT o_attempt integer, OUT o_enqueued_at double precision, OUT o_deadline double precision,
    OUT o_now double precision, OUT o_retry_after double precision)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_qid bigint;
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_deadline timestamptz := v_now + p_visibility * interval '1 second';
    v_expired boolean;
    v_wake integer := 0;
    v_claim_wake integer;
BEGIN
    -- The queue's id and whether a message in flight is past its deadline, in one look.
    SELECT q.id, EXISTS (SELECT 1 FROM __SCHEMA__.queue_messages m
                         WHERE m.queue_id = q.id AND m.state = 1 AND m.deadline <= v_now)
    INTO v_qid, v_expired
    FROM __SCHEMA__.queues q WHERE q.key = sha256(convert_to(p_name, 'UTF8'));
    IF v_qid IS NULL THEN
        v_qid := __SCHEMA__._queue_id(p_name);  -- a new queue: nothing in flight
    ELSIF v_expired THEN
        v_wake := __SCHEMA__._queue_purge(v_qid, v_now);
    END IF;
    o_now := extract(epoch FROM v_now);
    -- _queue_claim's common case inline: no cap, and a message to hand out.
    o_found := false;
    IF p_concurrency IS NULL THEN
        UPDATE __SCHEMA__.queue_messages m
        SET state = 1, attempts = m.attempts + 1, max_attempts = p_max_attempts,
            receipt = p_receipt, deadline = v_deadline
        WHERE m.seq = (
            SELECT r.seq FROM __SCHEMA__.queue_messages r
            WHERE r.queue_id = v_qid AND r.state = 0 AND r.available_at <= v_now
              AND (r.key IS NULL OR NOT EXISTS (
                  SELECT 1 FROM __SCHEMA__.queue_messages o
                  WHERE o.queue_id = v_qid AND o.key = r.key AND o.state < 2
                    AND o.seq < r.seq))
            ORDER BY r.seq
            LIMIT 1
            FOR UPDATE OF r SKIP LOCKED)
        RETURNING true, m.id, m.key, m.body, m.kind, m.attempts,
                  extract(epoch FROM m.enqueued_at)
        INTO o_found, o_id, o_key, o_body, o_kind, o_attempt, o_enqueued_at;
        o_found := FOUND;
    END IF;
    IF o_found THEN
        IF p_waiter IS NOT NULL THEN
            DELETE FROM __SCHEMA__.queue_waiters w
            WHERE w.queue_id = v_qid AND w.waiter = p_waiter;
        END IF;
        o_deadline := extract(epoch FROM v_deadline);
        v_claim_wake := -1;
    ELSE
        SELECT c.o_found, c.o_id, c.o_key, c.o_body, c.o_kind, c.o_attempt, c.o_enqueued_at,
               c.o_deadline, c.o_retry_after, c.o_wake
        INTO o_found, o_id, o_key, o_body, o_kind, o_attempt, o_enqueued_at, o_deadline,
             o_retry_after, v_claim_wake
        FROM __SCHEMA__._queue_claim(v_qid, p_receipt, p_visibility, p_concurrency,
                                     p_max_attempts, p_waiter, v_now, p_channel, true) c;
    END IF;
    v_wake := v_wake + v_claim_wake;  -- a delivery takes one of the freed messages
    IF v_wake > 0 THEN
        PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_wake, v_now, NULL);
    END IF;
END
$$;

-- queue_machine.ack of (p_id, p_ack_receipt), then queue_machine.claim, at one time in one
-- transaction (the worker loop: settle a message and take the next in one round trip).
-- p_waiter must be new (not registered before this call): then the waiters this wakes are
-- exactly those the ack then the claim would wake (never p_waiter itself: the ack came
-- before its registration).
CREATE FUNCTION __SCHEMA__.queue_ack_claim(
    p_name text, p_id text, p_ack_receipt text, p_receipt text,
    p_visibility double precision, p_concurrency integer, p_max_attempts integer,
    p_waiter text, p_now timestamptz, p_channel text,
    OUT o_acked boolean,
    OUT o_found boolean, OUT o_id text, OUT o_key text, OUT o_body bytea, OUT o_kind smallint,
    OUT o_attempt integer, OUT o_enqueued_at double precision, OUT o_deadline double precision,
    OUT o_now double precision, OUT o_retry_after double precision)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_qid bigint;
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_deadline timestamptz := v_now + p_visibility * interval '1 second';
    v_expired boolean;
    v_wake integer := 0;
    v_claim_wake integer;
BEGIN
    -- The queue's id and whether a message in flight is past its deadline, in one look.
    SELECT q.id, EXISTS (SELECT 1 FROM __SCHEMA__.queue_messages m
                         WHERE m.queue_id = q.id AND m.state = 1 AND m.deadline <= v_now)
    INTO v_qid, v_expired
    FROM __SCHEMA__.queues q WHERE q.key = sha256(convert_to(p_name, 'UTF8'));
    IF v_qid IS NULL THEN
        v_qid := __SCHEMA__._queue_id(p_name);  -- a new queue: nothing in flight
    ELSIF v_expired THEN
        v_wake := __SCHEMA__._queue_purge(v_qid, v_now);
    END IF;
    o_now := extract(epoch FROM v_now);
    -- The message by its id alone (the unique index), then checked: a condition the
    -- deadline index could also serve would let the plan walk every message in flight.
    DELETE FROM __SCHEMA__.queue_messages m
    WHERE m.seq = (SELECT s.seq FROM __SCHEMA__.queue_messages s
                   WHERE s.queue_id = v_qid AND s.id = p_id)
      AND m.state = 1 AND m.receipt = p_ack_receipt AND m.deadline > v_now;
    o_acked := FOUND;
    IF o_acked THEN
        v_wake := v_wake + 1;
    END IF;
    -- _queue_claim's common case inline: no cap, and a message to hand out.
    o_found := false;
    IF p_concurrency IS NULL THEN
        UPDATE __SCHEMA__.queue_messages m
        SET state = 1, attempts = m.attempts + 1, max_attempts = p_max_attempts,
            receipt = p_receipt, deadline = v_deadline
        WHERE m.seq = (
            SELECT r.seq FROM __SCHEMA__.queue_messages r
            WHERE r.queue_id = v_qid AND r.state = 0 AND r.available_at <= v_now
              AND (r.key IS NULL OR NOT EXISTS (
                  SELECT 1 FROM __SCHEMA__.queue_messages o
                  WHERE o.queue_id = v_qid AND o.key = r.key AND o.state < 2
                    AND o.seq < r.seq))
            ORDER BY r.seq
            LIMIT 1
            FOR UPDATE OF r SKIP LOCKED)
        RETURNING true, m.id, m.key, m.body, m.kind, m.attempts,
                  extract(epoch FROM m.enqueued_at)
        INTO o_found, o_id, o_key, o_body, o_kind, o_attempt, o_enqueued_at;
        o_found := FOUND;
    END IF;
    IF o_found THEN
        IF p_waiter IS NOT NULL THEN
            DELETE FROM __SCHEMA__.queue_waiters w
            WHERE w.queue_id = v_qid AND w.waiter = p_waiter;
        END IF;
        o_deadline := extract(epoch FROM v_deadline);
        v_claim_wake := -1;
    ELSE
        SELECT c.o_found, c.o_id, c.o_key, c.o_body, c.o_kind, c.o_attempt, c.o_enqueued_at,
               c.o_deadline, c.o_retry_after, c.o_wake
        INTO o_found, o_id, o_key, o_body, o_kind, o_attempt, o_enqueued_at, o_deadline,
             o_retry_after, v_claim_wake
        FROM __SCHEMA__._queue_claim(v_qid, p_receipt, p_visibility, p_concurrency,
                                     p_max_attempts, p_waiter, v_now, p_channel, true) c;
    END IF;
    v_wake := v_wake + greatest(v_claim_wake, 0);
    IF v_wake > 0 THEN
        -- _queue_wake's lock, then a look whether anyone waits at all (mostly nobody does
        -- while consumers keep up: the call is spared).
        PERFORM pg_advisory_xact_lock_shared(__SCHEMA__._queue_lock_key(v_qid, 3));
        IF EXISTS (SELECT 1 FROM __SCHEMA__.queue_waiters w WHERE w.queue_id = v_qid) THEN
            PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_wake, v_now, p_waiter);
        END IF;
    END IF;
END
$$;

-- queue_machine.ack of each (p_ids[i], p_ack_receipts[i]), then up to
-- cardinality(p_receipts) claims, at one time in one transaction: the worker loop's step
-- between two batches (Queue.work with prefetch). The claims are the ones queue_claim would
-- make one after another, taken in one statement: the oldest ready, due messages that head
-- their keys (so of distinct keys), no more than p_concurrency leaves room for, the i-th
-- oldest with p_receipts[i]. p_waiter (new, as for queue_ack_claim) is registered only if
-- the step claims nothing. o_acked[i] answers the i-th ack; o_ids .. o_enqueued_at are the
-- claimed messages, oldest first (empty: nothing claimed, and o_retry_after says when to
-- look again); o_deadline is theirs.
CREATE FUNCTION __SCHEMA__.queue_ack_claim_many(
    p_name text, p_ids text[], p_ack_receipts text[], p_receipts text[],
    p_visibility double precision, p_concurrency integer, p_max_attempts integer,
    p_waiter text, p_now timestamptz, p_channel text,
    OUT o_acked boolean[],
    OUT o_ids text[], OUT o_keys text[], OUT o_bodies bytea[], OUT o_kinds smallint[],
    OUT o_attempts integer[], OUT o_enqueued_at double precision[],
    OUT o_deadline double precision, OUT o_now double precision,
    OUT o_retry_after double precision)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_qid bigint;
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_deadline timestamptz := v_now + p_visibility * interval '1 second';
    v_expired boolean;
    v_wake integer := 0;
    v_room integer := coalesce(cardinality(p_receipts), 0);
    v_acked boolean;
    c record;
BEGIN
    IF v_room = 0 THEN
        RAISE EXCEPTION 'queue_ack_claim_many needs at least one receipt'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT q.id, EXISTS (SELECT 1 FROM __SCHEMA__.queue_messages m
                         WHERE m.queue_id = q.id AND m.state = 1 AND m.deadline <= v_now)
    INTO v_qid, v_expired
    FROM __SCHEMA__.queues q WHERE q.key = sha256(convert_to(p_name, 'UTF8'));
    IF v_qid IS NULL THEN
        v_qid := __SCHEMA__._queue_id(p_name);  -- a new queue: nothing in flight
    ELSIF v_expired THEN
        v_wake := __SCHEMA__._queue_purge(v_qid, v_now);
    END IF;
    o_now := extract(epoch FROM v_now);
    o_acked := '{}';
    IF coalesce(cardinality(p_ids), 0) > 0 THEN
        -- One statement per ack, each finding its message by id alone (the unique index)
        -- and checking the rest on that row, as queue_ack does: one statement for them all
        -- would join the ids to the messages, and the plan may then walk the deadline index
        -- past every message in flight (see version 14).
        FOR i IN 1..cardinality(p_ids) LOOP
            DELETE FROM __SCHEMA__.queue_messages m
            WHERE m.seq = (SELECT s.seq FROM __SCHEMA__.queue_messages s
                           WHERE s.queue_id = v_qid AND s.id = p_ids[i])
              AND m.state = 1 AND m.receipt = p_ack_receipts[i] AND m.deadline > v_now;
            v_acked := FOUND;
            o_acked := o_acked || v_acked;
            IF v_acked THEN
                v_wake := v_wake + 1;
            END IF;
        END LOOP;
    END IF;
    IF p_concurrency IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(__SCHEMA__._queue_lock_key(v_qid, 2));
        v_room := least(v_room, p_concurrency - (SELECT count(*) FROM __SCHEMA__.queue_messages m
                                                 WHERE m.queue_id = v_qid AND m.state = 1));
    END IF;
    IF v_room > 0 THEN
        WITH picked AS (
            SELECT r.seq FROM __SCHEMA__.queue_messages r
            WHERE r.queue_id = v_qid AND r.state = 0 AND r.available_at <= v_now
              AND (r.key IS NULL OR NOT EXISTS (
                  SELECT 1 FROM __SCHEMA__.queue_messages o
                  WHERE o.queue_id = v_qid AND o.key = r.key AND o.state < 2
                    AND o.seq < r.seq))
            ORDER BY r.seq
            LIMIT v_room
            FOR UPDATE OF r SKIP LOCKED),
        ranked AS (
            SELECT p.seq, row_number() OVER (ORDER BY p.seq) AS n FROM picked p),
        claimed AS (
            UPDATE __SCHEMA__.queue_messages m
            SET state = 1, attempts = m.attempts + 1, max_attempts = p_max_attempts,
                receipt = p_receipts[k.n], deadline = v_deadline
            FROM ranked k
            WHERE m.seq = k.seq
            RETURNING k.n, m.id, m.key, m.body, m.kind, m.attempts,
                      extract(epoch FROM m.enqueued_at) AS enqueued_at)
        SELECT array_agg(d.id ORDER BY d.n), array_agg(d.key ORDER BY d.n),
               array_agg(d.body ORDER BY d.n), array_agg(d.kind ORDER BY d.n),
               array_agg(d.attempts ORDER BY d.n), array_agg(d.enqueued_at ORDER BY d.n)
        INTO o_ids, o_keys, o_bodies, o_kinds, o_attempts, o_enqueued_at
        FROM claimed d;
    END IF;
    IF o_ids IS NULL THEN
        -- Nothing claimed: the general step, to register p_waiter (and say when to look
        -- again) holding the waiter lock, which may still find one.
        SELECT * INTO c
        FROM __SCHEMA__._queue_claim(v_qid, p_receipts[1], p_visibility, p_concurrency,
                                     p_max_attempts, p_waiter, v_now, p_channel, true);
        IF c.o_found THEN
            o_ids := ARRAY[c.o_id];
            o_keys := ARRAY[c.o_key];
            o_bodies := ARRAY[c.o_body];
            o_kinds := ARRAY[c.o_kind];
            o_attempts := ARRAY[c.o_attempt];
            o_enqueued_at := ARRAY[c.o_enqueued_at];
        ELSE
            o_ids := '{}';
            o_keys := '{}';
            o_bodies := '{}';
            o_kinds := '{}';
            o_attempts := '{}';
            o_enqueued_at := '{}';
            o_retry_after := c.o_retry_after;
        END IF;
    ELSIF p_waiter IS NOT NULL THEN
        DELETE FROM __SCHEMA__.queue_waiters w WHERE w.queue_id = v_qid AND w.waiter = p_waiter;
    END IF;
    IF cardinality(o_ids) > 0 THEN
        o_deadline := extract(epoch FROM v_deadline);
        -- Without an ack, the time-outs purged are the first claim's, which takes one of
        -- them, as queue_claim counts (with one, the first ack's, as queue_ack_claim does).
        IF coalesce(cardinality(p_ids), 0) = 0 THEN
            v_wake := v_wake - 1;
        END IF;
    END IF;
    IF v_wake > 0 THEN
        -- As queue_ack_claim: _queue_wake's lock, then a look whether anyone waits at all.
        PERFORM pg_advisory_xact_lock_shared(__SCHEMA__._queue_lock_key(v_qid, 3));
        IF EXISTS (SELECT 1 FROM __SCHEMA__.queue_waiters w WHERE w.queue_id = v_qid) THEN
            PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_wake, v_now, p_waiter);
        END IF;
    END IF;
END
$$;

-- The version-2 signature (no channel: woken on the schema's channel), kept for clients of
-- an older release during an upgrade.
CREATE FUNCTION __SCHEMA__.queue_claim(
    p_name text, p_receipt text, p_visibility double precision, p_concurrency integer,
    p_max_attempts integer, p_waiter text, p_now timestamptz DEFAULT NULL,
    OUT o_found boolean, OUT o_id text, OUT o_key text, OUT o_body bytea, OUT o_kind smallint,
    OUT o_attempt integer, OUT o_enqueued_at double precision, OUT o_deadline double precision,
    OUT o_now double precision, OUT o_retry_after double precision)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    SELECT c.o_found, c.o_id, c.o_key, c.o_body, c.o_kind, c.o_attempt, c.o_enqueued_at,
           c.o_deadline, c.o_now, c.o_retry_after
    INTO o_found, o_id, o_key, o_body, o_kind, o_attempt, o_enqueued_at, o_deadline, o_now,
         o_retry_after
    FROM __SCHEMA__.queue_claim(p_name, p_receipt, p_visibility, p_concurrency,
                                p_max_attempts, p_waiter, p_now, NULL::text) c;
END
$$;

-- ack, nack and extend find the message by its id (the unique index), then act only if it
-- is in flight with this receipt and its deadline has not passed.
CREATE FUNCTION __SCHEMA__.queue_ack(
    p_name text, p_id text, p_receipt text, p_now timestamptz DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_qid bigint;
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_expired boolean;
    v_wake integer := 0;
    v_acked boolean;
BEGIN
    -- The queue's id and whether a message in flight is past its deadline, in one look.
    SELECT q.id, EXISTS (SELECT 1 FROM __SCHEMA__.queue_messages m
                         WHERE m.queue_id = q.id AND m.state = 1 AND m.deadline <= v_now)
    INTO v_qid, v_expired
    FROM __SCHEMA__.queues q WHERE q.key = sha256(convert_to(p_name, 'UTF8'));
    IF v_qid IS NULL THEN
        v_qid := __SCHEMA__._queue_id(p_name);  -- a new queue: nothing in flight
    ELSIF v_expired THEN
        v_wake := __SCHEMA__._queue_purge(v_qid, v_now);
    END IF;
    -- The message by its id alone (the unique index), then checked: a condition the
    -- deadline index could also serve would let the plan walk every message in flight.
    DELETE FROM __SCHEMA__.queue_messages m
    WHERE m.seq = (SELECT s.seq FROM __SCHEMA__.queue_messages s
                   WHERE s.queue_id = v_qid AND s.id = p_id)
      AND m.state = 1 AND m.receipt = p_receipt AND m.deadline > v_now;
    v_acked := FOUND;
    IF v_acked THEN
        v_wake := v_wake + 1;
    END IF;
    IF v_wake > 0 THEN
        -- _queue_wake's lock, then a look whether anyone waits at all (mostly nobody does
        -- while consumers keep up: the call is spared).
        PERFORM pg_advisory_xact_lock_shared(__SCHEMA__._queue_lock_key(v_qid, 3));
        IF EXISTS (SELECT 1 FROM __SCHEMA__.queue_waiters w WHERE w.queue_id = v_qid) THEN
            PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_wake, v_now, NULL);
        END IF;
    END IF;
    RETURN v_acked;
END
$$;

CREATE FUNCTION __SCHEMA__.queue_nack(
    p_name text, p_id text, p_receipt text, p_delay double precision, p_error text,
    p_now timestamptz DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_qid bigint := __SCHEMA__._queue_id(p_name);
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_freed integer := __SCHEMA__._queue_purge(v_qid, v_now);
BEGIN
    UPDATE __SCHEMA__.queue_messages m
    SET receipt = NULL, error = coalesce(p_error, 'nacked'),
        state = CASE WHEN m.attempts >= m.max_attempts THEN 2 ELSE 0 END,
        died_at = CASE WHEN m.attempts >= m.max_attempts THEN v_now ELSE m.died_at END,
        available_at = CASE WHEN m.attempts >= m.max_attempts THEN m.available_at
                            ELSE v_now + p_delay * interval '1 second' END
    WHERE m.seq = (SELECT s.seq FROM __SCHEMA__.queue_messages s
                   WHERE s.queue_id = v_qid AND s.id = p_id)
      AND m.state = 1 AND m.receipt = p_receipt AND m.deadline > v_now;
    IF FOUND THEN
        PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed + 1, v_now, NULL);
        RETURN true;
    END IF;
    PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed, v_now, NULL);
    RETURN false;
END
$$;

CREATE FUNCTION __SCHEMA__.queue_extend(
    p_name text, p_id text, p_receipt text, p_seconds double precision,
    p_now timestamptz DEFAULT NULL)
RETURNS double precision
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_qid bigint := __SCHEMA__._queue_id(p_name);
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_freed integer := __SCHEMA__._queue_purge(v_qid, v_now);
    v_deadline timestamptz := v_now + p_seconds * interval '1 second';
    v_count integer;
BEGIN
    UPDATE __SCHEMA__.queue_messages m SET deadline = v_deadline
    WHERE m.seq = (SELECT s.seq FROM __SCHEMA__.queue_messages s
                   WHERE s.queue_id = v_qid AND s.id = p_id)
      AND m.state = 1 AND m.receipt = p_receipt AND m.deadline > v_now;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed, v_now, NULL);
    IF v_count > 0 THEN
        RETURN extract(epoch FROM v_deadline);
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION __SCHEMA__.queue_stats(
    p_name text, p_top integer, p_now timestamptz DEFAULT NULL,
    OUT o_ready bigint, OUT o_delayed bigint, OUT o_in_flight bigint, OUT o_dead bigint,
    OUT o_oldest double precision, OUT o_now double precision, OUT o_keys text[],
    OUT o_counts bigint[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_qid bigint := __SCHEMA__._queue_id(p_name);
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_freed integer := __SCHEMA__._queue_purge(v_qid, v_now);
BEGIN
    o_now := extract(epoch FROM v_now);
    SELECT count(*) FILTER (WHERE m.state = 0 AND m.available_at <= v_now),
           count(*) FILTER (WHERE m.state = 0 AND m.available_at > v_now),
           count(*) FILTER (WHERE m.state = 1),
           count(*) FILTER (WHERE m.state = 2),
           extract(epoch FROM min(m.enqueued_at) FILTER (WHERE m.state < 2))
    INTO o_ready, o_delayed, o_in_flight, o_dead, o_oldest
    FROM __SCHEMA__.queue_messages m WHERE m.queue_id = v_qid;
    SELECT coalesce(array_agg(d.key ORDER BY d.n DESC, d.key), '{}'),
           coalesce(array_agg(d.n ORDER BY d.n DESC, d.key), '{}')
    INTO o_keys, o_counts
    FROM (SELECT m.key, count(*) AS n FROM __SCHEMA__.queue_messages m
          WHERE m.queue_id = v_qid AND m.state < 2 AND m.key IS NOT NULL
          GROUP BY m.key ORDER BY n DESC, m.key LIMIT p_top) d;
    PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed, v_now, NULL);
END
$$;

CREATE FUNCTION __SCHEMA__.queue_dead(
    p_name text, p_limit integer, p_now timestamptz DEFAULT NULL)
RETURNS TABLE (o_id text, o_key text, o_body bytea, o_kind smallint, o_attempts integer,
               o_enqueued_at double precision, o_died_at double precision, o_error text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_qid bigint := __SCHEMA__._queue_id(p_name);
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_freed integer := __SCHEMA__._queue_purge(v_qid, v_now);
BEGIN
    PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed, v_now, NULL);
    RETURN QUERY
    SELECT m.id, m.key, m.body, m.kind, m.attempts, extract(epoch FROM m.enqueued_at)::float8,
           extract(epoch FROM m.died_at)::float8, m.error
    FROM __SCHEMA__.queue_messages m
    WHERE m.queue_id = v_qid AND m.state = 2
    ORDER BY m.seq LIMIT p_limit;
END
$$;

-- queue_machine.requeue: dead letters (p_ids, or all when NULL) back at the end of the queue
-- (a new seq: under the put lock), due now, attempts reset, enqueued_at kept.
CREATE FUNCTION __SCHEMA__.queue_requeue(
    p_name text, p_ids text[], p_now timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_qid bigint := __SCHEMA__._queue_id(p_name);
    v_now timestamptz;
    v_freed integer;
    v_count integer;
BEGIN
    PERFORM pg_advisory_xact_lock(__SCHEMA__._queue_lock_key(v_qid, 1));
    v_now := coalesce(p_now, clock_timestamp());
    v_freed := __SCHEMA__._queue_purge(v_qid, v_now);
    WITH gone AS (
        DELETE FROM __SCHEMA__.queue_messages m
        WHERE m.queue_id = v_qid AND m.state = 2 AND (p_ids IS NULL OR m.id = ANY (p_ids))
        RETURNING m.seq, m.id, m.key, m.body, m.kind, m.enqueued_at, m.max_attempts)
    INSERT INTO __SCHEMA__.queue_messages (queue_id, id, key, body, kind, enqueued_at,
        available_at, attempts, max_attempts, state)
    SELECT v_qid, g.id, g.key, g.body, g.kind, g.enqueued_at, v_now, 0, g.max_attempts, 0
    FROM gone g ORDER BY g.seq;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed + v_count, v_now, NULL);
    RETURN v_count;
END
$$;

CREATE FUNCTION __SCHEMA__.queue_purge_dead(
    p_name text, p_ids text[], p_now timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_qid bigint := __SCHEMA__._queue_id(p_name);
    v_now timestamptz;
    v_freed integer;
    v_count integer;
BEGIN
    -- The put lock too: a requeue and a purge of the same dead letters never wait for each
    -- other's rows in opposite orders.
    PERFORM pg_advisory_xact_lock(__SCHEMA__._queue_lock_key(v_qid, 1));
    v_now := coalesce(p_now, clock_timestamp());
    v_freed := __SCHEMA__._queue_purge(v_qid, v_now);
    DELETE FROM __SCHEMA__.queue_messages m
    WHERE m.queue_id = v_qid AND m.state = 2 AND (p_ids IS NULL OR m.id = ANY (p_ids));
    GET DIAGNOSTICS v_count = ROW_COUNT;
    PERFORM __SCHEMA__._queue_wake(v_qid, p_name, v_freed, v_now, NULL);
    RETURN v_count;
END
$$;

CREATE FUNCTION __SCHEMA__.queue_unregister(p_name text, p_waiter text) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM __SCHEMA__.queue_waiters w
    WHERE w.queue_id = (SELECT q.id FROM __SCHEMA__.queues q
                        WHERE q.key = sha256(convert_to(p_name, 'UTF8')))
      AND w.waiter = p_waiter;
END
$$;

-- == Rate limits ===============================================================================

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
-- Version 9: the line is kept in order of (rank, seq). p_lead: how far ahead of its
-- arrival a new waiting entry ranks, in microseconds (ranking.lead(priority, ageing)); a
-- newcomer that would stand first in line and whose slot has come is admitted at once. Its
-- default, 0, serves a client of the previous release, which calls with eight arguments
-- (the eight-argument function is gone, so such a call resolves here).
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
-- in order, and next_slot (now while idle). The line in order of (rank, seq) (version 9).
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
