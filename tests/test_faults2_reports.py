"""Issue 27, classes 9, 12, 13 and 14: reports under a non-UTF-8 locale, onto a full stdout, from
crafted evidence (a NUL, a lone surrogate, raw ESC/BEL), and a report given to --from."""
from __future__ import annotations

import json
import subprocess
import sys
from xml.dom import minidom

import pytest

from conftest import run_diag
from faults_support import env
from diag.testing import EvidenceBuilder

BAD = "tr\u0000ain\ud800\x1b[31mred\x07.py"


@pytest.fixture
def crafted(tmp_path):
    ev = tmp_path / "good.json"
    EvidenceBuilder().cuda_training().steps(10, total_s=2.5, samples=8).build().save(ev)
    d = json.loads(ev.read_text())
    d["run"]["script"] = BAD
    d["run"]["stop_reason"] = BAD
    d["run"]["args"] = [BAD]
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(d))          # the lone surrogate is written as the escape \ud800
    return p


@pytest.mark.parametrize("fmt", ["text", "json", "sarif", "junit", "html"])
def test_crafted_strings_in_evidence_reach_every_format_safely(tmp_path, crafted, fmt):
    out = tmp_path / f"out.{fmt}"
    r = run_diag("check", "--from", str(crafted), "--format", fmt, "--fail-on", "never", "-o", str(out),
                 cwd=tmp_path)
    assert r.code == 0, r.stderr
    assert "Traceback" not in r.stderr
    data = out.read_bytes()
    assert data, "the -o file is empty"
    text = data.decode("utf-8")          # valid UTF-8 throughout
    if fmt in ("json", "sarif"):
        json.loads(text)
    if fmt == "junit":
        minidom.parseString(data)       # well-formed XML
    if fmt in ("html", "text"):
        assert "\x1b" not in text and "\x00" not in text and "\x07" not in text


def test_a_report_given_to_from_is_one_sentence(tmp_path):
    ev = tmp_path / "evidence.json"
    EvidenceBuilder().cuda_training().steps(10, total_s=2.5, samples=8).build().save(ev)
    r = run_diag("check", "--from", str(ev), "--format", "json", "--fail-on", "never", cwd=tmp_path)
    rep = tmp_path / "report.json"
    rep.write_text(r.stdout)
    for cmd in ("check", "attach"):
        b = run_diag(cmd, "--from", str(rep), cwd=tmp_path)
        assert b.code == 2, (b.code, b.stdout[-300:], b.stderr)
        assert "is a diag report, not evidence" in b.stderr and "Traceback" not in b.stderr


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_text_output_under_a_non_utf8_locale(tmp_path, encoding):
    ev = tmp_path / "evidence.json"
    EvidenceBuilder().cuda_training().steps(10, total_s=2.5, samples=8).build().save(ev)
    for args in (("check", "--from", str(ev), "--fail-on", "never", "-v"), ("checks",),
                 ("cost", "--params", "7B", "--tokens", "140B", "--gpu", "h100", "--count", "8")):
        p = subprocess.run([sys.executable, "-m", "diag", *args], capture_output=True, cwd=tmp_path,
                           env=env(PYTHONIOENCODING=encoding, LANG="C", LC_ALL="C"), timeout=120)
        out, err = p.stdout.decode(encoding), p.stderr.decode(encoding)
        assert p.returncode == 0, (args, err[-2000:])
        assert "UnicodeEncodeError" not in err and "Traceback" not in err
        assert out.strip()


def test_a_full_stdout_is_one_sentence(tmp_path):
    ev = tmp_path / "evidence.json"
    EvidenceBuilder().cuda_training().steps(10, total_s=2.5, samples=8).build().save(ev)
    for fmt in ("text", "json"):
        with open("/dev/full", "w") as full:
            p = subprocess.run([sys.executable, "-m", "diag", "check", "--from", str(ev), "--format", fmt,
                                "--fail-on", "never"], stdout=full, stderr=subprocess.PIPE, text=True,
                               env=env(), cwd=tmp_path, timeout=120)
        assert p.returncode == 2, p.stderr
        assert "cannot write the report to stdout: No space left on device" in p.stderr
        assert "Traceback" not in p.stderr
