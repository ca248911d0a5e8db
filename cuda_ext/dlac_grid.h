// The DLAC grid codec as a data-parallel pipeline over tensors on one device: the CUDA kernels (dlac_cuda.cu) and,
// compiled for the host with sequential loops instead of kernel launches, the CPU emulation the tests check against
// the reference bit for bit (tests/codec/emulated_grid.cpp) on machines without a GPU.
//
// Every kernel is written once as a lambda over one work item (an element, a row, a symbol, a Huffman block, a
// CRC segment, a chunk) and run with for_each, or for elements and symbols with for_each_element over per-chunk
// tiles (one block per tile of one chunk or stream, so no work item searches for its chunk). Two kinds of kernel
// work on more than one item, and the emulation runs them through the same code: block passes
// (for_each_tile_block_if: phases over one tile with a block-shared scratch, shared memory on the GPU, and a barrier
// between them; the emulation poisons one scratch per tile and finishes each phase before the next) and warp passes
// (for_each_warp: the 32 lanes of a warp on one code row, combined by shuffles; the emulation runs the lanes in turn).
// Work items only communicate through atomics whose result does not depend on their order (or, min, max, add, and a
// compare-and-swap hash insert that keeps the smallest row), so running them one after another on the host computes
// exactly what the GPU computes. Per-chunk decisions that must
// equal the CPU encoder's (PACK / HUFF / DEDUP / RAW, Huffman code lengths, headers) are made on the host by the
// same functions dlac_codec.h gives the CPU encoder, from statistics the device gathers.
//
// Synchronizations (device-to-host copies, counted by readback_counter and tested): encode 1, the per-chunk state
// words with the histograms the planner reads, counted behind them (2 when those outgrow their region, sized by
// what the same grid shape needed last time); decode 2, every header with its checksum, then the error flags. Each
// phase's metadata goes up in one pinned, non-blocking copy (Staging). The first call on a device also uploads the
// CRC tables, blocking.
//
// Encode: range and finiteness -> per-chunk kind and bound -> the first quantization step checked, with its codes,
// in one pass (the other three steps only where it misses; codes redone for chunks that keep a later step) ->
// unique code rows (one warp per row hashes and compares it; hash set keeping the first row of each, probes bounded,
// then a prefix sum gives first-appearance ids) -> the histograms the planner reads (codes per tile in shared
// memory, the unique rows' weighted by their repeats; row index) -> [host: plan, headers, Huffman tables] -> RAW
// copies, every code placed at its bit offset (a prefix sum of code lengths) by tile-wise packing (a block ORs its
// tile's codes into words in shared memory and stores them whole, only its first and last word by atomic OR),
// block end offsets, CRC-32 per segment joined per chunk.
// Decode: headers and CRC per chunk -> [host: header validation] -> Huffman sections validated and tables built per
// section, one thread per Huffman block, PACK values per element -> dequantized output -> [host: error flags].
//
// Split by phase, each header flat in cuda_ext/ (the loader and the package data take cuda_ext/*.h):
//   dlac_grid_launch.h    launching kernels, tiles, block and warp passes, atomics
//   dlac_grid_transfer.h  read-backs, device buffers, metadata staging, CRC-32 on the device
//   dlac_grid_encode.h    encode_grid_device
//   dlac_grid_decode.h    decode_grid_device
//   dlac_grid.h           this file: the ops, with the CPU kernels' argument checks
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "dlac_codec.h"
#include "dlac_grid_decode.h"
#include "dlac_grid_encode.h"
#include "dlac_grid_launch.h"
#include "dlac_grid_transfer.h"
#include "dlac_ops.h"
#include "dlac_str.h"

