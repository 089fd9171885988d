"""The async source of Turnstile. ``turnstile/_sync`` is generated from it by
``scripts/unasync.py`` (CI runs ``--check``); only ``_compat.py`` is written by hand in both."""
