"""The do-no-harm harness (issue 26): every script of the corpus runs bare and under ``diag check``, and
what the two runs did is compared.

For each case, in two fresh folders holding a copy of the script's folder (so that a script that
writes beside ``__file__`` or in its working directory writes there):

* **exit code** — the bare process's, against the script's own as diag recorded it (``run.exit_code``;
  diag's exit code is its verdict, not the script's);
* **output** — the script's stdout and stderr (bare: as the process wrote them; under diag: the run's
  ``log.txt``, which holds only the script's own output), with timing numbers, progress bars, addresses,
  library frames of a traceback and the folder names masked (:func:`mask`): the same lines, and each
  stream's lines in the same order (log.txt is filled from two pipes);
* **files** — the same set of new files; a checkpoint (``.pt .pth .pkl .ckpt .bin``) is loaded in a
  fresh interpreter **where diag cannot be imported** (:data:`LOAD_WITHOUT_DIAG`) with
  ``weights_only=True`` where the bare file loads that way, and its tensors are compared bit for bit
  (pickles hold memory addresses, so their bytes differ between any two runs); no file holds the
  bytes ``diag.probe``; any other file is compared byte for byte after masking when it is text;
* **losses** — every scalar ``backward`` is called on, recorded by ``tests/dnh_site/sitecustomize.py``
  (loaded by both runs alike), compared bit for bit, per process.

Both runs get the same deterministic environment (``PYTHONHASHSEED=0``, one intra-op thread). Where a
case cannot be bit-identical even bare-against-bare, :data:`CASES` says why, and the harness compares
the rest.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "scripts"
SITE = ROOT / "tests" / "dnh_site"
PY = sys.executable
DIAG = [PY, "-m", "diag"]
CHECKPOINT_SUFFIXES = {".pt", ".pth", ".pkl", ".ckpt", ".bin", ".pt2"}


@dataclasses.dataclass(frozen=True)
class Case:
    script: str                  # relative to tests/scripts
    args: tuple = ()
    identical: bool | str = True  # True, or why the losses cannot be bit-identical even bare vs bare
    nproc: int = 0               # >0: launched by torchrun with that many processes (both runs)
    timeout: int = 240
    slow: bool = False           # a framework import (transformers, lightning): tens of seconds

    @property
    def id(self) -> str:
        return (self.script.replace("/", "-").removesuffix(".py") + ("-" + "-".join(a.strip("-") for a in self.args)
                                                                     if self.args else ""))


_RACE = "processes update shared parameters without a lock (Hogwild): the order of updates is the OS's"

CASES = [
    # plain loops
    Case("compare_train.py", ("--steps", "12")),
    Case("eval_only.py"),
    Case("eval_only.py", ("--grad",)),
    Case("perf_handmade_clean.py"),
    Case("perf_handmade_planted.py"),
    Case("perf_workers_clean.py", ("--epochs", "1")),
    Case("perf_workers_planted.py", ("--epochs", "1")),
    Case("spine_accumulate.py"),
    Case("spine_accumulate.py", ("--gan",)),
    Case("spine_crash.py"),
    Case("spine_crash_in_loader.py"),   # a chained error through the probe's DataLoader wrapper
    Case("spine_eval_cases.py"),
    Case("spine_eval_cases.py", ("--bad",)),
    Case("spine_loss_modules.py"),
    Case("spine_manual_sgd.py"),
    Case("spine_missing_import.py"),
    Case("spine_oom.py"),
    Case("spine_outputs.py"),
    Case("spine_outputs.py", ("--aux-first",)),
    Case("spine_progress.py"),
    Case("spine_slow_data.py"),
    Case("spine_sysexit.py"),
    Case("spine_train_in_eval_mode.py"),
    Case("train_with_eval.py"),
    Case("compiled_train_step.py", timeout=300),
    # distributed, two ranks on gloo
    Case("perf_ddp_clean.py", nproc=2),
    # the corpus
    Case("corpus/big_eval_loader.py"),
    Case("corpus/failing_parse.py"),
    Case("corpus/gan_two_optimizers.py"),
    Case("corpus/hogwild.py", identical=_RACE),
    Case("corpus/lbfgs_closure.py"),
    Case("corpus/lstm_seq_first.py"),
    Case("corpus/manual_update.py"),
    Case("corpus/quiet_probe.py"),
    Case("corpus/makemore_mlp.py"),
    Case("corpus/gpt_accum_val.py"),
    Case("corpus/gcn_full_graph.py"),
    Case("corpus/reinforce.py"),
    Case("corpus/ddp_tutorial.py", nproc=2),
    Case("corpus/fsdp_train.py", ("--api", "fsdp2", "--steps", "8"), nproc=2),
    Case("corpus/generate_after_train.py"),
    Case("corpus/hf_trainer.py", slow=True, timeout=400),
    # long enough for the probe's lane (diag.probe.lane) to take most steps: unsampled after step 26
    Case("corpus/hf_trainer.py", ("--steps", "120"), slow=True, timeout=400),
    Case("corpus/lightning_fit.py", slow=True, timeout=400),
]

# scripts of the corpus the harness leaves out, and why (shown in the table)
LEFT_OUT = {
    "spine_forever.py": "runs until stopped: bare it has no exit, output or files to compare",
    "dist_train.py": "a launcher test (its ranks wait on files the test writes)",
    "dist_reaper.py": "a launcher test (starts a daemon on purpose)",
    "perf_ddp_planted.py": "the same loop as perf_ddp_clean.py, which runs (two ranks cost ~20 s a run)",
    "spine_common.py": "a module the spine scripts import, not a script",
    "corpus/_truth.py": "a module the corpus scripts import, not a script",
    "cuda/*": "needs a GPU (the gpu-check script runs them on one)",
}

# ---- masking ------------------------------------------------------------------------------------
_LIB_FRAME = re.compile(r'^ *File "[^"]*(site-packages|dist-packages|lib/python3[^/"]*)/[^"]*", line \d+, in .*\n'
                        r'(?:^ {4,}.*\n)*', re.M)
_LOG_PREFIX = re.compile(r"^(USDT:|[IWEF]\d{4} )[^\]]*\]", re.M)   # glog-style: date, time, pid:tid, file

_MASKS = [
    # a traceback's frames inside installed packages (torch's Module._call_impl takes another path when
    # a module has hooks: `inner()`): the script's own frames and the exception line are compared
    (_LIB_FRAME, ""),
    (_LOG_PREFIX, "<log>"),
    # dynamo numbers the frames it compiles ([3/0]); the probe's step hooks add graph breaks in code
    # torch.compile traces (docs/performance.md, the sixth pass): more frames, the same computation
    (re.compile(r"\[\d+/\d+\]"), "[<frame>]"),
    (re.compile(r"\x1b\[[0-9;?]*[A-Za-z]"), ""),                                    # terminal colours
    (re.compile(r"[^\n\r]*\r(?!\n)"), ""),                                          # progress bars redrawn with \r
    (re.compile(r"\b0x[0-9a-f]{6,}\b"), "<addr>"),                                  # object addresses
    (re.compile(r"'?\b\w*(runtime|per_second|_time|elapsed)\w*'?\s*[:=]\s*'?[-+0-9.e]+'?"), "<timing>"),
    (re.compile(r"[-+]?\d+(\.\d+)?(e[-+]?\d+)?\s*(ms|µs|us|ns|s|sec|seconds|it/s|s/it|samples/s|steps/s)\b"),
     "<t>"),
    (re.compile(r"\b\d{1,2}:\d{2}(:\d{2})?\b"), "<clock>"),                         # tqdm's elapsed/eta
    (re.compile(r"\b\d{4}-\d{2}-\d{2}[ T_]\d{2}[:.]\d{2}[:.]\d{2}(\.\d+)?\b"), "<date>"),
    (re.compile(r"\bpid[ =:-]*\d+", re.I), "pid <n>"),
    (re.compile(r"version_\d+"), "version_<n>"),
]


def mask(text: str, *folders: str) -> str:
    for f in folders:
        text = text.replace(f, "<dir>")
    for rx, sub in _MASKS:
        text = rx.sub(sub, text)
    return "\n".join(line.rstrip() for line in text.splitlines() if line.strip())


# ---- running ------------------------------------------------------------------------------------
def _env(losses: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DIAG_", "PYTEST_"))}
    env.update(PYTHONPATH=str(SITE), DIAG_DNH_LOSSES=str(losses), PYTHONHASHSEED="0",
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1", CUBLAS_WORKSPACE_CONFIG=":4096:8",
               TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               DISABLE_TQDM="1", COLUMNS="100", NO_COLOR="1", PYTHONWARNINGS="ignore::DeprecationWarning")
    return env


def _prepare(case: Case, top: Path, side: str) -> tuple[Path, Path, Path]:
    work = top / side / "work"
    src = (SCRIPTS / case.script).parent
    shutil.copytree(src, work, ignore=shutil.ignore_patterns("__pycache__", "cuda", "corpus", "*.pyc"))
    losses = top / side / "losses"
    losses.mkdir()
    return work, losses, work / Path(case.script).name


def _launcher(case: Case) -> list[str]:
    if case.nproc:
        return [PY, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={case.nproc}"]
    return [PY]


@dataclasses.dataclass
class Side:
    exit_code: int | None
    output: str
    files: dict            # relative path -> Path
    losses: dict           # file name -> list of hex floats
    folder: Path
    detail: str = ""
    streams: tuple = ()    # bare: (stdout, stderr) apart


def _collect(work: Path, before: set, losses: Path) -> tuple[dict, dict]:
    files = {}
    for p in work.rglob("*"):
        rel = p.relative_to(work).as_posix()
        if p.is_file() and rel not in before and "__pycache__" not in rel:
            files[rel] = p
    got = {p.name: p.read_text().split() for p in sorted(losses.glob("*.txt"))}
    return files, got


def run_bare(case: Case, top: Path) -> Side:
    work, losses, script = _prepare(case, top, "bare")
    before = {p.relative_to(work).as_posix() for p in work.rglob("*")}
    p = subprocess.run([*_launcher(case), str(script), *case.args], cwd=work, env=_env(losses),
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
                       timeout=case.timeout)
    files, got = _collect(work, before, losses)
    return Side(p.returncode, p.stdout + p.stderr, files, got, work, streams=(p.stdout, p.stderr))


def run_diag(case: Case, top: Path) -> Side:
    work, losses, script = _prepare(case, top, "diag")
    before = {p.relative_to(work).as_posix() for p in work.rglob("*")}
    run_dir = top / "diag" / "run"
    cmd = [*DIAG, "check", "--script", str(script), "--run-dir", str(run_dir), "--format", "json",
           "-o", str(top / "diag" / "report.json"), "--fail-on", "never"]
    if case.nproc:
        cmd += ["--nproc-per-node", str(case.nproc), "--standalone"]
    p = subprocess.run([*cmd, "--", *case.args], cwd=work, env=_env(losses), stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, errors="replace", timeout=case.timeout + 60)
    files, got = _collect(work, before, losses)
    code, log = None, ""
    try:
        ev = json.loads((run_dir / "evidence.json").read_text())
        code = ev["run"].get("exit_code")
        log = (run_dir / "log.txt").read_text(errors="replace")
    except (OSError, ValueError, KeyError):
        pass
    return Side(code, log, files, got, work, detail=f"diag exit {p.returncode}: {p.stderr[-2000:]}")


# ---- comparing ----------------------------------------------------------------------------------
LOAD_WITHOUT_DIAG = r'''
import hashlib, json, sys
class _NoDiag:
    def find_spec(self, name, path=None, target=None):
        if name == "diag" or name.startswith("diag."):
            raise ImportError("diag is not importable here (do-no-harm harness)")
sys.meta_path.insert(0, _NoDiag())
sys.path[:] = [p for p in sys.path if p not in ("", ".")]
import torch
def flat(x, pre, out):
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu().contiguous()
        out[pre] = [str(t.dtype), list(t.shape), hashlib.sha256(t.view(torch.uint8).numpy().tobytes()
                    if t.numel() else b"").hexdigest()]
    elif isinstance(x, torch.nn.Module):
        flat(x.state_dict(), pre + ".state_dict", out)
        hooks = sum(len(getattr(x, n, {}) or {}) for n in ("_forward_pre_hooks", "_forward_hooks"))
        out[pre + ".hooks"] = hooks
    elif isinstance(x, dict):
        for k in sorted(x, key=str):
            flat(x[k], f"{pre}.{k}", out)
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            flat(v, f"{pre}[{i}]", out)
    elif isinstance(x, (int, float, str, bool, type(None))):
        out[pre] = repr(x)
res = {}
for path in sys.argv[1:]:
    out = {}
    if path.endswith(".pt2"):
        ep = torch.export.load(path)
        flat(ep.state_dict, "export", out)
        out["graph"] = str(ep.graph_module.code)
    else:
        try:
            obj = torch.jit.load(path)
            flat(dict(obj.state_dict()), "script", out)
            out["code"] = obj.code
        except Exception:
            try:
                obj = torch.load(path, weights_only=True); out["weights_only"] = True
            except Exception:
                obj = torch.load(path, weights_only=False); out["weights_only"] = False
            flat(obj, "obj", out)
    res[path] = out
print(json.dumps(res))
'''


def load_without_diag(paths: list[Path], cwd: Path) -> dict:
    """Load checkpoints in a fresh interpreter in which ``import diag`` fails; a summary of each."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DIAG_", "PYTHONPATH"))}
    p = subprocess.run([PY, "-c", LOAD_WITHOUT_DIAG, *map(str, paths)], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise AssertionError(f"a checkpoint does not load without diag:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout)


def compare(case: Case, bare: Side, under: Side) -> list[str]:
    """Every difference between the two runs, one sentence each (empty: none)."""
    diffs = []
    if bare.exit_code != under.exit_code:
        diffs.append(f"exit code {bare.exit_code} bare, {under.exit_code} under diag ({under.detail})")
    # diag reads the script's stdout and stderr through two pipes into one log.txt: a line of one
    # stream and a line of the other written a moment apart can swap places there (a terminal shows
    # them as they come). So: the same lines, and each stream's lines in their own order.
    folders = (str(bare.folder), str(bare.folder.parent))
    b = mask(under.output, str(under.folder), str(under.folder.parent))
    a = "\n".join(sorted(mask(bare.output, *folders).splitlines()))
    same = a == "\n".join(sorted(b.splitlines()))
    for stream in bare.streams:
        lines, it = mask(stream, *folders).splitlines(), iter(b.splitlines())
        same = same and all(any(x == y for y in it) for x in lines)   # a subsequence, in order
    if not same:
        a = mask(bare.output, *folders)
        import difflib

        d = "\n".join(list(difflib.unified_diff(a.splitlines(), b.splitlines(), "bare", "diag", lineterm=""))[:40])
        diffs.append(f"the script's output differs:\n{d}")
    if set(bare.files) != set(under.files):
        diffs.append(f"files written: {sorted(bare.files)} bare, {sorted(under.files)} under diag")
    ckpts = []
    for rel in sorted(set(bare.files) & set(under.files)):
        fa, fb = bare.files[rel], under.files[rel]
        raw = fb.read_bytes()
        if b"diag.probe" in raw or b"diag/probe" in raw:
            diffs.append(f"{rel} written under diag names diag's probe")
        if Path(rel).suffix in CHECKPOINT_SUFFIXES:
            ckpts.append(rel)
        elif mask(fa.read_text(errors="replace"), str(bare.folder)) != mask(raw.decode(errors="replace"), str(under.folder)):
            diffs.append(f"{rel} differs")
    if ckpts:
        la = load_without_diag([bare.files[r] for r in ckpts], bare.folder)
        lb = load_without_diag([under.files[r] for r in ckpts], under.folder)
        for r in ckpts:
            if la[str(bare.files[r])] != lb[str(under.files[r])]:
                diffs.append(f"{r}: loaded without diag, it holds other tensors (or loads another way) than bare")
    if case.identical is True and bare.losses != under.losses:
        n = {k: len(v) for k, v in bare.losses.items()}
        m = {k: len(v) for k, v in under.losses.items()}
        first = next((f"{k} #{i}: {x} bare, {y} diag" for k in bare.losses
                      for i, (x, y) in enumerate(zip(bare.losses[k], under.losses.get(k, [])))
                      if x != y), "")
        diffs.append(f"losses differ (counts {n} bare, {m} diag) {first}")
    return diffs


# torch's gloo backend can abort a rank while the process exits, after the script's last line and its
# destroy_process_group(): a C++ thread torn down while still joinable. Bare runs of
# corpus/fsdp_train.py did so 1 time in 30 with two launches at once on 2 cores (CI, 2026-12-05).
TEARDOWN_ABORT = "terminate called without an active exception"
TEARDOWN_TRIES = 3


def torn_down(case: Case, side: Side) -> bool:
    """The side is one a torchrun launch lost to torch's teardown abort (not the script, not diag)."""
    return bool(case.nproc) and side.exit_code not in (0, None) and TEARDOWN_ABORT in side.output


def run_case(case: Case, top: Path) -> list[str]:
    """Both runs of one case, side by side (two processes at once), and their differences. A side that
    torch's teardown abort took (:func:`torn_down`) runs again, up to :data:`TEARDOWN_TRIES` times in
    all: the comparison is between runs that ended as the script ends; the retries are reported."""
    from concurrent.futures import ThreadPoolExecutor

    sides = {"bare": run_bare, "diag": run_diag}
    got: dict[str, Side] = {}
    retried = []
    for attempt in range(TEARDOWN_TRIES):
        todo = [name for name in sides if name not in got or torn_down(case, got[name])]
        if not todo:
            break
        if attempt:
            retried.append(f"{'/'.join(todo)} again: torch's teardown abort ({TEARDOWN_ABORT!r})")
        for name in todo:
            shutil.rmtree(top / name, ignore_errors=True)
        with ThreadPoolExecutor(2) as pool:
            futures = {name: pool.submit(sides[name], case, top) for name in todo}
            got.update({name: f.result() for name, f in futures.items()})
    if retried:
        print(f"{case.id}: " + "; ".join(retried), file=sys.stderr)
    return compare(case, got["bare"], got["diag"])


def table(results: list[tuple[Case, list[str]]]) -> str:
    """The harness's table (markdown): one row per case, then the scripts left out."""
    rows = ["| script | launch | losses compared | result |", "|---|---|---|---|"]
    for case, diffs in results:
        launch = f"torchrun x{case.nproc}" if case.nproc else "python"
        losses = "bit for bit" if case.identical is True else f"no: {case.identical}"
        rows.append(f"| {case.script} {' '.join(case.args)} | {launch} | {losses} | "
                    f"{'same as bare' if not diffs else 'DIFFERS: ' + diffs[0].splitlines()[0]} |")
    for name, why in LEFT_OUT.items():
        rows.append(f"| {name} | - | - | left out: {why} |")
    return "\n".join(rows)
