# Reward service, CUDA flavour: PRMs, ORMs and generative judges on the GPU. No NVIDIA base image: PyPI's
# torch wheel carries the CUDA runtime (nvidia-* wheels), and the driver comes from the host through the
# NVIDIA container toolkit (`docker run --gpus all`). Build context: the repository root, after
# `docker/build_wheelhouse.sh cuda`.  docker build -f docker/reward.cuda.Dockerfile -t grpo-services/reward:cuda .
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
COPY docker/wheelhouse-cuda /wheels
COPY docker/requirements /requirements
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --no-compile --no-index --find-links /wheels \
    -r /requirements/reward-cuda.txt
COPY docker/dist /dist
RUN /opt/venv/bin/pip install --no-cache-dir --no-index --no-deps /dist/*.whl \
 && /opt/venv/bin/pip uninstall -y pip

FROM ${BASE_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="grpo-services reward (cuda)" \
      org.opencontainers.image.description="GRPO reward service: built-in rewards, code sandbox, PRM/ORM on CUDA" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY docker/debs /debs
RUN dpkg -i /debs/*.deb && rm -rf /debs \
 && useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin grpo
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    HOME=/tmp HF_HOME=/tmp/hf HF_HUB_OFFLINE=1 NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001
EXPOSE 50051 9090
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-m", "grpo_runtime.healthcheck", "--port", "50051"]
ENTRYPOINT ["python", "-m", "reward_service"]
CMD ["--host", "0.0.0.0", "--port", "50051", "--metrics-port", "9090"]
