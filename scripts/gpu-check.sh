#!/usr/bin/env bash
# The GPU validation run: everything in diag that needs a real NVIDIA GPU, one summary, < 8 minutes on
# an H200. Results under $OUT when set (else ./gpu-check-out/): figures.json, summary.txt, logs/,
# reports/<workload>.json (diag check --format json of each workload), runs/ (evidence of each run).
#
#   scripts/gpu-check.sh --prepare   (here, with a network) download the pure-Python wheels diag and the
#                                    tests need into .gpu-wheels/ (ignored by git)
#   scripts/gpu-check.sh --dry-run   list what would run; exit 0 (works on a CPU machine)
#   scripts/gpu-check.sh [--only PART,...] [--twins NAME,...]   on the GPU machine: install nothing from the network (the
#                                    system's torch, the wheels of .gpu-wheels/ into .gpu-venv/), run
#
# With the device tool: run(command="scripts/gpu-check.sh", carry=[".gpu-wheels"]) after --prepare;
# everything comes back under $OUT. Parts (in this order): gpus twins try overhead mfu nvml_cost gpu_tests
# (try: `diag try --knob amp.bf16` on the fp32 twin amp_unused, the measured speed-up beside the predicted one).
# The whole run, install included, stops within 465 s (GPU_CHECK_TOTAL_S); each part has its own cap.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
WHEELS=.gpu-wheels
VENV=.gpu-venv
# what diag and its gpu tests import, besides torch (and numpy, which comes with it); setuptools/wheel
# build the editable install offline
PKGS=("textual==8.2.8" "rich>=13" "nvidia-ml-py>=12" "psutil>=5.9" "pytest>=8" "pytest-asyncio>=0.23"
      "setuptools>=77" "wheel" "exceptiongroup" "tomli" "typing_extensions")   # the last three: pytest and textual on Python 3.10

case "${1:-}" in
  --prepare)
    mkdir -p "$WHEELS"
    "$PY" -m pip download --only-binary=:all: -d "$WHEELS" "${PKGS[@]}" || {
      echo "gpu-check: pip download failed (network or index); $WHEELS is incomplete" >&2; exit 2; }
    # pure-Python builds of what pytest needs on an older Python than this one (tomli ships compiled ones too)
    "$PY" -m pip download --only-binary=:all: --no-deps --python-version 3.10 --implementation py --platform any \
      -d "$WHEELS" tomli exceptiongroup >/dev/null 2>&1 || true
    echo "gpu-check: $(ls "$WHEELS" | wc -l) wheels in $WHEELS ($(du -sh "$WHEELS" | cut -f1)); carry it: carry=[\"$WHEELS\"]" >&2
    exit 0 ;;
  --dry-run)
    shift
    exec "$PY" scripts/gpu_check.py --dry-run "$@" ;;
  -h|--help)
    sed -n '2,15p' "$0"; exit 0 ;;
esac

if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "gpu-check: no CUDA torch with a visible GPU for $PY; on a CPU machine use --dry-run" >&2
  exit 2
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv --system-site-packages "$VENV" || { echo "gpu-check: cannot create $VENV" >&2; exit 2; }
  # --system-site-packages shows the *base* interpreter's packages: where $PY is itself a virtual
  # environment (the GPU image's python3 is /opt/torch/.venv), its torch would stay out of sight
  "$PY" -c 'import site; print("\n".join(site.getsitepackages()))' \
    > "$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')/_gpu_check_parent.pth"
fi
if ! "$VENV/bin/python" -c 'import diag.checks.api, textual, pynvml, pytest' 2>/dev/null; then
  if [ ! -d "$WHEELS" ]; then
    echo "gpu-check: $WHEELS missing: run scripts/gpu-check.sh --prepare where there is a network, and carry it" >&2
    exit 2
  fi
  out="${OUT:-gpu-check-out}"
  mkdir -p "$out"
  "$VENV/bin/python" -m pip install -q --no-index --find-links "$WHEELS" -e . pytest pytest-asyncio \
    > "$out/install.log" 2>&1 || {
      echo "gpu-check: offline install failed; see $out/install.log" >&2; exit 2; }
fi
export PATH="$PWD/$VENV/bin:$PATH"
# under 8 minutes in all, the offline install included: what the install left of TOTAL_S goes to the parts
TOTAL_S="${GPU_CHECK_TOTAL_S:-465}"
left=$((TOTAL_S - SECONDS))
if [ "$left" -lt 120 ]; then
  echo "gpu-check: only ${left} s left of ${TOTAL_S} s after the install; nothing run" >&2
  exit 2
fi
exec timeout -k 5 "$left" "$VENV/bin/python" scripts/gpu_check.py --budget "$((left - 15))" "$@"
