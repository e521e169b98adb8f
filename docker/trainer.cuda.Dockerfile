# Trainer service, CUDA flavour: trl.GRPOTrainer in bf16, 4/8-bit QLoRA with bitsandbytes. No NVIDIA base
# image: PyPI's torch wheel carries the CUDA runtime (nvidia-* wheels), and the driver comes from the host
# through the NVIDIA container toolkit (`docker run --gpus all`). Build context: the repository root, after
# `docker/build_wheelhouse.sh cuda`.  docker build -f docker/trainer.cuda.Dockerfile -t grpo-services/trainer:cuda .
# A full Python image (not -slim): Triton (torch.compile, some bitsandbytes kernels) compiles its launcher
# with the system C compiler and Python headers at run time.
ARG BASE_IMAGE=python:3.11-bookworm

FROM ${BASE_IMAGE} AS build
COPY docker/wheelhouse-cuda /wheels
COPY docker/requirements /requirements
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --no-compile --no-index --find-links /wheels \
    -r /requirements/trainer-cuda.txt
COPY docker/dist /dist
RUN /opt/venv/bin/pip install --no-cache-dir --no-index --no-deps /dist/*.whl \
 && /opt/venv/bin/pip uninstall -y pip

FROM ${BASE_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="grpo-services trainer (cuda)" \
      org.opencontainers.image.description="GRPO trainer service: trl.GRPOTrainer with loss variants on CUDA" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin grpo
COPY --from=build /opt/venv /opt/venv
COPY models/demo /opt/grpo/models/demo
COPY data/demo /opt/grpo/data/demo
RUN chmod -R a+rX /opt/grpo && install -d -o 10001 -g 10001 /var/lib/grpo/runs
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    HOME=/tmp HF_HOME=/tmp/hf HF_HUB_OFFLINE=1 MPLCONFIGDIR=/tmp/matplotlib \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001
EXPOSE 50053 9090
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-m", "grpo_runtime.healthcheck", "--port", "50053"]
ENTRYPOINT ["python", "-m", "trainer_service"]
CMD ["--host", "0.0.0.0", "--port", "50053", "--metrics-port", "9090"]
