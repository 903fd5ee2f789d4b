"""What checks/sync.py and the copy part of checks/dataloader.py need (CUDA training only): host-device
synchronisations counted per step over a window of ``SYNC_STEPS`` steps with
``torch.cuda.set_sync_debug_mode("warn")``, located in the user's code (``sync``), and, in the same
window, host-to-device copies (``extras.copies``: bytes, and ``non_blocking=True`` copies from pageable
memory, which are synchronous in fact; sync debug mode cannot see those)."""
from __future__ import annotations

import re
import warnings

from diag.probe.hooks import Patches
from diag.probe.quiet import add_filter, remove_filter
from diag.probe.perf._common import MAX_LOCATE, MAX_SITES, _count_at_caller

SYNC_MSG = "called a synchronizing CUDA operation"   # the text of torch's sync debug warning
SYNC_FIRST_STEP = 1     # the window opens at the end of this step (the first one is warm-up)
SYNC_STEPS = 20         # steps counted inside the window

# Called as fn("start", src) / fn("end", src) around each host-to-device copy the copy watch sees
# (``.to()``, ``.cuda()``, and ``copy_`` into a CUDA tensor; ``src`` is the CPU tensor copied): the
# device timeline (diag.probe.timeline) times copies here instead of patching Tensor a second time.
COPY_LISTENERS: list = []
# {"on": True} while the copy watch is on (the timeline marks the steps whose copies were all seen)
COPY_WATCH: dict = {"on": False}


def h2d_target(args, kwargs):
    """The device type a ``Tensor.to(...)``/``.cuda(...)`` call copies to (None when it keeps the
    device), and whether it asked for ``non_blocking``. Pure argument parsing, no copy."""
    import torch

    dev = kwargs.get("device")
    nb = bool(kwargs.get("non_blocking", False))
    if args:
        a0 = args[0]
        if isinstance(a0, (str, torch.device)):
            dev = a0
        elif isinstance(a0, int) and not isinstance(a0, bool):
            dev = "cuda"
        elif isinstance(a0, torch.Tensor):
            dev = a0.device        # .to(other_tensor)
        for a in args[1:3]:
            if a is True:
                nb = True
                break
    if dev is None:
        return None, nb
    if isinstance(dev, int) and not isinstance(dev, bool):
        return "cuda", nb
    t = dev if isinstance(dev, str) else getattr(dev, "type", str(dev))
    return t.split(":")[0], nb


