#!/usr/bin/env bash
# Everything a lent GPU machine should run, in one call that fits its limits (about 9 minutes of a 10-minute command):
#   run(command="bash benchmarks/gpu_session.sh", timeout_s=600)
#
# It uses the image's python3 as it is (torch 2.11.0+cu130, lightning, pytest, pytest-timeout, hypothesis, ninja,
# nvcc 13.0, compute-sanitizer; no TorchRec, no fbgemm, no network): no venv, no pip. Five stages fail
# independently, each under its own timeout, each writing its own file under $OUT:
#   1 environment report   1_env.txt          GPU, driver, python, torch, nvcc, compute-sanitizer
#   2 native build         2_build.txt        the JIT build of cuda_ext/ with its CUDA kernels (sm_90); without a
#                                             GPU, the same sources compile-checked (tests/codec/cuda_compile_check.py)
#   3 CUDA tests           3_tests.txt        pytest -m cuda tests/codec (the tests that collect without TorchRec)
#   4 benchmark            4_bench.txt/.json  benchmarks/cuda_codec_bench.py, rows flushed and saved as measured
#   5 memcheck             5_memcheck.txt     compute-sanitizer memcheck of one encode/decode
# and a summary, printed LAST (only the tail of the output comes back) and saved as 0_summary.txt. Stages that need
# a GPU report "no device" without one. The exit status is non-zero only for real failures (a stage that failed or
# timed out with a GPU present, a build or compile check that failed anywhere).
#
# Rehearsal without a GPU: PATH=/path/to/venv-with-torch-2.11/bin:$PATH bash benchmarks/gpu_session.sh
set -uo pipefail  # no -e: a failing stage is recorded and the next one still runs
cd "$(dirname "$0")/.."
REPO=$PWD
OUT=${OUT:-$REPO/benchmarks/results/gpu_session}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BUDGET_S=${DLAC_SESSION_BUDGET_S:-540}
export PYTHONUNBUFFERED=1
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export DLAC_EXTENSION_DIR=${DLAC_EXTENSION_DIR:-/tmp/dlac_extensions}
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}  # the H200 only: one architecture builds fastest
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
if [ -z "${CUDA_HOME:-}" ] && command -v nvcc >/dev/null; then
  # nvcc on PATH may be a wrapper script that execs the toolkit's nvcc: take the toolkit it names, if any.
  real_nvcc=$(grep -o '/[^ "]*/bin/nvcc' "$(command -v nvcc)" 2>/dev/null | head -1)
  [ -x "${real_nvcc:-}" ] || real_nvcc=$(readlink -f "$(command -v nvcc)")
  CUDA_HOME=$(dirname "$(dirname "$real_nvcc")")
  export CUDA_HOME
fi

# compute-sanitizer: on PATH, else where CUDA toolkits keep it.
SANITIZER=$(command -v compute-sanitizer || true)
for candidate in "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" \
  "${CUDA_HOME:-/usr/local/cuda}/compute-sanitizer/compute-sanitizer"; do
  if [ -z "$SANITIZER" ] && [ -x "$candidate" ]; then SANITIZER=$candidate; fi
done

START=$(date +%s)
STAGES=()
FAILED=0
if "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
  GPU=1
else
  GPU=0
fi

