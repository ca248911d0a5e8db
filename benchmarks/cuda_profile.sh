#!/usr/bin/env bash
# Where the CUDA kernels' time goes, on a lent GPU machine, in one call of at most 175 s (DLAC_PROFILE_BUDGET_S,
# start-up and transfers not counted):
#   run(command="bash benchmarks/cuda_profile.sh", timeout_s=240)
#
# Builds cuda_ext/ with its CUDA kernels as benchmarks/gpu_session.sh does (benchmarks/gpu_env.sh: sm_90, CUDA_HOME
# from nvcc, the image's python3 as it is), then profiles one encode and one decode of cuda_codec_bench's criteo
# payload at eps 0.01 (26 tables x 8 destinations x 4096 rows, dim 64; torch.ops.dlac as the bench's op columns call
# it) after two warm-ups (python -m benchmarks.cuda_profile), twice:
#   1 timeline      torch.profiler, no replay: every kernel, copy and memset in launch order, named after the DLAC
#                   launch (cuda_ext/dlac_grid_launch.h's KernelScope) or aten op that queued it, its start, duration
#                   and the GPU idle time before it; GPU time per name; wall time against GPU busy time
#   2 ncu           Nsight Compute on the same two calls only (cudaProfilerStart/Stop, --profile-from-start off),
#                   --clock-control none, kernel replay, sections SpeedOfLight, LaunchStats, Occupancy,
#                   MemoryWorkloadAnalysis, SchedulerStats, WarpStateStats; kernels named after their NVTX range
#                   (--nvtx --print-nvtx-rename kernel) where this ncu can
# Files under $OUT (5, each cut below 1 MB):
#   0_log.txt            environment, build, each stage's status and output tail (also printed: the tool returns
#                        the output's tail)
#   1_timeline.txt       CUDA-event times of both calls with the serial kernels (Huffman tables and blocks, CRC
#                        segments) spread over the SMs and with their old geometry (DLAC_CUDA_SERIAL_THREADS=256),
#                        then the torch.profiler report (and its key_averages table)
#   2_ncu_summary.txt    ncu --print-summary per-kernel (duration, and every section metric's min/max/avg per name)
#   3_ncu_metrics.csv    one row per kernel launch: its name, duration, grid, block, registers, shared memory,
#                        occupancy, SM / memory / DRAM throughput, warp cycles per issued instruction
#   4_ncu_details.txt    ncu --page details: each kernel's sections with the rules' advice
# Without a GPU it says so and exits 0 having profiled nothing (no rehearsal: there is nothing to time); a GPU that
# nvidia-smi lists but torch cannot use is a failure (exit 1), as is a failed build (1).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
OUT=${OUT:-/tmp/dlac_cuda_profile}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BUDGET_S=${DLAC_PROFILE_BUDGET_S:-175}
PAYLOAD_ARGS=(--payload "${DLAC_PROFILE_PAYLOAD:-criteo}" --eps "${DLAC_PROFILE_EPS:-0.01}")
# shellcheck source=benchmarks/gpu_env.sh
. "$REPO/benchmarks/gpu_env.sh"
START=$(date +%s)
LOG=$OUT/0_log.txt
: >"$LOG"
say() { echo "$*" | tee -a "$LOG"; }
left() { echo $((START + BUDGET_S - $(date +%s))); }
# Files over the device tool's limit do not come back: cut them (and say so) below 1 MB.
cap() {
  local f=$1
  if [ -f "$f" ] && [ "$(stat -c %s "$f")" -gt 950000 ]; then
    head -c 940000 "$f" >"$f.cut" && mv "$f.cut" "$f"
    printf '\n[cut at 940000 bytes by cuda_profile.sh]\n' >>"$f"
  fi
}

say "cuda_profile: $(date -u +%FT%TZ) on $(hostname), $(nproc) CPUs; budget ${BUDGET_S} s"
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
  LISTED=$( (command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null) | grep -c '^GPU [0-9]' || true)
  if [ "${LISTED:-0}" -gt 0 ]; then
    say "ERROR: nvidia-smi lists ${LISTED} GPU(s) but torch cannot use them: $("$PY" -c "import torch; print(torch.__version__, torch.version.cuda)" 2>&1 | tail -n 1)"
    exit 1
  fi
  say "cuda_profile: no device (torch.cuda.is_available() is False, nvidia-smi lists no GPU): nothing profiled"
  exit 0
fi

# ncu: on PATH, else where CUDA toolkits and Nsight Compute installs keep it.
NCU=$(command -v ncu || true)
for candidate in "${CUDA_HOME:-/usr/local/cuda}/bin/ncu" /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu \
  "${CUDA_HOME:-/usr/local/cuda}"/nsight-compute*/ncu; do
  if [ -z "$NCU" ] && [ -x "$candidate" ]; then NCU=$candidate; fi
done
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1
  "$PY" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda)"
  echo "CUDA_HOME=${CUDA_HOME:-unset} TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST MAX_JOBS=$MAX_JOBS"
  echo "ncu: ${NCU:-not found} $([ -n "$NCU" ] && "$NCU" --version 2>&1 | tail -n 1)"
} 2>&1 | tee -a "$LOG"

# 0 build (the JIT build of cuda_ext/ with its CUDA kernels), as gpu_session.sh's stage 2.
say "== build (timeout 130 s)"
t0=$(date +%s)
timeout --kill-after=5 130 "$PY" - >"$OUT/build.txt" 2>&1 <<'EOF'
import time
from lightning_dlac.codec import _loader
from lightning_dlac.codec.api import device_kernels
start = time.perf_counter()
_loader.load_native()
assert device_kernels("cuda"), "built, but without CUDA kernels"
print(f"native library with CUDA kernels built and loaded in {time.perf_counter() - start:.0f} s")
EOF
rc=$?
grep -v '^W[0-9]' "$OUT/build.txt" | tail -n 25 >>"$LOG"
rm -f "$OUT/build.txt"
say "build: exit $rc after $(($(date +%s) - t0)) s"
[ "$rc" = 0 ] || { say "cuda_profile: the build failed: see 0_log.txt"; exit 1; }

