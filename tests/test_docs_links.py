"""The README and docs/ link only to files and headings that exist (a moved section keeps its links)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def anchors(md: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out, block = set(), False
    for line in md.read_text().splitlines():
        if line.startswith("```"):
            block = not block
        if block or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def links(md: Path):
    block = False
    for n, line in enumerate(md.read_text().splitlines(), 1):
        if line.startswith("```"):
            block = not block
        if not block:
            for m in LINK.finditer(line):
                yield n, m.group(1)


@pytest.mark.parametrize("md", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_and_anchors_resolve(md):
    bad = []
    for n, target in links(md):
        if re.match(r"^[a-z]+:", target):
            continue                                  # https:, mailto: (not fetched: the suite is offline)
        path, _, anchor = target.partition("#")
        dest = (md.parent / path).resolve() if path else md
        if not dest.exists():
            bad.append(f"{md.name}:{n}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{md.name}:{n}: {target} (no such heading)")
    assert not bad, "\n".join(bad)
