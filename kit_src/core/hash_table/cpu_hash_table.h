// A growable hash table from int64 keys to float rows, with each row's optimizer state
// stored right after it so one probe serves a lookup and an update.
//
// Open addressing with linear probing. A slot is 16 bytes, the key and a metadata word (an
// occupied bit and the eviction score) side by side, so a probe touches one cache line and
// every int64 value is a valid key. Lookups of present keys run in parallel under a shared lock;
// inserts, erases, assigns and updates take the lock exclusively. Beyond max_capacity keys the
// table evicts the lowest-scored keys (LRU: last step used; LFU: times used) or, with no
// eviction, fails with ResourceExhausted and changes nothing.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "kit_src/core/hash_table/row_initializer.h"
#include "kit_src/core/parallel.h"
#include "kit_src/core/status.h"

namespace sok {

enum class EvictStrategy { kNone, kLru, kLfu };

struct HashTableOptions {
  int64_t dim = 1;                        // floats in a row's value
  int64_t state_dim = 0;                  // floats of optimizer state stored after the value
  int64_t init_capacity = 1024;           // keys held before the first growth
  int64_t max_capacity = int64_t{1} << 40;  // most keys held; beyond it evict or fail
  EvictStrategy evict = EvictStrategy::kNone;
  float state_initial_value = 0.0f;       // the first `dim` floats of a new key's optimizer
                                          // state (Adagrad's and Ftrl's accumulators); the
                                          // rest start at zero
};

class CpuHashTable {
 public:
  CpuHashTable(const HashTableOptions& options, const RowInitializer& initializer);

  int64_t size() const;
  int64_t dim() const { return options_.dim; }
  int64_t state_dim() const { return options_.state_dim; }
  const HashTableOptions& options() const { return options_; }

  // values ([n, dim], host) receives the row of each key. A missing key is inserted with its
  // initial value and zero state when `insert`, else it reads as zeros and is not stored.
  // With admit_probability < 1 (the low-frequency filter) each missing key is admitted with
  // that probability, drawn per (key, call); one not admitted reads as zeros.
  // Every lookup counts as a use for eviction scores.
  Status Lookup(const int64_t* keys, int64_t n, bool insert, float* values,
                const ParallelFor& parallel_for, float admit_probability = 1.0f);

  // Inserts or overwrites the value ([n, dim]) and, when `state` ([n, state_dim]) is not null,
  // the optimizer state of each key.
  Status Assign(const int64_t* keys, int64_t n, const float* values, const float* state);

  // Widens every row to hold `state_dim` floats of optimizer state (kept if already wide
  // enough), the first dim of them set to `initial_value`, the rest to zero. Done once, when
  // an optimizer first applies.
  void EnsureState(int64_t state_dim, float initial_value);

  // Replaces the whole content with `keys` ([n]), `values` ([n, dim]) and `state`
  // ([n, state_dim], or null for initial state), widening the state first; all or nothing.
  Status Replace(const int64_t* keys, int64_t n, const float* values, const float* state,
                 int64_t state_dim);

  // Removes the keys that are present; returns how many were.
  int64_t Erase(const int64_t* keys, int64_t n);

  // Every key with its value and state, in slot order.
  void Export(std::vector<int64_t>* keys, std::vector<float>* values,
              std::vector<float>* state) const;

  // Calls update(i, row) for each present key i (row: dim value floats, then state), under
  // the exclusive lock. `keys` must be unique: rows are updated in parallel. Missing keys
  // (e.g. evicted since their lookup) are skipped.
  template <typename Update>
  void UpdateRows(const int64_t* keys, int64_t n, const Update& update,
                  const ParallelFor& parallel_for) {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    parallel_for(n, 4 * RowWidth() + 50, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t slot = FindSlot(keys[i]);
        if (slot >= 0) update(i, Row(slot));
      }
    });
  }

 private:
  int64_t RowWidth() const { return options_.dim + options_.state_dim; }
  float* Row(int64_t slot) { return values_.data() + slot * RowWidth(); }
  struct Slot {
    int64_t key;
    std::atomic<uint64_t> meta;  // kOccupied | score
  };
  static constexpr uint64_t kOccupied = uint64_t{1} << 63;
  bool Occupied(int64_t slot) const {
    return slots_[slot].meta.load(std::memory_order_relaxed) & kOccupied;
  }
  uint64_t Score(int64_t slot) const {
    return slots_[slot].meta.load(std::memory_order_relaxed) & ~kOccupied;
  }
  int64_t Home(int64_t key) const;
  void Prefetch(int64_t key) const;
  int64_t FindSlot(int64_t key) const;  // -1 when absent
  int64_t FindOrInsertSlot(int64_t key);  // exclusive lock; room already reserved
  void Touch(int64_t slot, uint64_t clock);
  // Distinct keys among keys[i] with missing[i] that are not in the table.
  int64_t CountNewKeys(const int64_t* keys, const std::vector<uint8_t>& missing) const;
  // Makes room for `incoming` new keys (an upper bound is fine unless it would overflow
  // max_capacity): evicts or fails; grows the slot array. Exclusive lock.
  Status Reserve(int64_t incoming);
  void Rehash(int64_t slots);
  void EraseSlot(int64_t slot);
  void FillInitialState(float* state) const;

  HashTableOptions options_;
  RowInitializer initializer_;
  mutable std::shared_mutex mutex_;
  std::atomic<uint64_t> clock_{0};
  int64_t size_ = 0;
  int64_t mask_ = 0;                      // slots - 1; slots is a power of two
  std::unique_ptr<Slot[]> slots_;
  std::vector<float> values_;
};

}  // namespace sok
