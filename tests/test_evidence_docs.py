"""docs/evidence.md is generated from the Evidence dataclasses (diag/evidence/*.py): it must match
them, so that the schema's documentation cannot drift. Regenerate it with

    .venv/bin/python -m diag.evidence.docs > docs/evidence.md
"""
from __future__ import annotations

import ast
import dataclasses

from conftest import REPO
from diag.evidence import Evidence, Section
from diag.evidence.docs import SECTIONS, render

REGENERATE = ".venv/bin/python -m diag.evidence.docs > docs/evidence.md"


def test_docs_evidence_md_is_generated_from_the_dataclasses():
    path = REPO / "docs" / "evidence.md"
    assert path.is_file(), f"docs/evidence.md is missing; generate it: {REGENERATE}"
    assert path.read_text(encoding="utf-8") == render(), f"docs/evidence.md is out of date: {REGENERATE}"


def test_every_class_reachable_from_evidence_is_documented():
    documented = {cls for cls, _, _ in SECTIONS}
    seen, todo = set(), [Evidence]
    from diag.evidence._schema import resolve_hints
    import typing

    def classes(tp):
        for a in typing.get_args(tp) or ():
            yield from classes(a)
        if isinstance(tp, type) and (dataclasses.is_dataclass(tp) or issubclass(tp, Section)):
            yield tp

    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        for tp in resolve_hints(cls).values():
            todo.extend(classes(tp))
    assert seen <= documented, f"not documented in docs/evidence.md: {sorted(c.__name__ for c in seen - documented)}"


def test_checks_import_only_the_public_api_and_evidence():
    allowed = ("diag.checks.api", "diag.evidence", "__future__")
    for f in sorted((REPO / "checks").glob("*.py")):
        if f.name == "api.py":
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                mod = node.module or ""
                assert mod.startswith(allowed), f"checks/{f.name} imports {mod}: checks may import only {allowed[:2]}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    assert a.name.split(".")[0] in ("math", "re", "statistics", "itertools", "collections", "dataclasses",
                                                     "typing"), f"checks/{f.name} imports {a.name}"


def test_builtin_checks_do_not_restate_their_id_or_title():
    """The registry fills id and title in: a check's body names neither (checks/*.py)."""
    from diag.registry import Registry

    specs = Registry.discover(load_plugins=False).specs
    texts = {f.stem: f.read_text() for f in (REPO / "checks").glob("*.py") if not f.name.startswith("_")}
    for spec in specs:
        if spec.source != "builtin":
            continue
        text = texts[spec.module.rsplit(".", 1)[-1]]
        # once: in the decorator
        assert text.count(f'"{spec.id}"') == 1, f"{spec.id} is restated in {spec.module}"
        assert spec.takes_context, f"{spec.id} is not written against diag.checks.api"
