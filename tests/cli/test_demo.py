"""`turnstile demo` end to end (real worker processes), and the scenario's judging functions."""

from __future__ import annotations

import io
import itertools
import json
import re
from pathlib import Path

import pytest

from turnstile import demo
from turnstile.demo import EventRecord, Webhook, render

from ._invoke import run

pytestmark = pytest.mark.timeout(120)


def test_demo_with_default_settings_keeps_order_and_runs_orders_in_parallel() -> None:
    result = run("demo", timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for hook in ("RA1", "RA2", "RB1", "RB2", "RB3"):
        assert re.search(rf"\+\s*\d+\.\d+s\s+{hook} arrived", out), hook  # progress lines
        assert re.search(rf"{hook} started on worker \d+, token \d+", out), hook
        assert re.search(rf"{hook} done", out), hook
    timeline = out[out.index("timeline") : out.index("summary")]
    # Dots (waiting longer than half a column, e.g. on a busy machine) are allowed.
    assert re.search(r"order A\s+\.*RA1=+\.*RA2=+\n", timeline), timeline
    assert re.search(r"order B\s+\.*RB1=+\.*RB2=+\.*RB3=+\n", timeline), timeline
    summary = out[out.index("summary") :]
    kept = re.search(r"order kept within each order:\s+(\w+), (\d+) violations", summary)
    assert kept is not None and kept.groups() == ("yes", "0")
    assert re.search(r"orders in parallel:\s+yes, up to 2 orders at once", summary)
    makespan = re.search(r"makespan:\s+([\d.]+) s; ideal ([\d.]+) s \(efficiency (\d+)%\)", summary)
    assert makespan is not None
    spent, ideal = float(makespan.group(1)), float(makespan.group(2))
    assert ideal == pytest.approx(0.08 + 3 * 0.3)  # RB1 arrives at 80 ms, then 3 x 300 ms
    assert spent >= ideal
    assert re.search(r"handover latency:\s+p50 [\d.]+ ms, max [\d.]+ ms over 3 handovers", summary)


def _check_report(report: dict[str, object], orders: int, per_order: int) -> None:
    """Check the raw events independently of the demo's own summary."""
    events = report["events"]
    assert isinstance(events, list) and len(events) == orders * per_order
    for order, group in itertools.groupby(
        sorted(events, key=lambda e: (e["order"], e["started"])), key=lambda e: e["order"]
    ):
        runs = list(group)
        assert [e["seq"] for e in runs] == list(range(1, per_order + 1)), order
        for a, b in itertools.pairwise(runs):
            assert a["ended"] <= b["started"], (a, b)  # one at a time
            assert a["token"] < b["token"], (a, b)  # fencing tokens grow
    summary = report["summary"]
    assert isinstance(summary, dict)
    assert summary["ok"] is True and summary["order_violations"] == 0
    assert summary["completed"] == orders * per_order and summary["failed"] == 0
    assert summary["orders_in_parallel"] is True
    assert summary["makespan"] >= summary["ideal"] > 0


def test_demo_json_report_with_configured_sizes() -> None:
    result = run(
        "demo",
        "--orders",
        "3",
        "--events-per-order",
        "3",
        "--work-ms",
        "80",
        "--gap-ms",
        "10",
        "--arrival",
        "interleaved",
        "--workers",
        "6",
        "--json",
        timeout=90,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)  # nothing but JSON on stdout
    assert report["scenario"]["events_per_order"] == [3, 3, 3]
    assert report["scenario"]["workers"] == 6
    assert report["url"].startswith("sqlite:///")
    _check_report(report, orders=3, per_order=3)


def test_demo_on_a_given_url_uses_its_own_names(url: str) -> None:
    result = run("demo", "--url", url, "--events", "2,2", "--work-ms", "50", "--json", timeout=90)
    assert result.returncode == 0, result.stderr
    _check_report(json.loads(result.stdout), orders=2, per_order=2)
    path = Path(url.removeprefix("sqlite:///"))
    assert path.exists()
    # Released afterwards; names were prefixed so they cannot clash with real ones.
    assert json.loads(run("status", "--url", url, "--json").stdout)["names"] == []
    assert json.loads(run("status", "--url", url, "order:A", "--json").stdout)["holders"] == []


def test_demo_refuses_a_store_private_to_one_process() -> None:
    result = run("demo", "--url", "memory://")
    assert result.returncode == 2
    assert "memory:// is private to one process" in result.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--events", "2,x"], "--events: must be comma-separated counts, each 1 to 100"),
        (["--events", "0"], "--events: must be comma-separated counts"),
        (["--orders", "3", "--events", "2,3"], "--orders 3 does not match --events 2,3"),
        (["--orders", "0"], "--orders: must be between 1 and 200"),
        (["--workers", "0"], "--workers: must be between 1 and 64"),
        (["--work-ms", "-5"], "--work-ms: must be between 0 and 60000 milliseconds"),
        (["--events", "2", "--events-per-order", "2"], "not allowed with"),
        (["--orders", "20", "--events-per-order", "100"], "at most 1000 events"),
    ],
)
def test_demo_bad_arguments(args: list[str], expected: str) -> None:
    result = run("demo", *args)
    assert result.returncode == 2
    assert expected in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1


