#!/usr/bin/env bash
# The GPU check: everything of the course that touches a device, run on one device in one command.
USAGE="usage: bash tools/gpu_check.sh [--device cuda|cpu] [--out DIR]

Runs, on DEVICE (default cuda), timing each step:
  1. the unit tests that touch devices (tests/test_device.py and the device tests of test_zoo.py and
     test_misuse_cli.py; the CUDA-only ones skip on a CPU)
  2. notebooks 00, 03 and 04 executed on DEVICE with the zoo (SPECDEC_DEVICE=DEVICE; run, not compared);
     the executed copies go to DIR/notebooks, the committed notebooks are not touched
  3. specdec-lab bench --device DEVICE on the zoo (8 prompts, greedy and sampled)  -> DIR/bench.json
  4. tools/gpu_costs.py: v(n) and c at batch 1 and 8 of a random Llama-3.1-8B target and Llama-3.2-1B
     draft in bf16, beside the roofline's prediction  -> DIR/costs.json
     (--device cpu: a dry run with the models scaled down, marked as such in the JSON)

DIR defaults to results/gpu-check/DEVICE. Under 10 minutes on one GPU; 9 to 13 on a shared 2-core CPU."
set -euo pipefail

DEVICE=cuda
OUT=
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) echo "$USAGE"; exit 0 ;;
    --device) [[ $# -ge 2 ]] || { echo "gpu_check.sh: --device needs a value: cuda or cpu" >&2; exit 2; }
              DEVICE="$2"; shift 2 ;;
    --device=*) DEVICE="${1#*=}"; shift ;;
    --out) [[ $# -ge 2 ]] || { echo "gpu_check.sh: --out needs a folder" >&2; exit 2; }
           OUT="$2"; shift 2 ;;
    --out=*) OUT="${1#*=}"; shift ;;
    *) echo "gpu_check.sh: unknown argument '$1'" >&2; echo "$USAGE" >&2; exit 2 ;;
  esac
done
case "$DEVICE" in
  cuda|cuda:[0-9]*|cpu) ;;
  *) echo "gpu_check.sh: --device '$DEVICE': use cuda (the GPU check) or cpu (its dry run)" >&2; exit 2 ;;
esac

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-results/gpu-check/${DEVICE%%:*}}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's specdec_lab, installed or not
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

# Before anything long: can this machine use DEVICE at all? (zoo.check_device's message says why not.)
python -c "import sys; from specdec_lab import zoo
try: zoo.check_device(sys.argv[1])
except ValueError as e: sys.exit(f'gpu_check.sh: --device {e}')" "$DEVICE"
mkdir -p "$OUT"

START=$SECONDS
TIMES=()
step() {  # step NAME COMMAND...: run it, print and keep its time
  local name="$1" t0=$SECONDS
  shift
  echo "=== $name  ($(date -u +%H:%M:%S) UTC)"
  "$@"
  TIMES+=("$(printf '%-10s %4d s' "$name" $((SECONDS - t0)))")
  echo "=== $name: $((SECONDS - t0)) s"
}

step tests python -m pytest -q -o addopts="" -p no:xdist -p no:cacheprovider tests/test_device.py \
  tests/test_zoo.py tests/test_misuse_cli.py -k "test_device or device or gpu or cuda"

run_notebooks() {
  mkdir -p "$OUT/notebooks"
  for nb in notebooks/00_*.ipynb notebooks/03_*.ipynb notebooks/04_*.ipynb; do
    local t0=$SECONDS
    SPECDEC_DEVICE="$DEVICE" jupyter nbconvert --to notebook --execute --output-dir "$OUT/notebooks" \
      --ExecutePreprocessor.timeout=900 "$nb"
    echo "  $(basename "$nb"): $((SECONDS - t0)) s"
  done
}
step notebooks run_notebooks

step bench python -m specdec_lab bench --device "$DEVICE" --limit 8 --json "$OUT/bench.json"

step costs python tools/gpu_costs.py --device "$DEVICE" --out "$OUT/costs.json"

echo
echo "GPU check on $DEVICE: $((SECONDS - START)) s in all"
printf '  %s\n' "${TIMES[@]}"
echo "results: $OUT/bench.json, $OUT/costs.json; executed notebooks: $OUT/notebooks/"
