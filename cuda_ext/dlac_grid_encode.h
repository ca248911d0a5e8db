// The device pipeline's encoder (see dlac_grid.h for the pipeline and its synchronizations): range, kind and bound,
// quantization with histograms, unique code rows, the host's plan, bit packing and checksums.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "dlac_codec.h"
#include "dlac_grid_launch.h"
#include "dlac_grid_transfer.h"
#include "dlac_str.h"

namespace dlac {
namespace grid {
inline namespace DLAC_GRID_BUILD {

// Tile-wise bit packing: the payload bits [begin, end) of a tile of one stream's symbols (bit lengths nbits, their
// running sum cum over all streams), and the 32-bit payload words they touch. A tile's codes span at most
// kTileElems * kMaxCodeBits bits, so kPackWords words of shared memory hold them at any alignment.
struct TileBits {
  int64_t begin, end;
  DLAC_HD int64_t words() const { return end > begin ? ((end - 1) >> 5) - (begin >> 5) + 1 : 0; }
};
template <class Stream>
DLAC_HD inline TileBits tile_bits(const Stream& es, const Tile& t, const int64_t* cum, const int32_t* nbits) {
  const int64_t before = es.sym_base > 0 ? cum[es.sym_base - 1] : 0;
  const int64_t a = es.sym_base + t.first, b = a + t.count - 1;
  return {es.data_bit + (cum[a] - nbits[a] - before), es.data_bit + (cum[b] - before)};
}
static_assert(kMaxCodeBits <= 32 && kHuffMaxLen <= kMaxCodeBits, "a code fits one 32-bit word");
constexpr int64_t kPackWords = kTileElems * kMaxCodeBits / 32 + 1;
struct PackScratch {
  uint32_t words[kPackWords];
};

// Warp-cooperative code rows: one warp per row, lane L taking the row's words L, L + 32, ... (a warp reads the row
// in coalesced 128-byte pieces instead of one thread walking it word by word). The row's hash is the xor of its
// lanes' hashes, its comparison the and of its lanes': combined with shuffles on the device, and on the host by
// running the same lane functions for lanes 0..31 one after another, so the emulation computes the very hash and
// comparisons of the GPU (any hash gives the same bytes: a slot keeps the smallest row of its content).
constexpr uint32_t kWarp = 32;
DLAC_HD inline uint64_t mix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xFF51AFD7ED558CCDull;
  k ^= k >> 33;
  k *= 0xC4CEB9FE1A85EC53ull;
  return k ^ (k >> 33);
}
DLAC_HD inline uint64_t lane_hash(const uint32_t* p, int64_t dim, uint32_t lane) {
  if (int64_t(lane) >= dim) return 0;
  uint64_t h = 0x9E3779B97F4A7C15ull * (uint64_t(lane) + 1);
  for (int64_t j = lane; j < dim; j += kWarp) h = (h ^ p[j]) * 0x100000001B3ull;
  return mix64(h);
}
DLAC_HD inline bool lane_equal(const uint32_t* a, const uint32_t* b, int64_t dim, uint32_t lane) {
  for (int64_t j = lane; j < dim; j += kWarp)
    if (a[j] != b[j]) return false;
  return true;
}
#if defined(__CUDA_ARCH__)
__device__ inline uint32_t warp_lane() { return threadIdx.x & (kWarp - 1); }
#endif
// Called by all 32 lanes of a warp together on the device (for_each_warp), once per row on the host.
DLAC_HD inline uint64_t warp_row_hash(const uint32_t* p, int64_t dim) {
#if defined(__CUDA_ARCH__)
  uint64_t h = lane_hash(p, dim, warp_lane());
  for (int o = kWarp / 2; o > 0; o >>= 1) h ^= __shfl_xor_sync(0xFFFFFFFFu, h, o);
#else
  uint64_t h = 0;
  for (uint32_t lane = 0; lane < kWarp; ++lane) h ^= lane_hash(p, dim, lane);
#endif
  return mix64(h);
}
DLAC_HD inline bool warp_rows_equal(const uint32_t* a, const uint32_t* b, int64_t dim) {
#if defined(__CUDA_ARCH__)
  return __all_sync(0xFFFFFFFFu, lane_equal(a, b, dim, warp_lane())) != 0;
#else
  for (uint32_t lane = 0; lane < kWarp; ++lane)
    if (!lane_equal(a, b, dim, lane)) return false;
  return true;
#endif
}
// The lane that does a warp's atomics and writes (the only "lane" on the host).
DLAC_HD inline bool warp_leader() {
#if defined(__CUDA_ARCH__)
  return warp_lane() == 0;
#else
  return true;
#endif
}
// A compare-and-swap by the leader, its result given to every lane.
DLAC_HD inline uint32_t warp_cas(uint32_t* p, uint32_t expected, uint32_t v) {
#if defined(__CUDA_ARCH__)
  uint32_t old = 0;
  if (warp_leader()) old = atomicCAS(reinterpret_cast<unsigned int*>(p), expected, v);
  return __shfl_sync(0xFFFFFFFFu, old, 0);
#else
  return atomic_cas(p, expected, v);
#endif
}

// float <-> an unsigned key with the same order (for atomic min / max of floats).
DLAC_HD inline uint32_t order_key(float v) {
  uint32_t b = float_to_bits(v);
  return b ^ ((b & 0x80000000u) ? 0xFFFFFFFFu : 0x80000000u);
}
DLAC_HD inline float key_to_float(uint32_t k) {
  return bits_to_float(k ^ ((k & 0x80000000u) ? 0x80000000u : 0xFFFFFFFFu));
}

// kStepFactors[k], spelled out: device code cannot index a host array.
DLAC_HD inline float step_factor(int k) { return k == 0 ? 2.0f : k == 1 ? 1.9921875f : k == 2 ? 1.5f : 1.0f; }
static_assert(kStepFactors[0] == 2.0f && kStepFactors[1] == 1.9921875f && kStepFactors[2] == 1.5f &&
                  kStepFactors[3] == 1.0f && sizeof(kStepFactors) == 4 * sizeof(float),
              "step_factor must list kStepFactors");

DLAC_HD inline void store_u32_bytes(uint8_t* p, uint32_t v) {
  for (int k = 0; k < 4; ++k) p[k] = uint8_t(v >> (8 * k));
}
// ------------------------------------------------------------------------------------------------------------
// Encode
// ------------------------------------------------------------------------------------------------------------

struct EncChunk {
  int64_t r0, rows, c0, dim;
  int64_t elem_base, row_base, hash_base, hash_cap;
  float bound;
  uint32_t pad;
};

enum : uint32_t { kKindConst = 1, kKindRaw = 2, kKindQuant = 3 };

// Per-chunk state words on the device.
enum : int {
  kStLo = 0,   // order_key of the minimum
  kStHi,       // order_key of the maximum
  kStNonFinite,
  kStOverflow,  // bit k: step k overflows 24-bit codes
  kStMissed,    // bit k: some element holds with no code at step k
  kStKind,
  kStMin,       // float bits: the header's min (CONST value or quantization origin)
  kStEb,        // float bits: absolute bound
  kStStep,      // float bits: chosen step
  kStQmax,
  kStNuniq,
  kStError,     // bit 0: a row found no free hash slot, bit 1: a row was not found again (see kErr*)
  kStRecode,    // 1: the chosen step is not the first, so the codes written with the first are redone
  kStPad,
  kStWords,     // even, so the histogram stage after the state words starts 8-byte aligned
};
static_assert(kStWords % 2 == 0, "the readback stage after the state words must stay 8-byte aligned");
enum : uint32_t { kErrHashFull = 1, kErrHashLost = 2 };

// Histogram words the host planner reads for chunk state s (0 each where it reads none): all codes, the unique rows'
// codes, the row index. The device counts exactly these, side by side in this order, and the host walks them so.
DLAC_HD inline void hist_lengths(const uint32_t* s, int64_t rows, int64_t len[3]) {
  len[0] = len[1] = len[2] = 0;
  if (s[kStKind] != kKindQuant) return;
  const bool huff_ok = uint64_t(s[kStQmax]) + 1 <= kHuffMaxAlphabet;
  const bool dedup = dedup_candidate(uint64_t(rows), s[kStNuniq]);
  len[0] = huff_ok ? int64_t(s[kStQmax]) + 1 : 0;
  len[1] = dedup && huff_ok ? int64_t(s[kStQmax]) + 1 : 0;
  len[2] = dedup && index_huff_ok(s[kStNuniq]) ? int64_t(s[kStNuniq]) : 0;
}

// The histograms are counted into a region read back with the state words (one copy). Its size, in words: what the
// last call with the same row and column splits needed, plus a quarter (batches of one training run need about the
// same), at least kMinHistWords (64 KB) for a grid not seen before. A call whose histograms outgrow it counts them
// again in a region of their size and reads that back (a second copy). So the scratch follows what the histograms
// need, not the number of chunks (before: 3 x 4096 words zeroed and as many reserved per chunk, 10 MB at 208).
constexpr int64_t kMinHistWords = 16384;
class HistNeeds {
 public:
  static uint64_t key(c10::IntArrayRef rs, c10::IntArrayRef cs) {
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (int64_t v : rs) h = (h ^ uint64_t(v)) * 0x100000001B3ull;
    h = (h ^ 0xFFull) * 0x100000001B3ull;  // separates the row splits from the column splits
    for (int64_t v : cs) h = (h ^ uint64_t(v)) * 0x100000001B3ull;
    return h;
  }
  int64_t capacity(uint64_t key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = needs_.find(key);
    return std::max<int64_t>(kMinHistWords, it == needs_.end() ? 0 : it->second + it->second / 4);
  }
  void record(uint64_t key, int64_t words) {
    std::lock_guard<std::mutex> lock(mu_);
    if (needs_.size() >= 256 && needs_.find(key) == needs_.end()) needs_.clear();  // bounded: a training run has few
    needs_[key] = words;
  }

