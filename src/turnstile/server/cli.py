"""``turnstile serve``: run the HTTP service (needs ``pip install 'turnstile-locks[server]'``).

    turnstile serve [--url URL] [--host 127.0.0.1] [--port 8080] [--tokens FILE]

Also runnable as ``python -m turnstile.server``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from .._core.urls import (
    DEFAULT_DESCRIPTION,
    default_url,
    redact,
    resolve_url,
    scrub,
    secrets_in,
)
from ..errors import ConfigurationError, TurnstileError
from .config import (
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_HEADER_TIMEOUT,
    DEFAULT_KEEP_ALIVE,
    DEFAULT_MAX_BODY,
    DEFAULT_MAX_BODY_MEMORY,
    DEFAULT_MAX_HEADER_BYTES,
    DEFAULT_MAX_WAIT,
    DEFAULT_METRICS_NAMES,
    DEFAULT_OBSERVE_INTERVAL,
    MAX_METRICS_NAMES,
)

# The same codes as every `turnstile` command (docs/cli.md), plus one for the socket.
EXIT_USAGE = 2  # bad arguments
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: the store cannot be reached
EXIT_OSERR = 71  # EX_OSERR: cannot listen on --host/--port
EXIT_CONFIG = 78  # EX_CONFIG: bad token file; no tokens on a non-loopback address


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``serve`` to the ``turnstile`` command line."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "serve",
        help="run the HTTP service, dashboard and metrics",
        description="Serve the Turnstile HTTP API (/v1), a live dashboard (/), Prometheus "
        "metrics (/metrics) and /healthz over the store named by --url. Keeps no state of "
        "its own: run as many instances as you like on one Redis or PostgreSQL.",
    )
    add_arguments(parser)
    parser.set_defaults(func=run, handler=run)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    if not any("--url" in action.option_strings for action in parser._actions):
        parser.add_argument(
            "--url",
            default=None,
            help="store URL (default: $TURNSTILE_URL, else one SQLite file per user and "
            f"host: {_default_store()})",
        )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)"
    )
    parser.add_argument(
        "--port", type=int, default=8080, help="port; 0 picks a free one (default: 8080)"
    )
    parser.add_argument(
        "--tokens",
        metavar="FILE",
        default=None,
        help="bearer tokens, TOML or JSON (default: $TURNSTILE_TOKENS_FILE, else the document "
        "in $TURNSTILE_TOKENS; without tokens the service only listens on loopback)",
    )
    parser.add_argument(
        "--max-wait",
        type=float,
        default=DEFAULT_MAX_WAIT,
        metavar="S",
        help=f"longest long poll a request may ask for (default: {DEFAULT_MAX_WAIT:g})",
    )
    parser.add_argument(
        "--max-body",
        type=int,
        default=DEFAULT_MAX_BODY,
        metavar="BYTES",
        help=f"largest request body (default: {DEFAULT_MAX_BODY})",
    )
    parser.add_argument(
        "--header-timeout",
        type=float,
        default=DEFAULT_HEADER_TIMEOUT,
        metavar="S",
        help="close a connection whose request headers take longer than this, from its "
        f"opening or its previous answer (default: {DEFAULT_HEADER_TIMEOUT:g})",
    )
    parser.add_argument(
        "--body-timeout",
        type=float,
        default=DEFAULT_BODY_TIMEOUT,
        metavar="S",
        help="answer 408 to a request whose body takes longer than this after its headers "
        f"(default: {DEFAULT_BODY_TIMEOUT:g})",
    )
    parser.add_argument(
        "--keep-alive",
        type=float,
        default=DEFAULT_KEEP_ALIVE,
        metavar="S",
        help=f"close an idle kept-alive connection after this (default: {DEFAULT_KEEP_ALIVE:g})",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=None,
        metavar="N",
        help="answer 503 overloaded (with Retry-After) to connections beyond N "
        "(default: half of the open-file limit, ulimit -n)",
    )
    parser.add_argument(
        "--max-body-memory",
        type=int,
        default=DEFAULT_MAX_BODY_MEMORY,
        metavar="BYTES",
        help="bytes all request bodies being read may hold together; beyond: 503 overloaded "
        f"(default: {DEFAULT_MAX_BODY_MEMORY})",
    )
    parser.add_argument(
        "--max-header-bytes",
        type=int,
        default=DEFAULT_MAX_HEADER_BYTES,
        metavar="BYTES",
        help=f"largest request line and headers (default: {DEFAULT_MAX_HEADER_BYTES})",
    )
    parser.add_argument(
        "--observe-interval",
        type=float,
        default=DEFAULT_OBSERVE_INTERVAL,
        metavar="S",
        help="seconds between background looks that notice expiries (0: off; default: 2)",
    )
    parser.add_argument(
        "--queue",
        metavar="NAME",
        action="append",
        default=[],
        help="a queue to show on the dashboard and in /metrics even while it is empty "
        "(repeatable; every queue that holds messages is shown anyway)",
    )
    parser.add_argument(
        "--ready-file",
        metavar="FILE",
        default=None,
        help="write the service's base URL to FILE once it listens (for scripts and tests)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="log level (default: info)",
    )
    parser.add_argument(
        "--no-access-log", action="store_true", help="do not log every request"
    )
    parser.add_argument(
        "--log-format",
        default="text",
        choices=["text", "json"],
        help="text lines, or one JSON object per line for access and service logs "
        "(default: text)",
    )
    parser.add_argument(
        "--metrics-names",
        type=_metrics_names,
        default=DEFAULT_METRICS_NAMES,
        metavar="N",
        help="per-name holders/waiters gauges in /metrics for at most N names: the first N "
        f"held or awaited, in code-point order (0 to {MAX_METRICS_NAMES}; 0: none; "
        f"default: {DEFAULT_METRICS_NAMES})",
    )
    parser.add_argument(
        "--callback-secret-file",
        metavar="FILE",
        default=None,
        help="the shared secret that signs HTTP callback grants (HMAC-SHA256, header "
        f"X-Turnstile-Signature), read from FILE (default: ${SECRET_ENV}; without a secret "
        "the service accepts Step Functions callbacks only)",
    )
    parser.add_argument(
        "--callback-hosts",
        metavar="HOST[,HOST]",
        action="append",
        default=None,
        help="the only hosts HTTP callback URLs may name (repeatable; '.example.com' also "
        f"admits subdomains; default: ${HOSTS_ENV}, else any public host: loopback, private "
        "and link-local addresses are refused)",
    )
    parser.add_argument(
        "--no-deliver",
        action="store_true",
        help="run no deliverer: callback grants wait for another one on the same store "
        "(turnstile deliver, another instance)",
    )
    parser.add_argument(
        "--proxy-headers",
        action="store_true",
        help="trust X-Forwarded-For/-Proto from --forwarded-allow-ips (behind a TLS proxy)",
    )
    parser.add_argument(
        "--forwarded-allow-ips",
        default="127.0.0.1",
        metavar="IPS",
        help="proxies trusted with --proxy-headers (default: 127.0.0.1)",
    )


def _default_store() -> str:
    try:
        return default_url()
    except ConfigurationError:
        return f"sqlite:///{DEFAULT_DESCRIPTION}"


SECRET_ENV = "TURNSTILE_CALLBACK_SECRET"
HOSTS_ENV = "TURNSTILE_CALLBACK_HOSTS"
MIN_SECRET_BYTES = 16
QUIET_LOGGERS = ("boto3", "botocore", "s3transfer", "urllib3")


def _callback_secret(path: str | None) -> bytes | None:
    """The callback secret: the file's content (surrounding whitespace stripped), else
    ``$TURNSTILE_CALLBACK_SECRET``. Raises ConfigurationError (never quoting the secret)."""
    if path is None:
        value = os.environ.get(SECRET_ENV, "").strip()
        return _strong(value.encode("utf-8"), f"${SECRET_ENV}") if value else None
    try:
        secret = Path(path).read_bytes().strip()
    except OSError as exc:
        raise ConfigurationError(
            f"cannot read --callback-secret-file {path!r}: {exc.strerror or exc}"
        ) from None
    if not secret:
        raise ConfigurationError(f"--callback-secret-file {path!r} is empty")
    return _strong(secret, f"--callback-secret-file {path!r}")


def _strong(secret: bytes, where: str) -> bytes:
    if len(secret) < MIN_SECRET_BYTES:
        raise ConfigurationError(
            f"the callback secret of {where} is {len(secret)} bytes; use at least "
            f"{MIN_SECRET_BYTES} (e.g. openssl rand -hex 32)"
        )
    return secret


def _callback_hosts(given: list[str] | None) -> tuple[str, ...]:
    texts = given if given is not None else [os.environ.get(HOSTS_ENV, "")]
    return tuple(h.strip() for text in texts for h in text.split(",") if h.strip())


# The secrets of the store URL being served: blotted out of every message and log line.
_SECRETS: list[str] = []


def _metrics_names(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if not 0 <= value <= MAX_METRICS_NAMES:
        raise argparse.ArgumentTypeError(
            f"must be between 0 and {MAX_METRICS_NAMES}, got {value}"
        )
    return value


def _fail(message: str, code: int = EXIT_USAGE) -> int:
    print(f"turnstile serve: error: {scrub(message, _SECRETS)}", file=sys.stderr)
    return code


class _ScrubbingFormatter(logging.Formatter):
    """Wraps a handler's formatter: what it writes, with the store URL's secrets blotted
    out (a traceback or a driver's message may quote them)."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        return scrub(self.inner.format(record), _SECRETS)


def _scrub_logs(*names: str) -> None:
    for name in names:
        for handler in logging.getLogger(name or None).handlers:
            if not isinstance(handler.formatter, _ScrubbingFormatter):
                handler.setFormatter(_ScrubbingFormatter(handler.formatter))


def _bind(host: str, port: int) -> socket.socket:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    sock.bind(address)
    sock.set_inheritable(True)
    return sock


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from ..aio import connect
        from .app import create_app
        from .auth import TokenTable, is_loopback
        from .bounds import default_max_connections, install_repeat_filter, protocol_class
        from .config import ServerConfig
    except ImportError as exc:
        return _fail(
            f"the HTTP service needs {exc.name or 'its dependencies'}; "
            "fix: pip install 'turnstile-locks[server]'",
            EXIT_CONFIG,
        )
    try:
        url = resolve_url(getattr(args, "url", None))
    except ConfigurationError as exc:
        return _fail(str(exc), EXIT_CONFIG)
    _SECRETS[:] = secrets_in(url)
    try:
        callback_secret = _callback_secret(args.callback_secret_file)
    except ConfigurationError as exc:
        return _fail(str(exc), EXIT_CONFIG)
    if callback_secret is not None:
        # Blotted out of every message and log line, like the store URL's password.
        _SECRETS.append(callback_secret.decode("utf-8", "replace"))
    try:
        tokens = TokenTable.load(args.tokens)
    except ConfigurationError as exc:
        return _fail(str(exc), EXIT_CONFIG)
    for warning in tokens.warnings:
        print(f"turnstile serve: warning: {warning}", file=sys.stderr)
    if tokens.open and not is_loopback(args.host):
        return _fail(
            f"refusing to listen on {args.host!r} without tokens: anyone who can reach it "
            "could take and release every lock. Give --tokens FILE (or $TURNSTILE_TOKENS), "
            "or listen on 127.0.0.1",
            EXIT_CONFIG,
        )
    if not 0 <= args.port <= 65535:
        return _fail(f"--port must be 0 to 65535, got {args.port}")
    try:
        config = ServerConfig(
            url=getattr(args, "url", None),
            tokens=tokens,
            max_wait=args.max_wait,
            max_body=args.max_body,
            observe_interval=args.observe_interval,
            queues=tuple(args.queue),
            header_timeout=args.header_timeout,
            body_timeout=args.body_timeout,
            keep_alive=args.keep_alive,
            max_connections=args.max_connections,
            max_body_memory=args.max_body_memory,
            max_header_bytes=args.max_header_bytes,
            metrics_max_names=args.metrics_names,
            callback_secret=callback_secret,
            deliver=not args.no_deliver,
            callback_hosts=_callback_hosts(args.callback_hosts),
        )
    except TurnstileError as exc:
        return _fail(str(exc))

    async def main() -> int:
        try:
            client = await connect(url)
            await client.ping()
        except ConfigurationError as exc:
            return _fail(f"cannot open the store {redact(url)}: {exc}", EXIT_CONFIG)
        except TurnstileError as exc:
            return _fail(f"cannot open the store {redact(url)}: {exc}", EXIT_UNAVAILABLE)
        try:
            sock = _bind(args.host, args.port)
        except OSError as exc:
            await client.close()
            return _fail(
                f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", EXIT_OSERR
            )
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        base = f"http://{shown}:{port}"
        app = create_app(config, client)
        loop = asyncio.get_running_loop()
        service = app.state.service

        class Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: Any) -> None:
                super().handle_exit(sig, frame)
                # End long polls at once rather than after the graceful-shutdown timeout.
                loop.call_soon_threadsafe(service.begin_shutdown)

        server = Server(
            uvicorn.Config(
                app,
                log_level=args.log_level,
                access_log=not args.no_access_log,
                timeout_graceful_shutdown=3,
                server_header=False,
                proxy_headers=args.proxy_headers,
                forwarded_allow_ips=args.forwarded_allow_ips,
                http=protocol_class(
                    header_timeout=config.header_timeout,
                    max_connections=config.max_connections or default_max_connections(),
                ),
                timeout_keep_alive=config.keep_alive,  # type: ignore[arg-type]
                h11_max_incomplete_event_size=config.max_header_bytes,
                **log_options,
            )
        )
        _scrub_logs("", "uvicorn", "uvicorn.error", "uvicorn.access")  # configured just now
        # One line per kind of error, not one per occurrence, when something repeats fast.
        install_repeat_filter()

        async def watch() -> None:
            while not server.started:
                if server.should_exit:
                    return
                await asyncio.sleep(0.01)
            auth = f"{len(tokens)} token(s)" if not tokens.open else "no tokens (loopback only)"
            logging.getLogger("turnstile.server").warning(
                "serving %s on %s with %s; dashboard %s/, API %s/openapi.json",
                redact(url), base, auth, base, base,
            )
            if args.ready_file:
                path = Path(args.ready_file)
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_text(base + "\n", "utf-8")
                os.replace(tmp, path)

        notice = loop.create_task(watch())
        # uvicorn re-raises the SIGTERM/SIGINT that stopped it once it has shut down; with
        # these handlers restored by then, that is a no-op and a requested stop exits 0.
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda sig, frame: None)
        try:
            await server.serve(sockets=[sock])
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, signal.SIG_DFL if signum == signal.SIGTERM
                              else signal.default_int_handler)
            notice.cancel()
            sock.close()
            await client.close()
        return 0

    log_options: dict[str, Any] = {}
    if args.log_format == "json":
        from .observe import JsonFormatter, json_log_config

        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
        logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
        log_options["log_config"] = json_log_config(args.log_level)
    else:
        logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s: %(message)s")
    _scrub_logs("")
    # The AWS SDK and urllib3 log request parameters and URLs at DEBUG: a callback's task
    # token or URL. They log nothing below INFO here, whatever --log-level says.
    for name in QUIET_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(max(logging.INFO, logging.getLogger().getEffectiveLevel()))
    return asyncio.run(main())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="turnstile serve", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))
