#!/usr/bin/env bash
# Run diag on its bundled demo (a training script with planted problems); sets itself up first.
#   scripts/demo.sh            the planted problems (text report)
#   scripts/demo.sh --clean    the clean twin
#   scripts/demo.sh --format json
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/diag demo "$@"