# Seconds a stage may take: its cap, or what is left of the budget less 15 s for the summary.
budget() {
  local left=$((START + BUDGET_S - $(date +%s) - 15))
  if [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}

# stage NAME FILE CAP GPU_MODE COMMAND...: run COMMAND under timeout, output to FILE, record the outcome. GPU_MODE 0:
# runs anywhere; 1: runs anywhere, and exit status 2 without a GPU means "no device"; 2: not run without a GPU.
stage() {
  local name=$1 file=$2 cap=$3 needs_gpu=$4
  shift 4
  local limit t0 rc status
  limit=$(budget "$cap")
  if [ "$needs_gpu" = 2 ] && [ "$GPU" = 0 ]; then
    echo "no device: torch.cuda.is_available() is False; $name not run" >"$OUT/$file"
    STAGES+=("$name|no device|0|$file")
    return
  fi
  if [ "$limit" -lt 10 ]; then
    echo "skipped: the session budget (${BUDGET_S} s) is spent" >"$OUT/$file"
    STAGES+=("$name|SKIPPED (out of time)|0|$file")
    FAILED=1
    return
  fi
  echo "== $name (timeout ${limit} s) -> $OUT/$file"
  t0=$(date +%s)
  if declare -F "$1" >/dev/null; then
    # timeout runs programs, not shell functions: run the function in a child bash that inherits it (export -f).
    timeout --kill-after=10 "$limit" bash -c "$1" >"$OUT/$file" 2>&1
  else
    timeout --kill-after=10 "$limit" "$@" >"$OUT/$file" 2>&1
  fi
  rc=$?
  if [ "$rc" = 0 ]; then
    status=ok
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    status="TIMEOUT after ${limit} s"
    FAILED=1
  elif [ "$rc" = 2 ] && [ "$GPU" = 0 ] && [ "$needs_gpu" = 1 ]; then
    status="no device"
  else
    status="FAILED (exit $rc)"
    FAILED=1
  fi
  STAGES+=("$name|$status|$(($(date +%s) - t0))|$file")
  tail -n 3 "$OUT/$file" | sed 's/^/   /'
}

env_report() {
  echo "date: $(date -u +%FT%TZ)  host: $(hostname)  cpus: $(nproc)"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  else
    echo "nvidia-smi: not found"
  fi
  echo "python3: $(command -v "$PY") ($("$PY" --version 2>&1))"
  "$PY" - <<'EOF'
import importlib.util
import torch
print(f"torch {torch.__version__}, CUDA build {torch.version.cuda}, cuda available {torch.cuda.is_available()}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"device {p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB")
for name in ("lightning", "torchrec", "fbgemm_gpu", "pytest", "pytest_timeout", "hypothesis", "numpy", "ninja"):
    print(f"{name}: {'present' if importlib.util.find_spec(name) else 'absent'}")
EOF
  echo "CUDA_HOME=${CUDA_HOME:-unset} TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST MAX_JOBS=$MAX_JOBS"
  if command -v nvcc >/dev/null; then nvcc --version | tail -n 2; else echo "nvcc: not found"; fi
  if [ -n "$SANITIZER" ]; then
    echo "compute-sanitizer: $SANITIZER"
    "$SANITIZER" --version | head -n 2
  else
    echo "compute-sanitizer: not found"
  fi
}

build() {
  if [ "$GPU" = 1 ]; then
    "$PY" - <<'EOF'
import time
from lightning_dlac.codec import _loader
from lightning_dlac.codec.api import device_kernels
start = time.perf_counter()
_loader.load_native()
assert device_kernels("cuda"), "built, but without CUDA kernels"
print(f"native library with CUDA kernels built and loaded in {time.perf_counter() - start:.0f} s")
EOF
  else
    echo "no device: compile-checking the CUDA sources instead (no kernel runs)"
    "$PY" tests/codec/cuda_compile_check.py --arch "$TORCH_CUDA_ARCH_LIST"
  fi
}

memcheck_workload() {
  cat >/tmp/dlac_memcheck.py <<'EOF'
# One encode and decode of a small all-to-all grid on the GPU (every mode), checked against the CPU kernels.
import torch
from lightning_dlac.codec import _loader
_loader.load_native()
g = torch.Generator().manual_seed(0)
x = (torch.randn(200, 64, generator=g) * 0.05)[torch.randint(0, 200, (2048,), generator=g)]
x[:, 48:56] = torch.randn(2048, 8, generator=g)
x[:, 56:] = 1.5
rs, cs, b = [0, 1024, 2048], [0, 32, 48, 56, 64], torch.tensor([0.01, 0.05, 0.0, 0.01])
p, s = torch.ops.dlac.encode_grid(x.cuda(), rs, cs, b, True)
out = torch.ops.dlac.decode_grid(p, s.cpu(), rs, cs)
torch.cuda.synchronize()
want, want_sizes = torch.ops.dlac.encode_grid(x, rs, cs, b, True)
assert torch.equal(p.cpu(), want), "GPU payload differs from the CPU kernels'"
assert torch.equal(out.cpu(), torch.ops.dlac.decode_grid(want, want_sizes, rs, cs))
print("memcheck workload: encode and decode done, bytes equal to the CPU kernels'")
EOF
  if [ -z "$SANITIZER" ]; then
    echo "compute-sanitizer: not found"
    return 1
  fi
  "$SANITIZER" --tool memcheck --error-exitcode 3 --report-api-errors no "$PY" /tmp/dlac_memcheck.py
}

export PY GPU SANITIZER
export -f env_report build memcheck_workload
stage "1 environment" 1_env.txt 60 0 env_report
stage "2 native build" 2_build.txt 240 0 build
# Run without a GPU too: collecting the CUDA tests on an image without TorchRec is itself what is checked (they skip).
timeout_flag=()
if "$PY" -c "import pytest_timeout" >/dev/null 2>&1; then timeout_flag=(--timeout=240); fi
stage "3 CUDA tests" 3_tests.txt 180 0 "$PY" -m pytest -q -m cuda tests/codec -p no:cacheprovider "${timeout_flag[@]}"
stage "4 benchmark" 4_bench.txt 150 1 "$PY" benchmarks/cuda_codec_bench.py --repeat 10 --json-out "$OUT/4_bench.json"
stage "5 memcheck" 5_memcheck.txt 120 2 memcheck_workload

summary() {
  echo "================ GPU session summary ($(($(date +%s) - START)) s of ${BUDGET_S}; GPU: $([ "$GPU" = 1 ] && echo yes || echo no)) ================"
  printf '%-16s %-28s %6s  %s\n' stage status seconds file
  local s
  for s in "${STAGES[@]}"; do
    IFS='|' read -r name status secs file <<<"$s"
    printf '%-16s %-28s %6s  %s\n' "$name" "$status" "$secs" "$file"
  done
  echo "-- environment:"
  grep -E '^(torch |device |NVIDIA|name|lightning|torchrec|fbgemm_gpu)|release' "$OUT/1_env.txt" | head -n 8 | sed 's/^/   /'
  echo "-- build:"
  grep -v '^W[0-9]' "$OUT/2_build.txt" | tail -n 4 | cut -c1-200 | sed 's/^/   /'
  echo "-- tests:"
  grep -E '^(FAILED|ERROR)|passed|failed|skipped|no tests ran|error' "$OUT/3_tests.txt" | tail -n 8 | sed 's/^/   /'
  echo "-- benchmark:"
  grep -E '^(codec|memcpy|fp16|int8|dlac)|no device|did not build' "$OUT/4_bench.txt" | head -n 14 | cut -c1-150 |
    sed 's/^/   /'
  echo "-- memcheck:"
  grep -E 'ERROR SUMMARY|memcheck workload|no device|not found|Error' "$OUT/5_memcheck.txt" | tail -n 4 | sed 's/^/   /'
  echo "exit status: $FAILED ($([ "$FAILED" = 0 ] && echo 'no stage failed' || echo 'a stage failed: see its file'))"
}
summary | tee "$OUT/0_summary.txt"
exit "$FAILED"
