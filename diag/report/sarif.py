"""SARIF 2.1.0 output, for code-scanning UIs: one result per finding at warning or above."""
from __future__ import annotations

import json

from diag import __version__
from diag.findings import Severity

_LEVEL = {Severity.ERROR: "error", Severity.CRASHED: "error", Severity.WARNING: "warning",
          Severity.INFO: "note"}


def render_sarif(evidence, findings) -> str:
    rules = {}
    results = []
    for f in findings:
        if f.severity not in _LEVEL:
            continue
        rules.setdefault(f.id, {"id": f.id, "shortDescription": {"text": f.title},
                                **({"helpUri": f.docs} if f.docs else {})})
        res = {"ruleId": f.id, "level": _LEVEL[f.severity],
               "message": {"text": f.message + (f" Fix: {f.fix}" if f.fix else "")},
               "properties": {"evidence": f.evidence}}
        if f.location:
            region = {"startLine": f.location.line} if f.location.line else {}
            res["locations"] = [{"physicalLocation": {"artifactLocation": {"uri": f.location.file},
                                                      **({"region": region} if region else {})}}]
        results.append(res)
    doc = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{"tool": {"driver": {"name": "diag", "version": __version__,
                                      "rules": list(rules.values())}},
                  "results": results}],
    }
    return json.dumps(doc, indent=2, default=str)
