"""Saving what the TUI shows: evidence.json, report.json and report.txt (no textual here)."""
from __future__ import annotations

import io
from pathlib import Path


def save_report(evidence, findings, run=None, save_dir: str | None = None, replay: bool = False) -> list[Path]:
    """Write the evidence and the reports.

    A live run writes into its run directory (evidence.json through the runner, so the file stays
    consistent with what it keeps writing). A replay never touches the file it was given: it writes
    ``diag-<id>-report.json`` / ``.txt`` into ``save_dir`` (default: the current directory).
    """
    from rich.console import Console

    from diag.errors import exit_code_for
    from diag.report.console import render_console
    from diag.report.json import render_json

    code = int(exit_code_for(evidence, findings, "error"))
    written: list[Path] = []
    if run is not None and not replay:
        d = Path(save_dir) if save_dir else Path(run.run_dir)
        d.mkdir(parents=True, exist_ok=True)
        if save_dir:
            evidence.save(d / "evidence.json")
        else:
            run.save()
        written.append(d / "evidence.json")
        json_path, txt_path = d / "report.json", d / "report.txt"
    else:
        d = Path(save_dir or ".")
        d.mkdir(parents=True, exist_ok=True)
        stem = f"diag-{evidence.run.id or 'run'}"
        json_path, txt_path = d / f"{stem}-report.json", d / f"{stem}-report.txt"
    json_path.write_text(render_json(evidence, findings, code) + "\n", encoding="utf-8")
    written.append(json_path)
    buf = io.StringIO()
    console = Console(file=buf, width=100, color_system=None, force_terminal=False)
    render_console(evidence, findings, console, verbose=True)
    txt_path.write_text(buf.getvalue(), encoding="utf-8")
    written.append(txt_path)
    return [p.resolve() for p in written]
