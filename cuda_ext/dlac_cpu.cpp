// CPU kernels of the DLAC codec and the op schemas (TORCH_LIBRARY(dlac, m)).
//
// dlac::encode_grid / dlac::decode_grid encode or decode every (row block, column block) chunk of a 2-D float32
// tensor in row-block-major order, in parallel over chunks. A single chunk is the 1x1 grid. dlac::decode_grid_into
// is decode_grid writing into a given tensor (a view of the caller's output) instead of a new one.
// dlac::cast_column_blocks (dlac_cast.h) is the cast gradient exchange's gather and cast in one pass.
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <torch/types.h>

#include <string>
#include <tuple>
#include <vector>

#include "dlac_codec.h"
#include "dlac_ops.h"
#include "dlac_cast.h"

namespace {

using dlac::check_chunk_limits;
using dlac::check_splits;

std::tuple<at::Tensor, at::Tensor> encode_grid_cpu(const at::Tensor& x_in, c10::IntArrayRef row_splits,
                                                   c10::IntArrayRef col_splits, const at::Tensor& bounds,
                                                   bool relative) {
  TORCH_CHECK(x_in.device().is_cpu(), "dlac::encode_grid (CPU): x must be a CPU tensor");
  TORCH_CHECK(x_in.scalar_type() == at::kFloat, "x must be a float32 tensor, got ", x_in.scalar_type());
  TORCH_CHECK(x_in.dim() == 2, "x must be 2-D [rows, dim], got ", x_in.dim(), " dimensions");
  check_splits(row_splits, x_in.size(0), "row_splits");
  check_splits(col_splits, x_in.size(1), "col_splits");
  check_chunk_limits(row_splits, col_splits);
  const int64_t R = int64_t(row_splits.size()) - 1, C = int64_t(col_splits.size()) - 1;
  TORCH_CHECK(bounds.device().is_cpu() && bounds.scalar_type() == at::kFloat && bounds.dim() == 1 &&
                  bounds.numel() == C,
              "bounds must be a float32 CPU tensor with one bound per column block (", C, ")");
  at::Tensor b = bounds.contiguous();
  const float* bp = b.data_ptr<float>();
  dlac::check_bounds(bp, C, relative);
  // Chunks read a strided view; only the column stride must be 1.
  at::Tensor x = (x_in.size(1) <= 1 || x_in.stride(1) == 1) ? x_in : x_in.contiguous();
  const float* xp = x.data_ptr<float>();
  const int64_t ld = x.stride(0);

  const int64_t nchunks = R * C;
  std::vector<std::vector<uint8_t>> outs(nchunks);
  at::parallel_for(0, nchunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t r = i / C, c = i % C;
      const int64_t r0 = row_splits[r], rows = row_splits[r + 1] - r0;
      const int64_t c0 = col_splits[c], dim = col_splits[c + 1] - c0;
      dlac::encode_chunk(xp + r0 * ld + c0, rows, dim, ld, bp[c], relative, outs[i]);
    }
  });
  at::Tensor sizes = at::empty({nchunks}, at::kLong);
  int64_t* sp = sizes.data_ptr<int64_t>();
  std::vector<int64_t> offsets(nchunks + 1, 0);
  for (int64_t i = 0; i < nchunks; ++i) {
    sp[i] = int64_t(outs[i].size());
    offsets[i + 1] = offsets[i] + sp[i];
  }
  at::Tensor payload = at::empty({offsets[nchunks]}, at::kByte);
  uint8_t* pp = payload.data_ptr<uint8_t>();
  at::parallel_for(0, nchunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      if (!outs[i].empty()) std::memcpy(pp + offsets[i], outs[i].data(), outs[i].size());
  });
  return {payload, sizes};
}

