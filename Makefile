# The README's two commands are `make demo` and `make test`; each sets up .venv on its own if it is missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.dlac-installed
PYTEST_ARGS ?=

.PHONY: venv demo test test-fast lint asan-fuzz clean-venv

venv: $(STAMP)

# Re-installs whenever a requirements file or pyproject.toml changes.
$(STAMP): requirements/cpu.txt requirements/torchrec.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements/cpu.txt
	$(BIN)/python -m pip install --quiet --no-deps -r requirements/torchrec.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	$(BIN)/python -c "import torch, fbgemm_gpu, torchrec, lightning_dlac; print('lightning-dlac environment ready: torch', torch.__version__)"
	touch $@

# 2-process CPU (gloo) training of the example DLRM on synthetic Criteo-like data through DLACStrategy.
demo: venv
	$(BIN)/dlac fit --config examples/configs/dlrm_synthetic.yaml

test: venv
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-fast: venv
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

# The native codec built with AddressSanitizer + UBSan, fuzzed with mutated buffers and random encodes (~1 min).
asan-fuzz: venv
	$(BIN)/python tests/codec/asan_fuzz.py --n 6000

lint: venv
	$(BIN)/python -m ruff check lightning_dlac examples tests benchmarks

clean-venv:
	rm -rf $(VENV)
