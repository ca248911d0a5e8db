// The device pipeline's launch scaffolding (see dlac_grid.h for the pipeline): kernels written once as lambdas over
// work items, launched on the current CUDA stream or, compiled for the host, run as loops in an order the tests
// choose; per-chunk tiles, block passes with a shared scratch, warp passes, and the atomics work items meet through.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "dlac_codec.h"
#include "dlac_ops.h"

#if defined(__CUDACC__)
#include <ATen/record_function.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include "dlac_str.h"
#define DLAC_LAMBDA [=] __host__ __device__
#if defined(__has_include)
#if __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define DLAC_NVTX 1
#endif
#endif
#else
#define DLAC_LAMBDA [=]
#endif

#if defined(__CUDACC__)
#define DLAC_GRID_BUILD cuda
#else
#define DLAC_GRID_BUILD host
#endif

namespace dlac {
namespace grid {
// The CUDA library and the host emulation give these functions different bodies under the same names: an inline
// namespace per build keeps their symbols apart, should both libraries ever be loaded into one namespace.
inline namespace DLAC_GRID_BUILD {

// ------------------------------------------------------------------------------------------------------------
// Kernel names and device faults
// ------------------------------------------------------------------------------------------------------------

// Every launch names its kernel ("encode: range and finiteness"). A fault inside a kernel (an illegal address, say)
// is reported by CUDA at the next synchronization, not at its launch, so the names of the kernels launched since the
// last read-back are kept (across calls), and the ops add them to a device error (reporting_faults, dlac_grid.h): the
// error stays the CUDA error it is (torch.AcceleratorError in Python, never a corrupted-payload ValueError) and says
// which kernels may have caused it. DLAC_CUDA_SYNC_KERNELS=1 synchronizes after every launch, so that the error
// names the very kernel (slow: for debugging). Per host thread, as a call runs on one.
inline std::vector<const char*>& kernels_in_flight() {
  thread_local std::vector<const char*> names;
  return names;
}
inline std::string kernel_names() {
  std::string out;
  for (const char* name : kernels_in_flight()) out += (out.empty() ? "'" : ", '") + std::string(name) + "'";
  return out.empty() ? "(none)" : out;
}
// A device error that is CUDA's (a fault, a failed launch), as opposed to the ops' own checks.
inline bool is_device_error(const c10::Error& e) {
#if defined(__CUDACC__)
  return dynamic_cast<const c10::AcceleratorError*>(&e) != nullptr || cudaPeekAtLastError() != cudaSuccess;
#else
  return dynamic_cast<const c10::AcceleratorError*>(&e) != nullptr;
#endif
}

#if defined(__CUDACC__)
inline bool sync_each_kernel() {
  static const bool on = [] {
    const char* v = std::getenv("DLAC_CUDA_SYNC_KERNELS");
    return v != nullptr && *v != 0 && std::strcmp(v, "0") != 0;
  }();
  return on;
}
[[noreturn]] inline void throw_cuda_error(cudaError_t err, const std::string& what) {
  throw c10::AcceleratorError({__func__, __FILE__, uint32_t(__LINE__)}, int32_t(err),
                              ::dlac::str("CUDA error: ", cudaGetErrorString(err), " (", int(err), ") ", what));
}
// After a launch: a launch error names its kernel; with DLAC_CUDA_SYNC_KERNELS=1 a fault inside it does too.
inline void launched(const char* name) {
  kernels_in_flight().push_back(name);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw_cuda_error(err, ::dlac::str("on launching the DLAC kernel '", name, "'"));
  if (sync_each_kernel()) {
    err = cudaStreamSynchronize(c10::cuda::getCurrentCUDAStream());
    if (err != cudaSuccess)
      throw_cuda_error(err, ::dlac::str("in the DLAC kernel '", name, "' (DLAC_CUDA_SYNC_KERNELS=1 synchronized "
                                     "after it)"));
  }
}
inline void raise_emulated_fault() {}
// Every launch named for profilers, host side only (no kernel changes): a torch.profiler user scope (its kernel is
// attributed to the name, see benchmarks/cuda_profile.py) and an NVTX range (Nsight Compute names the kernel after it
// with --nvtx --print-nvtx-rename kernel: benchmarks/cuda_profile.sh). Both cost a flag check when no profiler listens.
class KernelScope {
 public:
  explicit KernelScope(const char* name) : rf_(at::RecordScope::USER_SCOPE) {
    if (rf_.isActive()) rf_.before(name, c10::ArrayRef<const c10::IValue>{});
#if DLAC_NVTX
    nvtxRangePushA(name);
#endif
  }
  ~KernelScope() {
#if DLAC_NVTX
    nvtxRangePop();
#endif
  }
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;

 private:
  at::RecordFunction rf_;
};
#else
// The emulation can pretend that a kernel faulted, to test how faults are reported: DLAC_EMULATE_FAULT names the
// kernel, and the next read-back raises the error a CUDA fault would (as CUDA reports it: at the synchronization).
inline const char*& emulated_fault() {
  thread_local const char* kernel = nullptr;
  return kernel;
}
inline void launched(const char* name) {
  kernels_in_flight().push_back(name);
  const char* fault = std::getenv("DLAC_EMULATE_FAULT");
  if (fault != nullptr && std::strcmp(fault, name) == 0) emulated_fault() = name;
}
inline void raise_emulated_fault() {
  if (emulated_fault() == nullptr) return;
  emulated_fault() = nullptr;
  throw c10::AcceleratorError({__func__, __FILE__, uint32_t(__LINE__)}, 700,
                              "CUDA error: an illegal memory access was encountered (emulated by DLAC_EMULATE_FAULT)");
}
#endif

// ------------------------------------------------------------------------------------------------------------
// Launching and atomics
// ------------------------------------------------------------------------------------------------------------

#if defined(__CUDACC__)
template <class F>
__global__ void for_each_kernel(int64_t n, F f) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) f(i);
}

// f(i) for every i in [0, n), in parallel on the current stream: the kernel `name`.
template <class F>
void for_each(const char* name, int64_t n, F f) {
  if (n <= 0) return;
  const KernelScope scope(name);
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 65535 * 8);
  for_each_kernel<<<unsigned(blocks), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(n, f);
  launched(name);
}

