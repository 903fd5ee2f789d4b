"""Multi-process runs, without launching any: the distributed checks on hand-built Evidence, merging
evidence files, torchrun option validation, the first-failure report, and the probe extension on a
real one-process gloo DDP job in this process. The real torchrun jobs are in test_distributed_e2e.py."""
from __future__ import annotations

import argparse

import pytest

from diag.torchrun import format_root_cause, parse_nproc, root_cause, validate_torchrun
from diag.errors import DiagError
from diag.evidence import DataLoaderInfo, Evidence, ExceptionInfo, ModelInfo, RankEvidence, StepRecord
from diag.findings import Severity
from diag.fold import fold
from diag.merge import merge_evidence
from diag.registry import Registry

MiB = 1 << 20


def run_check(cid, ev):
    reg = Registry.discover().select([cid])
    out = [f for f in reg.run(ev) if f.id == cid]
    assert out, f"{cid} produced no finding"
    return out


def rank(r, *, data=0.009, fwd=0.002, bwd=0.003, opt=0.001, other=0.001, comm=None, n=12, host="node-a",
         world=2, samples=8, workers=0, measured=True, **dist):
    """A rank whose steps all have the same phases; total = phases + comm wait (DDP equalises totals,
    so callers pass the comm wait that makes them equal)."""
    comm = 0.0 if comm is None else comm
    total = data + fwd + bwd + opt + other + comm
    steps = [StepRecord(index=i + 1, total_s=total, data_s=data, forward_s=fwd, backward_s=bwd,
                        optimizer_s=opt, other_s=other, samples=samples,
                        extra={"comm_wait_s": comm} if measured else {}) for i in range(n)]
    re = RankEvidence(rank=r, local_rank=r, world_size=world, host=host, steps=steps, status="completed",
                      dataloaders=[DataLoaderInfo(id=1, num_workers=workers, batches=n)])
    re.distributed = dict(dist)
    if measured:
        re.distributed.setdefault("comm", {"grad_sync_wait_s": comm * n, "steps": n})
    return re


def evidence(*ranks) -> Evidence:
    ev = Evidence()
    ev.ranks = list(ranks)
    ev.run.status = "completed"
    return ev


# ---- distributed.straggler ----------------------------------------------------------------------------

def test_straggler_found_in_data_wait_although_step_totals_are_equal():
    # rank 1's input pipeline is 5x slower; the all-reduce makes rank 0 wait for it, so both totals
    # are 48 ms: only the phases before the collective show who is slow
    ev = evidence(rank(0, data=0.009, comm=0.032), rank(1, data=0.041, comm=0.0, host="node-b"))
    assert ev.ranks[0].median_step()["total_s"] == pytest.approx(ev.ranks[1].median_step()["total_s"])
    (f,) = run_check("distributed.straggler", ev)
    assert f.severity is Severity.ERROR
    assert f.evidence["rank"] == 1 and f.evidence["host"] == "node-b" and f.evidence["phase"] == "data wait"
    assert "Rank 1 on node-b" in f.message and "data wait" in f.message
    assert f.evidence["others_comm_wait_s"] == pytest.approx(0.032)
    assert f.evidence["score"] == pytest.approx(0.032 / 0.048, rel=0.01)
    assert "input pipeline" in f.fix


def test_straggler_balanced_job_passes():
    ev = evidence(rank(0, data=0.0090), rank(1, data=0.0093), rank(2, data=0.0089), rank(3, data=0.0091))
    (f,) = run_check("distributed.straggler", ev)
    assert f.severity is Severity.PASS
    assert f.evidence["ranks"] == 4


def test_straggler_in_forward_among_eight_ranks_warning():
    ranks = [rank(i, data=0.001, fwd=0.010, comm=0.003) for i in range(8)]
    ranks[5] = rank(5, data=0.001, fwd=0.013, comm=0.0, host="node-c")   # +3 ms of a 19 ms step: 16%
    (f,) = run_check("distributed.straggler", evidence(*ranks))
    assert f.severity is Severity.WARNING
    assert (f.evidence["rank"], f.evidence["phase"], f.evidence["host"]) == (5, "forward", "node-c")


