"""Broken plugins cannot take diag down: a check that hangs, exits, interrupts or raises, a plugin that
exits at import, and two packages declaring one check id each end as a `crashed` finding with the
reason, and diag prints its report. Also: the example plugin package under examples/ installs, is
listed by `diag checks` without being imported, and fires on a crafted Evidence."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import REPO, run_diag
from diag.findings import Severity
from diag.registry import Registry, run_one
from diag.testing import EvidenceBuilder, run_check


def make_plugin(site: Path, dist: str, module: str, source: str, entry_points: dict[str, str]) -> None:
    """A plugin installed the way pip leaves one: a module and its dist-info (METADATA, entry_points.txt)."""
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    eps = "\n".join(f"{k} = {v}" for k, v in entry_points.items())
    (info / "entry_points.txt").write_text(f"[diag.checks]\n{eps}\n")


def evidence_file(tmp_path: Path) -> Path:
    ev = EvidenceBuilder().cuda_training().steps(10, total_s=2.5, samples=8).build()
    p = tmp_path / "evidence.json"
    ev.save(p)
    return p


def diag_with(site: Path, *args: str, timeout_s: str = "2", **kw):
    return run_diag(*args, env={"PYTHONPATH": f"{REPO}:{site}", "DIAG_CHECK_TIMEOUT": timeout_s}, **kw)


def crashed(report: dict) -> dict[str, dict]:
    return {f["id"]: f for f in report["findings"] if f["severity"] == "crashed"}


PLUGIN = '''
import os, sys, time
from diag.checks.api import check

@check(id="bad.hang", title="hangs")
def hang(ctx):
    while True:
        time.sleep(0.05)

@check(id="bad.exit", title="exits")
def exit_(ctx):
    sys.exit(0)

@check(id="bad.interrupt", title="interrupts")
def interrupt(ctx):
    raise KeyboardInterrupt

@check(id="bad.raise", title="raises")
def raise_(ctx):
    return 1 / 0

@check(id="bad.ok", title="works")
def ok(ctx):
    return ctx.passed("fine")
'''


def test_hanging_exiting_interrupting_checks_are_crashed_findings(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    make_plugin(site, "bad-plugin", "bad_plugin", PLUGIN, {"bad": "bad_plugin"})
    t0 = time.monotonic()
    r = diag_with(site, "check", "--from", str(evidence_file(tmp_path)), "--format", "json", "--fail-on", "never",
                  cwd=tmp_path)
    elapsed = time.monotonic() - t0
    assert r.code == 0, r.stderr
    assert "Traceback" not in r.stderr
    report = r.json()
    c = crashed(report)
    assert "did not finish within 2 s" in c["bad.hang"]["message"]
    assert "SystemExit" in c["bad.exit"]["message"]
    assert "KeyboardInterrupt" in c["bad.interrupt"]["message"]
    assert "ZeroDivisionError" in c["bad.raise"]["message"]
    assert "bad-plugin" in c["bad.hang"]["fix"]
    ok = [f for f in report["findings"] if f["id"] == "bad.ok"]
    assert ok and ok[0]["severity"] == "pass" and ok[0]["title"] == "works"
    # the built-in checks ran too, and the hung check did not hold diag for long
    assert any(f["id"] == "run.failed" for f in report["findings"])
    assert elapsed < 60


def test_console_report_is_printed_after_a_crashing_plugin(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    make_plugin(site, "bad-plugin", "bad_plugin", PLUGIN, {"bad": "bad_plugin"})
    r = diag_with(site, "check", "--from", str(evidence_file(tmp_path)), "--select", "bad", cwd=tmp_path)
    assert r.code == 1, r.stderr                 # crashed ranks with errors: CI must not pass silently
    assert "Traceback" not in r.stderr
    assert "bad.exit" in r.stdout and "bad.interrupt" in r.stdout and "bad.hang" in r.stdout


@pytest.mark.parametrize("body,needle", [
    ("import sys\nsys.exit(0)\n", "SystemExit"),
    ("raise KeyboardInterrupt\n", "KeyboardInterrupt"),
    ("raise ImportError('no module named foo')\n", "ImportError: no module named foo"),
    ("import time\nwhile True:\n    time.sleep(0.05)\n", "importing it took longer than 2 s"),
])
def test_a_plugin_failing_at_import_is_a_crashed_finding(tmp_path, body, needle):
    site = tmp_path / "site"
    site.mkdir()
    make_plugin(site, "evil-plugin", "evil_plugin", body, {"evil": "evil_plugin"})
    r = diag_with(site, "check", "--from", str(evidence_file(tmp_path)), "--format", "json", cwd=tmp_path)
    assert r.code == 1, (r.code, r.stderr)
    assert "Traceback" not in r.stderr
    c = crashed(r.json())
    assert needle in c["diag.plugin-load"]["message"] and "evil-plugin" in c["diag.plugin-load"]["message"]


def test_listing_plugins_does_not_import_them(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    marker = tmp_path / "imported"
    make_plugin(site, "evil-plugin", "evil_plugin", f"open({str(marker)!r}, 'w').write('x')\nimport sys\nsys.exit(3)\n",
                {"evil.check": "evil_plugin"})
    r = diag_with(site, "checks", "--format", "json")
    assert r.code == 0, r.stderr
    rows = {row["id"]: row for row in json.loads(r.stdout)}
    assert rows["evil.check"]["source"] == "evil-plugin (evil.check)" and rows["evil.check"]["loaded"] is False
    assert not marker.exists()
    text = diag_with(site, "checks")
    assert text.code == 0 and "evil.check" in text.stdout and not marker.exists()


def test_duplicate_check_id_is_reported_naming_both_packages(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    src = '''
    from diag.checks.api import check

    @check(id="dup.same", title="first")
    def first(ctx):
        return ctx.passed("one")
    '''
    make_plugin(site, "alpha-plugin", "alpha_plugin", src, {"alpha": "alpha_plugin"})
    make_plugin(site, "beta-plugin", "beta_plugin", src.replace("first", "second"), {"beta": "beta_plugin"})
    # and one that reuses a built-in id
    make_plugin(site, "gamma-plugin", "gamma_plugin", src.replace("dup.same", "run.failed"), {"gamma": "gamma_plugin"})
    r = diag_with(site, "check", "--from", str(evidence_file(tmp_path)), "--format", "json", cwd=tmp_path)
    assert r.code == 1 and "Traceback" not in r.stderr
    dups = [f for f in r.json()["findings"] if f["id"] == "diag.plugin-duplicate"]
    msgs = " | ".join(f["message"] for f in dups)
    assert len(dups) == 2 and all(f["severity"] == "crashed" for f in dups)
    assert "'dup.same'" in msgs and "alpha-plugin (alpha)" in msgs and "beta-plugin (beta)" in msgs
    assert "'run.failed'" in msgs and "builtin" in msgs and "gamma-plugin (gamma)" in msgs
    # the built-in's own finding still comes from the built-in
    runs = [f for f in r.json()["findings"] if f["id"] == "run.failed"]
    assert len(runs) == 1 and runs[0]["title"] != "first"


def test_check_timeout_in_process_and_its_setting(monkeypatch):
    from diag.checks.api import check
    from diag.errors import DiagError
    from diag.registry import check_timeout

    @check(id="t.slow", title="slow")
    def slow(ctx):
        time.sleep(30)

    t0 = time.monotonic()
    (f,) = run_one(slow, EvidenceBuilder().build(), timeout=0.3)
    assert f.severity is Severity.CRASHED and "did not finish within 0.3 s" in f.message
    assert time.monotonic() - t0 < 10
    monkeypatch.setenv("DIAG_CHECK_TIMEOUT", "0")
    assert check_timeout() is None
    monkeypatch.setenv("DIAG_CHECK_TIMEOUT", "7.5")
    assert check_timeout() == 7.5
    monkeypatch.setenv("DIAG_CHECK_TIMEOUT", "soon")
    with pytest.raises(DiagError, match="not a number of seconds"):
        check_timeout()


def test_preconditions_skip_with_their_reason_and_fill_id_title():
    from diag.checks.api import check, cuda_training, multi_rank

    @check(id="t.cuda", title="needs CUDA", requires=[cuda_training("it is about tensor cores.")])
    def needs_cuda(ctx):
        return ctx.finding(f"{len(ctx.models)} model(s) on CUDA")

    (f,) = run_check(needs_cuda, EvidenceBuilder().model(device="cpu").steps(3).build())
    assert f.severity is Severity.SKIPPED and f.message == "The model trains on cpu: it is about tensor cores."
    assert f.id == "t.cuda" and f.title == "needs CUDA" and f.evidence == {"devices": ["cpu"]}
    (g,) = run_check(needs_cuda, EvidenceBuilder().cuda_training().steps(3).build())
    assert g.severity is Severity.WARNING and g.message == "1 model(s) on CUDA" and g.check == "t.cuda"

    @check(id="t.multi", title="multi", requires=[multi_rank])
    def multi(ctx):
        return None

    (h,) = run_check(multi, EvidenceBuilder().build())
    assert h.severity is Severity.SKIPPED and "single-process" in h.message
    assert run_check(multi, EvidenceBuilder().rank(0, world_size=2).rank(1).build()) == []


# ---- the example package under examples/ ----------------------------------------------------------

EXAMPLE = REPO / "examples" / "diag-example-plugin"


@pytest.fixture(scope="module")
def example_site(tmp_path_factory):
    """pip-install examples/diag-example-plugin into a private directory (offline, no dependencies),
    so that the example is installed exactly as a user would, without touching the shared venv."""
    site = tmp_path_factory.mktemp("example-site")
    import importlib.util
    # offline when the venv has setuptools (the example's build backend); otherwise pip fetches it
    offline = ["--no-build-isolation", "--no-index"] if importlib.util.find_spec("setuptools") else []
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *offline,
                        "--disable-pip-version-check", "--target", str(site), str(EXAMPLE)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return site


def test_example_plugin_is_listed_and_fires(example_site, tmp_path):
    listing = diag_with(example_site, "checks", "--format", "json")
    assert listing.code == 0, listing.stderr
    rows = {row["id"]: row for row in json.loads(listing.stdout)}
    assert rows["example.slow-step"]["source"] == "diag-example-plugin (example.slow-step)"
    r = diag_with(example_site, "check", "--from", str(evidence_file(tmp_path)), "--select", "example",
                  "--format", "json", cwd=tmp_path, timeout_s="10")
    assert "Traceback" not in r.stderr, r.stderr
    (f,) = [f for f in r.json()["findings"] if f["id"] == "example.slow-step"]
    assert f["severity"] == "warning" and "2.50 s" in f["message"] and f["title"] == "Slow training steps"
    assert r.code == 0      # a warning does not fail the default --fail-on error


def test_example_plugin_own_tests_pass(example_site):
    env = {"PYTHONPATH": f"{REPO}:{example_site}"}
    import os
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(EXAMPLE / "tests")],
                       capture_output=True, text=True, timeout=300, env={**os.environ, **env}, cwd=EXAMPLE)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "2 passed" in p.stdout


def test_plugin_check_is_at_most_15_lines():
    src = (EXAMPLE / "src" / "diag_example_plugin" / "checks.py").read_text().strip().splitlines()
    assert len(src) <= 15
    assert Registry.discover(load_plugins=False) is not None


def test_the_guide_and_plugins_page_show_the_example_check():
    """The example check, as the repository has it, in the long guide (docs/guide.md: the README points
    there since it was made short, issue 30) and the plugins page."""
    code = (EXAMPLE / "src" / "diag_example_plugin" / "checks.py").read_text().strip()
    for doc in (REPO / "docs" / "guide.md", REPO / "docs" / "plugins.md"):
        text = doc.read_text()
        assert code.split("\n", 1)[1].strip() in text, f"{doc.name} does not show examples/.../checks.py as it is"


def test_a_bad_check_timeout_is_refused_before_anything_runs(tmp_path):
    r = run_diag("check", "--from", str(evidence_file(tmp_path)), env={"DIAG_CHECK_TIMEOUT": "-1"}, cwd=tmp_path)
    assert r.code == 2 and "Traceback" not in r.stderr
    assert "DIAG_CHECK_TIMEOUT='-1' must be a positive number of seconds" in r.stderr
