"""``python -m turnstile``: the same command line as the ``turnstile`` script."""

from turnstile.cli import main

if __name__ == "__main__":  # spawned demo workers import this module as __mp_main__
    raise SystemExit(main())
