"""diag try --format html: the what-if page (diag/report/try_html.py).

On synthetic trial results (fast): the table holds every trial and every knob not tried with its
verdict; each judged trial gets its step-time distribution beside its baseline's (a chart whose
shares sum to 1 per side); the winners' fixes are in the run's framework's words; hostile strings
stay text; a saved JSON report renders the same page. One real tiny run through the CLI, and a
headless-Chromium render where one is installed."""
from __future__ import annotations

import json

import numpy as np
import pytest

from diag.knobs import FRAMEWORK_NAMES
from diag.report.try_ import render
from diag.report.try_html import distribution, render_html
from diag.trial import judge as J
from diag.trial.engine import TryResult
from tests.conftest import run_diag
from tests.test_report_html import Page


def _side(mean_s: float, runs: int = 6, steps: int = 10, seed: int = 0, loss: float = 1.0) -> J.Side:
    rng = np.random.default_rng(seed)
    return J.Side(runs=[list(rng.normal(mean_s, mean_s * 0.05, steps).clip(mean_s * 0.5)) for _ in range(runs)],
                  losses=list(rng.normal(loss, 0.01, runs * steps)), samples=32.0)


def synthetic(framework: str | None = "transformers", script: str = "train.py") -> TryResult:
    base = _side(0.100, seed=1)
    workers = J.judge(J.Trial("dataloader.workers=4", "restart", knobs=["dataloader.workers=4"],
                              applied="num_workers 0 -> 4"), base, _side(0.040, seed=2))
    anomaly = J.judge(J.Trial("debug.anomaly", "switch", knobs=["debug.anomaly"]), base, _side(0.100, seed=3))
    bf16 = J.failed(J.Trial("amp.bf16", "switch", knobs=["amp.bf16"]), "the loss was NaN at step 7 with the knob on")
    res = TryResult(script=script, framework=framework, device="cpu",
                    trials=[workers, anomaly, bf16],
                    baseline={"median_step_s": 0.1, "steps": 40, "run_dir": "/tmp/x", "wall_s": 9.0},
                    not_tried=[{"knob": "amp.fp16", "verdict": "not applicable",
                                "why": "a GradScaler changes the script's backward and optimizer step"},
                               {"knob": "compile", "verdict": "left out", "why": "the budget had no room for 2 rounds"}],
                    notes=["the script ended before its blocks did"],
                    summary="dataloader.workers=4: 2.50x faster (2.30-2.70) in 60 steps, same loss curve",
                    elapsed_s=120.0, budget_s=300.0,
                    runs=[{"label": "baseline r1", "run_dir": "/tmp/r1", "wall_s": 9.0, "status": "ok",
                           "steps": 40, "clock": "wall"}],
                    directory=".diag/try/20260101", values={"batch_size": 32})
    return res


@pytest.fixture(scope="module")
def page_text():
    return render_html(synthetic())


def test_table_has_every_trial_and_every_knob_not_tried(page_text):
    p = Page(page_text)
    assert {"summary", "trials", "what-if", "fixes", "not-tried", "runs"} <= p.ids()
    text = " ".join(p.text)
    for knob in ("dataloader.workers=4", "debug.anomaly", "amp.bf16", "amp.fp16", "compile"):
        assert knob in text
    for verdict in ("faster", "no change", "broke", "not applicable", "left out"):
        assert verdict in text
    assert "2.50x faster (2.30-2.70)" in text                       # the summary line
    assert "a GradScaler changes the script's backward" in text     # why not applicable
    assert "the loss was NaN at step 7" in text                     # why broke
    assert "num_workers 0 -> 4" in text                              # what the probe applied
    arts = {a["id"]: a["data-verdict"] for a in p.find("article") if a.get("id", "").startswith("trial-")}
    assert arts == {"trial-dataloader.workers-4": "faster", "trial-debug.anomaly": "no change",
                    "trial-amp.bf16": "broke"}


def test_each_judged_trial_has_its_distribution_beside_its_baseline(page_text):
    p = Page(page_text)
    charts = p.data()["charts"]
    canvases = p.find("canvas")
    # the broke trial has no steps: no chart, a sentence instead
    assert len(canvases) == len(charts) == 2
    assert "No distribution: a side has no judged steps." in " ".join(p.text)
    for spec in charts.values():
        assert spec["type"] == "dist" and len(spec["sides"]) == 2
        assert len(spec["edges"]) == len(spec["sides"][0]["share"]) + 1
        for side in spec["sides"]:
            assert side["n"] == 60 and sum(side["share"]) == pytest.approx(1.0, abs=1e-3)
    # the faster knob's steps sit in lower bins than its baseline's
    spec = charts["try-dist-0"]
    centre = [(a + b) / 2 for a, b in zip(spec["edges"], spec["edges"][1:])]
    mean = [sum(c * s for c, s in zip(centre, side["share"])) for side in spec["sides"]]
    assert mean[1] < mean[0] * 0.6
    # the island keeps the report without the raw step times
    assert all("step_times" not in t for t in p.data()["try"]["trials"])


