"""Issue 27, classes 3, 4, 5 and 20: third-party checks run out of diag's process. A plugin stuck in C
code holding the GIL, an atexit handler that sleeps, a check that allocates past the memory limit,
os._exit, prints, os.chdir: each stays in the plugin worker; diag's exit code, stdout and files are its
own, and each broken check is one `crashed` finding with one reason."""
from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

from conftest import REPO, run_diag
from diag.testing import EvidenceBuilder


def make_plugin(site: Path, dist: str, module: str, source: str, entry_points: dict[str, str]) -> None:
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    eps = "\n".join(f"{k} = {v}" for k, v in entry_points.items())
    (info / "entry_points.txt").write_text(f"[diag.checks]\n{eps}\n")


def failed_evidence(tmp_path: Path) -> Path:
    """Evidence of a run whose script failed: diag's verdict is exit 3 (or 1 with --from)."""
    ev = EvidenceBuilder().cuda_training().steps(10, total_s=2.5, samples=8).build()
    p = tmp_path / "evidence.json"
    ev.save(p)
    return p


def plugin_site(tmp_path: Path, source: str) -> Path:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    make_plugin(site, "hostile-plugin", "hostile_plugin", source, {"hostile": "hostile_plugin"})
    return site


def diag_with(site: Path, *args, timeout_s="2", extra=None, **kw):
    env = {"PYTHONPATH": f"{REPO}:{site}", "DIAG_CHECK_TIMEOUT": timeout_s}
    env.update(extra or {})
    return run_diag(*args, env=env, **kw)


def crashed(report: dict) -> dict[str, dict]:
    return {f["id"]: f for f in report["findings"] if f["severity"] == "crashed"}


def test_a_check_holding_the_gil_in_c_code_is_stopped_at_the_limit(tmp_path):
    site = plugin_site(tmp_path, '''
        import re
        from diag.checks.api import check

        @check(id="hostile.regex", title="catastrophic regex")
        def regex(ctx):
            re.match(r"(a+)+$", "a" * 64 + "b")     # C code, never releases the GIL

        @check(id="hostile.ok", title="works")
        def ok(ctx):
            return ctx.passed("fine")
    ''')
    t0 = time.monotonic()
    r = diag_with(site, "check", "--from", str(failed_evidence(tmp_path)), "--format", "json",
                  "--fail-on", "never", cwd=tmp_path, timeout=240)
    elapsed = time.monotonic() - t0
    assert r.code == 0, r.stderr
    assert "Traceback" not in r.stderr
    c = crashed(r.json())
    assert "did not finish within 2 s" in c["hostile.regex"]["message"]
    ok = [f for f in r.json()["findings"] if f["id"] == "hostile.ok"]
    assert ok and ok[0]["severity"] == "pass"      # the check after it ran, in a new worker
    assert elapsed < 120


def test_os_exit_in_a_check_does_not_become_diags_exit_code(tmp_path):
    site = plugin_site(tmp_path, '''
        import os
        from diag.checks.api import check

        @check(id="hostile.exit", title="exits")
        def exit_(ctx):
            os._exit(0)
    ''')
    r = diag_with(site, "check", "--from", str(failed_evidence(tmp_path)), "--format", "json", cwd=tmp_path)
    assert r.code == 1, (r.code, r.stderr)          # the run's own verdict (run.failed) and the crash
    report = r.json()                                # stdout is the whole document
    msg = crashed(report)["hostile.exit"]["message"]
    assert "exited with code 0" in msg
    assert any(f["id"] == "run.failed" for f in report["findings"])


def test_printing_plugins_leave_json_and_sarif_stdout_data_only(tmp_path):
    site = plugin_site(tmp_path, '''
        import os, sys
        from diag.checks.api import check
        print("plugin says hello at import")
        os.write(1, b"raw bytes on fd 1\\n")

        @check(id="hostile.print", title="prints")
        def printer(ctx):
            print("progress: 50%")
            sys.stderr.write("a warning\\n")
            os.write(1, b"{not json\\n")
            return ctx.passed("fine")
    ''')
    ev = str(failed_evidence(tmp_path))
    r = diag_with(site, "check", "--from", ev, "--format", "json", "--fail-on", "never", cwd=tmp_path)
    assert r.code == 0, r.stderr
    report = json.loads(r.stdout)
    (f,) = [f for f in report["findings"] if f["id"] == "hostile.print"]
    assert f["severity"] == "pass" and "progress: 50%" in f["evidence"]["plugin_output"]
    assert "{not json" in f["evidence"]["plugin_output"]
    s = diag_with(site, "check", "--from", ev, "--format", "sarif", "--fail-on", "never", cwd=tmp_path)
    assert s.code == 0, s.stderr
    json.loads(s.stdout)
    assert "progress" not in s.stdout and "hello at import" not in s.stdout


def test_an_atexit_handler_that_sleeps_does_not_hold_diag(tmp_path):
    site = plugin_site(tmp_path, '''
        import atexit, time
        from diag.checks.api import check
        atexit.register(time.sleep, 600)

        @check(id="hostile.atexit", title="sleeps at exit")
        def c(ctx):
            atexit.register(time.sleep, 600)
            return ctx.passed("fine")
    ''')
    t0 = time.monotonic()
    r = diag_with(site, "check", "--from", str(failed_evidence(tmp_path)), "--format", "json",
                  "--fail-on", "never", cwd=tmp_path, timeout=300)
    assert r.code == 0, r.stderr
    assert time.monotonic() - t0 < 200      # the handler alone would take 600 s
    assert any(f["id"] == "hostile.atexit" and f["severity"] == "pass" for f in r.json()["findings"])


def test_a_check_past_the_memory_limit_is_crashed(tmp_path):
    site = plugin_site(tmp_path, '''
        from diag.checks.api import check

        @check(id="hostile.hog", title="hogs memory")
        def hog(ctx):
            block = bytearray(1 << 30)            # 1 GiB, past a 256 MiB limit
            return ctx.passed(f"{len(block)} bytes")
    ''')
    r = diag_with(site, "check", "--from", str(failed_evidence(tmp_path)), "--format", "json",
                  "--fail-on", "never", extra={"DIAG_CHECK_MEMORY": "256"}, cwd=tmp_path, timeout=240)
    assert r.code == 0, r.stderr
    msg = crashed(r.json())["hostile.hog"]["message"]
    assert "memory limit (256 MiB" in msg and "DIAG_CHECK_MEMORY" in msg
    bad = diag_with(site, "check", "--from", str(failed_evidence(tmp_path)), extra={"DIAG_CHECK_MEMORY": "lots"},
                    cwd=tmp_path)
    assert bad.code == 2 and "DIAG_CHECK_MEMORY" in bad.stderr and "Traceback" not in bad.stderr


def test_chdir_and_monkeypatching_in_a_plugin_do_not_reach_diag(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    site = plugin_site(tmp_path, f'''
        import json, os, sys
        from diag.checks.api import check

        @check(id="hostile.chdir", title="moves and patches")
        def c(ctx):
            os.chdir({str(elsewhere)!r})
            json.dumps = lambda *a, **k: "patched"
            sys.stdout.close()
            return ctx.passed("fine")
    ''')
    work = tmp_path / "work"
    work.mkdir()
    r = diag_with(site, "check", "--from", str(failed_evidence(tmp_path)), "--format", "json",
                  "--fail-on", "never", "-o", "out.json", cwd=work)
    assert r.code == 0, r.stderr
    assert (work / "out.json").is_file() and not (elsewhere / "out.json").exists()
    assert json.loads((work / "out.json").read_text())["findings"]
    assert os.listdir(elsewhere) == []
