"""JUnit XML: one testcase per finding; findings at or above --fail-on are failures, skipped
checks are skipped, crashed checks are errors."""
from __future__ import annotations

from xml.etree import ElementTree as ET

from diag.findings import FAIL_ON_LEVELS, Severity


def render_junit(evidence, findings, fail_on: str = "error") -> str:
    level = FAIL_ON_LEVELS.get(fail_on, 3)
    suite = ET.Element("testsuite", name="diag", tests=str(len(findings)))
    failures = errors = skipped = 0
    for f in findings:
        case = ET.SubElement(suite, "testcase", classname=f.id.split(".")[0], name=f.id)
        if f.severity is Severity.CRASHED:
            errors += 1
            ET.SubElement(case, "error", message=f.message).text = str(f.evidence.get("traceback", ""))
        elif f.severity is Severity.SKIPPED:
            skipped += 1
            ET.SubElement(case, "skipped", message=f.message)
        elif f.severity.rank >= level:
            failures += 1
            el = ET.SubElement(case, "failure", message=f.message, type=f.severity.value)
            el.text = "\n".join(x for x in (f.why, f.fix, f.snippet, str(f.location or "")) if x)
        else:
            ET.SubElement(case, "system-out").text = f"{f.severity.value}: {f.message}"
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    suite.set("skipped", str(skipped))
    return ET.tostring(suite, encoding="unicode")
