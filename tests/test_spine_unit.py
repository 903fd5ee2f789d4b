"""Unit tests of the spine: evidence round-trip, fold, registry, checks on hand-built Evidence."""
from __future__ import annotations

import json

import pytest

from diag.errors import DiagError
from diag.evidence import (SCHEMA_VERSION, DataLoaderInfo, Evidence, ExceptionInfo, ForwardSite,
                           ModelInfo, RankEvidence, StepRecord, load_evidence)
from diag.findings import Finding, Severity
from diag.fold import fold
from diag.memory.oom import parse_oom
from diag.registry import CheckSpec, Registry, check, run_one


def by_id(findings, cid):
    return [f for f in findings if f.id == cid]


def run_check(cid, ev):
    reg = Registry.discover().select([cid])
    return [f for f in reg.run(ev) if f.id == cid]


def steps(n, total, data, fwd=0.0):
    return [StepRecord(index=i + 1, total_s=total, data_s=data, forward_s=fwd or (total - data) / 2,
                       backward_s=(total - data) / 2 if not fwd else 0.0) for i in range(n)]


def ev_with(rank: RankEvidence, cpus=8) -> Evidence:
    ev = Evidence()
    ev.ranks.append(rank)
    ev.environment.cpu_count = cpus
    ev.run.status = "completed"
    return ev


# ---- evidence ------------------------------------------------------------------------------------

def test_evidence_json_round_trip(tmp_path):
    r = RankEvidence(steps=steps(3, 0.02, 0.005), dataloaders=[DataLoaderInfo(id=1, num_workers=2)],
                     forwards=[ForwardSite(key="s1", model=1, module="Net", location={"file": "t.py", "line": 3})],
                     models=[ModelInfo(id=1, cls="Net", params_total=10)],
                     exceptions=[ExceptionInfo(type="ValueError", message="x")],
                     memory={"samples": [{"allocated": 1}]})
    ev = ev_with(r)
    ev.gpu = {"provider": "none"}
    p = tmp_path / "evidence.json"
    ev.save(p)
    back = load_evidence(p)
    assert back.to_dict() == ev.to_dict()
    assert isinstance(back.primary.steps[0], StepRecord)
    assert back.primary.forwards[0].location["line"] == 3
    assert back.schema_version == SCHEMA_VERSION
    assert load_evidence(tmp_path).to_dict() == ev.to_dict()    # a run directory works too


