# Reward service, CPU flavour. Build context: the repository root, after docker/build_wheelhouse.sh
# (wheelhouse, requirements, project wheel and the bubblewrap .debs in docker/debs).
#   docker build -f docker/reward.cpu.Dockerfile --build-arg EXTRA=reward -t grpo-services/reward:cpu .
# EXTRA=reward-slim builds the slim flavour without torch (rule rewards and the code sandbox, no PRM/ORM).
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
ARG EXTRA=reward
COPY docker/wheelhouse /wheels
COPY docker/requirements /requirements
# Third-party dependencies first: this layer stays cached while only the project's code changes.
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /wheels -r "/requirements/${EXTRA}.txt"
COPY docker/dist /dist
RUN /opt/venv/bin/pip install --no-cache-dir --no-index --no-deps /dist/*.whl \
 && /opt/venv/bin/pip uninstall -y pip

FROM ${BASE_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="grpo-services reward" \
      org.opencontainers.image.description="GRPO reward service: built-in rewards, code sandbox, PRM/ORM" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
# bubblewrap (bwrap) builds the code sandbox; offline from docker/debs like the wheels. Programs run with the
# base image's python3 (what /opt/venv/bin/python links to), seen read-only inside the sandbox.
COPY docker/debs /debs
RUN dpkg -i /debs/*.deb && rm -rf /debs \
 && useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin grpo
COPY --from=build /opt/venv /opt/venv
# HOME=/tmp: the root filesystem is read-only at run time; /tmp is the writable scratch volume.
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    HOME=/tmp HF_HOME=/tmp/hf HF_HUB_OFFLINE=1
USER 10001
EXPOSE 50051 9090
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-m", "grpo_runtime.healthcheck", "--port", "50051"]
ENTRYPOINT ["python", "-m", "reward_service"]
CMD ["--host", "0.0.0.0", "--port", "50051", "--metrics-port", "9090"]