class SyncRecorder:
    def _init_sync(self) -> None:
        self._cuda_training = False
        self._sync_open = False
        self._sync_done = False
        self._sync_since = 0
        self._sync_located = 0
        self._sync_sites: dict[tuple, dict] = {}
        self.sync = {"state": "not started", "mode": None, "first_step": None, "last_step": None,
                     "steps": 0, "total": 0, "per_step": [], "sites": []}
        self._sync_filter = None
        self._orig_showwarning = None
        self._hook = self._showwarning     # one bound method, so that `is` finds it again
        self._copy_sites: dict[tuple, dict] = {}
        self.copies = {"h2d_copies": 0, "h2d_bytes": 0, "non_blocking_pageable": 0,
                       "non_blocking_pinned": 0, "blocking": 0, "steps": 0, "sites": [], "watched": False}
        self._copy_watch = False

    def _sync_step(self, probe, index: int) -> None:
        if self._sync_open:
            self.sync["per_step"].append(self._sync_since)
            self.sync["steps"] += 1
            self.sync["last_step"] = index
            self._sync_since = 0
            self.copies["steps"] += 1
            if self.sync["steps"] >= SYNC_STEPS:
                self._close_sync(probe)
        elif index >= SYNC_FIRST_STEP and self._cuda_training and not self._sync_done:
            self._open_sync(probe, index + 1)

    # ---- host-device synchronisation window (CUDA) -------------------------------------------------
    def _open_sync(self, probe, first_step: int) -> None:
        self._sync_done = True
        torch = self._torch
        try:
            mode = torch.cuda.get_sync_debug_mode()
        except Exception as e:
            self.sync["state"] = f"unavailable: {type(e).__name__}: {e}"[:300]
            self._mark("sync")
            return
        if mode != 0:
            # the script set it itself: leave it alone (it sees its own warnings or errors)
            self.sync["state"] = f"not sampled: the script set sync debug mode {mode} itself"
            self._mark("sync")
            return
        try:
            torch.cuda.set_sync_debug_mode("warn")
        except Exception as e:
            self.sync["state"] = f"unavailable: {type(e).__name__}: {e}"[:300]
            self._mark("sync")
            return
        self.start_sync_capture(first_step)
        if not self.compile["calls"] and not self.compile["models"]:
            self._start_copy_watch(torch)

    def start_sync_capture(self, first_step: int) -> None:
        """Route torch's sync warnings to the counter (public for tests: on a CPU-only build the
        warning can be issued by hand with the text a CUDA build uses)."""
        self._sync_filter = add_filter("always", re.escape(SYNC_MSG))   # no registry reset (quiet.add_filter)
        self._orig_showwarning = warnings.showwarning
        warnings.showwarning = self._hook
        self._sync_open = True
        self.sync.update(state="sampling", mode="warn", first_step=first_step)
        self._mark("sync")

    def _showwarning(self, message, category, filename, lineno, file=None, line=None):
        if str(message).startswith(SYNC_MSG):
            try:
                self._on_sync()
            except Exception:
                pass
            return None
        orig = self._orig_showwarning or warnings._showwarning_orig
        return orig(message, category, filename, lineno, file, line)

    def _on_sync(self) -> None:
        self.sync["total"] += 1
        self._sync_since += 1
        if self._sync_located >= MAX_LOCATE:
            return
        self._sync_located += 1
        _count_at_caller(self._sync_sites)

    def _close_sync(self, probe, emit: bool = True) -> None:
        self._stop_copy_watch()
        if not self._sync_open:
            return
        self._sync_open = False
        try:
            if self._torch is not None and self._torch.cuda.is_initialized():
                self._torch.cuda.set_sync_debug_mode(0)
        except Exception:
            pass
        try:
            remove_filter(self._sync_filter)
        except Exception:
            pass
        if warnings.showwarning is self._hook:
            warnings.showwarning = self._orig_showwarning or warnings._showwarning_orig
        s = self.sync
        s["state"] = "sampled"
        s["sites"] = sorted(self._sync_sites.values(), key=lambda x: -x["count"])[:MAX_SITES]
        c = self.copies
        c["sites"] = sorted(self._copy_sites.values(), key=lambda x: -x["count"])[:MAX_SITES]
        self._dirty.update(("sync", "copies"))
        if emit:
            self._flush(probe)

    # ---- host-to-device copies (CUDA, inside the window) --------------------------------------------
    def _start_copy_watch(self, torch) -> None:
        ext = self
        Tensor = torch.Tensor
        orig_to, orig_cuda, orig_copy = Tensor.to, Tensor.cuda, getattr(Tensor, "copy_", None)
        self._copy_patches = Patches()

        def to(t, *args, **kwargs):
            if ext._copy_watch:
                h2d = False
                try:
                    h2d = ext._on_copy(t, args, kwargs, None)
                except Exception:
                    pass
                if h2d and COPY_LISTENERS:
                    return _timed_copy(orig_to, t, args, kwargs)
            return orig_to(t, *args, **kwargs)

        def cuda(t, *args, **kwargs):
            if ext._copy_watch:
                h2d = False
                try:
                    h2d = ext._on_copy(t, args, kwargs, "cuda")
                except Exception:
                    pass
                if h2d and COPY_LISTENERS:
                    return _timed_copy(orig_cuda, t, args, kwargs)
            return orig_cuda(t, *args, **kwargs)

        def copy_(t, src, *args, **kwargs):
            # dst.copy_(src, non_blocking=...) with a CPU src into a CUDA dst: a host-to-device copy
            if ext._copy_watch:
                h2d = False
                try:
                    h2d = ext._on_copy_into(t, src, args, kwargs)
                except Exception:
                    pass
                if h2d and COPY_LISTENERS:
                    return _timed_copy(orig_copy, t, (src,) + args, kwargs, src)
            return orig_copy(t, src, *args, **kwargs)

        to.__wrapped__, cuda.__wrapped__ = orig_to, orig_cuda
        to.__doc__, cuda.__doc__ = orig_to.__doc__, orig_cuda.__doc__
        self._patch(Tensor, "to", to, self._copy_patches)
        self._patch(Tensor, "cuda", cuda, self._copy_patches)
        if orig_copy is not None:
            copy_.__wrapped__, copy_.__doc__ = orig_copy, orig_copy.__doc__
            self._patch(Tensor, "copy_", copy_, self._copy_patches)
        self._copy_watch = True
        COPY_WATCH["on"] = True
        self.copies["watched"] = True

    def _stop_copy_watch(self) -> None:
        self._copy_watch = False
        COPY_WATCH["on"] = False
        patches = getattr(self, "_copy_patches", None)
        if patches:
            patches.undo()

    def _on_copy(self, t, args, kwargs, target) -> bool:
        """Count a host-to-device copy; True when the call is one."""
        if t.device.type != "cpu":
            return False
        if target is None:
            target, nb = h2d_target(args, kwargs)
        else:
            nb = bool(kwargs.get("non_blocking", False)) or any(a is True for a in args[:2])
        if target != "cuda":
            return False
        self.record_copy(t, nb)
        return True

    def _on_copy_into(self, dst, src, args, kwargs) -> bool:
        """Count ``dst.copy_(src, ...)`` when it copies a CPU tensor into a CUDA one."""
        if getattr(src, "device", None) is None or src.device.type != "cpu" or dst.device.type != "cuda":
            return False
        nb = bool(kwargs.get("non_blocking", False)) or (bool(args) and args[0] is True)
        self.record_copy(src, nb)
        return True

    def record_copy(self, t, non_blocking: bool) -> None:
        """Count one host-to-device copy of CPU tensor ``t`` (public for tests)."""
        c = self.copies
        c["h2d_copies"] += 1
        c["h2d_bytes"] += t.numel() * t.element_size()
        if not non_blocking:
            c["blocking"] += 1
            return
        if t.is_pinned():
            c["non_blocking_pinned"] += 1
            return
        c["non_blocking_pageable"] += 1
        if len(self._copy_sites) < 100 and self._sync_located < MAX_LOCATE:
            self._sync_located += 1
            _count_at_caller(self._copy_sites)


def _timed_copy(orig, t, args, kwargs, src=None):
    """``orig(t, ...)`` with the copy listeners told before and after, with the CPU tensor copied
    (``src``, else ``t``); a listener that fails is left out; the copy always happens."""
    src = t if src is None else src
    for fn in list(COPY_LISTENERS):
        try:
            fn("start", src)
        except Exception:
            pass
    out = orig(t, *args, **kwargs)
    for fn in list(COPY_LISTENERS):
        try:
            fn("end", src)
        except Exception:
            pass
    return out
