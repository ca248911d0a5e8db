// The DLAC chunk codec: the same algorithm as lightning_dlac/codec/reference.py, byte for byte.
//
// docs/codec.md is the specification in words. Everything here is plain C++17 on raw pointers, shared by the CPU
// kernels (dlac_cpu.cpp) and the device pipeline (dlac_grid.h, dlac_cuda.cu): functions marked DLAC_HD are also
// compiled for the GPU, and the host-side planning (plan_chunk, Huffman lengths, header checks) is the one both
// encoders use, so their decisions cannot drift apart. Floating-point code must be compiled with -ffp-contract=off
// (no FMA) and without -ffast-math: every multiply and add is rounded separately to float32 (device code spells
// each operation with its round-to-nearest intrinsic, which nvcc never contracts).
#pragma once

#if defined(__CUDACC__)
#define DLAC_HD __host__ __device__
#else
#define DLAC_HD
#endif
// The encoder's hot loops must be inlined into it: GCC stopped doing so on its own under C++20 (torch 2.13+'s
// default), which cost about 20% of encode throughput (measured: 0.98-1.12 against 1.27-1.33 GB/s on Criteo chunks).
#if defined(__GNUC__)
#define DLAC_ALWAYS_INLINE __attribute__((always_inline))
#else
#define DLAC_ALWAYS_INLINE
#endif

#include <algorithm>
#include <cmath>
#if defined(__SSE2__) && !defined(__CUDA_ARCH__)
#include <emmintrin.h>
#endif
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the DLAC codec reads and writes little-endian buffers with memcpy; a big-endian port needs byte swaps"
#endif

