"""The SQLite store runs the reference state machine inside its transactions: with an
injected clock, every answer equals the model's, step for step. Plus what is SQLite's own:
tokens kept in the file, the schema version, a closed store."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from turnstile._core import lock_machine
from turnstile.errors import BackendUnavailable, ConfigurationError, InvalidArgument
from turnstile.stores.sqlite import lock_store as sqlite_store
from turnstile.stores.sqlite.lock_store import SCHEMA_VERSION, SQLiteStore


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Reference:
    """The model on plain Python objects, with one token counter for all names."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.states: dict[str, lock_machine.NameState] = {}
        self.last = 0

    def _tokens(self) -> lock_machine.Callable[[], int]:  # type: ignore[name-defined]
        now = self.clock()

        def next_token() -> int:
            self.last = lock_machine.clock_token(self.last, now)
            return self.last

        return next_token

    def state(self, name: str) -> lock_machine.NameState:
        return self.states.setdefault(name, lock_machine.NameState())

    def acquire(
        self, name: str, holder: str, limit: int, ttl: float, wait_ttl: float, enqueue: bool
    ) -> lock_machine.AcquireResult:
        result, _ = lock_machine.acquire(
            self.state(name),
            name=name,
            holder=holder,
            limit=limit,
            ttl=ttl,
            wait_ttl=wait_ttl,
            enqueue=enqueue,
            now=self.clock(),
            next_token=self._tokens(),
        )
        return result

    def release(self, name: str, holder: str, token: int | None) -> bool:
        released, _ = lock_machine.release(
            self.state(name),
            holder=holder,
            token=token,
            now=self.clock(),
            next_token=self._tokens(),
        )
        return released

    def renew(self, name: str, holder: str, token: int, ttl: float) -> lock_machine.Grant | None:
        return lock_machine.renew(
            self.state(name), name=name, holder=holder, token=token, ttl=ttl, now=self.clock()
        )

    def set_limit(self, name: str, limit: int) -> int | None:
        previous, _ = lock_machine.set_limit(
            self.state(name), limit=limit, now=self.clock(), next_token=self._tokens()
        )
        return previous

    def status(self, name: str) -> lock_machine.Status:
        return lock_machine.status(self.state(name), name=name, now=self.clock())


def _outcome(fn: Any, *args: Any) -> Any:
    """The answer, or the message of an InvalidArgument (a refused limit): equal on both."""
    try:
        return fn(*args)
    except InvalidArgument as exc:
        return ("refused", str(exc))


def _names_row_invariant(path: str) -> None:
    """A turnstile_names row exists exactly for names with holder or waiter rows (the store's
    _load relies on it to skip the other queries for an idle name)."""
    conn = sqlite3.connect(path)
    try:
        named = {r[0] for r in conn.execute("SELECT name FROM turnstile_names")}
        used = {
            r[0]
            for r in conn.execute(
                "SELECT name FROM turnstile_holders UNION SELECT name FROM turnstile_waiters"
            )
        }
    finally:
        conn.close()
    assert named == used


