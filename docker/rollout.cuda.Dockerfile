# Rollout service, CUDA flavour: HF engine and vLLM with sleep mode. No NVIDIA base image: PyPI's torch and
# vLLM wheels carry the CUDA runtime (nvidia-* wheels), and the driver comes from the host through the NVIDIA
# container toolkit (`docker run --gpus all`). Build context: the repository root, after
# `docker/build_wheelhouse.sh cuda`.  docker build -f docker/rollout.cuda.Dockerfile -t grpo-services/rollout:cuda .
# The base is a full Python image (not -slim): Triton, which vLLM's CUDA kernels use, compiles its launcher
# with the system C compiler and Python headers at run time.
ARG BASE_IMAGE=python:3.11-bookworm

FROM ${BASE_IMAGE} AS build
COPY docker/wheelhouse-cuda /wheels
COPY docker/requirements /requirements
# Third-party dependencies first: this layer stays cached while only the project's code changes.
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --no-compile --no-index --find-links /wheels \
    -r /requirements/rollout-cuda.txt
COPY docker/dist /dist
RUN /opt/venv/bin/pip install --no-cache-dir --no-index --no-deps /dist/*.whl \
 && /opt/venv/bin/pip uninstall -y pip

FROM ${BASE_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="grpo-services rollout (cuda)" \
      org.opencontainers.image.description="GRPO rollout service: HF and vLLM engines on CUDA, sleep mode" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin grpo
COPY --from=build /opt/venv /opt/venv
COPY models/demo /opt/grpo/models/demo
# Readable by the non-root user whatever the modes in the build context. The runs volume's mount point is
# the service user's: Docker gives a new named volume the owner of the directory it is first mounted on.
RUN chmod -R a+rX /opt/grpo && install -d -o 10001 -g 10001 /var/lib/grpo/runs
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    HOME=/tmp HF_HOME=/tmp/hf HF_HUB_OFFLINE=1 NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001
EXPOSE 50052 9090
HEALTHCHECK --interval=10s --timeout=5s --start-period=180s --retries=3 \
    CMD ["python", "-m", "grpo_runtime.healthcheck", "--port", "50052"]
ENTRYPOINT ["python", "-m", "rollout_service"]
CMD ["--host", "0.0.0.0", "--port", "50052", "--metrics-port", "9090", "--model", "/opt/grpo/models/demo", "--engine", "vllm"]