def test_straggler_warning_on_a_contended_host_is_an_info():
    """issue 33: two balanced ranks of a CPU job on a busy 2-core host; the host's scheduling made one
    rank's forward 16% of a step longer. A warning there is the host, not the rank: an info that says so.
    An error-sized straggler stays an error on the same host."""
    from diag.evidence.gpu import GpuTelemetry

    def busy(ev):
        n = 8
        ev.gpu = GpuTelemetry(provider="none", host={"cpu_count": 2, "series": {
            "t": list(range(n)), "cpu": [100.0] * n, "mem_used": [0] * n, "load1": [6.0] * n}},
            processes={"series": {"t": list(range(n)), "cpu": [60.0] * n}, "gpu": []})
        return ev

    ranks = [rank(i, data=0.001, fwd=0.010, comm=0.003) for i in range(8)]
    ranks[5] = rank(5, data=0.001, fwd=0.013, comm=0.0, host="node-c")   # +3 ms of a 19 ms step: 16%
    (f,) = run_check("distributed.straggler", busy(evidence(*ranks)))
    assert f.severity is Severity.INFO, f.message
    assert "contended" in f.message and f.evidence["host_contention"]["contended"]
    assert f.evidence["host"] == "node-c"
    ev = busy(evidence(rank(0, data=0.009, comm=0.032), rank(1, data=0.041, comm=0.0, host="node-b")))
    (f,) = run_check("distributed.straggler", ev)
    assert f.severity is Severity.ERROR


def test_straggler_with_bigger_batches_names_the_cause():
    ev = evidence(rank(0, fwd=0.005, comm=0.010, samples=8), rank(1, fwd=0.015, samples=16))
    (f,) = run_check("distributed.straggler", ev)
    assert f.evidence["phase"] == "forward" and "larger batches" in f.fix


def test_straggler_other_work_judged_only_when_comm_wait_measured():
    # rank 0 logs/checkpoints on its own: 20 ms of other work per step
    measured = evidence(rank(0, other=0.021), rank(1, other=0.001, comm=0.020))
    (f,) = run_check("distributed.straggler", measured)
    assert f.severity is Severity.ERROR and f.evidence["phase"] == "other work" and f.evidence["rank"] == 0
    # without the measured wait, "other" holds the wait itself: not judged, no false straggler
    unmeasured = evidence(rank(0, other=0.021, measured=False), rank(1, other=0.021, measured=False))
    unmeasured.ranks[1].steps[0].other_s = 0.001
    (g,) = run_check("distributed.straggler", unmeasured)
    assert g.severity is Severity.PASS and g.evidence["comm_wait_measured"] is False


def test_straggler_every_rank_input_bound_with_workers_is_not_a_straggler():
    # measured on this machine (num_workers=1, both ranks input-bound at the same rate): one rank's
    # batches arrive later (7.9 ms wait) while the other waits 4.0 ms for data and 4.4 ms in the
    # all-reduce, during which its worker kept producing: no rank holds the other back
    ev = evidence(rank(0, data=0.0040, comm=0.0044, workers=1), rank(1, data=0.0079, comm=0.0004, workers=1))
    (f,) = run_check("distributed.straggler", ev)
    assert f.severity is Severity.PASS
    # with workers but fast ranks that never wait for data, a slow pipeline is a straggler
    ev = evidence(rank(0, data=0.0002, comm=0.030, workers=2), rank(1, data=0.031, workers=2))
    (g,) = run_check("distributed.straggler", ev)
    assert g.severity is Severity.ERROR and g.evidence["rank"] == 1


@pytest.mark.parametrize("ranks,needle", [
    ([rank(0, world=1)], "Single-process"),
    ([rank(0, world=4)], "Only rank 0 of 4"),
    ([rank(0, n=2), rank(1, n=2)], "Too few timed steps"),
])
def test_straggler_skipped_with_reason(ranks, needle):
    (f,) = run_check("distributed.straggler", evidence(*ranks))
    assert f.severity is Severity.SKIPPED and needle in f.message


# ---- distributed.memory-imbalance -----------------------------------------------------------------

def test_memory_imbalance_device_peaks():
    GiB = 1 << 30
    rs = [rank(i, memory={"device": f"cuda:{i}", "peak_allocated_bytes": 20 * GiB, "total_bytes": 80 * GiB})
          for i in range(4)]
    rs[0].distributed["memory"]["peak_allocated_bytes"] = 34 * GiB     # rank 0 holds 14 GiB more
    (f,) = run_check("distributed.memory-imbalance", evidence(*rs))
    assert f.severity is Severity.ERROR
    assert f.evidence["rank"] == 0 and f.evidence["skew"] == pytest.approx(14 / 34, rel=1e-3)
    assert "device" in f.evidence["measure"] and "map_location" in f.snippet
    assert "of 80.00 GiB" in f.message