def test_the_winners_fix_is_in_the_frameworks_words():
    hf = Page(render_html(synthetic("transformers"))).text
    plain = Page(render_html(synthetic(None))).text
    assert "dataloader_num_workers" in " ".join(hf)              # TrainingArguments(dataloader_num_workers=4)
    assert f"The fix, in {FRAMEWORK_NAMES['transformers']}'s words" in " ".join(hf)
    assert "num_workers=4" in " ".join(plain) and "dataloader_num_workers" not in " ".join(plain)


def test_distribution_puts_a_stall_in_the_last_bin():
    d = distribution([0.01] * 50 + [5.0], [0.011] * 50)
    assert d["overflow"] is True and d["sides"][0]["share"][-1] > 0
    assert distribution([], [0.1]) is None
    assert distribution([0.1, float("nan")], [0.1]) is not None     # a NaN is dropped, not drawn


def test_saved_json_renders_the_same_page():
    res = synthetic()
    saved = json.loads(render(res, "json"))
    assert saved["trials"][0]["step_times"]["trial"]                  # the schema carries the step times
    assert render_html(saved) == render_html(res)


def test_hostile_strings_stay_text():
    res = synthetic(script='<script>document.body.dataset.pwned=1</script>.py')
    res.trials[2].why = '</article><img src=x onerror="alert(1)">'
    res.not_tried[0]["why"] = "<b>bold</b>"
    text = render_html(res)
    p = Page(text)
    assert not p.find("img")
    assert "<script>document" not in text and "<img" not in text and "<b>bold" not in text
    assert '</article><img src=x onerror="alert(1)">' in " ".join(p.text)   # shown, as text
    assert len([a for a, _ in p.scripts if a.get("id") != "diag-data"]) == 3


def test_empty_result_renders():
    p = Page(render_html(TryResult(script="t.py", summary="nothing to try: the findings point to no knob")))
    assert "No knob was tried" in " ".join(p.text) and p.data()["charts"] == {}


def test_cli_writes_html_from_a_real_tiny_run(tmp_path):
    """A real run: one switch knob over a tiny loop, the page written to -o, the text on stdout."""
    (tmp_path / "train.py").write_text(
        "import torch\nfrom torch import nn\n"
        "torch.manual_seed(0)\nm = nn.Linear(8, 2)\nopt = torch.optim.SGD(m.parameters(), lr=0.01)\n"
        "for i in range(80):\n"
        "    x = torch.randn(16, 8)\n    opt.zero_grad(set_to_none=False)\n"
        "    loss = m(x).pow(2).mean()\n    loss.backward()\n    opt.step()\n")
    out = tmp_path / "try.html"
    r = run_diag("try", "--script", "train.py", "--knob", "optim.set-to-none", "--steps", "10", "--budget", "60s",
                 "--format", "html", "-o", str(out), cwd=tmp_path, timeout=300)
    assert r.code == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    assert "summary:" in r.stdout and "<html" not in r.stdout.lower()
    p = Page(out.read_text())
    trials = p.data()["try"]["trials"]
    assert [t["knob"] for t in trials] == ["optim.set-to-none"]
    assert trials[0]["steps"] > 0 and trials[0]["verdict"] != "broke"
    assert len(p.find("canvas")) == 1 and p.data()["charts"]["try-dist-0"]["type"] == "dist"


def test_cli_refuses_a_bad_output_path(tmp_path):
    (tmp_path / "t.py").write_text("print(1)\n")
    r = run_diag("try", "--script", "t.py", "--format", "html", "-o", str(tmp_path / "no" / "x.html"), cwd=tmp_path)
    assert r.code == 2 and "cannot write the report" in r.stderr and "Traceback" not in r.stderr


@pytest.fixture(scope="module")
def chromium():
    from diag.report.browser import find_chromium

    path = find_chromium()
    if not path:
        pytest.skip("no headless Chromium here (scripts/setup.sh test installs it)")
    return path


def test_browser_renders_every_chart_without_errors(chromium, page_text, tmp_path):
    from diag.report.browser import render as browse

    path = tmp_path / "try.html"
    path.write_text(page_text)
    r = browse(path, chromium)
    assert r.errors == [] and r.console_errors == []
    assert r.body.get("data-rendered") == "ok"
    assert int(r.body["data-charts"]) == len(Page(page_text).find("canvas")) == 2


def test_nav_links_only_to_sections_on_the_page():
    """No winner: no fix section, and the nav does not point to one; every nav link has its target."""
    res = synthetic()
    res.trials = res.trials[1:]                       # no change and broke only
    res.not_tried = []
    p = Page(render_html(res))
    targets = [a["href"][1:] for a in p.find("a") if a.get("href", "").startswith("#")]
    assert "fixes" not in p.ids() and "fixes" not in targets
    assert set(targets) <= p.ids()
    assert "Notes" in p.text and "the script ended before its blocks did" in " ".join(p.text)