// Decodes every chunk into op (row stride ld): chunk (r, c) at op + row_splits[r] * ld + col_splits[c].
void decode_grid_to(const at::Tensor& payload_in, const at::Tensor& sizes_in, c10::IntArrayRef row_splits,
                    c10::IntArrayRef col_splits, float* op, int64_t ld) {
  TORCH_CHECK(payload_in.device().is_cpu() && payload_in.scalar_type() == at::kByte && payload_in.dim() == 1,
              "payload must be a 1-D uint8 CPU tensor");
  TORCH_CHECK(sizes_in.device().is_cpu() && sizes_in.scalar_type() == at::kLong && sizes_in.dim() == 1,
              "sizes must be a 1-D int64 CPU tensor");
  TORCH_CHECK(row_splits.size() >= 2 && col_splits.size() >= 2, "row_splits and col_splits need >= 2 points");
  check_splits(row_splits, row_splits.back(), "row_splits");
  check_splits(col_splits, col_splits.back(), "col_splits");
  const int64_t R = int64_t(row_splits.size()) - 1, C = int64_t(col_splits.size()) - 1;
  const int64_t nchunks = R * C;
  TORCH_CHECK(sizes_in.numel() == nchunks, "sizes must hold one entry per chunk (", nchunks, "), got ",
              sizes_in.numel());
  at::Tensor payload = payload_in.contiguous();
  at::Tensor sizes = sizes_in.contiguous();
  const int64_t* sp = sizes.data_ptr<int64_t>();
  std::vector<int64_t> offsets(nchunks + 1, 0);
  for (int64_t i = 0; i < nchunks; ++i) {
    TORCH_CHECK_VALUE(sp[i] >= 0, "chunk ", i, ": negative size ", sp[i]);
    offsets[i + 1] = offsets[i] + sp[i];
  }
  // What the bytes and sizes are found to be wrong with is a ValueError (Python's codec API: a CodecError), unlike
  // bad arguments above and device errors.
  TORCH_CHECK_VALUE(offsets[nchunks] == payload.numel(), "chunk sizes sum to ", offsets[nchunks],
                    " bytes but the payload holds ", payload.numel(), " (truncated payload?)");
  const uint8_t* pp = payload.data_ptr<uint8_t>();
  std::vector<std::string> errors(nchunks);
  at::parallel_for(0, nchunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t r = i / C, c = i % C;
      const int64_t r0 = row_splits[r], rows = row_splits[r + 1] - r0;
      const int64_t c0 = col_splits[c], dim = col_splits[c + 1] - c0;
      try {
        dlac::decode_chunk(pp + offsets[i], uint64_t(sp[i]), rows, dim, op + r0 * ld + c0, ld);
      } catch (const std::exception& e) {
        errors[i] = "chunk " + std::to_string(i) + " (row block " + std::to_string(r) + ", column block " +
                    std::to_string(c) + "): " + e.what();
      }
    }
  });
  for (int64_t i = 0; i < nchunks; ++i) TORCH_CHECK_VALUE(errors[i].empty(), errors[i]);
}

at::Tensor decode_grid_cpu(const at::Tensor& payload, const at::Tensor& sizes, c10::IntArrayRef row_splits,
                           c10::IntArrayRef col_splits) {
  TORCH_CHECK(row_splits.size() >= 2 && col_splits.size() >= 2, "row_splits and col_splits need >= 2 points");
  at::Tensor out = at::empty({row_splits.back(), col_splits.back()}, at::kFloat);
  decode_grid_to(payload, sizes, row_splits, col_splits, out.data_ptr<float>(), col_splits.back());
  return out;
}

// decode_grid writing into out: a float32 [row_splits[-1], col_splits[-1]] CPU tensor whose columns are contiguous
// (any row stride: a block of columns or rows of a larger tensor), so the exchange decodes straight into its output.
// Elements of out outside the grid's chunks are not written; after an error, out's contents are unspecified.
void decode_grid_into_cpu(const at::Tensor& payload, const at::Tensor& sizes, c10::IntArrayRef row_splits,
                          c10::IntArrayRef col_splits, const at::Tensor& out) {
  TORCH_CHECK(row_splits.size() >= 2 && col_splits.size() >= 2, "row_splits and col_splits need >= 2 points");
  TORCH_CHECK(out.device().is_cpu() && out.scalar_type() == at::kFloat && out.dim() == 2,
              "out must be a 2-D float32 CPU tensor");
  TORCH_CHECK(out.size(0) == row_splits.back() && out.size(1) == col_splits.back(), "out must be [",
              row_splits.back(), ", ", col_splits.back(), "], got [", out.size(0), ", ", out.size(1), "]");
  TORCH_CHECK(out.size(1) <= 1 || out.stride(1) == 1, "out's columns must be contiguous (column stride 1)");
  TORCH_CHECK(out.size(0) <= 1 || out.stride(0) >= out.size(1), "out's rows must not overlap");
  decode_grid_to(payload, sizes, row_splits, col_splits, out.data_ptr<float>(),
                 out.size(0) <= 1 ? out.size(1) : out.stride(0));
}

}  // namespace

TORCH_LIBRARY(dlac, m) {
  m.def("encode_grid(Tensor x, int[] row_splits, int[] col_splits, Tensor bounds, bool relative) -> (Tensor, Tensor)");
  m.def("decode_grid(Tensor payload, Tensor sizes, int[] row_splits, int[] col_splits) -> Tensor");
  m.def("decode_grid_into(Tensor payload, Tensor sizes, int[] row_splits, int[] col_splits, Tensor(a!) out) -> ()");
  m.def("cast_column_blocks(Tensor x, int[] col_splits, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(dlac, CPU, m) {
  m.impl("encode_grid", &encode_grid_cpu);
  m.impl("decode_grid", &decode_grid_cpu);
  m.impl("decode_grid_into", &decode_grid_into_cpu);
  m.impl("cast_column_blocks", &dlac::cast_column_blocks_cpu);
}
