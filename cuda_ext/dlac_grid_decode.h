// The device pipeline's decoder (see dlac_grid.h for the pipeline and its synchronizations): headers and
// checksums, the host's header validation, Huffman and PACK sections, the dequantized output, the error report.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "dlac_codec.h"
#include "dlac_grid_launch.h"
#include "dlac_grid_transfer.h"
#include "dlac_str.h"

namespace dlac {
namespace grid {
inline namespace DLAC_GRID_BUILD {

DLAC_HD inline float dequantize(float lo, uint32_t q, float step) { return f_add(lo, f_mul(float(int32_t(q)), step)); }

// ------------------------------------------------------------------------------------------------------------
// Decode
// ------------------------------------------------------------------------------------------------------------

struct DecChunk {
  int64_t r0, rows, c0, dim, elem_base, row_base, off;
  int32_t valid, mode;
  float lo, step;
  uint32_t nuniq, pad;
};

// One lossless section to decode into a code array: codes (0), unique rows (1), row index (2).
struct DecSection {
  int64_t data_off, nbytes, count, dst_base, sym_base;
  int32_t huff, dst;
  uint32_t width, pad;
};

inline at::Tensor decode_grid_device(const at::Tensor& payload, const std::vector<int64_t>& sizes, c10::IntArrayRef rs,
                                     c10::IntArrayRef cs) {
  const at::Device device = payload.device();
  const int64_t R = int64_t(rs.size()) - 1, C = int64_t(cs.size()) - 1, N = R * C;
  const int64_t ld = cs.back();
  std::vector<int64_t> offsets(N + 1, 0);
  for (int64_t i = 0; i < N; ++i) offsets[i + 1] = offsets[i] + sizes[i];
  // Phase 1: every chunk's header bytes and checksum gathered side by side on the device, one read-back. Chunks
  // shorter than a header get zeros there (copied, so written: compute-sanitizer's initcheck), the host reads none.
  Staging meta1;
  const CrcPlan crc_plan = plan_crcs(offsets, sizes, meta1);
  const int64_t rb_bytes = N * int64_t(kHeaderSize) + 4 * N;  // N * 48 is a multiple of 4: the crcs stay aligned
  const int64_t rb_off = meta1.reserve(rb_bytes);
  at::Tensor meta1_t = meta1.upload(device);
  {
    uint8_t* hdr = meta1.at<uint8_t>(rb_off);
    const int64_t* m = meta1.at<int64_t>(crc_plan.meta);
    const uint8_t* src = ptr<uint8_t>(payload);
    for_each("decode: gather headers", N * int64_t(kHeaderSize), DLAC_LAMBDA(int64_t t) {
      const int64_t i = t / int64_t(kHeaderSize);
      hdr[t] = m[2 * i + 1] >= int64_t(kHeaderSize) ? src[m[2 * i] + (t - i * int64_t(kHeaderSize))] : uint8_t(0);
    });
    run_crcs(crc_plan, meta1, payload, meta1.at<uint32_t>(rb_off + N * int64_t(kHeaderSize)));
  }
  const std::vector<uint8_t> rb = read_back<uint8_t>(meta1_t.narrow(0, rb_off, rb_bytes));
  std::vector<uint32_t> crcs(N);
  std::memcpy(crcs.data(), rb.data() + N * int64_t(kHeaderSize), 4 * size_t(N));

  // Host: header validation (the CPU decoder's checks and messages), then what to decode where.
  std::vector<std::string> errors(N);
  std::vector<DecChunk> chunks(N);
  std::vector<int64_t> elem_starts(N + 1, 0), row_starts(N + 1, 0);
  std::vector<DecSection> huff, pack;
  std::vector<int64_t> huff_chunk, huff_starts{0}, pack_starts{0};
  std::vector<int> sec_slot(size_t(N) * 2, -1);  // which huff section holds section 0 / 1 of chunk i
  const uint8_t zeros[kHeaderSize] = {0};
  for (int64_t i = 0; i < N; ++i) {
    const int64_t r = i / C, c = i % C;
    DecChunk& ch = chunks[i];
    ch.r0 = rs[r];
    ch.rows = rs[r + 1] - rs[r];
    ch.c0 = cs[c];
    ch.dim = cs[c + 1] - cs[c];
    ch.elem_base = elem_starts[i];
    ch.row_base = row_starts[i];
    ch.off = offsets[i];
    ch.valid = 0;
    elem_starts[i + 1] = elem_starts[i] + ch.rows * ch.dim;
    row_starts[i + 1] = row_starts[i] + ch.rows;
    const uint8_t* hp = zeros;
    if (sizes[i] >= int64_t(kHeaderSize)) hp = rb.data() + i * int64_t(kHeaderSize);
    Header h;
    try {
      h = parse_header(hp, uint64_t(sizes[i]), &crcs[i]);
      if (int64_t(h.rows) != ch.rows || int64_t(h.dim) != ch.dim)
        fail("header shape " + std::to_string(h.rows) + "x" + std::to_string(h.dim) + " does not match the block's " +
             std::to_string(ch.rows) + "x" + std::to_string(ch.dim));
    } catch (const DecodeError& e) {
      errors[i] = e.what();
      continue;
    }
    ch.valid = 1;
    ch.mode = h.mode;
    ch.lo = h.min;
    ch.step = h.step;
    ch.nuniq = h.nuniq;
    const int64_t body = offsets[i] + kHeaderSize;
    auto add = [&](int slot, bool is_huff, uint32_t width, int64_t start, int64_t nbytes, int64_t count, int32_t dst,
                   int64_t dst_base) {
      DecSection s{start, nbytes, count, dst_base, 0, is_huff ? 1 : 0, dst, width, 0};
      if (is_huff) {
        s.sym_base = huff_starts.back();
        sec_slot[i * 2 + slot] = int(huff.size());
        huff.push_back(s);
        huff_chunk.push_back(i);
        huff_starts.push_back(huff_starts.back() + int64_t(ceil_div(uint64_t(count), kHuffBlock)));
      } else {
        s.sym_base = pack_starts.back();
        pack.push_back(s);
        pack_starts.push_back(pack_starts.back() + count);
      }
    };
    const int64_t n = ch.rows * ch.dim;
    if (h.mode == kPack) add(0, false, h.width0, body, h.sec0, n, 0, ch.elem_base);
    else if (h.mode == kHuff) add(0, true, 0, body, h.sec0, n, 0, ch.elem_base);
    else if (h.mode == kDedup) {
      add(0, (h.flags & kFlagSec0Huff) != 0, h.width0, body, h.sec0, int64_t(h.nuniq) * ch.dim, 1, ch.elem_base);
      add(1, (h.flags & kFlagSec1Huff) != 0, h.width1, body + h.sec0, h.sec1, ch.rows, 2, ch.row_base);
    }
  }
  const int64_t E = elem_starts[N], NH = int64_t(huff.size()), NP = int64_t(pack.size());
  // Phase 2 metadata in one upload; the error words (zeroed) go last so that the call's second and last read-back
  // is one contiguous copy.
  Staging meta2;
  const int64_t hsec_off = meta2.add(huff), hs_off = meta2.add(huff_starts);
  std::vector<int64_t> pack_counts(pack.size());
  for (size_t k = 0; k < pack.size(); ++k) pack_counts[k] = pack[k].count;
  const std::vector<Tile> pack_tiles = make_tiles(pack_counts, std::vector<int64_t>(pack.size(), 1));
  const int64_t NPT = int64_t(pack_tiles.size());
  const int64_t psec_off = meta2.add(pack), ptl_off = meta2.add(pack_tiles);
  std::vector<int64_t> chunk_rows(N), chunk_dims(N);
  for (int64_t i = 0; i < N; ++i) {
    chunk_rows[i] = chunks[i].rows;
    chunk_dims[i] = chunks[i].dim;
  }
  const std::vector<Tile> tiles = make_tiles(chunk_rows, chunk_dims);
  const int64_t NT = int64_t(tiles.size());
  const int64_t ch_off = meta2.add(chunks), tl_off = meta2.add(tiles);
  const int64_t err_off = meta2.add(std::vector<uint32_t>(size_t(NH + N), 0u));
  at::Tensor meta2_t = meta2.upload(device);
  // Decoded codes are read only where a section wrote them, or after a section failed (then the call raises).
  at::Tensor codes_t = unset_u32(E, device), uniq_t = unset_u32(E, device), index_t = unset_u32(row_starts[N], device);
  at::Tensor out_t = at::empty({rs.back(), cs.back()}, at::TensorOptions().dtype(at::kFloat).device(device));
  uint32_t* dsts0 = ptr<uint32_t>(codes_t);
  uint32_t* dsts1 = ptr<uint32_t>(uniq_t);
  uint32_t* dsts2 = ptr<uint32_t>(index_t);
  const uint8_t* data = ptr<uint8_t>(payload);
  uint32_t* herr = meta2.at<uint32_t>(err_off);
  uint32_t* cerr = herr + NH;
  if (NH > 0) {
    const auto on_device = at::TensorOptions().device(device);
    at::Tensor views_t = at::empty({NH * int64_t(sizeof(HuffView))}, on_device.dtype(at::kByte));
    at::Tensor tables_t = at::empty({NH * int64_t(kHuffMaxAlphabet)}, on_device.dtype(at::kShort));
    const DecSection* HS = meta2.at<DecSection>(hsec_off);
    const int64_t* HST = meta2.at<int64_t>(hs_off);
    HuffView* views = ptr<HuffView>(views_t);
    uint16_t* tables = ptr<uint16_t>(tables_t);
    for_each_serial("decode: huffman tables", NH, DLAC_LAMBDA(int64_t k) {
      const DecSection& s = HS[k];
      HuffView v;
      const int e = huff_parse(data + s.data_off, uint64_t(s.nbytes), uint64_t(s.count), &v);
      views[k] = v;
      if (e) {
        herr[k] = uint32_t(e);
        return;
      }
      huff_decode_table(v, tables + k * int64_t(kHuffMaxAlphabet));
    });
    for_each_serial("decode: huffman blocks", huff_starts.back(), DLAC_LAMBDA(int64_t g) {
      const int64_t k = find_segment(HST, NH, g);
      if (herr[k]) return;
      const DecSection& s = HS[k];
      const uint64_t b = uint64_t(g - HST[k]);
      const uint64_t left = uint64_t(s.count) - b * kHuffBlock;
      const uint64_t count = left < kHuffBlock ? left : kHuffBlock;
      uint32_t* dst = (s.dst == 0 ? dsts0 : s.dst == 1 ? dsts1 : dsts2) + s.dst_base + int64_t(b * kHuffBlock);
      if (huff_decode_block(views[k], tables + k * int64_t(kHuffMaxAlphabet), b, count, dst) != kHuffOk)
        atomic_or(herr + k, uint32_t(kHuffCorrupt));
    });
  }
  if (NP > 0) {
    const DecSection* PS = meta2.at<DecSection>(psec_off);
    const Tile* PTL = meta2.at<Tile>(ptl_off);
    for_each_element("decode: pack values", PTL, NPT, DLAC_LAMBDA(int64_t p, int64_t k, int64_t, int64_t) {
      const DecSection& s = PS[p];
      uint32_t* dst = s.dst == 0 ? dsts0 : s.dst == 1 ? dsts1 : dsts2;
      dst[s.dst_base + k] = unpack_one(data + s.data_off, uint64_t(s.nbytes), uint64_t(k), s.width);
    });
  }
  const DecChunk* CH = meta2.at<DecChunk>(ch_off);
  const Tile* TL = meta2.at<Tile>(tl_off);
  float* out = out_t.data_ptr<float>();
  for_each_element_if("decode: output", TL, NT, DLAC_LAMBDA(int64_t i) { return CH[i].valid != 0; },
      DLAC_LAMBDA(int64_t i, int64_t l, int64_t r, int64_t j) {
    const DecChunk& ch = CH[i];
    if (!ch.valid) return;
    const int64_t e = ch.elem_base + l;
    float* o = out + (ch.r0 + r) * ld + ch.c0 + j;
    switch (ch.mode) {
      case kConst: *o = ch.lo; break;
      case kRaw: *o = bits_to_float(load_u32(data + ch.off + kHeaderSize + 4 * l)); break;
      case kDedup: {
        const uint32_t u = dsts2[ch.row_base + r];
        if (u >= ch.nuniq) {
          atomic_or(cerr + i, 1u);
          return;
        }
        *o = dequantize(ch.lo, dsts1[ch.elem_base + int64_t(u) * ch.dim + j], ch.step);
        break;
      }
      default: *o = dequantize(ch.lo, dsts0[e], ch.step);
    }
  });
  const std::vector<uint32_t> errs = read_back<uint32_t>(meta2_t.narrow(0, err_off, 4 * (NH + N)));
  const uint32_t* herrs = errs.data();
  const uint32_t* cerrs = herrs + NH;
  for (int64_t i = 0; i < N; ++i) {
    std::string msg = errors[i];
    for (int slot = 0; slot < 2 && msg.empty(); ++slot) {
      const int k = sec_slot[i * 2 + slot];
      if (k >= 0 && herrs[k]) msg = huff_error_message(int(herrs[k]));
    }
    if (msg.empty() && cerrs[i]) msg = "DEDUP index out of range";
    TORCH_CHECK_VALUE(msg.empty(), ::dlac::str("chunk ", i, " (row block ", i / C, ", column block ", i % C, "): ",
                                               msg));
  }
  return out_t;
}

}  // inline namespace DLAC_GRID_BUILD
}  // namespace grid
}  // namespace dlac
