#!/usr/bin/env python3
"""Run the do-no-harm harness (tests/dnh.py) over the whole corpus and print its table (markdown).

    .venv/bin/python scripts/do-no-harm.py            # every case
    .venv/bin/python scripts/do-no-harm.py hogwild    # the cases whose script name contains a word

Each case runs bare and under `diag check` (two processes at once); the table says, per script,
whether it behaved the same, and which comparisons do not apply and why. Exit 1 when any case differs."""
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import dnh  # noqa: E402


def main(argv: list[str]) -> int:
    cases = [c for c in dnh.CASES if not argv or any(w in c.script for w in argv)]
    results = []
    for case in cases:
        with tempfile.TemporaryDirectory(prefix="dnh-") as top:
            try:
                diffs = dnh.run_case(case, Path(top))
            except Exception as e:       # a timeout, a harness error: a row that says so
                diffs = [f"the harness failed: {type(e).__name__}: {e}"]
        results.append((case, diffs))
        print(f"{case.id}: {'same as bare' if not diffs else 'DIFFERS'}", file=sys.stderr, flush=True)
        for d in diffs:
            print("  " + d.replace("\n", "\n  "), file=sys.stderr)
    print(dnh.table(results))
    return 1 if any(d for _, d in results) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
