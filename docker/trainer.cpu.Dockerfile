# Trainer service, CPU flavour. Build context: the repository root, after docker/build_wheelhouse.sh.
#   docker build -f docker/trainer.cpu.Dockerfile -t grpo-services/trainer:cpu .
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
COPY docker/wheelhouse /wheels
COPY docker/requirements /requirements
# Third-party dependencies first: this layer stays cached while only the project's code changes.
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /wheels -r /requirements/trainer.txt
COPY docker/dist /dist
RUN /opt/venv/bin/pip install --no-cache-dir --no-index --no-deps /dist/*.whl \
 && /opt/venv/bin/pip uninstall -y pip

FROM ${BASE_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="grpo-services trainer" \
      org.opencontainers.image.description="GRPO trainer service: trl.GRPOTrainer with loss variants" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin grpo
COPY --from=build /opt/venv /opt/venv
COPY models/demo /opt/grpo/models/demo
COPY data/demo /opt/grpo/data/demo
# Readable by the non-root user whatever the modes in the build context. The runs volume's mount point is
# the service user's: Docker gives a new named volume the owner of the directory it is first mounted on.
RUN chmod -R a+rX /opt/grpo && install -d -o 10001 -g 10001 /var/lib/grpo/runs
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    HOME=/tmp HF_HOME=/tmp/hf HF_HUB_OFFLINE=1 MPLCONFIGDIR=/tmp/matplotlib
USER 10001
EXPOSE 50053 9090
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-m", "grpo_runtime.healthcheck", "--port", "50053"]
ENTRYPOINT ["python", "-m", "trainer_service"]
CMD ["--host", "0.0.0.0", "--port", "50053", "--metrics-port", "9090"]
