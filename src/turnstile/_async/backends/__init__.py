"""Backends: one module per store, each implementing :class:`~.base.AsyncBackend`."""