// Threads per block of for_each_serial for n items: few enough that the blocks spread over every SM (n / SMs,
// rounded up, at most a warp), or DLAC_CUDA_SERIAL_THREADS (1 to 1024) where set: 256 is for_each's geometry, to
// compare the two on a GPU (read at every launch, so one process can time both: benchmarks/cuda_profile.py).
inline int serial_block_threads(int64_t n) {
  const char* v = std::getenv("DLAC_CUDA_SERIAL_THREADS");
  const int forced = v != nullptr ? std::atoi(v) : 0;
  if (forced >= 1 && forced <= 1024) return forced;
  int device = 0, count = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    (void)cudaGetLastError();  // no answer is no error of this launch: a warp a block, as on a large GPU
    count = 0;
  }
  const int64_t sms = std::max<int64_t>(count, 1);
  return int(std::min<int64_t>(32, std::max<int64_t>(1, (n + sms - 1) / sms)));
}
// f(i) for every i in [0, n) as for_each, for work items that are each a long serial loop (a Huffman block of 4096
// symbols, a table of 4096 entries, a CRC segment of 4096 bytes) and few (hundreds to thousands): with for_each's
// 256 threads a block, 2000 items would fill 8 blocks, so 8 of an H200's 132 SMs would run them, 8 warps each, every
// lane walking its own stream (a load touches up to 32 lines), while the others idle. Here the blocks are at most a
// warp, one or a few per SM: each item's loop runs at its latency instead of waiting for a crowded SM.
template <class F>
void for_each_serial(const char* name, int64_t n, F f) {
  if (n <= 0) return;
  const KernelScope scope(name);
  const int threads = serial_block_threads(n);
  const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 65535 * 8);
  for_each_kernel<<<unsigned(blocks), threads, 0, c10::cuda::getCurrentCUDAStream()>>>(n, f);
  launched(name);
}
#else
// f(i) for every i in [0, n), one after another (the emulation). In index order, unless DLAC_EMULATE_ORDER is
// "reverse" or "shuffle" (a permutation seeded by DLAC_EMULATE_SEED): the tests run the pipeline in other orders to
// show that no result depends on the order in which work items run, which is what makes the GPU's answer the same.
template <class F>
void run_items(int64_t n, F f) {
  const char* order = std::getenv("DLAC_EMULATE_ORDER");
  if (order == nullptr || *order == 0 || std::strcmp(order, "forward") == 0) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
  std::vector<int64_t> items(size_t(std::max<int64_t>(n, 0)));
  std::iota(items.begin(), items.end(), int64_t(0));
  if (std::strcmp(order, "reverse") == 0) {
    std::reverse(items.begin(), items.end());
  } else {
    TORCH_CHECK(std::strcmp(order, "shuffle") == 0,
                ::dlac::str("DLAC_EMULATE_ORDER must be forward, reverse or shuffle, got ", order));
    const char* seed = std::getenv("DLAC_EMULATE_SEED");
    std::mt19937_64 rng(seed != nullptr ? std::strtoull(seed, nullptr, 10) : 0);
    std::shuffle(items.begin(), items.end(), rng);
  }
  for (int64_t i : items) f(i);
}
// The kernel `name`: its work items, as above.
template <class F>
void for_each(const char* name, int64_t n, F f) {
  run_items(n, f);
  launched(name);
}
// for_each_serial differs from for_each only in its launch geometry on the device: the same items, here.
template <class F>
void for_each_serial(const char* name, int64_t n, F f) {
  for_each(name, n, f);
}
#endif