namespace dlac {

constexpr uint32_t kHeaderSize = 48;
constexpr uint32_t kCrcOffset = 44;
constexpr uint8_t kVersion = 1;
enum Mode : uint8_t { kConst = 0, kRaw = 1, kPack = 2, kHuff = 3, kDedup = 4 };
constexpr float kMaxQ = 8388607.0f;          // largest pre-rounding value; codes fit in 24 bits
constexpr float kRoundMagic = 8388608.0f;    // (v + 2^23) - 2^23 == round_half_even(v) for 0 <= v <= 2^23
constexpr uint32_t kMaxCodeBits = 24;
// step = float32(abs_eb * k) for the first k that holds every element (see reference.STEP_FACTORS).
constexpr float kStepFactors[] = {2.0f, 1.9921875f, 1.5f, 1.0f};
constexpr uint64_t kMaxChunkElements = 1ull << 28;
constexpr uint32_t kHuffMaxLen = 12;
constexpr uint32_t kHuffMaxAlphabet = 1u << kHuffMaxLen;
constexpr uint32_t kHuffBlock = 4096;
constexpr uint32_t kHuffSectionHeader = 8;
constexpr uint8_t kFlagSec0Huff = 1;
constexpr uint8_t kFlagSec1Huff = 2;

// A buffer that does not decode; the message says what is wrong (the caller adds which chunk).
struct DecodeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ------------------------------------------------------------------------------------------------------------
// Little helpers
// ------------------------------------------------------------------------------------------------------------

DLAC_HD inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
inline uint64_t load_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
DLAC_HD inline void store_u32(uint8_t* p, uint32_t v) { memcpy(p, &v, 4); }
DLAC_HD inline float bits_to_float(uint32_t b) {
  float f;
  memcpy(&f, &b, 4);
  return f;
}
DLAC_HD inline uint32_t float_to_bits(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return b;
}
DLAC_HD inline uint32_t bits_for(uint32_t vmax) {
  uint32_t w = 0;
  while (w < 32 && (vmax >> w) != 0) ++w;
  return w;
}
DLAC_HD inline uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// An environment switch of the host code: set, and neither empty nor "0".
inline bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

// float32 operations rounded to nearest one at a time. On the host these are the plain operators (the build flags
// forbid contraction); on the device the intrinsics make it explicit whatever --fmad says.
DLAC_HD inline float f_add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
DLAC_HD inline float f_sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
DLAC_HD inline float f_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
DLAC_HD inline float f_div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
DLAC_HD inline bool f_isfinite(float v) { return (float_to_bits(v) & 0x7F800000u) != 0x7F800000u; }

// CRC-32 (zlib/IEEE polynomial, reflected), slicing-by-8.
struct Crc32Table {
  uint32_t t[8][256];
  Crc32Table() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
  }
};
inline const Crc32Table& crc_table() {
  static const Crc32Table table;
  return table;
}
inline uint32_t crc32_update(uint32_t crc, const uint8_t* p, size_t n) {
  const auto& T = crc_table().t;
  crc = ~crc;
  while (n >= 8) {
    uint32_t lo = load_u32(p) ^ crc;
    uint32_t hi = load_u32(p + 4);
    crc = T[7][lo & 0xFF] ^ T[6][(lo >> 8) & 0xFF] ^ T[5][(lo >> 16) & 0xFF] ^ T[4][lo >> 24] ^
          T[3][hi & 0xFF] ^ T[2][(hi >> 8) & 0xFF] ^ T[1][(hi >> 16) & 0xFF] ^ T[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) crc = T[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
  return ~crc;
}
// The CRC register after feeding buf[begin, end) of a chunk into register r (no initial or final inversion), with
// the bytes of the header's crc field taken as zero; t0 is the first slicing table. Bytewise, for the device,
// where each thread feeds one segment and the segments are joined with crc_shift (dlac_grid_transfer.h).
DLAC_HD inline uint32_t crc_register(uint32_t r, const uint8_t* buf, uint64_t begin, uint64_t end, const uint32_t* t0) {
  for (uint64_t i = begin; i < end; ++i) {
    uint32_t b = (i >= kCrcOffset && i < kCrcOffset + 4) ? 0u : buf[i];
    r = t0[(r ^ b) & 0xFF] ^ (r >> 8);
  }
  return r;
}

// CRC of a whole buffer with its header's crc field taken as zero.
inline uint32_t buffer_crc(const uint8_t* buf, size_t n) {
  static const uint8_t zeros[4] = {0, 0, 0, 0};
  uint32_t crc = crc32_update(0, buf, kCrcOffset);
  crc = crc32_update(crc, zeros, 4);
  return crc32_update(crc, buf + kCrcOffset + 4, n - kCrcOffset - 4);
}

// ------------------------------------------------------------------------------------------------------------
// Header
// ------------------------------------------------------------------------------------------------------------

struct Header {
  uint8_t mode = kConst, flags = 0, width0 = 0, width1 = 0;
  uint32_t rows = 0, dim = 0;
  float min = 0.0f, abs_eb = 0.0f, step = 0.0f;
  uint32_t nuniq = 0, sec0 = 0, sec1 = 0, crc = 0;
};

inline void write_header(const Header& h, uint8_t* p) {
  std::memcpy(p, "DLAC", 4);
  p[4] = kVersion;
  p[5] = h.mode;
  p[6] = h.flags;
  p[7] = h.width0;
  p[8] = h.width1;
  p[9] = p[10] = p[11] = 0;
  store_u32(p + 12, h.rows);
  store_u32(p + 16, h.dim);
  store_u32(p + 20, float_to_bits(h.min));
  store_u32(p + 24, float_to_bits(h.abs_eb));
  store_u32(p + 28, float_to_bits(h.step));
  store_u32(p + 32, h.nuniq);
  store_u32(p + 36, h.sec0);
  store_u32(p + 40, h.sec1);
  store_u32(p + 44, h.crc);
}

[[noreturn]] inline void fail(const std::string& what) { throw DecodeError(what); }

// Parse and validate a complete chunk buffer of n bytes (docs/codec.md, "Validation"); throws DecodeError. Only the
// 48 header bytes at p are read when crc, the buffer's checksum as buffer_crc computes it, is given (the device
// decoder computes checksums where the buffers are and validates the headers here).
inline Header parse_header(const uint8_t* p, uint64_t n, const uint32_t* crc = nullptr) {
  if (n < kHeaderSize)
    fail(std::to_string(n) + " bytes is shorter than the 48-byte DLAC header (truncated?)");
  if (std::memcmp(p, "DLAC", 4) != 0) fail("not a DLAC buffer (bad magic)");
  if (p[4] != kVersion) fail("format version " + std::to_string(p[4]) + " is not supported (this build reads 1)");
  Header h;
  h.mode = p[5];
  h.flags = p[6];
  h.width0 = p[7];
  h.width1 = p[8];
  if (h.mode > kDedup) fail("unknown mode " + std::to_string(h.mode));
  if (p[9] || p[10] || p[11]) fail("reserved header bytes are not zero");
  h.rows = load_u32(p + 12);
  h.dim = load_u32(p + 16);
  h.min = bits_to_float(load_u32(p + 20));
  h.abs_eb = bits_to_float(load_u32(p + 24));
  h.step = bits_to_float(load_u32(p + 28));
  h.nuniq = load_u32(p + 32);
  h.sec0 = load_u32(p + 36);
  h.sec1 = load_u32(p + 40);
  h.crc = load_u32(p + 44);
  uint64_t total = uint64_t(kHeaderSize) + h.sec0 + h.sec1;
  if (total != n)
    fail("header announces " + std::to_string(total) + " bytes but the buffer holds " + std::to_string(n) +
         " (truncated or padded?)");
  if ((crc != nullptr ? *crc : buffer_crc(p, n)) != h.crc) fail("checksum mismatch (corrupted buffer)");

  const uint64_t elems = uint64_t(h.rows) * h.dim;
  if (elems > kMaxChunkElements) fail("shape exceeds the 2^28-element chunk limit");
  const bool quantized = h.mode == kPack || h.mode == kHuff || h.mode == kDedup;
  switch (h.mode) {
    case kConst:
      if (h.flags || h.width0 || h.width1 || h.nuniq || h.sec0 || h.sec1 || !std::isfinite(h.min) || h.abs_eb != 0.0f ||
          h.step != 0.0f)
        fail("inconsistent CONST header");
      break;
    case kRaw:
      if (h.flags || h.width0 || h.width1 || h.nuniq || h.sec1 || h.sec0 != 4 * elems || h.min != 0.0f ||
          h.abs_eb != 0.0f || h.step != 0.0f)
        fail("inconsistent RAW header");
      break;
    default:
      break;
  }
  if (quantized) {
    if (elems == 0 || !std::isfinite(h.min) || !(std::isfinite(h.abs_eb) && h.abs_eb > 0.0f) ||
        !(std::isfinite(h.step) && h.step > 0.0f && double(h.step) <= 2.0 * double(h.abs_eb)) ||
        h.width0 > kMaxCodeBits)
      fail("inconsistent quantization parameters");
  }
  if (h.mode == kPack) {
    if (h.flags || h.width1 || h.nuniq || h.sec1 || h.sec0 != ceil_div(elems * h.width0, 8))
      fail("inconsistent PACK header");
  } else if (h.mode == kHuff) {
    if (h.flags != kFlagSec0Huff || h.width0 || h.width1 || h.nuniq || h.sec1) fail("inconsistent HUFF header");
  } else if (h.mode == kDedup) {
    if ((h.flags & ~3) || h.nuniq < 1 || h.nuniq > h.rows || h.width1 > kMaxCodeBits) fail("inconsistent DEDUP header");
    if (h.flags & kFlagSec0Huff) {
      if (h.width0) fail("inconsistent DEDUP header");
    } else if (h.sec0 != ceil_div(uint64_t(h.nuniq) * h.dim * h.width0, 8)) {
      fail("inconsistent DEDUP header");
    }
    if (h.flags & kFlagSec1Huff) {
      if (h.width1) fail("inconsistent DEDUP header");
    } else if (h.sec1 != ceil_div(uint64_t(h.rows) * h.width1, 8)) {
      fail("inconsistent DEDUP header");
    }
  }
  return h;
}

// ------------------------------------------------------------------------------------------------------------
// Quantization
// ------------------------------------------------------------------------------------------------------------

// Exact |x - xh| <= eb in float32 arithmetic (TwoSum recovers the rounding error of x - xh).
DLAC_HD inline bool within(float x, float xh, float eb) {
  float s = f_sub(x, xh);
  float bb = f_sub(s, x);
  float err = f_add(f_sub(x, f_sub(s, bb)), f_sub(-xh, bb));
  float a = fabsf(s);
  return (a < eb) | ((a == eb) & (((s > 0.0f) & (err <= 0.0f)) | ((s < 0.0f) & (err >= 0.0f))));
}

// 1 unless |x - xh| <= eb exactly; within() as integer masks, so that loops calling it vectorize.
inline uint32_t outside(float x, float xh, float eb) {
  float s = x - xh;
  float bb = s - x;
  float err = (x - (s - bb)) + ((-xh) - bb);
  float a = std::fabs(s);
  uint32_t lt = a < eb, eq = a == eb;
  uint32_t pos = uint32_t(s > 0.0f) & uint32_t(err <= 0.0f), neg = uint32_t(s < 0.0f) & uint32_t(err >= 0.0f);
  return (lt | (eq & (pos | neg))) ^ 1u;
}

// The code of one element for one step, as quantize_with_step gives it (the device quantizes element by element):
// kHeld with *code set, kMissed if neither the rounded code nor a neighbour holds within eb, kOverflow if the code
// would not fit in 24 bits.
enum QuantStatus : int { kHeld = 0, kMissed = 1, kOverflow = 2 };
DLAC_HD inline int quantize_element(float xv, float lo, float eb, float step, uint32_t* code) {
  float v = f_div(f_sub(xv, lo), step);
  if (!(v <= kMaxQ)) return kOverflow;
  float q = f_sub(f_add(v, kRoundMagic), kRoundMagic);
  uint32_t c = uint32_t(int32_t(q));
  if (within(xv, f_add(lo, f_mul(q, step)), eb)) {
    *code = c;
    return kHeld;
  }
  if (c >= 1 && within(xv, f_add(lo, f_mul(f_sub(q, 1.0f), step)), eb)) {
    *code = c - 1;
    return kHeld;
  }
  if (within(xv, f_add(lo, f_mul(f_add(q, 1.0f), step)), eb)) {
    *code = c + 1;
    return kHeld;
  }
  return kMissed;
}

// Codes for the rows at rowp (nrows x dim) for one step: 1 if every element holds within eb (after neighbour
// repair), 0 if one cannot, -1 if a code would not fit in 24 bits. Mirrors reference._quantize_with_step.
// *qmax is set to the largest code when every element holds; hi is the largest element; suspect is scratch.
//
// The main loop only tests float32 |x - xh| < eb, which implies the exact |x - xh| <= eb (rounding is monotone and
// eb is a float32, so an exact difference >= eb cannot round below eb); rows with an element that fails it (one
// off by a rounding error, or exactly on the bound) are listed and re-tested exactly, then repaired.
// The rounded codes of quantize_with_step's main loop; returns nonzero if a code would overflow. kDim > 0 fixes the
// row width at compile time.
template <int64_t kDim>
DLAC_ALWAYS_INLINE inline uint32_t quantize_rows(const float* const* rowp, int64_t nrows, int64_t dim_arg, float lo,
                                                 float eb, float step, uint32_t* codes, std::vector<uint32_t>& suspect) {
  const int64_t dim = kDim > 0 ? kDim : dim_arg;
  uint32_t overflow = 0;
  for (int64_t r = 0; r < nrows; ++r) {
    const float* p = rowp[r];
    uint32_t* c = codes + r * dim;
    uint32_t of = 0, bd = 0;
    for (int64_t j = 0; j < dim; ++j) {
      float xv = p[j];
      float v = (xv - lo) / step;
      of |= uint32_t(!(v <= kMaxQ));
      v = kMaxQ < v ? kMaxQ : v;  // its codes are discarded when it overflows; clamping keeps the loop branch-free
      float q = (v + kRoundMagic) - kRoundMagic;
      float xh = lo + q * step;
      bd |= uint32_t(!(std::fabs(xv - xh) < eb));
      c[j] = uint32_t(int32_t(q));  // 0 <= q <= 2^23: exact through int32 (which vectorizes; uint32 does not)
    }
    overflow |= of;
    if (bd) suspect.push_back(uint32_t(r));
  }
  return overflow;
}

// quantize_rows compiled for AVX2 as well (x86-64 hosts with GCC or Clang), chosen at run time: the loop is most
// of the encoder's time and SSE2, the baseline the library is built for, holds 4 floats a vector to AVX2's 8.
// Same bytes: every operation is the same separately rounded IEEE float32 operation (no FMA: the build passes
// -ffp-contract=off and the target adds no "fma"), only more elements at a time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__)
#define DLAC_X86_DISPATCH 1
template <int64_t kDim>
__attribute__((target("avx2"))) __attribute__((noinline)) uint32_t quantize_rows_avx2(
    const float* const* rowp, int64_t nrows, int64_t dim, float lo, float eb, float step, uint32_t* codes,
    std::vector<uint32_t>& suspect) {
  return quantize_rows<kDim>(rowp, nrows, dim, lo, eb, step, codes, suspect);
}
// DLAC_CPU_BASELINE set (and not "0") keeps the SSE2 loop on an AVX2 host, so that tests can check both copies.
inline bool cpu_has_avx2() {
  static const bool has = !env_flag("DLAC_CPU_BASELINE") && __builtin_cpu_supports("avx2");
  return has;
}
#endif

DLAC_ALWAYS_INLINE inline int quantize_with_step(const float* const* rowp, int64_t nrows, int64_t dim, float lo,
                                                 float hi, float eb, float step, uint32_t* codes, uint32_t* qmax,
                                                 std::vector<uint32_t>& suspect) {
  suspect.clear();
  uint32_t overflow;
#if defined(DLAC_X86_DISPATCH)
  if (cpu_has_avx2()) {
    overflow = dim == 64    ? quantize_rows_avx2<64>(rowp, nrows, dim, lo, eb, step, codes, suspect)
               : dim == 128 ? quantize_rows_avx2<128>(rowp, nrows, dim, lo, eb, step, codes, suspect)
                            : quantize_rows_avx2<0>(rowp, nrows, dim, lo, eb, step, codes, suspect);
  } else
#endif
  {
    overflow = dim == 64    ? quantize_rows<64>(rowp, nrows, dim, lo, eb, step, codes, suspect)
               : dim == 128 ? quantize_rows<128>(rowp, nrows, dim, lo, eb, step, codes, suspect)
                            : quantize_rows<0>(rowp, nrows, dim, lo, eb, step, codes, suspect);
  }
  if (overflow) return -1;
  // Every step of the rounded code is a monotone float32 operation, so the largest element has the largest code.
  const uint32_t top = uint32_t(int32_t(((hi - lo) / step + kRoundMagic) - kRoundMagic));
  *qmax = top;
  if (suspect.empty()) return 1;
  // The exact test, and where the rounded code misses the bound by a rounding error, its neighbours in the
  // reference's order. The largest code changes only if a repair moves a code above it or one at it down.
  uint32_t m = top;
  bool rescan = false;
  for (uint32_t r : suspect) {
    const float* p = rowp[r];
    uint32_t* c = codes + int64_t(r) * dim;
    for (int64_t j = 0; j < dim; ++j) {
      float xv = p[j];
      float q = float(c[j]);
      if (within(xv, lo + q * step, eb)) continue;
      float down = q - 1.0f, up = q + 1.0f;
      if (c[j] >= 1 && within(xv, lo + down * step, eb)) {
        rescan |= c[j] == top;
        c[j] -= 1;
      } else if (within(xv, lo + up * step, eb)) {
        c[j] += 1;
        m = c[j] > m ? c[j] : m;
      } else {
        return 0;
      }
    }
  }
  if (rescan) {
    m = 0;
    for (int64_t i = 0; i < nrows * dim; ++i) m = codes[i] > m ? codes[i] : m;
  }
  *qmax = m;
  return 1;
}

// ------------------------------------------------------------------------------------------------------------
// Huffman code construction (mirrors reference.huffman_lengths / canonical_codes)
// ------------------------------------------------------------------------------------------------------------

inline std::vector<uint8_t> huffman_lengths(const std::vector<uint64_t>& freq) {
  const uint32_t a = uint32_t(freq.size());
  std::vector<uint8_t> lens(a, 0);
  std::vector<uint32_t> used;
  for (uint32_t s = 0; s < a; ++s)
    if (freq[s]) used.push_back(s);
  if (used.empty()) return lens;
  if (used.size() == 1) {
    lens[used[0]] = 1;
    return lens;
  }
  // Merge the two lightest nodes, ordered by (weight, id), until one is left: the reference does it with a heap.
  // Two queues give the same sequence in O(n) after one sort: leaves sorted by (weight, id), and merged nodes,
  // which are created with non-decreasing weights and increasing ids (all above the leaves'), so each queue is
  // already in (weight, id) order and the lighter front is the heap's next pop.
  using Item = std::pair<uint64_t, uint32_t>;  // (weight, id)
  // The leaves in (weight, id) order, and the symbols in (weight descending, id) order for handing out lengths:
  // weights below kSmall by a counting sort (a row index stream's weights are mostly 1 or 2, and std::sort over
  // its thousands of symbols took about 6% of gradient encode time), the others by std::sort.
  constexpr uint64_t kSmall = 64;
  uint32_t bucket[kSmall + 1] = {0};
  std::vector<Item> big;
  for (uint32_t s : used) {
    if (freq[s] < kSmall) bucket[freq[s] + 1] += 1;
    else big.push_back({freq[s], s});
  }
  std::sort(big.begin(), big.end());
  for (uint64_t w = 1; w <= kSmall; ++w) bucket[w] += bucket[w - 1];  // bucket[w]: first slot of weight w
  const size_t nsmall = bucket[kSmall];
  std::vector<Item> leaves(used.size());
  for (uint32_t s : used)  // ids ascending within a weight
    if (freq[s] < kSmall) leaves[bucket[freq[s]]++] = {freq[s], s};
  std::copy(big.begin(), big.end(), leaves.begin() + nsmall);
  std::vector<Item> merged;
  merged.reserve(used.size());
  size_t li = 0, mi = 0;
  auto pop = [&]() -> Item {
    if (mi < merged.size() && (li == leaves.size() || merged[mi] < leaves[li])) return merged[mi++];
    return leaves[li++];
  };
  std::vector<uint32_t> parent(2 * size_t(a) + used.size(), 0);
  uint32_t next_id = a;
  for (size_t left = used.size(); left > 1; --left) {
    Item x = pop();
    Item y = pop();
    parent[x.second] = parent[y.second] = next_id;
    merged.push_back({x.first + y.first, next_id});
    ++next_id;
  }
  const uint32_t root = next_id - 1;
  std::vector<uint32_t> depth(next_id, 0);
  for (uint32_t node = root; node-- > a;) depth[node] = depth[parent[node]] + 1;
  std::vector<uint64_t> counts(std::max<size_t>(used.size(), kHuffMaxLen) + 1, 0);
  for (uint32_t s : used) counts[depth[parent[s]] + 1] += 1;
  for (size_t i = counts.size() - 1; i > kHuffMaxLen; --i) {
    while (counts[i] > 0) {
      size_t j = i - 2;
      while (counts[j] == 0) --j;
      counts[i] -= 2;
      counts[i - 1] += 1;
      counts[j + 1] += 2;
      counts[j] -= 1;
    }
  }
  // (weight descending, id ascending): the leaves' weight groups in reverse, ids ascending within each.
  std::vector<uint32_t> order(used.size());
  {
    size_t k = 0, end = leaves.size();
    while (end > 0) {
      size_t begin = end - 1;
      while (begin > 0 && leaves[begin - 1].first == leaves[end - 1].first) --begin;
      for (size_t i = begin; i < end; ++i) order[k++] = leaves[i].second;
      end = begin;
    }
  }
  size_t k = 0;
  for (uint32_t len = 1; len <= kHuffMaxLen; ++len)
    for (uint64_t c = 0; c < counts[len]; ++c) lens[order[k++]] = uint8_t(len);
  return lens;
}

// The first canonical code of each length, from the number of codes of each length (deflate's rule).
DLAC_HD inline void first_codes(const uint32_t* bl_count, uint32_t* next_code) {
  uint32_t code = 0;
  next_code[0] = 0;
  for (uint32_t len = 1; len <= kHuffMaxLen; ++len) {
    code = (code + bl_count[len - 1]) << 1;
    next_code[len] = code;
  }
}
// The l low bits of c in reverse order (canonical codes are MSB-first; the bit streams are LSB-first).
// Reverses all 32 bits with five swaps, then keeps the top l (a bit loop cost ~10% of gradient encode: a row index
// stream has thousands of symbols with 10-12 bit codes).
DLAC_HD inline uint32_t reverse_bits(uint32_t c, uint32_t l) {
  uint32_t r = c;
  r = ((r >> 1) & 0x55555555u) | ((r & 0x55555555u) << 1);
  r = ((r >> 2) & 0x33333333u) | ((r & 0x33333333u) << 2);
  r = ((r >> 4) & 0x0F0F0F0Fu) | ((r & 0x0F0F0F0Fu) << 4);
  r = ((r >> 8) & 0x00FF00FFu) | ((r & 0x00FF00FFu) << 8);
  r = (r >> 16) | (r << 16);
  return l == 0 ? 0u : r >> (32 - l);
}

// LSB-first (bit-reversed) canonical codes, ready to be OR-ed into an LSB-first bit stream.
inline std::vector<uint32_t> reversed_canonical_codes(const std::vector<uint8_t>& lens) {
  uint32_t bl_count[kHuffMaxLen + 2] = {0};
  for (uint8_t l : lens)
    if (l) bl_count[l] += 1;
  uint32_t next_code[kHuffMaxLen + 2] = {0};
  first_codes(bl_count, next_code);
  std::vector<uint32_t> rev(lens.size(), 0);
  for (size_t s = 0; s < lens.size(); ++s)
    if (lens[s]) rev[s] = reverse_bits(next_code[lens[s]]++, lens[s]);
  return rev;
}

// ------------------------------------------------------------------------------------------------------------
// Streams: PACK and HUFF
// ------------------------------------------------------------------------------------------------------------

// Plan for one stream of n values in [0, vmax]: PACK or HUFF, whichever is smaller (ties go to PACK).
struct StreamPlan {
  bool huff = false;
  uint32_t width = 0;
  uint64_t size = 0;
  uint32_t alphabet = 0;
  std::vector<uint8_t> lens;
};

inline StreamPlan plan_stream(uint64_t n, uint32_t vmax, const std::vector<uint64_t>* freq) {
  StreamPlan p;
  p.width = bits_for(vmax);
  p.size = ceil_div(n * p.width, 8);
  if (freq != nullptr && uint64_t(vmax) + 1 <= kHuffMaxAlphabet) {
    std::vector<uint8_t> lens = huffman_lengths(*freq);
    uint64_t bits = 0;
    for (size_t s = 0; s < lens.size(); ++s) bits += (*freq)[s] * lens[s];
    uint64_t hsize = kHuffSectionHeader + ceil_div(vmax + 1, 2) + 4 * ceil_div(n, kHuffBlock) + ceil_div(bits, 8);
    if (hsize < p.size) {
      p.huff = true;
      p.width = 0;
      p.size = hsize;
      p.alphabet = vmax + 1;
      p.lens = std::move(lens);
    }
  }
  return p;
}

// LSB-first bit writer into a pre-sized buffer.
struct BitWriter {
  uint8_t* out;
  uint64_t acc = 0;
  uint32_t nbits = 0;
  explicit BitWriter(uint8_t* o) : out(o) {}
  inline void put(uint32_t value, uint32_t width) {  // width <= 24
    acc |= uint64_t(value) << nbits;
    nbits += width;
    if (nbits >= 32) {
      store_u32(out, uint32_t(acc));
      out += 4;
      acc >>= 32;
      nbits -= 32;
    }
  }
  inline void flush() {
    while (nbits > 0) {
      *out++ = uint8_t(acc);
      acc >>= 8;
      nbits = nbits > 8 ? nbits - 8 : 0;
    }
  }
};

inline void pack_stream(const uint32_t* vals, uint64_t n, uint32_t width, uint8_t* out) {
  if (width == 0) return;
  BitWriter w(out);
  for (uint64_t i = 0; i < n; ++i) w.put(vals[i], width);
  w.flush();
}

// Bytes of a HUFF section before its block end offsets: alphabet size, block count, code lengths as nibbles.
inline uint64_t huff_prefix_size(const StreamPlan& p) { return kHuffSectionHeader + ceil_div(p.alphabet, 2); }
inline void write_huff_prefix(const StreamPlan& p, uint64_t n, uint8_t* out) {
  store_u32(out, p.alphabet);
  store_u32(out + 4, uint32_t(ceil_div(n, kHuffBlock)));
  uint8_t* q = out + kHuffSectionHeader;
  for (uint32_t s = 0; s < p.alphabet; s += 2) {
    uint8_t lo = p.lens[s], hi = s + 1 < p.alphabet ? p.lens[s + 1] : 0;
    *q++ = uint8_t(lo | (hi << 4));
  }
}
// Per symbol: reversed code | length << 24, the table both encoders write codes from.
inline std::vector<uint32_t> huff_code_table(const StreamPlan& p) {
  std::vector<uint32_t> rev = reversed_canonical_codes(p.lens);
  std::vector<uint32_t> table(p.alphabet);
  for (uint32_t s = 0; s < p.alphabet; ++s) table[s] = rev[s] | (uint32_t(p.lens[s]) << 24);
  return table;
}

inline void store_u64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }

// Writes the section (p.size bytes at out) and up to 8 zero bytes after it: out must have 8 writable bytes past
// the section, which a later section may then overwrite. Codes are at most 12 bits, so four of them fit in the
// 64-bit accumulator on top of the < 8 bits left over, and each group of four costs one unconditional 8-byte store.
inline void huff_encode(const uint32_t* vals, uint64_t n, const StreamPlan& p, uint8_t* out) {
  static_assert(7 + 4 * kHuffMaxLen <= 64, "four codes must fit in the bit accumulator");
  const uint32_t nblocks = uint32_t(ceil_div(n, kHuffBlock));
  write_huff_prefix(p, n, out);
  uint8_t* ends = out + huff_prefix_size(p);
  uint8_t* q = ends + 4 * size_t(nblocks);
  std::vector<uint32_t> table = huff_code_table(p);
  const uint32_t* t = table.data();
  uint64_t acc = 0, bitpos = 0;
  uint32_t nb = 0;  // bits in acc, < 8 between groups
  auto put = [&](uint32_t e) {
    acc |= uint64_t(e & 0xFFFFFFu) << nb;
    nb += e >> 24;
  };
  auto drain = [&]() {
    store_u64(q, acc);
    q += nb >> 3;
    bitpos += nb & ~7u;
    acc >>= (nb & ~7u);
    nb &= 7u;
  };
  for (uint32_t b = 0; b < nblocks; ++b) {
    const uint64_t begin = uint64_t(b) * kHuffBlock, end = std::min<uint64_t>(n, begin + kHuffBlock);
    uint64_t i = begin;
    for (; i + 4 <= end; i += 4) {
      // The four codes are joined into one value first (pairs, then the pairs), so that only one shift and one add
      // per group wait on the accumulator's bit count rather than four: the same bits as four put()s.
      const uint32_t e0 = t[vals[i]], e1 = t[vals[i + 1]], e2 = t[vals[i + 2]], e3 = t[vals[i + 3]];
      const uint32_t l0 = e0 >> 24, l1 = e1 >> 24, l2 = e2 >> 24, l3 = e3 >> 24;
      const uint64_t v01 = uint64_t(e0 & 0xFFFFFFu) | (uint64_t(e1 & 0xFFFFFFu) << l0);
      const uint64_t v23 = uint64_t(e2 & 0xFFFFFFu) | (uint64_t(e3 & 0xFFFFFFu) << l2);
      acc |= (v01 | (v23 << (l0 + l1))) << nb;
      nb += (l0 + l1) + (l2 + l3);
      drain();
    }
    for (; i < end; ++i) put(t[vals[i]]);
    drain();
    store_u32(ends + 4 * size_t(b), uint32_t(bitpos + nb));
  }
  store_u64(q, acc);
}

// Decode n values of a PACK stream (data holds exactly ceil(n*width/8) bytes, validated by the header).
template <typename Sink>
inline void unpack_stream(const uint8_t* data, uint64_t nbytes, uint64_t n, uint32_t width, Sink sink) {
  if (width == 0) {
    for (uint64_t i = 0; i < n; ++i) sink(i, 0u);
    return;
  }
  const uint64_t mask = (1ull << width) - 1;
  // Fast path reads 8 bytes at a time while they are all inside the section; the tail goes through a copy.
  uint64_t i = 0;
  for (; i < n; ++i) {
    uint64_t bit = i * width;
    if ((bit >> 3) + 8 > nbytes) break;
    sink(i, uint32_t((load_u64(data + (bit >> 3)) >> (bit & 7)) & mask));
  }
  if (i < n) {
    uint8_t tail[16] = {0};
    uint64_t start = (i * width) >> 3;
    std::memcpy(tail, data + start, nbytes - start);
    for (; i < n; ++i) {
      uint64_t bit = i * width - start * 8;
      sink(i, uint32_t((load_u64(tail + (bit >> 3)) >> (bit & 7)) & mask));
    }
  }
}

// Value i of a PACK stream of nbytes bytes, reading no byte past the section (device decoder; the CPU decoder's
// unpack_stream reads 8 bytes at a time and gives the same values).
DLAC_HD inline uint32_t unpack_one(const uint8_t* data, uint64_t nbytes, uint64_t i, uint32_t width) {
  if (width == 0) return 0;
  const uint64_t bit = i * width;
  const uint64_t byte = bit >> 3;
  uint64_t v = 0;
  for (uint32_t k = 0; k < 4 && byte + k < nbytes; ++k) v |= uint64_t(data[byte + k]) << (8 * k);
  return uint32_t((v >> (bit & 7)) & ((1ull << width) - 1));
}

// Why a HUFF section does not decode (0: it does); huff_error_message names each.
enum HuffError : int {
  kHuffOk = 0,
  kHuffTruncated,
  kHuffBadHeader,
  kHuffBadLengths,
  kHuffOversubscribed,
  kHuffBadOffsets,
  kHuffSizeMismatch,
  kHuffCorrupt,
};
inline const char* huff_error_message(int e) {
  switch (e) {
    case kHuffTruncated: return "truncated Huffman section";
    case kHuffBadHeader: return "invalid Huffman section header";
    case kHuffBadLengths: return "invalid Huffman code lengths";
    case kHuffOversubscribed: return "oversubscribed Huffman code";
    case kHuffBadOffsets: return "invalid Huffman block offsets";
    case kHuffSizeMismatch: return "Huffman bitstream size does not match its block offsets";
    default: return "corrupt Huffman bitstream";
  }
}

// The parts of a validated HUFF section of n symbols.
struct HuffView {
  uint32_t alphabet = 0;
  uint64_t nblocks = 0;
  const uint8_t* nib = nullptr;     // code lengths, two per byte
  const uint8_t* ends = nullptr;    // u32 end bit offset of each block
  const uint8_t* stream = nullptr;  // the bitstream
  uint64_t stream_bytes = 0;
};

// Validate a HUFF section (size bytes at data, n symbols) and locate its parts; returns a HuffError.
DLAC_HD inline int huff_parse(const uint8_t* data, uint64_t size, uint64_t n, HuffView* v) {
  const uint64_t nblocks = ceil_div(n, kHuffBlock);
  if (size < kHuffSectionHeader) return kHuffTruncated;
  const uint32_t alphabet = load_u32(data), nb = load_u32(data + 4);
  if (alphabet < 1 || alphabet > kHuffMaxAlphabet || nb != nblocks) return kHuffBadHeader;
  const uint64_t nib_bytes = ceil_div(alphabet, 2);
  if (size < kHuffSectionHeader + nib_bytes + 4 * nblocks) return kHuffTruncated;
  const uint8_t* nib = data + kHuffSectionHeader;
  uint32_t bl_count[kHuffMaxLen + 1] = {0};
  uint32_t maxlen = 0;
  for (uint32_t s = 0; s < alphabet; ++s) {
    uint32_t l = (s & 1) ? (nib[s >> 1] >> 4) : (nib[s >> 1] & 15);
    maxlen = l > maxlen ? l : maxlen;
    if (l && l <= kHuffMaxLen) bl_count[l] += 1;
  }
  if ((alphabet & 1) && (nib[alphabet >> 1] >> 4)) return kHuffBadLengths;
  if (maxlen == 0 || maxlen > kHuffMaxLen) return kHuffBadLengths;
  int64_t left = 1;
  for (uint32_t len = 1; len <= kHuffMaxLen; ++len) {
    left = 2 * left - bl_count[len];
    if (left < 0) return kHuffOversubscribed;
  }
  const uint8_t* ends = nib + nib_bytes;
  const uint8_t* stream = ends + 4 * nblocks;
  const uint64_t stream_bytes = size - uint64_t(stream - data);
  uint64_t start = 0;
  for (uint64_t b = 0; b < nblocks; ++b) {
    uint64_t end = load_u32(ends + 4 * b);
    uint64_t count = n - b * kHuffBlock < kHuffBlock ? n - b * kHuffBlock : kHuffBlock;
    if (end < start || end - start < count || end - start > kHuffMaxLen * count) return kHuffBadOffsets;
    start = end;
  }
  if (ceil_div(start, 8) != stream_bytes) return kHuffSizeMismatch;
  v->alphabet = alphabet;
  v->nblocks = nblocks;
  v->nib = nib;
  v->ends = ends;
  v->stream = stream;
  v->stream_bytes = stream_bytes;
  return kHuffOk;
}

// Decode table over 12-bit LSB-first windows of a validated section: symbol | length << 12 (length 0: no code).
// Canonical codes are handed out in symbol order within each length, as reversed_canonical_codes does.
DLAC_HD inline void huff_decode_table(const HuffView& v, uint16_t* table) {
  uint32_t bl_count[kHuffMaxLen + 2] = {0};
  for (uint32_t s = 0; s < v.alphabet; ++s) {
    uint32_t l = (s & 1) ? (v.nib[s >> 1] >> 4) : (v.nib[s >> 1] & 15);
    if (l) bl_count[l] += 1;
  }
  uint32_t next_code[kHuffMaxLen + 2] = {0};
  first_codes(bl_count, next_code);
  for (uint32_t k = 0; k < (1u << kHuffMaxLen); ++k) table[k] = 0;
  for (uint32_t s = 0; s < v.alphabet; ++s) {
    uint32_t l = (s & 1) ? (v.nib[s >> 1] >> 4) : (v.nib[s >> 1] & 15);
    if (!l) continue;
    for (uint32_t k = reverse_bits(next_code[l]++, l); k < (1u << kHuffMaxLen); k += (1u << l))
      table[k] = uint16_t(s | (l << 12));
  }
}

// Decode block b of a validated section into out[0, count); returns kHuffOk or kHuffCorrupt. One serial chain per
// block, reading no byte past the stream (the device decoder runs one block per thread).
DLAC_HD inline int huff_decode_block(const HuffView& v, const uint16_t* table, uint64_t b, uint64_t count,
                                     uint32_t* out) {
  uint64_t pos = b ? load_u32(v.ends + 4 * (b - 1)) : 0;
  const uint64_t end = load_u32(v.ends + 4 * b);
  const uint32_t mask = (1u << kHuffMaxLen) - 1;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t byte = pos >> 3;
    uint32_t w = 0;
    for (uint32_t k = 0; k < 3 && byte + k < v.stream_bytes; ++k) w |= uint32_t(v.stream[byte + k]) << (8 * k);
    uint16_t e = table[(w >> (pos & 7)) & mask];
    uint32_t len = e >> 12;
    pos += len;
    if (len == 0 || pos > end) return kHuffCorrupt;
    out[i] = e & 0xFFFu;
  }
  return pos == end ? kHuffOk : kHuffCorrupt;
}

