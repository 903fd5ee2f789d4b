#!/usr/bin/env bash
# Run diag's test suite; sets itself up first. Extra arguments go to pytest.
#
#   scripts/test.sh           the full suite: what CI runs (.ci/run), ~20-30 min on a 2-core machine
#   scripts/test.sh --fast    the fast tier for local work: everything but the end-to-end tests that
#                             start real training scripts (pytest -m "not slow"), a few minutes
#
# Tests that need a real GPU are marked gpu and skip without one. docs/testing.md has the tiers and
# their measured times.
set -uo pipefail
cd "$(dirname "$0")/.."
args=()
for a in "$@"; do
  if [ "$a" = "--fast" ]; then
    args+=(-m "not slow")
  else
    args+=("$a")
  fi
done
scripts/setup.sh test || exit $?
.venv/bin/python -m pytest ${args[@]+"${args[@]}"}
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$rc"
