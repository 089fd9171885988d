"""The Turnstile HTTP service: API v1, a live dashboard and Prometheus metrics.

Install with ``pip install 'turnstile[server]'`` and run ``turnstile serve``, or mount the
ASGI app yourself::

    from turnstile.server import ServerConfig, create_app
    app = create_app(ServerConfig(url="redis://localhost:6379/0"))

See docs/http.md.
"""

from __future__ import annotations

from .app import ServerConfig, Service, create_app
from .auth import Principal, TokenTable

__all__ = ["Principal", "ServerConfig", "Service", "TokenTable", "create_app"]
