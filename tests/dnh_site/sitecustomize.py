"""The do-no-harm harness's loss recorder (tests/dnh.py), loaded by ``site`` in every Python process
whose PYTHONPATH holds this folder, and inert unless ``DIAG_DNH_LOSSES`` names a folder.

Both runs start from the same seeds (Python's ``random`` and torch's default generator, seeded as
torch is imported), so that a script which seeds nothing is deterministic too: a probe that drew from
either generator would shift every number after it. When ``torch`` is imported, ``torch.autograd.backward`` (which ``Tensor.backward`` calls) is wrapped to
append the exact value of each scalar it is called on (``float.hex``) to
``$DIAG_DNH_LOSSES/<rank>-<process name>.txt``. The bare run and the run under diag load the same
recorder, so it is the same code in both: what differs between the two files is what diag changed.
diag's own command-line process never runs a backward; what the probe runs before the script starts
(its cost calibration, while ``__main__`` is still ``diag.probe.__main__``) is not recorded."""
import importlib.abc
import importlib.util
import os
import sys

_DIR = os.environ.get("DIAG_DNH_LOSSES")


def _install_recorder(torch) -> None:
    import multiprocessing

    torch.manual_seed(0)     # the same start in both runs for a script that seeds nothing itself

    orig = torch.autograd.backward

    def backward(tensors, *args, **kwargs):
        t = tensors[0] if isinstance(tensors, (tuple, list)) and len(tensors) == 1 else tensors
        try:
            main = getattr(sys.modules.get("__main__"), "__file__", None) or ""
            if main.endswith(os.path.join("diag", "probe", "__main__.py")):
                return orig(tensors, *args, **kwargs)   # diag's own work before the script starts
            if isinstance(t, torch.Tensor) and t.numel() == 1 and t.is_floating_point():
                name = f"{os.environ.get('RANK', '0')}-{multiprocessing.current_process().name}.txt"
                with open(os.path.join(_DIR, name), "a") as f:
                    f.write(float(t.detach().double()).hex() + "\n")
        except Exception:
            pass
        return orig(tensors, *args, **kwargs)

    backward.__wrapped__ = orig
    torch.autograd.backward = backward


class _AfterTorch(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``torch`` through the other finders, runs it, then installs the recorder."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
        _install_recorder(module)


if _DIR:
    import random

    random.seed(0)
    sys.meta_path.insert(0, _AfterTorch())
