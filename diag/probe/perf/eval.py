"""What checks/eval.py needs: per eval-mode forward site that built an autograd graph, the bytes of
activations the graph kept alive (``extras.eval_graph``)."""
from __future__ import annotations

from diag.probe.perf._common import _source
from diag.probe.tensors import grad_tensor

EVAL_MEASURE = 3        # eval forwards per site whose graph is measured
MAX_GRAPH_NODES = 50000


class EvalRecorder:
    def _init_eval(self) -> None:
        self.eval_graph: dict[str, dict] = {}

    def on_graph_forward(self, probe, module, args, kwargs, output, site) -> None:
        key = site.get("key")
        rec = self.eval_graph.get(key)
        if rec is not None and rec["measured"] >= EVAL_MEASURE:
            return
        out = grad_tensor(output)
        if out is None:
            return
        exclude = set()
        for p in module.parameters():
            try:
                exclude.add(p.untyped_storage().data_ptr())
            except Exception:
                pass
        for t in _flat_tensors(args) + _flat_tensors(kwargs):
            try:
                exclude.add(t.untyped_storage().data_ptr())
            except Exception:
                pass
        nbytes, nodes, complete = graph_saved_bytes(out, exclude)
        if rec is None:
            loc = site.get("location") or {}
            rec = self.eval_graph[key] = {
                "bytes": 0, "nodes": 0, "measured": 0, "complete": True,
                "code": _source(loc.get("file"), loc.get("line")),
            }
        rec["bytes"] = max(rec["bytes"], nbytes)
        rec["nodes"] = max(rec["nodes"], nodes)
        rec["complete"] = rec["complete"] and complete
        rec["measured"] += 1
        self._mark("eval_graph", now=rec["measured"] == 1)


def _flat_tensors(obj, depth: int = 0) -> list:
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    out: list = []
    if depth > 2:
        return out
    if isinstance(obj, (list, tuple)):
        for o in obj[:16]:
            out.extend(_flat_tensors(o, depth + 1))
    elif isinstance(obj, dict):
        for o in list(obj.values())[:16]:
            out.extend(_flat_tensors(o, depth + 1))
    return out


def graph_saved_bytes(output, exclude_storages: set) -> tuple[int, int, bool]:
    """Bytes of the tensors an autograd graph keeps alive for its backward (each storage once;
    storages in ``exclude_storages`` — parameters, the forward's inputs — not counted), the number
    of graph nodes walked, and whether the walk was complete (it stops at MAX_GRAPH_NODES)."""
    import torch

    seen: set = set()
    storages: set = set()
    total = 0
    stack = [output.grad_fn]
    nodes = 0
    attrs_cache: dict[type, list[str]] = {}
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        nodes += 1
        if nodes > MAX_GRAPH_NODES:
            return total, nodes, False
        names = attrs_cache.get(type(node))
        if names is None:
            names = attrs_cache[type(node)] = [a for a in dir(node) if a.startswith("_saved_")]
        for a in names:
            try:
                v = getattr(node, a)
            except Exception:
                continue
            vals = v if isinstance(v, (list, tuple)) else (v,)
            for x in vals:
                if isinstance(x, torch.Tensor):
                    try:
                        st = x.untyped_storage()
                        ptr = st.data_ptr()
                    except Exception:
                        continue
                    if ptr in exclude_storages or ptr in storages or ptr == 0:
                        continue
                    storages.add(ptr)
                    total += st.nbytes()
        for nxt, _ in node.next_functions:
            if nxt is not None:
                stack.append(nxt)
    return total, nodes, True