# -- the scenario's functions, on hand-made records ----------------------------------------


def test_default_schedule_is_the_spec_example() -> None:
    schedule = demo.arrival_schedule()
    assert [w.id for w in schedule] == ["RA1", "RA2", "RB1", "RB2", "RB3"]
    assert [w.arrival for w in schedule] == pytest.approx([0, 0.04, 0.08, 0.12, 0.16])
    interleaved = demo.arrival_schedule([2, 3], arrival="interleaved")
    assert [w.id for w in interleaved] == ["RA1", "RB1", "RA2", "RB2", "RB3"]


def test_shuffled_schedule_keeps_each_orders_sequence() -> None:
    one = demo.arrival_schedule([4, 4, 4], arrival="shuffled", seed=7)
    assert one == demo.arrival_schedule([4, 4, 4], arrival="shuffled", seed=7)
    assert [w.id for w in one] != [w.id for w in demo.arrival_schedule([4, 4, 4])]
    for order in "ABC":
        assert [w.seq for w in one if w.order == order] == [1, 2, 3, 4]


def test_order_labels() -> None:
    labels = demo.order_labels(28)
    assert labels[:3] == ["A", "B", "C"] and labels[25:] == ["Z", "AA", "AB"]


def _record(hook: str, start: float, end: float, token: int, asked: float = 0.0) -> EventRecord:
    order, seq = hook[1:-1], int(hook[-1])
    webhook = Webhook(hook, order, seq, asked, end - start)
    return EventRecord(webhook, 1, hook, token, asked, asked, start, end)


def test_violations_found_in_bad_runs_and_none_in_good_ones() -> None:
    good = [_record("RA1", 0.0, 0.3, 1), _record("RA2", 0.3, 0.6, 2), _record("RB1", 0.1, 0.4, 5)]
    assert demo.order_violations(good) == []
    swapped = [_record("RA2", 0.0, 0.3, 1), _record("RA1", 0.3, 0.6, 2)]
    assert [v.kind for v in demo.order_violations(swapped)] == ["order"]
    overlap = [_record("RA1", 0.0, 0.3, 1), _record("RA2", 0.2, 0.5, 2)]
    assert [v.kind for v in demo.order_violations(overlap)] == ["overlap"]
    stale = [_record("RA1", 0.0, 0.3, 2), _record("RA2", 0.3, 0.6, 2)]
    assert [str(v) for v in demo.order_violations(stale)] == [
        "RA2's fencing token is not larger than RA1's"
    ]


