"""The Cost tab's logic, without textual: what the form is prefilled with, and what it computes.

Everything is priced by :mod:`diag.cost` (the same engine as ``diag cost``): a formula estimate
(6·N·D training, 2·N·D evaluation) or, when the run measured a step's FLOPs, an extrapolation of the
measured run. The form's text goes through the engine's own parsers (7B, 1.4T, 40%, ...), so the tab
accepts what the command line accepts and says the same sentence when a value is wrong.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from diag.cost import CostError, estimate, estimate_measured, from_evidence, load_catalog, plan_phases
from diag.cost.catalog import CatalogError
from diag.cost.eval import estimate_eval, eval_frequency, eval_from_evidence
from diag.errors import DiagError

MEASURED = "measured"           # the basis values of the form
FORMULA = "formula"
SAME_DEVICE = "__measured__"    # the GPU select's value for "the device the run measured on"
FIELDS = ("basis", "params", "work", "eval", "gpu", "count", "mfu", "price")
DEFAULT_GPU = "h100-sxm"


@dataclass
class CostInputs:
    basis: str = FORMULA
    params: str = "7B"
    work: str = "140B"             # tokens (or samples); "3 epochs" with a measured run
    eval: str = ""                 # evaluation tokens/samples (blank: none)
    gpu: str = DEFAULT_GPU
    count: str = "8"
    mfu: str = ""                  # blank: measured, else Epoch AI's default (labelled assumed)
    price: str = ""                # blank: the catalogue's price

    def as_dict(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in FIELDS}


@dataclass
class Prefill:
    inputs: CostInputs
    measured: Any = None             # diag.cost.Measured, when the run measured a step
    why_not_measured: str | None = None
    unit: str = "tokens"
    notes: list[str] = field(default_factory=list)
    eval_measured: Any = None        # diag.cost.eval.EvalMeasured, when the run evaluated
    frequency: Any = None            # diag.cost.eval.EvalFrequency: a training run's periodic evaluation


@dataclass
class CostResult:
    main: Any = None                 # diag.cost.Estimate
    compare: list = field(default_factory=list)   # [Estimate] across the catalogue, cheapest first
    plan: Any = None                 # diag.cost.PhasePlan (explore / tune / full)
    eval_measured: Any = None        # diag.cost.eval.EvalEstimate: "evaluate on" at the measured evaluation rate
    error: str | None = None


_catalog = None


def catalog():
    global _catalog
    if _catalog is None:
        _catalog = load_catalog()
    return _catalog


def _si_text(v: float) -> str:
    for suffix, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if v >= size:
            x = v / size
            return (f"{x:.0f}" if x == int(x) else f"{x:.3g}") + suffix
    return f"{v:.0f}"


def _gpu_from_devices(device_names: list[str]) -> str | None:
    cat = catalog()
    for name in device_names:
        g = cat.match_device(name)
        if g is not None:
            return g.id
    return None


def prefill(evidence=None, device_names: list[str] | None = None) -> Prefill:
    """Form values from what is known: the measured run, else the model's size, else an example."""
    device_names = list(device_names or [])
    seen_gpu = _gpu_from_devices(device_names)
    count = str(len(device_names)) if device_names else "8"
    inputs = CostInputs(gpu=seen_gpu or DEFAULT_GPU, count=count)
    pre = Prefill(inputs)
    if evidence is None or not evidence.ranks:
        pre.notes.append("an example (7B parameters, Chinchilla's 20 tokens per parameter); edit any field")
        return pre
    try:
        m = from_evidence(evidence)
    except DiagError as e:
        m = None
        pre.why_not_measured = e.message
    params = None
    models = evidence.primary.models
    if models:
        params = max(x.params_total for x in models) or None
    if m is not None:
        pre.measured = m
        pre.unit = m.unit
        inputs.basis = MEASURED
        params = m.params or params
        inputs.gpu = m.gpu or seen_gpu or SAME_DEVICE
        if m.gpu is None and not seen_gpu:
            inputs.gpu = SAME_DEVICE
        inputs.count = str(max(m.world_size, 1))
        if m.units_per_epoch:
            inputs.work = "10 epochs"
        elif m.unit == "tokens" and params:
            inputs.work = _si_text(20 * params)
        else:
            inputs.work = _si_text(m.units_per_s * 3600)     # an hour of the measured throughput
        pre.notes.append(f"prefilled from the measured run ({m.steps_timed} timed steps, "
                         f"{m.units_per_s:,.1f} {m.unit}/s per device on {m.device_name or m.device})")
        if not m.units_per_epoch and not (m.unit == "tokens" and params):
            pre.notes.append(f"the dataset's size is unknown (no sized DataLoader): 'train on' starts at one "
                             f"hour of that throughput; type the {m.unit} you will train on")
    else:
        if params:
            pre.notes.append(f"the model has {_si_text(params)} parameters; tokens: Chinchilla's 20 per parameter")
        if evidence.ranks and evidence.primary.run_kind() == "evaluation":
            pre.notes.append("an evaluation run has no training step to measure: training is priced by "
                             "the formula (6·N·D); evaluation is priced from the measured rate")
        elif pre.why_not_measured:
            pre.notes.append(f"formula only: {pre.why_not_measured}")
    if params:
        inputs.params = _si_text(params)
        if inputs.basis == FORMULA:
            inputs.work = _si_text(20 * params)
    try:
        em = eval_from_evidence(evidence, catalog=catalog())
    except DiagError:
        em = None
    if em is not None:
        pre.eval_measured = em
        loaders = [d for d in evidence.primary.eval_loaders() if d.dataset_len]
        try:
            freq = eval_frequency(evidence, catalog=catalog())
        except DiagError:
            freq = None
        ratio = eval_ratio(em, evidence, freq)
        form_unit = m.unit if (m is not None and inputs.basis == MEASURED) else "tokens"
        train_units = _units_of(inputs.work, m if inputs.basis == MEASURED else None, params) \
            if em.unit == form_unit else None
        if ratio is not None and train_units:
            # a training run that evaluates: as much evaluation per training unit as the run did
            inputs.eval = _si_text(ratio * train_units)
            what = (f"the run's ratio ({_si_text(ratio * 1000)} evaluation {em.unit} per 1,000 training "
                    f"{em.unit}: a pass every {freq.every or 0:.0f} steps)")
        elif em.kind != "evaluation" and freq is not None and freq.passes and em.batch:
            # a training run whose training side is in another unit: one of its evaluation passes
            inputs.eval = _si_text(em.batch * em.steps / freq.passes)
            what = "one of the run's evaluation passes (type the total you will evaluate on)"
        elif em.unit == "samples" and loaders:
            inputs.eval = _si_text(max(d.dataset_len for d in loaders))
            what = "the evaluation set's size"
        else:
            inputs.eval = _si_text(em.units_per_s * 3600)
            what = "an hour of that throughput"
        pre.notes.append(f"evaluation measured: {em.units_per_s:,.1f} {em.unit}/s on {em.device_name or em.device} "
                         f"over {em.steps} evaluation steps; 'evaluate on' starts at {what}")
        pre.frequency = freq
    return pre


