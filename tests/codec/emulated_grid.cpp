// The device pipeline of cuda_ext/dlac_grid.h compiled for the host: every kernel runs as a sequential loop over
// its work items, so machines without a GPU can check the CUDA kernels' algorithm bit for bit against the
// reference (tests/codec/test_codec_device_pipeline.py). Registered as its own library, dlac_emu, on CPU.
#include <torch/library.h>

#include "dlac_grid.h"

namespace {
// Device-to-host copies the pipeline has made in this process (each one is a synchronization on a GPU).
int64_t device_to_host_copies() { return dlac::grid::readback_counter().load(); }
}  // namespace

TORCH_LIBRARY(dlac_emu, m) {
  m.def("encode_grid(Tensor x, int[] row_splits, int[] col_splits, Tensor bounds, bool relative) -> (Tensor, Tensor)");
  m.def("decode_grid(Tensor payload, Tensor sizes, int[] row_splits, int[] col_splits) -> Tensor");
  m.def("device_to_host_copies() -> int", &device_to_host_copies);
}

TORCH_LIBRARY_IMPL(dlac_emu, CPU, m) {
  m.impl("encode_grid", &dlac::grid::encode_grid_op);
  m.impl("decode_grid", &dlac::grid::decode_grid_op);
}