def test_ideal_is_the_longest_chain_or_the_worker_capacity() -> None:
    schedule = demo.arrival_schedule([2, 3], gap=0.04, work=0.3)
    chain = demo.ideal_makespan(schedule, workers=5)
    assert chain.seconds == pytest.approx(0.08 + 0.9) and "order B" in chain.reason
    capacity = demo.ideal_makespan(demo.arrival_schedule([1, 1, 1, 1], work=0.3), workers=2)
    assert capacity.seconds == pytest.approx(0.6) and "2 workers" in capacity.reason


def test_handovers_parallelism_and_makespan() -> None:
    records = [
        _record("RA1", 0.0, 0.3, 1, asked=0.0),
        _record("RA2", 0.302, 0.6, 2, asked=0.04),  # waited: a handover of 2 ms
        _record("RB1", 0.1, 0.4, 3, asked=0.1),
        _record("RB2", 0.9, 1.0, 4, asked=0.8),  # asked after RB1 ended: no handover
    ]
    assert demo.handover_latencies(records) == pytest.approx([0.002])
    most, together = demo.parallelism(records)
    assert most == 2 and together == pytest.approx(0.2 + 0.098)
    schedule = [r.webhook for r in records]
    assert demo.makespan(records, schedule) == pytest.approx(1.0)
    lines = demo.render_timeline(records, schedule, width=50)
    assert lines[2].startswith("order A") and "RA1" in lines[2] and "RA2" in lines[2]
    assert lines[3].startswith("order B") and "RB2" in lines[3]
    assert all(len(line) <= 12 + 50 for line in lines[2:])


# -- what the demo prints: text for people, never Python's -------------------------------

NOT_FOR_PEOPLE = re.compile(r"\bNone\b|object at 0x|\w+\(\w+=")  # None, reprs of objects


@pytest.mark.parametrize("variant", [[], ["--queue"]], ids=["locks", "queue"])
def test_demo_output_has_no_python_none_or_reprs(variant: list[str]) -> None:
    result = run("demo", *variant, "--events", "2,2", "--work-ms", "60", timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "summary" in out and "timeline" in out
    assert "None" not in out and "object at 0x" not in out, out
    assert not NOT_FOR_PEOPLE.search(out + result.stderr), out
    if variant:
        assert "workers waiting on a turn" in out
        assert "token" not in out  # a queue's turn has no fencing token to show


def test_failures_and_violations_are_shown_as_text() -> None:
    """The paths a healthy run does not take: failed webhooks (one no worker reported back
    on), violations, events without a token."""
    records = [_record("RA2", 0.0, 0.3, 2), _record("RA1", 0.2, 0.5, 1)]
    schedule = [*(r.webhook for r in records), Webhook("RB1", "B", 1, 0.1, 0.3)]
    failures = [
        demo.Failure(schedule[2], None, "not finished within 1 s"),
        demo.Failure(records[0].webhook, 3, "LeaseLost: lost"),
    ]
    result = demo.ScenarioResult(schedule, records, failures, 2, 0.5)
    summary = demo.summarize(result)
    assert not summary.ok
    out = io.StringIO()
    progress = render.ProgressLines(out)
    for update in [
        demo.Update("arrived", schedule[0], 0.0),
        demo.Update("started", schedule[0], 0.01, 1, None),
        demo.Update("started", schedule[1], 0.5, 2, 7),
        demo.Update("failed", schedule[2], 1.0, None, None, "not finished within 1 s"),
        demo.Update("ended", schedule[0], 0.3, 1, None),
    ]:
        progress.update(update)
    board = render.LiveBoard(out, schedule)
    board.update(demo.Update("failed", schedule[2], 1.0))
    board.finish()
    for tokens, wait in [(True, None), (False, 0.25)]:
        lines = render.render_report(
            records, schedule, summary, width=40, waiting="w", tokens=tokens, worker_wait=wait
        )
        out.write("\n".join(lines) + "\n")
    text = out.getvalue()
    assert "RB1 FAILED: not finished within 1 s" in text
    assert "order kept within each order:  NO, 3 violations" in text
    assert "failed webhooks:               2" in text
    assert "handover latency:" in text and "workers waiting on a turn:     0.250 s" in text
    assert not NOT_FOR_PEOPLE.search(text), text
