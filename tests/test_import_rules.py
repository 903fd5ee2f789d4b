"""The house's import rules (the import-linter contracts in pyproject.toml) hold.

lint-imports reads the package from the filesystem, where checks/ is not under diag/; so it runs over a copy
of diag/ with checks/ placed at diag/checks, where it installs.
"""
from __future__ import annotations

import os
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

CONTRACTS = [c["id"] for c in tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]]

@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "diag", src / "diag", ignore=ignore)
    shutil.copytree(REPO / "checks", src / "diag" / "checks", ignore=ignore)
    return src


def lint_imports(tree: Path, contract: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("lint-imports")
    if not exe.exists():
        pytest.fail(f"lint-imports is not installed next to {sys.executable}: run scripts/setup.sh test")
    env = dict(os.environ, PYTHONPATH=str(tree))
    return subprocess.run([str(exe), "--no-cache", "--no-logo", "--contract", contract, str(REPO / "pyproject.toml")],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=300)


def test_every_contract_is_checked():
    assert len(CONTRACTS) >= 7 and len(set(CONTRACTS)) == len(CONTRACTS)


@pytest.mark.parametrize("contract", CONTRACTS)
def test_contract_is_kept(tree, contract):
    r = lint_imports(tree, contract)
    assert r.returncode == 0 and " KEPT" in r.stdout, r.stdout + r.stderr
