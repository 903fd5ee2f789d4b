"""The JSON report (``diag check --format json``). Its schema is documented in docs/report-json.md
and versioned by ``schema_version``."""
from __future__ import annotations

import json

from diag import __version__
from diag.evidence import probe as probe_cost
from diag.findings import Severity, sort_findings

REPORT_SCHEMA_VERSION = 1


def summary(evidence, findings) -> dict:
    counts = {s.value: 0 for s in Severity}
    for f in findings:
        counts[f.severity.value] += 1
    r = evidence.primary if evidence.ranks else None
    med = r.median_step() if r else None
    own = probe_cost.of_evidence(evidence)
    return {
        "counts": counts,
        "steps": sum(x.step_stats.count for x in evidence.ranks),
        "step_time_median_s": round(med["total_s"], 6) if med else None,
        # the median of each phase (comm_s: DDP's collective wait, when there is any)
        "step_phases_median_s": ({k: round(v, 6) for k, v in med.items() if k.endswith("_s") and k != "total_s"}
                                 if med else None),
        "ranks": len(evidence.ranks),
        # what the run did and its evaluation throughput (README "Evaluation runs")
        "kind": evidence.run_kind(),
        "evaluation": _evaluation(r),
        # diag's probe's own time: share of the median step, seconds, by part (docs/performance.md)
        "probe": ({k: (round(v, 9) if isinstance(v, float) else v) for k, v in own.items()} if own else None),
    }


def _evaluation(r) -> dict | None:
    tp = r.eval_throughput() if r is not None else None
    if tp is None:
        return None
    share = r.eval_share()
    out = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in tp.items() if k != "phases"}
    out["median_phases_s"] = {k: round(v, 6) for k, v in (tp.get("phases") or {}).items()}
    out["passes"] = len(r.evaluations)
    out["share_of_training"] = round(share["share"], 6) if share else None
    return out


def report_dict(evidence, findings, exit_code: int, comparison=None) -> dict:
    """The report; strings keep their data but lose ANSI colour codes (captured from a script's
    output), and secret-looking script arguments are redacted (docs/reliability: redaction)."""
    from diag.compare.extract import export
    from diag.redact import redact_args
    from diag.sanitize import strip_ansi

    run = evidence.run
    out = {
        "schema_version": REPORT_SCHEMA_VERSION,
        "tool": {"name": "diag", "version": __version__},
        "run": {
            "id": run.id, "script": run.script, "args": redact_args(run.args), "status": run.status,
            "exit_code": run.exit_code, "wall_s": run.wall_s, "stop_reason": run.stop_reason,
            "run_dir": run.run_dir, "log": run.log_path,
            "evidence": (run.run_dir + "/evidence.json") if run.run_dir else None,
            "simulated_gpus": run.simulated_gpus,
        },
        "summary": summary(evidence, findings),
        "exit_code": exit_code,
        "findings": [f.to_dict() for f in sort_findings(findings)],
        "notes": evidence.notes,
        # what `diag compare` needs (every kept step's phases, memory peaks, MFU, the comparability
        # facts): a saved report is a complete baseline (docs/compare.md)
        "compare": export(evidence),
    }
    if comparison is not None:
        out["comparison"] = comparison.to_dict()
    return strip_ansi(out)


def render_json(evidence, findings, exit_code: int, comparison=None) -> str:
    return json.dumps(report_dict(evidence, findings, exit_code, comparison), indent=2, default=str)
