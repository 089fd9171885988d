"""Backends are chosen by URL scheme and imported lazily, so ``pip install turnstile-locks``
stays light: a missing driver is reported with the ``pip install`` line that fixes it.

Also the one place that knows which parts of a URL are secret: :func:`redact` (a URL safe to
show) and :func:`secrets_in` / :func:`scrub` (a message safe to show, whatever a driver put
in it). Every message, log line, ``repr`` and JSON document that shows a URL goes through
them; and where the embedded default store lives (:func:`default_url`)."""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from urllib.parse import SplitResult, quote, unquote, unquote_plus, urlsplit

from ..errors import ConfigurationError

ENV_VAR = "TURNSTILE_URL"
# The embedded default: one SQLite file per user and host, in the XDG state directory.
STATE_ENV = "XDG_STATE_HOME"
DEFAULT_STATE_DIR = "~/.local/state"
DEFAULT_FILE_NAME = "turnstile.db"
# How help texts and docs name the default (the real path: default_sqlite_path()).
DEFAULT_DESCRIPTION = f"${STATE_ENV}/turnstile/{DEFAULT_FILE_NAME} (default {DEFAULT_STATE_DIR})"

REDACTED = "***"


@dataclass(frozen=True, slots=True)
class BackendEntry:
    module: str  # module under turnstile._async.backends / turnstile._sync.backends
    extra: str | None  # the pip extra that brings its driver
    description: str


# scheme -> backend module. Later backends join by adding a row.
SCHEMES: dict[str, BackendEntry] = {
    # description: a noun phrase, used as "the {description} backend"
    "memory": BackendEntry("memory", None, "in-process memory"),
    "sqlite": BackendEntry("sqlite", None, "embedded SQLite"),
    "redis": BackendEntry("redis", "redis", "Redis"),
    "rediss": BackendEntry("redis", "redis", "Redis (TLS)"),
    "redis+cluster": BackendEntry("redis", "redis", "Redis Cluster"),
    "postgresql": BackendEntry("postgres", "postgres", "PostgreSQL"),
    "postgres": BackendEntry("postgres", "postgres", "PostgreSQL"),
    "http": BackendEntry("http", "http", "Turnstile HTTP service"),
    "https": BackendEntry("http", "http", "Turnstile HTTP service (TLS)"),
}


# -- the embedded default ----------------------------------------------------------------


def state_dir() -> str:
    """Turnstile's folder in the XDG state directory: ``$XDG_STATE_HOME/turnstile``, else
    ``~/.local/state/turnstile`` (a relative ``$XDG_STATE_HOME`` is ignored, as the XDG
    specification says)."""
    base = os.environ.get(STATE_ENV, "")
    if not os.path.isabs(base):
        home = os.path.expanduser("~")
        if not os.path.isabs(home):
            raise ConfigurationError(
                f"cannot find the default store: neither ${STATE_ENV} nor $HOME names an "
                "absolute directory; give a store URL (--url or $TURNSTILE_URL), e.g. "
                "sqlite:////var/lib/turnstile/turnstile.db"
            )
        base = os.path.join(home, ".local", "state")
    return os.path.join(base, "turnstile")


def default_sqlite_path() -> str:
    """The file of the embedded default store (absolute): one per user and host, whatever
    the working directory."""
    return os.path.join(state_dir(), DEFAULT_FILE_NAME)


def default_url() -> str:
    return "sqlite:///" + default_sqlite_path()  # an absolute path: sqlite:////home/…


