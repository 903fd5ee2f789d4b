"""The trial engine behind ``diag try``: runs the script under the probe with knobs applied from
outside (:mod:`diag.probe.knobapply`), alternating baseline and knobs, and judges each knob
(:mod:`diag.trial.judge`).

1. A first run (the baseline's first run, recording losses), unless ``--from`` gave evidence: its
   findings name the knobs to try when ``--knob`` does not.
2. Switch knobs: one run whose steps alternate in blocks (warm-up, then base, knob 1, knob 2, ...,
   base, knob 1, ...); each knob's blocks against the base blocks.
3. Restart knobs: short runs alternated A B C A B C (``rounds`` of each); each knob's runs against the
   baseline's runs.
4. The knobs found faster, combined, as one last trial (blocks when they are all switch knobs, runs
   alternated with the baseline's otherwise).

Each run works in its own copy of the working directory (:mod:`diag.trial.workdir`), deleted after
the run; the run directories (evidence, log) stay under ``.diag/try/<id>/``. The whole fits a time
budget: what does not fit is reported as left out.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from diag.errors import DiagError, ExitCode
from diag.knobs import KNOBS
from diag.trial import judge as J
from diag.trial import plan as P
from diag.trial.workdir import make_copy, tracker_env

DEFAULT_STEPS = 40          # steps of each restart run (and of the first run)
DEFAULT_BUDGET_S = 300.0
DEFAULT_ROUNDS = 3
DEFAULT_BLOCK = 5
SWITCH_WARMUP = 3
MIN_SWITCH_ROUNDS = 2
COMPILE_WARMUP = 6          # steps left out of a compiled run's start (compiling, recompiling)


@dataclass
class TryConfig:
    script: str
    args: list[str] = field(default_factory=list)
    knobs: list[str] | None = None           # specs; None: from the findings
    steps: int | None = None
    budget_s: float = DEFAULT_BUDGET_S
    from_evidence: list[str] | None = None
    rounds: int | None = None                # restart rounds at most (None: as the budget allows, up to 8)
    block: int = DEFAULT_BLOCK
    root: str = ".diag/try"
    progress: Callable[[str], None] | None = None
    evidence: Any = None                     # a run already judged (diag check --try): no first run
    findings: list | None = None             # its findings
    on_update: Callable[[Any], None] | None = None   # called with the TryResult so far after each run and phase (diag tui)
    cancel: Any = None                       # a threading.Event: once set, the run in progress is stopped and the trials end as interrupted


@dataclass
class RunOut:
    label: str
    run_dir: str
    wall_s: float
    status: str
    steps: list[dict]
    losses: dict[int, float]
    knob_status: dict[str, dict]
    peak_memory: float | None
    error: str | None
    median_step: float | None
    evidence: Any = None
    clock: str = "wall"          # "device": step times are the device timeline's spans (CUDA events)


@dataclass
class TryResult:
    script: str
    framework: str | None = None
    device: str = "cpu"
    trials: list[J.Trial] = field(default_factory=list)
    baseline: dict[str, Any] = field(default_factory=dict)
    not_tried: list[dict[str, str]] = field(default_factory=list)   # {knob, verdict, why}
    notes: list[str] = field(default_factory=list)
    summary: str = ""
    elapsed_s: float = 0.0
    budget_s: float = DEFAULT_BUDGET_S
    runs: list[dict[str, Any]] = field(default_factory=list)          # label, run_dir, wall_s, status
    directory: str = ""
    interrupted: bool = False
    values: dict[str, Any] = field(default_factory=dict)   # for the fix texts: batch_size of the training loader

    def to_dict(self) -> dict[str, Any]:
        return {"tool": "diag try", "script": self.script, "framework": self.framework, "device": self.device,
                "baseline": self.baseline, "trials": [t.to_dict() for t in self.trials],
                "not_tried": self.not_tried, "summary": self.summary, "notes": self.notes,
                "elapsed_s": round(self.elapsed_s, 3), "budget_s": self.budget_s, "runs": self.runs,
                "directory": self.directory, "interrupted": self.interrupted, "values": self.values}


class Engine:
    def __init__(self, cfg: TryConfig):
        self.cfg = cfg
        self.t0 = time.monotonic()
        self.cwd = os.getcwd()
        stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid() % 10000:04d}"
        self.dir = Path(cfg.root).resolve() / stamp
        self.result = TryResult(script=cfg.script, budget_s=cfg.budget_s, directory=str(self.dir))
        self.n_runs = 0
        self.est_run_s: float | None = None     # one restart run, measured
        self.step_s: float | None = None

    # ---- helpers ------------------------------------------------------------------------------------
    def say(self, text: str) -> None:
        if self.cfg.progress:
            self.cfg.progress(text)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        return self.cfg.budget_s - self.elapsed()

    def run(self, label: str, *, fixed: list[str], arms: list[str] | None = None, steps: int,
            block: int | None = None) -> RunOut:
        """One run of the script under the probe, in its own copy of the working directory."""
        from diag.runner import Run, RunConfig

        self.n_runs += 1
        env = {"DIAG_TRY_KNOBS": ",".join(fixed)}
        if arms:
            env.update(DIAG_TRY_ARMS=";".join(arms), DIAG_TRY_BLOCK=str(block or self.cfg.block),
                       DIAG_TRY_WARMUP=str(SWITCH_WARMUP))
        copy = make_copy(self.cwd, self.cfg.script)
        env.update(tracker_env(copy.root))
        for n in copy.notes:
            if n not in self.result.notes:
                self.result.notes.append(n)
        run_dir = self.dir / f"{self.n_runs:02d}-{_safe(label)}"
        # a hung or far slower run is stopped: three times the expected time, at least a minute
        max_time = None
        if self.est_run_s:
            max_time = max(60.0, 3 * (self.est_run_s + (steps * (self.step_s or 0))))
        t = time.monotonic()
        self.say(f"run {self.n_runs}: {label} ({steps} steps)")
        try:
            # the run's working directory is the copy; diag's own stays (a TUI runs trials in a thread)
            run = Run(RunConfig(script=copy.script, args=list(self.cfg.args), steps=steps, max_time=max_time,
                                run_dir=str(run_dir), echo=None, env=env, gpu=False, cwd=str(copy.root)))
            run.start()
            if self.cfg.cancel is not None:
                while run.running and not self.cfg.cancel.wait(0.1):
                    pass
                if self.cfg.cancel.is_set():
                    run.stop("stopped: the trials were cancelled", "stopped")
            ev = run.wait()
        finally:
            copy.remove()
        if self.cfg.cancel is not None and self.cfg.cancel.is_set():
            raise KeyboardInterrupt
        wall = time.monotonic() - t
        out = _read(label, str(run_dir), wall, ev)
        self.result.runs.append({"label": label, "run_dir": str(run_dir), "wall_s": round(wall, 3),
                                 "status": out.status, "steps": len(out.steps), "clock": out.clock})
        self.say(f"  {out.status}, {len(out.steps)} steps in {wall:.1f} s"
                 + (f" (median step {out.median_step * 1e3:.1f} ms)" if out.median_step else ""))
        self.update()
        return out

    def update(self) -> None:
        if self.cfg.on_update:
            self.cfg.on_update(self.result)

    # ---- the whole ----------------------------------------------------------------------------------
    def go(self) -> TryResult:
        cfg = self.cfg
        steps = cfg.steps or DEFAULT_STEPS
        res = self.result
        first: RunOut | None = None
        if cfg.evidence is not None:
            evidence = cfg.evidence
        elif cfg.from_evidence:
            from diag.evidence import load_evidence

            evidence = load_evidence(cfg.from_evidence[0])
        else:
            first = self.run("baseline", fixed=[], steps=steps)
            evidence = first.evidence
            if first.status in ("failed", "oom", "killed"):
                raise DiagError(f"the script failed on its own, before any knob was applied "
                                f"({first.error or first.status}); there is nothing to try",
                                code=ExitCode.SCRIPT_FAILED, hint=f"its output: {first.run_dir}/log.txt")
            if len(first.steps) < 3:
                raise DiagError(f"the script ran {len(first.steps)} training step(s) under the probe: too few "
                                "to time (diag try needs a training loop of at least a few steps)",
                                code=ExitCode.SCRIPT_FAILED, hint=f"its output: {first.run_dir}/log.txt")
            self.est_run_s = max(first.wall_s - len(first.steps) * (first.median_step or 0), 0.5)
            self.step_s = first.median_step
        rank = evidence.primary if evidence.ranks else None
        fw = getattr(getattr(rank, "framework", None), "name", None) if rank else None
        res.framework = fw or None
        res.device = _device(rank)
        try:
            loader = rank.training_loader() if rank is not None else None
            if loader is not None and loader.batch_size:
                res.values["batch_size"] = loader.batch_size
            opts = [o for o in (rank.optimizers or []) if getattr(o, "cls", "")] if rank is not None else []
            if opts:
                res.values["cls"] = opts[0].cls
        except Exception:
            pass
        if cfg.knobs:
            picks = P.from_specs(cfg.knobs)
        else:
            from diag.registry import Registry

            findings = cfg.findings if cfg.findings is not None else Registry.discover().run(evidence)
            picks = P.from_findings(findings)
            if not picks:
                res.notes.append("no finding at warning level or above points to a knob; name knobs with "
                                 "--knob (diag try --list shows them)")
        plan = P.split(picks)
        for p, why in plan.not_applicable:
            res.not_tried.append({"knob": p.spec, "verdict": "not applicable", "why": why})
        if first is not None:
            res.baseline = {"median_step_s": first.median_step, "steps": len(first.steps),
                            "run_dir": first.run_dir, "wall_s": round(first.wall_s, 3)}
        baseline_runs: list[RunOut] = [first] if first is not None else []
        if self.est_run_s is None and rank is not None:   # --from: the saved run's start-up and steps
            times = sorted(s.total_s for s in rank.steps if not s.instrumented and s.total_s > 0)
            self.step_s = times[len(times) // 2] if times else 0.1
            self.est_run_s = max(float(rank.steps[0].t - rank.steps[0].total_s), 0.5) if rank.steps else 10.0
        alloc = allocate(self.left(), self.est_run_s or 10.0, self.step_s or 0.1, steps, len(plan.switch),
                         len(plan.restart), cfg.block, reused_baselines=len(baseline_runs), max_restart=cfg.rounds)
        for p in plan.restart[alloc["restart_knobs"]:]:
            res.not_tried.append({"knob": p.spec, "verdict": "left out",
                                  "why": f"the budget ({cfg.budget_s:.0f} s) leaves no room for 2 runs of it "
                                         "beside the baseline's"})
        if plan.switch and not alloc["switch"]:
            for p in plan.switch:
                res.not_tried.append({"knob": p.spec, "verdict": "left out",
                                      "why": f"the budget ({cfg.budget_s:.0f} s) leaves no room for 2 rounds "
                                             "of blocks"})
        try:
            self.update()
            if self.cfg.cancel is not None and self.cfg.cancel.is_set():
                raise KeyboardInterrupt
            if plan.switch and alloc["switch"]:
                self._switch_trials(plan.switch, alloc["switch"])
                self.update()
            if alloc["restart_knobs"]:
                self._restart_trials(plan.restart[:alloc["restart_knobs"]], baseline_runs, steps, alloc["restart"])
                self.update()
            self._combined(steps)
        except KeyboardInterrupt:
            res.interrupted = True
            res.notes.append("interrupted: the trials finished so far are reported")
        res.summary = J.summary(res.trials)
        res.elapsed_s = self.elapsed()
        return res

    # ---- switch knobs: blocks of one process --------------------------------------------------------
    def _switch_trials(self, picks: list[P.Pick], rounds: int, arms: list[str] | None = None,
                       label: str = "switch knobs", kind: str = "switch", fixed: list[str] | None = None):
        res = self.result
        arms = arms or ["base"] + [p.spec for p in picks]
        per_round = len(arms) * self.cfg.block
        n = SWITCH_WARMUP + rounds * per_round
        out = self.run(label, fixed=fixed or [], arms=arms, steps=n)
        if len(out.steps) < n:
            res.notes.append(f"{label}: the script ended after {len(out.steps)} steps of the {n} asked "
                             "(give it more steps: its own arguments after --)")
        # a loss that turns NaN/inf in one arm's block spoils the weights for every block after it: that
        # arm broke, and the others are judged on the steps before it
        bad = min((i for i, v in out.losses.items() if not math.isfinite(v)), default=None)
        culprit = None
        steps_ok = out.steps
        if bad is not None:
            culprit = next(((s.get("extra") or {}).get("try") for s in out.steps if s["index"] == bad), None)
            steps_ok = [s for s in out.steps if s["index"] < bad]
            if culprit in (None, "base", "warmup"):
                res.notes.append(f"{label}: the script's own loss became {_nonfinite(out.losses[bad])} at step "
                                 f"{bad}, with no knob on; the steps after it are not judged")
        sides = J.split_arms(steps_ok, out.losses)
        base = sides.get("base") or J.Side()
        base.peak_memory = out.peak_memory
        for arm in arms[1:]:
            ids = arm.split("+")
            t = J.Trial(knob=arm.replace("+", " + "), kind=kind, knobs=ids)
            na = [f"{k}: {out.knob_status[k.split('=')[0]]['not_applicable']}" for k in ids
                  if (out.knob_status.get(k.split("=")[0]) or {}).get("not_applicable")]
            t.applied = _applied(out.knob_status, ids)
            if culprit == arm:
                J.judge(t, base, sides.get(arm) or J.Side())
                J.failed(t, f"the loss became {_nonfinite(out.losses[bad])} at step {bad}, in a block with the "
                            "knob on (the blocks before it had finite losses)")
            elif out.status in ("failed", "oom", "killed") and out.error:
                J.judge(t, base, sides.get(arm) or J.Side())
                J.failed(t, f"the run failed ({out.error}) during the alternating blocks")
            elif na and len(na) == len(ids):
                t.verdict, t.why = "not applicable", "; ".join(na)
            else:
                J.judge(t, base, sides.get(arm) or J.Side())
                if na:
                    t.why += " (not applied: " + "; ".join(na) + ")"
            res.trials.append(t)

    # ---- restart knobs: runs alternated -------------------------------------------------------------
    def _restart_trials(self, picks: list[P.Pick], baseline_runs: list[RunOut], steps: int, rounds: int) -> None:
        res = self.result
        runs: dict[str, list[RunOut]] = {p.spec: [] for p in picks}
        n_knobs = len(picks) + len(self.result.trials)
        r = 0
        while True:
            if r >= rounds:
                # more rounds while the measured runs say the budget holds them (and the combined trial's)
                walls = [x["wall_s"] for x in self.result.runs[-(len(picks) + 1):]]
                per = sum(walls) / len(walls) if walls else 0.0
                reserve = 4 * per if n_knobs >= 2 else 0.0
                if r >= (self.cfg.rounds or MAX_RESTART_ROUNDS) or self.left() < (len(picks) + 1) * per + reserve:
                    break
            if r >= len(baseline_runs):
                baseline_runs.append(self.run(f"baseline (round {r + 1})", fixed=[], steps=steps))
                self._learn(baseline_runs[-1])
            ended = False
            for p in picks:
                if self.est_run_s and self.left() < self.est_run_s + steps * (self.step_s or 0) and r >= 1:
                    res.notes.append(f"the budget ended round {r + 1} early")
                    ended = True
                    break
                runs[p.spec].append(self.run(f"{p.spec} (round {r + 1})", fixed=[p.spec], steps=steps))
            r += 1
            if ended:
                break
        base = _restart_side(baseline_runs, False)
        for p in picks:
            res.trials.append(self._restart_trial(p.spec, "restart", [p.spec], base, runs[p.spec]))

    def _restart_trial(self, name: str, kind: str, ids: list[str], base: J.Side, runs: list[RunOut]) -> J.Trial:
        t = J.Trial(knob=name, kind=kind, knobs=ids)
        status: dict[str, dict] = {}
        for r in runs:
            for k, st in (r.knob_status or {}).items():
                cur = status.setdefault(k, {"applied": 0, "not_applicable": None, "notes": []})
                cur["applied"] += st.get("applied") or 0
                cur["not_applicable"] = cur["not_applicable"] or st.get("not_applicable")
                cur["notes"] += [n for n in st.get("notes") or [] if n not in cur["notes"]]
        t.applied = _applied(status, ids)
        bad = [r for r in runs if r.status in ("failed", "oom", "killed")]
        hung = [r for r in runs if r.status == "timeout"]
        side = _restart_side(runs, "compile" in ids)
        J.judge(t, base, side)
        if hung and not bad:
            return J.failed(t, f"a run with the knob on was stopped at diag's time limit ({hung[0].error or 'max time'}; "
                               f"{len(hung[0].steps)} steps done): it hung, or ran far slower than the baseline")
        if bad:
            return J.failed(t, f"the script failed with the knob on: {bad[0].error or bad[0].status}"
                            + (f" (log: {bad[0].run_dir}/log.txt)" if bad[0].run_dir else ""))
        keys = [k.split("=")[0] for k in ids]
        na = [f"{k}: {status[k]['not_applicable']}" for k in keys if (status.get(k) or {}).get("not_applicable")
              and not status[k]["applied"]]
        if na and len(na) == len(ids):
            t.verdict, t.why = "not applicable", "; ".join(na)
        return t

    def _learn(self, out: RunOut) -> None:
        if self.est_run_s is None and out.steps:
            self.step_s = out.median_step
            self.est_run_s = max(out.wall_s - len(out.steps) * (out.median_step or 0), 0.5)

    # ---- the winners combined -----------------------------------------------------------------------
    def _combined(self, steps: int) -> None:
        res = self.result
        wins = [t for t in res.trials if t.verdict == "faster" and t.kind in ("switch", "restart")]
        if len(wins) < 2:
            return
        specs = [t.knob for t in wins]
        name = " + ".join(specs)
        per_run = (self.est_run_s or 0) + steps * (self.step_s or 0)
        if all(t.kind == "switch" for t in wins):
            per_round = 2 * self.cfg.block * (self.step_s or 0) * 1.1
            r = int((self.left() - (self.est_run_s or 0)) // max(per_round, 1e-6))
            if r < MIN_SWITCH_ROUNDS:
                res.not_tried.append({"knob": name, "verdict": "left out",
                                      "why": "the budget leaves no room for 2 rounds of the winners combined"})
                return
            self._switch_trials([], min(r, MAX_SWITCH_ROUNDS), arms=["base", "+".join(specs)], label="combined",
                                kind="combined")
            return
        rounds = min(self.cfg.rounds or DEFAULT_ROUNDS, int(self.left() // max(2 * per_run, 1e-6)))
        if rounds < 2:
            res.not_tried.append({"knob": name, "verdict": "left out",
                                  "why": "the budget leaves no room for 2 runs of the winners combined"})
            return
        combo, base_runs = [], []
        for r in range(rounds):
            base_runs.append(self.run(f"baseline (combined, round {r + 1})", fixed=[], steps=steps))
            combo.append(self.run(f"combined (round {r + 1})", fixed=specs, steps=steps))
        res.trials.append(self._restart_trial(name, "combined", list(specs), _restart_side(base_runs, False), combo))


# ---- the budget -----------------------------------------------------------------------------------

MAX_SWITCH_ROUNDS = 12
MAX_RESTART_ROUNDS = 8


def allocate(left: float, startup_s: float, step_s: float, steps: int, n_switch: int, n_restart: int,
             block: int, reused_baselines: int = 1, max_restart: int | None = None) -> dict[str, int]:
    """How many rounds the switch run and the restart runs get within ``left`` seconds: at least 2
    each (else restart knobs are dropped, last first, then the switch run), then grown in turn while
    the budget holds (up to MAX_*_ROUNDS), 4 runs' worth kept for the winners combined (2 rounds of 2
    runs) when two or more knobs are tried. Returns {"switch": rounds or 0, "restart": rounds or 0, "restart_knobs": kept}."""
    per_run = startup_s + steps * step_s

    def switch_cost(r: int) -> float:
        return 0.0 if not n_switch or r == 0 else startup_s + (SWITCH_WARMUP + r * (n_switch + 1) * block) * step_s * 1.1

    def restart_cost(r: int, k: int) -> float:
        return 0.0 if not k or r == 0 else (r * k + max(r - reused_baselines, 0)) * per_run

    reserve = 4 * per_run if n_switch + n_restart >= 2 else 0.0
    # the winners' combined trial is kept room for only when every knob's minimum still fits beside it
    avail = left - reserve if switch_cost(2) + restart_cost(2, n_restart) <= left - reserve else left
    rs = 2 if n_switch else 0
    rr = 2 if n_restart else 0
    k = n_restart
    while k and switch_cost(rs) + restart_cost(rr, k) > avail:
        k -= 1
    if not k:
        rr = 0
    if n_switch and switch_cost(rs) + restart_cost(rr, k) > avail:
        rs = 0
    grow = True
    while grow:
        grow = False
        if rr and rr < (max_restart or MAX_RESTART_ROUNDS) and switch_cost(rs) + restart_cost(rr + 1, k) <= avail:
            rr += 1
            grow = True
        if rs and rs < MAX_SWITCH_ROUNDS and switch_cost(rs + 1) + restart_cost(rr, k) <= avail:
            rs += 1
            grow = True
    return {"switch": rs, "restart": rr, "restart_knobs": k}


# ---- reading a run --------------------------------------------------------------------------------

def _nonfinite(v: float) -> str:
    return "nan" if math.isnan(v) else "inf"


def _safe(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.=" else "-" for c in label)[:60]


def _read(label: str, run_dir: str, wall: float, ev) -> RunOut:
    import statistics

    from diag.compare.extract import _scalars

    rank = ev.primary if ev.ranks else None
    steps, losses, status, peak, error = [], {}, {}, None, None
    if rank is not None:
        steps = [{"index": s.index, "total_s": s.total_s, "samples": s.samples, "instrumented": s.instrumented,
                  "extra": dict(s.extra or {})} for s in rank.steps]
        for chunk in (rank.extras.get("try_losses") or []):
            for pair in chunk if isinstance(chunk, list) else []:
                if isinstance(pair, list) and len(pair) == 2:
                    v = pair[1]
                    losses[int(pair[0])] = float(v) if v is not None else math.nan
        status = ((rank.extras.get("try") or {}).get("knobs")) or {}
        try:
            sc = _scalars(ev, rank)
            peak = sc.get("allocator_peak_bytes") or sc.get("device_peak_bytes")
        except Exception:
            peak = None
        if rank.exceptions:
            e = rank.exceptions[-1]
            lines = [ln.strip() for ln in f"{e.type}: {e.message}".strip().splitlines() if ln.strip()]
            if len(lines) > 1 and "Original Traceback" in e.message:    # a DataLoader worker's: its own last line
                lines = [lines[0] + " " + lines[-1]]
            error = lines[0][:400] if lines and (e.type or e.message) else None
    clock = "wall"
    if rank is not None and steps:
        # a CUDA run with a device timeline: each step's device span (CUDA events) replaces its wall time,
        # when the timeline covers most steps (a step without a record is left out)
        try:
            from diag.compare.extract import _device_steps

            dev = _device_steps(rank)
            if dev:
                cols = dev["steps"]
                span = {i: t for i, t in zip(cols["index"], cols["total_s"]) if t > 0}
                if len(span) >= 0.5 * len(steps):
                    steps = [dict(s, total_s=span[s["index"]]) for s in steps if s["index"] in span]
                    clock = "device"
        except Exception:
            clock = "wall"
    times = [s["total_s"] for s in steps if not s["instrumented"] and s["total_s"] > 0]
    med = statistics.median(times[1:] if len(times) > 3 else times) if times else None
    st = ev.run.status
    if st == "timeout":
        error = ev.run.stop_reason
    if st in ("failed", "oom") and error is None:
        error = ev.run.stop_reason or f"exit status {ev.run.exit_code}"
    return RunOut(label=label, run_dir=run_dir, wall_s=wall, status=st, steps=steps, losses=losses,
                  knob_status=status, peak_memory=peak, error=error, median_step=med, evidence=ev, clock=clock)


def _restart_side(runs: list[RunOut], compiled: bool) -> J.Side:
    from diag.compare.extract import warmup_count

    side = J.Side()
    samples = []
    peaks = []
    for r in runs:
        if r is None or r.status in ("failed", "oom", "killed"):
            continue
        n = len([s for s in r.steps if not s["instrumented"]])
        skip = max(warmup_count(n), COMPILE_WARMUP if compiled else 0)
        rows = J.steady(r.steps, skip)
        side.runs.append([s["total_s"] for s in rows])
        side.losses.extend(r.losses[s["index"]] for s in rows if s["index"] in r.losses)
        samples += [s["samples"] for s in rows if s.get("samples")]
        if r.peak_memory:
            peaks.append(r.peak_memory)
    if samples:
        samples.sort()
        side.samples = float(samples[len(samples) // 2])
    side.peak_memory = max(peaks) if peaks else None
    return side


def _applied(status: dict, ids: list[str]) -> str:
    parts = []
    for k in ids:
        st = status.get(k.split("=")[0]) or status.get(k) or {}
        if st.get("applied"):
            notes = "; ".join(st.get("notes") or [])
            parts.append(f"{k}: applied {st['applied']}x" + (f" ({notes})" if notes else ""))
    return "; ".join(parts)


def _device(rank) -> str:
    if rank is None:
        return "cpu"
    try:
        for m in rank.models or []:
            d = getattr(m, "device", None) or (m.get("device") if isinstance(m, dict) else None)
            if d:
                return str(d).split(":")[0]
    except Exception:
        pass
    return "cpu"


def list_knobs() -> list[dict[str, Any]]:
    return [{"knob": k.id + (f"={k.param}" if k.param else ""), "mode": k.mode, "title": k.title,
             "applies": k.applies, "how": k.trial if k.mode != "none" else f"not from outside: {k.outside}"}
            for k in KNOBS.values()]


def run_try(cfg: TryConfig) -> TryResult:
    if cfg.budget_s <= 0 or not math.isfinite(cfg.budget_s):
        raise DiagError("--budget must be a positive duration, e.g. 5m or 90s")
    return Engine(cfg).go()


__all__ = ["TryConfig", "TryResult", "Engine", "run_try", "list_knobs", "DEFAULT_STEPS", "DEFAULT_BUDGET_S"]
