// A fixed-size, zero-initialised array backed by transparent huge pages where the kernel
// offers them (THP in "madvise" mode, the common default). Hash tables and their rows are
// probed at random over hundreds of MB: with 4 KiB pages nearly every probe also misses the
// TLB, with 2 MiB pages almost none does.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>

namespace sok {

template <typename T>
class HugePageArray {
 public:
  HugePageArray() = default;
  explicit HugePageArray(int64_t count) : count_(count) {
    if (count == 0) return;
    bytes_ = RoundUp(static_cast<size_t>(count) * sizeof(T));
    void* memory = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                        -1, 0);
    if (memory == MAP_FAILED) throw std::bad_alloc();
    madvise(memory, bytes_, MADV_HUGEPAGE);  // advisory: fine where THP is off
    data_ = static_cast<T*>(memory);         // anonymous pages read as zeros
  }
  HugePageArray(HugePageArray&& other) noexcept { Swap(other); }
  HugePageArray& operator=(HugePageArray&& other) noexcept {
    HugePageArray(std::move(other)).Swap(*this);
    return *this;
  }
  HugePageArray(const HugePageArray&) = delete;
  HugePageArray& operator=(const HugePageArray&) = delete;
  ~HugePageArray() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  int64_t size() const { return count_; }
  T& operator[](int64_t i) { return data_[i]; }
  const T& operator[](int64_t i) const { return data_[i]; }

 private:
  static constexpr size_t kHugePage = size_t{2} << 20;
  // Small arrays stay on normal pages; large ones fill whole huge pages.
  static size_t RoundUp(size_t bytes) {
    const size_t unit = bytes >= kHugePage ? kHugePage : 4096;
    return (bytes + unit - 1) / unit * unit;
  }
  void Swap(HugePageArray& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(count_, other.count_);
    std::swap(bytes_, other.bytes_);
  }

  T* data_ = nullptr;
  int64_t count_ = 0;
  size_t bytes_ = 0;
};

}  // namespace sok
