"""Introspection of tensors: the tensors a forward's inputs or outputs hold (sequences, dicts and
dataclasses, a few levels deep, a bounded number), and the batch size they imply."""
from __future__ import annotations

import dataclasses


def _children(obj):
    """The values a forward's input or output holds: a sequence's items, a dict's values, a
    dataclass's fields (model outputs such as ``Output(loss=..., logits=...)``), at most 8."""
    if isinstance(obj, (list, tuple)):
        return obj[:8]
    if isinstance(obj, dict):
        return list(obj.values())[:8]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        try:
            return [getattr(obj, f.name, None) for f in dataclasses.fields(obj)[:8]]
        except Exception:
            return ()
    return ()


def _find_tensors(obj, want, out: list, limit: int, depth: int = 0) -> None:
    import torch

    if len(out) >= limit:
        return
    if isinstance(obj, torch.Tensor):
        if want(obj):
            out.append(obj)
        return
    if depth > 2:
        return
    for o in _children(obj):
        _find_tensors(o, want, out, limit, depth + 1)
        if len(out) >= limit:
            return


def first_tensor(obj):
    """The first tensor in a forward's input or output (None when there is none)."""
    out: list = []
    _find_tensors(obj, lambda t: True, out, 1)
    return out[0] if out else None


def grad_tensor(obj):
    """The first tensor in a forward's output that requires grad (None when none does)."""
    out: list = []
    _find_tensors(obj, lambda t: t.requires_grad, out, 1)
    return out[0] if out else None


def grad_tensors(obj, limit: int = 8) -> list:
    """Every tensor (up to ``limit``) in a forward's output that requires grad: a backward may start
    from any of them (a model returning (features, logits) whose loss uses only the logits)."""
    out: list = []
    _find_tensors(obj, lambda t: t.requires_grad, out, limit)
    return out


def batch_size_of(args, kwargs, hint: int | None = None) -> tuple[int | None, int | None, list, list]:
    """(samples, tokens, shapes, dtypes) from a forward's inputs. ``hint``: the number of samples in
    the last batch a DataLoader delivered; when one of the first input tensor's dims has that size,
    that is the batch (seq-first inputs: ``[seq, batch]``), otherwise dim 0. tokens is the tensor's
    numel when it is a 2-D integer tensor (token ids)."""
    t = first_tensor(args) if args else None
    if t is None and kwargs:
        t = first_tensor(kwargs)
    if t is None or t.dim() == 0:
        return None, None, [], []
    samples = int(t.shape[0])
    if hint is not None and samples != hint and hint in tuple(t.shape):
        samples = int(hint)
    tokens = None
    if t.dim() == 2 and not t.is_floating_point() and not t.is_complex():
        tokens = int(t.numel())
    return samples, tokens, [list(t.shape)], [str(t.dtype).replace("torch.", "")]



_TENSOR = None     # torch.Tensor, once torch is imported (this module stays importable without it)


def _tensor_cls():
    global _TENSOR
    if _TENSOR is None:
        import torch

        _TENSOR = torch.Tensor
    return _TENSOR


def output_grad_tensors(output) -> list:
    """:func:`grad_tensors` with the common case first (issue 20: per outermost forward): a model
    returning one plain tensor."""
    if type(output) is (_TENSOR or _tensor_cls()):
        return [output] if output.requires_grad else []
    return grad_tensors(output)


def samples_of(args, kwargs, hint: int | None = None) -> tuple[int | None, int | None]:
    """(samples, tokens) of :func:`batch_size_of`, without its shapes and dtypes; the common case (a
    plain tensor as the first argument) first (per training forward: the step's hot path)."""
    t = args[0] if args else None
    if type(t) is not (_TENSOR or _tensor_cls()):
        return batch_size_of(args, kwargs, hint)[:2]
    shape = t.shape
    if not shape:
        return None, None
    samples = shape[0]
    if hint is not None and samples != hint and hint in shape:
        samples = hint
    tokens = None
    if len(shape) == 2 and not t.is_floating_point() and not t.is_complex():
        tokens = shape[0] * shape[1]
    return samples, tokens


def on_backward(t, fn):
    """Call ``fn`` when a backward reaches ``t``: a pre-hook on the node that made it (``fn`` gets that
    node's output gradients; about half the cost of ``Tensor.register_hook``, which also builds the
    tensor's hook dictionary), or a tensor hook on a leaf."""
    node = t.grad_fn
    if node is not None:
        return node.register_prehook(fn)
    return t.register_hook(fn)


class TorchState:
    """torch's mode readers the outermost forward asks every step, bound once (``Probe.install``): a
    global read each instead of an ``import torch`` and a lookup in torch's module dict, which after a
    deep step's work are cache misses of a few microseconds (issue 20)."""
    torch = None
    Tensor = None
    grad = None
    inference = None
    autocast = None
    autocast_dtype = None
    any_autocast = None

    @classmethod
    def bind(cls):
        import torch

        if cls.torch is None:
            cls.Tensor = torch.Tensor
            cls.grad = torch.is_grad_enabled
            cls.inference = torch.is_inference_mode_enabled
            cls.autocast = torch.is_autocast_enabled
            cls.autocast_dtype = torch.get_autocast_dtype
            # one argument-free C call that is False in a run without autocast (most steps of most runs)
            cls.any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None) or (lambda: True)
            cls.torch = torch
        return cls
