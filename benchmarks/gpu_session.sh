#!/usr/bin/env bash
# Everything a lent GPU machine should run, in one call that leaves room for a second try in the 15-minute device
# budget: at most 300 s (DLAC_SESSION_BUDGET_S), start-up and file transfers not counted, so two tries with a cold
# start each (a few minutes, less than 150 s) fit in 900 s: 2 x (300 + 150) = 900.
#   run(command="bash benchmarks/gpu_session.sh", timeout_s=330)
#
# It uses the image's python3 as it is (torch 2.11.0+cu130, lightning, pytest, pytest-timeout, hypothesis, numpy,
# ninja, nvcc 13.0, compute-sanitizer; no TorchRec, no fbgemm, no network): no venv, no pip. Six stages fail
# independently, each under its own timeout (and what is left of the budget), each writing its own file under $OUT
# (8 files in all, the device tool's limit):
#   1 environment    1_env.txt          GPU, driver, python, torch, nvcc, compute-sanitizer
#   2 native build   2_build.txt        the JIT build of cuda_ext/ with its CUDA kernels (sm_90); without a GPU, the
#                                       same sources compile-checked (tests/codec/cuda_compile_check.py)
#   3 CUDA tests     3_tests.txt        pytest -v -m cuda tests/codec, each test named as it starts, 60 s per test
#                                       (a hang is stopped and named), durations at the end
#   4 benchmark      4_bench.txt/.json  python -m benchmarks.cuda_codec_bench on the zipf, criteo, multihot and gradient
#                                       payloads, rows flushed and saved as measured; its MX4 rows run fbgemm's
#                                       Triton kernels where they were carried (see DLAC_FBGEMM_TRITON below)
#   5 memcheck       5_memcheck.txt     compute-sanitizer memcheck with the caching allocator off
#                                       (PYTORCH_NO_CUDA_MEMORY_CACHING=1: every buffer its own allocation), over
#                                       every mode and damaged payloads decoded on the device
#                                       (tests/codec/cuda_sanitizer_workload.py damaged)
#   6 sanitizers     6_sanitizers.txt   racecheck, synccheck and initcheck (caching allocator off) of a small encode
#                                       and decode of every mode, the three at once
# and a summary, printed LAST (only the tail of the output comes back) and saved as 0_summary.txt. Without a GPU the
# stages rehearse what they can: the compile check, test collection, and the benchmark and sanitizer workloads on the
# CUDA pipeline compiled for the host (--emulate); the sanitizers themselves report "no device". The exit status is
# non-zero for every real failure, and nothing passes by skipping:
#   - nvidia-smi lists a GPU but torch cannot use it: the session fails at once, naming both (never "no device");
#   - a stage that failed or timed out, a build or compile check that failed;
#   - the benchmark's parity check (every row held to the CPU kernels) or a CUDA error in it;
#   - a sanitizer that found an error. A sanitizer that cannot run here (a probe on a trivial CUDA program fails) is
#     reported as "sanitizer unsupported here", apart from a finding;
#   - the workloads count what they ran (every grid case of the CUDA tests, a fixed number of damaged payloads), so a
#     slow run cannot pass on less.
# DLAC_SESSION_BENCH_ARGS adds arguments to the benchmark (the suite's rehearsal injects a parity fault with it).
# DLAC_FBGEMM_TRITON: the image has no fbgemm, but the benchmark's "mx4 (fbgemm triton)" rows need only its pure
# Triton kernels (fbgemm_gpu/triton). Where the venv's copy was carried along
# (run(..., carry=[".venv/lib/python3.11/site-packages/fbgemm_gpu/triton"])), the session points
# DLAC_FBGEMM_TRITON at it (unless already set); without it those rows say "not measured" and why.
#
# Rehearsal without a GPU: PATH=/path/to/venv-with-torch-2.11/bin:$PATH bash benchmarks/gpu_session.sh
set -uo pipefail  # no -e: a failing stage is recorded and the next one still runs
cd "$(dirname "$0")/.."
REPO=$PWD
OUT=${OUT:-$REPO/benchmarks/results/gpu_session}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BUDGET_S=${DLAC_SESSION_BUDGET_S:-300}
DAMAGED=${DLAC_SESSION_DAMAGED:-100}  # damaged payloads memcheck decodes, whole and by chunk
# PYTHONPATH, DLAC_EXTENSION_DIR, TORCH_CUDA_ARCH_LIST (9.0), MAX_JOBS, CUDA_HOME: shared with cuda_profile.sh.
# shellcheck source=benchmarks/gpu_env.sh
. "$REPO/benchmarks/gpu_env.sh"
export CI=true  # Hypothesis derandomized, as in CI
FBGEMM_TRITON=$REPO/.venv/lib/python3.11/site-packages/fbgemm_gpu/triton
if [ -z "${DLAC_FBGEMM_TRITON:-}" ] && [ -d "$FBGEMM_TRITON" ]; then
  export DLAC_FBGEMM_TRITON=$FBGEMM_TRITON  # MX4's Triton kernels for the benchmark (stage 4)
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
# A GPU the driver lists but torch cannot use would turn every stage into "no device": that is a failure.
LISTED=$( (command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null) | grep -c '^GPU [0-9]' || true)
if [ "$GPU" = 0 ] && [ "${LISTED:-0}" -gt 0 ]; then
  TORCH_SAYS=$("$PY" -c "import torch; print(f'torch {torch.__version__} (CUDA build {torch.version.cuda}):'
                         f' torch.cuda.is_available() is {torch.cuda.is_available()}')" 2>&1 | tail -n 1)
  DEVICE_ERROR="nvidia-smi lists ${LISTED} GPU(s) ($(nvidia-smi -L | head -n 1)) but $TORCH_SAYS: the session cannot\
 test anything. Check that this torch is a CUDA build matching the driver (nvidia-smi's CUDA version), and\
 CUDA_VISIBLE_DEVICES."
  echo "ERROR: $DEVICE_ERROR"
  STAGES+=("0 device|FAILED (GPU unusable)|0|0_summary.txt")
  FAILED=1
