"""I/O-free parts of the HTTP service: tokens, prefixes, metrics text, observed events."""

from __future__ import annotations

import hashlib
import hmac
import re

import pytest

from turnstile import ConfigurationError
from turnstile._core.records import Grant, HolderInfo, Status
from turnstile.server.auth import (
    ANONYMOUS,
    Principal,
    TokenTable,
    bearer,
    is_loopback,
    is_loopback_host_header,
)
from turnstile.server.metrics import Gauge, Metrics
from turnstile.server.observe import EventLog, Tracker


def test_listing_prefixes_cover_exactly_the_readable_names() -> None:
    p = Principal("t", ("a:", "b:x"))
    assert p.listing_prefixes("") == ["a:", "b:x"]
    assert p.listing_prefixes("a:1") == ["a:1"]
    assert p.listing_prefixes("b:") == ["b:x"]
    assert p.listing_prefixes("c:") == []
    assert Principal("t", ("", "a:")).listing_prefixes("q") == ["q"]
    assert Principal("t", ("a", "ab")).listing_prefixes("") == ["a"]
    names = ["a:1", "a:2", "b:x1", "b:x:1", "b:x", "b:y", "c:1", "", "a"]
    for prefix in ["", "a", "a:", "b:", "b:x", "b:x1", "b:x:", "z"]:
        # The store lists by plain prefix; `listed` (server/common.py) keeps what can_read.
        listed = {
            n for lp in p.listing_prefixes(prefix) for n in names
            if n.startswith(lp) and p.can_read(n)
        }
        expected = {n for n in names if n.startswith(prefix) and p.can_read(n)}
        assert listed == expected, prefix
    # A prefix matches at a separator only: "b:x" covers b:x and b:x:1, never b:x1.
    assert p.can_read("b:x") and p.can_read("b:x:1") and p.can_read("b:x/1")
    assert not p.can_read("b:x1") and not p.can_read("b:xy")


def test_principal_permissions() -> None:
    reader = Principal("r", ("a:",), read_only=True)
    assert reader.can_read("a:x") and not reader.can_write("a:x")
    assert not reader.can_read("b:x")
    assert ANONYMOUS.can_write("anything") and ANONYMOUS.admin


def test_token_table_authenticates_by_secret_or_digest() -> None:
    secret = "0123456789abcdef-secret"
    other = "another-secret-of-enough-length"
    table = TokenTable.from_document(
        {"tokens": [
            {"name": "plain", "secret": secret, "prefixes": ["a:"]},
            {"name": "hashed", "sha256": hashlib.sha256(other.encode()).hexdigest(),
             "read_only": True},
        ]},
        "test",
    )
    assert len(table) == 2 and not table.open
    assert table.authenticate(secret) == Principal("plain", ("a:",))
    assert table.authenticate(other) == Principal("hashed", ("",), read_only=True)
    for wrong in (None, "", secret + "x", secret[:-1], other.upper()):
        assert table.authenticate(wrong) is None
    assert TokenTable().authenticate(None) is ANONYMOUS


