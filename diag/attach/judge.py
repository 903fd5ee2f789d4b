"""The registry over sampled evidence.

Every check runs, as for ``diag check``. Then, for evidence with ``run.source == "attach"``:

* a finding under a usual id that an attach variant answered (``dataloader.workers`` from
  ``attach.dataloader-workers`` ...) replaces the probe check's finding under that id;
* checks that read only GPU telemetry (their ``needs`` all under ``gpu.``) keep their result: the
  telemetry was sampled during the window as in a probe run;
* every other check becomes ``skipped`` "not observable by sampling": it reads what only the probe
  inside the script records (step timings, forwards, optimizers, the allocator).

This filter belongs in the registry once checks declare what they observe (e.g. an ``observes=``
field on the check declaration); until then it lives here, and ``diag check --from`` calls it for
an attach file.
"""
from __future__ import annotations

from diag.findings import Finding, Severity

ATTACH_MODULE = "diag.checks.attach"
NOT_OBSERVABLE = "not observable by sampling"


def _observable_needs(needs: list[str]) -> bool:
    return bool(needs) and all(n == "gpu" or n.startswith("gpu.") for n in needs)


def _matches(fid: str, pattern: str) -> bool:
    pattern = pattern.rstrip(".*")
    return fid == pattern or fid.startswith(pattern + ".")


def judge(evidence, select=(), ignore=()) -> list[Finding]:
    from diag.attach.evidence import is_attach
    from diag.registry import Registry

    registry = Registry.discover()
    # validate the patterns against spec ids and finding ids alike (attach variants report usual ids)
    known = {s.id for s in registry.specs}
    for pattern in list(select) + list(ignore):
        if not any(_matches(k, pattern) for k in known):
            registry.select([pattern])   # raises the registry's one-sentence error
    findings = registry.run(evidence)
    if is_attach(evidence):
        specs = {s.id: s for s in registry.specs}
        attach_specs = {sid for sid, s in specs.items() if getattr(s.func, "__module__", "") == ATTACH_MODULE}
        answered = {f.id for f in findings if f.check in attach_specs}
        out = []
        done_skip: set[str] = set()
        for f in findings:
            spec = specs.get(f.check or f.id)
            if spec is None or f.check in attach_specs or f.severity is Severity.CRASHED and spec is None:
                out.append(f)
                continue
            if f.id in answered:
                continue
            if _observable_needs(spec.needs):
                out.append(f)
                continue
            if spec.id in done_skip:
                continue
            done_skip.add(spec.id)
            out.append(Finding(id=spec.id, severity=Severity.SKIPPED, title=spec.title,
                               message="Not observable by sampling (it reads "
                                       f"{', '.join(spec.needs) or 'what the probe records'}: diag check records it).",
                               check=spec.id, docs=spec.docs, evidence={"reason": NOT_OBSERVABLE}))
        findings = out
    if select:
        findings = [f for f in findings if any(_matches(f.id, p) or _matches(f.check or "", p) for p in select)]
    if ignore:
        findings = [f for f in findings if not any(_matches(f.id, p) or _matches(f.check or "", p) for p in ignore)]
    return findings