def eval_ratio(em, evidence, freq) -> float | None:
    """Evaluation units per training unit, as the run did them (units per pass over the units trained
    between passes); None unless a training run measured its evaluation interval and both sides in the
    evaluation's unit."""
    if em is None or freq is None or not em.batch or not freq.passes or not (freq.every or 0) > 0:
        return None
    st = evidence.primary.step_stats
    trained = st.tokens if em.unit == "tokens" else st.samples
    if not st.count or not trained:
        return None
    per_pass = em.batch * em.steps / freq.passes
    return per_pass / (trained / st.count * freq.every)


def _units_of(work: str, m, params) -> float | None:
    """The training units the prefilled 'train on' stands for (``m`` None: the formula's tokens)."""
    if m is None:
        return 20.0 * params if params else None
    ep = _EPOCHS.match(work or "")
    if ep:
        return float(ep.group(1)) * m.units_per_epoch if m.units_per_epoch else None
    if m.unit == "tokens" and params:
        return 20.0 * params
    return m.units_per_s * 3600


_EPOCHS = re.compile(r"^\s*([0-9.]+)\s*(epochs?|ep)\s*$", re.IGNORECASE)


def _blank(s: str) -> bool:
    return not str(s or "").strip()


def compute(inp: CostInputs, measured=None, compare_all: bool = True, eval_measured=None) -> CostResult:
    """Price the form. Every bad value comes back as ``error`` (one sentence), never an exception.
    ``eval_measured`` (diag.cost.eval.EvalMeasured): "evaluate on" is also priced at the run's measured
    evaluation throughput (``eval_measured`` of the result)."""
    try:
        if eval_measured is not None and inp.basis != MEASURED and measured is None:
            # the form's evaluation is priced at the measured evaluation rate, not by the formula in tokens
            from dataclasses import replace

            out = _compute(replace(inp, eval=""), measured, compare_all)
        else:
            out = _compute(inp, measured, compare_all)
        if eval_measured is not None and not _blank(inp.eval):
            # at the rate the run measured, on the device it ran on (the GPU select prices training)
            price = None if _blank(inp.price) else inp.price
            out.eval_measured = estimate_eval(eval_measured, inp.eval, unit=eval_measured.unit, price=price,
                                              catalog=catalog())
        return out
    except (CostError, CatalogError, DiagError) as e:
        return CostResult(error=e.message)
    except (ValueError, TypeError, ZeroDivisionError, OverflowError) as e:
        return CostResult(error=str(e))


