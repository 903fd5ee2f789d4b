"""End to end: `diag memory` and the memory extension of the probe on real tiny scripts (a
subprocess each). The OOM test raises, from a CPU script, the exception a CUDA run raises
(torch.OutOfMemoryError with the CUDA caching allocator's message): this CPU-only machine cannot
run out of GPU memory for real."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import findings_by_id

pytestmark = pytest.mark.slow

MLP = """\
import argparse
import torch
from torch import nn
ap = argparse.ArgumentParser()
ap.add_argument("--bs", type=int, default=16)
ap.add_argument("--steps", type=int, default=3)
a = ap.parse_args()
print("training starts", flush=True)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Dropout(0.1), nn.Linear(1024, 1024), nn.ReLU(),
                      nn.Linear(1024, 10))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(a.steps):
    x, y = torch.randn(a.bs, 256), torch.randint(0, 10, (a.bs,))
    opt.zero_grad(set_to_none=True)
    out = model(x)
    loss = nn.functional.cross_entropy(out, y)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.6f}")
model.eval()
with torch.inference_mode():
    for _ in range(2):
        model(torch.randn(a.bs, 256))
"""


def test_diag_memory_plans_accumulation_when_the_batch_does_not_fit(diag_cli, write_script, tmp_path):
    s = write_script("mlp.py", MLP)
    r = diag_cli("memory", "--script", str(s), "--memory", "1GiB", "--batch", "32768", "--format", "json",
                 "--", "--bs", "16")
    assert r.code == 1, r.stderr                       # 1: the batch does not fit
    out = r.json()
    plan = out["plan"]
    assert plan["status"] == "ok", plan
    v = plan["verdict"]
    assert v["observed_batch"] == 16 and v["target_batch"] == 32768 and v["fits"] is False
    mb = v["max_batch"]
    assert 0 < mb < 32768
    acc = v["accumulation"]
    assert acc["effective_batch"] == 32768 and acc["micro_batch"] <= mb
    assert acc["micro_batch"] * acc["steps"] == 32768 or not acc["exact"]
    assert "accum_steps" in acc["snippet"]
    est = plan["estimate"]
    assert est["monotonic"] is True
    peaks = [p["peak"] for p in est["points"]]
    assert peaks == sorted(peaks)
    assert est["search"]["trials"] <= 2 * 16 + 2          # bisection, not a scan
    assert v["max_eval_batch"] > mb                       # no backward: more fits
    assert est["replay"]["optimizers"] == ["AdamW"] and est["replay"]["zero_grad_set_to_none"] is True
    # the run stopped after one step; the plan is saved in the evidence
    assert out["run"]["status"] == "stopped"
    ev = json.loads((Path(out["run"]["run_dir"]) / "evidence.json").read_text())
    assert ev["memory_plan"]["verdict"]["max_batch"] == mb
    # the script's output went to stderr; diag stopped it inside its first optimizer.step()
    assert "training starts" in r.stderr and "step 0 loss" not in r.stderr and "step 0 loss" not in r.stdout
    # the saved plan prints again without running anything
    again = diag_cli("memory", "--from", out["run"]["run_dir"])
    assert again.code == 1 and "largest training batch that fits" in again.stdout


def test_diag_memory_text_on_a_catalogue_gpu(diag_cli, write_script):
    s = write_script("mlp.py", MLP)
    r = diag_cli("memory", "--script", str(s), "--gpu", "a100-80gb", "--", "--bs", "16")
    assert r.code == 0, r.stderr
    out = r.stdout
    assert "NVIDIA A100 80GB" in out and "74.51 GiB" in out          # 80 GB as the catalogue counts
    assert "largest training batch that fits" in out and "your batch 16 fits" in out
    assert "largest evaluation batch under inference_mode" in out
    assert "cuda context" in out.lower()


def test_model_that_cannot_be_replayed_is_skipped_with_the_reason(diag_cli, write_script):
    s = write_script("masked.py", """\
        import torch
        from torch import nn
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(32, 32)
            def forward(self, x):
                h = self.lin(x)
                return h[h > 0].sum() + h.sum()      # a data-dependent shape
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(8, 32)).backward()
            opt.step()
        """)
    r = diag_cli("memory", "--script", str(s), "--memory", "8GiB", "--format", "json")
    assert r.code == 1
    plan = r.json()["plan"]
    assert plan["status"] == "skipped"
    assert "data-dependent" in plan["reason"] and "masked.py:9" in plan["reason"]
    t = diag_cli("memory", "--from", r.json()["run"]["run_dir"])
    assert "skipped" in t.stdout and "data-dependent" in t.stdout


OOM = """\
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
B = 4096
for step in range(5):
    x, y = torch.randn(B, 256), torch.randint(0, 10, (B,))
    opt.zero_grad()
    out = model(x)
    if step == 1:
        # the exception (type and message) a CUDA run raises here, on a 700 MiB device
        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 64.00 MiB. GPU 0 has a total capacity of 700.00 MiB of "
            "which 10.00 MiB is free. Including non-PyTorch memory, this process has 758.00 MiB memory in use. "
            "Of the allocated memory 200.00 MiB is allocated by PyTorch, and 30.00 MiB is reserved by PyTorch "
            "but unallocated.")
    nn.functional.cross_entropy(out, y).backward()
    opt.step()