def test_memory_imbalance_uses_memory_section_then_host_rss():
    a = rank(0, memory={"host_peak_rss_bytes": 1100 * MiB})
    b = rank(1, memory={"host_peak_rss_bytes": 1400 * MiB})
    (f,) = run_check("distributed.memory-imbalance", evidence(a, b))
    assert f.severity is Severity.WARNING and f.evidence["rank"] == 1 and "host" in f.evidence["measure"]
    # the memory extension's per-step CUDA peaks win over host RSS
    a.memory = {"steps": [{"peak": 1000 * MiB}]}
    b.memory = {"steps": [{"peak": 1010 * MiB}]}
    (g,) = run_check("distributed.memory-imbalance", evidence(a, b))
    assert g.severity is Severity.PASS and "device" in g.evidence["measure"]


def test_memory_imbalance_small_absolute_difference_passes():
    a = rank(0, memory={"host_peak_rss_bytes": 100 * MiB})
    b = rank(1, memory={"host_peak_rss_bytes": 200 * MiB})     # 50% but only 100 MiB
    (f,) = run_check("distributed.memory-imbalance", evidence(a, b))
    assert f.severity is Severity.PASS


def test_memory_imbalance_skipped_without_per_rank_memory():
    (f,) = run_check("distributed.memory-imbalance", evidence(rank(0), rank(1)))
    assert f.severity is Severity.SKIPPED


# ---- distributed.backend ------------------------------------------------------------------------

def cuda_ranks(backend_config, nccl=True):
    out = []
    for i in range(2):
        r = rank(i, initialized=True, backend=backend_config.split(":")[-1].split(",")[0],
                 backend_config=backend_config, world_size=2,
                 available={"nccl": nccl, "gloo": True}, ddp={"models": [{"model": 1, "device": f"cuda:{i}"}]})
        out.append(r)
    return out


def test_backend_gloo_for_cuda_tensors_is_an_error_when_nccl_exists():
    (f,) = run_check("distributed.backend", evidence(*cuda_ranks("cuda:gloo,cpu:gloo")))
    assert f.severity is Severity.ERROR and "nccl" in f.snippet
    (g,) = run_check("distributed.backend", evidence(*cuda_ranks("gloo", nccl=False)))
    assert g.severity is Severity.WARNING and "no NCCL" in g.message


def test_backend_nccl_for_cuda_passes_and_cpu_gloo_passes():
    (f,) = run_check("distributed.backend", evidence(*cuda_ranks("cpu:gloo,cuda:nccl")))
    assert f.severity is Severity.PASS
    cpu = [rank(i, initialized=True, backend="gloo", backend_config="cpu:gloo,cuda:gloo", world_size=2,
                available={"nccl": False, "gloo": True}, ddp={"models": [{"model": 1, "device": "cpu"}]})
           for i in range(2)]
    (g,) = run_check("distributed.backend", evidence(*cpu))
    assert g.severity is Severity.PASS


def test_backend_nccl_missing_where_cuda_is_trained():
    rs = cuda_ranks("cpu:gloo,cuda:nccl", nccl=False)
    (f,) = run_check("distributed.backend", evidence(*rs))
    assert f.severity is Severity.WARNING and f.title == "NCCL is not available"


def test_backend_several_processes_without_process_group():
    rs = [rank(i, initialized=False, available={"nccl": False}) for i in range(2)]
    (f,) = run_check("distributed.backend", evidence(*rs))
    assert f.severity is Severity.WARNING and "no process group" in f.title
    (g,) = run_check("distributed.backend", evidence(rank(0, world=1)))
    assert g.severity is Severity.SKIPPED


# ---- distributed.device-placement -----------------------------------------------------------------

def test_device_placement_two_ranks_on_one_gpu():
    rs = [rank(i, memory={"device": "cuda:0"}) for i in range(3)]
    rs[2].distributed["memory"] = {"device": "cuda:2"}
    (f,) = run_check("distributed.device-placement", evidence(*rs))
    assert f.severity is Severity.ERROR and f.evidence["ranks"] == "0, 1" and "set_device" in f.snippet
    # the same index on different hosts, or behind different CUDA_VISIBLE_DEVICES, is not shared
    rs = [rank(0, memory={"device": "cuda:0"}, host="a"), rank(1, memory={"device": "cuda:0"}, host="b")]
    assert run_check("distributed.device-placement", evidence(*rs))[0].severity is Severity.PASS
    rs = [rank(i, memory={"device": "cuda:0"}, launcher={"cuda_visible_devices": str(i)}) for i in range(2)]
    assert run_check("distributed.device-placement", evidence(*rs))[0].severity is Severity.PASS
    rs = [rank(i, memory={"device": "cuda:0", "device_uuid": "GPU-same"}, launcher={"cuda_visible_devices": str(i)})
          for i in range(2)]
    assert run_check("distributed.device-placement", evidence(*rs))[0].severity is Severity.ERROR


