"""``diag checks``: the catalogue."""
from __future__ import annotations

import json
import sys

DESCRIPTION = "List every check diag knows (built-in and plugins): id, default severity, what it looks for."
EPILOG = """\
examples:
  diag checks                        a table
  diag checks --format markdown      the catalogue as Markdown (the README's is generated this way)
  diag checks --format json
"""


def add_arguments(p) -> None:
    p.add_argument("--format", choices=("text", "markdown", "json"), default="text")


def judges(spec) -> str:
    """The evidence a check judges: "probe", "probe, attach", or "attach, as `dataloader.workers`"."""
    text = ", ".join(spec.judges)
    return text + (f", as `{spec.replaces}`" if spec.replaces else "")


def markdown(specs, plugins=()) -> str:
    lines = ["| id | default severity | judges | what it looks for | source |", "|---|---|---|---|---|"]
    for s in specs:
        desc = " ".join(s.description.split()).replace("|", "\\|")
        # the table is docs/checks.md: a repository path "docs/x.md" is "x.md" from there
        link = s.docs.removeprefix("docs/") if s.docs and "://" not in s.docs else s.docs
        src = f"[docs]({link})" if s.docs else ""
        if s.source != "builtin":
            src = (src + " " if src else "") + f"plugin: {s.source}"
        lines.append(f"| `{s.id}` | {s.severity} | {judges(s)} | {desc} | {src} |")
    for p in plugins:
        lines.append(f"| `{p.name}` | | | plugin entry point `{p.value}` (not imported) | plugin: {p.dist} {p.version} |")
    from diag.knobs import markdown as knobs_markdown

    return "\n".join(lines) + "\n\n" + knobs_markdown()


def run(args) -> int:
    from diag.registry import Registry

    # Plugins are listed from their entry-point metadata: none is imported to list it.
    reg = Registry.discover(load_plugins=False)
    if args.format == "json":
        print(json.dumps([s.to_dict() for s in reg.specs] + [p.to_dict() for p in reg.plugins], indent=2))
    elif args.format == "markdown":
        sys.stdout.write(markdown(reg.specs, reg.plugins))
    else:
        from rich.table import Table

        from diag.commands._common import stdout_console

        title = f"{len(reg.specs)} checks" + (f" and {len(reg.plugins)} plugin entry point(s)" if reg.plugins else "")
        t = Table(title=title, show_lines=False)
        t.add_column("id", style="bold", no_wrap=True)
        t.add_column("severity")
        t.add_column("what it looks for")
        for s in reg.specs:
            t.add_row(s.id, s.severity, " ".join(s.description.split()))
        for p in reg.plugins:
            t.add_row(p.name, "", f"plugin {p.dist} {p.version}: entry point {p.value} (imported when checks run)")
        stdout_console().print(t)
    for p in reg.problems:
        print(f"diag: warning: plugin {p.entry_point} failed to load: {p.error}", file=sys.stderr)
    return 0
