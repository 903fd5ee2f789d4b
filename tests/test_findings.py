"""diag.findings: Finding to and from JSON."""
from __future__ import annotations

from diag.findings import Finding


def test_finding_round_trip():
    f = Finding(id="a.b", severity="warning", title="t", message="m", location={"file": "x.py", "line": 2})
    d = f.to_dict()
    assert d["severity"] == "warning" and d["location"] == {"file": "x.py", "line": 2, "function": None}
    assert Finding.from_dict(d) == f
