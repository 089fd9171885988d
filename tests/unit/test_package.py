"""What a user of the installed package sees: the public names, the distribution metadata."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import turnstile
import turnstile.aio

ROOT = Path(__file__).resolve().parents[2]


def test_dir_shows_only_the_public_api() -> None:
    assert dir(turnstile) == sorted(turnstile.__all__)
    assert dir(turnstile.aio) == sorted(turnstile.aio.__all__)
    for module in (turnstile, turnstile.aio):
        for name in dir(module):
            assert getattr(module, name) is not None
        private = [n for n in dir(module) if n.startswith("_") and n != "__version__"]
        assert private == []


def test_distribution_metadata() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    meta = project["project"]
    # `turnstile` on PyPI is somebody else's package: the distribution has its own name,
    # the import name and the command stay `turnstile`.
    assert meta["name"] == "turnstile-locks"
    assert meta["scripts"] == {"turnstile": "turnstile.cli:main"}
    assert meta["license"] == {"text": "Apache-2.0"}
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text
    for version in ("3.11", "3.12", "3.13"):
        assert f"Programming Language :: Python :: {version}" in meta["classifiers"]
    assert {"Source", "Issues", "Changelog"} <= set(meta["urls"])
    # Tools for developing Turnstile are dependency groups, not extras a user could pick.
    assert set(meta["optional-dependencies"]) == {"redis", "postgres", "server", "http"}
    assert {"dev", "bench"} <= set(project["dependency-groups"])
    assert (ROOT / "src" / "turnstile" / "py.typed").exists()


def test_install_lines_name_the_distribution() -> None:
    # Every documented `pip install` of Turnstile itself uses the distribution name.
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    files += [ROOT / "benchmarks" / "README.md"]
    files += sorted((ROOT / "src" / "turnstile").rglob("*.py"))
    files += sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "benchmarks").rglob("*.py"))
    wrong = []
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            own = "turnstile[" in line or re.search(r"install turnstile\b(?!-locks)", line)
            # dev and bench are dependency groups now, not extras.
            extra = re.search(r"\.\[[^]]*\b(dev|bench)\b", line)
            if "pip install" in line and (own or extra):
                wrong.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert wrong == []
