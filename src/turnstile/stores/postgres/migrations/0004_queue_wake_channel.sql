-- Turnstile PostgreSQL schema, version 4: a blocked queue consumer is woken on its own
-- client's channel, as lock waiters are since version 3.
--
-- Before: every queue wake-up was a NOTIFY on the schema's channel, which every client's
-- LISTEN connection received; each looked at the payload and all but one ignored it, so
-- the work of one wake-up grew with the number of listening clients.
--
-- Now a consumer that registers as a waiter (queue_claim with a waiter) also names the
-- channel its client LISTENs on (one random channel per client, see
-- turnstile/_async/backends/postgres.py), and _queue_wake notifies that channel only. The
-- payload is unchanged: queue_wake_key(name, waiter).
--
-- Compatibility: waiters registered through the version-2 queue_claim (7 arguments, kept
-- as it was: a client of the previous release still running during an upgrade) have no
-- channel and are woken on the schema's channel, as before.

ALTER TABLE __SCHEMA__.queue_waiters ADD COLUMN channel text;

-- queue_model.take_waiters, as in version 2, on each waiter's own channel where it named one.
CREATE OR REPLACE FUNCTION __SCHEMA__._queue_wake(p_qid bigint, p_name text, p_count integer)
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
    FOR w IN
        DELETE FROM __SCHEMA__.queue_waiters d
        WHERE d.seq IN (SELECT f.seq FROM __SCHEMA__.queue_waiters f WHERE f.queue_id = p_qid
                        ORDER BY f.seq LIMIT p_count)
        RETURNING d.waiter, d.channel
    LOOP
        PERFORM pg_notify(coalesce(nullif(w.channel, ''), __CHANNEL__),
                          __SCHEMA__.queue_wake_key(p_name, w.waiter));
    END LOOP;
END
$$;

-- queue_claim with p_channel (required, so a call of the version-2 signature never matches
-- this one): the version-2 function, then the waiter it registered (if it found nothing)
-- records the channel. Both in one transaction, under the queue row's lock that the inner
-- call took, so no wake-up can come between the two.
CREATE FUNCTION __SCHEMA__.queue_claim(
    p_name text, p_receipt text, p_visibility double precision, p_concurrency integer,
    p_max_attempts integer, p_waiter text, p_now timestamptz, p_channel text,
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
                                p_max_attempts, p_waiter, p_now) c;
    IF NOT o_found AND p_waiter IS NOT NULL AND p_channel IS NOT NULL THEN
        UPDATE __SCHEMA__.queue_waiters w SET channel = p_channel
        FROM __SCHEMA__.queues q
        WHERE q.key = sha256(convert_to(p_name, 'UTF8')) AND w.queue_id = q.id
          AND w.waiter = p_waiter;
    END IF;
END
$$;
