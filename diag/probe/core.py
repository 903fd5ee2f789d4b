"""The probe: hooks installed inside the user's process that turn a training run into events, and
the step state machine that decides where a training step begins and ends.

Everything here runs in the user's process, on their hot path: keep each hook cheap (no I/O
except one JSON line per step, no allocation proportional to tensors, no synchronisation).

Events are dicts ``{"kind": ..., "t": seconds since install, "rank": r, ...}`` handed to a sink
(:mod:`diag.probe.sink`). The folding of events into Evidence is in :mod:`diag.fold` (which must
stay torch-free).

The probe is split by concern:

- :mod:`diag.probe.sink`         where events go (a JSON-lines file, or a callback);
- :mod:`diag.probe.frames`, :mod:`~diag.probe.tensors`, :mod:`~diag.probe.models`,
  :mod:`~diag.probe.environment`: introspection (the user's frame, the tensors a forward holds,
  model descriptions, the environment);
- :mod:`diag.probe.hooks`        undoing hooks and patches;
- :mod:`diag.probe.context`      the extension interface (``ProbeContext``, ``Extension``);
- this module                    the ``Probe``: torch hooks and the step state machine.

Extensions (``diag.probe.extensions``) add their own observations through
:class:`diag.probe.context.Extension` hooks; the probe passes itself to them as a
:class:`~diag.probe.context.ProbeContext`, and they use nothing of it beyond that interface.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import os
import socket
import sys
import threading
import time
import traceback
import weakref
from typing import Any, Callable

from diag.probe.environment import ENV_ALLOWLIST, environment
from diag.probe.frames import exception_info, frame_location, is_library_file, is_oom, user_frame
from diag.probe.hooks import Patches, remove_hooks
from diag.probe.models import (MAX_LAYER_SHAPES, describe_model, device_type, find_ddp, has_parameters,
                               wrappers_of)
from diag.probe.sink import FileSink
from diag.probe.tensors import batch_size_of, first_tensor, grad_tensor, grad_tensors

# former private names, kept for code that imported them from here
_is_library_file = is_library_file
_has_parameters = has_parameters
_device_type = device_type

class DiagStop(BaseException):
    """Raised inside the user's script to end it at a step or time limit (unwinds like Ctrl-C,
    so the script's ``finally`` blocks and DataLoader shutdown still run)."""

    def __init__(self, reason: str, status: str = "stopped"):
        super().__init__(reason)
        self.reason = reason
        self.status = status


# ---------------------------------------------------------------------------------------------------
# the probe

class _Step:
    """The step in progress (implements :class:`diag.probe.context.StepState`)."""

    __slots__ = ("index", "start", "data_s", "forward_s", "backward_s", "optimizer_s", "eval_s",
                 "n_forward", "n_backward", "samples", "tokens", "sample_site", "micro_batches", "instrumented",
                 "extra")

    def __init__(self, index: int, start: float):
        self.index = index
        self.start = start
        self.data_s = self.forward_s = self.backward_s = self.optimizer_s = self.eval_s = 0.0
        self.n_forward = self.n_backward = 0
        self.samples = self.tokens = None
        self.sample_site = None      # the call site whose batches the step's samples count
        self.micro_batches = 0
        self.instrumented = False
        self.extra: dict = {}


