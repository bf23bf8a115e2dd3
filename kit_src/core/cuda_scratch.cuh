// What the CUDA kernels' host code shares: grid sizes for grid-stride loops, and per-call
// device scratch from the stream-ordered allocator, freed in stream order.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace sok {

// Blocks for a grid-stride loop over n items: enough to cover them, at most 65,536.
inline int GridBlocks(int64_t n, int threads) {
  return static_cast<int>(std::clamp<int64_t>((n + threads - 1) / threads, 1, 1 << 16));
}

// Lanes a row when groups of lanes share out rows: a power of two up to a warp (groups split a
// warp evenly), about one lane per element of the row's `width` (floats, or float4s).
inline int RowLanes(int64_t width) {
  int lanes = 1;
  while (lanes < 32 && lanes < width) lanes *= 2;
  return lanes;
}

// Scratch blocks for one call, returned to the pool when the call's work is done. The pool
// would hand freed memory back to the driver at every synchronisation (its default release
// threshold is 0); it keeps it for the next call instead.
class StreamScratch {
 public:
  explicit StreamScratch(cudaStream_t stream) : stream_(stream) { KeepPoolMemory(); }
  ~StreamScratch() {
    for (int i = 0; i < used_; ++i) cudaFreeAsync(blocks_[i], stream_);
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;

  template <typename T>
  cudaError_t Get(size_t count, T** out) {
    if (used_ == kMaxBlocks) return cudaErrorMemoryAllocation;
    void* p = nullptr;
    const cudaError_t status = cudaMallocAsync(&p, std::max<size_t>(count * sizeof(T), 1), stream_);
    if (status != cudaSuccess) return status;
    blocks_[used_++] = p;
    *out = static_cast<T*>(p);
    return cudaSuccess;
  }

 private:
  static void KeepPoolMemory() {
    static const bool done = [] {
      int device = 0;
      cudaMemPool_t pool;
      if (cudaGetDevice(&device) == cudaSuccess &&
          cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
        uint64_t keep = UINT64_MAX;
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
      }
      return true;
    }();
    (void)done;
  }

  static constexpr int kMaxBlocks = 16;
  cudaStream_t stream_;
  void* blocks_[kMaxBlocks] = {};
  int used_ = 0;
};

}  // namespace sok