// f(i) for every i in [0, n), run by all 32 lanes of one warp together on the device (every lane gets the same i,
// so a branch on i is taken by the whole warp and the warp_* functions below may shuffle); once per i on the host.
#if defined(__CUDACC__)
template <class F>
__global__ void for_each_warp_kernel(int64_t n, F f) {
  const int64_t nwarps = (int64_t(gridDim.x) * blockDim.x) / 32;
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; i < n; i += nwarps) f(i);
}
template <class F>
void for_each_warp(const char* name, int64_t n, F f) {
  if (n <= 0) return;
  const KernelScope scope(name);
  constexpr int kThreads = 256, kWarps = kThreads / 32;
  const int64_t blocks = std::min<int64_t>((n + kWarps - 1) / kWarps, 65535 * 8);
  for_each_warp_kernel<<<unsigned(blocks), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(n, f);
  launched(name);
}
#else
template <class F>
void for_each_warp(const char* name, int64_t n, F f) {
  for_each(name, n, f);
}
#endif

// Per-chunk tiles: each chunk's elements cut into tiles of up to kTileElems consecutive elements; one thread block
// works on one tile, so every element knows its chunk without a search, and its row and column advance by additions
// (one division per thread and tile instead of a binary search over chunk starts and a division per element).
constexpr int64_t kTileElems = 8192;
constexpr int kTileThreads = 256;
struct Tile {
  uint32_t chunk, dim, first, count;  // elements [first, first + count) of chunk, which has dim columns
};
static_assert(kTileElems <= (int64_t(1) << 31) && sizeof(Tile) == 16, "tile fields are 32-bit");

// Tiles of chunks with rows[i] x dims[i] elements (none for an empty chunk).
inline std::vector<Tile> make_tiles(const std::vector<int64_t>& rows, const std::vector<int64_t>& dims) {
  std::vector<Tile> tiles;
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t n = rows[i] * dims[i];
    for (int64_t first = 0; first < n; first += kTileElems)
      tiles.push_back({uint32_t(i), uint32_t(dims[i]), uint32_t(first), uint32_t(std::min(kTileElems, n - first))});
  }
  return tiles;
}

// The elements of tile t that thread `lane` of `nthreads` handles: first + lane, then every nthreads-th, each as
// f(chunk, element l within the chunk, row r = l / dim, column j = l % dim). Shared by the kernel and the emulation,
// so the tests run this very stepping.
template <class F>
DLAC_HD inline void walk_tile(const Tile& t, uint32_t lane, uint32_t nthreads, const F& f) {
  const uint32_t end = t.first + t.count, d = t.dim;
  uint32_t l = t.first + lane;
  if (l >= end) return;
  uint32_t r = l / d, j = l - r * d;
  const uint32_t dr = nthreads / d, dj = nthreads - dr * d;
  for (; l < end; l += nthreads) {
    f(int64_t(t.chunk), int64_t(l), int64_t(r), int64_t(j));
    r += dr;
    j += dj;
    if (j >= d) {
      j -= d;
      ++r;
    }
  }
}

// Every tile's chunk may pass: the guard of passes that touch every chunk.
struct AllChunks {
  DLAC_HD bool operator()(int64_t) const { return true; }
};

