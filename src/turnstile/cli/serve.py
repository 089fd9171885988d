"""``turnstile serve``: the HTTP API, live dashboard and Prometheus metrics over the store
(docs/http.md). Needs ``pip install 'turnstile-locks[server]'``; registering the command imports
nothing of the web stack."""

from __future__ import annotations

import argparse

from . import _support

EPILOG = """\
examples:
  turnstile serve                                     # 127.0.0.1:8080, no tokens
  turnstile serve --url redis://localhost:6379/0 --tokens tokens.toml --host 0.0.0.0

Without tokens it listens on loopback only. Then: http://127.0.0.1:8080/ (dashboard),
/openapi.json (API v1), /metrics, /healthz. Python clients connect with
turnstile.connect("http://127.0.0.1:8080", token=…).
exit codes: 0 stopped by SIGTERM/SIGINT; 2 bad arguments; 69 store unavailable;
71 cannot listen; 78 configuration (token file, no tokens on a public address, driver).
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from ..server.cli import add_arguments, run

    parser = _support.command_parser(
        subparsers,
        "serve",
        help="run the HTTP service, dashboard and metrics",
        description=(
            "Serve Turnstile over HTTP: API v1 for locks, semaphores and queues, a live\n"
            "dashboard, Prometheus metrics and a health check, over the store named by\n"
            "--url. The service keeps no state of its own: run as many instances as you\n"
            "like on one Redis or PostgreSQL."
        ),
        epilog=EPILOG,
    )
    add_arguments(parser)
    parser.set_defaults(handler=run)
