"""Time and money for training and evaluation: the engine behind ``diag cost`` and the TUI's Cost tab.

Pure Python: no torch, no textual, no printing. Every function returns dataclasses with a
``to_dict()``; every bad input raises :class:`CostError` (a :class:`diag.errors.DiagError`) with one
sentence.

API::

    from diag.cost import estimate, compare, plan_phases, from_evidence, estimate_measured, load_catalog

    e = estimate(params=175e9, tokens=300e9, gpu="A100", count=1024, mfu=0.30)
    e.flops, e.gpu_hours, e.wall_days, e.cost            # 3.15e23, 934_829, 38.0, 2.29e6

    compare(["H100x8", "A100x16"], params=7e9, tokens=140e9)    # -> [Estimate, Estimate]
    plan_phases("explore:0.1x4,tune:0.5x2,full:1", params=1e9, tokens=20e9, gpu="H100", count=8)

    m = from_evidence(evidence)                       # what the probe measured (prefill values)
    estimate_measured(m, epochs=3, gpu="H100", count=8)

How time is computed
--------------------
From a formula: time on one GPU = model FLOPs / (dense peak for the precision × MFU); the MFU is the
one given, else Epoch AI's default (30% for language models, 40% for others), labelled "assumed".
From a measured run on the same GPU: the measured throughput (samples or tokens per second per
device) extrapolated linearly. On another GPU: the measured FLOPs per sample/token at the measured
MFU (or the one given) of the target's peak. Wall-clock time assumes the MFU holds at that GPU count
(communication overhead belongs in the MFU).
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from diag.cost import formulas as F
from diag.cost.catalog import Catalog, CatalogError, Gpu, load_catalog, normalize_precision
from diag.errors import DiagError

# bytes per parameter for mixed-precision Adam training (bf16 weights 2 + fp32 master 4 + Adam m, v 8
# + grads 2): the low end of the usual 16-20 (see docs/cost.md)
BYTES_PER_PARAM_ADAM = 16


class CostError(DiagError):
    """A bad input to the cost engine (one sentence)."""


def _num(name: str, value: Any) -> float:
    try:
        return F._check_positive(name, value)
    except ValueError as e:
        raise CostError(str(e)) from None


def _count(name: str, value: Any) -> int:
    v = _num(name, value)
    if v != int(v):
        raise CostError(f"{name} must be a whole number, got {value:g}")
    return int(v)


def _mfu(value: Any, name: str = "MFU") -> float:
    try:
        return F.check_fraction(name, value)
    except ValueError as e:
        raise CostError(str(e)) from None


_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12, "p": 1e15}


def parse_quantity(text: Any, name: str) -> float:
    """'175e9', '175B', '1.4T', '300_000_000', '7M', '1,000' -> float (> 0), else one sentence."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return _num(name, text)
    s = str(text).strip().replace(",", "").replace("_", "")
    mult = 1.0
    if s and s[-1].lower() in _SUFFIX and not re.fullmatch(r"[0-9.]+e", s.lower()):
        mult = _SUFFIX[s[-1].lower()]
        s = s[:-1]
    try:
        v = float(s) * mult
    except ValueError:
        raise CostError(f"{name} must be a number (like 7e9 or 7B), got {str(text)!r}") from None
    return _num(name, v)


