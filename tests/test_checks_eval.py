"""checks/eval.py (eval.no-grad) on hand-built Evidence."""
from __future__ import annotations

import pytest

from check_support import ev_with, run_check
from diag.evidence import ForwardSite, ModelInfo, RankEvidence
from diag.findings import Severity


def _eval_rank(grad=True, inference=False, out_rg=True, training=False):
    return RankEvidence(
        models=[ModelInfo(id=1, cls="Net", params_total=100, params_trainable=80)],
        forwards=[ForwardSite(key="s1", model=1, module="Net", count=4, training=True, grad_enabled=True,
                              output_requires_grad=True, in_step=True),
                  ForwardSite(key="s2", model=1, module="Net", count=7, training=training,
                              grad_enabled=grad, inference_mode=inference, output_requires_grad=out_rg,
                              location={"file": "train.py", "line": 42, "function": "validate"})])


def test_eval_no_grad_triggers():
    out = run_check("eval.no-grad", ev_with(_eval_rank()))
    assert [f.severity for f in out] == [Severity.WARNING]
    assert out[0].evidence["forwards"] == 7 and out[0].evidence["trainable_params"] == 80
    assert out[0].location.line == 42 and "train.py:42" in out[0].message


@pytest.mark.parametrize("kw", [dict(grad=False), dict(inference=True, grad=False), dict(out_rg=False),
                                dict(training=True)])
def test_eval_no_grad_clean_cases(kw):
    out = run_check("eval.no-grad", ev_with(_eval_rank(**kw)))
    assert [f.severity for f in out] == [Severity.PASS]


def test_eval_no_grad_skipped_without_forwards():
    assert [f.severity for f in run_check("eval.no-grad", ev_with(RankEvidence()))] == [Severity.SKIPPED]
