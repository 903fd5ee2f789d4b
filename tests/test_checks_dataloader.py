"""checks/dataloader.py (dataloader.workers) on hand-built Evidence."""
from __future__ import annotations

import pytest

from check_support import ev_with, run_check, steps
from diag.evidence import DataLoaderInfo, RankEvidence
from diag.findings import Severity


@pytest.mark.parametrize("data_share,expected", [(0.02, Severity.PASS), (0.09, Severity.PASS),
                                                 (0.15, Severity.WARNING), (0.29, Severity.WARNING),
                                                 (0.31, Severity.ERROR), (0.8, Severity.ERROR)])
def test_dataloader_workers_thresholds(data_share, expected):
    r = RankEvidence(steps=steps(20, 0.02, 0.02 * data_share),
                     dataloaders=[DataLoaderInfo(id=1, num_workers=0, batches=20, batch_size=32)])
    out = run_check("dataloader.workers", ev_with(r))
    assert [f.severity for f in out] == [expected]
    assert out[0].evidence["data_share"] == pytest.approx(data_share, abs=1e-3)


def test_dataloader_workers_recommendation_scales_with_fetch_time():
    # 0 workers, 30 ms fetch per batch, 10 ms compute: needs ceil(1.5*30/10) = 5 workers
    r = RankEvidence(steps=steps(20, 0.04, 0.03), dataloaders=[DataLoaderInfo(id=1, batches=20)])
    f = run_check("dataloader.workers", ev_with(r, cpus=16))[0]
    assert f.evidence["recommended_workers"] == 5 and "num_workers=5" in f.fix
    f = run_check("dataloader.workers", ev_with(r, cpus=4))[0]
    assert f.evidence["recommended_workers"] == 3            # capped: CPUs minus one


def test_dataloader_workers_skipped_cases():
    assert run_check("dataloader.workers", ev_with(RankEvidence(steps=steps(5, 0.01, 0.0))))[0].severity \
        is Severity.SKIPPED
    assert run_check("dataloader.workers", ev_with(RankEvidence(dataloaders=[DataLoaderInfo()])))[0].severity \
        is Severity.SKIPPED
