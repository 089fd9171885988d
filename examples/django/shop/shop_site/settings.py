"""Minimal settings: one app, no database (the command needs none)."""

import os

SECRET_KEY = "example-only-not-secret"
DEBUG = False
ALLOWED_HOSTS: list[str] = []
INSTALLED_APPS = ["orders"]
DATABASES: dict[str, dict[str, str]] = {}
USE_TZ = True

# The Turnstile store shared by every host that runs the command (None: $TURNSTILE_URL, else
# the per-user SQLite file $XDG_STATE_HOME/turnstile/turnstile.db on this host).
TURNSTILE_URL = os.environ.get("TURNSTILE_URL")
