"""The check registry: finds checks through the ``diag.checks`` entry-point group and runs them.

A check is a pure function ``(Evidence) -> Iterable[Finding]`` declared with :func:`check`::

    from diag.registry import check
    from diag.findings import Finding, Severity

    @check(id="myorg.big-batch", title="Batch larger than 4096", severity="warning",
           needs=["steps"], tags=["data"])
    def big_batch(ev):
        ...
        yield Finding(id="myorg.big-batch", severity=Severity.WARNING, title=..., message=...)

An entry point may name a module (every decorated function in it is taken) or one function.
Built-in checks are registered the same way, in diag's own pyproject.toml.
A check that raises becomes a ``crashed`` finding; it never takes diag down.
"""
from __future__ import annotations

import importlib
import pkgutil
import traceback
import types
from dataclasses import dataclass, field
from typing import Callable, Iterable

from diag.errors import DiagError
from diag.findings import Finding, Severity

ENTRY_POINT_GROUP = "diag.checks"


@dataclass
class CheckSpec:
    id: str
    title: str
    func: Callable
    severity: str = "warning"          # the default severity when it triggers
    needs: list[str] = field(default_factory=list)   # what it reads from Evidence (documentation)
    tags: list[str] = field(default_factory=list)
    description: str = ""              # what it looks for, with thresholds (shown by `diag checks`)
    docs: str | None = None            # source of the rule
    source: str = "builtin"            # the entry point / distribution it came from

    def to_dict(self) -> dict:
        return {
            "id": self.id, "title": self.title, "severity": self.severity, "needs": self.needs,
            "tags": self.tags, "description": self.description, "docs": self.docs,
            "source": self.source,
        }


def check(id: str, title: str, severity: str = "warning", needs: Iterable[str] = (),
          tags: Iterable[str] = (), docs: str | None = None, description: str | None = None):
    """Declare a check. The description defaults to the function's docstring."""

    def deco(func: Callable) -> Callable:
        func.__diag_check__ = CheckSpec(
            id=id, title=title, func=func, severity=severity, needs=list(needs), tags=list(tags),
            description=(description or (func.__doc__ or "")).strip(), docs=docs,
        )
        return func

    return deco


def _specs_in(obj, source: str) -> list[CheckSpec]:
    out: list[CheckSpec] = []
    if isinstance(obj, types.ModuleType):
        for value in vars(obj).values():
            spec = getattr(value, "__diag_check__", None)
            if isinstance(spec, CheckSpec) and getattr(value, "__module__", None) == obj.__name__:
                out.append(spec)
    else:
        spec = getattr(obj, "__diag_check__", None)
        if isinstance(spec, CheckSpec):
            out.append(spec)
    for s in out:
        s.source = source
    return out


@dataclass
class LoadProblem:
    entry_point: str
    error: str


class Registry:
    def __init__(self, specs: list[CheckSpec] | None = None):
        self.specs: list[CheckSpec] = list(specs or [])
        self.problems: list[LoadProblem] = []

    # ---- discovery ----------------------------------------------------------------------------
    @classmethod
    def discover(cls) -> "Registry":
        from importlib.metadata import entry_points

        reg = cls()
        seen_ids: set[str] = set()
        eps = list(entry_points(group=ENTRY_POINT_GROUP))
        for ep in sorted(eps, key=lambda e: (not e.value.startswith("diag.checks"), e.name)):
            dist = getattr(getattr(ep, "dist", None), "name", None) or "?"
            source = "builtin" if ep.value.startswith("diag.checks") else f"{dist} ({ep.name})"
            try:
                obj = ep.load()
            except Exception as e:  # a broken plugin is reported, never fatal
                reg.problems.append(LoadProblem(f"{ep.name} = {ep.value}", f"{type(e).__name__}: {e}"))
                continue
            for spec in _specs_in(obj, source):
                if spec.id in seen_ids:
                    continue
                seen_ids.add(spec.id)
                reg.specs.append(spec)
        # The built-in modules are also found directly: a source tree that was never installed,
        # or installed metadata older than the tree (an entry point added since the last
        # `pip install -e .`), must not hide a built-in check.
        reg._add_builtin_modules(seen_ids)
        reg.specs.sort(key=lambda s: s.id)
        return reg

    def _add_builtin_modules(self, seen_ids: set[str]) -> None:
        import diag.checks as pkg

        for info in pkgutil.iter_modules(pkg.__path__):
            if info.name.startswith("_"):
                continue
            mod = importlib.import_module(f"diag.checks.{info.name}")
            for spec in _specs_in(mod, "builtin"):
                if spec.id not in seen_ids:
                    seen_ids.add(spec.id)
                    self.specs.append(spec)

    # ---- selection ----------------------------------------------------------------------------
    def select(self, select: Iterable[str] = (), ignore: Iterable[str] = ()) -> "Registry":
        """Keep checks whose id equals or starts with (``prefix.``) a selected pattern."""
        select = [s for s in select if s]
        ignore = [s for s in ignore if s]
        for pattern in list(select) + list(ignore):
            if not any(_matches(spec.id, pattern) for spec in self.specs):
                known = ", ".join(sorted({s.id.split(".")[0] for s in self.specs}))
                raise DiagError(
                    f"no check matches {pattern!r} (check ids start with: {known}); "
                    "run 'diag checks' for the catalogue"
                )
        specs = self.specs
        if select:
            specs = [s for s in specs if any(_matches(s.id, p) for p in select)]
        if ignore:
            specs = [s for s in specs if not any(_matches(s.id, p) for p in ignore)]
        out = Registry(specs)
        out.problems = self.problems
        return out

    # ---- running --------------------------------------------------------------------------------
    def run(self, evidence) -> list[Finding]:
        findings: list[Finding] = []
        for spec in self.specs:
            findings.extend(run_one(spec, evidence))
        for p in self.problems:
            findings.append(Finding(
                id="diag.plugin-load", severity=Severity.CRASHED,
                title="A check plugin failed to load",
                message=f"The entry point {p.entry_point} could not be loaded: {p.error}.",
                fix="Reinstall or fix the package that provides this entry point.",
            ))
        return findings


def _matches(check_id: str, pattern: str) -> bool:
    pattern = pattern.rstrip(".*")
    return check_id == pattern or check_id.startswith(pattern + ".")


def run_one(spec: CheckSpec, evidence) -> list[Finding]:
    try:
        result = spec.func(evidence)
        out = list(result or [])
        for f in out:
            if not isinstance(f, Finding):
                raise TypeError(f"check returned {type(f).__name__}, not Finding")
            if f.check is None or f.check == f.id:
                f.check = spec.id
            if f.docs is None:
                f.docs = spec.docs
        return out
    except Exception as e:
        tb = traceback.format_exc(limit=6)
        return [Finding(
            id=spec.id, severity=Severity.CRASHED, title=spec.title,
            message=f"The check raised {type(e).__name__}: {e}",
            evidence={"traceback": tb}, check=spec.id,
            fix="This is a bug in the check, not in your script; please report it with the evidence file.",
        )]


def run_checks(evidence, select: Iterable[str] = (), ignore: Iterable[str] = ()) -> list[Finding]:
    return Registry.discover().select(select, ignore).run(evidence)
