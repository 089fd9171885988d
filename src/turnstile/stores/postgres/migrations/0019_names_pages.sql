-- Turnstile PostgreSQL schema, version 19: the names table keeps a few pages, so that its key
-- is always looked up through its index.
--
-- The planner prices a sequential scan from the table file's real number of pages. On a
-- names table of under about eight pages (a few hundred names: a test, a service with a
-- handful of resources, a fresh deployment) it finds reading the whole table cheaper than
-- the key's index, and every step that finds a name by its key (the fast statements of
-- queries.sql and the functions' `WHERE key = ...`) then reads every row of the table and
-- compares keys, instead of one index entry and one row. Counted with callgrind (PostgreSQL
-- 15, 55 names): server instructions per uncontended acquire + release 342k -> 216k with
-- commits waiting for the disk, 322k -> 224k with durability=relaxed; the scan's share
-- grows with each name the table holds, up to the point where the planner switches.
--
-- This migration writes 80 padding rows of about 1.7 kB and deletes them in the same
-- transaction, which grows the file to about 25 pages, and tells VACUUM not to truncate the
-- empty pages at the end of the file (vacuum_truncate = false): the file keeps its pages, the
-- planner keeps pricing a scan at 25 pages, and takes the index at every table size. The
-- cost is about 200 kB per schema, and a names table no longer gives back the empty tail of
-- its file to the operating system after a burst of names (VACUUM FULL still does).
--
-- The padding rows' keys are 16 bytes long; a name's key is its sha256 (32 bytes), so no
-- name can meet one, and ON CONFLICT makes the migration safe to run on a populated schema
-- (it then only adds up to 80 dead rows, which VACUUM frees). Nothing else changes.

ALTER TABLE __SCHEMA__.names SET (vacuum_truncate = false);

INSERT INTO __SCHEMA__.names (key, name, lim)
SELECT decode(lpad(to_hex(g), 32, '0'), 'hex'),
       'turnstile:padding:' || g || repeat('.', 1600),
       1
FROM generate_series(1, 80) AS g
ON CONFLICT (key) DO NOTHING;

DELETE FROM __SCHEMA__.names
WHERE length(key) = 16 AND starts_with(name, 'turnstile:padding:');
