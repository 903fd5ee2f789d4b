"""The check registry: finds checks through the ``diag.checks`` entry-point group and runs them.

Checks are written against the public API, :mod:`diag.checks.api` (``@check``, a context object,
preconditions, formatters); docs/plugins.md is the guide. Functions decorated with this module's
legacy :func:`check` (a function of the Evidence that builds its own findings) still run.

An entry point may name a module (every decorated check in it is taken) or one check. Built-in checks
are registered the same way, in diag's own pyproject.toml; third-party entry points are listed from
their metadata (``diag checks``) and imported only to run.

Nothing a check or a plugin does takes diag down: an exception of any kind (``SystemExit`` and
``KeyboardInterrupt`` included) while importing or running becomes a ``crashed`` finding with the
reason, a check that runs past its time limit (``DIAG_CHECK_TIMEOUT`` seconds, default 5) is reported
``crashed`` and left behind, and a check id declared twice is reported naming both packages.

Evidence from ``diag check`` (the probe) and from ``diag attach`` (sampled stacks) runs through the same
registry: a check runs only on the evidence sources it judges (``Check.judges``, declared with
``@check(sources=...)``) and is reported ``skipped`` with why on the others, for instance "Not
observable by sampling"; a check that ``replaces`` another answers under its id on its sources, and
the pair never both report.
"""
from __future__ import annotations

import importlib
import os
import pkgutil
import threading
import traceback
import types
from dataclasses import dataclass
from typing import Callable, Iterable

from diag.checks.api import Check, Context, evidence_source, source_unmet
from diag.errors import DiagError
from diag.findings import Finding, Severity

ENTRY_POINT_GROUP = "diag.checks"
DEFAULT_TIMEOUT_S = 5.0
TIMEOUT_ENV = "DIAG_CHECK_TIMEOUT"

CheckSpec = Check   # the name before the public API; kept for older plugins and tests