"""


def test_cuda_oom_triggers_the_replay_and_the_finding_says_what_fits(diag_cli, write_script):
    s = write_script("oom.py", OOM)
    r = diag_cli("check", "--script", str(s), "--format", "json", "--select", "memory",
                 env={"DIAG_PROBE_DISABLE": "flopcounter"})
    assert r.code == 3, r.stderr                          # the script failed
    rep = r.json()
    f = findings_by_id(rep)["memory.oom"][0]
    assert f["severity"] == "error"
    assert "at step 2 with batch size 4096" in f["message"]
    ev = json.loads(Path(rep["run"]["evidence"]).read_text())
    est = ev["ranks"][0]["memory"]["estimate"]
    assert est["status"] == "ok" and est["trigger"] == "oom"
    assert est["capacity"] == 700 << 20 and est["capacity_source"] == "the OOM message's device"
    mb = est["max_batch"]
    assert 0 < mb < 4096
    acc = f["evidence"]["accumulation"]
    assert acc["effective_batch"] == 4096 and acc["micro_batch"] <= mb
    assert f"is {mb}" in f["fix"] and f"micro-batch {acc['micro_batch']} x {acc['steps']}" in f["fix"]
    assert f"accum_steps = {acc['steps']}" in f["snippet"]
    assert ev["ranks"][0]["memory"]["oom"]["step"] == 2


def test_check_does_not_replay_by_default_and_the_replay_changes_nothing(diag_cli, write_script):
    s = write_script("mlp.py", MLP)
    env = {"DIAG_PROBE_DISABLE": "flopcounter"}
    plain = diag_cli("check", "--script", str(s), "--format", "json", "--", "--steps", "4", env=env)
    assert plain.code == 0, plain.stderr
    ev = json.loads(Path(plain.json()["run"]["evidence"]).read_text())
    mem = ev["ranks"][0]["memory"]
    assert "estimate" not in mem                          # no replay on a healthy run by default
    assert mem["capture"]["batch"] == 16 and mem["capture"]["inputs"][0]["shape"] == [16, 256]
    assert mem["persistent"]["params"] == (256 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10) * 4
    assert mem["persistent"]["optimizer_state"] >= 2 * mem["persistent"]["params"]
    assert not any(st["instrumented"] for st in ev["ranks"][0]["steps"])
    assert "steps" not in mem and "breakdown" not in mem  # CUDA-only records: skipped on a CPU run

    asked = diag_cli("check", "--script", str(s), "--format", "json", "--", "--steps", "4",
                     env={**env, "DIAG_MEMORY_ESTIMATE": "1", "DIAG_MEMORY_CAPACITY": str(8 << 30)})
    assert asked.code == 0, asked.stderr
    ev2 = json.loads(Path(asked.json()["run"]["evidence"]).read_text())
    est = ev2["ranks"][0]["memory"]["estimate"]
    assert est["status"] == "ok" and est["trigger"] == "requested" and est["at_step"] == 1
    assert [st["instrumented"] for st in ev2["ranks"][0]["steps"]] == [False, True, False, False]
    # the replay's forwards and optimizer steps are not the user's: nothing extra was recorded
    assert [(o["cls"], o["steps"]) for o in ev2["ranks"][0]["optimizers"]] == [("AdamW", 4)]
    assert [(s["training"], s["count"]) for s in ev2["ranks"][0]["forwards"]] == \
        [(s["training"], s["count"]) for s in ev["ranks"][0]["forwards"]]
    assert not ev2["ranks"][0]["extras"].get("probe_errors")
    # the replay left the training alone: same losses, step for step (RNG and modules restored)
    losses = [ln for ln in plain.stderr.splitlines() if ln.startswith("step ")]
    assert len(losses) == 4
    assert losses == [ln for ln in asked.stderr.splitlines() if ln.startswith("step ")]
    # and the eval batch check has what it needs
    f = findings_by_id(asked.json())["memory.eval-batch"][0]
    assert f["severity"] == "info" and f["evidence"]["eval_batch"] == 16


@pytest.mark.parametrize("args,needle", [
    (["--memory", "lots"], "cannot read 'lots' as a memory size"),
    (["--gpu", "nosuchgpu"], "unknown GPU 'nosuchgpu'"),
    (["--gpu", "h100", "--memory", "8GiB"], "not both"),
    (["--headroom", "95%"], "between 0 and 90%"),
])
def test_bad_inputs_are_one_sentence_and_exit_2(diag_cli, write_script, args, needle):
    s = write_script("mlp.py", MLP)
    r = diag_cli("memory", "--script", str(s), *args)
    assert r.code == 2
    assert needle in r.stderr and "Traceback" not in r.stderr


def test_nothing_to_plan(diag_cli, tmp_path):
    r = diag_cli("memory")
    assert r.code == 2 and "nothing to plan" in r.stderr
    r = diag_cli("memory", "--script", str(tmp_path / "missing.py"))
    assert r.code == 2 and "does not exist" in r.stderr


GROWING = """\
import torch
from torch import nn
torch.manual_seed(0)


