"""docs/checks.md is the catalogue `diag checks --format markdown` prints: it must match the registry,
so that it cannot drift from the checks. Regenerate it with

    .venv/bin/python -m diag checks --format markdown > docs/checks.md
"""
from __future__ import annotations

from conftest import REPO

from diag.commands.checks import markdown
from diag.registry import Registry

REGENERATE = ".venv/bin/python -m diag checks --format markdown > docs/checks.md"


def test_docs_checks_md_matches_the_registry():
    specs = [s for s in Registry.discover().specs if s.source == "builtin"]
    expected = markdown(specs)
    path = REPO / "docs" / "checks.md"
    assert path.is_file(), f"docs/checks.md is missing; generate it: {REGENERATE}"
    actual = path.read_text(encoding="utf-8")
    if actual != expected:
        have = {line.split("`")[1] for line in actual.splitlines() if line.startswith("| `")}
        want = {s.id for s in specs}
        raise AssertionError(
            f"docs/checks.md is out of date with the registry (missing: {sorted(want - have)}, "
            f"stale: {sorted(have - want)}, or descriptions changed); regenerate it: {REGENERATE}")


def test_catalogue_rows_have_a_docs_link_for_the_performance_checklist():
    text = (REPO / "docs" / "checks.md").read_text(encoding="utf-8")
    rows = {line.split("`")[1]: line for line in text.splitlines() if line.startswith("| `")}
    for cid in ("amp.unused", "dataloader.pin-memory", "sync.host-device", "ddp.no-sync-accumulation",
                "optim.zero-grad", "compile.unused"):
        assert "[docs](https://" in rows[cid], cid
