"""The dashboard in a real headless Chromium (Debian's `chromium`, driven by Playwright)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import turnstile
from tests.server.conftest import TOKENS, chromium_path
from tests.server.png import colour_stats

CHROMIUM = chromium_path()
if CHROMIUM is None:
    if os.environ.get("CI"):
        pytest.fail("chromium is not installed: apt-get install -y chromium", pytrace=False)
    pytest.skip("chromium is not installed (apt-get install -y chromium); CI is not set",
                allow_module_level=True)
playwright_api = pytest.importorskip("playwright.sync_api", reason="the dev group")

from tests.http_server import ServerProcess, start_server  # noqa: E402

ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("dashboard")
    process = start_server(f"sqlite:///{tmp}/turnstile.db", tmp, tokens=[dict(t) for t in TOKENS],
                           args=("--observe-interval", "0.3"))
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright_api.sync_playwright() as p:
        instance = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield instance
        finally:
            instance.close()


def open_dashboard(browser: Any, server: ServerProcess, token: str | None) -> Any:
    page = browser.new_page(viewport={"width": 1100, "height": 760})
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto(server.base + "/")
    if token is not None:
        page.fill("#token", server.tokens[token])
        page.click("#token-form button")
    return page


def holders(page: Any) -> list[str]:
    return [t.strip() for t in page.locator("[data-testid=holder] .holder-id").all_inner_texts()]


def test_dashboard_live_view_screenshot_and_admin_actions(
    browser: Any, server: ServerProcess, tmp_path: Path
) -> None:
    client = turnstile.connect(server.url("admin"))
    try:
        lock = client.lock("a:order-42", ttl=30)
        lease = lock.acquire(timeout=5, holder="worker-7")
        assert not lock.try_acquire("waiting-1").acquired
        pool = client.semaphore("a:pool", 3, ttl=30)
        pool.try_acquire("p1")
        pool.try_acquire("p2")

        # Without a token the page says what it needs.
        bare = open_dashboard(browser, server, None)
        bare.wait_for_selector("[data-testid=message] >> text=bearer token", timeout=10_000)
        bare.close()

        page = open_dashboard(browser, server, "admin")
        page.wait_for_selector("[data-testid=holder] >> text=worker-7", timeout=10_000)
        card = page.locator("[data-testid=name][data-name='a:order-42']")
        assert "worker-7" in card.inner_text()
        assert card.locator("[data-testid=waiter]").all_inner_texts()[0].startswith("waiting-1")
        assert str(lease.token) in card.inner_text()
        pool_card = page.locator("[data-testid=name][data-name='a:pool']")
        assert "2/3 held" in pool_card.inner_text()
        assert page.locator("[data-testid=who]").inner_text() == "adminadmin"  # name, role

        # Live: a grant made after the page loaded shows up without a reload.
        page.evaluate("window.__same_page = 42")
        late = client.lock("a:late", ttl=30).acquire(timeout=5, holder="late-holder")
        page.wait_for_selector("[data-testid=holder] >> text=late-holder", timeout=10_000)
        assert page.evaluate("window.__same_page") == 42
        # An expiry the service observed (nobody released it) becomes an event. A look must
        # first see the lease held (a lease that comes and goes between two looks is never
        # seen, as docs/http.md says): a ttl of several observe intervals, and the page
        # showing the holder, make sure of that before it runs out.
        # (5 s: the page, slow to redraw on a loaded machine, still shows it in time.)
        client.lock("a:short", ttl=5.0).acquire(timeout=5, holder="sleepy")
        page.wait_for_selector("[data-testid=holder] >> text=sleepy", timeout=10_000)
        page.wait_for_selector("[data-testid=event] >> text=expired", timeout=30_000)
        events = page.locator("[data-testid=events]").inner_text()
        assert "a:short" in events and "observed" in events

        shot = Path(os.environ.get("TURNSTILE_SCREENSHOT_DIR", tmp_path)) / "dashboard.png"
        page.screenshot(path=str(shot), full_page=True)
        width, height, colours, busy = colour_stats(shot)
        assert width >= 1000 and height >= 700
        assert colours > 20, "the screenshot is (nearly) one flat colour"
        assert busy > 0.03, f"only {busy:.1%} of the screenshot differs from its background"

        # Admin action: force release; the line moves on and the event is shown.
        card.locator("[data-testid=force-release]").first.click()
        deadline = time.monotonic() + 10
        while "worker-7" in holders(page):
            assert time.monotonic() < deadline, "force release did not show"
            time.sleep(0.1)
        assert [h.holder for h in lock.status().holders] == ["waiting-1"]
        page.wait_for_selector("[data-testid=event] >> text=force_released", timeout=10_000)
        with pytest.raises(turnstile.LeaseLost):  # the forced-out holder learns it
            lease.renew()
        page.close()
        late.release()
    finally:
        client.close()


def test_dashboard_respects_tenants_and_read_only(browser: Any, server: ServerProcess) -> None:
    client = turnstile.connect(server.url("admin"))
    try:
        client.lock("a:tenant-view", ttl=30).acquire(timeout=5, holder="a-holder")
        client.lock("b:secret", ttl=30).acquire(timeout=5, holder="b-holder")

        reader = open_dashboard(browser, server, "reader-a")
        reader.wait_for_selector("[data-testid=holder] >> text=a-holder", timeout=10_000)
        text = reader.locator("main").inner_text()
        assert "b:secret" not in text and "b-holder" not in text
        assert reader.locator("[data-testid=force-release]").count() == 0
        who = reader.locator("[data-testid=who]").inner_text()
        assert "read-only" in who and 'prefixes: "a:"' in who and "null" not in who
        reader.close()

        other = open_dashboard(browser, server, "tenant-b")
        other.wait_for_selector("[data-testid=holder] >> text=b-holder", timeout=10_000)
        text = other.locator("main").inner_text()
        assert "a:tenant-view" not in text and "a-holder" not in text
        assert other.locator("[data-testid=force-release]").count() == 0  # not an admin
        other.close()
    finally:
        client.close()


def test_dashboard_never_interprets_names_as_html(browser: Any, server: ServerProcess) -> None:
    name = "a:<img src=x onerror=\"window.__pwned=1\"><b>bold</b>"
    client = turnstile.connect(server.url("admin"))
    try:
        client.lock(name, ttl=30).acquire(timeout=5, holder="<script>window.__pwned=2</script>")
        page = open_dashboard(browser, server, "admin")
        page.wait_for_selector("[data-testid=holder] >> text=<script>", timeout=10_000)
        assert page.evaluate("window.__pwned") is None
        assert page.locator("main img").count() == 0
        assert name in page.locator("main").inner_text()
        page.close()
    finally:
        client.close()


def test_dashboard_shows_queues_and_requeues_dead_letters(
    browser: Any, server: ServerProcess
) -> None:
    client = turnstile.connect(server.url("admin"))
    try:
        q = client.queue("a:webhooks", max_attempts=1)
        for i in range(3):
            q.put({"n": i}, key="order-7")
        q.put({"n": 9}, key="order-8")
        failing = q.get(timeout=1)
        assert failing is not None
        failing.nack(error="handler crashed")  # the only attempt: a dead letter
        in_flight = q.get(timeout=1)
        assert in_flight is not None

        page = open_dashboard(browser, server, "admin")
        row = page.locator("[data-testid=queue][data-name='a:webhooks']")
        row.wait_for(timeout=10_000)
        cells = row.locator("td").all_inner_texts()
        # queue, ready, delayed, in flight, dead, oldest, deepest keys, action
        assert cells[0] == "a:webhooks"
        assert (cells[1], cells[3], cells[4]) == ("2", "1", "1")
        assert "order-7 (2)" in cells[6]
        events = page.locator("[data-testid=events]").inner_text()
        assert "queue_nacked" in events and "queue_put" in events
        # A read-only tenant sees the queue (with its dead letter) but no admin button.
        reader = open_dashboard(browser, server, "reader-a")
        reader_row = reader.locator("[data-testid=queue][data-name='a:webhooks']")
        reader_row.wait_for(timeout=10_000)
        assert reader_row.locator("td").all_inner_texts()[4] == "1"
        assert reader.locator("[data-testid=requeue]").count() == 0
        reader.close()

        row.locator("[data-testid=requeue]").click()
        deadline = time.monotonic() + 10
        while row.locator("td").all_inner_texts()[4] != "0":
            assert time.monotonic() < deadline, "requeue did not show"
            time.sleep(0.1)
        assert q.stats().dead == 0 and q.stats().ready == 3
        page.close()
        other = open_dashboard(browser, server, "tenant-b")
        other.wait_for_selector("[data-testid=live].ok", timeout=10_000)  # data arrived
        assert other.locator("[data-testid=queue]").count() == 0
        other.close()
    finally:
        client.close()


WORDS_SPLIT_ACROSS_LINES = """() => {
  const broken = [];
  for (const li of document.querySelectorAll("[data-testid=event]")) {
    const walker = document.createTreeWalker(li, NodeFilter.SHOW_TEXT);
    let node;
    while ((node = walker.nextNode())) {
      if (node.parentElement.closest(".tok")) continue;  // names and holders may break
      const word = /\\S+/g;
      let m;
      while ((m = word.exec(node.data))) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const lines = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
        if (lines.size > 1) broken.push(m[0]);
      }
    }
  }
  return broken;
}"""


def test_dashboard_without_a_token_claims_nothing_and_events_wrap_between_words(
    browser: Any, server: ServerProcess
) -> None:
    client = turnstile.connect(server.url("admin"))
    try:
        client.lock("a:held-while-locked-out", ttl=30).acquire(timeout=5, holder="someone")
        client.queue("a:jobs-while-locked-out").put({"n": 1})
        # Without a token nothing is known: no "nothing held", no "no queues" under the banner.
        bare = open_dashboard(browser, server, None)
        bare.wait_for_selector("[data-testid=message] >> text=bearer token", timeout=10_000)
        assert bare.locator("[data-testid=names]").inner_text().strip() == ""
        assert bare.locator("[data-testid=queues]").inner_text().strip() == ""
        text = bare.locator("main").inner_text()
        assert "nothing held" not in text and "no queue" not in text
        bare.close()

        # Events of many lengths: wherever a line wraps, it wraps between words (only a
        # name or holder id longer than the column breaks inside itself).
        for n in range(12):
            name = "a:wrap-" + "x" * (3 * n) + "-end"
            with client.lock(name, ttl=30).acquire(timeout=5, holder="holder-" + "y" * n):
                pass
        page = open_dashboard(browser, server, "admin")
        page.wait_for_selector("[data-testid=event] >> text=a:wrap--end", timeout=10_000)
        page.wait_for_selector(
            "[data-testid=event] >> text=a:wrap-" + "x" * 33 + "-end", timeout=10_000
        )
        assert page.evaluate(WORDS_SPLIT_ACROSS_LINES) == []
        page.close()
    finally:
        client.close()
