"""Static checks on the typed core: ruff (pyflakes + import order) and mypy, on the files listed in
pyproject.toml ([tool.ruff] include, [tool.mypy] files).

ruff runs on the repository as it is. mypy runs over a copy of diag/ with checks/ placed at diag/checks
(where it installs, as in tests/test_import_rules.py), so that the registry is checked against the real
check API: in that copy checks/api.py is diag/checks/api.py.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:          # Python 3.10
    import tomli as tomllib

import pytest

from conftest import REPO

CONFIG = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]


def tool(name: str) -> str:
    exe = Path(sys.executable).with_name(name)
    if not exe.exists():
        pytest.fail(f"{name} is not installed next to {sys.executable}: run scripts/setup.sh test")
    return str(exe)


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_configured_files_exist():
    """A renamed or moved module must not drop out of the checks silently."""
    for path in CONFIG["mypy"]["files"]:
        assert (REPO / path).exists(), f"[tool.mypy] files names {path}, which does not exist"
    for pattern in CONFIG["ruff"]["include"]:
        assert list(REPO.glob(pattern)), f"[tool.ruff] include names {pattern}, which matches no file"


def test_ruff():
    r = run([tool("ruff"), "check", "--no-cache", "--output-format", "concise"], REPO)
    assert r.returncode == 0, (f"ruff check failed (fix with `.venv/bin/ruff check --fix`, or by hand):\n"
                               f"{r.stdout}{r.stderr}")


def test_mypy(tmp_path):
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".mypy_cache")
    shutil.copytree(REPO / "diag", tmp_path / "diag", ignore=ignore)
    shutil.copytree(REPO / "checks", tmp_path / "diag" / "checks", ignore=ignore)
    files = ["diag/" + p if p.startswith("checks/") else p for p in CONFIG["mypy"]["files"]]
    r = run([tool("mypy"), "--config-file", str(REPO / "pyproject.toml"), "--cache-dir", str(tmp_path / "cache"),
             *files], tmp_path)
    assert r.returncode == 0, (f"mypy failed (diag/checks/ below is checks/ in the repository):\n"
                               f"{r.stdout}{r.stderr}")
