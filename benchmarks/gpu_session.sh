#!/usr/bin/env bash
# Everything a lent GPU machine should run, in one go (the device tool's 15 minutes include its start-up):
# the CUDA environment, the CUDA tests, and the GPU codec benchmark. Results land in ${OUT:-benchmarks/results}.
#   bash benchmarks/gpu_session.sh
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
VENV=.venv-gpu
test -x $VENV/bin/python || python3 -m venv $VENV
$VENV/bin/python -m pip install --quiet --upgrade pip
$VENV/bin/python -m pip install --quiet -r requirements/cuda.txt
$VENV/bin/python -m pip install --quiet --no-deps -r requirements/torchrec.txt
$VENV/bin/python -m pip install --quiet --no-deps -e .
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
$VENV/bin/python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())" | tee -a "$OUT/gpu.txt"
# The CUDA kernels build on first use (~1 min); the tests marked cuda check parity, errors and device placement.
$VENV/bin/python -m pytest -q -m cuda tests 2>&1 | tee "$OUT/cuda_tests.txt"
$VENV/bin/python benchmarks/cuda_codec_bench.py --json-out "$OUT/cuda_codec_bench.json" 2>&1 | tee "$OUT/cuda_codec_bench.txt"