// Decode n symbols of a HUFF section into out (size n); throws DecodeError.
inline void huff_decode(const uint8_t* data, uint64_t size, uint64_t n, uint32_t* out) {
  HuffView v;
  if (int e = huff_parse(data, size, n, &v)) fail(huff_error_message(e));
  const uint64_t nblocks = v.nblocks;
  const uint8_t* ends = v.ends;
  const uint8_t* stream = v.stream;
  const uint64_t stream_bytes = v.stream_bytes;
  // Per-thread buffers: a fresh multi-megabyte allocation per section costs page faults (see EncodeScratch).
  thread_local std::vector<uint16_t> table(1u << kHuffMaxLen, 0);
  thread_local std::vector<uint8_t> padded;
  huff_decode_table(v, table.data());
  // Pad the stream so 8-byte reads never leave the buffer.
  padded.resize(stream_bytes + 8);
  std::memcpy(padded.data(), stream, stream_bytes);
  std::memset(padded.data() + stream_bytes, 0, 8);
  const uint8_t* bits = padded.data();
  struct Trim {
    ~Trim() {
      if (padded.capacity() > (size_t(64) << 20)) std::vector<uint8_t>().swap(padded);
    }
  } trim;
  // Each symbol's position depends on the previous one's length, so one block is a serial chain; blocks are
  // independent, so kLanes of them are decoded in lock-step to overlap their chains.
  constexpr uint64_t kLanes = 8;
  const uint32_t mask = (1u << kHuffMaxLen) - 1;
  for (uint64_t b0 = 0; b0 < nblocks; b0 += kLanes) {
    const uint64_t lanes = std::min<uint64_t>(kLanes, nblocks - b0);
    uint64_t pos[kLanes] = {0}, end[kLanes] = {0}, first[kLanes] = {0}, count[kLanes] = {0};
    for (uint64_t k = 0; k < lanes; ++k) {
      const uint64_t b = b0 + k;
      pos[k] = b ? load_u32(ends + 4 * (b - 1)) : 0;
      end[k] = load_u32(ends + 4 * b);
      first[k] = b * kHuffBlock;
      count[k] = std::min<uint64_t>(kHuffBlock, n - first[k]);
    }
    // Full blocks have kHuffBlock symbols; only the last block of the section can be shorter, and it is the last
    // lane of the last group: run all lanes to the shortest count, then finish the others one by one.
    uint64_t common = count[lanes - 1];
    uint32_t bad = 0;
    for (uint64_t i = 0; i < common; ++i) {
      for (uint64_t k = 0; k < lanes; ++k) {
        uint32_t window = uint32_t(load_u64(bits + (pos[k] >> 3)) >> (pos[k] & 7)) & mask;
        uint16_t e = table[window];
        uint32_t len = e >> 12;
        pos[k] += len;
        bad |= uint32_t(len == 0) | uint32_t(pos[k] > end[k]);
        out[first[k] + i] = e & 0xFFFu;
      }
      if (bad) fail("corrupt Huffman bitstream");
    }
    for (uint64_t k = 0; k < lanes; ++k) {
      for (uint64_t i = common; i < count[k]; ++i) {
        uint32_t window = uint32_t(load_u64(bits + (pos[k] >> 3)) >> (pos[k] & 7)) & mask;
        uint16_t e = table[window];
        uint32_t len = e >> 12;
        pos[k] += len;
        if (len == 0 || pos[k] > end[k]) fail("corrupt Huffman bitstream");
        out[first[k] + i] = e & 0xFFFu;
      }
      if (pos[k] != end[k]) fail("corrupt Huffman bitstream");
    }
  }
}

