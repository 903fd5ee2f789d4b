"""Peak-memory estimation without the GPU: replay one training step on fake tensors.

The probe captures the live model, its optimizer(s) and the *shapes* of one real input batch (never
the tensors themselves). :class:`StepReplay` then runs, at any batch size, what the user's loop runs::

    opt.zero_grad(set_to_none=<as the script did>)
    out = model(*inputs)          # the live module, with every parameter and buffer swapped for a
    loss = <surrogate>(out)       # fake tensor (torch.func.functional_call), so nothing real moves
    loss.backward()
    opt.step()                    # a new optimizer of the same class and hyper-parameters

twice (the second iteration is the steady state: optimizer state exists and, with
``set_to_none=False``, so do the gradients), under torch's ``FakeTensorMode`` (tensors carry shape,
dtype and device but no storage) and a dispatch-level tracker (:class:`_Tracker`) that sees every
storage created and freed. No real memory proportional to the model or the batch is allocated.

What the tracker counts is what CUDA's caching allocator would report as *allocated*
(``torch.cuda.max_memory_allocated``): every storage, rounded up to the allocator's 512-byte
blocks. What it cannot see (CUDA context, cuBLAS/cuDNN workspaces, allocator caching) is added as
documented allowances in :mod:`diag.memory.plan`.

The surrogate loss: a 0-dim output that requires grad (a model that computes its own loss) is used
as is; otherwise ``log_softmax(out.float(), -1).mean()`` over the first floating output, which
keeps one fp32 output-sized tensor for the backward, as cross-entropy does.

Limits (each becomes a ``skipped`` estimate with the reason, never a wrong number): ops with
data-dependent shapes or values (``nonzero``, boolean masks, ``.item()``), custom ops with no
fake/meta kernel, inputs that are not tensors/lists/tuples/dicts/plain values, models sharded by
FSDP.

This module imports torch; it runs inside the user's process (the probe) or in a benchmark. The pure
planning over its results (allowances, batch-size search) is :mod:`diag.memory.plan`.
"""
from __future__ import annotations

import contextlib
import time
import weakref
from typing import Any, Callable

import torch

from diag.probe.hooks import remove_hooks

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "other")

# raw tags -> the five categories shown to users
TAG_CATEGORY = {
    "param": "parameters", "buffer": "parameters",
    "grad": "gradients",
    "opt_state": "optimizer_state",
    "act": "activations", "eval": "activations",
    "input": "other", "temp": "other", "opt_temp": "other", "setup": "other",
}
PHASE_TAG = {"forward": "act", "backward": "temp", "optimizer": "opt_temp", "eval": "eval",
             "zero_grad": "temp", "input": "input", "setup": "setup"}

MATMUL_OPS = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "_addmm_activation",
              "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
              "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
              "_scaled_mm", "addmv", "mv", "dot"}
CONV_OPS = {"convolution", "_convolution", "cudnn_convolution", "mkldnn_convolution", "convolution_backward",
            "cudnn_convolution_transpose", "conv2d", "conv1d", "conv3d"}

CUDA_BLOCK = 512          # the CUDA caching allocator rounds every block up to 512 bytes


class ReplayError(Exception):
    """The step cannot be replayed on fake tensors; ``str(e)`` is one sentence for the user."""


# ---------------------------------------------------------------------------------------------------
# input capture: shapes only

class TensorSpec:
    __slots__ = ("shape", "dtype", "requires_grad", "device_type")

    def __init__(self, t: torch.Tensor):
        self.shape = tuple(int(s) for s in t.shape)
        self.dtype = t.dtype
        self.requires_grad = bool(t.requires_grad)
        self.device_type = t.device.type

    def to_dict(self) -> dict:
        return {"shape": list(self.shape), "dtype": str(self.dtype).replace("torch.", ""),
                "requires_grad": self.requires_grad, "device": self.device_type}


_PRIMITIVES = (int, float, bool, str, bytes, type(None), complex, torch.dtype, torch.device)


