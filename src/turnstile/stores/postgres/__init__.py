"""Store-side code: see docs/architecture.md."""