def resolve_url(url: str | None) -> str:
    """``url``, else ``$TURNSTILE_URL``, else the embedded default. An empty URL (given, or
    an empty ``$TURNSTILE_URL``) is refused: it is a mistake, not a request for the default."""
    if url is None:
        env = os.environ.get(ENV_VAR)
        if env is None:
            return default_url()
        if not env.strip():
            raise ConfigurationError(
                f"${ENV_VAR} is set but empty; give it a store URL (e.g. redis://host:6379/0),"
                f" or unset it to use the default store {default_url()}"
            )
        return env
    if not isinstance(url, str):
        raise ConfigurationError(f"url must be a string, got {type(url).__name__}")
    if not url.strip():
        raise ConfigurationError(
            "the store URL is empty; give one (e.g. sqlite:///./turnstile.db, "
            f"redis://host:6379/0), or leave it out to use ${ENV_VAR}, else the default "
            f"store {default_url()}"
        )
    return url


# -- secrets ------------------------------------------------------------------------------

# Query (or libpq keyword) parameters whose value is a secret, compared case-insensitively,
# plus any parameter whose name contains one of SECRET_WORDS. Not "key": a queue's key is
# no secret, and messages about it must stay readable.
SECRET_PARAMS = frozenset(
    {
        "password",
        "passwd",
        "pass",
        "pwd",
        "token",
        "access_token",
        "auth_token",
        "refresh_token",
        "id_token",
        "bearer",
        "secret",
        "client_secret",
        "api_key",
        "apikey",
        "auth",
        "authorization",
        "credentials",
        "sslpassword",
        "sslkey_password",
        "ssl_password",
        "private_key",
    }
)
SECRET_WORDS = (
    "password",
    "passwd",
    "secret",
    "token",
    "apikey",
    "api_key",
    "api-key",
    "credential",
    "private",
)
# key=value inside free text (a libpq conninfo, a driver's message): the value of a secret key.
_KEY_VALUE = re.compile(
    r"(?P<key>[A-Za-z0-9_.\-%+]+)(?P<sep>\s*=\s*)"
    r"(?P<value>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\s&;#,)]*)"
)
# A username alone is treated as a secret (a token written as http://TOKEN@host) only from
# this length on: shorter ones are ordinary user names, and blotting them out of every
# message would blot out ordinary words.
MIN_USER_TOKEN = 16


def is_secret_param(key: str) -> bool:
    """Whether a URL query parameter (or libpq keyword) named ``key`` holds a secret."""
    lowered = unquote_plus(key).strip().lower()
    return lowered in SECRET_PARAMS or any(word in lowered for word in SECRET_WORDS)


def _redact_pairs(text: str) -> str:
    """A query string (``a=1&password=x``) with every secret value replaced, and any URL
    given as a value (e.g. ``listen_url``) redacted in turn."""
    out = []
    for piece in text.split("&"):
        key, sep, value = piece.partition("=")
        if sep and is_secret_param(key):
            value = REDACTED
        elif sep and "://" in unquote_plus(value):
            value = quote(redact(unquote_plus(value)), safe=":/@*?=,")
        out.append(key + sep + value)
    return "&".join(out)


def _redact_text(text: str) -> str:
    """``key=value`` pairs with a secret key, in free text, with the value replaced."""

    def replace(match: re.Match[str]) -> str:
        if is_secret_param(match["key"]) and match["value"] not in ("", REDACTED):
            return match["key"] + match["sep"] + REDACTED
        return match[0]

    return _KEY_VALUE.sub(replace, text)


def redact(url: str) -> str:
    """``url`` safe to print or log: the userinfo (user and password, or a token written
    as the user) replaced by ``***``, and the value of every secret query parameter
    (``password``, ``token``, … in any case, also percent-encoded or repeated) too."""
    if not isinstance(url, str):
        return "<not a url>"
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if not parts.scheme or "://" not in url:
        return _redact_text(url)  # not a URL: perhaps a libpq conninfo (password=…)
    scheme, rest = url.split("://", 1)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = REDACTED + "@" + netloc.rsplit("@", 1)[1]
    shown = f"{scheme}://{netloc}{parts.path}"
    if "?" in rest:
        shown += "?" + _redact_pairs(parts.query)
    if "#" in rest:
        shown += "#" + _redact_pairs(parts.fragment)
    return _redact_text(shown)


