"""Bearer tokens: who may read, write and administer which names.

Tokens come from a TOML or JSON file (``turnstile serve --tokens FILE``, or
``$TURNSTILE_TOKENS_FILE``) or from ``$TURNSTILE_TOKENS`` holding the same document inline::

    [[tokens]]
    name = "tenant-a"                 # a label for logs, the dashboard and /v1/whoami
    secret = "…32+ random ASCII characters…"   # or: sha256 = "<hex digest of the secret>"
    prefixes = ["tenant-a:"]          # names this token may see and touch (default: all)
    read_only = false                 # true: status, listings, dashboard only
    admin = false                     # true: admin actions (force release, requeue dead letters)

A token may see and touch a name (a lock, a semaphore or a queue) only if the name starts
with one of its prefixes at a separator (see :func:`prefix_matches`): listings, the
dashboard, events and per-queue metrics are filtered the same way, so one tenant never
learns another's names. Presented tokens are hashed and compared with every configured
digest in constant time (:func:`hmac.compare_digest`, no early exit). Without any token
configured the service is open (every request acts as the ``anonymous`` admin) and refuses
to listen on anything but a loopback address.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
import socket
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError

MIN_SECRET_LENGTH = 16
GOOD_SECRET_LENGTH = 32  # below this, a secret is accepted with a warning
ENV_TOKENS = "TURNSTILE_TOKENS"
ENV_TOKENS_FILE = "TURNSTILE_TOKENS_FILE"
_KEYS = {"name", "secret", "sha256", "prefixes", "read_only", "admin"}


@dataclass(frozen=True, slots=True)
class Principal:
    """What one caller may do."""

    name: str
    prefixes: tuple[str, ...] = ("",)
    read_only: bool = False
    admin: bool = False

    def can_read(self, name: str) -> bool:
        return any(prefix_matches(p, name) for p in self.prefixes)

    def can_write(self, name: str) -> bool:
        return not self.read_only and self.can_read(name)

    def listing_prefixes(self, prefix: str) -> list[str]:
        """The store prefixes to list so that exactly the names starting with ``prefix`` that
        this principal may read are found (none when the two cannot overlap)."""
        found: set[str] = set()
        for mine in self.prefixes:
            if prefix.startswith(mine):
                found.add(prefix)
            elif mine.startswith(prefix):
                found.add(mine)
        # A prefix already covered by a shorter one adds nothing.
        return sorted(p for p in found if not any(q != p and p.startswith(q) for q in found))

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "prefixes": list(self.prefixes),
            "read_only": self.read_only,
            "admin": self.admin,
        }


def is_separator(char: str) -> bool:
    """Whether ``char`` separates the parts of a name: anything but a letter or a digit."""
    return not char.isalnum()


def prefix_matches(prefix: str, name: str) -> bool:
    """Whether a token's ``prefix`` covers ``name``: the name starts with it *at a
    separator*. A prefix ending in a separator (``"team1:"``) covers every name starting with
    it; one that does not (``"team1"``) covers ``team1`` itself and names that continue with
    a separator (``team1:x``, ``team1/x``), never ``team10:x``. ``""`` covers every name."""
    if not name.startswith(prefix):
        return False
    if not prefix or len(name) == len(prefix) or is_separator(prefix[-1]):
        return True
    return is_separator(name[len(prefix)])


ANONYMOUS = Principal("anonymous", ("",), read_only=False, admin=True)


@dataclass(frozen=True, slots=True)
class _Entry:
    digest: bytes
    principal: Principal


class TokenTable:
    """The configured tokens. Empty means the service is open (loopback only)."""

    def __init__(
        self, entries: Iterable[tuple[bytes, Principal]] = (), warnings: Iterable[str] = ()
    ) -> None:
        self._entries = tuple(_Entry(d, p) for d, p in entries)
        # What is accepted but risky in the configuration (never a secret): `serve` shows them.
        self.warnings = tuple(warnings)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def open(self) -> bool:
        return not self._entries

    def authenticate(self, presented: str | None) -> Principal | None:
        """The principal of a presented secret, or ``None``. Constant time in the secret:
        every configured digest is compared, with no early exit."""
        if self.open:
            return ANONYMOUS
        if not presented:
            return None
        try:
            # A header value arrives as its bytes read as Latin-1: these are the bytes sent.
            raw = presented.encode("latin-1")
        except UnicodeEncodeError:
            raw = presented.encode("utf-8", "surrogatepass")
        digest = hashlib.sha256(raw).digest()
        found: Principal | None = None
        for entry in self._entries:
            if hmac.compare_digest(digest, entry.digest):
                found = entry.principal
        return found

    @classmethod
    def from_document(cls, document: Any, source: str) -> TokenTable:
        if isinstance(document, Mapping):
            unknown = set(document) - {"tokens"}
            if unknown:
                raise ConfigurationError(
                    f"{source}: unknown top-level key(s) {sorted(unknown)}; expected 'tokens'"
                )
            document = document.get("tokens", [])
        if not isinstance(document, list):
            raise ConfigurationError(f"{source}: 'tokens' must be a list of tables")
        entries: list[tuple[bytes, Principal]] = []
        warnings: list[str] = []
        names: set[str] = set()
        digests: set[bytes] = set()
        for index, item in enumerate(document):
            where = f"{source}: tokens[{index}]"
            if not isinstance(item, Mapping):
                raise ConfigurationError(f"{where} must be a table")
            unknown = set(item) - _KEYS
            if unknown:
                raise ConfigurationError(
                    f"{where}: unknown key(s) {sorted(unknown)}; accepted: {sorted(_KEYS)}"
                )
            name = item.get("name")
            if not isinstance(name, str) or not name:
                raise ConfigurationError(f"{where}: 'name' must be a non-empty string")
            if name in names:
                raise ConfigurationError(f"{where}: duplicate token name {name!r}")
            names.add(name)
            digest = _digest(item, where)
            secret = item.get("secret")
            if isinstance(secret, str) and len(secret) < GOOD_SECRET_LENGTH:
                warnings.append(
                    f"{where} ({name!r}): its secret is {len(secret)} characters; use at least "
                    f"{GOOD_SECRET_LENGTH} random ones (python -c 'import secrets; "
                    "print(secrets.token_urlsafe(32))')"
                )
            if digest in digests:
                raise ConfigurationError(f"{where}: the same secret is configured twice")
            digests.add(digest)
            prefixes = item.get("prefixes", [""])
            if (
                not isinstance(prefixes, list)
                or not prefixes
                or not all(isinstance(p, str) for p in prefixes)
            ):
                raise ConfigurationError(
                    f"{where}: 'prefixes' must be a non-empty list of strings "
                    '(use [""] for every name)'
                )
            flags = {}
            for flag in ("read_only", "admin"):
                value = item.get(flag, False)
                if not isinstance(value, bool):
                    raise ConfigurationError(f"{where}: {flag!r} must be true or false")
                flags[flag] = value
            for prefix in dict.fromkeys(prefixes):
                if prefix and not is_separator(prefix[-1]):
                    warnings.append(
                        f"{where} ({name!r}): prefix {prefix!r} does not end with a separator: "
                        f"it covers {prefix!r} and names continuing with one "
                        f"({prefix + ':'!r}…), not {prefix + '0'!r}…; write {prefix + ':'!r} "
                        "to say so"
                    )
            principal = Principal(name, tuple(dict.fromkeys(prefixes)), **flags)
            entries.append((digest, principal))
        return cls(entries, warnings)

    @classmethod
    def load(cls, path: str | None = None, environ: Mapping[str, str] | None = None) -> TokenTable:
        """Tokens from ``path``, else ``$TURNSTILE_TOKENS_FILE``, else ``$TURNSTILE_TOKENS``
        (inline TOML or JSON), else none."""
        env = os.environ if environ is None else environ
        path = path or env.get(ENV_TOKENS_FILE) or None
        if path is not None:
            try:
                text = Path(path).read_text("utf-8")
            except OSError as exc:
                raise ConfigurationError(
                    f"cannot read the token file {path!r}: {exc.strerror or exc}"
                ) from None
            return cls.from_document(_parse(text, path, json_first=path.endswith(".json")), path)
        inline = env.get(ENV_TOKENS)
        if inline:
            return cls.from_document(_parse(inline, f"${ENV_TOKENS}", json_first=True), ENV_TOKENS)
        return cls()


def _digest(item: Mapping[str, Any], where: str) -> bytes:
    secret = item.get("secret")
    hashed = item.get("sha256")
    if (secret is None) == (hashed is None):
        raise ConfigurationError(f"{where}: give exactly one of 'secret' or 'sha256'")
    if secret is not None:
        if not isinstance(secret, str) or len(secret) < MIN_SECRET_LENGTH:
            raise ConfigurationError(
                f"{where}: 'secret' must be a string of at least {MIN_SECRET_LENGTH} characters "
                "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        if not secret.isascii() or not secret.isprintable() or secret != secret.strip():
            # HTTP header values are not reliably UTF-8 (they arrive as Latin-1 text), so a
            # secret beyond printable ASCII would match or not depending on the client.
            raise ConfigurationError(
                f"{where}: 'secret' must be printable ASCII without surrounding spaces (a "
                "header value); e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'"
            )
        return hashlib.sha256(secret.encode("ascii")).digest()
    try:
        digest = bytes.fromhex(hashed) if isinstance(hashed, str) else b""
    except ValueError:
        digest = b""
    if len(digest) != 32:
        raise ConfigurationError(
            f"{where}: 'sha256' must be 64 hex digits (sha256 of the secret's UTF-8 bytes)"
        )
    return digest


def _parse(text: str, source: str, *, json_first: bool) -> Any:
    parsers = [_json, _toml] if json_first or text.lstrip().startswith(("[", "{")) else [_toml]
    errors = []
    for parser in parsers:
        try:
            return parser(text)
        except ValueError as exc:
            errors.append(str(exc))
    raise ConfigurationError(f"cannot parse {source} as TOML or JSON: {errors[-1]}")


def _json(text: str) -> Any:
    return json.loads(text)


def _toml(text: str) -> Any:
    return tomllib.loads(text)


def is_loopback(host: str) -> bool:
    """Whether ``host`` only ever names this machine (127.0.0.0/8, ::1, localhost)."""
    host = host.strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    if host.lower() == "localhost":
        return True
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def is_loopback_host_header(value: str) -> bool:
    """Whether an HTTP ``Host`` header names this machine *literally* (a loopback address,
    ``localhost`` or a ``*.localhost`` name), without asking DNS: a name that merely resolves
    to 127.0.0.1 is how DNS rebinding reaches a loopback service from a web page."""
    host = value.strip().lower()
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else host[1:]
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None
