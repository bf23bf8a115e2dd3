// The rows of a host hash table, numbered and stored in chunks that never move.
//
// Pooled, a slot names its row by number, so rows take memory for the keys held rather than
// for every slot of the probe array (which is kept at most 70% full and doubles as it grows:
// a row per slot holds between 1.4x and 2.9x the rows needed). Growth adds chunks and copies
// nothing; a rehash moves slot entries only. Erased rows go to a free list and are reused.
// A table that keeps a row per slot uses the pool with row number = slot number.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "kit_src/core/huge_page_array.h"

namespace sok {

class RowPool {
 public:
  // Rows of `width` floats; a chunk holds about kChunkBytes of rows (all of them when not
  // `chunked`), and no more than `max_chunk_rows` (a power of two of them, so finding a row
  // is a shift and a mask). Drops every row.
  void Reset(int64_t width, int64_t max_chunk_rows = int64_t{1} << 62, bool chunked = true) {
    width_ = width;
    chunk_shift_ = 0;
    while ((int64_t{2} << chunk_shift_) <= max_chunk_rows &&
           ((int64_t{2} << chunk_shift_) * width * 4 <= kChunkBytes || !chunked)) {
      ++chunk_shift_;
    }
    chunks_.clear();
    chunk_data_.clear();
    free_rows_.clear();
    free_count_.store(0, std::memory_order_relaxed);
    used_.store(0, std::memory_order_relaxed);
  }

  int64_t width() const { return width_; }
  int64_t used() const { return used_.load(std::memory_order_relaxed); }
  float* Row(int64_t row) {
    return chunk_data_[row >> chunk_shift_] + (row & ChunkMask()) * width_;
  }
  const float* Row(int64_t row) const {
    return chunk_data_[row >> chunk_shift_] + (row & ChunkMask()) * width_;
  }

  // Bytes of the chunks that `takes` more Take calls would add (0 when there is room).
  int64_t GrowthBytes(int64_t takes) const {
    return (ChunksFor(RowsAfter(takes)) - static_cast<int64_t>(chunks_.size())) * ChunkRows() *
           width_ * 4;
  }
  // Adds the chunks that `takes` more Take calls need. Throws std::bad_alloc when host
  // memory runs out, with no row lost (chunks already added stay, empty).
  void Reserve(int64_t takes) { ReserveCapacity(RowsAfter(takes)); }
  // Room for `rows` rows numbered from 0 (as after Clear); throws as Reserve.
  void ReserveCapacity(int64_t rows) {
    const int64_t chunks = ChunksFor(rows);
    while (static_cast<int64_t>(chunks_.size()) < chunks) {
      chunks_.emplace_back(ChunkRows() * width_);
      chunk_data_.push_back(chunks_.back().data());
    }
  }
  // Every row free again, numbered from 0; the chunks stay.
  void Clear() {
    free_count_.store(0, std::memory_order_relaxed);
    used_.store(0, std::memory_order_relaxed);
  }

  // A free row number; thread-safe among Take calls, within what Reserve made room for.
  int64_t Take() {
    int64_t free = free_count_.load(std::memory_order_relaxed);
    while (free > 0 && !free_count_.compare_exchange_weak(free, free - 1,
                                                          std::memory_order_relaxed)) {
    }
    if (free > 0) return free_rows_[free - 1];
    return used_.fetch_add(1, std::memory_order_relaxed);
  }
  // `count` free row numbers into `out` (the free list's first); thread-safe as Take.
  void TakeMany(int64_t count, int64_t* out) {
    int64_t free = free_count_.load(std::memory_order_relaxed), from_free = 0;
    do {
      from_free = std::min(free, count);
    } while (from_free > 0 && !free_count_.compare_exchange_weak(free, free - from_free,
                                                                  std::memory_order_relaxed));
    for (int64_t k = 0; k < from_free; ++k) out[k] = free_rows_[free - 1 - k];
    const int64_t first = used_.fetch_add(count - from_free, std::memory_order_relaxed);
    for (int64_t k = from_free; k < count; ++k) out[k] = first + (k - from_free);
  }
  // Room for `gives` more Give calls made in parallel (Give alone grows the list).
  void ReserveGives(int64_t gives) {
    const int64_t needed = free_count_.load(std::memory_order_relaxed) + gives;
    if (static_cast<int64_t>(free_rows_.size()) < needed) free_rows_.resize(needed);
  }
  // Returns a row for reuse; thread-safe among Give calls after ReserveGives (never at the
  // same time as Take).
  void Give(int64_t row) { free_rows_[free_count_.fetch_add(1, std::memory_order_relaxed)] = row; }
  // Give of `count` rows with one atomic add: threads that free many rows gather them first,
  // as one shared counter bumped row by row stalls every thread on its cache line.
  void GiveMany(const int64_t* rows, int64_t count) {
    const int64_t at = free_count_.fetch_add(count, std::memory_order_relaxed);
    std::copy(rows, rows + count, free_rows_.begin() + at);
  }

  void Swap(RowPool& other) {
    std::swap(width_, other.width_);
    std::swap(chunk_shift_, other.chunk_shift_);
    chunks_.swap(other.chunks_);
    chunk_data_.swap(other.chunk_data_);
    free_rows_.swap(other.free_rows_);
    free_count_.store(other.free_count_.exchange(free_count_.load()));
    used_.store(other.used_.exchange(used_.load()));
  }

  // Copies rows [0, rows) into chunks of `width` floats each, keeping a row's number: the
  // first min(old, new width) floats of each row are kept, the rest unspecified. Throws
  // std::bad_alloc with the pool unchanged.
  void Widen(int64_t width, int64_t rows) {
    RowPool wide;
    wide.width_ = width;
    wide.chunk_shift_ = chunk_shift_;
    for (size_t c = 0; c < chunks_.size(); ++c) {
      wide.chunks_.emplace_back(ChunkRows() * width);
      wide.chunk_data_.push_back(wide.chunks_.back().data());
    }
    const int64_t kept = std::min(width, width_);
    for (int64_t row = 0; row < rows; ++row) {
      std::copy(Row(row), Row(row) + kept, wide.Row(row));
    }
    width_ = width;
    chunks_ = std::move(wide.chunks_);
    chunk_data_ = std::move(wide.chunk_data_);
  }

 private:
  static constexpr int64_t kChunkBytes = int64_t{16} << 20;
  int64_t ChunkRows() const { return int64_t{1} << chunk_shift_; }
  int64_t ChunkMask() const { return ChunkRows() - 1; }
  // Rows numbered from 0 that `takes` more Take calls reach.
  int64_t RowsAfter(int64_t takes) const {
    const int64_t from_free = std::min(takes, free_count_.load(std::memory_order_relaxed));
    return used_.load(std::memory_order_relaxed) + takes - from_free;
  }
  int64_t ChunksFor(int64_t rows) const {
    return std::max<int64_t>(static_cast<int64_t>(chunks_.size()),
                             (rows + ChunkRows() - 1) >> chunk_shift_);
  }

  int64_t width_ = 0;
  int64_t chunk_shift_ = 0;
  std::vector<HugePageArray<float>> chunks_;
  std::vector<float*> chunk_data_;  // chunks_[c].data(), read by every row access
  std::vector<int64_t> free_rows_;  // [0, free_count_) are free
  std::atomic<int64_t> free_count_{0};
  std::atomic<int64_t> used_{0};    // rows ever handed out: [0, used_)
};

}  // namespace sok
