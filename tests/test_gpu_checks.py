"""The gpu checks driven by the simulated scenarios: telemetry recorded by the real sampler (with an
injected clock) into Evidence, hand-built training steps, then the registry's checks; plus a few
end-to-end `diag check --simulate-gpus` runs and the import rules of `diag gpus`."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from diag.evidence import Evidence, ForwardSite, ModelInfo, RankEvidence, StepRecord
from diag.findings import Severity
from diag.gpu import Sampler, SimulatedProvider
from diag.gpu.series import peak_memory_by_device
from diag.registry import Registry

from conftest import REPO, findings_by_id

EPOCH = 1.7e9


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def evidence_for(scenario: str, seconds: float = 30.0, interval: float = 0.5, steps: tuple = (5.0, 25.0),
                 step_s: float = 0.25, data_share: float = 0.0, track: bool = True, seed: int = 0) -> Evidence:
    """Evidence of a run whose GPUs followed ``scenario``: the sampler records ``seconds`` of
    simulated telemetry; training steps of ``step_s`` fill the ``steps`` window (seconds after start)."""
    clock = Clock()
    prov = SimulatedProvider(scenario, seed=seed, clock=clock, epoch=EPOCH)
    sampler = Sampler(prov, interval=interval, host=False)
    if track:
        sampler.track(os.getpid())       # the simulated run's processes take this pid
    while clock.t <= seconds:
        sampler.sample_once()
        clock.t += interval
    ev = Evidence()
    ev.gpu = sampler.to_evidence()
    r = RankEvidence(rank=0, started_at=EPOCH, status="completed")
    t, i = steps[0], 0
    while t + step_s <= steps[1]:
        t += step_s
        i += 1
        r.steps.append(StepRecord(index=i, t=t, total_s=step_s, data_s=step_s * data_share,
                                  forward_s=step_s * (1 - data_share) * 0.4, backward_s=step_s * (1 - data_share) * 0.5,
                                  optimizer_s=step_s * (1 - data_share) * 0.1))
    r.step_stats.count = r.step_stats.timed = i
    ev.ranks.append(r)
    ev.run.status = "completed"
    if prov.simulated:
        ev.run.simulated_gpus = scenario
    return ev


# The GPU-telemetry checks (gpu.idle, in the same namespace, judges the CUDA device timeline instead:
# tests/test_timeline_checks.py)
TELEMETRY = (["gpu"], ["gpu.idle"])


def judge(ev: Evidence) -> dict:
    reg = Registry.discover().select(*TELEMETRY)
    return {f.id: f for f in reg.run(ev)}


def test_gpu_checks_are_registered():
    ids = {s.id for s in Registry.discover().specs}
    assert {"gpu.imbalance", "gpu.low-utilization", "gpu.throttling", "gpu.lost"} <= ids


def test_healthy_node_passes_everything():
    f = judge(evidence_for("healthy-8"))
    assert {k: v.severity for k, v in f.items()} == {k: Severity.PASS for k in f}
    assert "(simulated GPUs)" in f["gpu.low-utilization"].message
    assert f["gpu.low-utilization"].evidence["devices"] == 8


def test_imbalance_names_busy_and_idle_devices():
    f = judge(evidence_for("imbalance"))["gpu.imbalance"]
    assert f.severity is Severity.ERROR
    assert f.message.startswith("GPU 0 was busy 9") and "GPU 3 sat idle" in f.message
    assert "GPUs 1 and 2 ran at" in f.message and "(simulated GPUs)" in f.message
    assert f.evidence["idle"] == [3] and f.evidence["lagging"] == [1, 2] and f.evidence["busiest"] == 0
    assert f.evidence["mem_skew"] > 0.9 and f.evidence["decided_by"] == "processes"
    assert f.evidence["dataparallel_pattern"] is True and "DistributedDataParallel" in f.fix
    assert "DistributedDataParallel" in f.snippet


def test_imbalance_with_a_dataparallel_model_points_at_it():
    ev = evidence_for("imbalance")
    r = ev.primary
    r.models.append(ModelInfo(id=1, cls="ResNet", wrappers=["DataParallel"]))
    r.forwards.append(ForwardSite(key="k", model=1, module="DataParallel",
                                  location={"file": "train.py", "line": 42, "function": "main"}))
    f = judge(ev)["gpu.imbalance"]
    assert "This is the DataParallel pattern" in f.message
    assert str(f.location) == "train.py:42 (in main)"


def test_memory_skew_alone_is_a_warning():
    ev = evidence_for("healthy-8")
    devs = ev.gpu["devices"]
    devs[0]["stats"]["mem_used_max"] = int(devs[1]["stats"]["mem_used_max"] * 1.6)
    f = judge(ev)["gpu.imbalance"]
    assert f.severity is Severity.WARNING and "skew" in f.message and "GPU 0 peaked" in f.message


def test_one_of_eight_gpus_used_is_info():
    ev = evidence_for("healthy-8")
    for d in ev.gpu["devices"][1:]:
        d["used_by_run"] = False
        d["stats"]["util_mean"] = 0.0
    f = judge(ev)["gpu.imbalance"]
    assert f.severity is Severity.INFO and "used GPU 0 only" in f.message
    assert "torchrun --nproc-per-node=8" in f.snippet


def test_starved_gpus_low_utilization_related_to_data_wait():
    f = judge(evidence_for("starved", data_share=0.55))["gpu.low-utilization"]
    assert f.severity in (Severity.WARNING, Severity.ERROR)
    assert f.evidence["util_mean"] < 50 and f.evidence["data_wait_share"] == pytest.approx(0.55)
    assert "waited for data 55% of each step" in f.message and "num_workers" in f.snippet
    f2 = judge(evidence_for("starved", data_share=0.0))["gpu.low-utilization"]
    assert "did not wait for data" in f2.message and "torch.compile" in f2.snippet


def test_low_utilization_thresholds():
    f = judge(evidence_for("starved"))["gpu.low-utilization"]
    mean = f.evidence["util_mean"]
    assert (f.severity is Severity.ERROR) == (mean < 25)
    assert f.evidence["threshold"] == 50 and f.evidence["samples"] >= 3


def test_too_few_samples_is_skipped_with_advice():
    ev = evidence_for("starved", interval=1.0, steps=(5.0, 6.2))
    f = judge(ev)["gpu.low-utilization"]
    # 0.8 s of steady steps: shorter than NVML's averaging period, so no sample speaks for them alone
    assert f.severity is Severity.SKIPPED and "run longer" in f.message


def test_no_training_steps_skips_low_utilization():
    ev = evidence_for("healthy-8")
    ev.ranks[0].steps.clear()
    f = judge(ev)["gpu.low-utilization"]
    assert f.severity is Severity.SKIPPED and "training step" in f.message


def test_throttling_names_the_hot_gpu_and_the_power_cap():
    f = judge(evidence_for("throttling"))["gpu.throttling"]
    assert f.severity is Severity.WARNING
    assert "GPU 1 was slowed by heat" in f.message and "°C" in f.message and "MHz" in f.message
    assert "GPU 2 ran at its power limit (300 W)" in f.message
    assert set(f.evidence["thermal"]) == {"1"} and "2" in f.evidence["power_cap"]
    assert "cooling" in f.fix and "nvidia-smi" in f.snippet


def test_power_cap_alone_is_info_unless_limit_lowered():
    ev = evidence_for("throttling")
    for d in ev.gpu["devices"]:
        d["series"]["throttle"] = [m & ~0x60 if m is not None else None for m in d["series"]["throttle"]]
    f = judge(ev)["gpu.throttling"]
    assert f.severity is Severity.INFO and "normal" in f.fix
    ev.gpu["devices"][2]["default_power_limit_w"] = 450.0
    f = judge(ev)["gpu.throttling"]
    assert f.severity is Severity.WARNING and "lowered to 300 W from the default 450 W" in f.message


def test_lost_gpu_is_an_error_and_left_out_of_imbalance():
    f = judge(evidence_for("lost"))
    lost = f["gpu.lost"]
    assert lost.severity is Severity.ERROR and lost.evidence["lost"] == [2]
    assert "GPU 2 (NVIDIA A100-SXM4-40GB) stopped answering 4.0 s into the run" in lost.message
    assert "Xid" in lost.fix
    assert f["gpu.imbalance"].severity is Severity.PASS


def test_mig_utilisation_na_is_not_zero():
    f = judge(evidence_for("mig"))["gpu.low-utilization"]
    # GPU 0 (MIG) has no utilisation: it is left out, not counted as 0%
    assert f.severity is Severity.PASS and f.evidence["per_device"].keys() == {"1"}


@pytest.mark.parametrize("gpu", [
    {},
    {"provider": "none", "reason": "NVML (libnvidia-ml.so.1) was not found", "devices": []},
])
def test_no_gpu_every_check_skipped_with_reason(gpu):
    ev = Evidence()
    ev.gpu = gpu
    f = judge(ev)
    assert {v.severity for v in f.values()} == {Severity.SKIPPED}
    if gpu:
        assert all("libnvidia-ml.so.1" in v.message for v in f.values())
    f = judge(evidence_for("none"))
    assert all(v.severity is Severity.SKIPPED and "no GPUs" in v.message for v in f.values())


def test_script_never_on_gpu():
    ev = evidence_for("healthy-8", track=False)
    for d in ev.gpu["devices"]:
        d["used_by_run"] = False
    f = judge(ev)["gpu.low-utilization"]
    assert f.severity is Severity.WARNING and "trained on the CPU" in f.message


def test_without_process_info_active_devices_are_used():
    ev = evidence_for("imbalance", track=False)
    assert all(d["used_by_run"] is None for d in ev.gpu["devices"])
    f = judge(ev)["gpu.imbalance"]
    # GPU 3 shows no activity, so it is not counted as a device of the run
    assert f.evidence["decided_by"] == "activity" and f.evidence["devices"] == 3
    assert f.severity is Severity.WARNING and "GPUs 1 and 2 ran at" in f.message


def test_evidence_round_trip_keeps_the_telemetry():
    ev = evidence_for("throttling")
    again = Evidence.from_dict(json.loads(ev.to_json()))
    assert {k: v.message for k, v in judge(again).items()} == {k: v.message for k, v in judge(ev).items()}
    peaks = peak_memory_by_device(again)
    assert set(peaks) == {0, 1, 2, 3} and peaks[0]["used_max"] <= peaks[0]["total"] and peaks[0]["simulated"]


def test_evidence_gpu_is_bounded():
    ev = evidence_for("healthy-8", seconds=1200, interval=1.0, steps=(5, 1195), step_s=1.0, track=False)
    assert len(json.dumps(ev.gpu)) < 250_000
    assert ev.gpu["devices"][0]["stats"]["samples"] == 1201
    assert all(len(d["series"]["t"]) <= 241 for d in ev.gpu["devices"])


# ---- end to end ---------------------------------------------------------------------------------------------

TRAIN = """
import time, torch
model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(16):
    x = torch.randn(32, 16)
    loss = model(x).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    time.sleep(0.08)
