// dlac::cast_column_blocks (CPU): the gradient exchange's gather and cast in one pass.
//
// The column blocks col_splits[c]:col_splits[c + 1] of a float32 [rows, cols] tensor, each flattened row by row and
// laid one after the other, as bfloat16 or float16: the bits of torch.cat([x[:, a:b].reshape(-1), ...]).to(dtype),
// the layout TorchRec's backward all-to-all sends. x is read once, in order, one row at a time, each row's segments
// written to their blocks (a pass per block, reading x strided, ran ~3x slower on the team's CPUs).
//
// Rounding is torch's own: round to nearest even. With AVX2 (bfloat16) or F16C (float16) this is the arithmetic
// of torch's vectorized casts (ATen/cpu/vec: bfloat16 by the integer rounding-bias trick, NaN -> 0xffff; float16 by
// vcvtps2ph); without them c10::BFloat16 / c10::Half, torch's scalar casts. A NaN's payload bits may differ where
// torch took the other path; every other value matches bit for bit.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/types.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "dlac_ops.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define DLAC_CAST_X86 1
#endif

namespace dlac {
namespace cast {

inline uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0xffff;  // NaN, as torch's vectorized cast writes it
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

#ifdef DLAC_CAST_X86
__attribute__((target("avx2"))) inline __m256i bf16_of8(__m256 x) {
  const __m256i v = _mm256_castps_si256(x);
  __m256i t = _mm256_and_si256(_mm256_srli_epi32(v, 16), _mm256_set1_epi32(1));
  t = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(t, _mm256_set1_epi32(0x7fff)), v), 16);
  const __m256i ordered = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_ORD_Q));
  return _mm256_blendv_epi8(_mm256_set1_epi32(0xffff), t, ordered);
}

__attribute__((target("avx2"))) inline void bf16_row_avx2(const float* s, uint16_t* d, int64_t n) {
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m256i packed = _mm256_packus_epi32(bf16_of8(_mm256_loadu_ps(s + j)), bf16_of8(_mm256_loadu_ps(s + j + 8)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + j), _mm256_permute4x64_epi64(packed, 0xd8));
  }
  for (; j < n; ++j) d[j] = bf16_bits(s[j]);
}

__attribute__((target("avx2,f16c"))) inline void f16_row_f16c(const float* s, uint16_t* d, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + j), _mm256_cvtps_ph(_mm256_loadu_ps(s + j), _MM_FROUND_TO_NEAREST_INT));
  for (; j < n; ++j) d[j] = c10::Half(s[j]).x;
}
#endif

// One row segment of n floats to n wire values.
using RowCast = void (*)(const float*, uint16_t*, int64_t);

inline void bf16_row_scalar(const float* s, uint16_t* d, int64_t n) {
  for (int64_t j = 0; j < n; ++j) d[j] = c10::BFloat16(s[j]).x;
}

inline void f16_row_scalar(const float* s, uint16_t* d, int64_t n) {
  for (int64_t j = 0; j < n; ++j) d[j] = c10::Half(s[j]).x;
}

inline RowCast row_cast(bool bf16) {
#ifdef DLAC_CAST_X86
  static const bool avx2 = __builtin_cpu_supports("avx2");
  static const bool f16c = avx2 && __builtin_cpu_supports("f16c");
  if (bf16 && avx2) return &bf16_row_avx2;
  if (!bf16 && f16c) return &f16_row_f16c;
#endif
  return bf16 ? &bf16_row_scalar : &f16_row_scalar;
}

}  // namespace cast

inline void cast_column_blocks_cpu(const at::Tensor& x, c10::IntArrayRef col_splits, const at::Tensor& out) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2,
              "dlac::cast_column_blocks: x must be a 2-D float32 CPU tensor");
  TORCH_CHECK(x.size(1) <= 1 || x.stride(1) == 1, "x's columns must be contiguous (column stride 1)");
  check_splits(col_splits, x.size(1), "col_splits");
  TORCH_CHECK(out.device().is_cpu() && out.dim() == 1 && out.is_contiguous() &&
                  (out.scalar_type() == at::kBFloat16 || out.scalar_type() == at::kHalf),
              "out must be a contiguous 1-D bfloat16 or float16 CPU tensor");
  const int64_t rows = x.size(0), cols = x.size(1);
  TORCH_CHECK(out.numel() == rows * cols, "out must hold rows x cols = ", rows * cols, " elements, got ", out.numel());
  if (rows == 0 || cols == 0) return;
  const cast::RowCast cast_row = cast::row_cast(out.scalar_type() == at::kBFloat16);
  const float* xp = x.data_ptr<float>();
  const int64_t ld = x.stride(0);
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr());
  const std::vector<int64_t> splits(col_splits.begin(), col_splits.end());
  at::parallel_for(0, rows, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      for (size_t c = 0; c + 1 < splits.size(); ++c) {
        const int64_t a = splits[c], w = splits[c + 1] - a;
        if (w > 0) cast_row(xp + i * ld + a, op + rows * a + i * w, w);
      }
  });
}

}  // namespace dlac
