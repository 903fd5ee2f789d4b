"""The performance checklist end to end: real tiny scripts in tests/scripts/ run under
`diag check --format json`; each planted script must trigger its checks and its clean twin must not.
Several plants share a script where they do not hide one another, to keep the runs few (about 3 s
each). The CUDA-only checks are covered by test_checks_perf_cuda.py on CUDA-shaped evidence."""
from __future__ import annotations

import pytest

from conftest import SCRIPTS, findings_by_id, run_diag

pytestmark = pytest.mark.slow

WARN_UP = ("warning", "error")


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    cache: dict[str, dict] = {}

    def get(name: str, *args: str) -> dict:
        key = name + " ".join(args)
        if key not in cache:
            cwd = tmp_path_factory.mktemp(name.replace(".py", ""))
            if name.startswith("demo"):
                cmd = ["demo", "--format", "json"] + (["--clean"] if name == "demo-clean" else []) + \
                      ["--", "--epochs", "1", "--items", "320"]
            else:
                cmd = ["check", "--script", str(SCRIPTS / name), "--format", "json", "--fail-on", "never", *args]
            r = run_diag(*cmd, cwd=cwd, timeout=180)
            assert r.code == 0, r.stderr[-3000:]
            cache[key] = r.json()
        return cache[key]

    return get


def sev_of(rep, cid) -> list[str]:
    return [f["severity"] for f in rep["findings"] if f["id"] == cid]


def one(rep, cid) -> dict:
    (f,) = findings_by_id(rep)[cid]
    return f


def test_handmade_planted(reports):
    rep = reports("perf_handmade_planted.py")
    f = one(rep, "dataloader.main-thread-data")
    assert f["severity"] in WARN_UP and f["evidence"]["dataloader"] is False
    assert f["evidence"]["pre_forward_s"] >= 0.015                   # the 20 ms "read" per batch
    assert f["location"]["file"].endswith("perf_handmade_planted.py")
    f = one(rep, "amp.fp16-without-scaler")
    assert f["severity"] == "warning" and f["evidence"]["scalers_created"] == 0
    f = one(rep, "debug.anomaly-detection")
    assert f["severity"] == "warning" and f["location"]["line"] == 33
    assert one(rep, "parallel.data-parallel")["severity"] == "info"   # no GPU: a pass-through wrapper
    f = one(rep, "optim.zero-grad")
    assert f["severity"] in ("info", "warning") and f["evidence"]["calls_set_to_none_false"] >= 10
    f = one(rep, "eval.no-grad")
    assert f["severity"] == "warning" and f["evidence"]["graph_bytes_per_forward"] == 64 * 64 * 4
    assert f["fix"].startswith("perf_handmade_planted.py:47: run `acc = (model(val).argmax(1) == 0)")
    f = one(rep, "compile.unused")
    # issue 33: silent (pass) when the break-even is beyond the run's own length, which ended by itself
    assert f["severity"] == "info" or (f["severity"] == "pass" and
                                       f["evidence"]["break_even_steps"] > f["evidence"]["run_steps"]), f
    for cid in ("amp.unused", "matmul.tf32", "tensor-cores.alignment", "sync.host-device", "cudnn.benchmark",
                "dataloader.pin-memory", "optim.foreach-fused"):
        f = one(rep, cid)
        assert f["severity"] == "skipped" and "cpu" in f["message"], (cid, f["message"])


def test_handmade_clean(reports):
    rep = reports("perf_handmade_clean.py")
    for cid in ("dataloader.main-thread-data", "amp.fp16-without-scaler", "debug.anomaly-detection",
                "parallel.data-parallel", "optim.zero-grad", "eval.no-grad", "compile.unused"):
        assert sev_of(rep, cid) == ["pass"], (cid, findings_by_id(rep)[cid])
    assert one(rep, "amp.fp16-without-scaler")["evidence"]["scale_calls"] == 14


def test_workers_planted(reports):
    rep = reports("perf_workers_planted.py")
    f = one(rep, "dataloader.persistent-workers")
    assert f["severity"] in WARN_UP and f["evidence"]["epochs"] == 3
    assert f["evidence"]["respawn_cost_per_epoch_s"] >= 0.05               # the 60 ms worker_init_fn
    f = findings_by_id(rep)["debug.anomaly-detection"]
    assert [x["title"] for x in f] == ["Profiler on during training"] and f[0]["severity"] == "warning"
    assert f[0]["location"]["file"].endswith("perf_workers_planted.py")
    f = one(rep, "optim.zero-grad")
    assert f["severity"] in ("info", "warning") and f["evidence"]["module_zero_grad_calls"] == 18


def test_workers_clean(reports):
    rep = reports("perf_workers_clean.py")
    for cid in ("dataloader.persistent-workers", "debug.anomaly-detection", "optim.zero-grad"):
        assert sev_of(rep, cid) == ["pass"], (cid, findings_by_id(rep)[cid])


def test_ddp_planted(reports):
    rep = reports("perf_ddp_planted.py")
    f = one(rep, "ddp.find-unused-parameters")
    assert f["severity"] == "warning" and f["evidence"]["unused_params"] == 0
    f = one(rep, "ddp.no-sync-accumulation")
    assert f["severity"] in ("info", "warning")          # one rank: info unless the wait is >= 2%
    assert f["evidence"]["backwards_per_step"] == 4 and f["evidence"]["avoidable_allreduces_per_step"] == 3


def test_ddp_clean(reports):
    rep = reports("perf_ddp_clean.py")
    assert sev_of(rep, "ddp.find-unused-parameters") == ["pass"]
    f = one(rep, "ddp.no-sync-accumulation")
    assert f["severity"] == "pass" and f["evidence"]["no_sync_forwards_per_step"] == 3


def test_demo_shows_four_different_findings_and_clean_twin_is_clean(reports):
    rep = reports("demo")
    # a data wait on a contended host is an info that says workers will not help (issue 33): found all the same
    found = {f["id"] for f in rep["findings"] if f["severity"] in WARN_UP or
             (f["id"] == "dataloader.workers" and ((f.get("evidence") or {}).get("host") or {}).get("contended"))}
    assert {"dataloader.workers", "eval.no-grad", "debug.anomaly-detection", "amp.fp16-without-scaler"} <= found
    assert sev_of(rep, "optim.zero-grad")[0] in ("info", "warning")
    rep = reports("demo-clean")
    # probe.overhead judges diag, not the script: the probe's share of the clean twin's ~10 ms step
    # depends on the machine's load (5.8% measured on the loaded 2-core VM); it must still be judged
    assert sev_of(rep, "probe.overhead")[0] in ("pass", "info", "warning")
    bad = [(f["id"], f["message"]) for f in rep["findings"]
           if f["severity"] in WARN_UP + ("crashed",) and f["id"] != "probe.overhead"]
    assert bad == []
