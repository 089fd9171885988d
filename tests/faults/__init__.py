"""Fault tests across stores (issue 17): a TCP proxy (``proxy.py``) that drops or delays one
reply between a client and Redis or PostgreSQL, and what each operation must still do.

Store restarts under blocked waiters live with each store's other restart tests
(``tests/stores/redis/test_restart.py``, ``tests/stores/postgres/test_restart.py``). SQLite
has no server and no connection to lose: its faults are a killed or paused holder process
(``tests/contract/test_crash.py``). The HTTP service's restart is tested with the service.
"""
