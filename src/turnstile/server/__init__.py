"""The Turnstile HTTP service: API v1, a live dashboard and Prometheus metrics.

Install with ``pip install 'turnstile-locks[server]'`` and run ``turnstile serve``, or mount the
ASGI app yourself::

    from turnstile.server import ServerConfig, create_app
    app = create_app(ServerConfig(url="redis://localhost:6379/0"))

See docs/http.md. Importing this package is cheap; the web stack (Starlette) is imported
only when :func:`create_app` is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .auth import Principal, TokenTable
from .config import ServerConfig

if TYPE_CHECKING:
    from .app import Service, create_app

__all__ = ["Principal", "ServerConfig", "Service", "TokenTable", "create_app"]


def __getattr__(name: str) -> Any:
    if name in ("create_app", "Service"):
        from . import app

        return getattr(app, name)
    raise AttributeError(name)
