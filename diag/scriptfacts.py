"""What the user's script says about itself, read from its source by diag's process (never executed):
its own command-line flags (``parser.add_argument("--num-workers", ...)``), where it constructs its
DataLoaders (``loader = DataLoader(...)``), and which name each ``for ... in NAME`` / ``iter(NAME)``
line iterates. Checks locate a fix where it is made — the ``DataLoader(...)`` call, the script's own
``--num-workers`` or ``--compile`` flag — rather than where the probe saw the effect (the loop).

Stored as ``Evidence.run.script_facts`` (plain JSON, bounded); ``None`` when the script cannot be read
or parsed. Pure: no import of the script, no torch.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

MAX_ITEMS = 200


def _name(node) -> str | None:
    """``loader`` for ``loader``, ``self.loader``, ``loaders["train"]`` → the last plain name."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):
        return _name(node.value)
    if isinstance(node, ast.Call):
        f = node.func
        fname = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        if fname in ("iter", "enumerate", "tqdm", "zip", "cycle") and node.args:
            return _name(node.args[0])
    return None


def _call_name(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _const(node) -> Any:
    try:
        v = ast.literal_eval(node)
    except Exception:
        return None
    return v if isinstance(v, (int, float, str, bool)) or v is None else None


def read(path: str | Path) -> dict | None:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
        tree = ast.parse(text)
    except (OSError, SyntaxError, ValueError, RecursionError):
        return None
    flags: list[dict] = []
    loaders: list[dict] = []
    iterates: dict[str, str] = {}
    zero_grads: list[dict] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _call_name(node) == "zero_grad":
            kw = {k.arg: k.value for k in node.keywords if k.arg}
            stn = _const(kw["set_to_none"]) if "set_to_none" in kw else (_const(node.args[0]) if node.args else None)
            zero_grads.append({"line": node.lineno, "set_to_none": stn,
                               "on": ast.unparse(node.func.value)[:60] if isinstance(node.func, ast.Attribute) else ""})
        if isinstance(node, ast.Call) and _call_name(node) == "add_argument":
            opts = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            long = [o for o in opts if o.startswith("--")]
            if not long:
                continue
            kw = {k.arg: k.value for k in node.keywords if k.arg}
            dest = _const(kw["dest"]) if "dest" in kw else long[0][2:].replace("-", "_")
            action = _const(kw["action"]) if "action" in kw else None
            flags.append({"flag": long[0], "dest": dest, "line": node.lineno,
                          "default": _const(kw["default"]) if "default" in kw else None,
                          "store_true": action in ("store_true", "store_false", "BooleanOptionalAction")})
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Call) \
                and _call_name(node.value).endswith("DataLoader"):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [n for n in (_name(t) for t in targets) if n]
            kws = {k.arg: k.value for k in node.value.keywords if k.arg}
            nw = kws.get("num_workers")
            loaders.append({"line": node.value.lineno, "names": names,
                            "num_workers_from": ast.unparse(nw)[:80] if nw is not None else None})
        elif isinstance(node, ast.Call) and _call_name(node).endswith("DataLoader") \
                and not any(ld["line"] == node.lineno for ld in loaders):
            kws = {k.arg: k.value for k in node.keywords if k.arg}
            nw = kws.get("num_workers")
            loaders.append({"line": node.lineno, "names": [],
                            "num_workers_from": ast.unparse(nw)[:80] if nw is not None else None})
        if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            it = node.iter
            n = _name(it)
            line = getattr(it, "lineno", None) or getattr(node, "lineno", None)
            if n and line:
                iterates[str(line)] = n
        elif isinstance(node, ast.Call) and _call_name(node) in ("iter", "next") and node.args:
            n = _name(node.args[0])
            if n:
                iterates.setdefault(str(node.lineno), n)
    loaders.sort(key=lambda d: d["line"])
    return {"file": str(Path(path).resolve()), "flags": flags[:MAX_ITEMS], "loaders": loaders[:MAX_ITEMS],
            "iterates": dict(list(iterates.items())[:MAX_ITEMS]),
            "zero_grad": sorted(zero_grads, key=lambda d: d["line"])[:MAX_ITEMS]}
