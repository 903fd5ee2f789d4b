"""Each trial run in its own copy of the working directory, with trackers turned off, so that what a
run writes (checkpoints, logs, ``mlruns/``, ``wandb/``, ``lightning_logs/``, temporary files) lands in
the copy and is deleted with it.

The copy: directories are made anew; small files (up to :data:`MAX_FILE` each, :data:`MAX_TOTAL` in
all, :data:`MAX_FILES` files) are copied; larger files, and everything past the limits, are symbolic
links to the originals (read-only inputs such as data sets are read in place; a run that *rewrites*
such a file rewrites the original: docs/try.md says so). Version-control folders, virtual
environments, caches and diag's own ``.diag`` are linked, not walked.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

MAX_FILE = 1 << 20          # 1 MiB
MAX_TOTAL = 256 << 20       # 256 MiB
MAX_FILES = 5000
LINKED_DIRS = {".git", ".hg", ".svn", ".venv", "venv", "env", "node_modules", "__pycache__", ".mypy_cache",
               ".pytest_cache", ".ruff_cache", ".tox", ".nox", ".idea", ".vscode"}
SKIPPED = {".diag"}

# trackers off, caches of the trial's own (a run's remote side effects; docs/try.md lists what remains)
def tracker_env(copy: Path) -> dict[str, str]:
    return {
        "WANDB_MODE": "disabled", "WANDB_DISABLED": "true", "WANDB_SILENT": "true",
        "MLFLOW_TRACKING_URI": (copy / "mlruns").as_uri(), "DISABLE_MLFLOW_INTEGRATION": "TRUE",
        "NEPTUNE_MODE": "offline", "COMET_OFFLINE_DIRECTORY": str(copy / ".comet"), "COMET_MODE": "offline",
        "HF_HUB_DISABLE_TELEMETRY": "1", "TMPDIR": str(copy / ".tmp"),
    }


@dataclass
class Copy:
    root: Path                         # the copy of the working directory
    script: str                        # the script's path to run (inside the copy when it was under cwd)
    copied: int = 0
    linked: int = 0
    notes: list[str] = field(default_factory=list)

    def remove(self) -> None:
        shutil.rmtree(self.root.parent, ignore_errors=True)


def make_copy(cwd: str | Path, script: str, parent: str | Path | None = None) -> Copy:
    """A fresh copy of ``cwd`` (see the module docstring) in a new temporary directory."""
    cwd = Path(cwd).resolve()
    base = Path(tempfile.mkdtemp(prefix="diag-try-", dir=parent))
    root = base / (cwd.name or "work")
    root.mkdir()
    (root / ".tmp").mkdir(exist_ok=True)
    state = {"files": 0, "bytes": 0, "copied": 0, "linked": 0}
    _copy_tree(cwd, root, state)
    script_abs = Path(os.path.abspath(script))
    notes = []
    try:
        rel = script_abs.relative_to(cwd)
        run_script = str(root / rel)
        if not Path(run_script).exists():      # skipped (in a linked or skipped folder): run the original
            run_script = str(script_abs)
    except ValueError:
        run_script = str(script_abs)
        notes.append("the script lies outside the working directory: files it writes beside itself "
                     "(paths made from __file__) are not contained")
    return Copy(root=root, script=run_script, copied=state["copied"], linked=state["linked"], notes=notes)


def _link(src: Path, dst: Path, state: dict) -> None:
    try:
        os.symlink(src, dst, target_is_directory=src.is_dir())
        state["linked"] += 1
    except OSError:
        pass


def _copy_tree(src: Path, dst: Path, state: dict) -> None:
    try:
        entries = sorted(os.scandir(src), key=lambda e: e.name)
    except OSError:
        return
    for e in entries:
        s, d = Path(e.path), dst / e.name
        if e.name in SKIPPED:
            continue
        try:
            if e.is_symlink():
                target = os.readlink(s)
                os.symlink(target if os.path.isabs(target) else os.path.join(src, target), d)
                continue
            if e.is_dir():
                if e.name in LINKED_DIRS or (s / "pyvenv.cfg").exists() or state["files"] >= MAX_FILES:
                    _link(s, d, state)
                    continue
                d.mkdir()
                _copy_tree(s, d, state)
                continue
            size = e.stat().st_size
            state["files"] += 1
            if size <= MAX_FILE and state["bytes"] + size <= MAX_TOTAL and state["files"] <= MAX_FILES:
                shutil.copy2(s, d)
                state["bytes"] += size
                state["copied"] += 1
            else:
                _link(s, d, state)
        except OSError:
            continue