class Guard(nn.Module):
    # raises, inside the forward, the exception a 700 MiB CUDA device raises for a batch this large
    def forward(self, x):
        if x.shape[0] > 10_000:
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of 700.00 MiB of "
                "which 10.00 MiB is free. Including non-PyTorch memory, this process has 758.00 MiB memory in "
                "use. Of the allocated memory 200.00 MiB is allocated by PyTorch, and 30.00 MiB is reserved by "
                "PyTorch but unallocated.")
        return x


model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), Guard(), nn.Linear(1024, 10))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for B in [64, 64, 64, 65536]:                 # the last batch is far larger than the first ones
    x, y = torch.randn(B, 256), torch.randint(0, 10, (B,))
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
"""


def test_an_oom_on_a_larger_batch_than_the_first_names_the_failing_batch(diag_cli, write_script):
    """The H200 twin (tests/scripts/cuda/cuda_oom.py) trains at 256, then dies on 2M: the finding said
    'with batch size 256' (the batch of the first steps) and blamed memory kept across steps. The
    failing forward's inputs give the batch; the plan then says what fits."""
    s = write_script("grow.py", GROWING)
    r = diag_cli("check", "--script", str(s), "--format", "json", "--select", "memory",
                 env={"DIAG_PROBE_DISABLE": "flopcounter"})
    assert r.code == 3, r.stderr
    rep = r.json()
    f = findings_by_id(rep)["memory.oom"][0]
    assert "at step 4 with batch size 65536" in f["message"], f["message"]
    ev = json.loads(Path(rep["run"]["evidence"]).read_text())
    oom = ev["ranks"][0]["memory"]["oom"]
    assert oom["batch"] == 65536 and oom["batch_source"] == "failing forward"
    assert ev["ranks"][0]["memory"]["capture"]["batch"] == 64        # what the replay scales from
    mb = ev["ranks"][0]["memory"]["estimate"]["max_batch"]
    assert 64 < mb < 65536
    assert "fits" in f["fix"] and f["evidence"]["accumulation"]["effective_batch"] == 65536
    assert "kept across steps" not in f["fix"]