def _spec_of(obj: Any, depth: int = 0):
    if isinstance(obj, torch.Tensor):
        return ("T", TensorSpec(obj))
    if isinstance(obj, _PRIMITIVES):
        return ("V", obj)
    if depth > 6:
        raise ReplayError("the model's inputs are nested too deeply to be rebuilt for the replay")
    if isinstance(obj, tuple):
        items = [_spec_of(o, depth + 1) for o in obj]
        if hasattr(obj, "_fields"):
            return ("N", type(obj), items)
        return ("U", items)
    if isinstance(obj, list):
        return ("L", [_spec_of(o, depth + 1) for o in obj])
    if isinstance(obj, dict):
        return ("D", [(k, _spec_of(v, depth + 1)) for k, v in obj.items()])
    raise ReplayError(f"the model's input contains a {type(obj).__name__} object, which the replay "
                      "cannot rebuild at other batch sizes (tensors, lists, tuples, dicts and plain "
                      "values are supported)")


class InputSpec:
    """The structure, shapes and dtypes of one call's ``(args, kwargs)``; dim 0 of every tensor
    whose first dimension equals the batch size is the batch dimension."""

    def __init__(self, args: tuple, kwargs: dict | None, batch: int | None = None):
        self.args = _spec_of(tuple(args))
        self.kwargs = _spec_of(dict(kwargs or {}))
        tensors = list(self._tensors(self.args)) + list(self._tensors(self.kwargs))
        if batch is None:
            batch = next((t.shape[0] for t in tensors if t.shape), None)
        if not batch:
            raise ReplayError("the model's input has no tensor with a batch dimension")
        self.batch = int(batch)
        self.device_types = sorted({t.device_type for t in tensors})

    @staticmethod
    def _tensors(spec):
        kind = spec[0]
        if kind == "T":
            yield spec[1]
        elif kind in ("U", "L"):
            for s in spec[1]:
                yield from InputSpec._tensors(s)
        elif kind == "N":
            for s in spec[2]:
                yield from InputSpec._tensors(s)
        elif kind == "D":
            for _, s in spec[1]:
                yield from InputSpec._tensors(s)

    def describe(self) -> list[dict]:
        return [t.to_dict() for t in list(self._tensors(self.args)) + list(self._tensors(self.kwargs))]

    def build(self, batch: int, device_for: Callable[[str], torch.device]) -> tuple[tuple, dict]:
        """Fake tensors (call inside FakeTensorMode) at ``batch``."""

        def make(spec):
            kind = spec[0]
            if kind == "T":
                ts: TensorSpec = spec[1]
                shape = list(ts.shape)
                if shape and shape[0] == self.batch:
                    shape[0] = batch
                t = torch.empty(shape, dtype=ts.dtype, device=device_for(ts.device_type))
                if ts.requires_grad and t.is_floating_point():
                    t.requires_grad_(True)
                return t
            if kind == "V":
                return spec[1]
            if kind == "U":
                return tuple(make(s) for s in spec[1])
            if kind == "N":
                return spec[1](*[make(s) for s in spec[2]])
            if kind == "L":
                return [make(s) for s in spec[1]]
            if kind == "D":
                return {k: make(s) for k, s in spec[1]}
            raise AssertionError(kind)

        return make(self.args), make(self.kwargs)


# ---------------------------------------------------------------------------------------------------
# the tracker

try:
    from torch.utils._python_dispatch import TorchDispatchMode
except Exception:  # pragma: no cover - very old torch
    TorchDispatchMode = object  # type: ignore[misc,assignment]


