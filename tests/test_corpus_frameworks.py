"""Issue 12: verdicts that hold on real jobs. `diag check --format json` runs on each script of
tests/scripts/corpus/ (real transformers / Lightning / torch.multiprocessing loops, written in each
framework's documented idiom) and what it reports is held to the ground truth the script documents
in its header and counts itself (its `CORPUS_TRUTH {...}` line on stderr):

- the step count (per rank),
- samples (and tokens) per step,
- phases that add up: data + forward + backward + optimizer + other == step total, every step,
- the exact set of warnings/errors (none for a clean script; the planted ones for a twin),
- per case, the relation that class of loop gets wrong (loader roles, child processes, ...).

Assertions that today's diag fails because of an issue-12 bug are xfail(strict=True) with the class
in the reason: the implementation phase flips them (docs/steps-corpus-baseline.md lists each one
with the numbers seen). Each script runs once per module (about 16 runs of a few seconds).

`python tests/test_corpus_frameworks.py [CASE ...]` prints what diag says for each case against the
ground truth (the baseline table's numbers) without pytest.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import run_diag  # noqa: E402

CORPUS = Path(__file__).resolve().parent / "scripts" / "corpus"
LOUD = ("warning", "error")
RANK_ORDER = {"info": 1, "warning": 2, "error": 3}


@dataclass
class Case:
    script: str
    args: tuple = ()
    nproc: int = 1
    steps: int = 0                      # per rank (hogwild: over all children)
    samples: int | None = None          # per step (per rank)
    tokens: int | None = None
    loud: dict = field(default_factory=dict)   # id -> minimum severity; exactly these ids at warning/error
    found: dict = field(default_factory=dict)  # planted ids that must be reported at >= info
    truth: dict = field(default_factory=dict)  # what the script's CORPUS_TRUTH line must say
    needs: str | None = None            # a module the script imports (skip without it)
    code: int = 0                       # diag check's exit code with --fail-on never (3: the script fails)
    train_loader: dict | None = None    # fields that pick the training loader among the recorded ones
    tolerate: tuple = ()                # ids allowed (not required) at warning/error: see their note
    xfail: dict = field(default_factory=dict)  # assertion name -> issue-12 class (today's failures)


def _x(cls: str) -> str:
    return f"issue 12: {cls}"


C1 = "1, per-loader evidence (the training loader is judged, evaluation waits stay out of steps)"
C2 = "2, training in child processes"
C3 = "3, closure optimizers double-counted"
C4 = "4, several optimizers per iteration"
C5 = "5, one finding per call site"
C6 = "6, samples from the loader's batch, not dim 0"
C7 = "7, framework frames are not the user's line; framework vocabulary"
C8 = "8, one data-wait share"
C9 = "9, CPU-only worker advice"
C10 = "10, a quiet probe"
C11 = "11, steps without optimizer.step()"
C12 = "12, run.failed location and sanitised text"
# distributed.straggler: two ranks sharing 2 loaded CPU cores straggle for real (the OS schedules
# them unevenly); the corpus does not judge that check, it judges the others.
STRAGGLER = ("distributed.straggler",)
# dataloader.main-thread-data on a single-process framework run: today the framework's own per-step
# work before the forward (Lightning's hooks, the Trainer's input preparation) is 3-15% of these tiny
# steps, so whether today's diag crosses its 10% threshold depends on the machine's load. Class 7's
# false main-thread-data is held strictly on the DDP cases and lightning_plant (always above it).
FRAMEWORK_GAP = ("dataloader.main-thread-data",)

# dataloader.main-thread-data on the manual loop: since class 11 its step ends when the update
# exits, so the batch indexing before the next forward is measured (it was 0.0% before). That work is
# ~0.1 ms on a quiet machine, but on the shared 2-core VM every torch op of the loop stalls for
# 10-30 ms at times (measured: the same update takes 0.3 ms or 30 ms from step to step, with or
# without diag's extensions), and the stalls in the gap reach the 10% threshold on some runs.
MANUAL_GAP = ("dataloader.main-thread-data",)

CASES: dict[str, Case] = {
    "hf_plain": Case(
        "hf_trainer.py", steps=6, samples=4, tokens=128, needs="transformers", tolerate=FRAMEWORK_GAP,
        truth={"steps": 6, "samples_per_step": 4, "evaluations": 0}),
    "hf_eval": Case(
        "hf_trainer.py", ("--eval",), steps=6, samples=4, tokens=128, needs="transformers", tolerate=FRAMEWORK_GAP,
        truth={"steps": 6, "samples_per_step": 4, "evaluations": 2, "eval_forwards": 8},
        train_loader={"id": 1}),
    "hf_accum": Case(
        "hf_trainer.py", ("--accum", "2"), steps=6, samples=8, tokens=256, needs="transformers", tolerate=FRAMEWORK_GAP,
        truth={"steps": 6, "samples_per_step": 8, "micro_batches": 2}),
    "hf_ddp": Case(
        "hf_trainer.py", nproc=2, steps=6, samples=4, tokens=128, needs="transformers",
        loud={"ddp.find-unused-parameters": "warning"}, tolerate=STRAGGLER,
        truth={"steps": 6, "samples_per_step": 4, "world_size": 2}),
    "lightning": Case(
        "lightning_fit.py", ("--forward-ms", "20"), steps=8, samples=16, needs="lightning",
        tolerate=FRAMEWORK_GAP,
        truth={"steps": 8, "training_step_calls": 8, "eval_forwards": 8},
        train_loader={"batch_size": 16}),
    "lightning_plant": Case(
        "lightning_fit.py", ("--plant", "--forward-ms", "20"), steps=8, samples=16, needs="lightning",
        loud={"debug.anomaly-detection": "warning"},
        truth={"steps": 8}),
    "lightning_ddp": Case(
        "lightning_fit.py", ("--ddp",), nproc=2, steps=8, samples=16, needs="lightning", tolerate=STRAGGLER,
        truth={"steps": 8, "world_size": 2}),
    "lbfgs": Case(
        "lbfgs_closure.py", steps=5, samples=64,
        truth={"steps": 5, "samples_per_step": 64}),
    "gan": Case(
        "gan_two_optimizers.py", steps=8, samples=32,
        truth={"steps": 8, "samples_per_step": 32}),
    "gan_plant": Case(
        "gan_two_optimizers.py", ("--plant",), steps=8, samples=32, found={"optim.zero-grad": "info"},
        # planted and always found; info or warning by the zeroing's share of the step (2%: 0.1 ms of
        # a 4.5 ms step on an idle machine is a warning, of a 90 ms step on a loaded one an info)
        tolerate=("optim.zero-grad",),
        truth={"steps": 8}),
    "hogwild_fork": Case(
        "hogwild.py", ("--start-method", "fork"), steps=12, samples=16,
        truth={"steps": 12, "processes": 2, "parent_steps": 0},
        xfail={"phases": C2 + " (the children's steps are counted and summarised, not recorded phase by phase)"}),
    "hogwild_spawn": Case(
        "hogwild.py", ("--start-method", "spawn"), steps=12, samples=16,
        truth={"steps": 12, "processes": 2, "parent_steps": 0},
        xfail={"phases": C2 + " (the children's steps are counted and summarised, not recorded phase by phase)"}),
    "lstm_seq_first": Case(
        "lstm_seq_first.py", steps=6, samples=20, tokens=700,
        truth={"steps": 6, "samples_per_step": 20, "tokens_per_step": 700}),
    "big_eval": Case(
        # the evaluation loader (num_workers=0, ~16 ms a batch) is judged too: an info beside the clean
        # training loader, dropped on a contended host (issue 33)
        "big_eval_loader.py", steps=10, samples=32, tolerate=("dataloader.workers",),
        truth={"steps": 10, "eval_forwards": 48, "train_loader_workers": 1},
        train_loader={"batch_size": 32}),
    "big_eval_plant": Case(
        "big_eval_loader.py", ("--plant",), steps=10, samples=32,
        loud={"dataloader.workers": "warning", "eval.no-grad": "warning"},
        truth={"steps": 10, "eval_forwards": 48, "train_loader_workers": 0},
        train_loader={"batch_size": 32}),
    "manual_update": Case(
        "manual_update.py", steps=10, samples=64, tolerate=MANUAL_GAP,
        truth={"steps": 10, "samples_per_step": 64}),
    "quiet_probe": Case(
        "quiet_probe.py", steps=6, samples=16,
        truth={"steps": 6, "samples_per_step": 16}),
    "failing_parse": Case(
        "failing_parse.py", steps=0, code=3, loud={"run.failed": "error"}, tolerate=("run.no-steps",)),
}

# which assertions apply to which cases
WITH_STEPS = [n for n, c in CASES.items() if c.steps]
WITH_EVAL_LOADER = [n for n, c in CASES.items() if c.train_loader]


# ---------------------------------------------------------------------------------------------------
# running a case and reading what diag said

@dataclass
class Outcome:
    code: int
    report: dict
    evidence: dict
    truth: dict | None
    stderr: str
    log: str = ""          # the run's log.txt (the script's own output)

    @property
    def ranks(self) -> list[dict]:
        return self.evidence.get("ranks") or []

    def findings(self, severities=LOUD) -> list[dict]:
        return [f for f in self.report.get("findings", []) if f["severity"] in severities]


def run_case(name: str, cwd: Path) -> Outcome:
    case = CASES[name]
    cmd = ["check", "--script", str(CORPUS / case.script), "--format", "json", "--fail-on", "never"]
    if case.nproc > 1:
        cmd[1:1] = ["--nproc-per-node", str(case.nproc)]
    if case.args:
        cmd += ["--", *case.args]
    r = run_diag(*cmd, cwd=cwd, timeout=420)
    if r.code != case.code:
        raise AssertionError(f"diag check exited {r.code} on {name}:\n{r.stderr[-4000:]}")
    report = r.json()
    evidence = json.loads(Path(report["run"]["evidence"]).read_text())
    truth = None
    log_path = report["run"].get("log")
    run_log = Path(log_path).read_text(errors="replace") if log_path and Path(log_path).exists() else ""
    log = r.stderr + run_log
    at = log.find("CORPUS_TRUTH {")
    if at >= 0:
        truth, _ = json.JSONDecoder().raw_decode(log, at + len("CORPUS_TRUTH "))
    return Outcome(r.code, report, evidence, truth, r.stderr, run_log)


def steps_per_rank(o: Outcome) -> list[int]:
    return [r["step_stats"]["count"] for r in o.ranks]


def step_values(o: Outcome, key: str) -> list:
    return [s.get(key) for r in o.ranks for s in r["steps"]]


def phase_errors(o: Outcome) -> list[tuple[int, int, float, float]]:
    """(rank, step, sum of phases, total) for every step whose phases do not add up to its total
    (tolerance: 1 µs + 0.1% of the step)."""
    bad = []
    for r in o.ranks:
        for s in r["steps"]:
            parts = _parts(s)
            if abs(parts - s["total_s"]) > 1e-6 + 1e-3 * s["total_s"]:
                bad.append((r["rank"], s["index"], parts, s["total_s"]))
    return bad


def _parts(s: dict) -> float:
    """A step's phases; under DDP the time spent waiting in collectives is measured apart
    (extra.comm_wait_s) and belongs to the sum."""
    extra = s.get("extra") or {}
    return (s["data_s"] + s["forward_s"] + s["backward_s"] + s["optimizer_s"] + s["other_s"]
            + float(extra.get("comm_wait_s") or 0.0))


def training_loader(o: Outcome, name: str) -> dict | None:
    pick = CASES[name].train_loader or {}
    found = [d for d in o.ranks[0]["dataloaders"] if all(d.get(k) == v for k, v in pick.items())]
    return found[0] if len(found) == 1 else None


def loud_ids(o: Outcome) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for f in o.findings(("info", "warning", "error")):
        if f["id"] == "probe.overhead":   # judges diag's own cost on this machine, not the script (issue 20)
            continue
        if f["severity"] == "info":
            # a data wait found on a contended host is an info that says workers will not help (issue 33):
            # found all the same, its severity reshaped by the machine's load, not by the script
            host = (f.get("evidence") or {}).get("host") or {}
            # (the training loader's: a training run's evaluation loader is judged beside it, always an
            # info, with the same host figures; counting it too made big_eval_plant's one cause two)
            if not (f["id"] == "dataloader.workers" and host.get("contended")
                    and not (f.get("evidence") or {}).get("evaluation")):
                continue
            out.setdefault(f["id"], []).append("warning")
            continue
        out.setdefault(f["id"], []).append(f["severity"])
    return out


def describe(name: str, o: Outcome) -> dict:
    """The numbers the baseline table shows for one case."""
    samples = [v for v in step_values(o, "samples")]
    tokens = [v for v in step_values(o, "tokens")]
    tot = [s["total_s"] for r in o.ranks for s in r["steps"]]
    parts = [_parts(s) for r in o.ranks for s in r["steps"]]
    ratio = [p / t for p, t in zip(parts, tot) if t > 0]
    med = {}
    for k in ("total_s", "data_s", "forward_s", "backward_s", "optimizer_s", "other_s"):
        vals = [s[k] for r in o.ranks for s in r["steps"]]
        med[k] = round(statistics.median(vals) * 1000, 2) if vals else None
    loaders = [{"id": d["id"], "batch_size": d["batch_size"], "num_workers": d["num_workers"],
                "batches": d["batches"], "wait_s": round(d["wait_s"], 4),
                "at": _short(d.get("location"))} for d in (o.ranks[0]["dataloaders"] if o.ranks else [])]
    data_in_steps = round(sum(s["data_s"] for s in (o.ranks[0]["steps"] if o.ranks else [])), 4)
    return {
        "case": name, "truth": o.truth, "status": o.report["run"]["status"],
        "steps_per_rank": steps_per_rank(o),
        "samples": sorted(set(samples), key=lambda v: (v is None, v)),
        "tokens": sorted(set(tokens), key=lambda v: (v is None, v)),
        "n_forward": sorted({s["n_forward"] for r in o.ranks for s in r["steps"]}),
        "phase_sum_over_total": [round(min(ratio), 3), round(max(ratio), 3)] if ratio else None,
        "median_ms": med, "loaders": loaders, "data_s_in_steps_rank0": data_in_steps,
        "eval_s_in_steps": round(sum((s.get("extra") or {}).get("eval_s", 0.0)
                                     for r in o.ranks for s in r["steps"]), 4),
        "findings": [{"id": f["id"], "severity": f["severity"], "at": _short(f.get("location")),
                      "message": f["message"][:300], "fix": (f.get("fix") or "")[:200]}
                     for f in o.findings(("info", "warning", "error"))],
    }


def _short(loc: dict | None) -> str | None:
    if not loc:
        return None
    f = str(loc.get("file", "?"))
    if "site-packages" in f:
        f = "site-packages/" + f.split("site-packages/", 1)[1]
    else:
        f = f.rsplit("/", 1)[-1]
    return f"{f}:{loc.get('line')}"


# ---------------------------------------------------------------------------------------------------
# pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    cache: dict[str, Outcome] = {}

    def get(name: str) -> Outcome:
        if name not in cache:
            needs = CASES[name].needs
            if needs:
                pytest.importorskip(needs)
            cache[name] = run_case(name, tmp_path_factory.mktemp(name))
        return cache[name]

    return get


def _params(check: str, names=None):
    out = []
    for name in names or CASES:
        cls = CASES[name].xfail.get(check)
        marks = [pytest.mark.xfail(strict=True, reason=_x(cls))] if cls else []
        out.append(pytest.param(name, marks=marks, id=name))
    return out


@pytest.mark.parametrize("name", _params("truth", [n for n, c in CASES.items() if c.truth]))
def test_script_counts_its_ground_truth(outcome, name):
    """The corpus itself: each script ran to its end and counted what its header documents."""
    o = outcome(name)
    assert o.report["run"]["status"] == "completed", o.stderr[-3000:]
    assert o.truth is not None, "no CORPUS_TRUTH line in the script's output"
    for k, v in CASES[name].truth.items():
        assert o.truth.get(k) == v, (k, o.truth)


@pytest.mark.parametrize("name", _params("steps", WITH_STEPS))
def test_step_count(outcome, name):
    case, o = CASES[name], outcome(name)
    if name.startswith("hogwild"):
        # followed into the children (their steps seen), or said plainly as an info finding
        seen = sum(steps_per_rank(o))
        info = [f for f in o.findings(("info",)) if "child" in f["message"] or "process" in f["message"]]
        assert seen == case.steps or (seen == 0 and info), (steps_per_rank(o), info)
        return
    assert steps_per_rank(o) == [case.steps] * case.nproc


@pytest.mark.parametrize("name", _params("samples", WITH_STEPS))
def test_samples_per_step(outcome, name):
    case, o = CASES[name], outcome(name)
    samples = step_values(o, "samples")
    if name.startswith("hogwild") and not samples:
        # training ran in the children: their steps and samples are counted per child
        kids = [c for r in o.ranks for c in r.get("children", [])]
        assert [c["steps"] for c in kids] == o.truth["steps_per_child"], kids
        assert {c["samples"] / c["steps"] for c in kids} == {case.samples}, kids
        return
    assert samples, "no step recorded"
    assert set(samples) == {case.samples}, sorted(samples, key=str)
    if case.tokens is not None:
        assert set(step_values(o, "tokens")) == {case.tokens}


@pytest.mark.parametrize("name", _params("phases", WITH_STEPS))
def test_phases_add_up(outcome, name):
    o = outcome(name)
    assert any(r["steps"] for r in o.ranks), "no step recorded"
    assert phase_errors(o) == []


@pytest.mark.parametrize("name", _params("findings"))
def test_exact_warnings_and_errors(outcome, name):
    case, o = CASES[name], outcome(name)
    loud = {k: v for k, v in loud_ids(o).items() if k not in case.tolerate or k in case.loud}
    assert set(loud) == set(case.loud), {f["id"]: (f["severity"], f["message"][:200]) for f in o.findings()}
    for cid, least in case.loud.items():
        assert len(loud[cid]) == 1, (cid, loud[cid])   # one finding per cause (deduplicated by location)
        assert RANK_ORDER[loud[cid][0]] >= RANK_ORDER[least]
    for cid, least in case.found.items():
        sev = [f["severity"] for f in o.findings(("info", "warning", "error")) if f["id"] == cid]
        assert sev and RANK_ORDER[max(sev, key=RANK_ORDER.get)] >= RANK_ORDER[least], (cid, sev)
    # a finding that has a location points at the user's script, never into an installed package
    for f in o.findings(("info", "warning", "error")):
        loc = f.get("location") or {}
        if loc.get("file"):
            assert "site-packages" not in loc["file"] and "dist-packages" not in loc["file"], (f["id"], loc)


@pytest.mark.parametrize("name", _params("locations", WITH_STEPS))
def test_recorded_locations_are_the_users_code(outcome, name):
    """Every place diag records (DataLoaders, forward call sites) is a line of the user's script:
    under a framework, the script's line that called into it, never a file of the framework."""
    o = outcome(name)
    script = CASES[name].script
    places = [("loader", d.get("location")) for r in o.ranks for d in r["dataloaders"]]
    places += [("forward " + s["key"], s.get("location")) for r in o.ranks for s in r["forwards"]]
    wrong = [(what, _short(loc)) for what, loc in places
             if loc and loc.get("file") and not str(loc["file"]).endswith(script)]
    assert wrong == []