// ------------------------------------------------------------------------------------------------------------
// Row dedup: unique rows in order of first appearance + per-row index (mirrors reference.unique_rows)
// ------------------------------------------------------------------------------------------------------------

// Four independent multiply chains over 8-byte words: the chains' latencies overlap (ids do not depend on the hash,
// only the table's probing does).
DLAC_ALWAYS_INLINE inline uint64_t hash_row(const uint8_t* p, uint32_t dim) {
  constexpr uint64_t kMul = 0x100000001B3ull;
  uint64_t h0 = 0x9E3779B97F4A7C15ull, h1 = 0xC2B2AE3D27D4EB4Full, h2 = 0x165667B19E3779F9ull,
           h3 = 0x27D4EB2F165667C5ull;
  const uint64_t bytes = uint64_t(dim) * 4;
  uint64_t i = 0;
  for (; i + 32 <= bytes; i += 32) {
    h0 = (h0 ^ load_u64(p + i)) * kMul;
    h1 = (h1 ^ load_u64(p + i + 8)) * kMul;
    h2 = (h2 ^ load_u64(p + i + 16)) * kMul;
    h3 = (h3 ^ load_u64(p + i + 24)) * kMul;
  }
  for (; i + 8 <= bytes; i += 8) h0 = (h0 ^ load_u64(p + i)) * kMul;
  if (i < bytes) h1 = (h1 ^ load_u32(p + i)) * kMul;
  uint64_t h = h0 ^ (h1 >> 29) ^ (h1 << 7) ^ (h2 >> 17) ^ (h2 << 23) ^ (h3 >> 41) ^ (h3 << 11);
  h ^= h >> 33;
  return h * 0xFF51AFD7ED558CCDull;
}