#if defined(__CUDACC__)
template <class G, class F>
__global__ void __launch_bounds__(kTileThreads) tile_kernel(const Tile* tiles, G guard, F f) {
  const Tile t = tiles[blockIdx.x];
  if (!guard(int64_t(t.chunk))) return;  // the whole block leaves at once: chunks this pass has nothing to do in
  walk_tile(t, threadIdx.x, blockDim.x, f);
}

// f(chunk, l, r, j) for every element of every tile whose chunk passes guard(chunk) (tiles: device memory), one
// block per tile.
template <class G, class F>
void for_each_element_if(const char* name, const Tile* tiles, int64_t ntiles, G guard, F f) {
  if (ntiles <= 0) return;
  const KernelScope scope(name);
  TORCH_CHECK(ntiles < (int64_t(1) << 31), ::dlac::str("too many tiles for one launch: ", ntiles));
  tile_kernel<<<unsigned(ntiles), kTileThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(tiles, guard, f);
  launched(name);
}
#else
// The emulation: every (tile, thread) pair is a work item, in the order DLAC_EMULATE_ORDER asks for.
template <class G, class F>
void for_each_element_if(const char* name, const Tile* tiles, int64_t ntiles, G guard, F f) {
  for_each(name, ntiles * kTileThreads, [&](int64_t w) {
    const Tile& t = tiles[w / kTileThreads];
    if (guard(int64_t(t.chunk))) walk_tile(t, uint32_t(w % kTileThreads), uint32_t(kTileThreads), f);
  });
}
#endif
template <class F>
void for_each_element(const char* name, const Tile* tiles, int64_t ntiles, F f) {
  for_each_element_if(name, tiles, ntiles, AllChunks{}, f);
}

// Block passes: one block per tile whose chunk passes guard, with a scratch Scratch shared by the block (shared
// memory on the GPU), run as phases with a barrier between them: phase(tile, thread, nthreads, scratch) for every
// thread of the block, then the next phase. The emulation keeps one scratch per tile, filled with a poison pattern
// (shared memory starts undefined: a phase that reads a word no earlier phase wrote changes the bytes the tests
// compare), and runs each phase for every (tile, thread) work item in the order DLAC_EMULATE_ORDER asks for before
// the next phase starts, as if every block reached each barrier together.
#if defined(__CUDACC__)
template <class Scratch, class G, class... P>
__global__ void __launch_bounds__(kTileThreads) block_kernel(const Tile* tiles, G guard, P... phases) {
  __shared__ Scratch scratch;
  const Tile t = tiles[blockIdx.x];
  if (!guard(int64_t(t.chunk))) return;  // the whole block leaves before its first barrier
  ((phases(t, threadIdx.x, blockDim.x, scratch), __syncthreads()), ...);
}
template <class Scratch, class G, class... P>
void for_each_tile_block_if(const char* name, const Tile* tiles, int64_t ntiles, G guard, P... phases) {
  static_assert(sizeof(Scratch) <= 48 * 1024, "static shared memory is limited to 48 KB a block");
  if (ntiles <= 0) return;
  const KernelScope scope(name);
  TORCH_CHECK(ntiles < (int64_t(1) << 31), ::dlac::str("too many tiles for one launch: ", ntiles));
  block_kernel<Scratch><<<unsigned(ntiles), kTileThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(tiles, guard,
                                                                                                   phases...);
  launched(name);
}
#else
template <class Scratch, class G, class... P>
void for_each_tile_block_if(const char* name, const Tile* tiles, int64_t ntiles, G guard, P... phases) {
  if (ntiles <= 0) return;
  std::vector<char> runs(size_t(ntiles), 0);  // the guard, once per block as the kernel reads it
  run_items(ntiles, [&](int64_t b) { runs[size_t(b)] = guard(int64_t(tiles[b].chunk)) ? 1 : 0; });
  std::vector<Scratch> scratch(static_cast<size_t>(ntiles));
  std::memset(static_cast<void*>(scratch.data()), 0xA5, scratch.size() * sizeof(Scratch));
  auto run = [&](const auto& phase) {
    run_items(ntiles * kTileThreads, [&](int64_t w) {
      const int64_t b = w / kTileThreads;
      if (runs[size_t(b)]) phase(tiles[b], uint32_t(w % kTileThreads), uint32_t(kTileThreads), scratch[size_t(b)]);
    });
  };
  (run(phases), ...);
  launched(name);
}
#endif

