-- Turnstile PostgreSQL schema, version 18: the lock steps plan their statements once per
-- connection (plan_cache_mode = force_generic_plan on the functions a lock step calls).
--
-- A PL/pgSQL function plans each statement it runs the first time it runs it on a server
-- connection, and keeps that plan. With the default plan_cache_mode (auto), though, a
-- statement with parameters (every statement here: the name's id, the holder, the clock) is
-- planned again for its values at each of its first five runs on the connection, and only
-- then settles on its generic plan, which it then keeps (each statement of these functions
-- finds its rows by the name's key or id, which a generic plan does as well as any: the
-- steps settle on it). On a connection that has run a step fewer than five times, each run
-- paid those plans again: a waiter joining the line cost 1.6-1.9 ms in its 2nd to 6th runs
-- against 0.9-1.1 ms with this setting, as much as once settled (PostgreSQL 15, fresh
-- connections, commits not waiting for the disk, scratch measurements); a webhook worker,
-- whose connections run each path only now and then, paid it on its first hand-overs on
-- each of them. force_generic_plan keeps the plan made at the first run.
--
-- Only the functions of lock and semaphore steps, whose statements are all keyed lookups:
-- the queue's and the deliverer's functions scan ranges whose best plan may depend on the
-- values, and keep the default. The setting holds while the function runs (its helpers
-- included) and is restored when it returns, as search_path is: nothing leaks into the
-- session, so it is as safe through a transaction pooler as before.
--
-- Safe on a populated schema: seven functions get one more setting, nothing else changes.

ALTER FUNCTION __SCHEMA__.acquire(
    text, text, integer, double precision, double precision, boolean, timestamptz, text, text,
    bigint, text, integer)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION __SCHEMA__.release(text, text, bigint, timestamptz)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION __SCHEMA__.renew(text, text, bigint, double precision, timestamptz)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION __SCHEMA__.set_limit(text, integer, timestamptz)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION __SCHEMA__.acquire_callback(
    text, text, integer, double precision, double precision, timestamptz, text, bigint, text,
    integer)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION __SCHEMA__.settle_delivery(text, bigint, text, double precision, timestamptz)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION __SCHEMA__.status(text, timestamptz)
    SET plan_cache_mode = force_generic_plan;