# ---- per-class relations ---------------------------------------------------------------------------

def _judged(o: Outcome) -> dict:
    # the training loader's verdict (an evaluation loader's own wait is a second finding: issue 33)
    (f,) = [f for f in o.report["findings"] if f["id"] == "dataloader.workers"
            and not (f.get("evidence") or {}).get("evaluation")]
    return f


@pytest.mark.parametrize("name", [
    pytest.param("hf_eval", id="hf_eval"),
    pytest.param("lightning", id="lightning"),
    pytest.param("big_eval", id="big_eval"),
])
def test_dataloader_workers_judges_the_training_loader(outcome, name):
    """dataloader.workers judges the loader whose batches feed the training steps, whatever the
    evaluation loaders' sizes."""
    o = outcome(name)
    train = training_loader(o, name)
    assert train is not None, o.ranks[0]["dataloaders"]
    f = _judged(o)
    assert (f["evidence"].get("num_workers"), f["evidence"].get("batch_size")) == \
        (train["num_workers"], train["batch_size"]), f


@pytest.mark.parametrize("name", [
    pytest.param(n, id=n) for n in WITH_EVAL_LOADER
    if n != "big_eval_plant"])
def test_training_steps_wait_only_on_the_training_loader(outcome, name):
    """The training steps' data wait is at most the training loader's own wait: evaluation
    loaders' waits are the evaluation phase's."""
    o = outcome(name)
    train = training_loader(o, name)
    assert train is not None, o.ranks[0]["dataloaders"]
    in_steps = sum(s["data_s"] for s in o.ranks[0]["steps"])
    assert in_steps <= train["wait_s"] * 1.001 + 1e-5, (in_steps, o.ranks[0]["dataloaders"])


