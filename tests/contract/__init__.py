"""The contract suite: every SPEC guarantee, checked on every backend row of tests/backends.py.

Each test takes the ``backend`` fixture (a URL private to the test). Scenarios that need other
processes run ``tests/contract/lock_worker.py`` in real OS processes, each with its own
``turnstile.connect(url)``; for ``memory://``, which lives in one process, the same scenarios
run in threads on the test's client, and only what needs a separate process (kill -9,
SIGSTOP) is skipped. Results are checked from recorded data (intervals, tokens, grant
order, times on ``time.monotonic()``, one clock for all processes of a Linux host).

SPEC guarantee -> tests

1 Safety         test_safety: lock sections never overlap (8 processes, half on the async
                 API, plus a racy file counter), semaphore bound kept and used (peak == limit,
                 also in status() sampled meanwhile), bound under renewal;
                 test_async: tasks never overlap, semaphore bound.
2 FIFO           test_fifo: lock / semaphore grant in arrival order, killed waiter loses its
                 place; test_tickets: place kept while asking, lapses when not, lapsed waiter
                 rejoins at the back, unclaimed grant lapses; test_async: async FIFO.
3 Leases         test_crash: renewal keeps the lease, explicit renew extends on the store,
                 expiry reported by status, abandoned lease expires after ttl (not before).
4 Fencing        test_fencing: every grant, across processes, after reopening the store;
                 tokens checked in time order by every safety test.
5 Release/renew  test_release: double release, stale token (also from another process),
                 expired lease, unknown holder, renew of released/lost lease, release by
                 holder from another process.
6 Crash recovery test_crash: killed holder replaced within ttl + 1 s; abandoned lease.
7 No polling     test_wakeup: waiters woken by the hand-over (faster than their heartbeat),
                 a release wakes only the admitted waiter, waiting does not spin the CPU.
8 Lost leases    test_crash: paused (SIGSTOP) holder replaced by a larger token and, resumed,
                 sees lease.lost, its on_lost callback and LeaseLost from its with block;
                 lost lease never silent; store refuses a renewal; test_async: the same async.

API surface: test_acquire (timeout leaves no entry, timeout 0, acquire_nowait, lease fields),
test_tickets (try_acquire positions, idempotence, release from another process),
test_decorators (sequential/limited, sync and async, wrong kind refused),
test_arguments (every bad argument -> InvalidArgument; odd names work and stay separate),
test_async (the async API, cancellation leaves the line and leaks no grant).
"""
