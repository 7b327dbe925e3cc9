# shape-assembly-bench
#   make setup   create .venv/ (or use $(PYTHON)), install Vulkan/lavapipe, torch, the package
#   make test    run the test suite
#   make test-fast  the fast set (no scenes, no slow or browser tests): a few minutes, while working
#   make demo    run the scripted reference on a few A01 tries
# PYTHON=/usr/bin/python3 make setup   installs into that interpreter instead of .venv/

SHELL := /bin/bash
PYTHON ?=
PY := $(if $(strip $(PYTHON)),$(PYTHON),$(CURDIR)/.venv/bin/python)
PYTEST_ARGS ?=
XDIST ?= -n 2 --dist loadfile

.DEFAULT_GOAL := help
.PHONY: help setup test test-fast demo engines lock

help:
	@echo "Targets:"
	@echo "  make setup   idempotent setup: .venv/ (or PYTHON=...), Mesa lavapipe (root), torch if missing, pip install -e .[sim,export,jax,ray,dev,remote,dataset]"
	@echo "  make test    setup, then $(PY) -m pytest -q $(XDIST) --durations=20 (XDIST='' for one process)"
	@echo "  make test-fast  setup, then the fast set: $(PY) -m pytest -q -m \"$(FAST_MARKERS)\" $(XDIST) (a few minutes)"
	@echo "  make demo    setup, the bc-state engine, then eval.orin on 2 dev tries of A01 and B01 -> runs/demo"
	@echo "  make lock    pin the installed versions into requirements/lock.txt (after make test passed)"
	@echo "  make engines setup, then Octo's released weights (Hugging Face cache, else downloaded), ONNX exports, their INT8 Q/DQ graphs (calibrated on recorded dev tries), instruction embeddings and (with a GPU and TensorRT) engines -> build/engines, the folder eval.orin/eval.run/eval.serve run from (--engines DIR)"
	@echo "Variables:"
	@echo "  PYTHON=/usr/bin/python3   install into / run with this interpreter instead of .venv/"
	@echo "  PYTEST_ARGS='-k foo'      extra pytest arguments for make test"
	@echo "  SKIP_APT=1                skip the apt step of setup"
	@echo "  UNLOCKED=1                make setup installs without requirements/lock.txt (upgrading; Jetson)"

setup:
	@PYTHON="$(PYTHON)" bash scripts/setup.sh

# PYTEST_RC_FILE (env, used by .ci/run) receives pytest's own exit code,
# because make reports any failing recipe as exit status 2.
# every test on two pytest-xdist workers (whole files each; XDIST='' runs it in one process), the 20 slowest named
test: setup
	@$(PY) -m pytest -q $(XDIST) --durations=20 $(PYTEST_ARGS); rc=$$?; \
	if [ -n "$${PYTEST_RC_FILE:-}" ]; then echo $$rc > "$$PYTEST_RC_FILE"; fi; \
	exit $$rc

# the fast set while working: no ManiSkill scenes, nothing marked slow, no browser (pytest.ini names the markers), on
# two pytest-xdist workers as make test; make test (CI) runs everything
FAST_MARKERS := not sim and not slow and not browser
test-fast: setup
	@$(PY) -m pytest -q -m "$(FAST_MARKERS)" $(XDIST) $(PYTEST_ARGS)

# the mission's command on the embedded default: the bc-state engine (ONNX; TensorRT where a GPU and
# TensorRT exist), then the device loop on 2 dev tries of two setups, with latency per query
demo: setup
	$(PY) -m engines.build --models bc-state --ort-precisions fp32
	$(PY) -m eval.orin --model bc-state --split dev --setups A01,B01 --tries 2 --out runs/demo --fresh

# pin what is installed now into requirements/lock.txt (run after make test passed)
lock:
	@PY="$(PY)" bash scripts/lock.sh

engines: setup
	$(PY) -m engines.build