 private:
  std::mutex mu_;
  std::unordered_map<uint64_t, int64_t> needs_;
};
inline HistNeeds& hist_needs() {
  static auto* needs = new HistNeeds();  // never destroyed: calls may run while the process exits
  return *needs;
}

// Probes of the row hash set before a row gives up (the table has at least twice as many slots as rows, so a probe
// sequence longer than the table means a broken invariant: flag it and let the read-back raise, never spin).
// The host emulation can shrink the table (DLAC_EMULATE_HASH_SLOTS) so the tests reach that error.
inline int64_t hash_capacity(int64_t rows) {
  int64_t cap = 16;
  while (cap < 2 * rows) cap <<= 1;
#if !defined(__CUDACC__)
  if (const char* forced = std::getenv("DLAC_EMULATE_HASH_SLOTS")) {
    const int64_t f = std::strtoll(forced, nullptr, 10);
    TORCH_CHECK(f > 0 && (f & (f - 1)) == 0, ::dlac::str("DLAC_EMULATE_HASH_SLOTS must be a power of two, got ",
                                                         forced));
    cap = f;
  }
#endif
  return cap;
}
constexpr uint32_t kEmpty = 0xFFFFFFFFu;

// Histogram h's words in a region of `cap`: [hend[h] - hlen[h], hend[h]) if it has any and they fit, else none.
DLAC_HD inline bool hist_fits(const int64_t* hlen, const int64_t* hend, int64_t h, int64_t cap) {
  return hlen[h] > 0 && hend[h] <= cap;
}

// Codes counted per tile in shared memory: the codes of all elements and the unique rows' codes, two histograms of
// kHuffMaxAlphabet bins (32 KB a block; a tile belongs to one chunk), whose non-zero bins the block adds to the
// chunk's. The global histograms get one atomic per distinct code of a tile instead of one per warp and code.
struct CodeHists {
  uint32_t bins[2][kHuffMaxAlphabet];
};

// The histograms the planner reads (hist_lengths: lengths hlen, their running sum hend), counted into region[0, cap)
// (zeroed): those that fit, the others are left to a second round with room for all. Read only once the codes, the
// maximum code and the unique rows are known, so they are counted once, never cleared and redone. In a DEDUP
// candidate only the unique rows' codes are read: the histogram of all codes counts each with its row's multiplicity
// (mult), which is the same sum, the unique rows' histogram once; every row adds its index to the third.
inline void count_histograms(const EncChunk* CH, const uint32_t* S, const Tile* TL, int64_t NT, const int64_t* RWS,
                             int64_t N, int64_t RW, const uint32_t* codes, const uint32_t* first, const uint32_t* mult,
                             const uint32_t* index, const int64_t* hlen, const int64_t* hend, uint32_t* region,
                             int64_t cap) {
  const auto zero = DLAC_LAMBDA(const Tile&, uint32_t thread, uint32_t nthreads, CodeHists& sm) {
    for (uint32_t b = thread; b < kHuffMaxAlphabet; b += nthreads) sm.bins[0][b] = sm.bins[1][b] = 0;
  };
  const auto count = DLAC_LAMBDA(const Tile& t, uint32_t thread, uint32_t nthreads, CodeHists& sm) {
    const int64_t i = t.chunk;
    const EncChunk& ch = CH[i];
    const bool all = hist_fits(hlen, hend, 3 * i, cap), uniq = hist_fits(hlen, hend, 3 * i + 1, cap);
    const bool dedup = dedup_candidate(uint64_t(ch.rows), S[i * kStWords + kStNuniq]);
    walk_tile(t, thread, nthreads, [&](int64_t, int64_t l, int64_t r, int64_t) {
      uint32_t w = 1;
      if (dedup) {
        const int64_t g = ch.row_base + r;
        if (!first[g]) return;
        w = mult[g];
      }
      const uint32_t code = codes[ch.elem_base + l];  // below hlen: the maximum code is below kHuffMaxAlphabet
      if (all) hist_add_weighted(sm.bins[0] + code, w);
      if (uniq) hist_add_weighted(sm.bins[1] + code, 1u);
    });
  };
  const auto flush = DLAC_LAMBDA(const Tile& t, uint32_t thread, uint32_t nthreads, CodeHists& sm) {
    for (int k = 0; k < 2; ++k) {
      const int64_t h = 3 * int64_t(t.chunk) + k;
      if (!hist_fits(hlen, hend, h, cap)) continue;
      uint32_t* dst = region + hend[h] - hlen[h];
      for (int64_t b = thread; b < hlen[h]; b += nthreads)
        if (sm.bins[k][b] != 0) atomic_add(dst + b, sm.bins[k][b]);
    }
  };
  for_each_tile_block_if<CodeHists>("encode: code histograms", TL, NT, DLAC_LAMBDA(int64_t i) {
        return S[i * kStWords + kStKind] == kKindQuant &&
               (hist_fits(hlen, hend, 3 * i, cap) || hist_fits(hlen, hend, 3 * i + 1, cap));
      }, zero, count, flush);
  for_each("encode: row index histograms", RW, DLAC_LAMBDA(int64_t g) {
    const int64_t h = 3 * find_segment(RWS, N, g) + 2;
    if (hist_fits(hlen, hend, h, cap)) hist_add(region + hend[h] - hlen[h] + index[g]);
  });
}

// One lossless stream of a chunk: values from codes / unique code rows / row index, PACK or HUFF.
struct EncStream {
  int64_t sym_base;   // first symbol in the flat symbol space
  int64_t count;
  int64_t src_base;   // first value in its source array
  int64_t table_off;  // HUFF: this stream's (reversed code | length << 24) table
  int64_t data_bit;   // absolute bit offset of the first code in the payload
  int64_t ends_off;   // HUFF: absolute byte offset of the block end offsets
  int32_t src;        // 0 codes, 1 unique rows, 2 row index
  int32_t huff;
  uint32_t width;     // PACK
  uint32_t pad;
};

inline std::tuple<at::Tensor, at::Tensor> encode_grid_device(const at::Tensor& x, c10::IntArrayRef rs,
                                                              c10::IntArrayRef cs, const float* bounds,
                                                              bool relative) {
  const at::Device device = x.device();
  const int64_t R = int64_t(rs.size()) - 1, C = int64_t(cs.size()) - 1, N = R * C;
  const int64_t ld = x.stride(0);
  std::vector<EncChunk> chunks(N);
  std::vector<int64_t> elem_starts(N + 1, 0), row_starts(N + 1, 0);
  int64_t hash_total = 0;
  for (int64_t i = 0; i < N; ++i) {
    const int64_t r = i / C, c = i % C;
    EncChunk& ch = chunks[i];
    ch.r0 = rs[r];
    ch.rows = rs[r + 1] - rs[r];
    ch.c0 = cs[c];
    ch.dim = cs[c + 1] - cs[c];
    ch.elem_base = elem_starts[i];
    ch.row_base = row_starts[i];
    ch.hash_base = hash_total;
    ch.hash_cap = ch.rows > 1 && ch.dim > 0 ? hash_capacity(ch.rows) : 0;
    hash_total += ch.hash_cap;
    ch.bound = bounds[c];
    ch.pad = 0;
    elem_starts[i + 1] = elem_starts[i] + ch.rows * ch.dim;
    row_starts[i + 1] = row_starts[i] + (ch.dim > 0 ? ch.rows : 0);
  }
  const int64_t E = elem_starts[N], RW = row_starts[N];
  std::vector<uint32_t> state_init(size_t(N) * kStWords, 0);
  for (int64_t i = 0; i < N; ++i) state_init[i * kStWords + kStLo] = 0xFFFFFFFFu;

  // Phase 1 metadata in one upload; the state words go last, followed by the region the histograms are counted in,
  // so the one read-back of this phase is a single contiguous copy.
  Staging meta1;
  std::vector<int64_t> chunk_rows(N), chunk_dims(N);
  for (int64_t i = 0; i < N; ++i) {
    chunk_rows[i] = chunks[i].rows;
    chunk_dims[i] = chunks[i].dim;
  }
  const std::vector<Tile> tiles = make_tiles(chunk_rows, chunk_dims);
  const int64_t NT = int64_t(tiles.size());
  const int64_t ch_off = meta1.add(chunks), tl_off = meta1.add(tiles), rws_off = meta1.add(row_starts);
  const int64_t st_off = meta1.add(state_init);
  const uint64_t shape_key = HistNeeds::key(rs, cs);
  const int64_t hist_cap = hist_needs().capacity(shape_key);
  const int64_t stage_off = meta1.reserve(4 * hist_cap);
  at::Tensor meta1_t = meta1.upload(device);
  // Read only where written: codes and unique rows (quantized chunks, ids below nuniq), rep and index (rows of
  // quantized chunks), first (written for every row by the lookup pass). mult: rows per unique row, counted up.
  at::Tensor codes_t = unset_u32(E, device), uniq_t = unset_u32(E, device);
  at::Tensor first_t = unset_u32(RW, device), rep_t = unset_u32(RW, device), index_t = unset_u32(RW, device);
  at::Tensor mult_t = zeros_u32(RW, device);
  const auto i32 = at::TensorOptions().dtype(at::kInt).device(device);
  at::Tensor hash_t = at::full({std::max<int64_t>(hash_total, 1)}, -1, i32);
  at::Tensor hlen_t = at::empty({N * 3}, at::TensorOptions().dtype(at::kLong).device(device));

  const float* xp = x.data_ptr<float>();
  const EncChunk* CH = meta1.at<EncChunk>(ch_off);
  const Tile* TL = meta1.at<Tile>(tl_off);
  const int64_t* RWS = meta1.at<int64_t>(rws_off);
  uint32_t* S = meta1.at<uint32_t>(st_off);
  uint32_t* stage = meta1.at<uint32_t>(stage_off);
  uint32_t* codes = ptr<uint32_t>(codes_t);
  uint32_t* uniq = ptr<uint32_t>(uniq_t);
  uint32_t* first = ptr<uint32_t>(first_t);
  uint32_t* rep = ptr<uint32_t>(rep_t);
  uint32_t* index = ptr<uint32_t>(index_t);
  uint32_t* mult = ptr<uint32_t>(mult_t);
  uint32_t* table = ptr<uint32_t>(hash_t);
  int64_t* hlen = ptr<int64_t>(hlen_t);

  // Range and finiteness.
  for_each_element("encode: range and finiteness", TL, NT, DLAC_LAMBDA(int64_t i, int64_t, int64_t r, int64_t j) {
    const EncChunk& ch = CH[i];
    const float v = xp[(ch.r0 + r) * ld + ch.c0 + j];
    uint32_t* s = S + i * kStWords;
    if (!f_isfinite(v)) atomic_or(s + kStNonFinite, 1u);
    const uint32_t key = order_key(v);
    atomic_min(s + kStLo, key);
    atomic_max(s + kStHi, key);
  });
  // Kind and absolute bound, as encode_chunk decides them.
  for_each("encode: kind and bound", N, DLAC_LAMBDA(int64_t i) {
    const EncChunk& ch = CH[i];
    uint32_t* s = S + i * kStWords;
    if (ch.rows * ch.dim == 0) {
      s[kStKind] = kKindConst;
      s[kStMin] = float_to_bits(0.0f);
      return;
    }
    if (ch.bound == 0.0f || s[kStNonFinite]) {
      s[kStKind] = kKindRaw;
      return;
    }
    const float lo = f_add(key_to_float(s[kStLo]), 0.0f), hi = f_add(key_to_float(s[kStHi]), 0.0f);
    if (lo == hi) {
      s[kStKind] = kKindConst;
      s[kStMin] = float_to_bits(lo);
      return;
    }
    const float eb = relative ? f_mul(ch.bound, f_sub(hi, lo)) : ch.bound;
    if (!(f_isfinite(eb) && eb > 0.0f)) {
      s[kStKind] = kKindRaw;
      return;
    }
    s[kStKind] = kKindQuant;
    s[kStMin] = float_to_bits(lo);
    s[kStEb] = float_to_bits(eb);
  });
  // The first step (2 eb), which nearly every chunk keeps, in one pass with its codes: each element's verdict (the
  // CPU tries the steps in order; an element's verdict is its own), its code and the maximum code. If the chunk does
  // not keep the first step, these codes are redone below; if it goes RAW they are never read.
  for_each_element_if("encode: first step and codes", TL, NT,
      DLAC_LAMBDA(int64_t i) { return S[i * kStWords + kStKind] == kKindQuant; },
      DLAC_LAMBDA(int64_t i, int64_t l, int64_t r, int64_t j) {
    uint32_t* s = S + i * kStWords;
    const EncChunk& ch = CH[i];
    const float lo = bits_to_float(s[kStMin]), eb = bits_to_float(s[kStEb]);
    const float step = f_mul(eb, step_factor(0));
    if (!(f_isfinite(step) && step > 0.0f)) return;  // the chooser stops at the first step: RAW
    uint32_t code = 0;
    const int st = quantize_element(xp[(ch.r0 + r) * ld + ch.c0 + j], lo, eb, step, &code);
    if (st == kOverflow) atomic_or(s + kStOverflow, 1u);
    else if (st == kMissed) atomic_or(s + kStMissed, 1u);
    const int64_t e = ch.elem_base + l;
    codes[e] = code;
    atomic_max(s + kStQmax, code);
  });
  // The other steps' verdicts, only in chunks where some element missed the first step and none overflowed (the
  // chooser would stop at an overflow).
  for_each_element_if("encode: later steps", TL, NT, DLAC_LAMBDA(int64_t i) {
        const uint32_t* s = S + i * kStWords;
        return s[kStKind] == kKindQuant && !(s[kStOverflow] & 1u) && (s[kStMissed] & 1u);
      },
      DLAC_LAMBDA(int64_t i, int64_t, int64_t r, int64_t j) {
    uint32_t* s = S + i * kStWords;
    if (s[kStKind] != kKindQuant || (s[kStOverflow] & 1u) || !(s[kStMissed] & 1u)) return;
    const EncChunk& ch = CH[i];
    const float v = xp[(ch.r0 + r) * ld + ch.c0 + j];
    const float lo = bits_to_float(s[kStMin]), eb = bits_to_float(s[kStEb]);
    uint32_t overflow = 0, missed = 0;
    for (int k = 1; k < 4; ++k) {
      const float step = f_mul(eb, step_factor(k));
      if (!(f_isfinite(step) && step > 0.0f)) continue;
      uint32_t code;
      const int st = quantize_element(v, lo, eb, step, &code);
      if (st == kOverflow) overflow |= 1u << k;
      else if (st == kMissed) missed |= 1u << k;
    }
    if (overflow) atomic_or(s + kStOverflow, overflow);
    if (missed) atomic_or(s + kStMissed, missed);
  });
  for_each("encode: step choice", N, DLAC_LAMBDA(int64_t i) {
    uint32_t* s = S + i * kStWords;
    if (s[kStKind] != kKindQuant) return;
    const float eb = bits_to_float(s[kStEb]);
    for (int k = 0; k < 4; ++k) {
      const float step = f_mul(eb, step_factor(k));
      if (!(f_isfinite(step) && step > 0.0f) || (s[kStOverflow] >> k & 1u)) break;
      if (!(s[kStMissed] >> k & 1u)) {
        s[kStStep] = float_to_bits(step);
        if (k > 0) {  // the first step's codes and maximum are void
          s[kStRecode] = 1u;
          s[kStQmax] = 0u;
        }
        return;
      }
    }
    s[kStKind] = kKindRaw;
  });
  // Chunks that keep a later step: their codes redone with that step.
  for_each_element_if("encode: codes at a later step", TL, NT, DLAC_LAMBDA(int64_t i) {
        return S[i * kStWords + kStKind] == kKindQuant && S[i * kStWords + kStRecode] != 0u;
      },
      DLAC_LAMBDA(int64_t i, int64_t l, int64_t r, int64_t j) {
    uint32_t* s = S + i * kStWords;
    const EncChunk& ch = CH[i];
    const int64_t e = ch.elem_base + l;
    uint32_t code = 0;
    quantize_element(xp[(ch.r0 + r) * ld + ch.c0 + j], bits_to_float(s[kStMin]), bits_to_float(s[kStEb]),
                     bits_to_float(s[kStStep]), &code);
    codes[e] = code;
    atomic_max(s + kStQmax, code);
  });
  // Unique code rows: each slot ends up holding the smallest row with its content. One warp per row (hash and
  // comparisons warp-cooperative; every branch below depends only on values all lanes share).
  for_each_warp("encode: row hash insert", RW, DLAC_LAMBDA(int64_t g) {
    const int64_t i = find_segment(RWS, N, g);
    const EncChunk& ch = CH[i];
    if (S[i * kStWords + kStKind] != kKindQuant || ch.rows < 2) return;
    const uint32_t r = uint32_t(g - ch.row_base);
    const uint32_t* base = codes + ch.elem_base;
    const uint32_t* row = base + int64_t(r) * ch.dim;
    uint32_t* slots = table + ch.hash_base;
    const uint32_t mask = uint32_t(ch.hash_cap - 1);
    uint32_t slot = uint32_t(warp_row_hash(row, ch.dim) >> 32) & mask;
    for (int64_t probe = 0; probe < ch.hash_cap; ++probe) {
      const uint32_t old = warp_cas(slots + slot, kEmpty, r);
      if (old == kEmpty) return;
      if (warp_rows_equal(base + int64_t(old) * ch.dim, row, ch.dim)) {
        if (warp_leader()) atomic_min(slots + slot, r);
        return;
      }
      slot = (slot + 1) & mask;
    }
    if (warp_leader()) atomic_or(S + i * kStWords + kStError, kErrHashFull);
  });
  for_each_warp("encode: row lookup", RW, DLAC_LAMBDA(int64_t g) {
    const int64_t i = find_segment(RWS, N, g);
    const EncChunk& ch = CH[i];
    const bool leader = warp_leader();
    if (S[i * kStWords + kStKind] != kKindQuant || ch.rows < 2) {
      if (leader) first[g] = 0u;  // every row gets its flag here: the running count below reads them all
      return;
    }
    const uint32_t r = uint32_t(g - ch.row_base);
    const uint32_t* base = codes + ch.elem_base;
    const uint32_t* row = base + int64_t(r) * ch.dim;
    const uint32_t* slots = table + ch.hash_base;
    const uint32_t mask = uint32_t(ch.hash_cap - 1);
    uint32_t slot = uint32_t(warp_row_hash(row, ch.dim) >> 32) & mask;
    for (int64_t probe = 0; probe < ch.hash_cap; ++probe, slot = (slot + 1) & mask) {
      const uint32_t u = slots[slot];  // the table is complete: every lane reads the same word
      if (u != kEmpty && warp_rows_equal(base + int64_t(u) * ch.dim, row, ch.dim)) {
        if (leader) {
          rep[g] = u;
          first[g] = u == r ? 1u : 0u;
        }
        return;
      }
    }
    // Not found (only after the insert failed): keep every later index in range until the read-back raises.
    if (leader) {
      atomic_or(S + i * kStWords + kStError, kErrHashLost);
      rep[g] = r;
      first[g] = 1u;
    }
  });
  // First-appearance ids: a running count of first rows.
  at::Tensor incl_t = at::cumsum(first_t, 0, at::kLong);
  const int64_t* incl = ptr<int64_t>(incl_t);
  for_each("encode: unique row ids", RW, DLAC_LAMBDA(int64_t g) {
    const int64_t i = find_segment(RWS, N, g);
    const EncChunk& ch = CH[i];
    if (S[i * kStWords + kStKind] != kKindQuant || ch.rows < 2) return;
    const int64_t before = ch.row_base > 0 ? incl[ch.row_base - 1] : 0;
    index[g] = uint32_t(incl[ch.row_base + rep[g]] - 1 - before);
    hist_add(mult + ch.row_base + rep[g]);  // one more row with the content of its first
  });
  for_each("encode: unique row counts", N, DLAC_LAMBDA(int64_t i) {
    const EncChunk& ch = CH[i];
    uint32_t* s = S + i * kStWords;
    if (s[kStKind] != kKindQuant) return;
    const int64_t before = ch.row_base > 0 ? incl[ch.row_base - 1] : 0;
    s[kStNuniq] = ch.rows < 2 ? uint32_t(ch.rows) : uint32_t(incl[ch.row_base + ch.rows - 1] - before);
  });
  // The histograms the planner reads, side by side behind the state words: their lengths (hist_lengths per chunk),
  // a running sum for where each goes, then counted there (count_histograms; those past the region wait for a
  // second round below).
  for_each("encode: histogram lengths", N,
           DLAC_LAMBDA(int64_t i) { hist_lengths(S + i * kStWords, CH[i].rows, hlen + 3 * i); });
  at::Tensor hend_t = at::cumsum(hlen_t, 0);
  const int64_t* hend = ptr<int64_t>(hend_t);
  meta1_t.narrow(0, stage_off, 4 * hist_cap).zero_();
  count_histograms(CH, S, TL, NT, RWS, N, RW, codes, first, mult, index, hlen, hend, stage, hist_cap);

  // Host: one read-back (state words and the histograms), a second only if the histograms outgrew their region.
  const int64_t st_words = (stage_off - st_off) / 4;
  std::vector<uint32_t> rb = read_back<uint32_t>(meta1_t.narrow(0, st_off, 4 * (st_words + hist_cap)));
  const uint32_t* st = rb.data();
  std::vector<int64_t> hist_at(size_t(N) * 3, -1), hist_len(size_t(N) * 3, 0);
  int64_t hist_words = 0;
  for (int64_t i = 0; i < N; ++i) {
    const uint32_t* s = st + i * kStWords;
    if (s[kStError]) {
      const std::string what = (s[kStError] & kErrHashFull) ? "a row found no free slot in" : "a row was lost from";
      TORCH_CHECK(false, ::dlac::str("chunk ", i, " (row block ", i / C, ", column block ", i % C,
                                     "): the device encoder's row "
                  "hash set is broken (", what, " its ", chunks[i].hash_cap, " slots for ", chunks[i].rows, " rows); "
                  "this is a bug in the CUDA kernels: please report it, and encode on the CPU meanwhile (x.cpu())"));
    }
    int64_t len[3];
    hist_lengths(s, chunks[i].rows, len);
    for (int p = 0; p < 3; ++p) {
      if (!len[p]) continue;
      hist_at[i * 3 + p] = hist_words;
      hist_len[i * 3 + p] = len[p];
      hist_words += len[p];
    }
  }
  hist_needs().record(shape_key, hist_words);
  const uint32_t* hist_h = st + st_words;
  if (hist_words > hist_cap) {  // counted again, all of them, in a region of their size
    at::Tensor all_t = zeros_u32(hist_words, device);
    count_histograms(CH, S, TL, NT, RWS, N, RW, codes, first, mult, index, hlen, hend, ptr<uint32_t>(all_t),
                     hist_words);
    const std::vector<uint32_t> all = read_back<uint32_t>(all_t.narrow(0, 0, hist_words));
    rb.resize(size_t(st_words));
    rb.insert(rb.end(), all.begin(), all.end());
    st = rb.data();
    hist_h = st + st_words;
  }
  auto freq_of = [&](int64_t i, int p) {
    const int64_t from = hist_at[i * 3 + p];
    std::vector<uint64_t> f(static_cast<size_t>(hist_len[i * 3 + p]));
    for (size_t v = 0; v < f.size(); ++v) f[v] = hist_h[from + v];
    return f;
  };

  std::vector<int64_t> sizes(N), offsets(N + 1, 0);
  std::vector<uint8_t> blob;       // header and Huffman prefix bytes, written at blob_dst
  std::vector<int64_t> blob_dst;
  std::vector<int64_t> out_meta(size_t(N) * 2, 0);  // per chunk: payload offset, mode
  std::vector<EncStream> streams;
  std::vector<int64_t> stream_starts{0}, block_starts{0};
  std::vector<uint32_t> code_tables;
  std::vector<Header> headers(N);
  std::vector<ChunkPlan> plans(N);
  // Each chunk's plan (Huffman code lengths included) is independent of the others: in parallel on the host.
  at::parallel_for(0, N, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const uint32_t* s = st + i * kStWords;
      const EncChunk& ch = chunks[i];
      Header& h = headers[i];
      h.rows = uint32_t(ch.rows);
      h.dim = uint32_t(ch.dim);
      uint32_t kind = s[kStKind];
      if (kind == kKindQuant) {
        const bool huff_ok = hist_at[i * 3] >= 0;
        std::vector<uint64_t> freq, f0, f1;
        if (huff_ok) freq = freq_of(i, 0);
        if (hist_at[i * 3 + 1] >= 0) f0 = freq_of(i, 1);
        if (hist_at[i * 3 + 2] >= 0) f1 = freq_of(i, 2);
        plans[i] = plan_chunk(uint64_t(ch.rows), uint64_t(ch.dim), s[kStQmax], s[kStNuniq],
                              huff_ok ? &freq : nullptr, hist_at[i * 3 + 1] >= 0 ? &f0 : nullptr,
                              hist_at[i * 3 + 2] >= 0 ? &f1 : nullptr);
        if (plans[i].mode == kRaw) kind = kKindRaw;
        else h = quantized_header(plans[i], uint64_t(ch.rows), uint64_t(ch.dim), bits_to_float(s[kStMin]),
                                  bits_to_float(s[kStEb]), bits_to_float(s[kStStep]), s[kStNuniq]);
      }
      if (kind == kKindConst) {
        h.mode = kConst;
        h.min = bits_to_float(s[kStMin]);
      } else if (kind == kKindRaw) {
        h.mode = kRaw;
        h.sec0 = uint32_t(4 * ch.rows * ch.dim);
      }
    }
  });
  for (int64_t i = 0; i < N; ++i) {
    const EncChunk& ch = chunks[i];
    const Header& h = headers[i];
    sizes[i] = int64_t(kHeaderSize) + h.sec0 + h.sec1;
    offsets[i + 1] = offsets[i] + sizes[i];
    out_meta[2 * i] = offsets[i];
    out_meta[2 * i + 1] = h.mode;
    uint8_t hb[kHeaderSize];
    write_header(h, hb);
    for (uint32_t k = 0; k < kHeaderSize; ++k) {
      blob.push_back(hb[k]);
      blob_dst.push_back(offsets[i] + k);
    }
    if (h.mode != kPack && h.mode != kHuff && h.mode != kDedup) continue;
    // Streams: (plan, source, first value, count, section start).
    const ChunkPlan& plan = plans[i];
    struct Part {
      const StreamPlan* p;
      int32_t src;
      int64_t base, count, start;
    };
    std::vector<Part> parts;
    const int64_t body = offsets[i] + kHeaderSize;
    if (h.mode == kDedup) {
      parts.push_back({&plan.p0, 1, ch.elem_base, int64_t(h.nuniq) * ch.dim, body});
      parts.push_back({&plan.p1, 2, ch.row_base, ch.rows, body + int64_t(plan.p0.size)});
    } else {
      parts.push_back({&plan.whole, 0, ch.elem_base, ch.rows * ch.dim, body});
    }
    for (const Part& part : parts) {
      EncStream es{};
      es.sym_base = stream_starts.back();
      es.count = part.count;
      es.src_base = part.base;
      es.src = part.src;
      es.huff = part.p->huff ? 1 : 0;
      es.width = part.p->width;
      TORCH_CHECK(part.p->width <= kMaxCodeBits, ::dlac::str("chunk ", i, ": a ", part.p->width,
                                                             "-bit PACK stream (the format "
                  "allows ", kMaxCodeBits, "); this is a bug in the encoder's plan, please report it"));
      if (part.p->huff) {
        std::vector<uint8_t> prefix(huff_prefix_size(*part.p));
        write_huff_prefix(*part.p, uint64_t(part.count), prefix.data());
        for (size_t k = 0; k < prefix.size(); ++k) {
          blob.push_back(prefix[k]);
          blob_dst.push_back(part.start + int64_t(k));
        }
        const int64_t nblocks = int64_t(ceil_div(uint64_t(part.count), kHuffBlock));
        es.ends_off = part.start + int64_t(prefix.size());
        es.data_bit = 8 * (es.ends_off + 4 * nblocks);
        es.table_off = int64_t(code_tables.size());
        const std::vector<uint32_t> t = huff_code_table(*part.p);
        code_tables.insert(code_tables.end(), t.begin(), t.end());
        block_starts.push_back(block_starts.back() + nblocks);
      } else {
        es.data_bit = 8 * part.start;
        block_starts.push_back(block_starts.back());
      }
      streams.push_back(es);
      stream_starts.push_back(stream_starts.back() + part.count);
    }
  }
  const int64_t total = offsets[N];
  const int64_t NS = int64_t(streams.size()), SYM = stream_starts.back(), BLK = block_starts.back();