def test_authentication_compares_with_hmac_compare_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every configured digest is compared (no early exit) with compare_digest."""
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr("turnstile.server.auth.hmac.compare_digest", spy)
    table = TokenTable.from_document(
        [{"name": f"t{i}", "secret": f"secret-number-{i:04d}"} for i in range(5)], "test"
    )
    assert table.authenticate("secret-number-0000") is not None
    assert len(calls) == 5
    calls.clear()
    assert table.authenticate("nope-nope-nope-nope") is None
    assert len(calls) == 5


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('tokens = "x"', "must be a list"),
        ("[[tokens]]\nname = 'a'\nsecret = 'short'", "at least 16"),
        ("[other]\nx = 1", "unknown top-level key"),
        ("not toml at all [", "cannot parse"),
    ],
)
def test_token_documents_are_checked(text: str, message: str, tmp_path: object) -> None:
    import pathlib

    path = pathlib.Path(str(tmp_path)) / "tokens.toml"
    path.write_text(text)
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        TokenTable.load(str(path), environ={})


def test_tokens_load_from_toml_file_env_file_or_inline_env(tmp_path: object) -> None:
    import pathlib

    path = pathlib.Path(str(tmp_path)) / "tokens.toml"
    path.write_text('[[tokens]]\nname = "ops"\nsecret = "ops-secret-0123456789"\nadmin = true\n')
    assert TokenTable.load(str(path), environ={}).authenticate("ops-secret-0123456789") == (
        Principal("ops", admin=True)
    )
    from_env_file = TokenTable.load(None, environ={"TURNSTILE_TOKENS_FILE": str(path)})
    assert len(from_env_file) == 1
    inline = TokenTable.load(
        None, environ={"TURNSTILE_TOKENS": '[{"name": "x", "secret": "inline-secret-0123"}]'}
    )
    assert inline.authenticate("inline-secret-0123") == Principal("x")
    assert TokenTable.load(None, environ={}).open
    with pytest.raises(ConfigurationError, match="cannot read the token file"):
        TokenTable.load(str(path) + ".missing", environ={})


def test_loopback_and_bearer_parsing() -> None:
    for host in ("127.0.0.1", "127.5.5.5", "::1", "[::1]", "localhost"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "10.0.0.1", "192.168.1.1", "example.invalid"):
        assert not is_loopback(host), host
    for header in ("127.0.0.1:8080", "localhost", "LOCALHOST:1", "[::1]:8080", "::1",
                   "app.localhost:80", "127.9.9.9"):
        assert is_loopback_host_header(header), header
    for header in ("evil.example:8080", "localhost.evil.example", "10.0.0.1", "", "[::2]:80",
                   "0.0.0.0:8080", "127.0.0.1.nip.io"):
        assert not is_loopback_host_header(header), header
    assert bearer("Bearer abc") == "abc" and bearer("bearer   abc ") == "abc"
    assert bearer("Basic abc") is None and bearer("Bearer") is None and bearer(None) is None


def test_metrics_text_format() -> None:
    metrics = Metrics()
    metrics.inc("grants", 3)
    metrics.wait.observe(0.003)
    metrics.wait.observe(100.0)
    metrics.handover.observe(0.0015)
    metrics.request("POST", "/v1/locks/acquire", 200)
    text = metrics.render([Gauge("turnstile_queue_ready", "Ready.", (("queue", 'q"1\\'),), 4)])
    lines = text.splitlines()
    assert "turnstile_grants_total 3" in lines
    assert 'turnstile_wait_seconds_bucket{le="0.001"} 0' in lines
    assert 'turnstile_wait_seconds_bucket{le="0.005"} 1' in lines
    assert 'turnstile_wait_seconds_bucket{le="+Inf"} 2' in lines
    assert "turnstile_wait_seconds_count 2" in lines
    assert 'turnstile_handover_seconds_bucket{le="0.002"} 1' in lines
    assert ('turnstile_http_requests_total{method="POST",route="/v1/locks/acquire",'
            'status="200"} 1') in lines
    assert 'turnstile_queue_ready{queue="q\\"1\\\\"} 4' in lines
    # Every sample line is `name{labels} value` and every metric has HELP and TYPE.
    sample = re.compile(r'^[a-z_]+(\{([a-z_]+="([^"\\]|\\.)*",?)*\})? [-+0-9.eInf]+$')
    for line in lines:
        assert line.startswith("# ") or sample.match(line), line
    for name in re.findall(r"^# TYPE (\S+)", text, re.M):
        assert f"# HELP {name} " in text


def _status(name: str, now: float, *holders: tuple[str, int, float]) -> Status:
    return Status(name, 1, tuple(HolderInfo(h, t, now - 1, e) for h, t, e in holders), (), now)


def test_tracker_turns_observations_into_honest_events() -> None:
    events = EventLog(capacity=100)
    tracker = Tracker(events, Metrics())
    tracker.observe(_status("n", 100.0, ("a", 1, 105.0)))
    assert events.last_seq == 0  # a first look tells nothing about the past
    tracker.observe(_status("n", 106.0, ("b", 2, 110.0)))  # a vanished after its expiry
    kinds = [(e.kind, e.holder, e.via) for e in events.since(0, ANONYMOUS)]
    assert kinds == [("expired", "a", "observed"), ("granted", "b", "observed")]
    assert tracker.metrics.counters["expiries_observed"] == 1
    tracker.observe(_status("n", 107.0))  # b vanished before its expiry: released elsewhere
    assert events.since(2, ANONYMOUS)[0].kind == "released"
    # What this instance did itself is not reported again as observed.
    grant = Grant("n", "c", 3, 108.0, 118.0)
    tracker.granted(grant, claimed_at=108.0)
    tracker.granted(grant, claimed_at=108.5)  # idempotent step: counted once
    tracker.observe(_status("n", 109.0, ("c", 3, 118.0)))
    tracker.released("n", "c", 3, True)
    tracker.observe(_status("n", 110.0))
    tail = [(e.kind, e.via) for e in events.since(3, ANONYMOUS)]
    assert tail == [("granted", "this instance"), ("released", "this instance")]
    assert tracker.metrics.counters["grants"] == 1
    # Events are filtered by what the reader may see.
    assert events.since(0, Principal("other", ("x:",))) == []


def test_tracker_measures_waits_and_handovers() -> None:
    tracker = Tracker(EventLog(), Metrics())
    tracker.asked("n", "w")
    tracker.granted(Grant("n", "w", 7, 50.0, 80.0), claimed_at=50.004)
    assert tracker.metrics.handover.count == 1
    assert tracker.metrics.handover.total == pytest.approx(0.004)
    assert tracker.metrics.wait.count == 1
    tracker.granted(Grant("n", "x", 8, 60.0, 90.0), claimed_at=60.0)  # immediate: no handover
    assert tracker.metrics.handover.count == 1 and tracker.metrics.wait.count == 2
