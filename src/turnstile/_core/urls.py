"""Backends are chosen by URL scheme and imported lazily, so ``pip install turnstile-locks``
stays light: a missing driver is reported with the ``pip install`` line that fixes it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit, urlunsplit

from ..errors import ConfigurationError

DEFAULT_URL = "sqlite:///turnstile.db"
ENV_VAR = "TURNSTILE_URL"


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


def resolve_url(url: str | None) -> str:
    if url is None or url == "":
        url = os.environ.get(ENV_VAR) or DEFAULT_URL
    if not isinstance(url, str):
        raise ConfigurationError(f"url must be a string, got {type(url).__name__}")
    return url


def redact(url: str) -> str:
    """The URL with any password replaced by ``***``, safe to print or log."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def split(url: str) -> tuple[BackendEntry, SplitResult]:
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ConfigurationError(f"cannot parse URL {redact(url)!r}: {exc}") from None
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