# ---- merging the nodes' evidence ---------------------------------------------------------------------

def node(ranks, world=4, run_id="job-1", status="completed", started=1000.0):
    ev = Evidence()
    ev.run.id = f"run-{ranks[0]}"
    ev.run.status = status
    ev.run.started_at = started + ranks[0]
    ev.run.wall_s = 10.0 + ranks[0]
    ev.environment.hostname = f"host{ranks[0]}"
    for r in ranks:
        re = rank(r, world=world, host=f"host{ranks[0]}", launcher={"run_id": run_id})
        ev.ranks.append(re)
    ev.gpu = {"provider": f"gpus of host{ranks[0]}"}
    return ev


def test_merge_two_nodes():
    a, b = node([2, 3], status="failed"), node([0, 1])
    ev = merge_evidence([a, b], sources=["n1/evidence.json", "n0/evidence.json"])
    assert [r.rank for r in ev.ranks] == [0, 1, 2, 3]
    assert ev.run.launcher == "merged" and ev.run.status == "failed"
    assert ev.run.sources == ["n1/evidence.json", "n0/evidence.json"]
    assert ev.environment.hostname == "host0" and ev.gpu["provider"] == "gpus of host0"
    assert ev.run.wall_s == 12.0 and ev.run.started_at == 1000.0
    assert any("n0/evidence.json (ranks 0-1 on host0)" in n for n in ev.notes)
    # the result is a normal Evidence: it round-trips and the checks judge all four ranks
    back = Evidence.from_dict(ev.to_dict())
    assert len(back.ranks) == 4
    assert run_check("distributed.straggler", back)[0].evidence["ranks"] == 4


def test_merge_notes_missing_ranks():
    ev = merge_evidence([node([0, 1], world=6), node([2, 3], world=6)], sources=["a", "b"])
    assert any("ranks 4-5 of world size 6" in n for n in ev.notes)


@pytest.mark.parametrize("files,needle", [
    (lambda: [node([0, 1]), node([1, 2])], "rank 1 appears in both"),
    (lambda: [node([0, 1]), node([2, 3], world=8)], "different world sizes"),
    (lambda: [node([0, 1]), node([2, 3], run_id="job-2")], "different torchrun jobs"),
    (lambda: [node([0], world=1), node([1])], "single-process run"),
    (lambda: [node([0, 1]), Evidence()], "holds no rank"),
    (lambda: [node([0, 1])] * 2, "are the same run"),
    (lambda: [node([0, 1]), node([5], world=4)], "outside world size 4"),
])
def test_merge_refuses_files_of_different_jobs(files, needle):
    with pytest.raises(DiagError) as e:
        merge_evidence(files(), sources=["node0/evidence.json", "node1/evidence.json"])
    assert needle in e.value.message and "\n" not in e.value.message


# ---- torchrun options ---------------------------------------------------------------------------

@pytest.mark.parametrize("value,expected", [("4", 4), (2, 2), ("gpu", "gpu"), ("AUTO", "auto"), ("cpu", "cpu")])
def test_parse_nproc_accepts_what_torchrun_accepts(value, expected):
    assert parse_nproc(value) == expected


@pytest.mark.parametrize("value", ["0", "-1", "two", "", "1.5", True])
def test_parse_nproc_refuses(value):
    with pytest.raises(ValueError):
        parse_nproc(value)


