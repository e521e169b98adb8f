#!/usr/bin/env bash
# Resolve the CUDA images' requirement sets together for their platform (linux x86_64, manylinux_2_28,
# CPython 3.11) from PyPI and write the pinned set: `docker/cuda_lock.sh [OUT]` (default: stdout only).
# uv resolves from package metadata alone, in seconds, without downloading the gigabytes of CUDA wheels, so
# `make lint` runs it to fail CI when a pin drifts out of what resolves (vLLM's torch pin, TRL's range, ...).
set -euo pipefail
cd "$(dirname "$0")/.."

UV=${UV:-.venv/bin/uv}
out=${1:-/dev/null}
# --no-config: this machine's uv/pip settings (local CPU torch, torch cap) do not apply to the images.
"$UV" pip compile --quiet --no-config --no-header --index-url https://pypi.org/simple \
    --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
    --extra reward --extra rollout --extra vllm-cuda --extra trainer --extra quantization \
    --output-file "$out" pyproject.toml