// Hash set of at most `expected` rows (dim 32-bit words, compared bytewise): ids are handed out in order of first
// insertion. `first` is sized up front, so an insert never reallocates (push_back was an out-of-line call per row).
struct RowTable {
  uint32_t dim, cap = 16, n = 0;
  size_t row_bytes;
  std::vector<uint32_t> slots;
  std::vector<const uint8_t*> first;  // first[u]: the first row seen with id u, for u < size()
  RowTable(uint64_t expected, uint32_t d) : dim(d), row_bytes(size_t(d) * 4) {
    while (cap < 2 * expected) cap <<= 1;
    slots.assign(cap, UINT32_MAX);
    first.resize(expected);
  }
  DLAC_ALWAYS_INLINE uint32_t insert(const uint8_t* row) {
    uint32_t slot = uint32_t(hash_row(row, dim) >> 32) & (cap - 1);
    while (true) {
      uint32_t u = slots[slot];
      if (u == UINT32_MAX) {
        if (n == first.size()) throw std::logic_error("dlac: RowTable holds more rows than it was sized for");
        first[n] = row;
        slots[slot] = n;
        return n++;
      }
      if (std::memcmp(first[u], row, row_bytes) == 0) return u;
      slot = (slot + 1) & (cap - 1);
    }
  }
  uint32_t size() const { return n; }
};

