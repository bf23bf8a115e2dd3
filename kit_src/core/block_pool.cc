#include "kit_src/core/block_pool.h"

#include <sys/mman.h>

namespace sok {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kHugePage = size_t{2} << 20;

void* MapBlock(size_t bytes) {
  void* block = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (block == MAP_FAILED) return nullptr;
  if (bytes >= kHugePage) madvise(block, bytes, MADV_HUGEPAGE);  // advisory
  return block;
}

}  // namespace

BlockPool::BlockPool(const BlockPoolOptions& options) : options_(options) {}

BlockPool::~BlockPool() {
  for (const auto& [block, bytes] : size_of_) munmap(block, bytes);
}

size_t BlockPool::SizeClass(size_t bytes) {
  if (bytes <= 8 * kPage) return (bytes + kPage - 1) / kPage * kPage;
  size_t power = 8 * kPage;
  while (power * 2 < bytes) power *= 2;
  const size_t step = power / 8;  // classes power + step, power + 2 step, ..., 2 power
  return (bytes + step - 1) / step * step;
}

void* BlockPool::Take(size_t bytes) {
  const size_t size = SizeClass(bytes);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = free_.find(size);
    if (found != free_.end() && !found->second.empty()) {
      void* block = found->second.back();
      found->second.pop_back();
      cached_bytes_ -= size;
      return block;
    }
  }
  void* block = MapBlock(size);
  if (block == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  size_of_[block] = size;
  return block;
}

void BlockPool::Give(void* block) {
  if (block == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = size_of_.find(block);
  if (found == size_of_.end()) return;  // not ours: nothing to do
  const size_t size = found->second;
  if (cached_bytes_ + size > options_.max_cached_bytes) {
    size_of_.erase(found);
    munmap(block, size);
    return;
  }
  free_[size].push_back(block);
  cached_bytes_ += size;
}

BlockPool& SharedBlockPool() {
  static BlockPool* pool = new BlockPool();  // never destroyed: tensors may outlive statics
  return *pool;
}

}  // namespace sok
