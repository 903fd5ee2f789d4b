"""diag's benchmark: measures what the README promises (probe overhead, time to first finding,
memory-estimate cost, GPU sampler cost, TUI CPU cost, ...).

    .venv/bin/python bench/run.py                 # every section
    .venv/bin/python bench/run.py probe cost      # some sections
    .venv/bin/python bench/run.py --json out.json

Each section is a module ``bench/bench_<name>.py`` with ``run(results: dict) -> None`` that adds
its figures (plain numbers with units in the key names) to ``results[<name>]`` and prints a short
human summary as it goes.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def sections() -> dict[str, Path]:
    return {p.stem[len("bench_"):]: p for p in sorted(HERE.glob("bench_*.py"))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="sections to run (default: all): " + ", ".join(sections()))
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args()
    avail = sections()
    names = args.names or list(avail)
    unknown = [n for n in names if n not in avail]
    if unknown:
        print(f"bench: unknown section(s) {', '.join(unknown)}; available: {', '.join(avail)}", file=sys.stderr)
        return 2
    results: dict = {"machine": {"python": platform.python_version(), "platform": platform.platform(),
                                 "cpus": __import__("os").cpu_count()}}
    for name in names:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", avail[name])
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        results[name] = {}
        mod.run(results[name])
        print(f"   ({time.perf_counter() - t0:.1f} s)", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