def test_big_eval_plant_points_at_the_training_loader(outcome):
    o = outcome("big_eval_plant")
    f = _judged(o)
    src = (CORPUS / "big_eval_loader.py").read_text().splitlines()
    # the training loader's construction or its iteration, never the evaluation loader's lines
    lines = {i for i, s in enumerate(src, 1)
             if s.strip().startswith(("train_loader = DataLoader(", "for x, y in train_loader:"))}
    assert len(lines) == 2
    assert f["location"]["line"] in lines and f["evidence"]["num_workers"] == 0, f


def test_big_eval_plant_no_grad_at_the_eval_line(outcome):
    o = outcome("big_eval_plant")
    found = [f for f in o.findings() if f["id"] == "eval.no-grad"]
    assert found, o.findings()
    src = (CORPUS / "big_eval_loader.py").read_text().splitlines()
    line = next(i for i, s in enumerate(src, 1) if "planted: no torch.no_grad()" in s)
    assert {f["location"]["line"] for f in found} == {line}


@pytest.mark.parametrize("name", ["big_eval", "big_eval_plant"])
def test_one_data_wait_share(outcome, name):
    o = outcome(name)
    shares = {f["id"]: f["evidence"]["data_share"] for f in o.report["findings"]
              if isinstance(f.get("evidence"), dict) and f["evidence"].get("data_share") is not None
              and not f["evidence"].get("evaluation")}      # the evaluation loader's own share is its own
    assert len(shares) >= 2 and len(set(shares.values())) == 1, shares


