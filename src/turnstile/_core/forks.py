"""Clients that cross ``os.fork()``.

A client created before a fork (gunicorn ``--preload``, Celery's prefork pool,
``multiprocessing`` with the fork start method) is copied into the child with every socket
and SQLite handle it had open. Those belong to the parent: the child must neither use them
(its requests would interleave with the parent's on the same connection) nor close them
(closing a PostgreSQL connection sends the server a Terminate message on the parent's
socket, and SQLite's close may touch the parent's locks). So a backend notes the
:func:`generation` it opened its connections in and, on its first use in a child, opens new
ones and hands the inherited ones to :func:`abandon`, which keeps them referenced, never
closed, for the life of the child.
"""

from __future__ import annotations

import os

_generation = 0
_abandoned: list[object] = []


def generation() -> int:
    """How many forks separate this process from the one that imported Turnstile: a value
    that changes in every forked child, cheap enough to check on every operation."""
    return _generation


def abandon(*resources: object) -> None:
    """Keep a parent's connections alive and untouched in this child: never used, never
    closed, never garbage-collected (a collected connection would close itself)."""
    _abandoned.extend(resources)


def _after_fork_in_child() -> None:
    global _generation
    _generation += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
