"""Crafted evidence files: every command that reads one (`check`, `cost`, `memory`, `tui` with --from)
answers a wrong type, `run: null`, deep nesting, /dev/zero, a directory, a newer schema or a string
schema_version with exit 2 and one sentence naming the file, the JSON path and the expected type —
never a traceback. Schema 1 files still load and give the findings they gave before."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from conftest import REPO, run_diag
from diag.errors import DiagError
from diag.evidence import SCHEMA_VERSION, Evidence, load_evidence
from diag.testing import EvidenceBuilder

FIXTURE_V1 = REPO / "tests" / "fixtures" / "tui" / "evidence.json"
V1_FINDINGS = REPO / "tests" / "fixtures" / "evidence_v1" / "findings.json"

COMMANDS = {
    "check": ["check", "--from"],
    "cost": ["cost", "--gpu", "h100", "--from"],
    "memory": ["memory", "--from"],
    "tui": ["tui", "--from"],
}


def base() -> dict:
    ev = EvidenceBuilder().cuda_training().steps(5, total_s=0.2, samples=8).dataloader().build()
    ev.primary.flops["measured"] = {"flops": 1e12, "model_flops": 1e12, "device": "cuda",
                                    "device_name": "NVIDIA A100-SXM4-80GB", "precision": "bf16", "step": 2}
    return json.loads(ev.to_json())


def assert_one_sentence(r, *needles):
    assert r.code == 2, (r.code, r.stdout[-500:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    lines = [l for l in r.stderr.strip().splitlines() if l.startswith("diag: error:")]
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


# Every top-level field with a wrong type, and the path + expected type the sentence must name.
TOP_LEVEL = [
    ("schema_version", "1", "schema_version is a string ('1'), expected an integer"),
    ("schema_version", 1.5, "schema_version is a number (1.5), expected an integer"),
    ("diag_version", 7, "diag_version is an integer (7), expected a string"),
    ("run", None, "run is null, expected an object (RunInfo)"),
    ("run", "done", "run is a string ('done'), expected an object (RunInfo)"),
    ("environment", [], "environment is a list, expected an object (Environment)"),
    ("ranks", {}, "ranks is an object, expected a list of RankEvidence"),
    ("gpu", "none", "gpu is a string ('none'), expected an object (GpuTelemetry)"),
    ("memory_plan", 3, "memory_plan is an integer (3), expected an object (MemoryPlan)"),
    ("notes", "x", "notes is a string ('x'), expected a list of strings"),
]


@pytest.mark.parametrize("field,value,needle", TOP_LEVEL, ids=[f"{f}={v!r}" for f, v, _ in TOP_LEVEL])
def test_wrong_type_in_every_top_level_field_in_process(field, value, needle):
    data = base()
    data[field] = value
    with pytest.raises(DiagError) as e:
        Evidence.from_dict(data, source="ev.json")
    assert needle in str(e.value) and "'ev.json'" in str(e.value)


NESTED = [
    (lambda d: d["ranks"][0]["steps"][2].__setitem__("total_s", "fast"),
     "ranks[0].steps[2].total_s is a string ('fast'), expected a number"),
    (lambda d: d["environment"]["devices"][0].__setitem__("total_memory", "80GB"),
     "environment.devices[0].total_memory is a string ('80GB'), expected an integer"),
    (lambda d: d["ranks"][0]["flops"]["measured"].__setitem__("flops", "many"),
     "ranks[0].flops.measured.flops is a string ('many'), expected a number"),
    (lambda d: d["ranks"][0]["memory"].__setitem__("device", {"total": [1]}),
     "ranks[0].memory.device.total is a list, expected an integer"),
    (lambda d: d["run"].__setitem__("status", 3), "run.status is an integer (3), expected a string"),
    (lambda d: d["ranks"][0]["step_stats"].__setitem__("count", 10 ** 30),
     "ranks[0].step_stats.count is an integer out of range, expected an integer within"),
    (lambda d: d["ranks"][0]["dataloaders"][0].__setitem__("num_workers", True),
     "ranks[0].dataloaders[0].num_workers is a boolean (true), expected an integer"),
    (lambda d: d["ranks"][0].__setitem__("flops", {"measured": "x"}),
     "ranks[0].flops.measured is a string ('x'), expected an object (FlopsMeasured)"),
    (lambda d: d["run"].__setitem__("wall_s", float("nan")), "run.wall_s is a number (nan), expected a finite number"),
]


@pytest.mark.parametrize("mutate,needle", NESTED, ids=[n.split(" is ")[0] for _, n in NESTED])
def test_wrong_types_deeper_name_the_json_path(mutate, needle, tmp_path):
    data = base()
    mutate(data)
    p = tmp_path / "evidence.json"
    p.write_text(json.dumps(data))
    with pytest.raises(DiagError) as e:
        load_evidence(p)
    assert needle in str(e.value), str(e.value)
    assert str(p) in str(e.value)


def write_cases(tmp_path: Path) -> dict[str, tuple[Path, list[str]]]:
    cases: dict[str, tuple[Path, list[str]]] = {}

    def put(name, data, *needles):
        p = tmp_path / f"{name}.json"
        p.write_text(data if isinstance(data, str) else json.dumps(data))
        cases[name] = (p, [str(p), *needles])

    for field, value, needle in TOP_LEVEL:
        d = base()
        d[field] = value
        put(f"top-{field}-{type(value).__name__}", d, needle)
    d = base()
    d["ranks"][0]["steps"][0]["total_s"] = "fast"
    put("step-string", d, "ranks[0].steps[0].total_s is a string")
    d = base()
    d["ranks"][0]["extras"]["events"] = {"x": json.loads("[" * 100 + "]" * 100)}
    put("deep-extras", d, "nested deeper than 64 levels")
    put("deep-100k", "[" * 100_000 + "]" * 100_000, "nested deeper than 64 levels")
    put("newer", {**base(), "schema_version": SCHEMA_VERSION + 1}, "newer than this diag")
    put("no-version", {k: v for k, v in base().items() if k != "schema_version"}, "has no schema_version")
    put("a-list", [1, 2], "does not hold a JSON object")
    (tmp_path / "emptydir").mkdir()
    cases["directory"] = (tmp_path / "emptydir", [str(tmp_path / "emptydir"), "is a directory with no evidence.json"])
    cases["dev-zero"] = (Path("/dev/zero"), ["/dev/zero", "is not a regular file"])
    return cases


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_reader_refuses_crafted_files_in_one_sentence(command, tmp_path):
    cases = write_cases(tmp_path)
    if command != "check":     # every case on `check`; the rest on a representative subset (speed)
        keep = {"top-run-NoneType", "top-schema_version-str", "top-ranks-dict", "top-gpu-str", "step-string",
                "deep-100k", "dev-zero", "directory", "newer"}
        cases = {k: v for k, v in cases.items() if k in keep}
    for name, (path, needles) in cases.items():
        r = run_diag(*COMMANDS[command], str(path), cwd=tmp_path, timeout=120)
        try:
            assert_one_sentence(r, *needles)
        except AssertionError as e:
            raise AssertionError(f"{command} --from {name}: {e}") from None


def test_schema_1_files_still_load_and_give_the_same_findings():
    from diag.findings import sort_findings
    from diag.registry import Registry

    ev = load_evidence(FIXTURE_V1)
    assert json.loads(FIXTURE_V1.read_text())["schema_version"] == 1
    assert ev.schema_version == SCHEMA_VERSION
    reg = Registry.discover(load_plugins=False)
    got = [f.to_dict() for f in sort_findings(reg.run(ev))]
    # checks added since diag 0.1 that judge only sampled evidence (diag attach: run.hung, attach.phases)
    # are skipped on this probe evidence by the registry; the rest must be exactly 0.1's findings
    attach_only = {s.id for s in reg.specs if "probe" not in s.judges}
    assert {"run.hung", "attach.phases"} <= attach_only
    assert all(f["severity"] == "skipped" for f in got if f["check"] in attach_only)
    got = [f for f in got if f["check"] not in attach_only]
    want = json.loads(V1_FINDINGS.read_text())
    # checks added since (gpu.idle needs a device timeline, probe.overhead the probe's own time: a
    # schema 1 file has neither) say so as skipped; every check 0.1 had gives exactly 0.1's findings
    known = {f["check"] for f in want}
    added = [f for f in got if f["check"] not in known]
    # (and the evaluation checks of issue 18 need evaluation steps, which a schema 1 file has not)
    # (issue 33's host.contention and inference.after-training judge what a schema 1 file has: the host's
    # CPU series and the forward sites with their first step; issue 29's sharded checks need a sharded run)
    assert {f["check"] for f in added} == {"gpu.idle", "probe.overhead", "eval.inference-mode", "eval.train-mode",
                                           "eval.small-batch", "eval.host-sync", "eval.amp", "host.contention",
                                           "inference.after-training", "sharded.exposed-comm",
                                           "sharded.mixed-precision", "sharded.cpu-offload"}
    judged_from_v1 = {"host.contention", "inference.after-training"}
    assert all(f["severity"] == "skipped" for f in added if f["check"] not in judged_from_v1), added
    assert all(f["severity"] == "pass" for f in added if f["check"] in judged_from_v1), added
    got = [f for f in got if f["check"] in known]
    assert [(f["id"], f["severity"]) for f in got] == [(f["id"], f["severity"]) for f in want]
    assert got == want


def test_saved_evidence_round_trips_with_typed_sections(tmp_path):
    data = base()
    ev = Evidence.from_dict(copy.deepcopy(data))
    m = ev.primary.flops.measured
    assert m.flops == 1e12 and m.device_name == "NVIDIA A100-SXM4-80GB" and ev.primary.flops.status is None
    assert ev.primary.memory.device is None and ev.gpu.devices is None
    p = tmp_path / "e.json"
    ev.save(p)
    again = load_evidence(p)
    assert again.to_dict() == ev.to_dict()
    assert json.loads(p.read_text())["schema_version"] == SCHEMA_VERSION