# 1 timeline.
limit=$(($(left) < 60 ? $(left) : 60))
say "== timeline (timeout ${limit} s)"
t0=$(date +%s)
timeout --kill-after=5 "$limit" "$PY" -m benchmarks.cuda_profile --mode timeline --out "$OUT" "${PAYLOAD_ARGS[@]}" \
  >"$OUT/timeline_run.txt" 2>&1
rc=$?
[ -f "$OUT/timeline.txt" ] && mv "$OUT/timeline.txt" "$OUT/1_timeline.txt"
cap "$OUT/1_timeline.txt"
say "timeline: exit $rc after $(($(date +%s) - t0)) s"
if [ "$rc" != 0 ] || [ ! -f "$OUT/1_timeline.txt" ]; then tail -n 40 "$OUT/timeline_run.txt" | tee -a "$LOG"; fi
rm -f "$OUT/timeline_run.txt"

# 2 ncu.
if [ -z "$NCU" ]; then
  say "ncu: not found (PATH, \$CUDA_HOME/bin, /opt/nvidia/nsight-compute): no hardware counters"
else
  REP=/tmp/dlac_cuda_profile_$$
  rm -f "$REP.ncu-rep"
  NVTX=(--nvtx)
  RENAME=()
  "$NCU" --help 2>/dev/null | grep -q -- '--print-nvtx-rename' && RENAME=(--print-nvtx-rename kernel)
  limit=$(($(left) - 25))
  say "== ncu (timeout ${limit} s): ${RENAME[*]:-kernels under their own names (this ncu cannot rename by NVTX)}"
  t0=$(date +%s)
  if [ "$limit" -lt 20 ]; then
    say "ncu: skipped, the budget is spent"
  else
    timeout --kill-after=5 "$limit" "$NCU" --target-processes all --profile-from-start off --clock-control none \
      --replay-mode kernel --launch-count 120 "${NVTX[@]}" \
      --section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
      --section SchedulerStats --section WarpStateStats -o "$REP" -f \
      "$PY" -m benchmarks.cuda_profile --mode ncu "${PAYLOAD_ARGS[@]}" >"$OUT/ncu_run.txt" 2>&1
    rc=$?
    say "ncu: exit $rc after $(($(date +%s) - t0)) s"
    grep -v '^==PROF==' "$OUT/ncu_run.txt" | tail -n 15 >>"$LOG"
    grep '^==\(PROF\|ERROR\|WARNING\)==' "$OUT/ncu_run.txt" | tail -n 10 | tee -a "$LOG"
    rm -f "$OUT/ncu_run.txt"
    if [ -f "$REP.ncu-rep" ]; then
      "$NCU" -i "$REP.ncu-rep" "${RENAME[@]}" --print-summary per-kernel >"$OUT/2_ncu_summary.txt" 2>&1
      # One row per launch; if this ncu lacks a metric of the long list, the short one.
      local_metrics=gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread
      long_metrics=$local_metrics,launch__shared_mem_per_block_static,launch__waves_per_multiprocessor
      long_metrics=$long_metrics,sm__warps_active.avg.pct_of_peak_sustained_active
      long_metrics=$long_metrics,sm__throughput.avg.pct_of_peak_sustained_elapsed
      long_metrics=$long_metrics,gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed
      long_metrics=$long_metrics,dram__throughput.avg.pct_of_peak_sustained_elapsed
      long_metrics=$long_metrics,smsp__average_warp_latency_per_inst_issued.ratio
      long_metrics=$long_metrics,smsp__issue_active.avg.pct_of_peak_sustained_active
      if ! "$NCU" -i "$REP.ncu-rep" "${RENAME[@]}" --page raw --csv --metrics "$long_metrics" \
        >"$OUT/3_ncu_metrics.csv" 2>&1 || grep -q '^==ERROR==' "$OUT/3_ncu_metrics.csv"; then
        "$NCU" -i "$REP.ncu-rep" "${RENAME[@]}" --page raw --csv --metrics "$local_metrics" \
          >"$OUT/3_ncu_metrics.csv" 2>&1
      fi
      "$NCU" -i "$REP.ncu-rep" "${RENAME[@]}" --page details >"$OUT/4_ncu_details.txt" 2>&1
      for f in 2_ncu_summary.txt 3_ncu_metrics.csv 4_ncu_details.txt; do cap "$OUT/$f"; done
      rm -f "$REP.ncu-rep"
    else
      say "ncu: no report written"
    fi
  fi
fi

say "== cuda_profile: $(($(date +%s) - START)) s; files:"
ls -l "$OUT" | tail -n +2 | tee -a "$LOG"
# The tool returns the output's tail: the timeline's totals and GPU time per launch name, then ncu's durations.
echo "== timeline: totals and GPU time per launch name (1_timeline.txt has every launch)"
grep -E '^(CUDA events|== profile|-- profile|   +[0-9.]+ ms)' "$OUT/1_timeline.txt" 2>/dev/null | cut -c1-160
if [ -f "$OUT/3_ncu_metrics.csv" ]; then
  echo "== ncu: one row per launch (3_ncu_metrics.csv), first columns"
  cut -c1-400 "$OUT/3_ncu_metrics.csv" | head -n 90
fi
exit 0
