"""Decisions with no I/O: validation, models, the reference state machine, URLs, timing."""
