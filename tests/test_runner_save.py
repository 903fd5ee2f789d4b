"""How often a run rewrites evidence.json while it goes on: at most once a second, and less often as the
evidence grows, so that the rewriting takes at most 1% of one core (the makemore case: a 400-step
evidence cost ~28 ms of CPU a rewrite, a 2,000-step one ~0.1 s: rewritten every second, ~10% of a
core in diag's parent beside a training that uses every core)."""
from __future__ import annotations

import json

import pytest

import diag.runner as runner
from conftest import SCRIPTS


@pytest.fixture
def run(tmp_path):
    return runner.Run(runner.RunConfig(script=str(SCRIPTS / "spine_progress.py"), run_dir=str(tmp_path / "run"),
                                       gpu=False))


def _clock(monkeypatch, *values):
    it = iter(values)
    monkeypatch.setattr(runner, "_cpu", lambda: next(it))


@pytest.mark.parametrize("cost, every", [(0.001, 1.0), (0.028, 2.8), (0.1, 10.0), (0.5, 30.0)])
def test_the_next_rewrite_waits_a_hundred_times_what_this_one_cost(run, monkeypatch, cost, every):
    assert run._save_every == runner.SAVE_EVERY_S
    _clock(monkeypatch, 5.0, 5.0 + cost)
    run.save()
    assert run._save_every == pytest.approx(every)
    assert json.loads(run.evidence_path.read_text())["schema_version"] >= 2     # and it was written


def test_a_rewrite_that_fails_leaves_the_interval_as_it_was(run, monkeypatch):
    _clock(monkeypatch, 0.0, 0.2)
    run.save()
    assert run._save_every == pytest.approx(20.0)

    def full(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(run.evidence, "save", full)
    _clock(monkeypatch, 0.0)
    with pytest.raises(OSError):
        run.save(raise_errors=True)
    assert run._save_every == pytest.approx(20.0)


def test_a_real_rewrite_sets_an_interval_within_its_bounds(run):
    run.save()
    assert runner.SAVE_EVERY_S <= run._save_every <= runner.SAVE_MAX_S
    assert run.evidence_path.is_file()


def test_an_events_chunk_is_decoded_in_one_call_and_a_bad_line_costs_only_itself():
    from diag.runner import _decode_lines

    good = [{"kind": "step", "index": i, "total_s": 0.01} for i in range(3)]
    chunk = "".join(json.dumps(e) + "\n" for e in good).encode()
    assert _decode_lines(chunk) == good
    assert _decode_lines(b"\n\n") == []
    # half a line from a crashed writer, a line holding two values, text that is not JSON: each is
    # skipped alone, the good lines around them are kept
    bad = (json.dumps(good[0]) + "\n" + '{"kind": "st\n' + json.dumps(good[1]) + "\n" + "1, 2\n"
           + "not json\n" + json.dumps(good[2]) + "\n").encode()
    assert _decode_lines(bad) == good
    assert _decode_lines('{"text": "caf\u00e9 \u2028 x"}\n'.encode()) == [{"text": "caf\u00e9 \u2028 x"}]