namespace dlac {
namespace grid {
inline namespace DLAC_GRID_BUILD {

// ------------------------------------------------------------------------------------------------------------
// The ops (the device's TORCH_LIBRARY_IMPL calls these): same checks and messages as the CPU kernels
// ------------------------------------------------------------------------------------------------------------

// Runs one op's device pipeline. A CUDA error (a fault in a kernel, which CUDA reports at the next synchronization,
// or a failed launch) stays the error it is (torch.AcceleratorError in Python), with the names of the kernels launched
// since the last read-back added: this call's, and the previous call's last ones (an encode ends with kernels no
// read-back follows, so their faults surface in the next call); the ops' own checks (bad arguments: RuntimeError; a
// corrupted payload: ValueError) pass unchanged.
template <class F>
auto reporting_faults(const char* op, F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (c10::Error& e) {
    if (is_device_error(e))
      e.add_context(::dlac::str(op, ": CUDA reported this after the DLAC kernels ", kernel_names(),
                                ", launched since the "
                             "last synchronization of a DLAC call (a fault inside a kernel surfaces at the next "
                             "one; DLAC_CUDA_SYNC_KERNELS=1 synchronizes after every kernel, to name the one)"));
    throw;
  }
}

inline std::tuple<at::Tensor, at::Tensor> encode_grid_op(const at::Tensor& x_in, c10::IntArrayRef rs,
                                                          c10::IntArrayRef cs, const at::Tensor& bounds,
                                                          bool relative) {
  TORCH_CHECK(x_in.scalar_type() == at::kFloat, ::dlac::str("x must be a float32 tensor, got ", x_in.scalar_type()));
  TORCH_CHECK(x_in.dim() == 2, ::dlac::str("x must be 2-D [rows, dim], got ", x_in.dim(), " dimensions"));
  check_splits(rs, x_in.size(0), "row_splits");
  check_splits(cs, x_in.size(1), "col_splits");
  check_chunk_limits(rs, cs);
  const int64_t C = int64_t(cs.size()) - 1;
  TORCH_CHECK(bounds.scalar_type() == at::kFloat && bounds.dim() == 1 && bounds.numel() == C,
              ::dlac::str("bounds must be a float32 tensor with one bound per column block (", C, ")"));
  const std::vector<float> b = reporting_faults("dlac::encode_grid", [&] { return argument_on_host<float>(bounds); });
  check_bounds(b.data(), C, relative);
  // Chunks read a strided view; only the column stride must be 1.
  at::Tensor x = (x_in.size(1) <= 1 || x_in.stride(1) == 1) ? x_in : x_in.contiguous();
  return reporting_faults("dlac::encode_grid", [&] { return encode_grid_device(x, rs, cs, b.data(), relative); });
}

inline at::Tensor decode_grid_op(const at::Tensor& payload_in, const at::Tensor& sizes_in, c10::IntArrayRef rs,
                                 c10::IntArrayRef cs) {
  TORCH_CHECK(payload_in.scalar_type() == at::kByte && payload_in.dim() == 1, "payload must be a 1-D uint8 tensor");
  TORCH_CHECK(sizes_in.scalar_type() == at::kLong && sizes_in.dim() == 1, "sizes must be a 1-D int64 tensor");
  TORCH_CHECK(rs.size() >= 2 && cs.size() >= 2, "row_splits and col_splits need >= 2 points");
  check_splits(rs, rs.back(), "row_splits");
  check_splits(cs, cs.back(), "col_splits");
  const int64_t nchunks = (int64_t(rs.size()) - 1) * (int64_t(cs.size()) - 1);
  TORCH_CHECK(sizes_in.numel() == nchunks, ::dlac::str("sizes must hold one entry per chunk (", nchunks, "), got ",
              sizes_in.numel()));
  // Sizes that do not fit the payload, like every error the decoder finds in the bytes, are a ValueError.
  const std::vector<int64_t> sizes = reporting_faults("dlac::decode_grid", [&] {
    return argument_on_host<int64_t>(sizes_in);
  });
  int64_t total = 0;
  for (int64_t i = 0; i < nchunks; ++i) {
    TORCH_CHECK_VALUE(sizes[i] >= 0, ::dlac::str("chunk ", i, ": negative size ", sizes[i]));
    total += sizes[i];
  }
  TORCH_CHECK_VALUE(total == payload_in.numel(), ::dlac::str("chunk sizes sum to ", total,
                                                             " bytes but the payload holds ",
                    payload_in.numel(), " (truncated payload?)"));
  return reporting_faults("dlac::decode_grid",
                          [&] { return decode_grid_device(payload_in.contiguous(), sizes, rs, cs); });
}

}  // inline namespace DLAC_GRID_BUILD
}  // namespace grid
}  // namespace dlac
