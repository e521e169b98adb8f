#!/usr/bin/env bash
# GPU check: vLLM sleep/wake (levels 1 and 2, a weight push after each wake), a 4-bit QLoRA step, a bf16
# trainer with the vLLM engine and the IS correction, the NCCL weight push rate.
# (The cuda images are built and checked without a GPU: make images-cuda, scripts/check_cuda_images.py.)
#
#   scripts/gpu_check.sh            on a CUDA machine; results in bench/results/gpu_check.json (< 10 min)
#   scripts/gpu_check.sh --dry-run  the same steps on CPU (HF engine, unquantized, gloo, no image build);
#                                   results in runs/gpu_check/gpu_check.cpu.json
#
# PYTHON (default .venv/bin/python) needs CUDA torch 2.13.0, vllm, bitsandbytes and the project:
#   pip install torch==2.13.0 -e '.[reward,rollout,vllm-cuda,trainer,quantization]'
# BUDGET_S (default 570) bounds the whole run; each step prints PASS, FAIL or SKIP and the exit code is 1
# when a step failed. The step code is scripts/gpu_check.py (one subcommand per step).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-.venv/bin/python}
BUDGET_S=${BUDGET_S:-570}
device=cuda
out=bench/results/gpu_check.json
case "${1:-}" in
    "") ;;
    --dry-run) device=cpu; out=runs/gpu_check/gpu_check.cpu.json ;;
    *) echo "usage: $0 [--dry-run]" >&2; exit 2 ;;
esac
out=${OUT:-$out}

if [ "$device" = cuda ]; then
    command -v nvidia-smi >/dev/null || { echo "FAIL gpu_check: no nvidia-smi (use --dry-run on CPU)" >&2; exit 1; }
    "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
        || { echo "FAIL gpu_check: $PY has no CUDA torch" >&2; exit 1; }
fi
[ -f tests/assets/models/policy/config.json ] || "$PY" -m tiny_models --out tests/assets/models --kinds policy

# The Python side stops starting steps when its budget is spent; the outer timeout only catches a hang.
exec timeout --kill-after=10 $((BUDGET_S + 25)) \
    "$PY" scripts/gpu_check.py all --device "$device" --budget-s "$BUDGET_S" --out "$out"