def parse_fraction(text: Any, name: str = "MFU") -> float:
    """'0.4' or '40%' -> 0.4; outside (0, 1] is an error."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return _mfu(text, name)
    s = str(text).strip()
    pct = s.endswith("%")
    try:
        v = float(s[:-1] if pct else s)
    except ValueError:
        raise CostError(f"{name} must be a fraction like 0.4 (or 40%), got {s!r}") from None
    return _mfu(v / 100 if pct else v, name)


# ---- results --------------------------------------------------------------------------------------

@dataclass
class Part:
    """One workload (training or evaluation) priced on one GPU configuration."""
    units: float                      # tokens (or samples) processed
    flops: float                      # model FLOPs
    gpu_hours: float
    wall_hours: float
    cost: float | None                # None without a price
    hardware_flops: float | None = None

    @property
    def wall_days(self) -> float:
        return self.wall_hours / F.HOURS_PER_DAY


@dataclass
class Estimate:
    label: str                        # "A100 80GB SXM x 1024"
    gpu: str                          # catalogue id ("cpu" for a measured CPU run)
    gpu_name: str
    count: int
    precision: str
    peak_flops: float | None          # dense peak per GPU for the precision, FLOP/s
    mfu: float | None                 # model FLOPs utilisation used
    mfu_basis: str                    # "given" | "measured ..." | "assumed (...)"
    rate_flops_per_s: float           # model FLOP/s per GPU used for the time (peak x MFU, or measured)
    price_per_gpu_hour: float | None
    price_basis: str                  # "given" | "catalogue: <source>, as of <date>" | "no price"
    unit: str                         # "tokens" | "samples"
    training: Part | None = None
    eval: Part | None = None
    params: float | None = None
    recompute: str = "none"
    hfu: float | None = None
    basis: str = "formula"            # formula | measured
    flops_formula: str = "6·N·D"      # how the training FLOPs were obtained
    chinchilla_tokens: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def flops(self) -> float:
        return self.training.flops if self.training else 0.0

    @property
    def gpu_hours(self) -> float:
        return sum(p.gpu_hours for p in (self.training, self.eval) if p)

    @property
    def wall_hours(self) -> float:
        return sum(p.wall_hours for p in (self.training, self.eval) if p)

    @property
    def wall_days(self) -> float:
        return self.wall_hours / F.HOURS_PER_DAY

    @property
    def cost(self) -> float | None:
        parts = [p for p in (self.training, self.eval) if p]
        if not parts or any(p.cost is None for p in parts):
            return None
        return sum(p.cost for p in parts)  # type: ignore[misc]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("training", "eval"):
            if d[k] is not None:
                d[k]["wall_days"] = getattr(self, k).wall_days
        d.update(total_gpu_hours=self.gpu_hours, total_wall_hours=self.wall_hours,
                 total_wall_days=self.wall_days, total_cost=self.cost)
        return d


# ---- GPU resolution -------------------------------------------------------------------------------

def _catalog(catalog: Catalog | None) -> Catalog:
    return catalog if catalog is not None else load_catalog()


def _resolve(gpu: str | Gpu, catalog: Catalog) -> Gpu:
    if isinstance(gpu, Gpu):
        return gpu
    if gpu is None or not str(gpu).strip():
        raise CostError("name a GPU with --gpu (for example --gpu H100); 'diag cost --list-gpus' shows the catalogue")
    return catalog.get(str(gpu))


def _precision_for(g: Gpu, precision: str | None) -> tuple[str, float]:
    """The precision to use and its dense peak per card (FLOP/s)."""
    if precision:
        try:
            p = normalize_precision(precision)
        except CatalogError as e:
            raise CostError(e.message) from None
        peak = g.peak_flops(p)
        if peak is None:
            have = ", ".join(k for k in ("bf16", "fp16", "tf32", "fp32", "fp8") if k in g.tflops) or "none"
            raise CostError(f"{g.name} has no dense {p} rate in the catalogue (it has: {have}); "
                            f"choose another --precision")
        return p, peak
    for p in ("bf16", "fp16", "tf32", "fp32"):
        peak = g.peak_flops(p)
        if peak is not None:
            return p, peak
    raise CostError(f"{g.name} has no peak TFLOPS in the catalogue; add them to your catalogue file")


def _price(g: Gpu | None, price: Any) -> tuple[float | None, str]:
    if price is not None:
        p = price if isinstance(price, float) else parse_quantity(price, "price")
        return _num("price", p), "given"
    if g is not None and g.price is not None:
        basis = f"indicative, as of {g.price.as_of}"
        if g.price.range:
            basis += f", range ${g.price.range[0]:.2f}-{g.price.range[1]:.2f}"
        return g.price.usd_per_hour, basis + f"; source: {g.price.source}"
    return None, "no price in the catalogue (pass --price)"


def parse_target(spec: str, default_count: int = 1) -> tuple[str, int]:
    """'H100x8', 'H100*8', '8xH100', 'H100:8' or 'H100' -> (gpu, count)."""
    s = str(spec).strip()
    if not s:
        raise CostError("an empty GPU in --compare (write e.g. H100x8,A100x16)")
    m = re.fullmatch(r"(.+?)\s*[x×*:]\s*(\d+)", s, flags=re.IGNORECASE)
    if m and not re.fullmatch(r".*[x×]\d+", m.group(1), flags=re.IGNORECASE):
        return m.group(1).strip(), _count("GPU count", int(m.group(2)))
    m = re.fullmatch(r"(\d+)\s*[x×*]\s*(.+)", s, flags=re.IGNORECASE)
    if m:
        return m.group(2).strip(), _count("GPU count", int(m.group(1)))
    return s, default_count


def _part(units: float, flops: float, rate: float, count: int, price: float | None,
          hardware: float | None = None) -> Part:
    gpu_s = flops / rate
    gh = gpu_s / F.SECONDS_PER_HOUR
    return Part(units=units, flops=flops, gpu_hours=gh, wall_hours=gh / count, cost=F.money(gh, price),
                hardware_flops=hardware)


def _memory_note(params: float | None, g: Gpu, count: int) -> str | None:
    if not params or not g.memory_gb:
        return None
    need = params * BYTES_PER_PARAM_ADAM / 1e9
    have = g.memory_gb * count
    if need > have:
        return (f"model state alone (≈{BYTES_PER_PARAM_ADAM} bytes/parameter for mixed-precision Adam: "
                f"{need:,.0f} GB) exceeds the memory of {count} x {g.memory_gb:g} GB = {have:,.0f} GB; "
                "more GPUs (or sharding and offloading) are needed")
    return None


# ---- from formulas --------------------------------------------------------------------------------

def estimate(params: Any, tokens: Any, gpu: str | Gpu, count: Any = 1, mfu: Any = None, price: Any = None, *,
             catalog: Catalog | None = None, precision: str | None = None, eval_tokens: Any = None,
             recompute: str = "none", n_layers: int | None = None, n_heads: int | None = None,
             head_dim: int | None = None, seq_len: int | None = None) -> Estimate:
    """Training (6·N·D, plus PaLM's attention term when the architecture is given) and evaluation
    (2·N·D) priced on ``count`` GPUs at ``mfu`` (default: Epoch AI's 30%, labelled assumed)."""
    N = parse_quantity(params, "params")
    D = parse_quantity(tokens, "tokens")
    n = _count("GPU count", count)
    cat = _catalog(catalog)
    g = _resolve(gpu, cat)
    prec, peak = _precision_for(g, precision)
    if mfu is None:
        u, basis = F.DEFAULT_MFU_LLM, "assumed (Epoch AI's default for language models; pass --mfu)"
    else:
        u, basis = parse_fraction(mfu), "given"
    p, pbasis = _price(g, price)
    arch = {"n_layers": n_layers, "n_heads": n_heads, "head_dim": head_dim, "seq_len": seq_len}
    try:
        flops = F.training_flops(N, D, **arch)
        hw = F.hardware_flops(N, D, recompute=recompute, **arch)
        ev_flops = F.eval_flops(N, parse_quantity(eval_tokens, "eval tokens"), **arch) if eval_tokens is not None else None
    except ValueError as e:
        raise CostError(str(e)) from None
    rate = peak * u
    est = Estimate(
        label=f"{g.name} x {n}", gpu=g.id, gpu_name=g.name, count=n, precision=prec, peak_flops=peak, mfu=u,
        mfu_basis=basis, rate_flops_per_s=rate, price_per_gpu_hour=p, price_basis=pbasis, unit="tokens",
        training=_part(D, flops, rate, n, p, hw), params=N, recompute=recompute,
        hfu=u * hw / flops, basis="formula",
        flops_formula="6·N·D + 12·L·H·Q·T·D (PaLM)" if n_layers is not None else "6·N·D",
        chinchilla_tokens=F.chinchilla_tokens(N),
    )
    if ev_flops is not None:
        est.eval = _part(parse_quantity(eval_tokens, "eval tokens"), ev_flops, rate, n, p)
        est.notes.append("evaluation assumed to reach the same MFU as training (forward only: 2·N per token)")
    if recompute == "full" and est.hfu is not None and est.hfu > 1:
        raise CostError(f"with full recomputation an MFU of {u:.0%} means a hardware utilisation of "
                        f"{est.hfu:.0%}, above 100%: lower --mfu")
    mem = _memory_note(N, g, n)
    if mem:
        est.notes.append(mem)
    if g.devices_per_card > 1:
        est.notes.append(f"{g.name}: figures and prices are per card ({g.devices_per_card} devices each in PyTorch)")
    return est


def compare(targets: list[str] | str, params: Any, tokens: Any, count: Any = 1, mfu: Any = None,
            price: Any = None, *, catalog: Catalog | None = None, **kw) -> list[Estimate]:
    """One :class:`Estimate` per target ('H100x8', 'A100x16', ...); the given ``price`` applies only
    when a single target is compared (prices differ by GPU)."""
    if isinstance(targets, str):
        targets = [t for t in targets.split(",")]
    if not targets:
        raise CostError("--compare needs at least one GPU (e.g. H100x8,A100x16)")
    cat = _catalog(catalog)
    out = []
    for spec in targets:
        name, n = parse_target(spec, _count("GPU count", count))
        out.append(estimate(params, tokens, name, n, mfu, price if len(targets) == 1 else None, catalog=cat, **kw))
    return out


# ---- phases ---------------------------------------------------------------------------------------

DEFAULT_PHASES = "explore:0.1x4,tune:0.5x2,full:1"


@dataclass
class Phase:
    name: str
    fraction: float                 # of the full run's tokens/samples
    runs: int = 1
    gpu: str | None = None          # None: the plan's GPU
    count: int | None = None


@dataclass
class PhasePlan:
    phases: list[tuple[Phase, Estimate]]

    @property
    def gpu_hours(self) -> float:
        return sum(e.gpu_hours * ph.runs for ph, e in self.phases)

    @property
    def wall_hours(self) -> float:
        """Phases run one after the other; the runs of a phase too."""
        return sum(e.wall_hours * ph.runs for ph, e in self.phases)

    @property
    def wall_days(self) -> float:
        return self.wall_hours / F.HOURS_PER_DAY

    @property
    def cost(self) -> float | None:
        costs = [e.cost for _, e in self.phases]
        if any(c is None for c in costs):
            return None
        return sum(c * ph.runs for c, (ph, _) in zip(costs, self.phases))  # type: ignore[operator]

    def to_dict(self) -> dict[str, Any]:
        return {"phases": [{"phase": asdict(ph), "estimate": e.to_dict(), "gpu_hours": e.gpu_hours * ph.runs,
                            "wall_hours": e.wall_hours * ph.runs,
                            "cost": None if e.cost is None else e.cost * ph.runs} for ph, e in self.phases],
                "total_gpu_hours": self.gpu_hours, "total_wall_hours": self.wall_hours,
                "total_wall_days": self.wall_days, "total_cost": self.cost}


def parse_phases(spec: str) -> list[Phase]:
    """'explore:0.1x4,tune:0.5x2@A100x8,full:1' -> phases. Each item is NAME:FRACTION[xRUNS][@GPU[xN]];
    FRACTION may be a percentage ('10%'). An empty spec gives :data:`DEFAULT_PHASES`."""
    spec = (spec or "").strip() or DEFAULT_PHASES
    out: list[Phase] = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        m = re.fullmatch(r"([A-Za-z][\w-]*)\s*:\s*([0-9.]+%?)\s*(?:[x×*]\s*(\d+))?\s*(?:@\s*(.+))?", item)
        if not m:
            raise CostError(f"cannot read phase {item!r}: write NAME:FRACTION[xRUNS][@GPU[xN]], "
                            "e.g. explore:0.1x4,tune:0.5x2,full:1")
        name, frac_s, runs_s, target = m.groups()
        frac = parse_fraction(frac_s, f"the fraction of phase {name!r}")
        runs = _count(f"the runs of phase {name!r}", int(runs_s)) if runs_s else 1
        gpu = count = None
        if target:
            gpu, count = parse_target(target, 0)
            count = count or None
        out.append(Phase(name=name, fraction=frac, runs=runs, gpu=gpu, count=count))
    if not out:
        raise CostError("--phases is empty")
    return out


def plan_phases(spec: str | list[Phase], params: Any, tokens: Any, gpu: str, count: Any = 1, mfu: Any = None,
                price: Any = None, *, catalog: Catalog | None = None, measured: "Measured | None" = None,
                **kw) -> PhasePlan:
    """Price a tiered plan: each phase runs ``fraction`` of the full workload ``runs`` times, on the
    plan's GPUs unless the phase names its own. With ``measured``, each phase is extrapolated from the
    measured run (``tokens`` is then the full run's tokens or samples)."""
    phases = parse_phases(spec) if isinstance(spec, str) else list(spec)
    cat = _catalog(catalog)
    full = parse_quantity(tokens, "tokens")
    out = []
    for ph in phases:
        g = ph.gpu or gpu
        n = ph.count or count
        if measured is not None:
            e = estimate_measured(measured, units=full * ph.fraction, gpu=g, count=n, mfu=mfu,
                                  price=price if not ph.gpu else None, catalog=cat)
        else:
            e = estimate(params, full * ph.fraction, g, n, mfu, price if not ph.gpu else None, catalog=cat, **kw)
        e.label = f"{ph.name}: {e.label}"
        out.append((ph, e))
    return PhasePlan(out)


# ---- from a measured run ----------------------------------------------------------------------------

@dataclass
class Measured:
    """What the probe measured, reduced to what the estimate needs (and what the TUI pre-fills)."""
    params: float | None
    unit: str                           # tokens | samples
    units_per_step: float               # per device (rank)
    model_flops_per_step: float
    hardware_flops_per_step: float
    step_s: float                       # median step time (instrumented step excluded)
    units_per_s: float                  # per device
    world_size: int
    device: str                         # cuda | cpu | mps
    device_name: str | None
    gpu: str | None                     # catalogue id of the device
    precision: str
    peak_flops: float | None            # per device
    mfu: float | None
    hfu: float | None
    samples_per_step: float | None = None
    tokens_per_step: float | None = None
    dataset_len: int | None = None      # samples in the training DataLoader's dataset
    steps_timed: int = 0
    recompute_detected: bool = False
    overhead_ratio: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def flops_per_unit(self) -> float:
        return self.model_flops_per_step / self.units_per_step

    @property
    def units_per_epoch(self) -> float | None:
        if not self.dataset_len:
            return None
        if self.unit == "samples":
            return float(self.dataset_len)
        if self.samples_per_step and self.tokens_per_step:
            return self.dataset_len * self.tokens_per_step / self.samples_per_step
        return None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["flops_per_unit"] = self.flops_per_unit
        d["units_per_epoch"] = self.units_per_epoch
        return d


def from_evidence(ev) -> Measured:
    """The measured step of a run (``flops.measured`` on rank 0) and its timing, for estimates and
    for pre-filling the TUI. Raises :class:`CostError` when nothing was measured."""
    from diag.cost.measured import judge_rank

    if not ev.ranks:
        raise CostError("the evidence holds no process: nothing was measured")
    r = ev.primary
    m = (r.flops or {}).get("measured") if isinstance(r.flops, dict) else None
    if not m:
        status = (r.flops or {}).get("status") if isinstance(r.flops, dict) else None
        raise CostError("the evidence has no FLOP measurement"
                        + (f" ({status})" if status else " (the run needs at least 3 training steps)"))
    if not m.get("flops"):
        raise CostError("the measured step counted no FLOPs (compiled or custom kernels are invisible to "
                        "FlopCounterMode); estimate with --params instead")
    m, s = judge_rank(r)      # the catalogue peak looked up now, from the recorded device name
    if not s.get("step_s"):
        raise CostError("the evidence has no timed step besides the measured one: run a few more steps")
    tokens = m.get("tokens")
    samples = m.get("samples")
    unit = "tokens" if tokens else "samples"
    per_step = tokens or samples
    if not per_step:
        raise CostError("the measured step's batch size is unknown (no tensor input to the model)")
    world = max(int(m.get("world_size") or 1), len(ev.ranks), 1)
    loaders = [d for d in r.dataloaders if d.dataset_len]
    ds_len = max((d.dataset_len for d in loaders), default=None) if loaders else None
    notes = []
    if m.get("recompute_detected"):
        notes.append("activation recomputation detected: MFU counts 3x the forward FLOPs, HFU what executed")
    if m.get("method") == "analytic":
        notes.append("compiled model: the step's FLOPs are 6 x non-embedding parameters x tokens/samples, not counted")
    elif m.get("compiled"):
        notes.append("the model is compiled: FlopCounterMode may not see fused kernels, FLOPs can be low")
    if m.get("peak_note"):
        notes.append(m["peak_note"])
    return Measured(
        params=m.get("params"), unit=unit, units_per_step=float(per_step),
        model_flops_per_step=float(m.get("model_flops") or m["flops"]), hardware_flops_per_step=float(m["flops"]),
        step_s=float(s["step_s"]), units_per_s=float(per_step) / float(s["step_s"]), world_size=world,
        device=m.get("device") or "cpu", device_name=m.get("device_name"), gpu=m.get("gpu"),
        precision=m.get("precision") or "fp32", peak_flops=m.get("peak_flops"), mfu=s.get("mfu"),
        hfu=s.get("hfu"), samples_per_step=samples, tokens_per_step=tokens, dataset_len=ds_len,
        steps_timed=int(s.get("steps_timed") or 0), recompute_detected=bool(m.get("recompute_detected")),
        overhead_ratio=s.get("overhead_ratio"), notes=notes,
    )


def estimate_measured(m: Measured, *, tokens: Any = None, samples: Any = None, epochs: Any = None,
                      units: Any = None, gpu: str | None = None, count: Any = None, mfu: Any = None,
                      price: Any = None, eval_tokens: Any = None, precision: str | None = None,
                      catalog: Catalog | None = None) -> Estimate:
    """Extrapolate a measured run to a full workload (``tokens`` for token models, ``samples`` or
    ``epochs`` otherwise; ``units`` is either, in the measured unit).

    Same device (``gpu`` None or the measured one, no ``mfu``): measured throughput per device times
    ``count`` (default: the run's world size). Another GPU, or an ``mfu`` given: measured FLOPs per
    token/sample at the measured MFU (else the given one, else Epoch AI's default) of its peak.
    """
    cat = _catalog(catalog)
    given = [x for x in (tokens, samples, epochs, units) if x is not None]
    if len(given) != 1:
        raise CostError("give exactly one of --tokens, --samples or --epochs to extrapolate the measured run")
    if units is not None:
        work = parse_quantity(units, m.unit)
    elif epochs is not None:
        ep = parse_quantity(epochs, "epochs")
        per_epoch = m.units_per_epoch
        if per_epoch is None:
            raise CostError("the run's dataset size is unknown (no DataLoader with a sized dataset): "
                            f"use --{m.unit} instead of --epochs")
        work = ep * per_epoch
    elif tokens is not None:
        if m.unit != "tokens":
            raise CostError("the measured model takes no token ids (its first input is not a 2-D integer "
                            "tensor): use --samples or --epochs")
        work = parse_quantity(tokens, "tokens")
    else:
        work = parse_quantity(samples, "samples")
        if m.unit == "tokens":
            if not (m.samples_per_step and m.tokens_per_step):
                raise CostError("the tokens per sample of the measured run are unknown: use --tokens")
            work *= m.tokens_per_step / m.samples_per_step
    n = _count("GPU count", count) if count is not None else m.world_size
    same = gpu is None or (m.gpu is not None and _resolve(gpu, cat).id == m.gpu)
    flops = m.flops_per_unit * work
    hw = m.hardware_flops_per_step / m.units_per_step * work
    notes = list(m.notes)
    g: Gpu | None = None
    if same and mfu is None and precision is None:
        if m.gpu is not None:
            g = cat.gpus.get(m.gpu)
        rate = m.model_flops_per_step / m.step_s           # measured model FLOP/s per device
        u = m.mfu
        basis = f"measured over {m.steps_timed} timed steps" if u is not None else \
            f"measured over {m.steps_timed} timed steps"
        label_gpu = g.name if g else (m.device_name or m.device)
        gid = g.id if g else m.device
        prec, peak = m.precision, m.peak_flops
        notes.append(f"extrapolated from the measured throughput: {m.units_per_s:,.1f} {m.unit}/s per device")
    else:
        g = _resolve(gpu if gpu is not None else (m.gpu or ""), cat)
        prec, peak = _precision_for(g, precision or (m.precision if m.precision in g.tflops else None))
        if mfu is not None:
            u, basis = parse_fraction(mfu), "given"
        elif m.mfu is not None:
            u, basis = min(m.mfu, 1.0), f"measured on {m.device_name or m.gpu} (assumed to carry over)"
        else:
            u = F.DEFAULT_MFU_LLM if m.unit == "tokens" else F.DEFAULT_MFU_OTHER
            basis = ("assumed (Epoch AI's default for "
                     + ("language models" if m.unit == "tokens" else "non-language models")
                     + f"; the run was measured on {m.device_name or m.device}, without a catalogue peak)")
        rate = peak * u
        label_gpu, gid = g.name, g.id
        notes.append(f"measured FLOPs per {m.unit[:-1]}: {m.flops_per_unit:.3g}")
        best = g.peak_flops("bf16") or g.peak_flops("fp16")
        if prec in ("fp32", "tf32") and best and best > 1.5 * peak:
            notes.append(f"the run used {m.precision}: under bf16/fp16 autocast {g.name}'s dense peak is "
                         f"{best / 1e12:,.0f} TFLOPS instead of {peak / 1e12:,.0f} (try --precision bf16)")
    p, pbasis = _price(g, price)
    est = Estimate(
        label=f"{label_gpu} x {n}", gpu=gid, gpu_name=label_gpu, count=n, precision=prec, peak_flops=peak,
        mfu=u, mfu_basis=basis, rate_flops_per_s=rate, price_per_gpu_hour=p, price_basis=pbasis, unit=m.unit,
        training=_part(work, flops, rate, n, p, hw), params=m.params, basis="measured",
        flops_formula=f"measured FLOPs per {m.unit[:-1]} x {m.unit}",
        hfu=(u * m.hardware_flops_per_step / m.model_flops_per_step) if u else None,
        recompute="full" if m.recompute_detected else "none",
        chinchilla_tokens=F.chinchilla_tokens(m.params) if m.params and m.unit == "tokens" else None,
        notes=notes,
    )
    if eval_tokens is not None:
        ev_units = parse_quantity(eval_tokens, f"eval {m.unit}")
        # forward only: a third of the training model FLOPs per unit (2N of 6N)
        est.eval = _part(ev_units, m.flops_per_unit / 3.0 * ev_units, rate, n, p)
        est.notes.append("evaluation: a third of the measured training FLOPs per unit (forward only), "
                         "at the same FLOP/s as training")
    if g is not None:
        mem = _memory_note(m.params, g, n)
        if mem:
            est.notes.append(mem)
    if n != m.world_size:
        est.notes.append(f"measured on {m.world_size} device(s); {n} assumed to scale linearly")
    if math.isclose(rate, 0.0):
        raise CostError("the measured throughput is zero")
    return est
