# shape-assembly-bench
#   make setup   create .venv/ (or use $(PYTHON)), install Vulkan/lavapipe, torch, the package
#   make test    run the test suite
#   make demo    run the scripted reference on a few A01 tries
# PYTHON=/usr/bin/python3 make setup   installs into that interpreter instead of .venv/

SHELL := /bin/bash
PYTHON ?=
PY := $(if $(strip $(PYTHON)),$(PYTHON),$(CURDIR)/.venv/bin/python)
PYTEST_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help setup test demo engines

help:
	@echo "Targets:"
	@echo "  make setup   idempotent setup: .venv/ (or PYTHON=...), Mesa lavapipe (root), torch if missing, pip install -e .[sim,export,jax,ray,dev]"
	@echo "  make test    setup, then $(PY) -m pytest -q"
	@echo "  make demo    setup, then the scripted reference on 3 A01 tries (dev split) -> runs/demo"
	@echo "  make engines setup, then ONNX exports and (with a GPU and TensorRT) engines -> build/engines"
	@echo "Variables:"
	@echo "  PYTHON=/usr/bin/python3   install into / run with this interpreter instead of .venv/"
	@echo "  PYTEST_ARGS='-k foo'      extra pytest arguments for make test"
	@echo "  SKIP_APT=1                skip the apt step of setup"

setup:
	@PYTHON="$(PYTHON)" bash scripts/setup.sh

# PYTEST_RC_FILE (env, used by .ci/run) receives pytest's own exit code,
# because make reports any failing recipe as exit status 2.
test: setup
	@$(PY) -m pytest -q $(PYTEST_ARGS); rc=$$?; \
	if [ -n "$${PYTEST_RC_FILE:-}" ]; then echo $$rc > "$$PYTEST_RC_FILE"; fi; \
	exit $$rc

demo: setup
	$(PY) -m eval.run --model scripted --split dev --setups A01 --tries 3 --out runs/demo

engines: setup
	$(PY) -m engines.build
