// Host <-> device helpers of the device pipeline (see dlac_grid.h): read-backs (the synchronizations a call costs),
// device buffers, one-copy metadata staging, and the CRC-32 of every chunk on the device.
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "dlac_codec.h"
#include "dlac_grid_launch.h"

namespace dlac {
namespace grid {
inline namespace DLAC_GRID_BUILD {

// ------------------------------------------------------------------------------------------------------------
// Host <-> device helpers
// ------------------------------------------------------------------------------------------------------------

// Stream safety. Every kernel, copy and temporary of one call runs on the stream that is current when the op is
// called. Device temporaries come from the caching allocator on that stream, which hands a freed block out again only
// to work ordered after it on the same stream, so freeing them when the call returns (kernels still queued) is safe.
// Host staging is pinned and copied with non_blocking=true: ATen records an event on the stream for the pinned block
// and the caching host allocator does not reuse it until the copy has run. The one buffer shared across calls (and so
// across streams), the CRC tables, is uploaded blocking, once per device.

// Device-to-host copies of the device pipeline's own results: each one waits for the stream, so they are the
// synchronizations a call costs. Counted (process-wide) so the tests can hold the pipeline to its documented
// numbers: encode 1 (2 when the histograms outgrow their region), decode 2.
inline std::atomic<int64_t>& readback_counter() {
  static std::atomic<int64_t> count{0};
  return count;
}

template <class T>
T* ptr(const at::Tensor& t) {
  return reinterpret_cast<T*>(t.data_ptr());
}
// A copy of device results on the host: one synchronization.
template <class T>
std::vector<T> read_back(const at::Tensor& t) {
  readback_counter().fetch_add(1);
  raise_emulated_fault();  // the host emulation's stand-in for a fault that this synchronization reports
  at::Tensor h = t.contiguous().to(at::kCPU);
  kernels_in_flight().clear();  // every kernel before this copy ran without a fault
  std::vector<T> v(size_t(h.nbytes() / sizeof(T)));
  if (!v.empty()) std::memcpy(v.data(), h.data_ptr(), v.size() * sizeof(T));
  return v;
}
// An op argument (bounds, sizes) as a host vector: free for host tensors (as the Python API passes them), one
// synchronization for a device tensor.
template <class T>
std::vector<T> argument_on_host(const at::Tensor& t) {
  if (!t.device().is_cpu()) return read_back<T>(t);
  at::Tensor h = t.contiguous();
  std::vector<T> v(size_t(h.nbytes() / sizeof(T)));
  if (!v.empty()) std::memcpy(v.data(), h.data_ptr(), v.size() * sizeof(T));
  return v;
}
inline at::Tensor zeros_u32(int64_t n, const at::Device& device) {
  return at::zeros({std::max<int64_t>(n, 1)}, at::TensorOptions().dtype(at::kInt).device(device));
}
// A device buffer every read element of which a kernel writes first: no memset on the GPU. The host emulation fills
// it with a poison pattern instead, so a read of an element nobody wrote changes the bytes the tests compare.
inline at::Tensor unset_u32(int64_t n, const at::Device& device) {
  const auto options = at::TensorOptions().dtype(at::kInt).device(device);
#if defined(__CUDACC__)
  return at::empty({std::max<int64_t>(n, 1)}, options);
#else
  return at::full({std::max<int64_t>(n, 1)}, int32_t(0xA5A5A5A5u), options);
#endif
}

// One phase's metadata, gathered on the host and uploaded in one copy: arrays are appended 8-byte aligned and read
// on the device at their offsets. From pinned memory without blocking on a GPU: the copy is queued behind the
// kernels already on the stream instead of waiting for them. `reserve` bytes after the uploaded ones belong to the
// device buffer only (results a later read-back takes in the same copy as the arrays before them).
class Staging {
 public:
  template <class T>
  int64_t add(const std::vector<T>& v) {
    const int64_t at = int64_t((bytes_.size() + 7) & ~size_t(7));
    bytes_.resize(size_t(at) + v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(bytes_.data() + at, v.data(), v.size() * sizeof(T));
    return at;
  }
  // Offset of `nbytes` device-only bytes after everything added so far (call after the last add).
  int64_t reserve(int64_t nbytes) {
    const int64_t at = int64_t((bytes_.size() + 7) & ~size_t(7));
    reserved_ = at - int64_t(bytes_.size()) + nbytes;
    return at;
  }
  at::Tensor upload(const at::Device& device) {
    const bool pinned = device.is_cuda();
    const int64_t n = int64_t(bytes_.size());
    at::Tensor dev =
        at::empty({std::max<int64_t>(n + reserved_, 8)}, at::TensorOptions().dtype(at::kByte).device(device));
    if (n > 0) {
      at::Tensor host = at::empty({n}, at::TensorOptions().dtype(at::kByte).pinned_memory(pinned));
      std::memcpy(host.data_ptr<uint8_t>(), bytes_.data(), size_t(n));
      dev.narrow(0, 0, n).copy_(host, /*non_blocking=*/pinned);
    }
    base_ = dev.data_ptr<uint8_t>();
    return dev;
  }
  template <class T>
  T* at(int64_t offset) const {
    return reinterpret_cast<T*>(base_ + offset);
  }

 private:
  std::vector<uint8_t> bytes_;
  int64_t reserved_ = 0;
  uint8_t* base_ = nullptr;
};

// CRC tables on the device: the bytewise table, and for joining segments of kCrcSegment bytes, the register after
// feeding kCrcSegment zero bytes from each single-byte state (the map is linear in the register).
constexpr uint64_t kCrcSegment = 4096;
inline at::Tensor crc_tables(const at::Device& device) {
  static std::mutex mu;
  // Never destroyed: device tensors freed after the CUDA runtime shut down at exit would crash.
  static auto* cache = new std::unordered_map<std::string, at::Tensor>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(device.str());
  if (it != cache->end()) return it->second;
  std::vector<uint32_t> t(5 * 256);
  const uint32_t* t0 = crc_table().t[0];
  for (int i = 0; i < 256; ++i) t[i] = t0[i];
  for (int b = 0; b < 4; ++b)
    for (uint32_t v = 0; v < 256; ++v) {
      uint32_t r = v << (8 * b);
      for (uint64_t k = 0; k < kCrcSegment; ++k) r = t0[r & 0xFF] ^ (r >> 8);
      t[256 * (b + 1) + v] = r;
    }
  // Blocking: the tables are shared by every later call on every stream, so they must be complete before any of
  // them can run (a non-blocking upload would be ordered on this caller's stream only). Once per device and process.
  at::Tensor host = at::empty({int64_t(t.size())}, at::TensorOptions().dtype(at::kInt));
  std::memcpy(host.data_ptr(), t.data(), t.size() * sizeof(uint32_t));
  at::Tensor d = host.to(device, /*non_blocking=*/false, /*copy=*/true);
  cache->emplace(device.str(), d);
  return d;
}
DLAC_HD inline uint32_t crc_shift(const uint32_t* tables, uint32_t r) {
  const uint32_t* s = tables + 256;
  return s[r & 0xFF] ^ s[256 + ((r >> 8) & 0xFF)] ^ s[512 + ((r >> 16) & 0xFF)] ^ s[768 + (r >> 24)];
}

// CRC-32 of every chunk (offsets[i], sizes[i]) of at least a header, with the crc field taken as zero.
// Chunk i is cut into segments: the first holds size % kCrcSegment bytes (or a whole segment), the rest are whole,
// so one table joins them. Planned into a phase's staging (segment starts; offset and size per chunk), run after it
// is uploaded.
struct CrcPlan {
  int64_t n = 0, nseg = 0;
  int64_t starts = 0, meta = 0;  // staging offsets: int64 [n + 1] segment starts, int64 [2n] (offset, size)
};
inline CrcPlan plan_crcs(const std::vector<int64_t>& offsets, const std::vector<int64_t>& sizes, Staging& staging) {
  CrcPlan plan;
  plan.n = int64_t(sizes.size());
  std::vector<int64_t> seg_starts(plan.n + 1, 0), meta(2 * plan.n);
  for (int64_t i = 0; i < plan.n; ++i) {
    const int64_t nseg = sizes[i] >= int64_t(kHeaderSize) ? int64_t(ceil_div(uint64_t(sizes[i]), kCrcSegment)) : 0;
    seg_starts[i + 1] = seg_starts[i] + nseg;
    meta[2 * i] = offsets[i];
    meta[2 * i + 1] = sizes[i];
  }
  plan.nseg = seg_starts[plan.n];
  plan.starts = staging.add(seg_starts);
  plan.meta = staging.add(meta);
  return plan;
}
// crc[i] for every chunk of at least a header (0 for the others).
inline void run_crcs(const CrcPlan& plan, const Staging& staging, const at::Tensor& payload, uint32_t* crc) {
  const at::Device device = payload.device();
  const int64_t n = plan.n;
  at::Tensor tables_t = crc_tables(device);
  at::Tensor regs = unset_u32(plan.nseg, device);
  const int64_t* starts = staging.at<int64_t>(plan.starts);
  const int64_t* m = staging.at<int64_t>(plan.meta);
  const uint32_t* tables = ptr<uint32_t>(tables_t);
  const uint8_t* data = ptr<uint8_t>(payload);
  uint32_t* reg = ptr<uint32_t>(regs);
  for_each_serial("crc: segment registers", plan.nseg, DLAC_LAMBDA(int64_t t) {
    const int64_t i = find_segment(starts, n, t);
    const uint64_t size = uint64_t(m[2 * i + 1]), s = uint64_t(t - starts[i]);
    const uint64_t first = size - (ceil_div(size, kCrcSegment) - 1) * kCrcSegment;
    const uint64_t begin = s == 0 ? 0 : first + (s - 1) * kCrcSegment;
    const uint64_t end = s == 0 ? first : begin + kCrcSegment;
    reg[t] = crc_register(s == 0 ? 0xFFFFFFFFu : 0u, data + m[2 * i], begin, end, tables);
  });
  for_each_serial("crc: join segments", n, DLAC_LAMBDA(int64_t i) {
    if (starts[i + 1] == starts[i]) {
      crc[i] = 0u;
      return;
    }
    uint32_t r = reg[starts[i]];
    for (int64_t t = starts[i] + 1; t < starts[i + 1]; ++t) r = crc_shift(tables, r) ^ reg[t];
    crc[i] = ~r;
  });
}

}  // inline namespace DLAC_GRID_BUILD
}  // namespace grid
}  // namespace dlac