class _Tracker(TorchDispatchMode):
    """Counts live storages by tag, the peak and what made it up, per phase."""

    def __init__(self, round_to: int = CUDA_BLOCK, count_device: str | None = None):
        super().__init__()
        self.round_to = max(1, int(round_to))
        self.count_device = count_device
        self.phase = "setup"
        self.cur = 0
        self.tags: dict[str, int] = {t: 0 for t in TAG_CATEGORY}
        self.live: dict[int, list] = {}       # id(storage) -> [weakref, nbytes, tag]
        self.peak = 0
        self.peak_tags: dict[str, int] = dict(self.tags)
        self.peak_phase = "setup"
        self.phase_peaks: dict[str, tuple[int, dict[str, int]]] = {}
        self.opnames: set[str] = set()
        self.earlier: list[tuple[int, dict[str, int], str]] = []

    def new_iteration(self) -> None:
        """Start measuring a new iteration's peak; :meth:`best` keeps the highest, the later one
        on a tie (the steady state, when the optimizer state already exists, explains it best)."""
        self.earlier.append((self.peak, self.peak_tags, self.peak_phase))
        self.peak = self.cur
        self.peak_tags = dict(self.tags)
        self.peak_phase = self.phase

    def best(self) -> tuple[int, dict[str, int], str]:
        best = (self.peak, self.peak_tags, self.peak_phase)
        for e in self.earlier:
            if e[0] > best[0]:
                best = e
        return best

    def set_phase(self, phase: str) -> None:
        self.phase = phase
        pp = self.phase_peaks.get(phase)
        if pp is None or self.cur > pp[0]:
            self.phase_peaks[phase] = (self.cur, dict(self.tags))

    def _size(self, n: int) -> int:
        if n <= 0:
            return 0
        r = self.round_to
        return -(-n // r) * r

    def track(self, t: torch.Tensor, tag: str | None = None) -> None:
        if self.count_device is not None and t.device.type != self.count_device:
            return
        try:
            st = t.untyped_storage()
        except Exception:   # tensors without storage (sparse, some subclasses)
            return
        key = id(st)
        rec = self.live.get(key)
        if rec is not None:
            if tag is not None and rec[2] != tag:
                self._retag(rec, tag)
            return
        n = self._size(st.nbytes())
        tag = tag or PHASE_TAG.get(self.phase, "temp")
        live = self.live
        tags = self.tags

        def _freed(_ref, key=key):
            r = live.pop(key, None)
            if r is not None:
                self.cur -= r[1]
                tags[r[2]] -= r[1]

        try:
            ref = weakref.ref(st, _freed)
        except TypeError:
            return
        live[key] = [ref, n, tag]
        self.cur += n
        tags[tag] += n
        if self.cur > self.peak:
            self.peak = self.cur
            self.peak_tags = dict(tags)
            self.peak_phase = self.phase
        pp = self.phase_peaks.get(self.phase)
        if pp is None or self.cur > pp[0]:
            self.phase_peaks[self.phase] = (self.cur, dict(tags))

    def _retag(self, rec: list, tag: str) -> None:
        self.tags[rec[2]] -= rec[1]
        self.tags[tag] += rec[1]
        rec[2] = tag

    def retag(self, t: torch.Tensor | None, tag: str) -> None:
        if t is None:
            return
        self.track(t, tag)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.opnames.add(getattr(func, "_opname", ""))
        _each_tensor(out, self.track)
        return out


def _each_tensor(obj, fn) -> None:
    if isinstance(obj, torch.Tensor):
        fn(obj)
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            _each_tensor(o, fn)
    elif isinstance(obj, dict):
        for o in obj.values():
            _each_tensor(o, fn)


def categories(tags: dict[str, int]) -> dict[str, int]:
    out = dict.fromkeys(CATEGORIES, 0)
    for tag, n in tags.items():
        out[TAG_CATEGORY[tag]] += n
    return out


# ---------------------------------------------------------------------------------------------------
# the replay

def _unwrap(model):
    """The module to replay: DDP / DataParallel / torch.compile wrappers removed."""
    for _ in range(4):
        name = type(model).__name__
        if name in ("DataParallel", "DistributedDataParallel") and hasattr(model, "module"):
            model = model.module
        elif name == "OptimizedModule" and hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif name == "FullyShardedDataParallel":
            raise ReplayError("the model is sharded with FSDP; the replay handles unsharded models only")
        else:
            break
    return model


class _ModuleSnapshot:
    """Everything the replay could change on the live modules, restored afterwards (a forward that
    caches a tensor in an attribute must not leave a fake tensor behind)."""

    def __init__(self, root):
        self.items = []
        for m in root.modules():
            self.items.append((m, dict(m.__dict__), dict(m._parameters), dict(m._buffers)))

    def restore(self) -> None:
        for m, d, params, bufs in self.items:
            cur = m.__dict__
            for k in [k for k in cur if k not in d]:
                del cur[k]
            for k, v in d.items():
                if cur.get(k, _MISSING) is not v:
                    cur[k] = v
            if m._parameters != params or any(m._parameters[k] is not v for k, v in params.items()):
                m._parameters.clear()
                m._parameters.update(params)
            if m._buffers.keys() != bufs.keys() or any(m._buffers[k] is not v for k, v in bufs.items()):
                m._buffers.clear()
                m._buffers.update(bufs)


_MISSING = object()


@contextlib.contextmanager
def _autocast_off():
    ctxs = []
    for dev in ("cpu", "cuda"):
        try:
            if torch.is_autocast_enabled(dev):
                ctxs.append(torch.autocast(dev, enabled=False))
        except Exception:
            pass
    with contextlib.ExitStack() as stack:
        for c in ctxs:
            stack.enter_context(c)
        yield


def explain(e: BaseException) -> str:
    """One sentence for a replay failure."""
    if isinstance(e, ReplayError):
        return str(e)
    name = type(e).__name__
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    where = _user_location(e)
    at = f" (at {where})" if where else ""
    if name in ("DynamicOutputShapeException", "DataDependentOutputException") or \
            "data-dependent" in msg.lower():
        op = msg.split()[0] if msg else "an operator"
        return (f"the model's step has a data-dependent shape or value ({op}){at}, which cannot be "
                "replayed on fake tensors")
    if name == "UnsupportedOperatorException" or "no fake impl" in msg.lower() or \
            "fake impl" in msg.lower() or "meta kernel" in msg.lower() or "Meta backend" in msg:
        op = msg.split()[0] if name == "UnsupportedOperatorException" and msg else \
            (msg.split("<CustomOpDef(")[1].split(")")[0] if "<CustomOpDef(" in msg else "a custom operator")
        return (f"operator {op} has no fake (meta) kernel{at}, so the step cannot be replayed "
                "without running it")
    return f"the replay failed{at}: {name}: {msg[:300]}"


def _user_location(e: BaseException) -> str | None:
    try:
        import traceback

        from diag.probe.frames import is_library_file as _is_library_file
        for fr in reversed(traceback.extract_tb(e.__traceback__)):
            if not _is_library_file(fr.filename):
                return f"{fr.filename}:{fr.lineno}"
    except Exception:
        pass
    return None


def _loss_of(out):
    tensors: list[torch.Tensor] = []

    def collect(o, depth=0):
        if isinstance(o, torch.Tensor):
            tensors.append(o)
        elif depth < 4 and isinstance(o, (list, tuple)):
            for x in o:
                collect(x, depth + 1)
        elif depth < 4 and hasattr(o, "values") and callable(o.values):
            try:
                for x in list(o.values()):
                    collect(x, depth + 1)
            except Exception:
                pass

    collect(out)
    for t in tensors:
        if t.dim() == 0 and t.requires_grad and t.is_floating_point():
            return t
    for t in tensors:
        if t.requires_grad and t.is_floating_point():
            if t.dim() == 0:
                return t
            return torch.log_softmax(t.float(), dim=-1).mean()
    raise ReplayError("the model's output has no floating tensor that requires grad, so there is no "
                      "backward to replay")


class StepReplay:
    """Replays the user's training step on fake tensors at any batch size.

    ``model``: the live module (wrappers are removed); ``optimizers``: live optimizers (those that
    hold the model's parameters are rebuilt with the same class and hyper-parameters);
    ``inputs``: an :class:`InputSpec`; ``autocast``: ``(dtype_name)`` when the step ran under
    autocast; ``set_to_none``: the script's ``zero_grad`` argument; ``target``: ``"cuda"`` applies
    the CUDA allocator's 512-byte rounding and the CUDA optimizer defaults (foreach).
    """

    def __init__(self, model, optimizers=(), inputs: InputSpec | None = None, *,
                 autocast: str | None = None, set_to_none: bool = True, target: str = "cuda",
                 hold_output: bool = True, device: str | None = None):
        if inputs is None:
            raise ReplayError("no input batch was captured")
        self.model = _unwrap(model)
        self.inputs = inputs
        self.autocast = autocast
        self.set_to_none = True if set_to_none is None else bool(set_to_none)
        self.target = target
        self.hold_output = hold_output
        self.notes: list[str] = []
        live_dev = _device_of(self.model)
        if device is None:
            device = "cuda" if (live_dev == "cuda" and torch.cuda.is_available()) else "cpu"
        self.device = torch.device(device)
        self.live_device = live_dev
        ids = {id(p) for p in self.model.parameters()}
        self.optimizers = [o for o in optimizers if o is not None and
                           any(id(p) in ids for g in o.param_groups for p in g["params"])]
        self.optimizer_names = [type(o).__name__ for o in self.optimizers]
        if not self.optimizers:
            self.notes.append("no optimizer holding the model's parameters was found: the estimate has "
                              "no optimizer state")
        self.round_to = CUDA_BLOCK if target == "cuda" else 1

    # ---- one fake session -------------------------------------------------------------------------
    def _device_for(self, device_type: str) -> torch.device:
        if device_type == self.live_device or device_type == "meta":
            return self.device
        return torch.device("cpu") if self.device.type == "cuda" else self.device

    def _session(self, body: Callable[["_Session"], None]) -> dict:
        from torch._subclasses.fake_tensor import FakeTensorMode

        t0 = time.perf_counter()
        snap = _ModuleSnapshot(self.model)
        rng = torch.get_rng_state()
        count = "cuda" if self.device.type == "cuda" else None
        tracker = _Tracker(self.round_to, count_device=count)
        fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        sess = _Session(self, tracker, fake_mode)
        try:
            from torch.utils._python_dispatch import _disable_current_modes

            # a clean mode stack: a FlopCounterMode (or the user's own mode) must not see the replay
            # anomaly detection (left on by some scripts) checks every gradient for NaN: a
            # data-dependent read that fake tensors cannot answer, and no part of the estimate
            with _disable_current_modes(), torch.inference_mode(False), torch.enable_grad(), \
                    _autocast_off(), torch.autograd.set_detect_anomaly(False):
                with fake_mode:
                    sess.setup()
                with fake_mode, tracker:
                    body(sess)
        except ReplayError:
            raise
        except Exception as e:
            raise ReplayError(explain(e)) from None
        finally:
            sess.close()
            snap.restore()
            try:
                torch.set_rng_state(rng)
            except Exception:
                pass
        return {"tracker": tracker, "seconds": time.perf_counter() - t0}

    def train(self, batch: int, accumulation: int = 1, iterations: int = 1) -> dict:
        """Peak of a steady-state training step of ``accumulation`` micro-batches of ``batch``
        samples.

        The state a previous step leaves is built first, cheaply: gradients and one optimizer step
        (the optimizer state), then ``zero_grad`` as the script calls it, then a forward under
        no_grad whose output stands for the previous step's output the loop variable still holds.
        Then ``iterations`` full steps are replayed and the highest peak is kept."""

        def body(s: _Session):
            s.create_optimizer_state()
            if self.hold_output:
                s.previous_output(batch)
            for i in range(iterations):
                if i:
                    s.tr.new_iteration()
                s.train_iteration(batch, accumulation)

        r = self._session(body)
        tr: _Tracker = r["tracker"]
        peak, tags, phase = tr.best()
        return self._result("train", batch, tr, r["seconds"], accumulation=accumulation,
                            peak=peak, tags=tags, phase=phase)

    def eval(self, batch: int) -> dict:
        """Peak of one evaluation forward under ``torch.inference_mode()`` at ``batch``, with the
        optimizer state (and, with ``set_to_none=False``, the gradients) a training step leaves
        alive, as between epochs."""

        def body(s: _Session):
            s.create_optimizer_state()
            s.zero_grad()
            s.eval_forward(batch)

        r = self._session(body)
        tr: _Tracker = r["tracker"]
        peak, tags = tr.phase_peaks.get("eval", (tr.cur, dict(tr.tags)))
        return self._result("eval", batch, tr, r["seconds"], peak=peak, tags=tags, phase="eval")

    def _result(self, mode, batch, tr: "_Tracker", seconds, *, peak, tags, phase, accumulation=1) -> dict:
        ops = tr.opnames
        return {
            "uses": {"matmul": bool(ops & MATMUL_OPS), "conv": bool(ops & CONV_OPS)},
            "mode": mode, "batch": int(batch), "accumulation": int(accumulation),
            "peak": int(peak), "categories": categories(tags), "peak_phase": phase,
            "phase_peaks": {k: int(v[0]) for k, v in tr.phase_peaks.items() if k != "setup"},
            "seconds": round(seconds, 4),
        }

    def describe(self) -> dict:
        return {
            "model": type(self.model).__name__, "optimizers": self.optimizer_names,
            "replay_device": self.device.type, "live_device": self.live_device,
            "autocast": self.autocast, "zero_grad_set_to_none": self.set_to_none,
            "observed_batch": self.inputs.batch, "inputs": self.inputs.describe(),
            "target": self.target, "notes": list(self.notes),
        }


class _Session:
    """State of one fake replay (fake parameters, rebuilt optimizers)."""

    def __init__(self, replay: StepReplay, tracker: _Tracker, fake_mode):
        self.r = replay
        self.tr = tracker
        self.fake_mode = fake_mode
        self.state: dict[str, torch.Tensor] = {}
        self.params: list[torch.Tensor] = []
        self.opts: list = []
        self.handles: list = []
        self.prev_out = None
        self.prev_inputs = None

    def setup(self) -> None:
        r = self.r
        fake_of: dict[int, torch.Tensor] = {}
        for name, p in r.model.named_parameters():
            fp = torch.nn.Parameter(
                torch.empty_strided(tuple(p.shape), tuple(p.stride()), dtype=p.dtype,
                                    device=r._device_for(p.device.type)),
                requires_grad=p.requires_grad)
            fake_of[id(p)] = fp
            self.state[name] = fp
            self.params.append(fp)
        for name, b in r.model.named_buffers():
            self.state[name] = torch.empty_strided(tuple(b.shape), tuple(b.stride()), dtype=b.dtype,
                                                   device=r._device_for(b.device.type))
        for p in self.params:
            self.tr.track(p, "param")
            if p.requires_grad:
                self.handles.append(p.register_post_accumulate_grad_hook(self._grad_ready))
        for name, b in r.model.named_buffers():
            self.tr.track(self.state[name], "buffer")
        for opt in r.optimizers:
            new = self._rebuild(opt, fake_of)
            if new is not None:
                self.opts.append(new)

    def _grad_ready(self, p) -> None:
        self.tr.retag(p.grad, "grad")

    def _rebuild(self, opt, fake_of):
        groups = []
        for g in opt.param_groups:
            ps = [fake_of[id(p)] for p in g["params"] if id(p) in fake_of]
            if not ps:
                continue
            ng = {k: v for k, v in g.items() if k != "params"}
            ng["params"] = ps
            if self.r.target == "cuda" and "foreach" in ng and ng.get("foreach") is None \
                    and not ng.get("fused") and not ng.get("differentiable"):
                ng["foreach"] = True      # what torch picks for CUDA parameters
            groups.append(ng)
        if not groups:
            return None
        cls = type(opt)
        defaults = dict(getattr(opt, "defaults", {}) or {})
        for attempt in (lambda: cls(groups, **defaults), lambda: cls(groups)):
            try:
                return attempt()
            except TypeError:
                continue
        raise ReplayError(f"the optimizer {cls.__name__} could not be rebuilt for the replay "
                          "(its constructor needs arguments diag cannot recover)")

    # ---- phases -----------------------------------------------------------------------------------
    def zero_grad(self) -> None:
        self.tr.set_phase("zero_grad")
        if self.opts:
            for o in self.opts:
                o.zero_grad(set_to_none=self.r.set_to_none)
        else:
            for p in self.params:
                if p.grad is not None:
                    if self.r.set_to_none:
                        p.grad = None
                    else:
                        p.grad.zero_()

    def _autocast(self):
        if self.r.autocast:
            dtype = getattr(torch, self.r.autocast, None)
            if isinstance(dtype, torch.dtype):
                return torch.autocast(self.r.device.type, dtype=dtype)
        return contextlib.nullcontext()

    def _inputs(self, batch: int):
        self.tr.set_phase("input")
        args, kwargs = self.r.inputs.build(batch, self.r._device_for)
        self.prev_inputs = None          # the loop's variables now point at the new batch
        return args, kwargs

    def _forward(self, args, kwargs):
        from torch.func import functional_call

        with self._autocast():
            return functional_call(self.r.model, self.state, tuple(args), dict(kwargs),
                                   tie_weights=True, strict=False)

    def train_iteration(self, batch: int, accumulation: int) -> None:
        self.zero_grad()
        for _ in range(accumulation):
            args, kwargs = self._inputs(batch)
            self.tr.set_phase("forward")
            out = self._forward(args, kwargs)
            with self._autocast():
                loss = _loss_of(out)
            # the previous step's output stays referenced by the loop variable until now
            self.prev_out = None
            if self.r.hold_output:
                self.prev_out = out
            del out
            self.tr.set_phase("backward")
            loss.backward()
            del loss
            self.prev_inputs = (args, kwargs)
            del args, kwargs
        self._optimizer_step()

    def _optimizer_step(self) -> None:
        """Every optimizer steps; the state it creates is tagged as optimizer state."""
        self.tr.set_phase("optimizer")
        for o in self.opts:
            o.step()
        for o in self.opts:
            for st in o.state.values():
                for v in st.values():
                    if isinstance(v, torch.Tensor):
                        self.tr.retag(v, "opt_state")
        self.tr.set_phase("between")

    def create_optimizer_state(self) -> None:
        """What one training step leaves behind (gradients, optimizer state), without running the
        model: every trainable parameter gets a gradient and the optimizer steps once."""
        self.tr.set_phase("backward")
        for p in self.params:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
                self.tr.retag(p.grad, "grad")
        self._optimizer_step()

    def previous_output(self, batch: int) -> None:
        """The output of the previous step, still referenced by the loop's variable (``out = model(x)``)
        when the next forward runs: made by a forward under no_grad at the same batch."""
        args, kwargs = self._inputs(batch)
        self.tr.set_phase("warmup")
        with torch.no_grad():
            out = self._forward(args, kwargs)
        self.prev_out = out
        self.prev_inputs = (args, kwargs)
        del out, args, kwargs
        self.tr.set_phase("between")

    def eval_forward(self, batch: int) -> None:
        self.prev_out = None
        args, kwargs = self._inputs(batch)
        for m in self.r.model.modules():
            m.training = False              # restored by the module snapshot
        self.tr.set_phase("eval")
        with torch.inference_mode():
            out = self._forward(args, kwargs)
        del out

    def close(self) -> None:
        remove_hooks(self.handles)
        self.prev_out = self.prev_inputs = None
        self.opts.clear()
        self.state.clear()
        self.params.clear()


PHASE_TAG["between"] = "temp"
PHASE_TAG["warmup"] = "act"


def _device_of(model) -> str:
    for p in model.parameters():
        return p.device.type
    for b in model.buffers():
        return b.device.type
    return "cpu"
