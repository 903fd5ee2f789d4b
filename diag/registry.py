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
``crashed``, and a check id declared twice is reported naming both packages.

Third-party code never runs in diag's process: plugins are imported and their checks run in one
worker process per registry (:mod:`diag.plugin_worker`), held to a hard time and memory limit and
killed when a check overruns, whatever the check does (a C call holding the GIL, ``os._exit``,
``atexit``, printing, ``os.chdir``). diag's process only holds a description of each plugin check.
The built-in checks (the modules of the ``diag.checks`` package) run in diag's process, each in a
thread with the same time limit (left behind when it overruns).

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
import time
import traceback
import types
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable

from diag.checks.api import Check, Context, evidence_source, source_unmet
from diag.errors import DiagError
from diag.findings import Finding, Severity

if TYPE_CHECKING:
    from diag.plugin_worker import PluginWorker  # imported when a plugin runs, not with the registry

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
        setattr(func, "__diag_check__", Check(
            id=id, title=title, func=func, severity=severity, needs=list(needs), tags=list(tags),
            description=(description or (func.__doc__ or "")).strip(), docs=docs, takes_context=False,
            module=func.__module__,
        ))
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


def _remote_stub(*_a, **_k):
    raise RuntimeError("a plugin check runs in diag's plugin worker, not in diag's process")


def _remote_spec(d: dict, source: str) -> Check:
    """diag's description of a plugin check that lives in the worker."""
    def strs(v):
        return [str(x) for x in v] if isinstance(v, list) else []

    return Check(id=str(d.get("id")), title=str(d.get("title") or d.get("id")), func=_remote_stub,
                 severity=str(d.get("severity") or "warning"), needs=strs(d.get("needs")),
                 tags=strs(d.get("tags")), description=str(d.get("description") or ""),
                 docs=d.get("docs") if isinstance(d.get("docs"), str) else None, source=source,
                 takes_context=bool(d.get("takes_context")),
                 module=d.get("module") if isinstance(d.get("module"), str) else None,
                 sources=strs(d.get("sources")) or None,
                 replaces=d.get("replaces") if isinstance(d.get("replaces"), str) else None)


class _Plugins:
    """The worker that holds the plugins' code, shared by a registry and its selections."""

    def __init__(self, eps: list[tuple[str, str]], timeout: Callable[[], float | None]):
        from diag.plugin_worker import memory_limit_mib

        self.eps = eps                   # (key "name = value", dist) of every plugin entry point
        self.memory = memory_limit_mib()
        self.timeout = timeout
        self.worker: PluginWorker | None = None
        self.failed: set[str] = set()    # entry points left out of every (re)start: they broke a worker
        self.evidence_id: int | None = None
        self.starts = 0
        self.start_s = 0.0

    def start(self, on_loaded: Callable[[dict], None] | None = None,
              on_problem: Callable[[str, str], None] | None = None) -> bool:
        """A live worker with every plugin loaded (True), or False when none could be started."""
        from diag.plugin_worker import PluginWorker, WorkerDied, WorkerTimeout

        while True:
            if self.worker is not None and self.worker.alive:
                return True
            self.close()
            t0 = time.monotonic()
            try:
                self.worker = PluginWorker(self.memory).start()
            except (WorkerDied, WorkerTimeout) as e:
                return self._fail_all(e.why if isinstance(e, WorkerDied) else "the plugin worker did not start in time",
                                      on_problem)
            self.starts += 1
            self.evidence_id = None
            current = None
            try:
                self.worker.send({"op": "load", "skip": sorted(self.failed)})
                while True:
                    msg = self.worker.receive(self.timeout() if current else 60.0)
                    ev = msg.get("ev")
                    if ev == "loading":
                        current = msg.get("ep")
                    elif ev == "loaded":
                        current = None
                        if on_loaded is not None:
                            on_loaded(msg)
                    elif ev == "ready":
                        self.start_s += time.monotonic() - t0
                        return True
            except WorkerTimeout:
                why = (f"importing it took longer than {self.timeout():g} s" if current
                       else "the plugin worker stopped answering")
            except WorkerDied as e:
                why = f"importing it ended the plugin worker ({e.why.replace('the plugin', 'its')})" \
                    if current else e.why
            self.start_s += time.monotonic() - t0
            if current is None:
                return self._fail_all(why, on_problem)
            if on_problem is not None:
                on_problem(current, why)
            self.failed.add(current)
            self.close()       # and start again without it

    def _fail_all(self, why: str, on_problem) -> bool:
        """Every plugin not yet failed fails with ``why`` (the worker could not go on); False."""
        for key, _dist in self.eps:
            if key not in self.failed and on_problem is not None:
                on_problem(key, why)
            self.failed.add(key)
        self.close()
        return False

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None
        self.evidence_id = None

    def run(self, specs: list[Check], evidence, timeout: float | None) -> dict[tuple[str, str], list[Finding]]:
        """Every plugin check's findings, keyed by (id, source)."""
        from diag.plugin_worker import LOAD_EVIDENCE_TIMEOUT_S, MEMORY_ENV, WorkerDied, WorkerTimeout

        out: dict[tuple[str, str], list[Finding]] = {}
        text = None
        todo = list(specs)
        while todo:
            spec = todo[0]
            if not self.start():
                for s in todo:
                    out[(s.id, s.source)] = _crashed(s, "The check could not run: diag's plugin worker did "
                                                        "not start.")
                return out
            w = self.worker
            assert w is not None and w._dir is not None   # start() returned True: a live, started worker
            try:
                if self.evidence_id != id(evidence):
                    if text is None:
                        try:
                            text = evidence.to_json(indent=None)
                        except (TypeError, ValueError) as e:
                            for s in todo:
                                out[(s.id, s.source)] = _crashed(
                                    s, f"The check could not run: the evidence cannot be handed to the "
                                       f"plugin worker ({e}).")
                            return out
                    path = os.path.join(w._dir, "evidence.json")
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                    with os.fdopen(fd, "w", encoding="utf-8") as fh:
                        fh.write(text)
                    w.send({"op": "evidence", "path": path})
                    msg = w.receive(LOAD_EVIDENCE_TIMEOUT_S)
                    if msg.get("ev") != "ok":
                        why = str(msg.get("why") or "it could not read the evidence")
                        for s in todo:
                            out[(s.id, s.source)] = _crashed(s, f"The check could not run: diag's plugin "
                                                                f"worker could not read the evidence ({why}).")
                        return out
                    self.evidence_id = id(evidence)
            except (WorkerDied, WorkerTimeout) as e:
                why = e.why if isinstance(e, WorkerDied) else "it did not read the evidence in time"
                for s in todo:
                    out[(s.id, s.source)] = _crashed(s, f"The check could not run: diag's plugin worker "
                                                        f"failed ({why}).")
                self.close()
                return out
            try:
                w.send({"op": "run", "id": spec.id, "source": spec.source})
                msg = w.receive(timeout)
            except WorkerTimeout:
                out[(spec.id, spec.source)] = _crashed(
                    spec, f"The check did not finish within {timeout:g} s and was stopped (its worker "
                          f"process was killed; the limit is set with {TIMEOUT_ENV}).")
                self.close()
                todo.pop(0)
                continue
            except WorkerDied as e:
                out[(spec.id, spec.source)] = _crashed(
                    spec, f"The check ended diag's plugin worker: {e.why.replace('the plugin', 'its')}; "
                          "diag's own exit code and output are unaffected.")
                self.close()
                todo.pop(0)
                continue
            todo.pop(0)
            rows = msg.get("findings")
            output = msg.get("output") or ""
            if not isinstance(rows, list):
                out[(spec.id, spec.source)] = _crashed(spec, "The check was not found in diag's plugin worker.")
                continue
            found = []
            for row in rows:
                try:
                    f = Finding.from_dict(row)
                except Exception as e:
                    found = _crashed(spec, f"The check returned a finding diag cannot read ({type(e).__name__}).")
                    break
                if f.severity is Severity.CRASHED and f.message.startswith("The check raised MemoryError"):
                    f.message = (f"The check ran past its memory limit ({self.memory} MiB, set with "
                                 f"{MEMORY_ENV}).")
                found.append(f)
            if output.strip():
                for f in found:
                    if isinstance(f.evidence, dict):
                        f.evidence["plugin_output"] = output
            out[(spec.id, spec.source)] = found
        return out


