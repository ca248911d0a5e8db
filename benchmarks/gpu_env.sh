# The environment of the scripts a lent GPU machine runs (benchmarks/gpu_session.sh, benchmarks/cuda_profile.sh),
# sourced from the repository root with REPO set to it: the checkout on PYTHONPATH, the JIT build's directory and
# architecture (the H200 only: one architecture builds fastest), its parallelism, and CUDA_HOME from the nvcc on PATH
# where unset. Each variable that is already set is kept.
export PYTHONUNBUFFERED=1
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export DLAC_EXTENSION_DIR=${DLAC_EXTENSION_DIR:-/tmp/dlac_extensions}
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
if [ -z "${CUDA_HOME:-}" ] && command -v nvcc >/dev/null; then
  # nvcc on PATH may be a wrapper script that execs the toolkit's nvcc: take the toolkit it names, if any.
  real_nvcc=$(grep -o '/[^ "]*/bin/nvcc' "$(command -v nvcc)" 2>/dev/null | head -1)
  [ -x "${real_nvcc:-}" ] || real_nvcc=$(readlink -f "$(command -v nvcc)")
  CUDA_HOME=$(dirname "$(dirname "$real_nvcc")")
  export CUDA_HOME
fi