def test_cpu_run_gets_no_gpu_snippet(outcome):
    o = outcome("big_eval_plant")
    f = _judged(o)
    assert "pin_memory" not in (f.get("snippet") or "") + (f.get("fix") or ""), f


def test_hf_ddp_fix_speaks_training_arguments(outcome):
    o = outcome("hf_ddp")
    (f,) = [f for f in o.findings() if f["id"] == "ddp.find-unused-parameters"]
    assert "ddp_find_unused_parameters=False" in (f.get("fix") or "") + (f.get("snippet") or ""), f
    assert f["location"] and f["location"]["file"].endswith("hf_trainer.py"), f


def test_lightning_anomaly_fix_speaks_lightning(outcome):
    o = outcome("lightning_plant")
    (f,) = [f for f in o.findings() if f["id"] == "debug.anomaly-detection"]
    assert "detect_anomaly" in (f.get("fix") or "") + (f.get("snippet") or ""), f
    assert f["location"] and f["location"]["file"].endswith("lightning_fit.py"), f


def test_manual_update_is_the_optimizer_phase(outcome):
    o = outcome("manual_update")
    steps = o.ranks[0]["steps"][1:]
    # the update under torch.no_grad() is the step's optimizer phase (it was 0.0 in every step), and
    # the step ends when it exits. (How the update compares with "other" is not asserted: on the
    # shared 2-core VM the same update takes 0.3 ms or 30 ms from step to step.)
    assert steps and all(s["optimizer_s"] > 0 for s in steps)
    assert all(s["ended_by"] == "manual" for s in o.ranks[0]["steps"])