class Registry:
    def __init__(self, specs: list[Check] | None = None):
        self.specs: list[Check] = list(specs or [])
        self.problems: list[LoadProblem] = []
        self.plugins: list[PluginEntry] = []     # third-party entry points (listed, maybe not loaded)
        self.timeout: float | None = None        # None: read DIAG_CHECK_TIMEOUT when running
        self._plugins: _Plugins | None = None    # the worker holding the plugins' code
        self._remote: set[int] = set()           # id() of the specs that live in the worker

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
        if load_plugins and plugin_eps:
            reg._load_plugins(plugin_eps, owner)
        reg.specs.sort(key=lambda s: s.id)
        return reg

    def _load_plugins(self, plugin_eps, owner: dict[str, str]) -> None:
        """Import the plugins in the worker; diag keeps a description of each check."""
        from diag.plugin_worker import memory_limit_mib

        memory_limit_mib()   # a bad DIAG_CHECK_MEMORY is a usage error before anything runs
        dists = {f"{ep.name} = {ep.value}": (getattr(getattr(ep, "dist", None), "name", None) or "?")
                 for ep in plugin_eps}
        self._plugins = _Plugins(sorted(dists.items()), self._timeout)
        done: set[str] = set()

        def loaded(msg: dict) -> None:
            key = str(msg.get("ep"))
            if key in done:
                return          # a restarted worker loads it again: described once
            done.add(key)
            where = f"{key} (from {dists.get(key, '?')})"
            if msg.get("error"):
                self.problems.append(LoadProblem(where, str(msg["error"])))
                return
            rows = [r for r in msg.get("specs") or [] if isinstance(r, dict) and isinstance(r.get("id"), str)]
            if not rows:
                self.problems.append(LoadProblem(where, "it declares no check (no function decorated with "
                                                        "diag.checks.api.check)"))
                return
            specs = [_remote_spec(r, str(msg.get("source"))) for r in rows]
            self._remote.update(id(s) for s in specs)
            self._add(specs, owner)

        def problem(key: str, why: str) -> None:
            if key in done:
                return
            done.add(key)
            self.problems.append(LoadProblem(f"{key} (from {dists.get(key, '?')})", why))

        self._plugins.start(loaded, problem)

    def close(self) -> None:
        """End the plugin worker (also done when diag exits)."""
        if self._plugins is not None:
            self._plugins.close()

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
        out._plugins = self._plugins
        out._remote = self._remote
        return out

    def is_plugin(self, spec: Check) -> bool:
        """True for a check whose code lives in the plugin worker."""
        return id(spec) in self._remote

    # ---- running --------------------------------------------------------------------------------
    def run(self, evidence) -> list[Finding]:
        timeout = self._timeout()
        findings: list[Finding] = []
        todo = [s for s in self.specs if not self.answered_by_another(s, evidence)]
        remote = [s for s in todo if self.is_plugin(s)]
        results = self._plugins.run(remote, evidence, timeout) if remote and self._plugins else {}
        for spec in todo:
            if self.is_plugin(spec):
                findings.extend(dedupe(results.get((spec.id, spec.source)) or []))
            else:
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