class Probe:
    """Torch hooks and the step state machine. Extensions receive the probe as their
    :class:`~diag.probe.context.ProbeContext` and use only that interface."""

    def __init__(self, sink: Callable[[dict], None], *, max_steps: int | None = None,
                 rank: int = 0, local_rank: int = 0, world_size: int = 1,
                 extensions: list | None = None, script: str | None = None):
        self.sink = sink
        self.max_steps = max_steps
        self.rank = rank
        self.local_rank = local_rank
        self.world_size = world_size
        self.script = script
        self.t0 = time.perf_counter()
        self.wall0 = time.time()
        self.pid = os.getpid()
        self.active = False
        self._forked = False
        self._handles: list = []
        self._patches = Patches()
        self.extensions = list(extensions or [])
        # state
        self._depth = 0
        self.forward_start = 0.0
        self._top_module = None
        self._top_depth = 0          # the depth the model forward runs at (1, or deeper under a bare one)
        self._bare_start = 0.0       # a parameterless outermost forward (a loss module): when it began
        self._bare_had_model = False
        self._seek_model = False     # inside a parameterless outermost forward, no model seen yet
        self.forward_counts_samples = True   # the training forward being reported adds to the step's samples
        self._in_data = 0
        self._in_backward = False
        self._bwd_start = 0.0
        self._opt_start: dict[int, float] = {}
        self._any_optimizer_step = False
        self._manual_mode: bool | None = None   # decided once, when the first backward ends a step
        self.steps_done = 0
        self.epoch = 0
        self.current_step: _Step | None = None
        self._last_boundary: float | None = None
        self.step_closed_at: float = 0.0
        self._models: dict[int, int] = {}        # id(module) -> model id
        self._model_device: dict[int, str] = {}  # model id -> device type of its first parameter
        self._model_refs: dict[int, Any] = {}    # model id -> weakref
        self._sites: dict[tuple, dict] = {}
        self._site_counts: dict[str, int] = {}
        self._site_dirty: set[str] = set()
        self._loaders: dict[int, dict] = {}      # id(loader) -> info
        self._loader_refs: dict[int, Any] = {}
        self._optimizers: dict[int, dict] = {}
        self._last_model = None                  # weakref to the last top-level training model
        self.errors_reported: set[str] = set()
        self._env_refreshed = False
        self.lock = threading.RLock()

    # ---- events ------------------------------------------------------------------------------------
    def now(self) -> float:
        return time.perf_counter() - self.t0

    def emit(self, kind: str, **data) -> None:
        if self._forked:
            return
        data["kind"] = kind
        data["t"] = round(self.now(), 6)
        data["rank"] = self.rank
        try:
            self.sink(data)
        except Exception as e:  # never break the user's run because of our output
            self.report_error("sink", e)

    def report_error(self, where: str, e: BaseException) -> None:
        """A ``probe_error`` event, once per ``where``; never raises."""
        if where in self.errors_reported:
            return
        self.errors_reported.add(where)
        try:
            self.sink({"kind": "probe_error", "t": self.now(), "rank": self.rank, "where": where,
                       "error": f"{type(e).__name__}: {e}",
                       "traceback": traceback.format_exc(limit=8)})
        except Exception:
            pass

    def _ext(self, method: str, *args) -> None:
        for ext in list(self.extensions):
            fn = getattr(ext, method, None)
            if fn is None:
                continue
            try:
                fn(self, *args)
            except DiagStop:
                raise
            except Exception as e:
                self.report_error(f"{type(ext).__name__}.{method}", e)
                if method != "uninstall":
                    try:
                        self.extensions.remove(ext)
                    except ValueError:
                        pass

    # ---- the extension interface (diag.probe.context.ProbeContext) -----------------------------------
    @property
    def manual_mode(self) -> bool | None:
        return self._manual_mode

    def is_live(self) -> bool:
        return self.active and not self._forked

    def model_id(self, module) -> int | None:
        return self._models.get(id(module))

    def models(self) -> list:
        out = []
        for ref in list(self._model_refs.values()):
            try:
                m = ref()
            except Exception:
                m = None
            if m is not None:
                out.append(m)
        return out

    def last_model(self):
        ref = self._last_model
        return ref() if ref is not None else None

    def is_top_forward(self, module) -> bool:
        return self._depth == 1 and module is self._top_module

    def phase(self) -> str:
        if self._in_data:
            return "data"
        if self._in_backward:
            return "backward"
        if self._depth > 0:
            return "forward"
        return "other"

    @contextlib.contextmanager
    def paused(self):
        was_active = self.active
        self.active = False
        try:
            yield self
        finally:
            self.active = was_active
            # optimizer steps begun while paused never reach the post hook's bookkeeping
            for o in list(self._opt_start):
                if o not in self._optimizers:
                    self._opt_start.pop(o, None)

    def disable(self, extension) -> None:
        try:
            self.extensions.remove(extension)
        except ValueError:
            pass

    # ---- install / uninstall -----------------------------------------------------------------------
    def install(self) -> "Probe":
        import torch
        from torch.nn.modules import module as nn_module
        from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                           register_optimizer_step_pre_hook)
        from torch.utils.data import dataloader as dl

        self.active = True
        self.emit("start", pid=self.pid, host=socket.gethostname(), local_rank=self.local_rank,
                  world_size=self.world_size, started_at=self.wall0, script=self.script,
                  argv=list(sys.argv))
        self.emit("env", **environment())
        self._handles.append(nn_module.register_module_forward_pre_hook(self._fwd_pre))
        self._handles.append(nn_module.register_module_forward_hook(
            self._fwd_post, with_kwargs=True, always_call=True))
        self._handles.append(register_optimizer_step_pre_hook(self._opt_pre))
        self._handles.append(register_optimizer_step_post_hook(self._opt_post))

        probe = self
        orig_iter = dl.DataLoader.__iter__
        orig_next = dl._BaseDataLoaderIter.__next__

        def __iter__(loader):
            it = orig_iter(loader)
            try:
                probe._on_loader_iter(loader, it)
            except Exception as e:
                probe.report_error("dataloader.__iter__", e)
            return it

        def __next__(it):
            if not probe.active or probe._forked:
                return orig_next(it)
            t0 = time.perf_counter()
            probe._before_data(t0)
            if probe.extensions:
                probe._ext("on_data", "start")
            probe._in_data += 1
            try:
                batch = orig_next(it)
            except StopIteration:
                probe._in_data -= 1
                raise
            except BaseException:
                probe._in_data -= 1
                raise
            probe._in_data -= 1
            if probe.extensions:
                probe._ext("on_data", "end")
            probe._on_batch(it, time.perf_counter() - t0)
            return batch

        self._patch(dl.DataLoader, "__iter__", __iter__)
        self._patch(dl._BaseDataLoaderIter, "__next__", __next__)

        orig_zero_grad = torch.optim.Optimizer.zero_grad

        def zero_grad(opt, set_to_none: bool = True):
            t0 = time.perf_counter()
            out = orig_zero_grad(opt, set_to_none)
            try:
                probe._on_zero_grad(opt, set_to_none, time.perf_counter() - t0)
            except Exception as e:
                probe.report_error("zero_grad", e)
            return out

        self._patch(torch.optim.Optimizer, "zero_grad", zero_grad)
        os.register_at_fork(after_in_child=self._after_fork)
        self._ext("install")
        return self

    def _after_fork(self) -> None:
        # DataLoader workers (and other forks) inherit the hooks: they must stay silent.
        self._forked = True

    def _patch(self, owner, name: str, new) -> None:
        self._patches.patch(owner, name, new)

    def uninstall(self) -> None:
        if not self.active:
            return
        self.active = False
        remove_hooks(self._handles)
        self._patches.undo()
        self._ext("uninstall")

    # ---- end of run --------------------------------------------------------------------------------
    def finish(self, status: str, exit_code: int | None = None, exception: BaseException | None = None,
               reason: str | None = None) -> None:
        """Flush what is pending and emit the `end` event."""
        if self._forked:
            return
        try:
            if self.current_step is not None and self.current_step.n_backward > 0:
                self._close_step(time.perf_counter(), "manual" if not self._any_optimizer_step else "optimizer")
            self._flush_sites()
            self._emit_loaders()
            self._emit_optimizers()
            self.emit("env", **environment())
        except Exception as e:
            self.report_error("finish", e)
        if exception is not None:
            self.emit("exception", **exception_info(exception, self.steps_done, self.script))
        self._ext("on_exit", status)
        self.emit("end", status=status, exit_code=exit_code, reason=reason, steps=self.steps_done)

    # ---- module hooks ------------------------------------------------------------------------------
    def _fwd_pre(self, module, args):
        # Nested calls (every layer of the model) only touch two ints and a bool here: inside a
        # compiled region dynamo traces these hooks, and reading the model object from it breaks tracing.
        if self._in_backward:   # recomputation (activation checkpointing): not a forward of the step,
            return None         # and it may end by an exception that skips the post hook
        self._depth += 1
        if self._depth == 1:
            if has_parameters(module):
                self.forward_start = time.perf_counter()
                self._top_module = module
                self._top_depth = 1
                self._seek_model = False
            else:
                # a module without parameters (a loss, a bare activation) is not a model: its forward
                # is timed, and a module with parameters it calls counts as the model forward
                self._top_module = None
                self._top_depth = 0
                self._seek_model = True
                self._bare_start = time.perf_counter()
                self._bare_had_model = False
        elif self._seek_model and has_parameters(module):
            self.forward_start = time.perf_counter()
            self._top_module = module
            self._top_depth = self._depth
            self._seek_model = False
            self._bare_had_model = True
        return None

    def _fwd_post(self, module, args, kwargs, output=None):
        # torch calls always_call hooks as hook(module, args, result) when a forward raised
        # (module.py ignores with_kwargs there): `kwargs` then holds the result
        if self._in_backward:
            return None
        self._depth -= 1
        if output is None and not isinstance(kwargs, dict):
            self._depth = max(self._depth, 0)
            if self._depth == self._top_depth - 1 and self._top_module is module:
                self._top_module, self._top_depth = None, 0
                self._seek_model = self._depth > 0
            return None
        if self._depth < 0:   # a forward started before the probe was installed
            self._depth = 0
            return None
        if self._depth == self._top_depth - 1 and module is self._top_module:
            if self._depth > 0:          # a model called by a parameterless module: look for another
                self._top_module, self._top_depth, self._seek_model = None, 0, True
        elif self._depth == 0 and self._top_depth == 0:
            self._seek_model = False
            if not self._bare_had_model:
                self._on_bare_forward(output, self._bare_start, time.perf_counter())
            return None
        else:
            return None
        if self._forked or not self.active or self._in_backward or self._in_data:
            return None
        end = time.perf_counter()
        try:
            self._on_top_forward(module, args, kwargs, output, self.forward_start, end)
        except DiagStop:
            raise
        except Exception as e:
            self.report_error("forward", e)
        return None

    def _on_bare_forward(self, output, start: float, end: float) -> None:
        """An outermost forward of a module without parameters (``loss_fn(model(x), y)``): its time
        belongs to the step's forward (or evaluation), and a backward may start at its output; it is
        not a model, a call site or a batch of its own."""
        if self._forked or not self.active or self._in_data:
            return
        step = self.current_step
        try:
            import torch

            outs = grad_tensors(output) if torch.is_grad_enabled() else []
            if outs:
                if step is not None:
                    step.forward_s += end - start
                for t in outs:
                    t.register_hook(self._bwd_hook)
            elif step is not None:
                step.eval_s += end - start
        except Exception as e:
            self.report_error("forward", e)

    def _on_top_forward(self, module, args, kwargs, output, start: float, end: float) -> None:
        import torch

        mid = self._models.get(id(module))
        if mid is None or self._model_refs.get(mid) is None or self._model_refs[mid]() is not module:
            mid = len(self._model_refs) + 1
            self._models[id(module)] = mid
            try:
                self._model_refs[mid] = weakref.ref(module)
            except TypeError:
                self._model_refs[mid] = lambda: None
            info = describe_model(module, mid)
            self.emit("model", **info)
            self._ext("on_model", module, info)
        grad = torch.is_grad_enabled()
        training = bool(module.training)
        inference = torch.is_inference_mode_enabled()
        outs = grad_tensors(output) if grad else []     # the backward may start from any of them
        out_t = outs[0] if outs else None
        out_rg = out_t is not None
        dev_type = self._model_device.get(mid)
        if dev_type is None:
            dev_type = self._model_device[mid] = device_type(module)
        try:
            ac = torch.is_autocast_enabled(dev_type)
            ac_dtype = str(torch.get_autocast_dtype(dev_type)).replace("torch.", "") if ac else None
        except Exception:
            ac, ac_dtype = False, None
        frame = user_frame(3)
        loc_key = (frame.f_code.co_filename, frame.f_lineno) if frame is not None else None
        key = (mid, loc_key, training, grad, inference, ac_dtype, out_rg)
        site = self._sites.get(key)
        if site is None:
            samples, tokens, shapes, dtypes = batch_size_of(args, kwargs)
            skey = f"s{len(self._sites) + 1}"
            site = {
                "key": skey, "model": mid, "module": wrappers_of(module)[0],
                "location": frame_location(frame), "training": training, "grad_enabled": grad,
                "inference_mode": inference, "autocast": ac_dtype,
                "autocast_device": dev_type if ac else None, "output_requires_grad": out_rg,
                "in_step": grad and training and out_rg, "first_step": self.steps_done + 1,
                "input_shapes": shapes, "input_dtypes": dtypes, "backpropagated": False,
            }
            self._sites[key] = site
            self._site_counts[skey] = 0
            self.emit("forward_site", **site)
        # a training forward: grad mode, an output that needs grad, and the module in training mode
        # or a call site whose output was seen to feed a backward (training in eval mode, e.g. to
        # freeze BatchNorm statistics)
        train_fwd = grad and out_rg and (training or site["backpropagated"])
        if train_fwd:
            # a new step begins with its first training forward (manual-update scripts)
            self._before_activity(start)
        skey = site["key"]
        self._site_counts[skey] += 1
        self._site_dirty.add(skey)
        dt = end - start
        step = self.current_step
        if train_fwd:
            if step is None:
                step = self._open_step(start)
            step.forward_s += dt
            step.n_forward += 1
            # the step's samples: every batch through the call site of its first training forward
            # (gradient accumulation: each micro-batch), not a second model or a second view
            counted = step.sample_site is None or step.sample_site == skey
            if counted:
                step.micro_batches += 1
                samples, tokens, _, _ = batch_size_of(args, kwargs)
                if step.sample_site is None:
                    step.sample_site = skey
                    step.samples, step.tokens = samples, tokens
                else:
                    if samples is not None:
                        step.samples = (step.samples or 0) + samples
                    if tokens is not None:
                        step.tokens = (step.tokens or 0) + tokens
            self.forward_counts_samples = counted
            self._last_model = self._model_refs.get(mid)
            if not self._in_backward:
                # on every output that needs grad: the loss may use any of them
                for t in outs:
                    try:
                        t.register_hook(self._bwd_hook)
                    except Exception:
                        pass
            if self.extensions:
                self._ext("on_forward", module, args, kwargs, output, True)
        else:
            if step is not None:
                step.eval_s += dt
            if out_rg and not self._in_backward:
                # a graph built outside training mode: find out whether a backward goes through it
                try:
                    out_t.register_hook(functools.partial(self._graph_bwd_hook, site))
                except Exception:
                    pass
        if not train_fwd and out_rg and self.extensions:
            # a forward that built an autograd graph outside training (eval mode, grad enabled)
            self._ext("on_graph_forward", module, args, kwargs, output, site)

    # ---- backward ----------------------------------------------------------------------------------
    def _bwd_hook(self, grad):
        if self._in_backward or self._forked:
            return None
        self._in_backward = True
        self._bwd_start = time.perf_counter()
        try:
            import torch

            torch.autograd.Variable._execution_engine.queue_callback(self._bwd_end)
        except Exception as e:
            self._in_backward = False
            self.report_error("backward", e)
        return None

    def _graph_bwd_hook(self, site, grad):
        """A backward reached the output of a forward made in eval mode: that call site trains."""
        if self._forked:
            return None
        if not site["backpropagated"]:
            site["backpropagated"] = True
            site["in_step"] = True
            self.emit("forward_site", **site)
        return self._bwd_hook(grad)

    def _bwd_end(self):
        end = time.perf_counter()
        self._in_backward = False
        step = self.current_step or self._open_step(self._bwd_start)
        step.backward_s += end - self._bwd_start
        step.n_backward += 1

    # ---- optimizer ---------------------------------------------------------------------------------
    def _opt_pre(self, opt, args, kwargs):
        if self._forked:
            return None
        self._opt_start[id(opt)] = time.perf_counter()
        return None

    def _opt_post(self, opt, args, kwargs):
        if self._forked or not self.active:
            return None
        end = time.perf_counter()
        start = self._opt_start.pop(id(opt), end)
        self._any_optimizer_step = True
        info = self.optimizer_info(opt)
        info["steps"] += 1
        step = self.current_step or self._open_step(start)
        step.optimizer_s += end - start
        if step.n_backward > 0:
            self._close_step(end, "optimizer")
        return None

    def optimizer_info(self, opt, create: bool = True) -> dict | None:
        info = self._optimizers.get(id(opt))
        if info is None and create:
            defaults = getattr(opt, "defaults", {}) or {}
            groups = getattr(opt, "param_groups", []) or []
            info = {
                "id": len(self._optimizers) + 1, "cls": type(opt).__name__,
                "param_groups": len(groups),
                "params": sum(len(g.get("params", [])) for g in groups),
                "lr": _float_or_none(groups[0].get("lr")) if groups else None,
                "foreach": defaults.get("foreach"), "fused": defaults.get("fused"),
                "steps": 0, "zero_grad_calls": 0, "zero_grad_set_to_none": None, "zero_grad_s": 0.0,
                "state_bytes": None,
            }
            self._optimizers[id(opt)] = info
        return info

    def _on_zero_grad(self, opt, set_to_none, dt: float = 0.0) -> None:
        if self._forked or not self.active:
            return
        info = self.optimizer_info(opt)
        info["zero_grad_calls"] += 1
        info["zero_grad_s"] = info.get("zero_grad_s", 0.0) + dt
        info["zero_grad_set_to_none"] = bool(set_to_none)

    _optimizer_info = optimizer_info

    # ---- DataLoader --------------------------------------------------------------------------------
    def _on_loader_iter(self, loader, it) -> None:
        if self._forked or not self.active:
            return
        info = self._loaders.get(id(loader))
        if info is None or self._loader_refs.get(id(loader), lambda: None)() is not loader:
            ds = getattr(loader, "dataset", None)
            try:
                ds_len = len(ds)  # type: ignore[arg-type]
            except Exception:
                ds_len = None
            from torch.utils.data import IterableDataset

            frame = user_frame(3)
            info = {
                "id": len(self._loaders) + 1,
                "num_workers": int(getattr(loader, "num_workers", 0) or 0),
                "pin_memory": bool(getattr(loader, "pin_memory", False)),
                "batch_size": getattr(loader, "batch_size", None),
                "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
                "prefetch_factor": getattr(loader, "prefetch_factor", None),
                "drop_last": bool(getattr(loader, "drop_last", False)),
                "dataset_type": type(ds).__name__ if ds is not None else "",
                "dataset_len": ds_len,
                "iterable_dataset": isinstance(ds, IterableDataset),
                "location": frame_location(frame),
                "epochs": 0, "batches": 0, "wait_s": 0.0, "first_batch_s": [], "max_wait_s": 0.0,
            }
            self._loaders[id(loader)] = info
            try:
                self._loader_refs[id(loader)] = weakref.ref(loader)
            except TypeError:
                pass
        info["epochs"] += 1
        self.epoch = max(self.epoch, info["epochs"])
        try:
            it._diag_loader = info["id"]
            it._diag_first = True
        except Exception:
            pass
        self.emit("dataloader", **info)

    def _before_data(self, t: float) -> None:
        self._before_activity(t)

    def _on_batch(self, it, dt: float) -> None:
        lid = getattr(it, "_diag_loader", None)
        info = None
        if lid is not None:
            for i in self._loaders.values():
                if i["id"] == lid:
                    info = i
                    break
        if info is not None:
            info["batches"] += 1
            info["wait_s"] += dt
            if dt > info["max_wait_s"]:
                info["max_wait_s"] = dt
            if getattr(it, "_diag_first", False):
                it._diag_first = False
                info["first_batch_s"].append(round(dt, 6))
                if len(info["first_batch_s"]) > 200:
                    del info["first_batch_s"][0]
        step = self.current_step or self._open_step(time.perf_counter() - dt)
        step.data_s += dt

    def _emit_loaders(self) -> None:
        for info in self._loaders.values():
            self.emit("dataloader", **info)

    def _emit_optimizers(self) -> None:
        for info in self._optimizers.values():
            self.emit("optimizer", **info)

    # ---- steps -------------------------------------------------------------------------------------
    def _open_step(self, start: float) -> _Step:
        if self._last_boundary is not None:
            start = self._last_boundary
        self.current_step = _Step(self.steps_done + 1, start)
        if self.extensions:
            self._ext("on_step_start", self.current_step.index)
        return self.current_step

    def _before_activity(self, t: float) -> None:
        """New data or a new training forward: close a manual step (backward without an
        optimizer step) if that is how this script trains."""
        step = self.current_step
        if step is None or step.n_backward == 0 or self._any_optimizer_step:
            return
        if self._manual_mode is None:
            self._manual_mode = not _optimizer_alive()
        if self._manual_mode:
            self._close_step(t, "manual")

    def _close_step(self, end: float, kind: str) -> None:
        step = self.current_step
        if step is None:
            return
        self.current_step = None
        self._last_boundary = end
        self._depth = 0   # a step ends outside any forward: heal a count a swallowed exception left raised
        self._seek_model = False
        self.steps_done = step.index
        total = end - step.start
        other = total - step.data_s - step.forward_s - step.backward_s - step.optimizer_s - step.eval_s
        ev = {
            "index": step.index, "total_s": total, "data_s": step.data_s, "forward_s": step.forward_s,
            "backward_s": step.backward_s, "optimizer_s": step.optimizer_s,
            "other_s": max(other, 0.0) + step.eval_s, "n_forward": step.n_forward,
            "n_backward": step.n_backward, "samples": step.samples, "tokens": step.tokens,
            "micro_batches": step.micro_batches or None,
            "epoch": self.epoch or None, "ended_by": kind, "instrumented": step.instrumented,
            "extra": step.extra,
        }
        if step.eval_s:
            ev["extra"]["eval_s"] = step.eval_s
        if self.extensions:
            self._ext("on_step_end", ev)
        if self._site_dirty:   # forward counts ride on the step event: one write per step
            ev["forward_counts"] = {k: self._site_counts[k] for k in self._site_dirty}
            self._site_dirty.clear()
        self.emit("step", **ev)
        if not self._env_refreshed and step.index >= 2:
            # flags such as cudnn.benchmark are often set after import: read them again once
            self._env_refreshed = True
            self._emit_loaders()
            self._emit_optimizers()
            self.emit("env", **environment())
        self.step_closed_at = time.perf_counter()   # the probe's own end-of-step work ends here
        if self.max_steps is not None and step.index >= self.max_steps:
            raise DiagStop(f"--steps {self.max_steps} reached", "stopped")

    def _flush_sites(self) -> None:
        if self._site_dirty:
            self.emit("forward_counts", counts={k: self._site_counts[k] for k in self._site_dirty})
            self._site_dirty.clear()


def _float_or_none(v) -> float | None:
    try:
        return float(v)
    except Exception:
        return None


def _optimizer_alive() -> bool:
    """Is there an Optimizer object in this process? Looked up once per run, when the first
    backward is followed by new work without an optimizer step."""
    try:
        import torch

        opt_cls = torch.optim.Optimizer
        # type(o), not isinstance: isinstance may consult o.__class__, which some deprecated
        # torch objects answer with a FutureWarning in the user's output
        return any(issubclass(type(o), opt_cls) for o in gc.get_objects())
    except Exception:
        return False


__all__ = [
    "DiagStop", "ENV_ALLOWLIST", "FileSink", "MAX_LAYER_SHAPES", "Probe", "batch_size_of", "describe_model",
    "environment", "exception_info", "find_ddp", "first_tensor", "frame_location", "grad_tensor",
    "grad_tensors", "is_library_file", "is_oom", "user_frame", "wrappers_of",
]


# the former private name of ``Probe.report_error``
Probe._report_error = Probe.report_error
