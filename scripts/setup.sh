#!/usr/bin/env bash
# Set up diag's virtual environment at .venv (idempotent; quick when already done).
#
#   scripts/setup.sh          runtime dependencies
#   scripts/setup.sh test     runtime + test dependencies (and, as root with apt, headless Chromium for
#                             the HTML report's browser test: scripts/install-browser.sh)
#   (both install the 'attach' extra: py-spy, for diag attach PID)
#
# torch: a torch that is already importable (for example a CUDA build in the Python you run this
# with) is kept: the venv then sees it through --system-site-packages. Otherwise the CPU build
# torch==2.13.0 is installed (override with DIAG_TORCH_SPEC, e.g. DIAG_TORCH_SPEC='torch==2.5.1', and
# pick the index with DIAG_TORCH_INDEX, e.g. https://download.pytorch.org/whl/cpu for a CPU-only build).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
PY="${PYTHON:-python3}"
VENV=.venv
stamp="$VENV/.diag-setup-$extras"
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ -x "$VENV/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
if ! command -v "$PY" >/dev/null; then
  echo "setup: $PY not found; install Python 3.10 or newer (or set PYTHON=/path/to/python3)" >&2
  exit 2
fi
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  echo "setup: diag needs Python 3.10 or newer; $PY is $("$PY" --version 2>&1)" >&2
  exit 2
fi
if [ ! -x "$VENV/bin/python" ]; then
  if "$PY" -c 'import torch' >/dev/null 2>&1; then
    echo "setup: keeping the torch already installed for $PY ($("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null))" >&2
    "$PY" -m venv --system-site-packages "$VENV"
  else
    "$PY" -m venv "$VENV"
  fi
fi
log="$VENV/setup.log"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
run_pip() {  # quiet on success; the whole log on failure
  if ! "${pip[@]}" "$@" >"$log" 2>&1; then
    grep -v "is ignored: it is neither" "$log" >&2
    echo "setup: pip install $* failed (log: $log)" >&2
    exit 1
  fi
}
if ! "$VENV/bin/python" -c 'import torch' >/dev/null 2>&1; then
  echo "setup: installing ${DIAG_TORCH_SPEC:-torch==2.13.0} (CPU build where no CUDA torch is present)" >&2
  if [ -n "${DIAG_TORCH_INDEX:-}" ]; then
    run_pip install --index-url "$DIAG_TORCH_INDEX" "${DIAG_TORCH_SPEC:-torch==2.13.0}"
  else
    run_pip install "${DIAG_TORCH_SPEC:-torch==2.13.0}"
  fi
fi
target=".[attach]"
[ "$extras" = "test" ] && target=".[test,attach]"
echo "setup: installing diag (editable) and its dependencies into $VENV" >&2
run_pip install -e "$target"
if [ "$extras" = "test" ]; then
  scripts/install-browser.sh || true    # the HTML report's browser test; skipped without a browser
fi
echo "$want" > "$stamp"
