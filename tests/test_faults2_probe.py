"""Issue 27, classes 15 and 18, on the probe's side: a script that closed its stderr keeps its own
exception in the evidence; a script that replaces itself with os.execv keeps its steps."""
import json
import subprocess
import sys


def _check(tmp_path, body: str) -> dict:
    script = tmp_path / "s.py"
    script.write_text(body)
    run = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "diag", "check", "--script", str(script), "--run-dir", str(run),
                    "--format", "json", "-o", str(tmp_path / "r.json")], cwd=tmp_path,
                   stdin=subprocess.DEVNULL, capture_output=True, timeout=240)
    return json.loads((run / "evidence.json").read_text())


def test_a_script_that_closed_fd_2_keeps_its_exception(tmp_path):
    ev = _check(tmp_path, "import os\nos.close(2)\nraise RuntimeError('planted after closing fd 2')\n")
    assert ev["run"]["status"] == "failed"
    assert "planted after closing fd 2" in json.dumps(ev)


def test_os_execv_keeps_the_steps_run_before_it(tmp_path):
    ev = _check(tmp_path, "import os, sys, torch\n"
                          "m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                          "for i in range(35):\n"
                          "    opt.zero_grad(); m(torch.randn(8, 4)).sum().backward(); opt.step()\n"
                          "os.execv(sys.executable, [sys.executable, '-c', 'print(1)'])\n")
    assert len(ev["ranks"][0]["steps"]) == 35
