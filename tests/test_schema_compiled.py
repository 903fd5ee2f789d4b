"""The evidence's converters compiled once per type (diag/evidence/_schema.py ``_converter``) accept,
build and refuse exactly what the path-keeping walk (``_build``) does, and the JSON writer that walks
the objects without copying them writes what ``dataclasses.asdict`` + ``json.dumps`` wrote. The
runner folds every step event through the first and rewrites evidence.json with the second while
the user's job runs; the gain is measured in docs/performance.md (thirteenth pass)."""
from __future__ import annotations

import copy
import dataclasses
import json
import random
from pathlib import Path

import pytest

from diag.evidence import Evidence, SchemaError, StepRecord, build
from diag.evidence._schema import Section, _build
from diag.fold import fold

FIXTURE = Path(__file__).parent / "fixtures" / "tui" / "evidence.json"

# values of every JSON kind, and the edges the rules name (bool is not an int, whole floats are,
# int64's bounds, non-finite floats)
ODD_VALUES = [None, True, False, 0, 7, -3, 2.0, 2.5, 1 << 63, -(1 << 63), (1 << 63) - 1, float("inf"),
              float("nan"), "s", "", [], [1, "a"], {}, {"a": 1}, {"steps": []}]


def _shape(o):
    """``o`` with each object's class spelled out (a Section equals a plain dict under ==)."""
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return (type(o).__name__, {f.name: _shape(getattr(o, f.name)) for f in dataclasses.fields(o)})
    if isinstance(o, dict):
        return (type(o).__name__, {k: _shape(v) for k, v in o.items()})
    if isinstance(o, list):
        return ("list", [_shape(x) for x in o])
    if isinstance(o, float) and o != o:
        return ("float", "nan")
    return (type(o).__name__, o)


def _outcome(fn):
    try:
        return ("ok", _shape(fn()))
    except SchemaError as e:
        return ("error", str(e))
    except TypeError as e:
        return ("type-error", str(e))


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, prefix + (i,))


def _parent(data, path):
    node = data
    for k in path[:-1]:
        node = node[k]
    return node


def test_compiled_and_walked_agree_on_a_real_evidence_and_every_kind_of_wrong_value():
    data = json.loads(FIXTURE.read_text())
    assert _outcome(lambda: build(Evidence, data, "")) == _outcome(lambda: _build(Evidence, data, ""))
    paths = [p for p in _paths(data) if p]
    rng = random.Random(28)
    picked = rng.sample(paths, min(50, len(paths)))
    differing, refused = [], 0
    for path in picked:
        parent, key = _parent(data, path), path[-1]
        original = parent[key]
        for value in ODD_VALUES:
            parent[key] = copy.deepcopy(value)
            fast = _outcome(lambda: build(Evidence, data, ""))
            parent[key] = copy.deepcopy(value)
            slow = _outcome(lambda: _build(Evidence, data, ""))
            if fast != slow:
                differing.append((path, value, fast[0], slow[0], fast[1] if fast[0] != "ok" else slow[1]))
            refused += fast[0] != "ok"
        parent[key] = original
    assert not differing, differing[:3]
    assert refused > 40      # the mutations reached typed fields: the refusals were compared too


def test_the_error_names_the_path_of_the_first_mismatch():
    data = json.loads(FIXTURE.read_text())
    data["ranks"][0]["steps"][1]["total_s"] = "slow"
    with pytest.raises(SchemaError) as e:
        build(Evidence, data, "")
    assert e.value.path == "ranks[0].steps[1].total_s"
    assert "a string ('slow')" in str(e.value)


def test_a_step_event_builds_the_same_record_either_way():
    event = {"index": 12, "total_s": 0.02, "data_s": 0.001, "forward_s": 0.008, "backward_s": 0.009,
             "optimizer_s": 0.001, "other_s": 0.001, "samples": 32, "instrumented": False, "n_backward": 1}
    fast = build(StepRecord, dict(event), "StepRecord")
    assert _shape(fast) == _shape(_build(StepRecord, dict(event), "StepRecord"))
    assert fast.total_s == 0.02 and fast.index == 12
    event["samples"] = 32.0          # a whole float is an integer, as before
    assert build(StepRecord, event, "StepRecord").samples == 32
    assert type(build(StepRecord, event, "StepRecord").samples) is int


def test_sections_keep_their_class_and_undeclared_keys():
    data = json.loads(FIXTURE.read_text())
    ev = build(Evidence, data, "")
    sections = [v for r in ev.ranks for v in vars(r).values() if isinstance(v, Section)]
    assert sections and all(type(s) is not dict for s in sections)
    data["ranks"][0].setdefault("memory", {})["a_key_from_a_newer_probe"] = [1, 2]
    assert build(Evidence, data, "").ranks[0].memory["a_key_from_a_newer_probe"] == [1, 2]


def test_to_json_and_to_dict_write_what_asdict_wrote():
    ev = Evidence.from_dict(json.loads(FIXTURE.read_text()))
    for i in range(50):        # steps folded from events, as the runner does
        fold(ev, {"kind": "step", "rank": 0, "t": 1.0 + i, "step": 1000 + i, "total_s": 0.01,
                  "forward_s": 0.004, "backward_s": 0.005})
    ev.ranks[0].extras["a_tuple"] = (1, 2)
    ev.ranks[0].extras["a_set"] = {3}
    old = dataclasses.asdict(ev)
    assert _shape(ev.to_dict()) == _shape(old)
    expected = json.dumps(old, indent=1, default=lambda o: sorted(o) if isinstance(o, set) else str(o),
                          allow_nan=False)
    assert ev.to_json() == expected
    assert json.loads(ev.to_json(indent=None)) == json.loads(expected)
    assert "\n" not in ev.to_json(indent=None)
    back = Evidence.from_dict(json.loads(ev.to_json(indent=None)))
    assert _shape(back.to_dict()) == _shape(Evidence.from_dict(json.loads(expected)).to_dict())


def test_to_dict_is_a_copy():
    ev = Evidence.from_dict(json.loads(FIXTURE.read_text()))
    d = ev.to_dict()
    d["ranks"][0]["steps"].clear()
    d["ranks"][0]["extras"]["x"] = 1
    assert ev.ranks[0].steps and "x" not in ev.ranks[0].extras