@pytest.mark.parametrize("content,needle", [
    ("", "is empty"),
    ('{"schema_version": 1, "run": {', "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"run": {}}', "no schema_version"),
    (json.dumps({"schema_version": SCHEMA_VERSION + 1}), "newer than this diag"),
    (json.dumps({"schema_version": 1, "ranks": [{"steps": 5}]}), "malformed"),
])
def test_bad_evidence_files_are_one_sentence(tmp_path, content, needle):
    p = tmp_path / "e.json"
    p.write_text(content)
    with pytest.raises(DiagError) as e:
        load_evidence(p)
    assert needle in e.value.message
    assert "\n" not in e.value.message


def test_missing_evidence_file(tmp_path):
    with pytest.raises(DiagError, match="does not exist"):
        load_evidence(tmp_path / "nope.json")


def test_fold_builds_rank_evidence_and_bounds_lists():
    ev = Evidence()
    fold(ev, {"kind": "start", "rank": 1, "t": 0, "pid": 7, "host": "h", "world_size": 2})
    for i in range(3):
        fold(ev, {"kind": "step", "rank": 1, "t": i, "index": i + 1, "total_s": 0.01, "data_s": 0.002,
                  "n_backward": 1, "samples": 8})
    fold(ev, {"kind": "forward_site", "rank": 1, "t": 0, "key": "s1", "module": "M", "training": False})
    fold(ev, {"kind": "forward_counts", "rank": 1, "t": 0, "counts": {"s1": 5}})
    for i in range(5):
        fold(ev, {"kind": "append", "rank": 1, "t": 0, "path": "memory.samples", "value": i, "limit": 3})
    fold(ev, {"kind": "set", "rank": 1, "t": 0, "path": "flops.measured", "value": {"flops": 10}})
    fold(ev, {"kind": "set", "rank": 1, "t": 0, "path": "nonsense.x", "value": 1})   # ignored
    fold(ev, {"kind": "end", "rank": 1, "t": 9, "status": "completed", "exit_code": 0})
    r = ev.rank(1)
    assert r.pid == 7 and r.world_size == 2 and r.status == "completed"
    assert r.step_stats.count == 3 and r.step_stats.samples == 24 and r.backward_calls == 3
    assert r.forwards[0].count == 5
    assert r.memory["samples"] == [2, 3, 4]
    assert r.flops["measured"]["flops"] == 10
    assert ev.primary is r          # no rank 0: the first rank stands in


def test_median_step_skips_warmup_and_instrumented():
    r = RankEvidence(steps=steps(6, 0.01, 0.0))
    r.steps[0].total_s = 5.0                # warm-up
    r.steps[3].total_s = 9.0
    r.steps[3].instrumented = True          # FLOP counting: not timing
    med = r.median_step()
    assert med["total_s"] == pytest.approx(0.01) and med["n"] == 4


# ---- registry ------------------------------------------------------------------------------------

def test_registry_discovers_builtins_through_entry_points():
    reg = Registry.discover()
    ids = {s.id for s in reg.specs}
    assert {"eval.no-grad", "dataloader.workers", "memory.oom", "run.failed", "run.no-steps"} <= ids
    assert all(s.source == "builtin" for s in reg.specs if s.id.startswith(("eval.", "run.")))
    assert reg.problems == []


def test_select_and_ignore_by_prefix():
    reg = Registry.discover()
    assert {s.id for s in reg.select(["run"]).specs} == {"run.failed", "run.hung", "run.no-steps"}
    assert "run.failed" not in {s.id for s in reg.select(ignore=["run.failed"]).specs}
    with pytest.raises(DiagError, match="no check matches 'nosuch'"):
        reg.select(["nosuch"])


def test_a_check_that_raises_is_crashed_not_fatal():
    @check(id="t.boom", title="boom")
    def boom(ev):
        raise ZeroDivisionError("oops")
        yield

    out = run_one(boom.__diag_check__, Evidence())
    assert len(out) == 1 and out[0].severity is Severity.CRASHED
    assert "ZeroDivisionError: oops" in out[0].message
    assert Severity.CRASHED.rank > Severity.ERROR.rank


def test_a_check_returning_garbage_is_crashed():
    spec = CheckSpec(id="t.bad", title="bad", func=lambda ev: ["not a finding"])
    out = run_one(spec, Evidence())
    assert out[0].severity is Severity.CRASHED and "not Finding" in out[0].message


def test_finding_round_trip():
    f = Finding(id="a.b", severity="warning", title="t", message="m", location={"file": "x.py", "line": 2})
    d = f.to_dict()
    assert d["severity"] == "warning" and d["location"] == {"file": "x.py", "line": 2, "function": None}
    assert Finding.from_dict(d) == f


# ---- checks on hand-built evidence -----------------------------------------------------------------

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


def test_run_no_steps_and_failed():
    ev = ev_with(RankEvidence())
    assert run_check("run.no-steps", ev)[0].severity is Severity.ERROR
    ev.run.status = "failed"
    ev.primary.exceptions.append(ExceptionInfo(type="KeyError", message="'x'", step=0,
                                               location={"file": "t.py", "line": 1}))
    assert run_check("run.no-steps", ev)[0].severity is Severity.WARNING
    f = run_check("run.failed", ev)[0]
    assert f.severity is Severity.ERROR and "KeyError" in f.message and f.location.file == "t.py"


def test_parse_oom_messages():
    msg = ("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 3 has a total capacity of 15.77 GiB of which "
           "4.12 MiB is free. Of the allocated memory 14.9 GiB is allocated by PyTorch, and 310.5 MiB is "
           "reserved by PyTorch but unallocated.")
    d = parse_oom(msg)
    assert d["requested"] == 20 << 20 and d["device"] == "cuda:3"
    assert d["capacity"] == int(15.77 * (1 << 30)) and d["reserved_unallocated"] == int(310.5 * (1 << 20))
    assert d["reserved"] == d["allocated"] + d["reserved_unallocated"]
    old = ("CUDA out of memory. Tried to allocate 1.50 GiB (GPU 0; 11.17 GiB total capacity; 9.80 GiB already "
           "allocated; 512.00 MiB free; 10.20 GiB reserved in total by PyTorch)")
    d = parse_oom(old)
    assert d["allocated"] == int(9.8 * (1 << 30)) and d["reserved"] == int(10.2 * (1 << 30))
    cpu = "[enforce fail at alloc_cpu.cpp:114] DefaultCPUAllocator: not enough memory: you tried to allocate 123 bytes."
    assert parse_oom(cpu) == {"requested": 123, "device": "cpu"}
    assert parse_oom("something else") == {}


def test_console_report_keeps_passed_and_skipped_to_a_line_each():
    """Problems in full; each passed or skipped check on one line cut to the terminal; -v in full."""
    import io
    import sys
    from pathlib import Path

    from rich.console import Console

    from diag.findings import count_phrase
    from diag.report.console import render_console

    sys.path.insert(0, str(Path(__file__).parent))
    from tui_support import demo_evidence, demo_findings

    ev, findings = demo_evidence(), demo_findings()
    rest = [f for f in findings if f.severity in (Severity.PASS, Severity.SKIPPED)]
    long = max(rest, key=lambda f: len(f.message))
    assert len(long.message) > 80

    def text(verbose: bool) -> str:
        c = Console(file=io.StringIO(), width=80, color_system=None, record=True)
        render_console(ev, findings, c, verbose=verbose)
        return c.export_text()

    short, full = text(False), text(True)
    rows = [ln for ln in short.splitlines() if ln.startswith(("PASS ", "SKIPPED "))]
    assert len(rows) == len(rest)                     # one line each, none wrapped
    row = next(ln for ln in rows if f" {long.id} " in ln)
    assert row.rstrip().endswith("…") and len(row.rstrip()) <= 80
    assert "-v shows" in short and "-v shows" not in full
    assert " ".join(long.message.split()[-3:]) in " ".join(full.split())   # the whole message with -v
    n = sum(1 for f in findings if f.severity is Severity.WARNING)
    assert count_phrase(Severity.WARNING, n) in short
    assert count_phrase(Severity.WARNING, 1) == "1 warning" and count_phrase(Severity.PASS, 2) == "2 passed"
