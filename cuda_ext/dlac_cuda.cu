// CUDA kernels of the DLAC codec: dlac::encode_grid / dlac::decode_grid (and decode_grid_into) for tensors on a GPU.
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
#include "dlac_str.h"

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

// decode_grid into out (the CPU op's contract). The device decoder writes a new tensor, copied into out here: the
// same values, not yet the saving the CPU op makes (decoding into a strided destination on the device is left to do).
void decode_grid_into_cuda(const at::Tensor& payload, const at::Tensor& sizes, c10::IntArrayRef row_splits,
                           c10::IntArrayRef col_splits, const at::Tensor& out) {
  TORCH_CHECK(payload.is_cuda(), "dlac::decode_grid_into (CUDA): payload must be a CUDA tensor");
  TORCH_CHECK(out.device() == payload.device() && out.scalar_type() == at::kFloat && out.dim() == 2,
              "out must be a 2-D float32 tensor on the payload's device");
  TORCH_CHECK(row_splits.size() >= 2 && col_splits.size() >= 2, "row_splits and col_splits need >= 2 points");
  TORCH_CHECK(out.size(0) == row_splits.back() && out.size(1) == col_splits.back(), ::dlac::str("out must be [",
              row_splits.back(), ", ", col_splits.back(), "], got [", out.size(0), ", ", out.size(1), "]"));
  const c10::cuda::CUDAGuard guard(payload.device());
  out.copy_(dlac::grid::decode_grid_op(payload, sizes, row_splits, col_splits));
}

}  // namespace

TORCH_LIBRARY_IMPL(dlac, CUDA, m) {
  m.impl("encode_grid", &encode_grid_cuda);
  m.impl("decode_grid", &decode_grid_cuda);
  m.impl("decode_grid_into", &decode_grid_into_cuda);
}