@pytest.mark.parametrize("returning", [True, False], ids=["update-returning", "select-update"])
def test_store_follows_the_model_step_for_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, returning: bool
) -> None:
    if returning and not sqlite_store.RETURNING:
        pytest.skip(f"SQLite {sqlite3.sqlite_version} has no UPDATE ... RETURNING")
    monkeypatch.setattr(sqlite_store, "RETURNING", returning)
    rng = random.Random(42)
    clock = Clock(1_700_000_000.0)
    path = str(tmp_path / "diff.db")
    store = SQLiteStore(path, clock=clock)
    ref = Reference(clock)
    names = ["n1", "{n2} 😀"]
    holders = [f"h{i}" for i in range(6)]
    tokens: dict[tuple[str, str], int] = {}
    seen: set[str] = set()  # kinds of answers met: the sequence must include refusals
    try:
        for step in range(1500):
            clock.now += rng.choice([0.0, 0.001, 0.05, 0.3, 1.0])
            name, holder = rng.choice(names), rng.choice(holders)
            op = rng.random()
            if op < 0.55:
                args = (
                    name,
                    holder,
                    rng.choice([1, 1, 2, 3]),
                    rng.choice([0.5, 1.0, 4.0]),
                    rng.choice([0.2, 1.0]),
                    rng.random() < 0.85,
                )
                got, want = _outcome(store.acquire, *args), _outcome(ref.acquire, *args)
                if isinstance(want, lock_machine.AcquireResult) and want.grant is not None:
                    tokens[(name, holder)] = want.grant.token
                seen.add("refused" if isinstance(want, tuple) else "answered")
            elif op < 0.6:
                limit = rng.choice([1, 2, 3])
                got, want = store.set_limit(name, limit), ref.set_limit(name, limit)
                seen.add("changed" if want is not None and want != limit else "unchanged")
            elif op < 0.85:
                token = tokens.get((name, holder)) if rng.random() < 0.7 else None
                if token is not None and rng.random() < 0.2:
                    token += 1
                got, want = store.release(name, holder, token), ref.release(name, holder, token)
            else:
                token = tokens.get((name, holder), 1)
                got = store.renew(name, holder, token, 1.0)
                want = ref.renew(name, holder, token, 1.0)
            assert got == want, f"step {step}"
            for n in names:
                assert store.status(n) == ref.status(n), f"step {step}, {n}"
            if step % 50 == 0:
                _names_row_invariant(path)
        _names_row_invariant(path)
        assert seen == {"refused", "answered", "changed", "unchanged"}
    finally:
        store.close()


def test_tokens_survive_reopening_even_with_a_clock_that_went_back(tmp_path: Path) -> None:
    path = str(tmp_path / "tokens.db")
    store = SQLiteStore(path, clock=Clock(2_000_000_000.0))
    first = store.acquire("n", "a", 1, 1.0, 1.0, True).grant
    assert first is not None
    store.close()
    store = SQLiteStore(path, clock=Clock(1_000_000_000.0))  # the host clock stepped back
    try:
        second = store.acquire("n2", "a", 1, 1.0, 1.0, True).grant
        assert second is not None and second.token == first.token + 1
    finally:
        store.close()


def test_wal_and_schema_version(tmp_path: Path) -> None:
    path = str(tmp_path / "schema.db")
    SQLiteStore(path).close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(ConfigurationError, match="newer than this release"):
        SQLiteStore(path)


def test_closed_store_raises_backend_unavailable(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "closed.db"))
    store.acquire("n", "a", 1, 1.0, 1.0, True)
    store.close()
    store.close()  # twice is harmless
    for call in (
        lambda: store.acquire("n", "b", 1, 1.0, 1.0, True),
        lambda: store.release("n", "a", None),
        lambda: store.status("n"),
        store.ping,
        store.data_version,
    ):
        with pytest.raises(BackendUnavailable, match="closed"):
            call()


def test_a_path_in_a_missing_folder_is_a_configuration_error(tmp_path: Path) -> None:
    # Retrying cannot help (issue 17): ConfigurationError naming the path, folder not made.
    path = str(tmp_path / "no-such-dir" / "x.db")
    with pytest.raises(ConfigurationError, match=r"no-such-dir/x\.db"):
        SQLiteStore(path)
    assert not (tmp_path / "no-such-dir").exists()


