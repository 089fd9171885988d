"""``stores/postgres/schema.sql`` (the schema as it is now, to read) makes exactly the schema
the migrations make (how a schema gets there, and what a new one is still made by); the one
Python ``wake_key`` equals the SQL functions ``wake_key`` and ``queue_wake_key``."""

from __future__ import annotations

import secrets
from importlib import resources
from typing import Any

import psycopg
import pytest

import turnstile
from turnstile.stores.postgres import sql as pg

pytestmark = pytest.mark.postgres

# Each query lists one kind of catalog entry of the schema %(schema)s, in a stable order.
CATALOG = {
    "relations": """
        SELECT c.relname, c.relkind, c.reloptions::text
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(schema)s AND c.relname NOT LIKE 'schema_version%%'
        ORDER BY 1""",
    "columns": """
        SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod),
               a.attnotnull, a.attidentity, pg_get_expr(d.adbin, d.adrelid), co.collname
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        LEFT JOIN pg_collation co ON co.oid = a.attcollation
        WHERE n.nspname = %(schema)s AND c.relkind = 'r' AND a.attnum > 0
          AND NOT a.attisdropped AND c.relname <> 'schema_version'
        ORDER BY 1, 2""",
    "indexes": """
        SELECT indexname, indexdef FROM pg_indexes
        WHERE schemaname = %(schema)s AND tablename <> 'schema_version' ORDER BY 1""",
    "constraints": """
        SELECT c.relname, k.conname, pg_get_constraintdef(k.oid)
        FROM pg_constraint k
        JOIN pg_class c ON c.oid = k.conrelid
        JOIN pg_namespace n ON n.oid = k.connamespace
        WHERE n.nspname = %(schema)s AND c.relname <> 'schema_version'
        ORDER BY 1, 2""",
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid)
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = %(schema)s
        ORDER BY 1, 2""",
}


def _catalog(conn: psycopg.Connection[Any], schema: str) -> dict[str, list[tuple[Any, ...]]]:
    """The schema's catalog, its own name and NOTIFY channel replaced by placeholders."""

    def plain(value: Any) -> Any:
        if not isinstance(value, str):
            return value
        for own, placeholder in (
            (pg.quote_ident(schema), "__SCHEMA__"),
            (pg.quote_literal(pg.channel_for(schema)), "__CHANNEL__"),
            (schema, "__SCHEMA__"),
        ):
            value = value.replace(own, placeholder)
        return value

    return {
        kind: [tuple(plain(v) for v in row) for row in conn.execute(query, {"schema": schema})]
        for kind, query in CATALOG.items()
    }


def test_schema_sql_makes_what_the_migrations_make(pg_url: str, pg_server: str) -> None:
    client = turnstile.connect(pg_url)  # a new schema: the migrations, in order
    migrated = client.backend.config.schema  # type: ignore[attr-defined]
    client.close()
    from_file = f"tf_{secrets.token_hex(5)}"
    text = resources.files("turnstile.stores.postgres").joinpath("schema.sql").read_text("utf-8")
    with psycopg.connect(pg_server, autocommit=True) as conn:
        try:
            conn.execute(f"CREATE SCHEMA {pg.quote_ident(from_file)}")
            conn.execute(pg.render(text, from_file).encode("utf-8"))
            want = _catalog(conn, migrated)
            got = _catalog(conn, from_file)
        finally:
            conn.execute(f"DROP SCHEMA IF EXISTS {pg.quote_ident(from_file)} CASCADE")
    assert want["functions"], "the migrated schema has no functions"
    for kind in CATALOG:
        assert got[kind] == want[kind], kind


def test_python_wake_key_equals_the_sql_functions(pg_url: str) -> None:
    client = turnstile.connect(pg_url)
    schema = pg.quote_ident(client.backend.config.schema)  # type: ignore[attr-defined]
    conninfo = client.backend.config.conninfo  # type: ignore[attr-defined]
    client.close()
    pairs = [("job", "worker-1"), ("", ""), ("naïve ✓ {x}", "h\u00e9"), ("a" * 4096, "b" * 300)]
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for name, waiter in pairs:
            lock, queue = conn.execute(
                f"SELECT {schema}.wake_key(%s, %s), {schema}.queue_wake_key(%s, %s)",
                (name, waiter, name, waiter),
            ).fetchone() or ("", "")
            assert lock == pg.wake_key(name, waiter)
            assert queue == pg.wake_key(name, waiter, queue=True)
