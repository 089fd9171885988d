"""The benchmarks still run, and the harness computes its numbers right.

No performance assertions here (performance is measured in benchmarks/, never asserted):
each ``benchmarks/bench_*.py`` runs once with ``--quick`` in a subprocess and must finish and
print its results; the harness's metrics are checked on hand-made intervals.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
SKIP_EXIT = 77  # a bench script's way of saying "my server is not configured here"

# The scripts run with benchmarks/ on sys.path; so does this test, to import their package.
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

import turnstile_bench as h  # noqa: E402

# -- the scripts ----------------------------------------------------------------------------
SCRIPTS = sorted(BENCHMARKS.glob("bench_*.py"))


def test_there_is_a_benchmark() -> None:
    assert any(p.name == "bench_sqlite.py" for p in SCRIPTS)


# A quick run takes 35 to 125 s on the CI machine (bench_admission the longest), more when
# the machine is busy: the bound is there to catch a hang, not to time the run.
QUICK_RUN_LIMIT = 400


@pytest.mark.slow
@pytest.mark.timeout(QUICK_RUN_LIMIT + 20)
@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_quick_run_completes(script: Path, tmp_path: Path) -> None:
    output = tmp_path / "results.md"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            str(script),
            "--quick",
            "--json",
            "--output",
            str(output),
            "--tmpdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=QUICK_RUN_LIMIT,
        cwd=ROOT,
        env=env,
    )
    if proc.returncode == SKIP_EXIT:
        pytest.skip(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "skipped")
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout)
    assert results["machine"]["python"]
    text = output.read_text("utf-8")
    assert f"python benchmarks/{script.name}" in text.split("- command: `", 1)[1]
    check = CHECKS.get(script.stem, _check_lock_bench)
    check(results, text)
    # Plots beside the results file, each linked from it; nothing else left behind.
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs, "no plot drawn"
    for name in pngs:
        assert name.startswith("results-") and f"]({name})" in text
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["results.md", *pngs])


def _check_lock_bench(results: dict, text: str) -> None:
    assert results["uncontended"] and all(r["ops_per_s"] > 0 for r in results["uncontended"])
    assert results["handover"] and all(r["grants"] > 0 for r in results["handover"])
    assert results["webhooks"] and all(
        r["events"] > 0 for group in results["webhooks"] for r in group
    )
    tables = [line for line in text.splitlines() if line.startswith("| lock |")]
    assert len(tables) >= 3, text
    for label in {r["label"] for r in results["uncontended"]}:
        assert f"| {label} |" in text
    # The store's CPU per operation, where the contender's probe reads it (a Redis server's
    # INFO cpu, a PostgreSQL cluster on this machine): a column of its own, never negative.
    server = [r["server_us"] for r in results["uncontended"] if r["server_us"] is not None]
    assert all(us >= 0 for us in server)
    assert ("server CPU µs / op" in text) == bool(server)


def _check_postgres_bench(results: dict, text: str) -> None:
    _check_lock_bench(results, text)
    if not os.environ.get("TURNSTILE_BENCH_POSTGRES_URL"):
        # Its own throwaway cluster runs here: every row with a probe reads its CPU.
        assert all(r["server_us"] is not None for r in results["uncontended"])


def _check_queue(results: dict, text: str) -> None:
    # Its own scenarios: webhooks by queue/lock, throughput beside the peers.
    assert {r["how"] for r in results["webhooks"]} == {"by lock", "by queue"}
    assert results["throughput"] and all(r["per_second"] > 0 for r in results["throughput"])
    assert "## Reading the results" in text
    queues = {(r["store"], r["queue"], bool(r["keys"])) for r in results["throughput"]}
    if any(store == "redis" for store, _, _ in queues):
        assert ("redis", "turnstile", True) in queues
        assert ("redis", "Dramatiq (RedisBroker)", False) in queues
    if any(store == "postgres" for store, _, _ in queues):
        assert ("postgres", "procrastinate", True) in queues  # jobs with a lock per key
        assert ("postgres", "procrastinate", False) in queues


def _check_http(results: dict, text: str) -> None:
    rates = results["rates"]
    assert {r["clients"] for r in rates} == {1, 8}
    assert {r["label"].split(" ")[0] for r in rates} == {"in-process", "HTTP"}
    assert all(r["per_second"] > 0 and r["pairs"] > 0 for r in rates)
    http = [r for r in rates if r["label"].startswith("HTTP")]
    assert all(r["service_cpu_s"] is not None and r["service_cpu_s"] >= 0 for r in http)
    assert results["handover"] and all(r["grants"] > 0 and r["overlaps"] == 0
                                       for r in results["handover"])
    assert "What bounds it" in text


def _check_scale(results: dict, text: str) -> None:
    stores = {r["store"] for r in results["lines"]}
    assert "sqlite" in stores
    for store in stores:
        sizes = sorted(r["waiters"] for r in results["lines"] if r["store"] == store)
        assert sizes[0] == 2 and sizes[-1] > 2
    assert all(r["grants"] > 0 and r["p50_ms"] > 0 for r in results["lines"])
    for r in results["names"]:
        assert r["live_after"] == r["live_before"] == 0, r  # names used once: no entry stays
        assert r["ops_per_s"] > 0 and r["bytes_per_held_name"] > 0
    assert "## Reading the results" in text


def _check_workflows(results: dict, text: str) -> None:
    rows = {r["label"]: r for r in results["rows"]}
    assert any(label.startswith("callback") for label in rows)
    assert any(label.startswith("ListExecutions") for label in rows)
    for row in rows.values():
        assert row["succeeded"] == row["executions"] > 0
        assert row["makespan_s"] > 0 and row["ideal_s"] > 0
        assert row["aws_calls_per_execution"] > 0
    callback = next(r for label, r in rows.items() if label.startswith("callback"))
    assert callback["max_working"] <= results["limit"]
    # A callback waiter asks once and is resumed once: its semaphore part does not grow
    # with how long it waited (the polling rows do).
    assert callback["semaphore_transitions_max"] == 2
    assert "local emulator" in text and "## Against the targets" in text


def _check_admission(results: dict, text: str) -> None:
    rows = results["rows"]
    bound = results["spec"]["rate"] + results["spec"]["burst"]
    ran = [r for r in rows if r["available"]]
    assert {(r["label"], r["callers"]) for r in ran} >= {
        ("turnstile sqlite", 8), ("turnstile sqlite", 64),
        ("limits moving window, memory (1 process)", 8),
    }
    for r in rows:
        if not r["available"]:
            assert r["note"]  # a row that could not run here says why
            continue
        assert r["admissions"] > 0 and 0 < r["counted"] <= r["admissions"]
        assert r["window_bound"] == bound and r["max_in_window"] >= 1
        assert r["excess"] == max(0, r["max_in_window"] - bound)
        assert r["steps_per_admission"] >= 1
        assert r["fifo_violations"] >= 0
        assert f"| {r['label']} | {r['callers']} |" in text
        if r["label"].startswith("turnstile"):
            # The guarantee, from the store's own admission times (correctness, not speed).
            assert r["excess"] == 0, r
            assert r["certain_fifo_violations"] is not None
        if r["store"] == "redis":
            assert r["redis_commands_per_admission"] > 0
        if r["library"] == "dbos":
            # Shape only: DBOS's own stamps, its line (enqueue order), its SQL counted.
            assert r["certain_fifo_violations"] is not None
            assert r["transactions_per_admission"] > 0
            assert r["to_start_p50_ms"] > 0 and r["result_p50_ms"] >= 0
            assert r["late_p50_ms"] >= 0 and 0 <= r["waited"] <= r["admissions"]
            assert r["max_in_window_wall"] >= 1
    # DBOS rows for each caller count: measured, or saying why not (no dbos, no PostgreSQL).
    dbos = [r for r in rows if r["library"] == "dbos"]
    assert {r["callers"] for r in dbos} == {r["callers"] for r in rows}
    assert all(r["store"] == "postgres" and r["label"].startswith("DBOS") for r in dbos)
    assert "## Against the targets" in text and "## DBOS" in text
    if any(r["available"] for r in dbos):
        assert "DBOS Transact" in text and "SQL statements / admission" in text
    else:
        assert "Not measured in this run: " + dbos[0]["note"] in text


CHECKS = {
    "bench_postgres": _check_postgres_bench,
    "bench_admission": _check_admission,
    "bench_queue": _check_queue,
    "bench_http": _check_http,
    "bench_scale": _check_scale,
    "bench_workflows": _check_workflows,
}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_run_all_regenerates_results_and_plots(tmp_path: Path) -> None:
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "run_all.py"), "--quick", "--only", "sqlite",
         "--results", str(results), "--tmpdir", str(tmp_path)],
        capture_output=True, text=True, timeout=110, cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    text = (results / "sqlite.md").read_text("utf-8")
    pngs = sorted(p.name for p in results.glob("sqlite-*.png"))
    assert {"sqlite-handover.png", "sqlite-uncontended.png", "sqlite-webhooks.png"} <= set(pngs)
    assert all(f"]({name})" in text for name in pngs)
    assert "sqlite" in proc.stderr and "ok" in proc.stderr
    bad = subprocess.run([sys.executable, str(BENCHMARKS / "run_all.py"), "--only", "nope"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bad.returncode != 0 and "no benchmark named nope" in bad.stderr


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_stopped_run_cleans_up_after_itself(tmp_path: Path) -> None:
    """SIGTERM to ``run_all.py`` while a script runs: the script is stopped the same way and
    unwinds (here: its scratch folder of database and lock files is removed), and both exit
    with 128 + SIGTERM, where the signal's default would have left everything behind."""
    proc = subprocess.Popen(
        [sys.executable, str(BENCHMARKS / "run_all.py"), "--quick", "--only", "sqlite",
         "--results", str(tmp_path / "results"), "--tmpdir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 100
        while not list(tmp_path.glob("turnstile-bench-*")):  # the script's scratch folder
            assert proc.poll() is None and time.monotonic() < deadline, "never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=130)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert not list(tmp_path.glob("turnstile-bench-*")), "the scratch folder was left behind"


# -- the harness's numbers --------------------------------------------------------------------
def test_percentile_interpolates() -> None:
    assert h.percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.5
    assert h.percentile([5.0], 99) == 5.0
    assert h.percentile(list(map(float, range(101))), 99) == 99.0
    assert math.isnan(h.percentile([], 50))


def test_overlaps_and_streaks() -> None:
    assert h.count_overlaps([(0, 1), (1, 2), (2.5, 3)]) == 0
    assert h.count_overlaps([(0, 10), (1, 2), (3, 4), (11, 12)]) == 2
    assert h.longest_streak([1, 1, 2, 2, 2, 1]) == 3
    assert h.longest_streak([]) == 0


def g(pid: int, wait: float, start: float, end: float) -> object:
    return h.Grant(pid, wait, start, end)


def test_fifo_violations() -> None:
    fair = [g(1, 0.0, 0.0, 1.0), g(2, 0.1, 1.0, 2.0), g(3, 0.2, 2.0, 3.0), g(1, 1.0, 3.0, 4.0)]
    assert h.fifo_violations(fair) == 0
    # pid 1 releases at 1.0, asks again at once and takes it back before 2 and 3.
    unfair = [g(1, 0.0, 0.0, 1.0), g(2, 0.1, 2.0, 3.0), g(3, 0.2, 3.0, 4.0), g(1, 1.0, 1.0, 2.0)]
    assert h.fifo_violations(unfair) == 1
    # Within the tolerance the order of two requests is not judged.
    close = [g(1, 0.0, 0.0, 1.0), g(2, 0.5, 2.0, 3.0), g(3, 0.5005, 1.0, 2.0)]
    assert h.fifo_violations(close, tolerance=0.001) == 0
    assert h.fifo_violations(close, tolerance=0.0) == 1


def test_certain_fifo_violations() -> None:
    def q(pid: int, wait: float, queued: float, start: float, end: float) -> object:
        return h.Grant(pid, wait, start, end, queued)

    # A lock that never confirms a place in line: nothing to check.
    assert h.certain_fifo_violations([g(1, 0.0, 0.0, 1.0), g(2, 0.1, 1.0, 2.0)]) is None
    # pid 2 was confirmed in line at 0.2; pid 3 asked at 0.5 and went first: certain.
    overtaken = [
        q(1, 0.0, math.nan, 0.0, 1.0),
        q(2, 0.1, 0.2, 2.0, 3.0),
        q(3, 0.5, 0.6, 1.0, 2.0),
    ]
    assert h.certain_fifo_violations(overtaken) == 1
    # pid 3 asked at 0.15, before pid 2's place was confirmed (0.2): the two requests may have
    # crossed on the way to the store, so going first is no certain violation, although the
    # call-time heuristic counts it (2 asked 0.05 s earlier).
    crossed = [
        q(1, 0.0, math.nan, 0.0, 1.0),
        q(2, 0.1, 0.2, 2.0, 3.0),
        q(3, 0.15, 0.3, 1.0, 2.0),
    ]
    assert h.certain_fifo_violations(crossed) == 0
    assert h.fifo_violations(crossed) == 1
    assert h.handover_metrics(overtaken)["certain_fifo_violations"] == 1


def test_handover_metrics() -> None:
    grants = [g(1, 0.0, 0.0, 1.0), g(2, 0.0, 1.002, 2.0), g(2, 2.0, 2.0, 3.0), g(1, 0.5, 3.004, 4)]
    m = h.handover_metrics(grants)
    assert (m["grants"], m["handovers"], m["to_other"]) == (4, 3, 2)
    assert m["longest_streak"] == 2
    assert m["fifo_violations"] == 1  # pid 2 asked at 2.0, after pid 1 (0.5), but went first
    assert m["overlaps"] == 0
    assert m["gap_p50_ms"] == pytest.approx(3.0)


def test_scenarios_and_the_fifo_bound() -> None:
    demo = h.WebhookScenario.parse("RA1,RA2,RB1,RB2,RB3")
    assert [a.order for a in demo.arrivals] == ["A", "A", "B", "B", "B"]
    # 3 workers: A1 | A2 waits for A1 | B1; then B2, B3 waits for B2 -> 3 units = ideal.
    assert h.fifo_bound(demo, 3, 1.0) == 3.0
    assert h.ideal_makespan(demo, 3, 1.0) == 3.0
    # 2 workers: the worker holding B3 waits behind B2, so 4 units against an ideal of 3.
    assert h.fifo_bound(demo, 2, 1.0) == 4.0
    one = h.WebhookScenario.random(20, 10, seed=1)
    assert len(one.arrivals) == 200 and one == h.WebhookScenario.random(20, 10, seed=1)
    assert one != h.WebhookScenario.random(20, 10, seed=2)
    # The perfect lock's efficiency on 20 x 10 random webhooks over 8 workers is about 0.8.
    effs = [
        h.ideal_makespan(s, 8, 1.0) / h.fifo_bound(s, 8, 1.0)
        for s in (h.WebhookScenario.random(20, 10, seed=k) for k in range(30))
    ]
    assert 0.75 < sum(effs) / len(effs) < 0.9
    spaced = h.WebhookScenario.random(2, 2, seed=1, spacing=10.0)
    assert h.fifo_bound(spaced, 4, 1.0) == 31.0 == h.ideal_makespan(spaced, 4, 1.0)


def test_webhook_metrics() -> None:
    H = h.Handled
    events = [
        H(0, "A", 1, 0.0, 0.0, 1.0),
        H(1, "A", 2, 0.0, 2.0, 3.0),  # arrived before index 2, ran after it
        H(2, "A", 3, 0.5, 1.0, 2.0),  # ... and its worker asked later: the lock's fault
        H(3, "B", 1, 0.0, 0.0, 1.0),
        H(4, "B", 2, 0.0, 0.5, 1.5),  # overlaps B's first webhook
        H(5, "C", 3, 0.0, math.nan, math.nan, "TimeoutError()"),
    ]
    m = h.webhook_metrics(events)
    assert m["order_violations"] == 1
    assert m["lock_fifo_violations"] == 1
    assert m["certain_lock_fifo_violations"] is None  # no lock confirmation recorded
    assert m["overlaps"] == 1
    assert m["order_gap_p50_ms"] == pytest.approx(0.0)


def test_server_cpu_is_counted_per_process_and_never_negative() -> None:
    from turnstile_bench.adapters import cpu_since

    before = {10: 1.0, 11: 2.0, 12: 5.0}
    # 10 ran 0.5 s more, 11 ended (left out), 13 started (all of its 0.25 s), 12's pid now
    # belongs to a new process with less CPU than the old one had (counted from 0).
    now = {10: 1.5, 12: 0.125, 13: 0.25}
    assert cpu_since(before, now) == 0.5 + 0.125 + 0.25
    assert cpu_since({}, {}) == 0.0
    assert cpu_since(now, now) == 0.0


def test_markdown_and_json() -> None:
    table = h.markdown_table(["lock", "x"], [["a", 1.234], ["b", math.nan]])
    assert table.splitlines() == ["| lock | x |", "|---|---:|", "| a | 1.23 |", "| b | - |"]
    assert json.loads(h.to_json({"v": math.nan, "g": h.Grant(1, 0.0, 1.0, 2.0)})) == {
        "v": None,
        "g": {"pid": 1, "wait_start": 0.0, "start": 1.0, "end": 2.0, "queued": None},
    }


def test_the_webhooks_and_their_ideal_are_the_demos() -> None:
    from turnstile import demo

    scenario = h.WebhookScenario.random(3, 2, seed=4, spacing=0.01, work=0.5)
    expected = demo.arrival_schedule([2, 2, 2], gap=0.01, work=0.5, arrival="shuffled", seed=4)
    assert list(scenario.arrivals) == expected
    assert h.ideal_makespan(scenario, 2) == demo.ideal_makespan(expected, 2).seconds
    parsed = h.WebhookScenario.parse(h.scenarios.demo_notation())
    assert [(w.id, w.order, w.seq) for w in parsed.arrivals] == [
        (w.id, w.order, w.seq) for w in demo.arrival_schedule()
    ]


def test_plots_are_drawn_from_the_results_and_linked(tmp_path: Path) -> None:
    from turnstile_bench import plots
    from turnstile_bench.scenarios import ThroughputRow

    def handover(label: str, procs: int, p50: float) -> h.HandoverResult:
        return h.HandoverResult(label, procs, 2.0, 10, 9, 9, 1.0, p50, p50, p50, 1, 0, 1.0, 0,
                                1.0)

    results = {
        "handover": [handover("a", 3, 1.0), handover("a", 9, 2.0), handover("b", 3, 5.0)],
        "uncontended": [h.UncontendedResult("a", 10, 1.0, 10.0, 0.1, 0.2)],
        "throughput": [ThroughputRow("redis", "q", 10, 2, 100.0, 50.0, 1.0, 2.0)],
        "figures": [plots.Figure("extra", "t", "x", "y", [1, 2], {"s": [1.0, math.nan]},
                                 kind="line")],
    }
    figures = plots.figures(results)
    assert [f.slug for f in figures] == ["handover", "uncontended", "throughput", "latency",
                                         "extra"]
    # Hand-over by waiters (processes - 1), one line per lock, a gap where one is missing.
    assert figures[0].x == [2, 8] and figures[0].kind == "line"
    assert figures[0].series["a"] == [1.0, 2.0] and math.isnan(figures[0].series["b"][1])
    drawn = plots.draw(results, tmp_path / "r.md")
    names = sorted(p.name for _, p in drawn)
    assert names == sorted(f"r-{f.slug}.png" for f in figures)
    assert all((tmp_path / n).read_bytes()[:4] == b"\x89PNG" for n in names)
    links = plots.markdown_links(drawn)
    assert all(f"]({n})" in links for n in names) and "## Plots" in links
    assert plots.markdown_links([]) == ""


def test_handover_trials_are_interleaved_and_the_median_one_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real worker processes on a SQLite file: with trials, each lock runs that many times
    and its row is the trial of median p50; a lock slower than REPEAT_BELOW_MS in its first
    trial runs once (here: every lock, with the bound at 0)."""
    import functools

    from turnstile_bench import scenarios

    url = f"sqlite:///{tmp_path / 'locks.db'}"
    fast = h.Contender("turnstile sqlite", functools.partial(h.TurnstileLock, url))
    [r] = h.run_handover([fast], processes=2, rounds=4, hold=0.001, trials=3)
    assert len(r.trials) == 3 and r.grants == 8
    assert r.gap_p50_ms == sorted(r.trials)[1]
    table = h.handover_table([r])
    assert "p50 per trial" in table and " / ".join(h.fmt(t) for t in r.trials) in table
    assert "trial of median p50 out of 3" in h.handover_trials_note([r])

    monkeypatch.setattr(scenarios, "REPEAT_BELOW_MS", 0.0)
    [once] = h.run_handover([fast], processes=2, rounds=4, hold=0.001, trials=3)
    assert len(once.trials) == 1
    assert h.handover_trials_note([once]) == ""
    assert "p50 per trial" not in h.handover_table([once])


def test_a_miss_is_never_printed_as_a_tie() -> None:
    assert h.fmt_against(0.95, 0.947) == 3  # "0.947", not "0.95", beside the target 0.95
    assert h.fmt_against(0.46, 0.4612, 0.5) == 3
    assert h.fmt_against(0.5, 0.6) == 2
    assert h.fmt_against(0.95, 0.95) == 2  # a true tie stays a tie
