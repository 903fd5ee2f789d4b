"""Shared by the corpus scripts: report what the script itself counted (the ground truth diag is
judged against) on one line of stderr, ``CORPUS_TRUTH {json}``. Only rank 0 (or a process that is not
part of a distributed job) reports."""
import json
import os
import sys


def report(**truth) -> None:
    if os.environ.get("RANK", "0") != "0":
        return
    print("CORPUS_TRUTH " + json.dumps(truth, sort_keys=True), file=sys.stderr, flush=True)
