// CUDA kernels of the DLAC codec: dlac::encode_grid / dlac::decode_grid for tensors on a GPU.
//
// The pipeline is cuda_ext/dlac_grid.h and the dlac_grid_*.h headers it includes, compiled here with kernel
// launches (the tests compile the same files for the host and check them bit for bit against the reference).
// Payload, sizes and decoded output stay on x's device, so the all-to-all sends them with NCCL without a host round
// trip; the encoder synchronizes once (the chunk sizes decide the payload's size; twice when its histograms outgrow
// their region) and the decoder twice (header validation, error report). Everything runs on the current stream
// (dlac_grid_transfer.h says why that is stream-safe).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <tuple>

#include "dlac_grid.h"

namespace {

std::tuple<at::Tensor, at::Tensor> encode_grid_cuda(const at::Tensor& x, c10::IntArrayRef row_splits,
                                                    c10::IntArrayRef col_splits, const at::Tensor& bounds,
                                                    bool relative) {
  TORCH_CHECK(x.is_cuda(), "dlac::encode_grid (CUDA): x must be a CUDA tensor");
  const c10::cuda::CUDAGuard guard(x.device());
  return dlac::grid::encode_grid_op(x, row_splits, col_splits, bounds, relative);
}

at::Tensor decode_grid_cuda(const at::Tensor& payload, const at::Tensor& sizes, c10::IntArrayRef row_splits,
                            c10::IntArrayRef col_splits) {
  TORCH_CHECK(payload.is_cuda(), "dlac::decode_grid (CUDA): payload must be a CUDA tensor");
  const c10::cuda::CUDAGuard guard(payload.device());
  return dlac::grid::decode_grid_op(payload, sizes, row_splits, col_splits);
}

}  // namespace

TORCH_LIBRARY_IMPL(dlac, CUDA, m) {
  m.impl("encode_grid", &encode_grid_cuda);
  m.impl("decode_grid", &decode_grid_cuda);
}
