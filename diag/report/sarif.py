"""SARIF 2.1.0 output, for code-scanning UIs: one result per finding at info or above.

What code-scanning services need to accept and track the results:

* paths relative to the checkout (``artifactLocation.uri`` + ``uriBaseId: "SRCROOT"``), with
  ``run.originalUriBaseIds.SRCROOT`` the absolute root (``file:///…/``); the root is ``--source-root``
  when given, else the git checkout that holds the script, else the script's directory;
* a location on every result (the script itself when a finding has no line of its own);
* rules with ``shortDescription`` (the title), ``fullDescription``, ``help`` and ``helpUri`` (the
  rule's source, e.g. the PyTorch tuning guide's section; left out for the few rules without one);
* ``partialFingerprints`` (rule id + file + function, not the line) so an alert stays the same alert
  when lines move.

Validated against the SARIF 2.1.0 schema in tests/test_report_ci_formats.py.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

from diag import __version__
from diag.findings import Severity

_LEVEL = {Severity.ERROR: "error", Severity.CRASHED: "error", Severity.WARNING: "warning",
          Severity.INFO: "note"}
BASE_ID = "SRCROOT"


def source_root(evidence, given: str | None = None) -> Path | None:
    """The checkout root: ``given``, else git's top level around the script (or the run's cwd)."""
    if given:
        return Path(given).resolve()
    start = evidence.run.script or evidence.run.cwd or None
    if not start:
        return None
    try:   # a crafted evidence file's path may hold a NUL byte or a lone surrogate
        d = Path(start).resolve()
        d = d if d.is_dir() else d.parent
        if not d.is_dir():
            return None
    except (OSError, ValueError):
        return None
    try:
        out = subprocess.run(["git", "-C", str(d), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=10, check=False)
        if out.returncode == 0 and out.stdout.strip():
            return Path(out.stdout.strip()).resolve()
    except (OSError, subprocess.SubprocessError):
        pass
    return d


def _artifact(file: str, root: Path | None, cwd: str | None) -> dict:
    p = Path(file)
    if not p.is_absolute() and cwd:
        p = Path(cwd) / p
    try:
        p = p.resolve()
    except (OSError, ValueError):
        pass
    if root is not None:
        try:
            rel = p.relative_to(root)
            return {"uri": rel.as_posix(), "uriBaseId": BASE_ID}
        except ValueError:
            pass
    return {"uri": p.as_uri() if p.is_absolute() else p.as_posix()}


def _fingerprint(rule: str, artifact: dict, function: str | None) -> str:
    key = "\x1f".join([rule, artifact.get("uri", ""), function or ""])
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]


def render_sarif(evidence, findings, source_root_dir: str | None = None) -> str:
    root = source_root(evidence, source_root_dir)
    cwd = evidence.run.cwd or None
    rules: dict[str, dict] = {}
    results = []
    script = evidence.run.script
    for f in findings:
        if f.severity not in _LEVEL:
            continue
        if f.id not in rules:
            rule = {"id": f.id, "name": "".join(w.capitalize() for w in f.id.replace("-", ".").split(".")),
                    "shortDescription": {"text": f.title},
                    "fullDescription": {"text": f.why or f.title},
                    **({"helpUri": f.docs} if f.docs and "://" in f.docs else {}),
                    "help": {"text": (f.fix or f.title) + (f"\n\n{f.snippet}" if f.snippet else "")},
                    "defaultConfiguration": {"level": _LEVEL[f.severity]},
                    "properties": {"tags": list(f.tags)}}
            rules[f.id] = rule
        loc_file = f.location.file if f.location and f.location.file and f.location.file != "?" else script
        res = {"ruleId": f.id, "ruleIndex": list(rules).index(f.id), "level": _LEVEL[f.severity],
               "message": {"text": f.message + (f" Fix: {f.fix}" if f.fix else "")},
               "properties": {"evidence": f.evidence, "severity": f.severity.value}}
        if loc_file:
            art = _artifact(loc_file, root, cwd)
            phys: dict = {"artifactLocation": art}
            if f.location and f.location.file == loc_file and f.location.line:
                phys["region"] = {"startLine": int(f.location.line)}
            else:
                phys["region"] = {"startLine": 1}
                res["properties"]["location_note"] = "no line of its own: reported at the script"
            loc: dict = {"physicalLocation": phys}
            if f.location and f.location.function:
                loc["logicalLocations"] = [{"name": f.location.function, "kind": "function"}]
            res["locations"] = [loc]
            res["partialFingerprints"] = {
                "diagFinding/v1": _fingerprint(f.id, art, f.location.function if f.location else None)}
        else:
            # no script at all (in-process run with no location): a fingerprint on the rule alone
            res["locations"] = [{"message": {"text": "the run as a whole"}}]
            res["partialFingerprints"] = {"diagFinding/v1": _fingerprint(f.id, {}, None)}
        results.append(res)
    run: dict = {"tool": {"driver": {"name": "diag", "version": __version__, "semanticVersion": __version__,
                                     "rules": list(rules.values())}},
                 "results": results,
                 "columnKind": "unicodeCodePoints"}
    if root is not None:
        run["originalUriBaseIds"] = {BASE_ID: {"uri": root.as_uri().rstrip("/") + "/"}}
    if evidence.run.simulated_gpus:
        run["properties"] = {"simulated_gpus": evidence.run.simulated_gpus}
    doc = {"$schema": "https://json.schemastore.org/sarif-2.1.0.json", "version": "2.1.0", "runs": [run]}
    return json.dumps(doc, indent=2, default=str)


__all__ = ["render_sarif", "source_root", "BASE_ID"]