def _compute(inp: CostInputs, measured, compare_all: bool) -> CostResult:
    mfu = None if _blank(inp.mfu) else inp.mfu
    price = None if _blank(inp.price) else inp.price
    count = inp.count.strip() or "1"
    try:
        n = int(float(count))
        if float(count) != n:
            raise ValueError
    except ValueError:
        raise CostError(f"the GPU count must be a whole number, got {count!r}") from None
    ev_units = None if _blank(inp.eval) else inp.eval
    cat = catalog()
    out = CostResult()
    if inp.basis == MEASURED and measured is not None:
        kw: dict[str, Any] = {}
        m_ep = _EPOCHS.match(inp.work or "")
        if m_ep:
            kw["epochs"] = m_ep.group(1)
        else:
            kw["units"] = inp.work
        gpu = None if inp.gpu in (SAME_DEVICE, "") else inp.gpu
        out.main = estimate_measured(measured, gpu=gpu, count=n, mfu=mfu, price=price, eval_tokens=ev_units,
                                     catalog=cat, **kw)
        if compare_all:
            for g in cat:
                try:
                    out.compare.append(estimate_measured(measured, gpu=g.id, count=n, mfu=mfu, catalog=cat, **kw))
                except DiagError:
                    continue
        units = out.main.training.units
        out.plan = plan_phases("", None, units, gpu, n, mfu, price, catalog=cat, measured=measured)
    else:
        out.main = estimate(inp.params, inp.work, inp.gpu, n, mfu, price, catalog=cat, eval_tokens=ev_units)
        if compare_all:
            for g in cat:
                try:
                    out.compare.append(estimate(inp.params, inp.work, g.id, n, mfu, catalog=cat))
                except DiagError:
                    continue
        out.plan = plan_phases("", inp.params, inp.work, inp.gpu, n, mfu, price, catalog=cat)
    out.compare.sort(key=lambda e: (e.cost is None, e.cost if e.cost is not None else e.wall_hours))
    return out
