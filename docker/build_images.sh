#!/usr/bin/env bash
# Build the service images: `docker/build_images.sh [cpu|cuda]` (default cpu).
# cpu: BASE_IMAGE defaults to python:3.11-slim-bookworm when that image is present locally, else to
#      a local Debian base made by build_base.sh (no registry is needed). Images are tagged
#      grpo-services/{reward,rollout,trainer}:cpu (+ grpo-services/reward:cpu-slim without torch).
# cuda: needs BASE_IMAGE_CUDA (an NVIDIA CUDA runtime image with Python 3.11) and a CUDA wheelhouse;
#       see docker/*.cuda.Dockerfile.
set -euo pipefail
cd "$(dirname "$0")/.."

flavour=${1:-cpu}
docker info >/dev/null 2>&1 || { echo "no Docker daemon: start dockerd first (see README)" >&2; exit 1; }

if [ "$flavour" = cpu ]; then
    base=${BASE_IMAGE:-python:3.11-slim-bookworm}
    if ! docker image inspect "$base" >/dev/null 2>&1; then
        base=grpo-services/base:bookworm
        docker/build_base.sh "$base"
    fi
    # Images carry the hash of the sources they were built from; an image whose label matches is reused.
    source=$(git ls-files -z -- pyproject.toml gen grpo_runtime reward_service rollout_service \
        trainer_service tiny_models models/demo data/demo docker | xargs -0 sha256sum | sha256sum | cut -c1-16)
    current() { [ "$(docker image inspect -f '{{index .Config.Labels "grpo.source"}}' "$1" 2>/dev/null)" = "$source" ]; }
    prepared=0
    build() {  # tag dockerfile [build args...]
        local tag=$1 file=$2
        shift 2
        if current "$tag"; then
            echo "$tag is up to date"
            return
        fi
        if [ "$prepared" = 0 ]; then
            docker/build_wheelhouse.sh
            prepared=1
        fi
        echo "building $tag"
        # The build stage is tagged too: it holds the dependency layers the next build reuses, and a
        # tagged stage survives the prune of stale images below.
        docker build -q --network=none -f "$file" --build-arg BASE_IMAGE="$base" "$@" \
            --target build -t "$tag-build" . >/dev/null
        docker build -q --network=none -f "$file" --build-arg BASE_IMAGE="$base" --label "grpo.source=$source" \
            "$@" -t "$tag" . >/dev/null
    }
    build grpo-services/reward:cpu docker/reward.cpu.Dockerfile
    build grpo-services/reward:cpu-slim docker/reward.cpu.Dockerfile --build-arg EXTRA=reward-slim
    build grpo-services/rollout:cpu docker/rollout.cpu.Dockerfile
    build grpo-services/trainer:cpu docker/trainer.cpu.Dockerfile
    # Images replaced by these builds (untagged, several GB each) would otherwise fill the disk.
    docker image prune -f >/dev/null
    docker images --format '{{.Repository}}:{{.Tag}} {{.Size}}' 'grpo-services/*'
elif [ "$flavour" = cuda ]; then
    : "${BASE_IMAGE_CUDA:?set BASE_IMAGE_CUDA to an NVIDIA CUDA runtime image with Python 3.11}"
    for service in reward rollout trainer; do
        docker build -f "docker/$service.cuda.Dockerfile" --build-arg BASE_IMAGE="$BASE_IMAGE_CUDA" \
            -t "grpo-services/$service:cuda" .
    done
else
    echo "usage: $0 [cpu|cuda]" >&2
    exit 2
fi