@pytest.mark.parametrize("nproc,args,needle", [
    (None, ["--nnodes=2"], "need --nproc-per-node"),
    (2, ["--nnodes=2"], "needs --master-addr"),
    (2, ["--nnodes=2", "--master-addr=10.0.0.1"], "needs --node-rank"),
    (2, ["--nnodes=2", "--master-addr=10.0.0.1", "--node-rank=2"], "out of range"),
    (2, ["--nnodes=2", "--standalone", "--rdzv-endpoint=h:1"], "--standalone runs a single node"),
    (2, ["--nnodes=3:2"], "MIN <= MAX"),
    (2, ["--master-port=0"], "between 1 and 65535"),
    (2, ["--rdzv-endpoint=host:port"], "HOST or HOST:PORT"),
    (2, ["--node-rank=-1"], "0 or more"),
    (2, ["--nproc-per-node=3"], "once"),
    (2, ["--no-python"], "cannot be passed through"),
    (2, ["--run-path"], "cannot be passed through"),
    (0, [], "positive number"),
])
def test_validate_torchrun_refuses_before_launch(nproc, args, needle):
    with pytest.raises(DiagError) as e:
        validate_torchrun(nproc, args)
    assert needle in e.value.message


def test_validate_torchrun_accepts_multi_node_forms():
    assert validate_torchrun("4", ["--nnodes=2", "--node-rank=1", "--master-addr=10.0.0.1",
                                   "--master-port=29500"]) == 4
    assert validate_torchrun(8, ["--nnodes=1:4", "--rdzv-backend=c10d", "--rdzv-endpoint=[::1]:29400",
                                 "--rdzv-id=job"]) == 8
    assert validate_torchrun(None, []) is None


def test_cli_options_become_torchrun_arguments():
    from diag.commands._common import add_run_arguments, torchrun_config

    p = argparse.ArgumentParser()
    add_run_arguments(p)
    args = p.parse_args(["--script", "t.py", "--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1",
                         "--master-addr", "10.0.0.1", "--master-port", "29501", "--max-restarts", "0",
                         "--torchrun-arg=--monitor-interval=1"])
    assert torchrun_config(args) == (2, ["--nnodes=2", "--node-rank=1", "--master-addr=10.0.0.1",
                                         "--master-port=29501", "--max-restarts=0", "--monitor-interval=1"])
    with pytest.raises(SystemExit):
        p.parse_args(["--nproc-per-node", "zero"])


def test_runner_builds_the_torchrun_command(tmp_path):
    from diag.runner import Run, RunConfig

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    run = Run(RunConfig(script=str(script), args=["--lr", "1"], nproc_per_node="2",
                        torchrun_args=["--nnodes=1"], run_dir=str(tmp_path / "run"), gpu=False))
    cmd = run.command()
    assert cmd[1:6] == ["-m", "diag.probe.launch", "--nproc-per-node=2", "--nnodes=1", "--standalone"]
    assert cmd[-5:] == ["-m", "diag.probe", str(script.resolve()), "--lr", "1"]
    assert run.evidence.run.launcher == "torchrun"
    with pytest.raises(DiagError, match="need --nproc-per-node"):
        Run(RunConfig(script=str(script), torchrun_args=["--nnodes=2"], run_dir=str(tmp_path / "r2"), gpu=False))


@pytest.mark.parametrize("given, added", [
    ([], True),                                       # one node, nothing said: a free local port
    (["--nnodes=1"], True),
    (["--max-restarts=0", "--monitor-interval=1"], True),
    (["--standalone"], False),                        # already there
    (["--master-port=29501"], False),                 # the user chose the rendezvous
    (["--master-addr", "10.0.0.1"], False),
    (["--rdzv-endpoint=host:29400", "--rdzv-backend=c10d"], False),
    (["--rdzv_backend=c10d"], False),                 # torchrun's underscore spelling
    (["--nnodes=2", "--node-rank=0", "--master-addr=a"], False),
    (["--nnodes=1:4"], False),                        # elastic
])
def test_one_node_jobs_rendezvous_on_a_free_port(given, added):
    from diag.torchrun import with_local_rendezvous

    got = with_local_rendezvous(given, environ={})
    assert got == ([*given, "--standalone"] if added else given)
    # torchrun reads its options from PET_* variables too: a rendezvous given there is left alone
    assert with_local_rendezvous(given, environ={"PET_MASTER_PORT": "29501"}) == given


# ---- the first failure --------------------------------------------------------------------------

def failed_rank(r, t, exc_type, msg, started=100.0, **launcher_exit):
    re = RankEvidence(rank=r, world_size=3, host="h", status="failed", started_at=started)
    if exc_type:
        re.exceptions.append(ExceptionInfo(type=exc_type, message=msg, t=t,
                                           traceback=f"Traceback (most recent call last):\n{exc_type}: {msg}\n"))
    if launcher_exit:
        re.distributed["launcher_exit"] = launcher_exit
    return re


