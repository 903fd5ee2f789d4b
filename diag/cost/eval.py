"""The cost of evaluation from a measured run (``diag cost --from RUN --eval-samples N | --eval-tokens N``
and the TUI's Cost tab). Pure Python, no torch.

- **Throughput**: the evaluation steps' measured samples/s (tokens/s for token inputs) on the run's
  device turns an evaluation set into time, GPU-hours and money (the catalogue's price for the
  measured GPU, or ``--price``). Another GPU (``--gpu``): the measured FLOPs per sample at an MFU
  (``--mfu``, else the run's measured one when its device has a catalogue peak, else Epoch AI's
  default) of that GPU's dense peak.
- **FLOPs**: one evaluation forward counted with FlopCounterMode (``flops.eval``: evaluation-only
  runs), or the forward FLOPs of the training step's measurement (training runs), shown beside the
  analytic 2·N·D.
- **Evaluation frequency**: for a training run with periodic evaluation, the share of wall time the
  passes took and what evaluating every k steps would cost or save, from the run's own pass and step
  times (per 1,000 training steps and over the measured run).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from diag.cost import formulas as F
from diag.cost.catalog import Catalog
from diag.cost.estimate import (CostError, _catalog, _count, _precision_for, _price, _resolve, parse_fraction,
                                parse_quantity)
from diag.cost.measured import peak_for


@dataclass
class EvalMeasured:
    """What a run measured about its evaluation."""
    kind: str                           # the run's kind: evaluation | training+evaluation
    unit: str                           # samples | tokens
    units_per_s: float                  # measured evaluation throughput on the run's device
    batches_per_s: float
    steps: int                          # evaluation steps timed
    batch: float | None                 # mean units per evaluation step
    device: str                         # cuda | cpu | ...
    device_name: str | None
    gpu: str | None                     # catalogue id of the device, when known
    flops_per_unit: float | None        # measured FLOPs of one evaluation forward per unit
    flops_source: str | None            # "evaluation forward (FlopCounterMode)" | "training step's forward"
    params: float | None
    analytic_per_unit: float | None     # 2·N
    precision: str | None
    world_size: int = 1
    notes: list[str] = field(default_factory=list)

    @property
    def ratio_to_analytic(self) -> float | None:
        if self.flops_per_unit and self.analytic_per_unit:
            return self.flops_per_unit / self.analytic_per_unit
        return None

    @property
    def achieved_flops_per_s(self) -> float | None:
        return self.flops_per_unit * self.units_per_s if self.flops_per_unit else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ratio_to_analytic"] = self.ratio_to_analytic
        d["achieved_flops_per_s"] = self.achieved_flops_per_s
        return d


@dataclass
class EvalEstimate:
    units: float
    unit: str
    label: str                          # the device(s) priced
    count: int
    basis: str                          # how the rate was obtained
    units_per_s: float                  # per device
    seconds: float                      # wall-clock on ``count`` devices
    device_hours: float
    cost: float | None
    price_per_hour: float | None
    price_basis: str
    flops: float | None                 # measured FLOPs per unit x units
    analytic_flops: float | None        # 2·N·D
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class IntervalRow:
    every: float                        # evaluate every this many training steps
    share: float                        # of training+evaluation wall time
    eval_s_per_1000_steps: float
    delta_s_per_1000_steps: float       # against the run's own interval (negative: saves)
    delta_cost_per_1000_steps: float | None
    current: bool = False


@dataclass
class EvalFrequency:
    passes: int
    every: float | None                 # the run's median interval (training steps)
    per_pass_s: float
    step_s: float                       # mean training step
    eval_s: float
    train_s: float
    share: float
    rows: list[IntervalRow] = field(default_factory=list)
    price_per_hour: float | None = None
    count: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---- from evidence --------------------------------------------------------------------------------

def eval_from_evidence(ev, catalog: Catalog | None = None) -> EvalMeasured:
    """The evaluation a run measured. Raises :class:`CostError` when it has none."""
    if not ev.ranks:
        raise CostError("the evidence holds no process: nothing was measured")
    r = ev.primary
    tp = r.eval_throughput()
    if tp is None:
        raise CostError("the run has no evaluation step (no forward that did not train): "
                        "run an evaluation script, or a training run that evaluates, under `diag check`")
    tokens = bool(tp.get("tokens_per_s"))
    unit = "tokens" if tokens else "samples"
    rate = tp["tokens_per_s"] if tokens else tp["samples_per_s"]
    if not rate:
        raise CostError("the evaluation steps' batch size is unknown (no tensor input with a batch dimension)")
    timed = tp.get("timed") or tp["steps"]
    batch = (tp["tokens"] if tokens else tp["samples"]) / timed if timed else None
    fl = r.flops if isinstance(r.flops, dict) else {}
    e = fl.get("eval") or {}
    m = fl.get("measured") or {}
    notes: list[str] = []
    flops_pu = params = None
    source = precision = None
    device = device_name = None
    if e.get("flops"):
        units = e.get("tokens") if tokens else e.get("samples")
        if units:
            flops_pu = e["flops"] / units
            source = f"evaluation forward {e.get('eval_step')}, FlopCounterMode"
        params = e.get("params")
        precision = e.get("precision")
        device, device_name = e.get("device"), e.get("device_name")
    elif m and m.get("forward_flops"):
        units = m.get("tokens") if tokens else m.get("samples")
        if units:
            flops_pu = float(m["forward_flops"]) / units
            source = f"the forward of training step {m.get('step')}, FlopCounterMode"
        params = m.get("params")
        precision = m.get("precision")
        device, device_name = m.get("device"), m.get("device_name")
    if params is None:
        sites = r.eval_forward_sites()
        models = {s.model for s in sites}
        params = sum(mm.params_total for mm in r.models if mm.id in models) or None
    if device is None:
        devs = [str(d) for s in r.eval_forward_sites() for mm in [r.model(s.model)] if mm for d in mm.devices]
        device = devs[0].split(":")[0] if devs else "cpu"
        if device == "cuda":
            cuda = [d for d in ev.environment.devices if d.type == "cuda"]
            device_name = cuda[0].name if cuda else None
    gpu = None
    if device_name:
        gid, _peak, _note = peak_for(device_name, "fp32")
        gpu = gid
    if flops_pu is None:
        notes.append("no FLOP measurement of an evaluation forward: FLOPs shown from 2·N·D only")
    analytic = 2.0 * params if params else None
    if analytic and not tokens and params:
        notes.append("2·N·D per sample counts 2 FLOPs per parameter per sample (one multiply-add); convolutions "
                     "and attention reuse weights, so measured FLOPs differ")
    kind = ev.run_kind()
    return EvalMeasured(kind=kind, unit=unit, units_per_s=float(rate), batches_per_s=float(tp["batches_per_s"]),
                        steps=timed, batch=batch, device=device, device_name=device_name, gpu=gpu,
                        flops_per_unit=flops_pu, flops_source=source, params=params,
                        analytic_per_unit=analytic, precision=precision,
                        world_size=max(len(ev.ranks), 1), notes=notes)


def estimate_eval(m: EvalMeasured, units: Any, *, unit: str, gpu: str | None = None, count: Any = None,
                  mfu: Any = None, price: Any = None, precision: str | None = None,
                  catalog: Catalog | None = None) -> EvalEstimate:
    """Time and money to evaluate ``units`` samples (or tokens) at the measured throughput, or on another
    GPU at an MFU of its peak."""
    cat = _catalog(catalog)
    if unit != m.unit:
        if unit == "tokens":
            raise CostError("the evaluated model takes no token ids (its input is not a 2-D integer tensor): "
                            "use --eval-samples")
        raise CostError("the evaluated model takes token ids: use --eval-tokens (tokens = samples x sequence length)")
    work = parse_quantity(units, f"eval {unit}")
    if work <= 0:
        raise CostError(f"--eval-{unit} must be more than 0")
    n = _count("GPU count", count) if count is not None else 1
    same = gpu is None or (m.gpu is not None and _resolve(gpu, cat).id == m.gpu)
    notes = list(m.notes)
    g = None
    if same and mfu is None and precision is None:
        if m.gpu is not None:
            g = cat.gpus.get(m.gpu)
        rate_units = m.units_per_s
        label = g.name if g else (m.device_name or m.device)
        basis = f"measured: {m.units_per_s:,.1f} {unit}/s over {m.steps} evaluation steps on {label}"
    else:
        if not m.flops_per_unit:
            raise CostError("pricing another GPU needs the FLOPs of one evaluation forward, and the run "
                            "measured none (it needs at least 3 evaluation batches)")
        g = _resolve(gpu if gpu is not None else (m.gpu or ""), cat)
        prec, peak = _precision_for(g, precision)
        if mfu is not None:
            u, ubasis = parse_fraction(mfu), "given"
        else:
            u, ubasis = (F.DEFAULT_MFU_LLM if unit == "tokens" else F.DEFAULT_MFU_OTHER), "assumed, Epoch AI's default"
        rate_units = peak * u / m.flops_per_unit
        label = g.name
        basis = f"{m.flops_per_unit:.3g} FLOPs/{unit[:-1]} (measured) at MFU {u:.0%} ({ubasis}) of {prec} peak"
        notes.append("evaluation rarely reaches training's MFU: small batches and Python between forwards "
                     "leave the device idle; the measured run's own rate is the safer figure")
    p, pbasis = _price(g, price)
    if math.isclose(rate_units, 0.0):
        raise CostError("the measured evaluation throughput is zero")
    seconds = work / (rate_units * n)
    dev_hours = seconds * n / F.SECONDS_PER_HOUR
    if n > 1:
        notes.append(f"{n} devices assumed to scale linearly (evaluation shards by sample)")
    return EvalEstimate(units=work, unit=unit, label=f"{label} x {n}", count=n, basis=basis,
                        units_per_s=rate_units, seconds=seconds, device_hours=dev_hours,
                        cost=F.money(dev_hours, p), price_per_hour=p, price_basis=pbasis,
                        flops=m.flops_per_unit * work if m.flops_per_unit else None,
                        analytic_flops=m.analytic_per_unit * work if m.analytic_per_unit else None, notes=notes)


def eval_frequency(ev, *, price: Any = None, gpu: str | None = None, count: Any = None,
                   catalog: Catalog | None = None) -> EvalFrequency | None:
    """The share of a training run's wall time its evaluation passes took, and what evaluating every k
    steps would cost or save (k = the run's interval x 1/4, 1/2, 1, 2, 4, 10), from its mean pass time
    and mean training step (so the run's own interval reproduces its measured share). None for a run
    without both."""
    if not ev.ranks:
        return None
    s = ev.primary.eval_share()
    if s is None:
        return None
    cat = _catalog(catalog)
    g = None
    if gpu is not None:
        g = _resolve(gpu, cat)
    else:
        cuda = [d for d in ev.environment.devices if d.type == "cuda"]
        if cuda:
            gid, _p, _n = peak_for(cuda[0].name, "fp32")
            g = cat.gpus.get(gid) if gid else None
    p, _basis = _price(g, price)
    n = _count("GPU count", count) if count is not None else max(len(ev.ranks), 1)
    every = s["every"] or (s["steps"] / s["passes"])
    freq = EvalFrequency(passes=s["passes"], every=s["every"], per_pass_s=s["per_pass_s"], step_s=s["step_s"],
                         eval_s=s["eval_s"], train_s=s["train_s"], share=s["share"], price_per_hour=p, count=n)
    base = 1000.0 / every * s["per_pass_s"]
    for f in (0.25, 0.5, 1, 2, 4, 10):
        k = max(every * f, 1.0)
        ev_s = 1000.0 / k * s["per_pass_s"]
        share = ev_s / (ev_s + 1000.0 * s["step_s"])
        delta = ev_s - base
        freq.rows.append(IntervalRow(every=k, share=share, eval_s_per_1000_steps=ev_s,
                                     delta_s_per_1000_steps=delta,
                                     delta_cost_per_1000_steps=F.money(delta * n / F.SECONDS_PER_HOUR, p)
                                     if p is not None else None, current=(f == 1)))
    return freq