// ------------------------------------------------------------------------------------------------------------
// Range scan: min, max and "holds a NaN or Inf" over many rows
// ------------------------------------------------------------------------------------------------------------

// The order the minimum and maximum are taken in cannot matter to the encoder (a NaN or Inf sends the chunk raw,
// and a signed zero is normalised afterwards), so they are kept per SIMD lane.
struct RangeScan {
#if defined(__SSE2__) && !defined(__CUDA_ARCH__)
  __m128 lo = _mm_set1_ps(INFINITY), hi = _mm_set1_ps(-INFINITY);
  __m128i nf = _mm_setzero_si128();
  const __m128i exp_mask = _mm_set1_epi32(0x7F800000);
  float slo = INFINITY, shi = -INFINITY;
  uint32_t snf = 0;
  void add(const float* p, int64_t n) {
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
      __m128 v = _mm_loadu_ps(p + j);
      lo = _mm_min_ps(v, lo);  // v < lo ? v : lo, per lane
      hi = _mm_max_ps(v, hi);
      __m128i e = _mm_and_si128(_mm_castps_si128(v), exp_mask);
      nf = _mm_or_si128(nf, _mm_cmpeq_epi32(e, exp_mask));
    }
    for (; j < n; ++j) scalar(p[j]);
  }
  void finish(float& out_lo, float& out_hi, bool& out_nf) {
    alignas(16) float l[4], h[4];
    alignas(16) uint32_t f[4];
    _mm_store_ps(l, lo);
    _mm_store_ps(h, hi);
    _mm_store_si128(reinterpret_cast<__m128i*>(f), nf);
    for (int k = 0; k < 4; ++k) {
      slo = l[k] < slo ? l[k] : slo;
      shi = h[k] > shi ? h[k] : shi;
      snf |= f[k];
    }
    out_lo = slo;
    out_hi = shi;
    out_nf = snf != 0;
  }
#else
  float slo = INFINITY, shi = -INFINITY;
  uint32_t snf = 0;
  void add(const float* p, int64_t n) {
    for (int64_t j = 0; j < n; ++j) scalar(p[j]);
  }
  void finish(float& out_lo, float& out_hi, bool& out_nf) {
    out_lo = slo;
    out_hi = shi;
    out_nf = snf != 0;
  }
#endif
  void scalar(float v) {
    snf |= uint32_t((float_to_bits(v) & 0x7F800000u) == 0x7F800000u);
    slo = v < slo ? v : slo;
    shi = v > shi ? v : shi;
  }
};

// ------------------------------------------------------------------------------------------------------------
// Chunk encode / decode
// ------------------------------------------------------------------------------------------------------------

// Whether a chunk of rows rows with nuniq distinct code rows is worth trying as DEDUP, and whether its row index
// can be Huffman coded.
DLAC_HD inline bool dedup_candidate(uint64_t rows, uint32_t nuniq) { return rows > 1 && nuniq < rows; }
DLAC_HD inline bool index_huff_ok(uint32_t nuniq) { return uint64_t(nuniq) <= kHuffMaxAlphabet; }

// How a quantized chunk is stored, decided from its codes' statistics alone, so that the CPU and device encoders
// (which gather those statistics differently) make the same choice: PACK or HUFF of all codes, or DEDUP (unique
// code rows + row index) when it is strictly smaller, or kRaw when nothing beats 4 bytes per element.
// freq: histogram of all codes (null when qmax + 1 > 4096); f0/f1: of the unique rows' codes and of the row index
// (null when not a DEDUP candidate or too wide for Huffman).
struct ChunkPlan {
  uint8_t mode = kPack;
  StreamPlan whole, p0, p1;
  uint64_t body = 0;  // bytes after the header
};
inline ChunkPlan plan_chunk(uint64_t rows, uint64_t dim, uint32_t qmax, uint32_t nuniq,
                            const std::vector<uint64_t>* freq, const std::vector<uint64_t>* f0,
                            const std::vector<uint64_t>* f1) {
  const uint64_t n = rows * dim;
  ChunkPlan c;
  c.whole = plan_stream(n, qmax, freq);
  c.body = c.whole.size;
  c.mode = c.whole.huff ? kHuff : kPack;
  if (dedup_candidate(rows, nuniq)) {
    c.p0 = plan_stream(uint64_t(nuniq) * dim, qmax, f0);
    c.p1 = plan_stream(rows, nuniq - 1, f1);
    if (c.p0.size + c.p1.size < c.body) {
      c.body = c.p0.size + c.p1.size;
      c.mode = kDedup;
    }
  }
  if (c.body >= 4 * n) c.mode = kRaw;
  return c;
}

// The header of a chunk stored as plan says (crc left 0).
inline Header quantized_header(const ChunkPlan& plan, uint64_t rows, uint64_t dim, float lo, float eb, float step,
                               uint32_t nuniq) {
  Header h;
  h.mode = plan.mode;
  h.rows = uint32_t(rows);
  h.dim = uint32_t(dim);
  h.min = lo;
  h.abs_eb = eb;
  h.step = step;
  if (plan.mode == kDedup) {
    h.flags = uint8_t((plan.p0.huff ? kFlagSec0Huff : 0) | (plan.p1.huff ? kFlagSec1Huff : 0));
    h.width0 = uint8_t(plan.p0.width);
    h.width1 = uint8_t(plan.p1.width);
    h.nuniq = nuniq;
    h.sec0 = uint32_t(plan.p0.size);
    h.sec1 = uint32_t(plan.p1.size);
  } else {
    h.flags = plan.whole.huff ? kFlagSec0Huff : 0;
    h.width0 = uint8_t(plan.whole.width);
    h.sec0 = uint32_t(plan.whole.size);
  }
  return h;
}

inline void finish(std::vector<uint8_t>& out, Header h) {
  h.crc = 0;
  write_header(h, out.data());
  store_u32(out.data() + kCrcOffset, buffer_crc(out.data(), out.size()));
}

inline std::vector<uint64_t> histogram(const uint32_t* vals, uint64_t n, uint32_t vmax) {
  std::vector<uint64_t> f(size_t(vmax) + 1, 0);
  for (uint64_t i = 0; i < n; ++i) f[vals[i]] += 1;
  return f;
}

inline void encode_raw(const float* x, int64_t rows, int64_t dim, int64_t ld, std::vector<uint8_t>& out) {
  Header h;
  h.mode = kRaw;
  h.rows = uint32_t(rows);
  h.dim = uint32_t(dim);
  h.sec0 = uint32_t(4 * rows * dim);
  out.assign(kHeaderSize + h.sec0, 0);
  for (int64_t r = 0; r < rows; ++r) std::memcpy(out.data() + kHeaderSize + 4 * r * dim, x + r * ld, 4 * dim);
  finish(out, h);
}