def test_root_cause_is_the_earliest_exception_not_rank_0():
    ev = evidence(failed_rank(0, 5.4, "RuntimeError", "Connection closed by peer"),
                  failed_rank(1, 4.5, "ValueError", "planted failure", started=100.2),
                  RankEvidence(rank=2, world_size=3, status="stopped"))
    ev.run.status = "failed"
    rc = root_cause(ev)
    assert rc["rank"] == 1 and rc["exception"].type == "ValueError"
    text = format_root_cause(ev)
    assert text.count("Traceback (most recent call last)") == 1
    assert "rank 1 on h failed first: ValueError: planted failure" in text
    assert "rank 0: RuntimeError: Connection closed by peer" in text and "rank 2" not in text
    # run.failed names the same rank
    (f,) = run_check("run.failed", ev)
    assert f.evidence["rank"] == 1


def test_root_cause_of_a_rank_killed_by_a_signal_comes_from_the_launcher():
    ev = evidence(failed_rank(0, None, None, "", exitcode=-15, signal="SIGTERM", first_observed=False),
                  failed_rank(1, None, None, "", exitcode=-11, signal="SIGSEGV", first_observed=True))
    ev.run.status = "failed"
    text = format_root_cause(ev)
    assert text.startswith("diag: rank 1 on h was killed by SIGSEGV")
    assert "rank 0: ended by SIGTERM" in text


def test_launcher_exit_events_fold_into_the_rank():
    ev = Evidence()
    fold(ev, {"kind": "merge", "rank": 3, "t": 0.0, "path": "distributed",
              "value": {"launcher_exit": {"exitcode": -9, "signal": "SIGKILL"}}})
    assert ev.rank(3).distributed["launcher_exit"]["signal"] == "SIGKILL"


# ---- the probe extension, in this process, on a real one-process gloo DDP job ---------------------------

def test_probe_extension_on_real_ddp(tmp_path):
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset

    import diag

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(8, 8)
            self.bn = nn.BatchNorm1d(8)          # a buffer: DDP broadcasts it before each forward
            self.unused_head = nn.Linear(8, 2)   # never called: an unused parameter for DDP

        def forward(self, x):
            return self.bn(self.body(x))

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = DDP(Net(), find_unused_parameters=True)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=8)
        with diag.watch() as run:
            for i, (x,) in enumerate(data):
                accumulate = i % 2 == 0
                ctx = model.no_sync() if accumulate else torch.enable_grad()
                with ctx:
                    model(x).pow(2).mean().backward()
                if not accumulate:
                    opt.step()
                    opt.zero_grad()
    finally:
        dist.destroy_process_group()
    r = run.evidence.primary
    d = r.distributed
    assert d["active"] and d["initialized"] and d["backend"] == "gloo" and d["world_size"] == 1
    (m,) = d["ddp"]["models"]
    assert m["find_unused_parameters"] is True and m["buffers"] == 3 and m["device"] == "cpu"
    assert m["unused_params"] == 2 and set(m["unused_names"]) == {"unused_head.weight", "unused_head.bias"}
    assert m["forwards_checked"] == 3
    assert d["ddp"]["forwards_sync"] == 4 and d["ddp"]["forwards_no_sync"] == 4
    assert r.step_stats.count == 4
    for s in r.steps:
        assert s.n_backward == 2 and s.extra["ddp_sync"] == 1 and s.extra["ddp_no_sync"] == 1
        assert s.extra["comm_wait_s"] >= 0.0
        parts = s.data_s + s.forward_s + s.backward_s + s.optimizer_s + s.other_s + s.extra["comm_wait_s"]
        assert parts == pytest.approx(s.total_s, abs=1e-6)
    assert d["comm"]["grad_sync_wait_s"] >= 0.0 and d["comm"]["buffer_sync_wait_s"] > 0.0
    assert d["memory"]["host_peak_rss_bytes"] > 50 * MiB and d["memory"]["device"] == "cpu"
    # the buffer-sync timer was an instance attribute: removed on exit
    assert "_sync_buffers" not in model.__dict__


def test_reached_params_walks_the_graph():
    import torch
    from torch import nn

    from diag.probe.distributed import reached_params

    a, b = nn.Linear(3, 3), nn.Linear(3, 3)
    out = a(torch.randn(2, 3))
    found = reached_params([out])
    assert id(a.weight) in found and id(a.bias) in found and id(b.weight) not in found