def check_timeout() -> float | None:
    """The per-check time limit in seconds (DIAG_CHECK_TIMEOUT; 0 or 'none' disables it)."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    if raw.lower() in ("0", "none", "off"):
        return None
    try:
        value = float(raw)
    except ValueError:
        raise DiagError(f"{TIMEOUT_ENV}={raw!r} is not a number of seconds") from None
    if not value > 0 or value != value or value == float("inf"):
        raise DiagError(f"{TIMEOUT_ENV}={raw!r} must be a positive number of seconds (or 0 for no limit)")
    return value


def check(id: str, title: str, severity: str = "warning", needs: Iterable[str] = (),
          tags: Iterable[str] = (), docs: str | None = None, description: str | None = None):
    """Legacy declaration: the check is a function of the Evidence and builds whole Findings.
    New checks use :func:`diag.checks.api.check`."""

    def deco(func: Callable) -> Callable:
        func.__diag_check__ = Check(
            id=id, title=title, func=func, severity=severity, needs=list(needs), tags=list(tags),
            description=(description or (func.__doc__ or "")).strip(), docs=docs, takes_context=False,
            module=func.__module__,
        )
        return func

    return deco


def _specs_in(obj, source: str) -> list[Check]:
    out: list[Check] = []
    if isinstance(obj, types.ModuleType):
        for value in vars(obj).values():
            spec = getattr(value, "__diag_check__", None)
            if isinstance(spec, Check) and (spec.module or getattr(spec.func, "__module__", None)) == obj.__name__:
                out.append(spec)
    else:
        spec = getattr(obj, "__diag_check__", None)
        if isinstance(spec, Check):
            out.append(spec)
    for s in out:
        s.source = source
    return out


@dataclass
class LoadProblem:
    entry_point: str
    error: str
    id: str = "diag.plugin-load"
    title: str = "A check plugin failed to load"
    fix: str = "Reinstall or fix the package that provides this entry point."


@dataclass
class PluginEntry:
    """A third-party entry point, known from its metadata only (not imported)."""
    name: str           # the entry point's name (by convention the check id, or an id prefix)
    value: str          # module or module:attribute
    dist: str           # the distribution that declares it
    version: str

    @property
    def source(self) -> str:
        return f"{self.dist} ({self.name})"

    def to_dict(self) -> dict:
        return {"id": self.name, "title": None, "severity": None, "needs": [], "tags": [],
                "description": f"plugin entry point {self.value} from {self.dist} {self.version} (not imported)",
                "docs": None, "source": self.source, "loaded": False}


def _is_builtin(ep) -> bool:
    return ep.value == "diag.checks" or ep.value.startswith("diag.checks.") or ep.value.startswith("diag.checks:")


def _call_with_limit(fn: Callable, timeout: float | None):
    """Run ``fn()`` in a daemon thread: ``(result, None)``, or ``(None, (kind, exc, traceback))`` where
    kind is 'raised' (any BaseException) or 'timeout' (still running after ``timeout`` s; left behind)."""
    box: dict = {}

    def target():
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - SystemExit/KeyboardInterrupt from a plugin included
            box["error"] = ("raised", e, traceback.format_exc(limit=6))

    if timeout is None:
        target()
    else:
        t = threading.Thread(target=target, name="diag-check", daemon=True)
        t.start()
        t.join(timeout)
        if t.is_alive():
            return None, ("timeout", None, "")
    if "error" in box:
        return None, box["error"]
    return box.get("result"), None


class Registry:
    def __init__(self, specs: list[Check] | None = None):
        self.specs: list[Check] = list(specs or [])
        self.problems: list[LoadProblem] = []
        self.plugins: list[PluginEntry] = []     # third-party entry points (listed, maybe not loaded)
        self.timeout: float | None = None        # None: read DIAG_CHECK_TIMEOUT when running

    # ---- discovery ----------------------------------------------------------------------------
    @classmethod
    def discover(cls, load_plugins: bool = True) -> "Registry":
        """Built-in checks, and the plugins' checks (imported only when ``load_plugins``; otherwise
        they are listed from their entry-point metadata in ``plugins``)."""
        from importlib.metadata import entry_points

        check_timeout()   # a bad DIAG_CHECK_TIMEOUT is a usage error before anything runs
        reg = cls()
        owner: dict[str, str] = {}   # check id -> source that declared it first
        eps = list(entry_points(group=ENTRY_POINT_GROUP))
        plugin_eps = []
        for ep in sorted(eps, key=lambda e: (not _is_builtin(e), e.name)):
            if _is_builtin(ep):
                try:
                    reg._add(_specs_in(ep.load(), "builtin"), owner)
                except Exception:  # stale metadata of an editable install: found below from the tree
                    pass
                continue
            dist = getattr(ep, "dist", None)
            reg.plugins.append(PluginEntry(ep.name, ep.value, getattr(dist, "name", None) or "?",
                                           getattr(dist, "version", None) or "?"))
            plugin_eps.append(ep)
        # The built-in modules are also found directly: a source tree that was never installed,
        # or installed metadata older than the tree, must not hide a built-in check.
        reg._add_builtin_modules(owner)
        if load_plugins:
            for ep, entry in zip(plugin_eps, reg.plugins):
                reg._load_plugin(ep, entry, owner)
        reg.specs.sort(key=lambda s: s.id)
        return reg

    def _add(self, specs: list[Check], owner: dict[str, str]) -> None:
        for spec in specs:
            first = owner.get(spec.id)
            if first is not None:
                if first != spec.source:
                    self.problems.append(LoadProblem(
                        spec.source, f"the check id {spec.id!r} is declared both by {first} and by "
                                     f"{spec.source}; only the one from {first} runs",
                        id="diag.plugin-duplicate", title="Two packages declare the same check id",
                        fix=f"Uninstall one of them, or rename the check in {spec.source}."))
                continue
            owner[spec.id] = spec.source
            self.specs.append(spec)

    def _load_plugin(self, ep, entry: PluginEntry, owner: dict[str, str]) -> None:
        label = f"{ep.name} = {ep.value}"
        obj, err = _call_with_limit(ep.load, self._timeout())
        if err is not None:
            kind, e, _tb = err
            if kind == "timeout":
                why = f"importing it took longer than {self._timeout():g} s"
            else:
                why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            self.problems.append(LoadProblem(f"{label} (from {entry.dist})", why))
            return
        specs = _specs_in(obj, entry.source)
        if not specs:
            self.problems.append(LoadProblem(f"{label} (from {entry.dist})",
                                             "it declares no check (no function decorated with "
                                             "diag.checks.api.check)"))
        self._add(specs, owner)

    def _add_builtin_modules(self, owner: dict[str, str]) -> None:
        import diag.checks as pkg

        for info in pkgutil.iter_modules(pkg.__path__):
            if info.name.startswith("_") or info.name == "api":
                continue
            try:
                mod = importlib.import_module(f"diag.checks.{info.name}")
            except Exception as e:   # a broken built-in module is a crashed result, never diag's traceback
                self.problems.append(LoadProblem(
                    f"diag.checks.{info.name} (built-in)", f"{type(e).__name__}: {e}" if str(e) else type(e).__name__,
                    title="A built-in check module failed to load",
                    fix="This is a bug in diag: please report it with this message; the other checks still ran."))
                continue
            self._add([s for s in _specs_in(mod, "builtin") if s.id not in owner], owner)

    def _timeout(self) -> float | None:
        return self.timeout if self.timeout is not None else check_timeout()

    # ---- selection ----------------------------------------------------------------------------
    def select(self, select: Iterable[str] = (), ignore: Iterable[str] = ()) -> "Registry":
        """Keep checks whose id equals or starts with (``prefix.``) a selected pattern."""
        select = [s for s in select if s]
        ignore = [s for s in ignore if s]
        for pattern in list(select) + list(ignore):
            if not any(_selected(spec, pattern) for spec in self.specs):
                known = ", ".join(sorted({s.id.split(".")[0] for s in self.specs}))
                raise DiagError(
                    f"no check matches {pattern!r} (check ids start with: {known}); "
                    "run 'diag checks' for the catalogue"
                )
        specs = self.specs
        if select:
            specs = [s for s in specs if any(_selected(s, p) for p in select)]
        if ignore:
            specs = [s for s in specs if not any(_selected(s, p) for p in ignore)]
        out = Registry(specs)
        out.problems = self.problems
        out.plugins = self.plugins
        out.timeout = self.timeout
        return out

    # ---- running --------------------------------------------------------------------------------
    def run(self, evidence) -> list[Finding]:
        timeout = self._timeout()
        findings: list[Finding] = []
        for spec in self.specs:
            if self.answered_by_another(spec, evidence):
                continue
            findings.extend(dedupe(run_one(spec, evidence, timeout=timeout)))
        for p in self.problems:
            findings.append(Finding(
                id=p.id, severity=Severity.CRASHED, title=p.title,
                message=(f"The entry point {p.entry_point} could not be loaded: {p.error}."
                         if p.id == "diag.plugin-load" else f"{p.error[0].upper()}{p.error[1:]}."),
                fix=p.fix,
            ))
        return findings

    def answered_by_another(self, spec: Check, evidence) -> bool:
        """True when ``spec`` does not judge this evidence's source and another check in the registry
        answers under the same id for it (a ``replaces`` pair): ``spec`` is then left out."""
        src = evidence_source(evidence)
        if src in spec.judges:
            return False
        if spec.replaces and any(s.id == spec.replaces and src in s.judges for s in self.specs):
            return True
        return any(s.replaces == spec.id and src in s.judges for s in self.specs)


def _selected(spec: Check, pattern: str) -> bool:
    """A pattern selects a check by its id, or by the id it reports under (``replaces``)."""
    return _matches(spec.id, pattern) or (spec.replaces is not None and _matches(spec.replaces, pattern))


def dedupe(findings: list[Finding]) -> list[Finding]:
    """One finding per (id, severity, location): a check that yields the same verdict twice for
    the same line (two model objects called at one call site) reports it once. Findings without a
    location, and skipped/passed results, are kept as they are."""
    out: list[Finding] = []
    seen: set = set()
    for f in findings:
        loc = f.location
        if loc is None or not getattr(loc, "file", None) or f.severity in (Severity.PASS, Severity.SKIPPED):
            out.append(f)
            continue
        key = (f.id, f.severity, loc.file, getattr(loc, "line", None), f.message)
        key_loose = key[:4]
        if key in seen or key_loose in seen:
            continue
        seen.add(key)
        seen.add(key_loose)
        out.append(f)
    return out


def _matches(check_id: str, pattern: str) -> bool:
    pattern = pattern.rstrip(".*")
    return check_id == pattern or check_id.startswith(pattern + ".")


def _crashed(spec: Check, message: str, tb: str = "") -> list[Finding]:
    return [Finding(
        id=spec.id, severity=Severity.CRASHED, title=spec.title, message=message,
        evidence={"traceback": tb} if tb else {}, check=spec.id, docs=spec.docs,
        fix=("This is a bug in the check, not in your script; please report it with the evidence file."
             if spec.source == "builtin" else
             f"This is a bug in the plugin {spec.source}, not in your script; report it to its authors."),
    )]


def _execute(spec: Check, evidence) -> list:
    """The evidence source, the preconditions, then the check; its findings as a list (not yet validated)."""
    ctx = Context(spec, evidence)
    unmet = source_unmet(spec, evidence)
    if unmet is not None:
        reason, numbers = unmet
        return [ctx.finding(reason, Severity.SKIPPED, evidence=numbers)]
    if not spec.takes_context:
        return list(spec.func(evidence) or [])
    for pre in spec.requires:
        unmet = pre(ctx)
        if unmet is not None:
            reason, numbers = unmet
            return [ctx.skip(reason, **numbers)]
    result = spec.func(ctx)
    if result is None:
        return []
    if isinstance(result, Finding):
        return [result]
    return list(result)


def run_one(spec: Check, evidence, timeout: float | None = None) -> list[Finding]:
    """Run one check: its findings with id/title/docs filled in, or one ``crashed`` finding when it
    raised (any BaseException), returned something else than findings, or ran past ``timeout`` s."""
    out, err = _call_with_limit(lambda: _execute(spec, evidence), timeout)
    if err is not None:
        kind, e, tb = err
        if kind == "timeout":
            return _crashed(spec, f"The check did not finish within {timeout:g} s and was abandoned "
                                  f"(the limit is set with {TIMEOUT_ENV}).")
        return _crashed(spec, f"The check raised {type(e).__name__}: {e}", tb)
    for f in out:
        if not isinstance(f, Finding):
            return _crashed(spec, f"The check raised TypeError: check returned {type(f).__name__}, not Finding")
        if f.check is None or f.check == f.id:
            f.check = spec.id
        if f.docs is None:
            f.docs = spec.docs
    return out
