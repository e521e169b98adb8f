#!/usr/bin/env bash
# Build the local base image grpo-services/base:bookworm when no registry is reachable:
# a minimal Debian bookworm root filesystem (Python 3.11) made with debootstrap and imported.
# With a registry, the Dockerfiles' default BASE_IMAGE (python:3.11-slim-bookworm) is used instead.
#   docker/build_base.sh [IMAGE [PACKAGE...]]: extra Debian packages go into the root filesystem too (the
#   CUDA rollout and trainer images need a C compiler and Python headers: Triton builds its launcher at
#   run time, as the full python:3.11-bookworm image allows).
set -euo pipefail

IMAGE=${1:-grpo-services/base:bookworm}
if [ $# -gt 0 ]; then shift; fi
extra=$(IFS=,; echo "${*:-}")
if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    echo "$IMAGE exists"
    exit 0
fi
command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap; }

rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
# libnuma1: vLLM CPU loads libnuma.so.1; passwd: useradd for the non-root user.
debootstrap --variant=minbase \
    --include=python3,python3-venv,ca-certificates,libnuma1,passwd${extra:+,$extra} \
    bookworm "$rootfs" >/dev/null
# No package caches or lists in the image.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
# The python:3.11 images call the interpreter `python`; so do our entrypoints.
ln -sf /usr/bin/python3 "$rootfs/usr/bin/python"
tar -C "$rootfs" -c . | docker import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    - "$IMAGE"
echo "built $IMAGE"
