"""docs/choosing-a-store.md and docs/comparison.md quote only numbers that this repository's
benchmark results (benchmarks/results/*.md) contain: every decimal or thousands-grouped
figure on those pages must appear in a results file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = "\n".join(p.read_text() for p in sorted((ROOT / "benchmarks" / "results").glob("*.md")))
FIGURE = re.compile(r"(?<![\w.,])\d{1,3}(?:,\d{3})+(?:\.\d+)?|(?<![\w.,])\d+\.\d+(?![\w.])")


@pytest.mark.parametrize("page", ["choosing-a-store.md", "comparison.md"])
def test_quoted_figures_come_from_the_results_files(page: str) -> None:
    text = (ROOT / "docs" / page).read_text()
    figures = set(FIGURE.findall(text))
    assert len(figures) >= 15, f"{page} quotes almost no measurements: {sorted(figures)}"
    missing = sorted(
        f for f in figures if not re.search(rf"(?<![\d.,]){re.escape(f)}(?!\d)", RESULTS)
    )
    assert missing == [], f"{page} quotes figures no results file contains: {missing}"


@pytest.mark.parametrize("page", ["choosing-a-store.md", "comparison.md"])
def test_pages_are_linked_from_the_readme(page: str) -> None:
    assert f"(docs/{page})" in (ROOT / "README.md").read_text()
