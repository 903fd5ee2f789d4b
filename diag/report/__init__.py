"""Reports: console text (rich), JSON, SARIF, JUnit, HTML. None of them imports textual or torch."""
from __future__ import annotations

from typing import Any

FORMATS = ("text", "json", "sarif", "junit", "html")


def fmt_value(v: Any) -> str:
    """A finding's evidence value, compactly (shared by the console report and the TUI)."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e6):
            return f"{v:.3g}"
        return f"{v:.4g}"
    if isinstance(v, int) and abs(v) >= 10000:
        return f"{v:,}"
    if isinstance(v, (list, tuple)):
        inner = ", ".join(fmt_value(x) for x in v[:8])
        return f"[{inner}{', …' if len(v) > 8 else ''}]"
    if isinstance(v, dict):
        inner = ", ".join(f"{k}={fmt_value(x)}" for k, x in list(v.items())[:6])
        return "{" + inner + (", …" if len(v) > 6 else "") + "}"
    return str(v)


def render(fmt: str, evidence, findings, exit_code: int, **kw) -> str:
    if fmt == "json":
        from diag.report.json import render_json

        return render_json(evidence, findings, exit_code)
    if fmt == "sarif":
        from diag.report.sarif import render_sarif

        return render_sarif(evidence, findings, kw.get("source_root"))
    if fmt == "junit":
        from diag.report.junit import render_junit

        return render_junit(evidence, findings, **kw)
    if fmt == "html":
        from diag.report.html import render_html

        return render_html(evidence, findings, exit_code, kw.get("comparison"))
    raise ValueError(fmt)
