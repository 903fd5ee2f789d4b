"""Reports: console text (rich), JSON, SARIF, JUnit. None of them imports textual or torch."""
from __future__ import annotations

FORMATS = ("text", "json", "sarif", "junit")


def render(fmt: str, evidence, findings, exit_code: int, **kw) -> str:
    if fmt == "json":
        from diag.report.json import render_json

        return render_json(evidence, findings, exit_code)
    if fmt == "sarif":
        from diag.report.sarif import render_sarif

        return render_sarif(evidence, findings)
    if fmt == "junit":
        from diag.report.junit import render_junit

        return render_junit(evidence, findings, **kw)
    raise ValueError(fmt)