fi

# Seconds a stage may take: its cap, or what is left of the budget less 10 s for the summary.
budget() {
  local left=$((START + BUDGET_S - $(date +%s) - 10))
  if [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}

# stage NAME FILE CAP COMMAND...: run COMMAND under timeout, output to FILE, record the outcome. Without a GPU, exit
# status 2 from a command means "no device" (it found no GPU and rehearsed nothing) and 10 that it rehearsed what it
# could without one, successfully; neither is a failure.
stage() {
  local name=$1 file=$2 cap=$3
  shift 3
  local limit t0 rc status
  limit=$(budget "$cap")
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
    STAGE_LIMIT=$limit timeout --kill-after=5 "$limit" bash -c "$1" >"$OUT/$file" 2>&1
  else
    timeout --kill-after=5 "$limit" "$@" >"$OUT/$file" 2>&1
  fi
  rc=$?
  if [ "$rc" = 0 ]; then
    status=ok
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    status="TIMEOUT after ${limit} s"
    FAILED=1
  elif [ "$rc" = 2 ] && [ "$GPU" = 0 ]; then
    status="no device"
  elif [ "$rc" = 10 ] && [ "$GPU" = 0 ]; then
    status="rehearsed (no GPU)"
  elif [ "$rc" = 11 ]; then
    status="sanitizer unsupported here"
  elif [ "$rc" = 12 ]; then
    status="rehearsed; sanitizer unsupported"
  else
    status="FAILED (exit $rc)"
    FAILED=1
  fi
  STAGES+=("$name|$status|$(($(date +%s) - t0))|$file")
  tail -n 3 "$OUT/$file" | cut -c1-200 | sed 's/^/   /'
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
for name in ("lightning", "torchrec", "fbgemm_gpu", "triton", "pytest", "pytest_timeout", "hypothesis", "numpy",
             "ninja"):
    print(f"{name}: {'present' if importlib.util.find_spec(name) else 'absent'}")
EOF
  echo "CUDA_HOME=${CUDA_HOME:-unset} TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST MAX_JOBS=$MAX_JOBS"
  echo "DLAC_FBGEMM_TRITON=${DLAC_FBGEMM_TRITON:-unset} (MX4's Triton kernels for the benchmark)"
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
    "$PY" tests/codec/cuda_compile_check.py --arch "$TORCH_CUDA_ARCH_LIST" && return 10
  fi
}

tests() {
  local flags=(-v -m cuda -p no:cacheprovider --durations=15 -o console_output_style=classic)
  # 60 s per test, below the stage's cap: a hung test is stopped, named, with every thread's stack. The thread
  # method works while the test waits inside CUDA (a signal would wait for it), and ends the run there.
  if "$PY" -c "import pytest_timeout" >/dev/null 2>&1; then flags+=(--timeout=60 --timeout-method=thread); fi
  # Without a GPU, collecting them on an image without TorchRec is itself the check (they skip).
  "$PY" -m pytest "${flags[@]}" tests/codec || return
  [ "$GPU" = 1 ] || return 10
}

bench() {
  if [ "$GPU" = 1 ]; then
    # shellcheck disable=SC2086  # DLAC_SESSION_BENCH_ARGS is a list of words
    "$PY" -m benchmarks.cuda_codec_bench --repeat 10 --json-out "$OUT/4_bench.json" ${DLAC_SESSION_BENCH_ARGS:-}
  else
    echo "no device: the benchmark's payloads, parity checks and synchronization counts on the CUDA pipeline"
    echo "emulated on the host, small batch, wall clock (a rehearsal: no GPU figure)"
    # shellcheck disable=SC2086
    "$PY" -m benchmarks.cuda_codec_bench --emulate --batch 16 --repeat 1 --eps 0.01 0.05 --no-host-copies \
      --quick-baselines --json-out "$OUT/4_bench.json" ${DLAC_SESSION_BENCH_ARGS:-} && return 10
  fi
}

# Can the sanitizer run here at all? A trivial CUDA program under memcheck: a failure there is the sanitizer's
# (unsupported driver or device), not a finding in this project's kernels. 0: it runs; 1: it does not (said why).
sanitizer_probe() {
  local probe=/tmp/dlac_sanitizer_probe.txt
  if [ -z "$SANITIZER" ]; then
    echo "compute-sanitizer: not found"
    return 1
  fi
  if timeout --kill-after=3 60 "$SANITIZER" --tool memcheck --error-exitcode 3 "$PY" -c \
    "import torch; torch.zeros(1, device='cuda').add_(1); torch.cuda.synchronize()" >"$probe" 2>&1; then
    return 0
  fi
  echo "compute-sanitizer cannot run a trivial CUDA program here (not a finding in this project):"
  tail -n 5 "$probe"
  return 1
}

memcheck() {
  local workload=(tests/codec/cuda_sanitizer_workload.py damaged --count "$DAMAGED")
  local probed=0
  sanitizer_probe && probed=1
  if [ "$GPU" = 0 ]; then
    echo "no device: the memcheck workload on the CUDA pipeline emulated on the host (a rehearsal)"
    if [ "$probed" = 1 ]; then
      # A sanitizer that runs without a GPU (the suite's stand-in): the emulated workload under it.
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$SANITIZER" --tool memcheck --error-exitcode 3 "$PY" "${workload[@]}" \
        --emulate && return 10
      return
    fi
    "$PY" "${workload[@]}" --emulate && return 12
    return
  fi
  [ "$probed" = 1 ] || return 11
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$SANITIZER" --tool memcheck --error-exitcode 3 --report-api-errors no \
    --print-limit 40 "$PY" "${workload[@]}"
}

sanitizers() {
  local probed=0
  sanitizer_probe && probed=1
  if [ "$GPU" = 0 ]; then
    echo "no device: the racecheck/synccheck/initcheck workload on the CUDA pipeline emulated on the host"
    "$PY" tests/codec/cuda_sanitizer_workload.py small --emulate || return
    [ "$probed" = 1 ] && return 10
    return 12
  fi
  [ "$probed" = 1 ] || return 11
  # The three at once (each its own process and GPU context), each under the stage's time less 5 s.
  local tool rc=0 limit=$((STAGE_LIMIT - 5))
  for tool in racecheck synccheck initcheck; do
    local extra=()
    [ "$tool" = racecheck ] && extra=(--racecheck-report all)
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout --kill-after=3 "$limit" "$SANITIZER" --tool "$tool" \
      --error-exitcode 3 --report-api-errors no --print-limit 40 "${extra[@]}" \
      "$PY" tests/codec/cuda_sanitizer_workload.py small >"/tmp/dlac_$tool.txt" 2>&1 &
  done
  for tool in racecheck synccheck initcheck; do
    wait -n || rc=1
  done
  for tool in racecheck synccheck initcheck; do
    echo "================ $tool"
    cat "/tmp/dlac_$tool.txt"
  done
  return $rc
}

export PY GPU SANITIZER OUT DAMAGED
export -f env_report build tests bench sanitizer_probe memcheck sanitizers
stage "1 environment" 1_env.txt 15 env_report
stage "2 native build" 2_build.txt 120 build
stage "3 CUDA tests" 3_tests.txt 60 tests
# Without a GPU the benchmark's rehearsal may JIT-build the host kernels first (tens of seconds on a loaded 2-core
# machine): its cap is the GPU stage's 45 s plus that build's room, still well inside the session's budget.
stage "4 benchmark" 4_bench.txt "$([ "$GPU" = 1 ] && echo 45 || echo 120)" bench
stage "5 memcheck" 5_memcheck.txt 50 memcheck
stage "6 sanitizers" 6_sanitizers.txt 40 sanitizers

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
  grep -v '^W[0-9]' "$OUT/2_build.txt" | tail -n 3 | cut -c1-200 | sed 's/^/   /'
  echo "-- tests:"
  grep -E '^(FAILED|ERROR)|Timeout|[0-9]+ (passed|failed|skipped)|no tests ran' "$OUT/3_tests.txt" | tail -n 8 |
    cut -c1-200 | sed 's/^/   /'
  echo "-- benchmark (GB/s as the exchange calls the codec; op = the kernels alone):"
  grep -E '^(payload|zipf|criteo|multihot|gradient) |^zipf: mx4.*not measured|no device|did not build|Error' \
    "$OUT/4_bench.txt" |
    grep -vE 'via host copies|: \(|memcpy moves' | head -n 30 | cut -c1-160 | sed 's/^/   /'
  echo "-- memcheck:"
  grep -E 'ERROR SUMMARY|sanitizer workload \(|DIFFERS|no device|not found|Error' "$OUT/5_memcheck.txt" | tail -n 5 |
    cut -c1-200 | sed 's/^/   /'
  echo "-- racecheck / synccheck / initcheck:"
  grep -E '^=+ [a-z]+check|ERROR SUMMARY|RACECHECK SUMMARY|sanitizer workload \(|DIFFERS|no device|not found' \
    "$OUT/6_sanitizers.txt" | tail -n 12 | cut -c1-200 | sed 's/^/   /'
  [ -z "${DEVICE_ERROR:-}" ] || echo "ERROR: $DEVICE_ERROR"
  echo "exit status: $FAILED ($([ "$FAILED" = 0 ] && echo 'no stage failed' || echo 'a stage failed: see its file'))"
}
summary | tee "$OUT/0_summary.txt"
exit "$FAILED"
