#!/usr/bin/env bash
# Collect what the images install, so image builds run offline (`pip install --no-index`):
#   docker/wheelhouse/        third-party wheels for every extra (torch: this machine's CPU wheel);
#                             rebuilt only when pyproject.toml changes, so image layers stay cached
#   docker/requirements/*.txt the requirement list of each image's extra (from pyproject.toml)
#   docker/dist/              the project's own wheel, rebuilt every time (a cheap last layer)
#   docker/debs/              Debian packages the reward image installs with dpkg (bubblewrap, the code
#                             sandbox, and its libcap2), fetched by this bookworm host's apt for the
#                             bookworm base images; fetched again only when one is missing
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
stamp=docker/wheelhouse/.pyproject.sha256
digest=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$digest" ]; then
    rm -rf docker/wheelhouse
    mkdir -p docker/wheelhouse
    "$PY" -m pip wheel -q --wheel-dir docker/wheelhouse 'torch==2.13.0' '.[reward,rollout,trainer,vllm]'
    rm -f docker/wheelhouse/grpo_services-*.whl
    echo "$digest" > "$stamp"
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
"$PY" docker/requirements.py --out docker/requirements
rm -rf docker/dist
"$PY" -m pip wheel -q --no-deps --wheel-dir docker/dist .
