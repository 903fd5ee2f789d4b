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
    (skipped,) = run_check("run.no-steps", ev)           # the failure is the reason: run.failed says it
    assert skipped.severity is Severity.SKIPPED and "run.failed" in skipped.message
    f = run_check("run.failed", ev)[0]
    assert f.severity is Severity.ERROR and "KeyError" in f.message and f.location.file == "t.py"
    assert f.message.endswith("'x'.")


def test_run_failed_message_ends_with_one_full_stop():
    ev = ev_with(RankEvidence())
    ev.run.status = "failed"
    ev.primary.exceptions.append(ExceptionInfo(
        type="UnpicklingError", message="Weights only load failed. This file can still be loaded. \n(1) more",
        step=0, location={"file": "t.py", "line": 1}))
    (f,) = run_check("run.failed", ev)
    assert f.message.endswith("This file can still be loaded.") and ". ." not in f.message