  // Phase 2 metadata in one upload: header and prefix bytes with their destinations, chunk modes, streams, code
  // tables, the checksum plan and the sizes returned.
  Staging meta2;
  const int64_t dst_off = meta2.add(blob_dst), meta_off = meta2.add(out_meta), sizes_off = meta2.add(sizes);
  std::vector<int64_t> stream_counts(streams.size());
  for (size_t k = 0; k < streams.size(); ++k) stream_counts[k] = streams[k].count;
  const std::vector<Tile> stream_tiles = make_tiles(stream_counts, std::vector<int64_t>(streams.size(), 1));
  const int64_t NST = int64_t(stream_tiles.size());
  const int64_t streams_off = meta2.add(streams), stl_off = meta2.add(stream_tiles);
  const int64_t bs_off = meta2.add(block_starts), ct_off = meta2.add(code_tables);
  const CrcPlan crc_plan = plan_crcs(offsets, sizes, meta2);
  const int64_t blob_off = meta2.add(blob);
  at::Tensor meta2_t = meta2.upload(device);
  const int64_t* meta = meta2.at<int64_t>(meta_off);

  // Device: the payload, zeroed (codes are or-ed into it), with headers and Huffman prefixes in place.
  at::Tensor words_t = zeros_u32((total + 3) / 4 + 1, device);
  at::Tensor payload = words_t.view(at::kByte).narrow(0, 0, total);
  payload.index_copy_(0, meta2_t.narrow(0, dst_off, 8 * int64_t(blob_dst.size())).view(at::kLong),
                      meta2_t.narrow(0, blob_off, int64_t(blob.size())));
  uint8_t* out = ptr<uint8_t>(words_t);
  uint32_t* words = ptr<uint32_t>(words_t);
  // One pass for both: RAW chunks get the floats as they are, DEDUP chunks their unique code rows in id order.
  for_each_element_if("encode: raw copies and unique rows", TL, NT,
      DLAC_LAMBDA(int64_t i) { return meta[2 * i + 1] == kRaw || meta[2 * i + 1] == kDedup; },
      DLAC_LAMBDA(int64_t i, int64_t l, int64_t r, int64_t j) {
    const int64_t mode = meta[2 * i + 1];
    const EncChunk& ch = CH[i];
    if (mode == kRaw) {
      store_u32_bytes(out + meta[2 * i] + kHeaderSize + 4 * l, float_to_bits(xp[(ch.r0 + r) * ld + ch.c0 + j]));
    } else if (mode == kDedup && first[ch.row_base + r]) {
      uniq[ch.elem_base + int64_t(index[ch.row_base + r]) * ch.dim + j] = codes[ch.elem_base + l];
    }
  });
  if (NS > 0) {
    at::Tensor bits_t = unset_u32(SYM, device);
    const EncStream* SS = meta2.at<EncStream>(streams_off);
    const Tile* STL = meta2.at<Tile>(stl_off);
    const int64_t* BST = meta2.at<int64_t>(bs_off);
    const uint32_t* CT = meta2.at<uint32_t>(ct_off);
    int32_t* nbits = ptr<int32_t>(bits_t);
    const uint32_t* srcs0 = codes;
    const uint32_t* srcs1 = uniq;
    const uint32_t* srcs2 = index;
    // Bits per symbol, then each symbol's offset in its stream from a running sum.
    // Symbols in tiles of one stream each (as elements in tiles of one chunk: no search for the stream).
    for_each_element("encode: symbol lengths", STL, NST, DLAC_LAMBDA(int64_t k, int64_t l, int64_t, int64_t) {
      const EncStream& es = SS[k];
      const uint32_t* src = es.src == 0 ? srcs0 : es.src == 1 ? srcs1 : srcs2;
      const uint32_t v = src[es.src_base + l];
      nbits[es.sym_base + l] = es.huff ? int32_t(CT[es.table_off + v] >> 24) : int32_t(es.width);
    });
    at::Tensor cum_t = at::cumsum(bits_t, 0, at::kLong);
    const int64_t* cum = ptr<int64_t>(cum_t);
    // Tile-wise bit packing: a block ORs its tile's codes into words in shared memory, then stores the words that
    // hold only its own bits as they are, and ORs in only the first and the last (shared with the neighbouring tile,
    // or with the stream's prefix and block ends): one global store per payload word instead of an atomic OR per code.
    const auto zero = DLAC_LAMBDA(const Tile& t, uint32_t thread, uint32_t nthreads, PackScratch& sm) {
      const int64_t nw = tile_bits(SS[t.chunk], t, cum, nbits).words();
      for (int64_t w = thread; w < nw; w += nthreads) sm.words[w] = 0;
    };
    const auto pack = DLAC_LAMBDA(const Tile& t, uint32_t thread, uint32_t nthreads, PackScratch& sm) {
      const EncStream& es = SS[t.chunk];
      const int64_t origin = 32 * (tile_bits(es, t, cum, nbits).begin >> 5);
      const uint32_t* src = es.src == 0 ? srcs0 : es.src == 1 ? srcs1 : srcs2;
      const int64_t before = es.sym_base > 0 ? cum[es.sym_base - 1] : 0;
      walk_tile(t, thread, nthreads, [&](int64_t, int64_t l, int64_t, int64_t) {
        const int64_t s = es.sym_base + l;
        const uint32_t len = uint32_t(nbits[s]);
        if (len == 0) return;
        const uint32_t v = src[es.src_base + l];
        const uint32_t code = es.huff ? (CT[es.table_off + v] & 0xFFFFFFu) : v;
        const int64_t bit = es.data_bit + (cum[s] - len - before) - origin;
        const int64_t w = bit >> 5;
        const uint32_t sh = uint32_t(bit & 31);
        atomic_or(sm.words + w, code << sh);
        if (sh + len > 32) atomic_or(sm.words + w + 1, code >> (32 - sh));
      });
    };
    const auto flush = DLAC_LAMBDA(const Tile& t, uint32_t thread, uint32_t nthreads, PackScratch& sm) {
      const TileBits tb = tile_bits(SS[t.chunk], t, cum, nbits);
      const int64_t nw = tb.words(), w0 = tb.begin >> 5;
      for (int64_t w = thread; w < nw; w += nthreads) {
        const uint32_t v = sm.words[w];
        if (w > 0 && w < nw - 1) words[w0 + w] = v;
        else if (v != 0) atomic_or(words + w0 + w, v);
      }
    };
    for_each_tile_block_if<PackScratch>("encode: bit packing", STL, NST, AllChunks{}, zero, pack, flush);
    // Huffman block end offsets (bits from the start of the stream).
    for_each("encode: huffman block ends", BLK, DLAC_LAMBDA(int64_t g) {
      const int64_t k = find_segment(BST, NS, g);
      const EncStream& es = SS[k];
      const int64_t b = g - BST[k];
      const int64_t last = ((b + 1) * int64_t(kHuffBlock) < es.count ? (b + 1) * int64_t(kHuffBlock) : es.count) - 1;
      const int64_t before = es.sym_base > 0 ? cum[es.sym_base - 1] : 0;
      store_u32_bytes(out + es.ends_off + 4 * b, uint32_t(cum[es.sym_base + last] - before));
    });
  }
  // Checksums, written into each header.
  at::Tensor crc_t = unset_u32(N, device);  // every encoded chunk holds at least a header: all N are written
  uint32_t* crc = ptr<uint32_t>(crc_t);
  run_crcs(crc_plan, meta2, payload, crc);
  for_each("encode: checksums into headers", N,
           DLAC_LAMBDA(int64_t i) { store_u32_bytes(out + meta[2 * i] + kCrcOffset, crc[i]); });
  // A copy, so the caller's sizes do not keep this call's staging alive.
  at::Tensor sizes_t = meta2_t.narrow(0, sizes_off, 8 * N).view(at::kLong).clone();
  return {payload, sizes_t};
}

}  // inline namespace DLAC_GRID_BUILD
}  // namespace grid
}  // namespace dlac