def test_lbfgs_closure_forwards_are_forwards_of_one_batch(outcome):
    """Every closure call is a forward + backward of the step, and optimizer time excludes them."""
    o = outcome("lbfgs")
    steps = o.ranks[0]["steps"]
    assert [s["n_forward"] for s in steps] == o.truth["closure_calls"]
    for s in steps:
        assert s["optimizer_s"] + s["forward_s"] + s["backward_s"] <= s["total_s"] * 1.001 + 1e-6, s


def test_quiet_probe_compile_global_hooks_warning(outcome):
    """torch.compile's warning about global module hooks is caused by diag's hooks: the user never
    sees it (the script alone prints none)."""
    o = outcome("quiet_probe")
    assert "when there are global hooks" not in o.stderr + o.log


def test_quiet_probe_user_warning_keeps_its_location(outcome):
    o = outcome("quiet_probe")
    lines = [ln for ln in (o.stderr + o.log).splitlines() if "CUDA is not available" in ln]
    # the warning names the script's file and line, not a file of diag's package (the checkout itself
    # may sit in a folder named diag: only the path before ":LINE:" is judged)
    import re

    package = str(Path(__file__).resolve().parent.parent / "diag") + os.sep
    where = [re.match(r"\s*(.+?):(\d+): ", ln) for ln in lines]
    assert lines and all(m and Path(m.group(1)).name == "quiet_probe.py"
                         and not m.group(1).startswith(package) for m in where), lines


def test_failing_parse_is_located_in_the_script(outcome):
    o = outcome("failing_parse")
    (f,) = [f for f in o.findings() if f["id"] == "run.failed"]
    assert f["location"] and f["location"]["file"].endswith("failing_parse.py"), f
    # JSON spells ESC as \u001b: any of it is an ANSI sequence that reached the report
    assert "\\u001b" not in json.dumps(o.report), "raw ANSI escape in the JSON report"


# ---------------------------------------------------------------------------------------------------
# the baseline table without pytest

def _main(argv: list[str]) -> int:
    names = argv or list(CASES)
    rows = []
    keep = os.environ.get("CORPUS_KEEP")   # a directory: keep each case's run directory there
    for name in names:
        with tempfile.TemporaryDirectory(prefix=f"corpus-{name}-") as d:
            where = Path(keep) / name if keep else Path(d)
            where.mkdir(parents=True, exist_ok=True)
            try:
                o = run_case(name, where)
            except AssertionError as e:
                print(json.dumps({"case": name, "failed": str(e)[-2000:]}), flush=True)
                continue
            row = describe(name, o)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
