"""checks/run.py (run.no-steps, run.failed) on hand-built Evidence."""
from __future__ import annotations

from check_support import ev_with, run_check
from diag.evidence import ExceptionInfo, RankEvidence
from diag.findings import Severity


def test_run_no_steps_and_failed():
    ev = ev_with(RankEvidence())
    assert run_check("run.no-steps", ev)[0].severity is Severity.ERROR
    ev.run.status = "failed"
    ev.primary.exceptions.append(ExceptionInfo(type="KeyError", message="'x'", step=0,
                                               location={"file": "t.py", "line": 1}))
    assert run_check("run.no-steps", ev)[0].severity is Severity.WARNING
    f = run_check("run.failed", ev)[0]
    assert f.severity is Severity.ERROR and "KeyError" in f.message and f.location.file == "t.py"