def _variants(secret: str) -> set[str]:
    """A secret as it may appear in a message: as written, decoded, encoded."""
    decoded = unquote(secret)
    return {
        secret,
        decoded,
        unquote_plus(secret),
        quote(decoded, safe=""),
        quote(decoded, safe="+"),
        quote(decoded),
    }


def secrets_in(url: str | None) -> list[str]:
    """Every secret written in ``url`` (userinfo, secret query parameters, and those of a
    URL given as a parameter), in each form a message may show it, longest first: what
    :func:`scrub` removes from a message about that URL."""
    if not url or not isinstance(url, str):
        return []
    found: set[str] = set()
    try:
        parts = urlsplit(url)
    except ValueError:
        parts = None
    if parts is None and "@" in url:  # unparseable, but its userinfo is still a secret
        userinfo = url.split("://", 1)[-1].rpartition("@")[0]
        found |= {userinfo, *_variants(userinfo.partition(":")[2] or userinfo)}
    if parts is None or not parts.scheme or "://" not in url:
        for match in _KEY_VALUE.finditer(url):
            if is_secret_param(match["key"]):
                found |= _variants(match["value"].strip("'\""))
    else:
        userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
        user, colon, password = userinfo.partition(":")
        if colon and password:
            found |= _variants(password)
        if not colon and len(unquote(user)) >= MIN_USER_TOKEN:
            found |= _variants(user)  # a token written as the user: http://TOKEN@host
        for text in (parts.query, parts.fragment):
            for piece in text.split("&") if text else ():
                key, sep, value = piece.partition("=")
                if not sep:
                    continue
                if is_secret_param(key):
                    found |= _variants(value)
                elif "://" in unquote_plus(value):
                    found.update(secrets_in(unquote_plus(value)))
    return sorted((s for s in found if s and s != REDACTED), key=lambda s: (-len(s), s))


def scrub(text: str, secrets: list[str] | tuple[str, ...]) -> str:
    """``text`` with every one of ``secrets`` (see :func:`secrets_in`) replaced by ``***``,
    and the value of any ``password=…``-like pair too."""
    for secret in sorted(secrets, key=len, reverse=True):
        if secret:
            text = text.replace(secret, REDACTED)
    return _redact_text(text)


def scrub_exception(exc: BaseException, secrets: list[str] | tuple[str, ...]) -> None:
    """Blot ``secrets`` out of ``exc`` and of every exception it was raised from or during
    (a driver's, which may quote a DSN, a password or a token written as the user), in
    place: their ``args`` are what a traceback, ``str`` and ``repr`` show."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        args = current.args
        scrubbed = tuple(scrub(a, secrets) if isinstance(a, str) else a for a in args)
        if scrubbed != args:
            with contextlib.suppress(AttributeError, TypeError):  # read-only args
                current.args = scrubbed
        current = current.__cause__ or current.__context__


# -- schemes ------------------------------------------------------------------------------


def split(url: str) -> tuple[BackendEntry, SplitResult]:
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ConfigurationError(
            f"cannot parse URL {redact(url)!r}: {scrub(str(exc), secrets_in(url))}"
        ) from None
    scheme = parts.scheme.lower()
    entry = SCHEMES.get(scheme)
    if entry is None:
        supported = ", ".join(f"{s}://" for s in SCHEMES)
        shown = f"{scheme}://" if scheme else redact(url)
        raise ConfigurationError(
            f"unsupported URL scheme {shown!r} in {redact(url)!r}; supported schemes: {supported}"
        )
    return entry, parts


def missing_driver(entry: BackendEntry, exc: ImportError) -> ConfigurationError:
    hint = (
        f"pip install 'turnstile-locks[{entry.extra}]'"
        if entry.extra
        else "reinstall turnstile-locks"
    )
    return ConfigurationError(
        f"the {entry.description} backend needs a driver that is not installed "
        f"({exc.name or exc}); fix: {hint}"
    )
