// A cache of large memory blocks that keeps freed blocks mapped for the next request of the
// same size class.
//
// A training step allocates the same large outputs (pooled vectors, gathered rows, their
// gradients) every step. Fresh allocations of that size come from mmap and every page is
// faulted in and zeroed by the kernel again on first write, which costs as much as the
// kernels' own work. Blocks handed back here stay mapped (on huge pages where THP allows), so
// a step reuses the pages the previous step already touched.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

namespace sok {

struct BlockPoolOptions {
  size_t max_cached_bytes = size_t{2} << 30;  // free blocks kept beyond this are unmapped
};

class BlockPool {
 public:
  explicit BlockPool(const BlockPoolOptions& options = BlockPoolOptions());
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // A block of at least `bytes` bytes, page aligned, contents unspecified; nullptr when the
  // system is out of memory.
  void* Take(size_t bytes);
  // Returns a block from Take.
  void Give(void* block);

  // The size Take maps for a request: 8 size classes per power of two (at most 12.5% waste).
  static size_t SizeClass(size_t bytes);

 private:
  BlockPoolOptions options_;
  mutable std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;  // size class -> free blocks
  std::unordered_map<void*, size_t> size_of_;            // every live or free block
  size_t cached_bytes_ = 0;
};

// The process-wide pool behind kernel outputs and ScratchVector.
BlockPool& SharedBlockPool();

// std::allocator for large temporaries: blocks of at least kMinPooledBytes come from
// SharedBlockPool, so a kernel's per-call scratch does not fault its pages in every call.
template <typename T>
struct ScratchAllocator {
  using value_type = T;
  static constexpr size_t kMinPooledBytes = size_t{128} << 10;
  ScratchAllocator() = default;
  template <typename U>
  ScratchAllocator(const ScratchAllocator<U>&) {}  // NOLINT: rebinding is implicit
  T* allocate(size_t n) {
    if (n * sizeof(T) < kMinPooledBytes) return std::allocator<T>().allocate(n);
    void* block = SharedBlockPool().Take(n * sizeof(T));
    if (block == nullptr) throw std::bad_alloc();
    return static_cast<T*>(block);
  }
  void deallocate(T* p, size_t n) {
    if (n * sizeof(T) < kMinPooledBytes) {
      std::allocator<T>().deallocate(p, n);
    } else {
      SharedBlockPool().Give(p);
    }
  }
  template <typename U>
  bool operator==(const ScratchAllocator<U>&) const { return true; }
  template <typename U>
  bool operator!=(const ScratchAllocator<U>&) const { return false; }
};

template <typename T>
using ScratchVector = std::vector<T, ScratchAllocator<T>>;

}  // namespace sok
