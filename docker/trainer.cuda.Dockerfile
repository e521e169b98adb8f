# Trainer service, CUDA flavour. Build context: the repository root, with a CUDA wheelhouse in
# docker/wheelhouse (torch 2.13.0 CUDA build and the project wheel), made on a machine that may fetch it:
#   pip wheel --wheel-dir docker/wheelhouse torch==2.13.0 '.[trainer,quantization]'
#   docker build -f docker/trainer.cuda.Dockerfile -t grpo-services/trainer:cuda .
# Python 3.11 comes from the official Python image and is copied onto the NVIDIA runtime image
# (Ubuntu 24.04's glibc is newer than Debian bookworm's, so the interpreter runs unchanged).
ARG BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS python

FROM ${BASE_IMAGE} AS runtime
COPY --from=python /usr/local /usr/local
RUN ldconfig && useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin grpo

FROM runtime AS build
COPY docker/wheelhouse /wheels
RUN python3.11 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /wheels "grpo-services[trainer,quantization]" \
 && /opt/venv/bin/pip uninstall -y pip

FROM runtime
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="grpo-services trainer (cuda)" \
      org.opencontainers.image.description="GRPO trainer service on CUDA" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/venv /opt/venv
COPY models/demo /opt/grpo/models/demo
COPY data/demo /opt/grpo/data/demo
# Readable by the non-root user whatever the modes in the build context. The runs volume's mount point is
# the service user's: Docker gives a new named volume the owner of the directory it is first mounted on.
RUN chmod -R a+rX /opt/grpo && install -d -o 10001 -g 10001 /var/lib/grpo/runs
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    HOME=/tmp HF_HOME=/tmp/hf HF_HUB_OFFLINE=1
USER 10001
EXPOSE 50053 9090
HEALTHCHECK --interval=10s --timeout=5s --start-period=180s --retries=3 \
    CMD ["python", "-m", "grpo_runtime.healthcheck", "--port", "50053"]
ENTRYPOINT ["python", "-m", "trainer_service"]
CMD ["--host", "0.0.0.0", "--port", "50053", "--metrics-port", "9090"]
