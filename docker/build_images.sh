#!/usr/bin/env bash
# Build the service images: `docker/build_images.sh [cpu|cuda]` (default cpu).
# cpu: BASE_IMAGE defaults to python:3.11-slim-bookworm when that image is present locally, else to
#      a local Debian base made by build_base.sh (no registry is needed). Images are tagged
#      grpo-services/{reward,rollout,trainer}:cpu (+ grpo-services/reward:cpu-slim without torch).
# cuda: grpo-services/{reward,rollout,trainer}:cuda from the same kind of base and PyPI's CUDA wheels
#       (docker/build_wheelhouse.sh cuda fetches about 6 GB once); scripts/check_cuda_images.sh checks them.
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
    # No NVIDIA base image: torch and vLLM bring the CUDA runtime as wheels (build/wheelhouse-cuda), the
    # driver comes from the host. The reward image takes the cpu images' base; rollout and trainer a base
    # with a C compiler and Python headers, which Triton needs at run time (python:3.11-bookworm, or a local
    # Debian one with gcc, libc6-dev and python3-dev).
    base=${BASE_IMAGE:-python:3.11-slim-bookworm}
    if ! docker image inspect "$base" >/dev/null 2>&1; then
        base=grpo-services/base:bookworm
        docker/build_base.sh "$base"
    fi
    compiler_base=${BASE_IMAGE_CUDA:-python:3.11-bookworm}
    if ! docker image inspect "$compiler_base" >/dev/null 2>&1; then
        compiler_base=grpo-services/base-compiler:bookworm
        docker/build_base.sh "$compiler_base" gcc libc6-dev python3-dev
    fi
    docker/build_wheelhouse.sh cuda
    # The build context: what the cuda Dockerfiles copy, hard-linked (no copy of the wheels).
    context=build/cuda-context
    rm -rf "$context"
    mkdir -p "$context/docker" "$context/models" "$context/data"
    cp -al build/wheelhouse-cuda "$context/docker/wheelhouse-cuda"
    cp -al docker/requirements docker/dist docker/debs "$context/docker/"
    cp -al models/demo "$context/models/demo"
    cp -al data/demo "$context/data/demo"
    for service in reward rollout trainer; do
        service_base=$compiler_base
        [ "$service" = reward ] && service_base=$base
        echo "building grpo-services/$service:cuda"
        docker build -q --network=none -f "docker/$service.cuda.Dockerfile" --build-arg BASE_IMAGE="$service_base" \
            -t "grpo-services/$service:cuda" "$context" >/dev/null
        # The build stage (the wheelhouse and a second copy of the venv, about 10 GB) is not kept.
        docker image prune -f >/dev/null
    done
    rm -rf "$context"
    docker images --format '{{.Repository}}:{{.Tag}} {{.Size}}' 'grpo-services/*:cuda'
else
    echo "usage: $0 [cpu|cuda]" >&2
    exit 2
fi
