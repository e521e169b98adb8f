#!/usr/bin/env bash
# Collect what the images install, so image builds run offline (`pip install --no-index`):
#   `docker/build_wheelhouse.sh [cpu|cuda]` (default cpu)
#   docker/wheelhouse/        cpu: third-party wheels for every extra (torch: this machine's CPU wheel)
#   build/wheelhouse-cuda/    cuda: the CUDA images' third-party wheels from PyPI (torch and vLLM carry the
#                             CUDA runtime as nvidia-* wheels), exactly the set docker/cuda_lock.sh pins
#                             in docker/requirements/cuda.lock; outside docker/ so that the cpu builds'
#                             context does not carry its 6 GB (build_images.sh cuda stages a context)
#                             (each rebuilt only when pyproject.toml changes, so image layers stay cached)
#   docker/requirements/*.txt the requirement list of each image's extra (from pyproject.toml)
#   docker/dist/              the project's own wheel, rebuilt every time (a cheap last layer)
#   docker/debs/              Debian packages the reward images install with dpkg (bubblewrap, the code
#                             sandbox, and its libcap2), fetched by this bookworm host's apt for the
#                             bookworm base images; fetched again only when one is missing
set -euo pipefail
cd "$(dirname "$0")/.."

flavour=${1:-cpu}
PY=${PY:-.venv/bin/python}
digest=$(sha256sum pyproject.toml | cut -d' ' -f1)
"$PY" docker/requirements.py --out docker/requirements
if [ "$flavour" = cpu ]; then
    stamp=docker/wheelhouse/.pyproject.sha256
    if [ "$(cat "$stamp" 2>/dev/null)" != "$digest" ]; then
        rm -rf docker/wheelhouse
        mkdir -p docker/wheelhouse
        "$PY" -m pip wheel -q --wheel-dir docker/wheelhouse 'torch==2.13.0' '.[reward,rollout,trainer,vllm]'
        rm -f docker/wheelhouse/grpo_services-*.whl
        echo "$digest" > "$stamp"
    fi
elif [ "$flavour" = cuda ]; then
    stamp=build/wheelhouse-cuda/.pyproject.sha256
    if [ "$(cat "$stamp" 2>/dev/null)" != "$digest" ]; then
        docker/cuda_lock.sh docker/requirements/cuda.lock
        rm -rf build/wheelhouse-cuda
        mkdir -p build/wheelhouse-cuda
        # --isolated and no PIP_FIND_LINKS/PIP_CONSTRAINT: this machine's pip configuration points at its
        # local CPU torch wheel and caps torch, neither of which is what the images install. The host is
        # the images' platform (linux x86_64, CPython 3.11), so sdists are built here for them.
        env -u PIP_FIND_LINKS -u PIP_CONSTRAINT "$PY" -m pip wheel --isolated -q --no-deps \
            --cert /etc/ssl/certs/ca-certificates.crt --wheel-dir build/wheelhouse-cuda \
            -r docker/requirements/cuda.lock
        echo "$digest" > "$stamp"
    fi
else
    echo "usage: $0 [cpu|cuda]" >&2
    exit 2
fi
debs=(bubblewrap libcap2)
for package in "${debs[@]}"; do
    if ! compgen -G "docker/debs/${package}_*.deb" >/dev/null; then
        rm -rf docker/debs
        mkdir -p docker/debs
        # A package list older than the mirror names versions it no longer has: refresh once on failure.
        (cd docker/debs && { apt-get download -qq "${debs[@]}" || { apt-get update -qq && apt-get download -qq "${debs[@]}"; }; })
        break
    fi
done
rm -rf docker/dist
"$PY" -m pip wheel -q --no-deps --wheel-dir docker/dist .
