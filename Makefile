# The README's two commands are `make demo` and `make test`; each sets up .venv on its own if it is missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.dlac-installed
PYTEST_ARGS ?=

.PHONY: venv demo test test-fast lint asan-fuzz cuda-check gpu-rehearsal clean-venv bench-smoke bench-quick bench render

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
	$(BIN)/python -m pytest -q --durations=15 $(PYTEST_ARGS)

test-fast: venv
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

# The native codec and the CUDA pipeline compiled for the host, built with AddressSanitizer + UBSan, fuzzed with
# mutated buffers, random encodes and the GPU session's memcheck workload (~3-5 min on 2 cores).
asan-fuzz: venv
	$(BIN)/python tests/codec/asan_fuzz.py --n 6000

# Compile-check the CUDA kernels without a GPU: CUDA builds of torch in .venv-cuda (requirements/cuda-check.txt) and
# .venv-cuda-image (torch 2.11.0+cu130, the lent GPU machine's image; requirements/cuda-check-image.txt), ~5 GB each,
# installed once; nvcc from CUDA_HOME or PATH, TORCH_CUDA_ARCH_LIST=9.0 unless set. Builds cuda_ext/ as the loader
# does on a GPU machine, once against each torch's headers (a few minutes each on 2 cores).
CUDA_VENV ?= .venv-cuda
CUDA_STAMP := $(CUDA_VENV)/.dlac-installed
CUDA_IMAGE_VENV ?= .venv-cuda-image
CUDA_IMAGE_STAMP := $(CUDA_IMAGE_VENV)/.dlac-installed
$(CUDA_STAMP): requirements/cuda-check.txt
	test -x $(CUDA_VENV)/bin/python || $(PYTHON) -m venv $(CUDA_VENV)
	$(CUDA_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(CUDA_VENV)/bin/python -m pip install --quiet -r requirements/cuda-check.txt
	touch $@
$(CUDA_IMAGE_STAMP): requirements/cuda-check-image.txt
	test -x $(CUDA_IMAGE_VENV)/bin/python || $(PYTHON) -m venv $(CUDA_IMAGE_VENV)
	$(CUDA_IMAGE_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(CUDA_IMAGE_VENV)/bin/python -m pip install --quiet -r requirements/cuda-check-image.txt
	touch $@

cuda-check: $(CUDA_STAMP) $(CUDA_IMAGE_STAMP)
	$(CUDA_VENV)/bin/python tests/codec/cuda_compile_check.py
	$(CUDA_IMAGE_VENV)/bin/python tests/codec/cuda_compile_check.py

# Rehearse benchmarks/gpu_session.sh without a GPU in an environment like the lent machine's image: .venv-cuda-image
# plus its test packages (requirements/cuda-check-rehearsal.txt), no TorchRec. Every stage runs what it can (compile
# check, test collection, benchmark and sanitizer workloads on the emulated pipeline) into benchmarks/results/
# gpu_session/, then the ways a real session must fail (a GPU torch cannot use, a parity fault, a sanitizer finding)
# with stand-ins (tests/benchmarks/test_gpu_session.py); docs/codec.md says what each stage does on the GPU.
REHEARSAL_STAMP := $(CUDA_IMAGE_VENV)/.dlac-rehearsal-installed
$(REHEARSAL_STAMP): $(CUDA_IMAGE_STAMP) requirements/cuda-check-rehearsal.txt
	$(CUDA_IMAGE_VENV)/bin/python -m pip install --quiet -r requirements/cuda-check-rehearsal.txt
	touch $@

gpu-rehearsal: $(REHEARSAL_STAMP)
	PATH=$(abspath $(CUDA_IMAGE_VENV))/bin:$$PATH bash benchmarks/gpu_session.sh
	PATH=$(abspath $(CUDA_IMAGE_VENV))/bin:$$PATH python -m pytest -q -p no:cacheprovider tests/benchmarks/test_gpu_session.py

# Every published figure from one command per depth (benchmarks/lib/plan.py lists the steps; docs/benchmarks.md says
# what each depth runs and how long it takes). Each writes benchmarks/results/*.json (tracked) and re-renders the
# figure blocks of README.md and docs/ from them (python -m benchmarks.render). Timings need a calm machine.
# bench-smoke proves the pipeline in minutes into a scratch directory (results and rendered copies), measuring nothing.
BENCH_STAMP := $(VENV)/.dlac-bench-installed
BENCH_SCRATCH ?= /tmp/dlac-bench-smoke
$(BENCH_STAMP): $(STAMP) benchmarks/requirements.txt
	$(BIN)/python -m pip install --quiet -r benchmarks/requirements.txt
	touch $@

bench-smoke: $(BENCH_STAMP)
	$(BIN)/python -m benchmarks.suite --depth smoke --results $(BENCH_SCRATCH) --render

bench-quick: $(BENCH_STAMP)
	$(BIN)/python -m benchmarks.suite --depth quick --render

bench: $(BENCH_STAMP)
	$(BIN)/python -m benchmarks.suite --depth full --render

# Re-render the figure blocks from the committed results files (tests/benchmarks/test_figures.py checks they agree).
render: venv
	$(BIN)/python -m benchmarks.render

lint: venv
	$(BIN)/python -m ruff check lightning_dlac examples tests benchmarks

clean-venv:
	rm -rf $(VENV) $(CUDA_VENV) $(CUDA_IMAGE_VENV)