// Histogram of n values below f.size(), added to f. Four partial counts: a stream dominated by one value (the zero
// code of a gradient) would otherwise wait on the previous increment of the same counter at every element.
inline void add_histogram(const uint32_t* vals, uint64_t n, std::vector<uint64_t>& f, std::vector<uint32_t>& part) {
  const size_t a = f.size();
  part.assign(4 * a, 0);
  uint32_t *p0 = part.data(), *p1 = p0 + a, *p2 = p1 + a, *p3 = p2 + a;
  uint64_t i = 0;  // 32-bit partial counts cannot overflow: a chunk holds at most 2^28 elements
  for (; i + 4 <= n; i += 4) {
    p0[vals[i]] += 1;
    p1[vals[i + 1]] += 1;
    p2[vals[i + 2]] += 1;
    p3[vals[i + 3]] += 1;
  }
  for (; i < n; ++i) p0[vals[i]] += 1;
  for (size_t k = 0; k < a; ++k) f[k] += uint64_t(p0[k]) + p1[k] + p2[k] + p3[k];
}

// Working buffers of the encoder, kept per thread across chunks: allocating them afresh for every chunk cost page
// faults and zeroing (about 7% of gradient encode time). Buffers over kScratchKeep bytes are released after use.
struct EncodeScratch {
  static constexpr size_t kScratchKeep = size_t(64) << 20;
  std::vector<uint32_t> raw_index, rcodes, codes, uniq, index, code_of_raw, part, suspect;
  std::vector<uint64_t> mult, cnt;
  std::vector<const float*> rowp;
  std::vector<float> values, block;
  template <typename V>
  static void trim(V& v) {
    if (v.capacity() * sizeof(typename V::value_type) > kScratchKeep) V().swap(v);
  }
  void release_large() {
    trim(raw_index), trim(rcodes), trim(codes), trim(uniq), trim(index), trim(code_of_raw), trim(mult), trim(cnt),
        trim(rowp), trim(values), trim(block);
  }
};
inline EncodeScratch& encode_scratch() {
  thread_local EncodeScratch s;
  return s;
}
// Grows v to at least n elements without zeroing what it already holds (the callers overwrite what they use).
template <typename V>
inline typename V::value_type* at_least(V& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// DLAC_ENCODE_IN_PLACE set (and not "0") makes the encoder read every column block where it lies, as it does a chunk
// too large to copy, so that tests can check that path on small chunks. Read once per process.
inline bool encode_in_place() {
  static const bool on = env_flag("DLAC_ENCODE_IN_PLACE");
  return on;
}

// Asks for the cache lines of the dim floats at row. Hardware prefetchers stay within a page, and a row of a wide
// tensor's column block is a page of its own: the encoder's loops over such rows call this kRowsAhead rows ahead.
constexpr int64_t kRowsAhead = 8;
DLAC_ALWAYS_INLINE inline void prefetch_row(const float* row, int64_t dim) {
#if defined(__GNUC__)
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < 4 * dim; b += 64) __builtin_prefetch(p + b);
#else
  (void)row, (void)dim;
#endif
}

// Copies rows x dim floats of row stride ld into the contiguous block at dst.
template <int64_t kDim>
DLAC_ALWAYS_INLINE inline void gather_rows(const float* x, int64_t rows, int64_t dim_arg, int64_t ld, float* dst) {
  const int64_t dim = kDim > 0 ? kDim : dim_arg;
  for (int64_t r = 0; r < rows; ++r) {
    if (r + kRowsAhead < rows) prefetch_row(x + (r + kRowsAhead) * ld, dim);
    std::memcpy(dst + r * dim, x + r * ld, 4 * size_t(dim));
  }
}

// Rows hashed for raw-row dedup before deciding whether it pays: if fewer than one in kRawProbeMinRepeat of the
// first kRawProbe rows repeats an earlier row (gradients: none do), the remaining rows are taken as distinct.
// Raw-row dedup only saves quantizing repeated rows twice; the code-row dedup finds every repeat anyway, so the
// output does not depend on this choice.
constexpr int64_t kRawProbe = 256;
constexpr int64_t kRawProbeMinRepeat = 16;

