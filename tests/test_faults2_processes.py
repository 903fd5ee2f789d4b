"""Issue 27, classes 7, 8 and 10: an environment-clearing, double-forked daemon does not outlive a
normal run; a symlinked script runs as `python link.py` does (its `__file__` and `argv[0]` name the
link, so files beside the link are found); SIGTERM and SIGHUP after the script ended (while checks run)
end diag as Ctrl-C does: one line, exit 130, no traceback."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import run_diag
from faults_support import alive, env, read_pids, script, wait_for

DAEMON = '''
import os, sys, time
pidfile = sys.argv[1]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        # the daemon: a fresh interpreter with an empty environment (no run marker)
        os.execve(sys.executable, [sys.executable, "-c",
                  "import os, time\\nopen(%r, 'a').write(str(os.getpid()) + '\\\\n')\\ntime.sleep(300)" % pidfile], {})
    os._exit(0)
deadline = time.time() + 60
while time.time() < deadline and not (os.path.exists(pidfile) and open(pidfile).read().strip()):
    time.sleep(0.05)
print("daemon started")
'''


def test_an_env_clearing_double_forked_daemon_does_not_outlive_the_run(tmp_path):
    s = script(tmp_path, "daemon.py", DAEMON)
    pidfile = tmp_path / "daemon.pid"
    r = run_diag("check", "--script", str(s), "--run-dir", str(tmp_path / "rd"), "--fail-on", "never",
                 "--", str(pidfile), cwd=tmp_path, timeout=240)
    assert r.code == 0, r.stderr
    pids = read_pids(pidfile)
    assert pids, r.stderr
    try:
        wait_for(lambda: not alive(pids), timeout=20)
    finally:
        for pid in alive(pids):
            os.kill(pid, signal.SIGKILL)


def test_a_symlinked_script_runs_as_python_runs_it(tmp_path):
    real = tmp_path / "code"
    real.mkdir()
    script(real, "train.py", '''
        import json, os, sys
        here = os.path.dirname(os.path.abspath(__file__))
        cfg = json.load(open(os.path.join(here, "config.json")))
        print("FILE", __file__, "ARGV0", sys.argv[0], "LR", cfg["lr"])
    ''')
    job = tmp_path / "job"
    job.mkdir()
    (job / "config.json").write_text('{"lr": 3}')
    (job / "link.py").symlink_to(real / "train.py")
    bare = subprocess.run([sys.executable, "link.py"], cwd=job, capture_output=True, text=True)
    assert bare.returncode == 0 and "LR 3" in bare.stdout, bare.stderr
    r = run_diag("check", "--script", "link.py", "--run-dir", str(tmp_path / "rd"), "--fail-on", "never",
                 cwd=job, timeout=240)
    assert r.code == 0, r.stderr
    line = next(ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("FILE"))
    assert "LR 3" in line and str(job / "link.py") in line and "code/train.py" not in line, line


@pytest.mark.slow
def test_sigterm_while_checks_run_is_handled_like_ctrl_c(tmp_path):
    """The checks of a plugin that sleeps keep diag busy after the script ended: SIGTERM then."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "slow_plugin.py").write_text(
        "import time\nfrom diag.checks.api import check\n\n"
        "@check(id='slow.check', title='slow')\ndef slow(ctx):\n"
        f"    open({str(tmp_path / 'checking')!r}, 'w').write('x')\n    time.sleep(60)\n")
    info = site / "slow_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: slow-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[diag.checks]\nslow = slow_plugin\n")
    s = script(tmp_path, "ok.py", "print('done')\n")
    e = env(DIAG_CHECK_TIMEOUT="120")
    e["PYTHONPATH"] = e["PYTHONPATH"] + os.pathsep + str(site)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        (tmp_path / "checking").unlink(missing_ok=True)
        p = subprocess.Popen([sys.executable, "-m", "diag", "check", "--script", str(s), "--run-dir",
                              str(tmp_path / f"rd-{sig.name}")], cwd=tmp_path, env=e, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        wait_for(lambda: (tmp_path / "checking").exists(), timeout=120)
        os.kill(p.pid, sig)
        _, err = p.communicate(timeout=60)
        assert p.returncode == 130, err
        assert f"interrupted by {sig.name}" in err and "Traceback" not in err


def test_a_deleted_current_directory_is_one_sentence(tmp_path):
    s = script(tmp_path, "s.py", "print(1)\n")
    gone = tmp_path / "gone"
    gone.mkdir()
    code = (f"import os, subprocess, sys; os.chdir({str(gone)!r}); os.rmdir({str(gone)!r}); "
            f"sys.exit(subprocess.run([sys.executable, '-m', 'diag', 'check', '--script', {str(s)!r}]).returncode)")
    for _ in range(1):
        p = subprocess.run([sys.executable, "-c", code], env=env(), capture_output=True, text=True, timeout=120)
        assert p.returncode == 2, p.stderr
        assert "current directory no longer exists" in p.stderr and "Traceback" not in p.stderr