"""


@pytest.mark.slow
def test_check_with_simulated_imbalance_end_to_end(diag_cli, write_script):
    script = write_script("train.py", TRAIN)
    r = diag_cli("check", "--script", str(script), "--simulate-gpus", "imbalance", "--gpu-interval", "0.2",
                 "--format", "json")
    assert r.code == 1, r.stderr
    rep = r.json()
    assert rep["run"]["simulated_gpus"] == "imbalance"
    assert any("simulated" in n for n in rep["notes"])
    f = findings_by_id(rep)
    assert f["gpu.imbalance"][0]["severity"] == "error"
    assert "GPU 3 sat idle" in f["gpu.imbalance"][0]["message"]
    assert f["gpu.lost"][0]["severity"] == "pass"
    ev = json.loads((__import__("pathlib").Path(rep["run"]["evidence"])).read_text())
    g = ev["gpu"]
    assert g["provider"] == "simulated" and g["simulated"] and g["interval_s"] == 0.2 and g["samples"] >= 5
    assert [d["used_by_run"] for d in g["devices"]] == [True] * 4
    assert g["processes"]["tracked"] and g["processes"]["max_rss"] > 10 << 20


@pytest.mark.slow
def test_check_with_env_simulation_text_says_simulated(diag_cli, write_script):
    script = write_script("train.py", TRAIN)
    r = diag_cli("check", "--script", str(script), "--gpu-interval", "0.25", "--select", "gpu", "--ignore", "gpu.idle",
                 env={"DIAG_SIMULATE_GPUS": "throttling", "COLUMNS": "200"})
    assert r.code == 0, r.stderr
    assert "SIMULATED" in r.stdout and "gpu.throttling" in r.stdout and "GPU 1 was slowed by heat" in r.stdout
    assert "(simulated GPUs)" in " ".join(r.stdout.split())   # (the message may wrap inside the phrase)


@pytest.mark.slow
def test_check_without_gpu_skips_with_the_reason(diag_cli, write_script):
    script = write_script("train.py", TRAIN)
    r = diag_cli("check", "--script", str(script), "--select", "gpu", "--ignore", "gpu.idle", "--format", "json")
    rep = r.json()
    ev = json.loads(open(rep["run"]["evidence"]).read())
    if ev["gpu"]["devices"]:
        pytest.skip("this machine has a GPU")
    assert ev["gpu"]["provider"] == "none" and ev["gpu"]["reason"]
    assert rep["run"]["simulated_gpus"] is None
    for f in rep["findings"]:
        assert f["severity"] == "skipped" and ev["gpu"]["reason"].rstrip(".") in f["message"]


def test_bad_gpu_options_are_one_sentence(diag_cli, write_script):
    script = write_script("train.py", TRAIN)
    r = diag_cli("check", "--script", str(script), "--gpu-interval", "0.05")
    assert r.code == 2 and "argument --gpu-interval: must be at least 0.1 s" in r.stderr
    assert "Traceback" not in r.stderr
    r = diag_cli("check", "--script", str(script), "--simulate-gpus", "nope")
    assert r.code == 2 and "unknown scenario 'nope' (choose one of: healthy-8" in r.stderr
    r = diag_cli("check", "--script", str(script), env={"DIAG_SIMULATE_GPUS": "nope"})
    assert r.code == 2 and "DIAG_SIMULATE_GPUS='nope' is not a known scenario" in r.stderr


def test_gpus_command_imports_neither_torch_nor_textual():
    code = ("import sys, io, contextlib, json\nfrom diag.cli import main\n"
            "buf = io.StringIO()\nwith contextlib.redirect_stdout(buf):\n"
            "    rc = main(['gpus', '--simulate-gpus', 'healthy-8'])\n"
            "    rc2 = main(['gpus', '--json', '--simulate-gpus', 'mig'])\n"
            "print(json.dumps({'rc': [rc, rc2], 'torch': 'torch' in sys.modules, 'textual': 'textual' in sys.modules}))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert json.loads(p.stdout.strip().splitlines()[-1]) == {"rc": [0, 0], "torch": False, "textual": False}
