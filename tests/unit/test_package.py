"""What a user of the installed package sees: the public names, the distribution metadata."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

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
    assert set(meta["optional-dependencies"]) == {
        "redis",
        "postgres",
        "server",
        "http",
        "otel",
        "aws",
    }
    assert {"dev", "bench"} <= set(project["dependency-groups"])
    assert (ROOT / "src" / "turnstile" / "py.typed").exists()


def test_install_lines_name_the_distribution() -> None:
    # Every documented `pip install` of Turnstile itself uses the distribution name.
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    files += [ROOT / "benchmarks" / "README.md", ROOT / "examples" / "README.md"]
    files += sorted((ROOT / "examples").rglob("*.py")) + sorted((ROOT / "examples").rglob("*.txt"))
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


@pytest.mark.slow
def test_the_wheel_carries_the_license_the_types_and_the_command(tmp_path: Path) -> None:
    """Build the wheel as a user's pip would (isolated build with hatchling) and read it."""
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if built.returncode != 0 and "hatchling" in built.stderr and not os.environ.get("CI"):
        pytest.skip(f"cannot fetch the build backend here: {built.stderr.strip()[-200:]}")
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("turnstile_locks-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(f"{dist_info}/METADATA").decode()
        entry_points = archive.read(f"{dist_info}/entry_points.txt").decode()
    assert "turnstile/py.typed" in names
    assert "turnstile/__init__.py" in names and "turnstile/stores/postgres/schema.sql" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith("/LICENSE") for n in names)
    assert "\nName: turnstile-locks\n" in metadata
    assert "Classifier: Programming Language :: Python :: 3.13" in metadata
    assert "Project-URL: Source," in metadata
    assert "Provides-Extra: dev" not in metadata and "Provides-Extra: bench" not in metadata
    assert "turnstile = turnstile.cli:main" in entry_points
    assert not any(n.startswith(("tests/", "benchmarks/", "scripts/")) for n in names)