// Encode one chunk (row stride ld, unit column stride) into out. bound is float32; 0 means RAW.
//
// Identical float rows give identical codes, so rows are deduplicated on their raw bits first and only the distinct
// ones are quantized; unique code rows are then found among those, in the same first-appearance order as the
// reference's dedup over all rows (the first row with a given code row is always the first row of its raw row, and
// raw rows are numbered in order of first appearance, whether found by hashing or taken as distinct).
template <int64_t kDim>
inline void encode_chunk_dim(const float* x, int64_t rows, int64_t dim_arg, int64_t ld, float bound, bool relative,
                             std::vector<uint8_t>& out) {
  const int64_t dim = kDim > 0 ? kDim : dim_arg;
  Header h;
  h.rows = uint32_t(rows);
  h.dim = uint32_t(dim);
  const uint64_t n = uint64_t(rows) * dim;
  auto emit_const = [&](float value) {
    h.mode = kConst;
    h.min = value;
    out.assign(kHeaderSize, 0);
    finish(out, h);
  };
  if (n == 0) return emit_const(0.0f);
  if (bound == 0.0f) return encode_raw(x, rows, dim, ld, out);
  EncodeScratch& s = encode_scratch();
  struct Release {
    EncodeScratch& s;
    ~Release() { s.release_large(); }
  } release{s};
  // A column block of a wider tensor (the exchange's chunks: one table's columns of the pooled embeddings or of the
  // gradient) is copied into a contiguous block once, and every pass below reads that: the passes read each row
  // two or three times (scan and hash, quantize, RAW fallback), and a row of a column block sits on a page of its
  // own, which costs its own address translation and cache lines on every pass. Same values, same bytes out.
  if (ld != dim && rows > 1 && 4 * n <= EncodeScratch::kScratchKeep && !encode_in_place()) {
    if (s.block.size() < n) s.block.reserve(n);  // exactly n: a doubled capacity past kScratchKeep would be trimmed
    float* block = at_least(s.block, size_t(n));
    gather_rows<kDim>(x, rows, dim, ld, block);
    x = block;
    ld = dim;
  }

  // Pass 1: min, max, finiteness and raw-row dedup (given up after kRawProbe rows if it finds few repeats).
  const int64_t probe = std::min<int64_t>(rows, kRawProbe);
  RowTable raw{uint64_t(probe), uint32_t(dim)};
  uint32_t* raw_index = at_least(s.raw_index, size_t(rows));
  float lo = INFINITY, hi = -INFINITY;
  bool nonfinite = false;
  int64_t hashed = rows;  // rows [0, hashed) are numbered by the table, rows after it are distinct raw rows
  {
    RangeScan scan;
    // The first pass reads x from memory, one row per page when x is still a column block of a wider tensor (one
    // too large to copy above), so the rows ahead are fetched here (prefetch_row).
    auto ahead = [&](int64_t r) {
      if (r < rows) prefetch_row(x + r * ld, dim);
    };
    for (int64_t r = 0; r < kRowsAhead; ++r) ahead(r);
    for (int64_t r = 0; r < probe; ++r) {
      ahead(r + kRowsAhead);
      const float* p = x + r * ld;
      scan.add(p, dim);
      raw_index[r] = raw.insert(reinterpret_cast<const uint8_t*>(p));
    }
    if (rows > probe && (probe - int64_t(raw.size())) * kRawProbeMinRepeat < probe) {
      hashed = probe;
      for (int64_t r = probe; r < rows; ++r) {
        ahead(r + kRowsAhead);
        scan.add(x + r * ld, dim);
      }
    } else if (rows > probe) {
      RowTable grown{uint64_t(rows), uint32_t(dim)};  // re-insert the probed rows: ids stay in the same order
      for (int64_t r = 0; r < probe; ++r) grown.insert(reinterpret_cast<const uint8_t*>(x + r * ld));
      for (int64_t r = probe; r < rows; ++r) {
        ahead(r + kRowsAhead);
        const float* p = x + r * ld;
        scan.add(p, dim);
        raw_index[r] = grown.insert(reinterpret_cast<const uint8_t*>(p));
      }
      std::swap(raw, grown);
    }
    scan.finish(lo, hi, nonfinite);
  }
  if (nonfinite) return encode_raw(x, rows, dim, ld, out);
  lo = lo + 0.0f;  // -0.0 -> +0.0, so the header does not depend on which zero was seen first
  hi = hi + 0.0f;
  if (lo == hi) return emit_const(lo);
  const float eb = relative ? bound * (hi - lo) : bound;
  if (!(std::isfinite(eb) && eb > 0.0f)) return encode_raw(x, rows, dim, ld, out);

  // Raw rows: the table's, then every row after the hashed ones.
  const uint32_t nhashed = raw.size();
  const uint32_t nraw = uint32_t(nhashed + (rows - hashed));
  const float** rowp = at_least(s.rowp, nraw);
  for (uint32_t u = 0; u < nhashed; ++u) rowp[u] = reinterpret_cast<const float*>(raw.first[u]);
  for (int64_t r = hashed; r < rows; ++r) {
    rowp[nhashed + (r - hashed)] = x + r * ld;
    raw_index[r] = uint32_t(nhashed + (r - hashed));
  }
  const bool raw_identity = nraw == uint64_t(rows);  // raw row u is row u: codes are already in row order

  // Pass 2: quantize the distinct raw rows with the first step that holds every element.
  uint32_t* rcodes = at_least(s.rcodes, size_t(nraw) * dim);
  float step = 0.0f;
  int held = 0;
  uint32_t qmax = 0;
  for (float k : kStepFactors) {
    step = eb * k;
    if (!(std::isfinite(step) && step > 0.0f)) return encode_raw(x, rows, dim, ld, out);
    held = quantize_with_step(rowp, nraw, dim, lo, hi, eb, step, rcodes, &qmax, s.suspect);
    if (held != 0) break;  // 1: held; -1: code overflow, which smaller steps cannot help
  }
  if (held != 1) return encode_raw(x, rows, dim, ld, out);

  // Code-row dedup over the raw rows; cnt: rows per unique code row.
  uint64_t* mult = at_least(s.mult, nraw);
  std::fill(mult, mult + nraw, 0);
  for (int64_t r = 0; r < rows; ++r) mult[raw_index[r]] += 1;
  RowTable cod(nraw, uint32_t(dim));
  uint32_t* code_of_raw = at_least(s.code_of_raw, nraw);
  uint64_t* cnt = at_least(s.cnt, nraw);
  std::fill(cnt, cnt + nraw, 0);
  for (uint32_t u = 0; u < nraw; ++u) {
    const uint32_t k = cod.insert(reinterpret_cast<const uint8_t*>(rcodes + size_t(u) * dim));
    code_of_raw[u] = k;
    cnt[k] += mult[u];
  }
  const uint32_t nuniq = cod.size();
  // The unique code rows, contiguous: they appear in increasing order among the raw rows' codes.
  const uint32_t* uniq = rcodes;
  if (nuniq < nraw) {
    uint32_t* uq = at_least(s.uniq, size_t(nuniq) * dim);
    for (uint32_t k = 0; k < nuniq; ++k) std::memcpy(uq + size_t(k) * dim, cod.first[k], 4 * size_t(dim));
    uniq = uq;
  }
  const bool dedup = dedup_candidate(rows, nuniq);
  const bool huff_ok = uint64_t(qmax) + 1 <= kHuffMaxAlphabet;
  // Histograms: f0 over the unique code rows; every code's (freq) is f0 plus the extra copies of repeated rows.
  std::vector<uint64_t> freq, f0, f1;
  if (huff_ok) {
    f0.assign(size_t(qmax) + 1, 0);
    add_histogram(uniq, uint64_t(nuniq) * dim, f0, s.part);
    freq = f0;
    for (uint32_t k = 0; k < nuniq; ++k) {
      if (cnt[k] == 1) continue;
      const uint32_t* c = uniq + size_t(k) * dim;
      const uint64_t extra = cnt[k] - 1;
      for (int64_t j = 0; j < dim; ++j) freq[c[j]] += extra;
    }
  }
  uint32_t* index = nullptr;
  if (dedup) {
    index = at_least(s.index, size_t(rows));
    for (int64_t r = 0; r < rows; ++r) index[r] = code_of_raw[raw_index[r]];
    if (index_huff_ok(nuniq)) {
      f1.assign(nuniq, 0);
      add_histogram(index, uint64_t(rows), f1, s.part);
    }
  }
  ChunkPlan plan = plan_chunk(rows, dim, qmax, nuniq, huff_ok ? &freq : nullptr,
                              dedup && huff_ok ? &f0 : nullptr, dedup && index_huff_ok(nuniq) ? &f1 : nullptr);
  if (plan.mode == kRaw) return encode_raw(x, rows, dim, ld, out);
  const uint8_t mode = plan.mode;
  const StreamPlan &whole = plan.whole, &p0 = plan.p0, &p1 = plan.p1;
  h = quantized_header(plan, rows, dim, lo, eb, step, nuniq);
  const size_t size = kHeaderSize + plan.body;
  out.assign(size + 8, 0);  // huff_encode writes up to 8 bytes past its section
  uint8_t* body = out.data() + kHeaderSize;
  if (mode == kDedup) {
    if (p0.huff) huff_encode(uniq, uint64_t(nuniq) * dim, p0, body);
    else pack_stream(uniq, uint64_t(nuniq) * dim, p0.width, body);
    if (p1.huff) huff_encode(index, uint64_t(rows), p1, body + p0.size);
    else pack_stream(index, uint64_t(rows), p1.width, body + p0.size);
  } else {
    const uint32_t* codes = rcodes;
    if (!raw_identity) {
      uint32_t* c = at_least(s.codes, n);
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(c + r * dim, rcodes + size_t(raw_index[r]) * dim, 4 * size_t(dim));
      codes = c;
    }
    if (whole.huff) huff_encode(codes, n, whole, body);
    else pack_stream(codes, n, whole.width, body);
  }
  out.resize(size);
  finish(out, h);
}

// The encoder compiled for the common table widths too, where the per-row loops have a known trip count (the
// widths DLRM uses; any other goes through the generic one, with the same bytes).
inline void encode_chunk(const float* x, int64_t rows, int64_t dim, int64_t ld, float bound, bool relative,
                         std::vector<uint8_t>& out) {
  if (dim == 64) return encode_chunk_dim<64>(x, rows, dim, ld, bound, relative, out);
  if (dim == 128) return encode_chunk_dim<128>(x, rows, dim, ld, bound, relative, out);
  encode_chunk_dim<0>(x, rows, dim, ld, bound, relative, out);
}

// Decode one validated-size chunk into out (rows x dim floats, row stride ld). Throws DecodeError.
inline void decode_chunk(const uint8_t* buf, uint64_t size, int64_t rows, int64_t dim, float* out, int64_t ld) {
  Header h = parse_header(buf, size);
  if (int64_t(h.rows) != rows || int64_t(h.dim) != dim)
    fail("header shape " + std::to_string(h.rows) + "x" + std::to_string(h.dim) + " does not match the block's " +
         std::to_string(rows) + "x" + std::to_string(dim));
  const uint8_t* sec0 = buf + kHeaderSize;
  const uint8_t* sec1 = sec0 + h.sec0;
  const uint64_t n = uint64_t(rows) * dim;
  if (h.mode == kConst) {
    for (int64_t r = 0; r < rows; ++r) std::fill(out + r * ld, out + r * ld + dim, h.min);
    return;
  }
  if (h.mode == kRaw) {
    for (int64_t r = 0; r < rows; ++r) std::memcpy(out + r * ld, sec0 + 4 * r * dim, 4 * dim);
    return;
  }
  const float lo = h.min;
  const float step = h.step;
  if (h.mode == kPack) {
    unpack_stream(sec0, h.sec0, n, h.width0, [&](uint64_t i, uint32_t q) {
      out[int64_t(i / dim) * ld + int64_t(i % dim)] = lo + float(q) * step;
    });
    return;
  }
  EncodeScratch& s = encode_scratch();  // the encoder's per-thread buffers serve the decoder as well
  struct Release {
    EncodeScratch& s;
    ~Release() { s.release_large(); }
  } release{s};
  if (h.mode == kHuff) {
    uint32_t* codes = at_least(s.codes, n);
    huff_decode(sec0, h.sec0, n, codes);
    for (int64_t r = 0; r < rows; ++r) {
      const uint32_t* c = codes + r * dim;
      float* o = out + r * ld;
      for (int64_t j = 0; j < dim; ++j) o[j] = lo + float(int32_t(c[j])) * step;
    }
    return;
  }
  // DEDUP: dequantize the unique rows once, then copy one per output row.
  const uint32_t u = h.nuniq;
  const uint64_t nu = uint64_t(u) * dim;
  uint32_t* ucodes = at_least(s.uniq, nu);
  uint32_t* index = at_least(s.index, size_t(rows));
  if (h.flags & kFlagSec0Huff) huff_decode(sec0, h.sec0, nu, ucodes);
  else unpack_stream(sec0, h.sec0, nu, h.width0, [&](uint64_t i, uint32_t q) { ucodes[i] = q; });
  if (h.flags & kFlagSec1Huff) huff_decode(sec1, h.sec1, rows, index);
  else unpack_stream(sec1, h.sec1, rows, h.width1, [&](uint64_t i, uint32_t q) { index[i] = q; });
  // Codes are below 2^24: through int32 the conversion is exact and vectorizes (uint32 -> float does not).
  float* table = at_least(s.values, nu);
  for (uint64_t i = 0; i < nu; ++i) table[i] = lo + float(int32_t(ucodes[i])) * step;
  for (int64_t r = 0; r < rows; ++r) {
    if (index[r] >= u) fail("DEDUP index out of range");
    std::memcpy(out + r * ld, table + size_t(index[r]) * dim, 4 * dim);
  }
}

}  // namespace dlac