// On the device (sm_80+), the lanes of a warp that target the same word first combine their values and one of them
// does the atomic: neighbouring codes share payload words, and every element of a chunk updates the same minimum.
// (__activemask() lanes all reach the __match_any_sync that follows: there is no branch between them.)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// Combines v over the lanes whose p is the same word with reduce; true on the one lane that should do the atomic.
template <class Reduce>
__device__ inline bool warp_combine(const uint32_t* p, uint32_t& v, Reduce reduce) {
  const unsigned peers = __match_any_sync(__activemask(), reinterpret_cast<unsigned long long>(p));
  v = reduce(peers, v);
  return int(threadIdx.x & 31) == __ffs(peers) - 1;
}
#define DLAC_WARP_COMBINE 1
#endif

DLAC_HD inline void atomic_or(uint32_t* p, uint32_t v) {
#if defined(__CUDA_ARCH__)
#if DLAC_WARP_COMBINE
  if (!warp_combine(p, v, [](unsigned peers, uint32_t x) { return __reduce_or_sync(peers, x); })) return;
#endif
  atomicOr(reinterpret_cast<unsigned int*>(p), v);
#else
  *p |= v;
#endif
}
// Minimum / maximum, combined within the warp as above. The word is read before the atomic so that the common case
// (no change) costs none: safe because every target only ever moves one way (a stale read can only cost an extra
// atomic, never skip a needed one).
DLAC_HD inline void atomic_min(uint32_t* p, uint32_t v) {
#if defined(__CUDA_ARCH__)
#if DLAC_WARP_COMBINE
  if (!warp_combine(p, v, [](unsigned peers, uint32_t x) { return __reduce_min_sync(peers, x); })) return;
#endif
  if (v < *reinterpret_cast<volatile uint32_t*>(p)) atomicMin(reinterpret_cast<unsigned int*>(p), v);
#else
  if (v < *p) *p = v;
#endif
}
DLAC_HD inline void atomic_max(uint32_t* p, uint32_t v) {
#if defined(__CUDA_ARCH__)
#if DLAC_WARP_COMBINE
  if (!warp_combine(p, v, [](unsigned peers, uint32_t x) { return __reduce_max_sync(peers, x); })) return;
#endif
  if (v > *reinterpret_cast<volatile uint32_t*>(p)) atomicMax(reinterpret_cast<unsigned int*>(p), v);
#else
  if (v > *p) *p = v;
#endif
}
DLAC_HD inline uint32_t atomic_cas(uint32_t* p, uint32_t expected, uint32_t v) {
#if defined(__CUDA_ARCH__)
  return atomicCAS(reinterpret_cast<unsigned int*>(p), expected, v);
#else
  uint32_t old = *p;
  if (old == expected) *p = v;
  return old;
#endif
}
// Histogram increment; lanes of a warp that hit the same bin add once (codes cluster, so bins are contended).
DLAC_HD inline void hist_add(uint32_t* p) {
#if defined(__CUDA_ARCH__)
  const unsigned mask = __activemask();
  const unsigned peers = __match_any_sync(mask, reinterpret_cast<unsigned long long>(p));
  if (int(threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(reinterpret_cast<unsigned int*>(p), __popc(peers));
#else
  *p += 1;
#endif
}

DLAC_HD inline void atomic_add(uint32_t* p, uint32_t v) {
#if defined(__CUDA_ARCH__)
  atomicAdd(reinterpret_cast<unsigned int*>(p), v);
#else
  *p += v;
#endif
}
// Weighted histogram increment; lanes of a warp that hit the same bin add their weights once.
DLAC_HD inline void hist_add_weighted(uint32_t* p, uint32_t w) {
#if defined(__CUDA_ARCH__)
#if DLAC_WARP_COMBINE
  if (!warp_combine(p, w, [](unsigned peers, uint32_t x) { return __reduce_add_sync(peers, x); })) return;
#endif
  atomicAdd(reinterpret_cast<unsigned int*>(p), w);
#else
  *p += w;
#endif
}

// The segment holding item e: the last i in [0, nseg) with starts[i] <= e (empty segments are skipped over).
DLAC_HD inline int64_t find_segment(const int64_t* starts, int64_t nseg, int64_t e) {
  int64_t lo = 0, hi = nseg;
  while (hi - lo > 1) {
    int64_t mid = (lo + hi) >> 1;
    if (starts[mid] <= e) lo = mid;
    else hi = mid;
  }
  return lo;
}

}  // inline namespace DLAC_GRID_BUILD
}  // namespace grid
}  // namespace dlac
