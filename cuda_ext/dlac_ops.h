// Argument checks shared by every implementation of the dlac ops (CPU, CUDA, and the CPU emulation of the device
// pipeline that the tests build), so that each rejects bad input with the same message.
#pragma once

#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstdint>

#include "dlac_codec.h"
#include "dlac_str.h"

namespace dlac {

inline void check_splits(c10::IntArrayRef splits, int64_t total, const char* name) {
  TORCH_CHECK(splits.size() >= 2, ::dlac::str(name, " must hold at least two split points [0, ..., ", total, "]"));
  TORCH_CHECK(splits.front() == 0 && splits.back() == total,
              ::dlac::str(name, " must start at 0 and end at ", total, ", got [", splits.front(), ", ..., ",
                          splits.back(), "]"));
  for (size_t i = 1; i < splits.size(); ++i)
    TORCH_CHECK(splits[i] >= splits[i - 1], ::dlac::str(name, " must be non-decreasing, got ", splits[i - 1], " then ",
                                                        splits[i]));
}

inline void check_chunk_limits(c10::IntArrayRef rs, c10::IntArrayRef cs) {
  for (size_t r = 0; r + 1 < rs.size(); ++r)
    for (size_t c = 0; c + 1 < cs.size(); ++c) {
      uint64_t n = uint64_t(rs[r + 1] - rs[r]) * uint64_t(cs[c + 1] - cs[c]);
      TORCH_CHECK(n <= kMaxChunkElements, ::dlac::str("block (", r, ", ", c, ") has ", n,
                                                      " elements, more than the 2^28 a chunk may hold; split it into"
                                                      " more row blocks"));
    }
}

// bp: one float32 bound per column block (host memory).
inline void check_bounds(const float* bp, int64_t count, bool relative) {
  for (int64_t c = 0; c < count; ++c) {
    TORCH_CHECK(std::isfinite(bp[c]) && bp[c] >= 0.0f, ::dlac::str("bounds must be finite and >= 0 (0 = raw), got ",
                                                                   bp[c]));
    TORCH_CHECK(!relative || bp[c] < 1.0f, ::dlac::str("relative bounds must be < 1, got ", bp[c]));
  }
}

}  // namespace dlac