def test_a_file_that_is_not_a_database_is_a_configuration_error(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    path.write_bytes(b"not a database, not at all\n" * 200)
    with pytest.raises(ConfigurationError, match="is not a SQLite database") as info:
        SQLiteStore(str(path))
    assert isinstance(info.value.__cause__, sqlite3.Error)


def _open_at_once(path: str, barrier: object, results: object) -> None:
    barrier.wait()  # type: ignore[attr-defined]
    try:
        SQLiteStore(path).close()
        results.put("ok")  # type: ignore[attr-defined]
    except Exception as exc:  # reported to the test, which names it
        results.put(f"{type(exc).__name__}: {exc}")  # type: ignore[attr-defined]


def test_many_processes_open_a_new_file_at_once(tmp_path: Path) -> None:
    """Several workers starting together on a file nobody has opened yet all get in.

    Switching a new file to WAL makes SQLite answer "database is locked" at once, without
    its busy handler, to a second process doing the same; the store must wait and look
    again (this failed about one round in three before it did)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    for round_ in range(25):
        path = str(tmp_path / f"new-{round_}.db")
        barrier = ctx.Barrier(6)
        results = ctx.Queue()
        procs = [
            ctx.Process(target=_open_at_once, args=(path, barrier, results)) for _ in range(6)
        ]
        for proc in procs:
            proc.start()
        answers = [results.get(timeout=60) for _ in procs]
        for proc in procs:
            proc.join(timeout=60)
        assert answers == ["ok"] * 6, (round_, answers)
        with sqlite3.connect(path) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_new_files_get_small_pages_and_old_files_keep_theirs(tmp_path: Path) -> None:
    fresh = str(tmp_path / "fresh.db")
    SQLiteStore(fresh).close()
    with sqlite3.connect(fresh) as conn:
        assert conn.execute("PRAGMA page_size").fetchone()[0] == sqlite_store.PAGE_SIZE
    old = str(tmp_path / "old.db")
    with sqlite3.connect(old) as conn:  # a file made with 4 KiB pages, in WAL already
        conn.execute("PRAGMA page_size = 4096")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE unrelated (x)")
    store = SQLiteStore(old)
    try:
        grant = store.acquire("n", "a", 1, 5.0, 1.0, True).grant
        assert grant is not None
        assert store.release("n", "a", grant.token)
    finally:
        store.close()
    with sqlite3.connect(old) as conn:
        assert conn.execute("PRAGMA page_size").fetchone()[0] == 4096
        assert conn.execute("SELECT count(*) FROM unrelated").fetchone()[0] == 0


def test_queue_claim_walks_the_backlog_in_order_without_sorting_it(tmp_path: Path) -> None:
    """A claim takes the first due message that heads its key, in arrival order. It must walk
    the ready messages in seq order (index by_state), never fetch every due message and sort
    them: that cost 1.2 ms per claim with 3,000 waiting (a throughput bug, found by
    profiling). The plan is checked here; the speed is in benchmarks/results/queue.md."""
    from turnstile._core.records import NewMessage
    from turnstile.stores.sqlite.queue_store import SQLiteQueueStore

    store = SQLiteStore(str(tmp_path / "plan.db"))
    queues = SQLiteQueueStore(store)
    try:
        for i in range(300):
            message = NewMessage(f"m{i}", f"k{i % 7}", b"1", 0, 0.0, None, 5)
            queues.put("q", message, 300.0)
        statements: list[str] = []
        store._conn().set_trace_callback(statements.append)
        claimed = queues.claim("q", "receipt", 30.0, None, 5, None)
        store._conn().set_trace_callback(None)
        assert claimed.delivery is not None and claimed.delivery.id == "m0"
        (query,) = [s for s in statements if "ORDER BY seq LIMIT 1" in s and "NOT EXISTS" in s]
        plan = " | ".join(
            str(row[3]) for row in store._conn().execute("EXPLAIN QUERY PLAN " + query)
        )
        assert "turnstile_queue_by_state" in plan, plan
        assert "TEMP B-TREE" not in plan, plan
    finally:
        queues.close()
        store.close()


def test_a_forked_child_opens_its_own_connection(tmp_path: Path) -> None:
    """SQLite forbids using a connection carried across fork(): the child's first operation
    opens a new one, and the parent's stays open and untouched for the parent."""
    import os

    store = SQLiteStore(str(tmp_path / "fork.db"))
    try:
        parent_conn = store._conn()
        grant = store.acquire("n", "parent", 1, 5.0, 1.0, True).grant
        assert grant is not None
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                child_conn = store._conn()
                ok = child_conn is not parent_conn and store._all == [child_conn]
                result = store.acquire("n", "child", 1, 5.0, 1.0, False)
                code = 0 if ok and result.grant is None and store.status("n").holders else 3
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert store._conn() is parent_conn  # the parent's connection is still its own
        assert store.release("n", "parent", grant.token)
    finally:
        store.close()
