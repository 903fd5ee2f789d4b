"""Shared fixtures. Integration tests run the real `diag` CLI in a subprocess on real tiny scripts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def _has_gpu() -> bool:
    """A real NVIDIA GPU is reachable: through torch (CUDA build) or through NVML (a driver)."""
    try:
        import torch

        if torch.cuda.is_available():
            return True
    except Exception:
        pass
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount() > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a real NVIDIA GPU (neither torch nor NVML sees one)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    def json(self):
        return json.loads(self.stdout)


def run_diag(*args: str, cwd: str | os.PathLike | None = None, timeout: float = 120,
             env: dict | None = None) -> Result:
    """Run `python -m diag ARGS` in a subprocess; returns exit code, stdout, stderr."""
    e = dict(os.environ)
    e["PYTHONPATH"] = str(REPO) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e.setdefault("COLUMNS", "120")
    e.pop("DIAG_SIMULATE_GPUS", None)
    if env:
        e.update(env)
    p = subprocess.run([sys.executable, "-m", "diag", *args], cwd=cwd, capture_output=True, text=True,
                       timeout=timeout, env=e, stdin=subprocess.DEVNULL)
    return Result(p.returncode, p.stdout, p.stderr)


@pytest.fixture
def diag_cli(tmp_path):
    """Call as diag_cli("check", "--script", ...): runs in tmp_path (run dirs land there)."""

    def _run(*args, **kw):
        kw.setdefault("cwd", tmp_path)
        return run_diag(*args, **kw)

    return _run


@pytest.fixture
def write_script(tmp_path):
    """write_script("name.py", source) -> path of a dedented script in tmp_path."""

    def _write(name: str, source: str) -> Path:
        p = tmp_path / name
        p.write_text(textwrap.dedent(source))
        return p

    return _write


def findings_by_id(report: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for f in report["findings"]:
        out.setdefault(f["id"], []).append(f)
    return out


def severities(report: dict, check_id: str) -> list[str]:
    return [f["severity"] for f in report["findings"] if f["id"] == check_id]


def check_json(diag_cli, script, *extra, script_args=(), timeout=120):
    """`diag check --format json` on a script from tests/scripts: the result and its parsed report."""
    args = ["check", "--script", str(SCRIPTS / script), "--format", "json", *extra]
    if script_args:
        args += ["--", *script_args]
    r = diag_cli(*args, timeout=timeout)
    assert r.stdout.strip(), f"no JSON on stdout; stderr:\n{r.stderr}"
    return r, r.json()
