"""Store-side parts of the PostgreSQL backend shared by the sync and async flavours: the URL,
the SQL files, the wake-up key, and how psycopg's exceptions become Turnstile's.

Every line of SQL lives in a ``.sql`` file beside this module:

- ``schema.sql``: the schema as it is now (tables, indexes, the current version of every
  function), to read. The state machine lives there, as functions (one call = one
  transaction = one round trip) following :mod:`turnstile._core.lock_machine` and
  :mod:`turnstile._core.queue_machine` step for step.
- ``queries.sql``: every statement the backends send, by name (locks, queues, migrating).
- ``migrations/``: how a schema gets to the current version, never edited once released
  (deployed databases have applied them).

A new schema is made by running the migrations in order, exactly as an old one is brought
up to date, so there is one way a schema comes to be; ``schema.sql`` is not run by the
backends, and ``tests/stores/postgres/test_schema_file.py`` checks that it makes the same
schema as the migrations do (catalog and function text).
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from dataclasses import dataclass, field
from importlib import resources
from urllib.parse import (
    SplitResult,
    parse_qsl,
    quote,
    unquote,
    urlencode,
    urlsplit,
    urlunsplit,
)

import psycopg

from ..._core import urls
from ..._core.urls import redact
from ...errors import BackendUnavailable, ConfigurationError, TurnstileError

DEFAULT_SCHEMA = "turnstile"
DEFAULT_APPLICATION_NAME = "turnstile"
DEFAULT_CONNECT_TIMEOUT = 5
DEFAULT_POOL_MIN = 1
DEFAULT_POOL_MAX = 10
DEFAULT_RETRY_TIMEOUT = 5.0
MAX_RETRY_TIMEOUT = 3600.0
MAX_IDENTIFIER_BYTES = 63  # PostgreSQL's NAMEDATALEN - 1
MIN_SERVER_VERSION = 120000  # sha256(), starts_with(), identity columns

# Query parameters of a postgresql:// URL that are Turnstile's own; the rest go to libpq.
TURNSTILE_PARAMS = (
    "schema",
    "pool_min",
    "pool_max",
    "listen",
    "listen_url",
    "retry_timeout",
    "durability",
    "prepare",
)
DURABILITIES = ("durable", "relaxed", "strict")
# The lock and semaphore operations that commit a change: with durability=relaxed they do
# not wait for their WAL to reach disk (the "relaxed" query of queries.sql). Queue
# operations are never relaxed: a message put is a message kept. Nor are the callback
# operations (acquire_callback, take_deliveries, settle_delivery): a callback waiter has no
# connection to notice a forgotten place or grant, and a durable take flushes the WAL of
# every commit before it, so a grant made by a relaxed release is on disk before a
# deliverer sends it; a settle that a crash forgot would be delivered again (a Step
# Functions task token answers a second SendTaskSuccess with a refusal, which would release
# the grant the execution holds). See docs/postgres.md, "Callback grants". The rate-limit
# steps that commit (rate_acquire, rate_leave) are relaxed too: an admission a crash forgot
# only goes uncounted (the next ones may come that much sooner), as a relaxed grant may be
# forgotten; rate_status writes nothing.
RELAXABLE = frozenset(
    {"acquire", "release", "acquire_fast", "acquire_fresh", "acquire_idle", "release_fast",
     "release_idle", "renew", "set_limit", "rate_acquire", "rate_leave"}
)
# The plain statements sent only with prepare=on, and the function call each stands for: what
# a client sends instead once it stops preparing (PostgresConnection._unprepared), since a
# long statement parsed and planned at every call costs more than the call.
UNPREPARED = {
    "acquire_fast": "acquire",
    "acquire_fresh": "acquire",
    "acquire_idle": "acquire",
    "release_fast": "release",
    "release_idle": "release",
}
# Where a statement that cannot be wrapped in the "relaxed" query puts the setting: a filter
# on the one row it returns, or a column of it, so it is evaluated exactly once, in the
# statement's transaction (never in a WHERE clause that a sequential scan would evaluate on
# every row it reads: on a small table the planner scans rather than use the key's index).
RELAXED_MARK = "__RELAXED__"
RELAXED_FILTER = "set_config('synchronous_commit', 'off', true) IS NOT NULL"
# A release that frees an idle name (the fast holder's, queries.sql FAST_FREE: nobody else
# holds it or waits, so it grants nobody) commits without waiting for the disk unless
# durability=strict: a crash can forget only that the name was freed, which leaves it held
# by the holder that released it until that lease runs out, as if the holder had died
# holding it; any later durable commit (the next grant, on any name) flushes it first. The
# setting goes in the RETURNING of the UPDATE that frees the name, evaluated only for the
# row it changed, so the release function behind it (which may grant a waiter) never runs
# with it. See docs/postgres.md, "Durability". With durability=relaxed the same setting is
# the relaxed one: a statement with this mark and no RELAXED_MARK (release_idle, which
# frees the name or changes nothing) is relaxed by it alone.
UNFLUSHED_MARK = "__UNFLUSHED__"
UNFLUSHED_TEST = "set_config('synchronous_commit', 'off', true) IS NOT NULL AND"

_SIMPLE_SCHEMA = re.compile(r"[a-z_][a-z0-9_]{0,50}")


# -- SQL files ----------------------------------------------------------------------------
def _sql_folder() -> resources.abc.Traversable:
    return resources.files("turnstile.stores.postgres")


def _load_queries() -> dict[str, str]:
    """The named queries of queries.sql. A block headed "-- part: NAME" is not a query but
    text that queries share: each "__NAME__" in a query, or in a later part, is replaced by
    it (acquire_fast's UPDATE is acquire_idle's, release_fast's is release_idle's, the fast
    grant's token and times are acquire_fresh's too), so the copies cannot drift."""
    text = _sql_folder().joinpath("queries.sql").read_text("utf-8")
    blocks: dict[tuple[str, str], str] = {}
    current: tuple[str, str] | None = None
    lines: list[str] = []
    for line in text.splitlines():
        match = re.fullmatch(r"-- (name|part): (\w+)\s*", line)
        if match:
            if current is not None:
                blocks[current] = "\n".join(lines).strip()
            current, lines = (match.group(1), match.group(2)), []
        elif current is not None and not line.startswith("--"):
            lines.append(line)
    if current is not None:
        blocks[current] = "\n".join(lines).strip()
    parts: dict[str, str] = {}
    queries: dict[str, str] = {}
    for (kind, name), body in blocks.items():  # in file order: a part may use earlier ones
        for part, shared in parts.items():
            body = body.replace(f"__{part}__", shared)
        (parts if kind == "part" else queries)[name] = body
    unknown = {m for q in queries.values() for m in re.findall(r"__([A-Z_]+)__", q)}
    # filled in by PostgresConfig.query(), render() etc.
    unknown -= {"SCHEMA", "RELAXED", "UNFLUSHED", "QUERY", "CHANNEL_NAME"}
    if unknown:
        raise RuntimeError(f"queries.sql names parts it does not define: {sorted(unknown)}")
    return queries


def _load_migrations() -> list[tuple[int, str, str]]:
    found = []
    for entry in _sql_folder().joinpath("migrations").iterdir():
        if entry.name.endswith(".sql"):
            version = int(entry.name.split("_", 1)[0])
            found.append((version, entry.name, entry.read_text("utf-8")))
    found.sort()
    if [v for v, _, _ in found] != list(range(1, len(found) + 1)):
        raise RuntimeError(f"PostgreSQL migrations are not numbered 1..n: {found}")
    return found


QUERIES = _load_queries()
MIGRATIONS = _load_migrations()
SCHEMA_VERSION = MIGRATIONS[-1][0]


def quote_ident(value: str) -> str:
    return '"' + value.replace('"', '""') + '"'


def quote_literal(value: str) -> str:
    # Only ever used on channel names we build from [a-z0-9_.] (see channel_for).
    return "'" + value.replace("'", "''") + "'"


def channel_for(schema: str) -> str:
    """The NOTIFY channel of a schema: readable for plain schema names, hashed otherwise (a
    channel is an identifier of at most 63 bytes, and is spliced into the functions)."""
    if _SIMPLE_SCHEMA.fullmatch(schema):
        return f"turnstile.{schema}"
    return "turnstile." + hashlib.sha256(schema.encode("utf-8")).hexdigest()[:32]


def client_channel(client_id: str) -> str:
    """The NOTIFY channel of one client (its LISTEN connection): hand-overs to that client's
    waiters are announced there only, so no other process wakes for them."""
    return f"turnstile.client.{client_id}"


def render(sql: str, schema: str) -> str:
    return sql.replace("__SCHEMA__", quote_ident(schema)).replace(
        "__CHANNEL__", quote_literal(channel_for(schema))
    )


def listen(channel: str) -> str:
    """The LISTEN statement of one channel (an identifier, so spliced in, quoted)."""
    return QUERIES["listen"].replace("__CHANNEL_NAME__", quote_ident(channel))


def migrate_lock_key(schema: str) -> int:
    """The advisory lock (transaction-scoped) that serialises migrations of one schema."""
    digest = hashlib.sha256(b"turnstile.migrate\0" + schema.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def migration_script(schema: str, applied: int = 0, grant_to: str | None = None) -> str:
    """The SQL that ``turnstile migrate --print-sql`` shows a DBA: the migrations after
    ``applied``, with the version bookkeeping, as one transaction (what the backends run on
    their first connection, statement for statement). It refuses to run if the schema is no
    longer at ``applied`` when it is applied. ``grant_to``: also grant that role what the
    application needs (docs/postgres.md, "Permissions")."""
    ident = quote_ident(schema)
    out = [
        f"-- Turnstile schema {schema!r}: from version {applied} to {SCHEMA_VERSION}.",
        "-- Review, then run as a role that may create the schema, e.g.",
        "--   psql -v ON_ERROR_STOP=1 -f this-file.sql   (it is one transaction: BEGIN … COMMIT)",
        "BEGIN;",
        f"SELECT pg_advisory_xact_lock({migrate_lock_key(schema)});",
        render(QUERIES["create_schema"], schema) + ";",
        render(QUERIES["create_version_table"], schema) + ";",
        "DO $turnstile$ BEGIN",
        f"  IF (SELECT coalesce(max(version), 0) FROM {ident}.schema_version) <> {applied} THEN",
        f"    RAISE EXCEPTION 'schema % is not at version {applied}: generate the script again',",
        f"      {quote_literal(schema)};",
        "  END IF;",
        "END $turnstile$;",
    ]
    for number, filename, script in MIGRATIONS:
        if number > applied:
            out += [
                "",
                f"-- {filename}",
                render(script, schema).strip(),
                f"INSERT INTO {ident}.schema_version (version, name) "
                f"VALUES ({number}, {quote_literal(filename)});",
            ]
    if grant_to is not None:
        role = quote_ident(grant_to)
        out += [
            "",
            f"-- What the application role {grant_to!r} needs (docs/postgres.md).",
            f"GRANT USAGE ON SCHEMA {ident} TO {role};",
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {ident} TO {role};",
            f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {ident} TO {role};",
            f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {ident} TO {role};",
        ]
    out += ["COMMIT;", ""]
    return "\n".join(out)


@functools.lru_cache(maxsize=4096)
def name_key(name: str) -> bytes:
    """The names row's key of ``name``: sha256 of its UTF-8 bytes, as the SQL functions make
    it (``sha256(convert_to(name, 'UTF8'))``), computed here for the plain statements
    (and remembered for the names used lately: each acquire and release sends it)."""
    return hashlib.sha256(name.encode("utf-8")).digest()


def wake_key(name: str, waiter: str, *, queue: bool = False) -> str:
    """The NOTIFY payload (its first word) that names one waiter: of a lock (``waiter`` is
    the holder) or, with ``queue``, a blocked consumer of a queue (``waiter`` is its id).
    Must equal the SQL functions ``wake_key`` and ``queue_wake_key`` of ``schema.sql``
    (``tests/stores/postgres/test_schema.py`` checks both). A queue's key starts with
    NUL "queue" NUL, and lock names never start with NUL, so the two never collide."""
    data = name.encode("utf-8") + b"\0" + waiter.encode("utf-8")
    if queue:
        data = b"\0queue\0" + data
    return hashlib.sha256(data).hexdigest()[:32]


# -- URL ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PostgresConfig:
    # for psycopg: Turnstile's parameters removed, defaults added (may hold the password:
    # never shown, not even in repr)
    conninfo: str = field(repr=False)
    # the LISTEN connection; None: no LISTEN, waiters poll
    listen_conninfo: str | None = field(repr=False)
    schema: str
    pool_min: int
    pool_max: int
    retry_timeout: float
    connect_timeout: float
    display: str  # the URL with its password replaced, safe to print
    secrets: tuple[str, ...] = field(repr=False)  # strings never to print (passwords)
    # "durable" (every commit waits for its WAL on disk, but a release that frees an idle
    # name), "strict" (every commit waits) or "relaxed" (lock, semaphore and rate-limit
    # commits do not): see docs/postgres.md, "Durability"
    durability: str = "durable"
    # Server-side prepared statements (prepare=on, the default): each pooled connection
    # parses and plans each statement once, under a name hashed from its text (prepared.py:
    # safe through any pooler, where a server connection holding that name holds that
    # text), and acquire and release are sent as plain statements (queries.sql,
    # acquire_fast and release_fast). prepare=off: nothing prepared.
    prepare: bool = True

    @property
    def channel(self) -> str:
        return channel_for(self.schema)

    @property
    def relaxed(self) -> bool:
        return self.durability == "relaxed"

    def statement(self, name: str) -> str:
        """The query the backends send for operation ``name``: with prepare=on, acquire and
        release as plain statements (``acquire_fast``, ``release_fast``)."""
        if self.prepare and f"{name}_fast" in QUERIES:
            return self.query(f"{name}_fast")
        return self.query(name)

    def query(self, name: str) -> str:
        text = QUERIES[name]
        unflushed = UNFLUSHED_MARK in text and self.durability != "strict"
        text = text.replace(UNFLUSHED_MARK, UNFLUSHED_TEST if unflushed else "")
        if RELAXED_MARK in text:
            # A statement with a data-modifying WITH (acquire, release) cannot be wrapped:
            # it says where the relaxed setting goes.
            relaxed = self.relaxed and name in RELAXABLE
            text = text.replace(RELAXED_MARK, RELAXED_FILTER if relaxed else "true")
        elif self.relaxed and name in RELAXABLE and not unflushed:
            text = QUERIES["relaxed"].replace("__QUERY__", text)
        return render(text, self.schema)

    def scrub(self, text: str) -> str:
        return urls.scrub(text, self.secrets)


def _int_param(params: dict[str, str], key: str, default: int, low: int, high: int) -> int:
    raw = params.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(
            f"URL parameter {key}={raw!r} must be an integer from {low} to {high}"
        ) from None
    if not low <= value <= high:
        raise ConfigurationError(f"URL parameter {key}={value} must be from {low} to {high}")
    return value


def _on_off(params: dict[str, str], key: str) -> bool:
    """A switch that is on by default (``prepare``, ``listen``): ``on`` or ``off``, any case."""
    raw = params.get(key, "on")
    if raw.lower() not in ("on", "off"):
        raise ConfigurationError(
            f"URL parameter {key}={raw!r} must be 'on' (the default) or 'off'"
        )
    return raw.lower() == "on"


def _libpq_url(parts: SplitResult, params: list[tuple[str, str]], app_suffix: str) -> str:
    keys = {k for k, _ in params}
    extra: list[tuple[str, str]] = []
    if "connect_timeout" not in keys:
        extra.append(("connect_timeout", str(DEFAULT_CONNECT_TIMEOUT)))
    if "application_name" not in keys:
        extra.append(("application_name", DEFAULT_APPLICATION_NAME + app_suffix))
    elif app_suffix:
        params = [(k, v + app_suffix if k == "application_name" else v) for k, v in params]
    # libpq decodes %XX but not '+' (urlencode's default for a space): quote, not quote_plus.
    query = urlencode(params + extra, quote_via=quote)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))


def parse_url(url: str, parts: SplitResult) -> PostgresConfig:
    """Split Turnstile's own parameters off a ``postgresql://`` URL.

    ``schema`` (default ``turnstile``), ``pool_min``/``pool_max`` (connections kept / at most),
    ``retry_timeout`` (seconds an operation keeps retrying over dropped connections and
    server restarts; 0 = fail at once), ``listen=off`` (no LISTEN connection: waiters poll
    with a backoff) and ``listen_url`` (a separate URL for the LISTEN connection, e.g. a
    direct or session-mode one when the main URL is a transaction pooler). Everything else
    is passed to libpq unchanged. ``durability=relaxed`` lets lock, semaphore and rate-limit
    operations commit without waiting for the disk, ``durability=strict`` makes even a
    release that frees an idle name wait for it (see docs/postgres.md, "Durability").
    ``prepare`` (``on``, the default, or ``off``) says whether to use server-side prepared
    statements (see docs/postgres.md, "Connection pooling")."""
    display = redact(url)
    try:
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False)
    except ValueError as exc:
        raise ConfigurationError(f"cannot parse the query of {display!r}: {exc}") from None
    ours: dict[str, str] = {}
    rest: list[tuple[str, str]] = []
    for key, value in pairs:
        if key in TURNSTILE_PARAMS:
            if key in ours:
                raise ConfigurationError(f"URL parameter {key} is given twice in {display!r}")
            ours[key] = value
        else:
            rest.append((key, value))
    secrets = tuple(
        s
        for s in {
            parts.password or "",
            unquote(parts.password or ""),
            *(v for k, v in rest if k == "password"),
        }
        if s
    )
    secrets = tuple({*secrets, *urls.secrets_in(url)})
    schema = ours.get("schema", DEFAULT_SCHEMA)
    size = len(schema.encode("utf-8", "surrogatepass"))
    if not 1 <= size <= MAX_IDENTIFIER_BYTES or "\0" in schema:
        raise ConfigurationError(
            f"URL parameter schema={schema!r} must be 1 to {MAX_IDENTIFIER_BYTES} bytes "
            "(a PostgreSQL identifier) without NUL"
        )
    pool_min = _int_param(ours, "pool_min", DEFAULT_POOL_MIN, 0, 1000)
    pool_max = _int_param(ours, "pool_max", max(DEFAULT_POOL_MAX, pool_min), 1, 1000)
    if pool_max < pool_min:
        raise ConfigurationError(f"URL parameter pool_max={pool_max} is below pool_min={pool_min}")
    retry_raw = ours.get("retry_timeout")
    retry_timeout = DEFAULT_RETRY_TIMEOUT
    if retry_raw is not None:
        try:
            retry_timeout = float(retry_raw)
        except ValueError:
            retry_timeout = math.nan
        if not 0 <= retry_timeout <= MAX_RETRY_TIMEOUT:
            raise ConfigurationError(
                f"URL parameter retry_timeout={retry_raw!r} must be 0 to "
                f"{MAX_RETRY_TIMEOUT:g} seconds"
            )
    connect_timeout = float(dict(rest).get("connect_timeout", DEFAULT_CONNECT_TIMEOUT) or 0)
    if connect_timeout <= 0:
        connect_timeout = DEFAULT_CONNECT_TIMEOUT  # libpq: 0 = wait forever; we bound ours
    durability = ours.get("durability", "durable").lower()
    if durability not in DURABILITIES:
        raise ConfigurationError(
            f"URL parameter durability={ours['durability']!r} must be 'durable' (the default), "
            "'strict' or 'relaxed'"
        )
    prepare = _on_off(ours, "prepare")
    listen = _on_off(ours, "listen")
    conninfo = _libpq_url(parts, rest, "")
    listen_conninfo: str | None = None
    if listen:
        if "listen_url" in ours:
            listen_url = ours["listen_url"]
            try:
                lparts = urlsplit(listen_url)
            except ValueError:
                raise ConfigurationError("URL parameter listen_url cannot be parsed") from None
            if lparts.scheme not in ("postgresql", "postgres"):
                raise ConfigurationError(
                    f"URL parameter listen_url must be a postgresql:// URL, got "
                    f"{redact(listen_url)!r}"
                )
            lpairs = [
                (k, v)
                for k, v in parse_qsl(lparts.query, keep_blank_values=True)
                if k not in TURNSTILE_PARAMS
            ]
            secrets = tuple(
                {*secrets, *(s for s in (lparts.password, unquote(lparts.password or "")) if s)}
            )
            listen_conninfo = _libpq_url(lparts, lpairs, ":listen")
        else:
            listen_conninfo = _libpq_url(parts, rest, ":listen")
    return PostgresConfig(
        conninfo=conninfo,
        listen_conninfo=listen_conninfo,
        schema=schema,
        pool_min=pool_min,
        pool_max=pool_max,
        retry_timeout=retry_timeout,
        connect_timeout=connect_timeout,
        display=display,
        secrets=secrets,
        durability=durability,
        prepare=prepare,
    )


# -- errors ---------------------------------------------------------------------------------
# SQLSTATE classes that mean: this URL or role cannot work, retrying will not help.
_CONFIG_STATES = ("28", "3D", "42501")
# libpq reports a refused login without a SQLSTATE; these are the server's refusals that
# retrying will not fix (a missing database or role, a wrong password, pg_hba.conf).
_CONFIG_MESSAGES = (
    "does not exist",
    "authentication failed",
    "pg_hba.conf",
    "permission denied",
    "is not permitted to log in",
    "password is required",
    "invalid connection option",
)


def is_retryable(exc: BaseException) -> bool:
    """A dropped or refused connection, a server restart, a pool timeout, a serialisation
    failure: the operation did not happen or is idempotent, so it may be tried again."""
    return isinstance(exc, psycopg.OperationalError)


def is_connection_error(exc: BaseException) -> bool:
    state = getattr(exc, "sqlstate", None)
    return state is None or state.startswith(("08", "57P"))


# SQLSTATE of acquire's refusal of a newcomer naming another limit (or per_key) than a busy
# name's; its DETAIL is the name's limit (see migrations/0005_one_limit_per_name.sql), then a
# space and its per_key when the name is a semaphore group (migrations/0010_groups.sql).
LIMIT_CONFLICT = "TSL01"


def conflicting_shape(exc: BaseException | None) -> tuple[int, int | None] | None:
    """The name's (limit, per_key) if ``exc`` is acquire's refusal, else ``None``."""
    if getattr(exc, "sqlstate", None) != LIMIT_CONFLICT:
        return None
    detail = getattr(getattr(exc, "diag", None), "message_detail", None)
    try:
        words = [int(word) for word in (detail or "").split()]
    except ValueError:
        return None
    if len(words) == 1:
        return words[0], None
    if len(words) == 2:
        return words[0], words[1]
    return None


# SQLSTATE of rate_acquire's refusal of a caller naming another rate than a busy rate
# limit's; its DETAIL is the name's "rate per burst" (see migrations/0008_rates.sql).
RATE_CONFLICT = "TSL02"


def conflicting_rate(exc: BaseException | None) -> tuple[int, float, int] | None:
    """The name's (rate, per, burst) if ``exc`` is rate_acquire's refusal, else ``None``."""
    if getattr(exc, "sqlstate", None) != RATE_CONFLICT:
        return None
    detail = getattr(getattr(exc, "diag", None), "message_detail", None)
    try:
        rate, per, burst = (detail or "").split()
        return int(rate), float(per), int(burst)
    except ValueError:
        return None


def describe(exc: BaseException, config: PostgresConfig) -> str:
    # One line, without a final full stop (it is quoted mid-sentence); libpq's lines
    # ("… Connection refused", "Is the server running …?") become clauses.
    lines = [" ".join(line.split()).rstrip(".") for line in str(exc).splitlines()]
    lines = [line for line in lines if line]
    text = "; ".join(lines[:1] + [line[:1].lower() + line[1:] for line in lines[1:]])
    return config.scrub(text or type(exc).__name__)


def translate(exc: BaseException, action: str, config: PostgresConfig) -> TurnstileError:
    """A psycopg exception as a Turnstile one (the caller raises it ``from exc``)."""
    return BackendUnavailable(
        f"PostgreSQL at {config.display!r} failed to {action}: {describe(exc, config)}"
    )


def cannot_migrate(exc: BaseException, config: PostgresConfig) -> ConfigurationError:
    """The connecting role may not create or migrate the schema: say who can, and how."""
    return ConfigurationError(
        f"PostgreSQL at {config.display!r}: this role lacks the privilege to create or "
        f"migrate schema {config.schema!r} to Turnstile schema version {SCHEMA_VERSION} "
        f"({describe(exc, config)}); have a DBA review and apply the SQL printed by "
        "`turnstile migrate --url URL --print-sql [--grant ROLE]`, or run "
        "`turnstile migrate --url URL --apply` as a role that may (docs/postgres.md)"
    )


def translate_connect(exc: BaseException, config: PostgresConfig) -> TurnstileError:
    state = getattr(exc, "sqlstate", None) or ""
    text = describe(exc, config)
    if isinstance(exc, psycopg.ProgrammingError) and not state:
        return ConfigurationError(f"invalid PostgreSQL URL {config.display!r}: {text}")
    if state.startswith(_CONFIG_STATES) or (not state and any(m in text for m in _CONFIG_MESSAGES)):
        return ConfigurationError(
            f"PostgreSQL at {config.display!r} refused the connection or the schema "
            f"{config.schema!r}: {text} (check the user, password, database and the role's "
            "privileges; see docs/postgres.md)"
        )
    # libpq often asks the question itself ("Is the server running on that host …?"):
    # then it is not asked twice.
    asked = "server running" in text.lower()
    hint = "" if asked else " (is the server running and reachable there?)"
    return BackendUnavailable(f"cannot connect to PostgreSQL at {config.display!r}: {text}{hint}")
