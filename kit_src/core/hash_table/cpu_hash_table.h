// A growable hash table from int64 keys to float rows, with each row's optimizer state
// stored right after it so one probe serves a lookup and an update.
//
// Open addressing with linear probing. A slot is 16 bytes, the key and a metadata word (an
// occupied bit and the eviction score) side by side, so a probe touches one cache line and
// every int64 value is a valid key. Rows live in a RowPool on huge pages: a row per slot, at
// the slot's number (a probe fetches slot and row at once), or, with `pooled_rows`, rows for
// the keys held, each slot naming its row in an array beside the slots (half the memory or
// less; a probe's row fetch waits for the slot: lookups of 64-byte rows take 1.45x as long,
// of 512-byte rows 1.23x, in benchmarks/diagnosis/host_tier_step.py). Lookups that do not
// insert run in parallel under a shared lock; find-or-insert takes the lock exclusively and
// still runs in parallel: threads claim empty slots with a compare-and-swap. Erases, assigns
// and updates take the lock exclusively. Beyond max_capacity keys the table evicts the
// lowest-scored keys (LRU: last step used; LFU: times used) or, with no eviction, fails with
// ResourceExhausted and changes nothing.
#pragma once

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "kit_src/core/hash_table/dynamic_table.h"
#include "kit_src/core/hash_table/row_initializer.h"
#include "kit_src/core/hash_table/row_pool.h"
#include "kit_src/core/huge_page_array.h"
#include "kit_src/core/parallel.h"
#include "kit_src/core/status.h"

namespace sok {

// Copies a row of `count` floats. Whole 8-float blocks go as AVX moves the compiler inlines:
// a call to memcpy for every key of a lookup cost about 10% of it at dim 16.
inline void CopyFloats(const float* from, int64_t count, float* to) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) std::memcpy(to + i, from + i, 8 * sizeof(float));
  for (; i < count; ++i) to[i] = from[i];
}

class CpuHashTable final : public DynamicTable {
 public:
  CpuHashTable(const HashTableOptions& options, const RowInitializer& initializer);

  int64_t size() const;
  // Grows the slots (and pooled rows) for `incoming` more keys now, so that inserting them
  // later needs no host memory (a failure is ResourceExhausted, the table unchanged).
  Status GrowFor(int64_t incoming);
  // Inserts keys the table does not hold (distinct), with their rows and state (initial
  // state where null), in one parallel pass: rows moving in from another tier. Where they
  // need growth or eviction first, as InsertOrAssign.
  Status InsertNew(const int64_t* keys, int64_t n, const float* values, const float* state,
                   const TableContext& context);
  // Take of a lookup's distinct missing keys, standing for the find-or-insert and take a
  // tiered table's host tier did: the keys held are taken (rows and state out, erased);
  // keys not held that the filter admits get the initial row and state an insert would have
  // given them, without entering the table; then the lowest-scored keys go (into `evicted`)
  // until the keys held, taken and admitted fit max_capacity. found[i]: held or admitted.
  // A full table without eviction fails with nothing changed.
  Status TakeOrAdmit(const int64_t* keys, int64_t n, float admit_probability, float* values,
                     float* state, uint8_t* found, EvictedRows* evicted,
                     const TableContext& context);
  // Moves the bound on the key count (a tiered table lends part of it to its other tier);
  // keys already beyond it stay until the next insert makes room.
  void SetMaxCapacity(int64_t max_capacity) {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    options_.max_capacity = max_capacity;
  }

  // DynamicTable, in host memory; every call returns when done. Write times are kept to the
  // millisecond: Export includes rows written in the threshold's millisecond, and 2^32 ms
  // (49.7 days) after the table's creation all writes look recent. ApplySparseUpdate sums
  // duplicate keys' gradients first, then updates the rows in parallel.
  bool in_device_memory() const override { return false; }
  SOK_DYNAMIC_TABLE_OPERATIONS;

 private:
  // Keys a find-or-insert evicted to make room, with their rows (float32, [count, dim]).
  struct EvictedBuffer {
    std::vector<int64_t> keys;
    std::vector<float> values;
  };
  // Lookup of keys ([n], stride 1) into values ([n, dim]); inserts missing keys when `insert`.
  Status LookupRows(const int64_t* keys, int64_t n, bool insert, float* values,
                    const ParallelFor& parallel_for, float admit_probability,
                    EvictedBuffer* evicted);
  // Take in one pass over distinct keys: each key held has its row and state read out
  // (found[i] 1) and is erased in the same visit; keys not held read as zeros (found[i] 0).
  // Exclusive lock.
  void TakeHeld(const int64_t* keys, int64_t n, float* values, float* state, uint8_t* found,
                const ParallelFor& parallel_for);
  // Take in two passes, where the erase must wait: the rows and state of the keys held read
  // out (found[i] 1, else 0 and zeros), then the keys with found[i] == 1 erased. Exclusive
  // lock.
  void ReadHeld(const int64_t* keys, int64_t n, float* values, float* state, uint8_t* found,
                const ParallelFor& parallel_for) const;
  void EraseTaken(const int64_t* keys, int64_t n, float* values, float* state, uint8_t* found,
                  const ParallelFor& parallel_for);
  void ZeroRow(int64_t i, float* values, float* state, int64_t state_dim) const;
  // Evicts the `count` lowest-scored keys, their rows into `evicted` when not null.
  void EvictLowestScored(int64_t count, EvictedBuffer* evicted);
  // Copies evicted keys and rows to the caller's output.
  static Status HandOut(const EvictedBuffer& buffer, EvictedRows* evicted);
  // A float32 value as the table's storage type would round it (16-bit values).
  void RoundToStorage(float* value) const;
  // LookupRows of a call's keys in either stride.
  Status LookupKeys(const TableKeys& keys, bool insert, float* values, float admit_probability,
                    EvictedRows* evicted, const ParallelFor& parallel_for);

  // Widens every row to hold `state_dim` floats of optimizer state (kept if already wide
  // enough), the first dim of them set to `initial_value`, the rest to zero. Done once, when
  // an optimizer first applies.
  Status EnsureState(int64_t state_dim, float initial_value);
  // Runs `allocate` (new arrays of `bytes`, made before anything changes): a failed
  // allocation is ResourceExhausted naming the host memory, the table unchanged.
  Status HostAllocation(const std::function<void()>& allocate, int64_t bytes);

  // Calls update(i, value, state) for each present key i (value: dim floats, state:
  // state_dim floats, both updated in place), under the exclusive lock. `keys` must be
  // unique: rows are updated in parallel. Missing keys (e.g. evicted since their lookup) are
  // skipped. A 16-bit value is widened before and rounded after the update.
  template <typename Update>
  void UpdateRows(const int64_t* keys, int64_t n, const Update& update,
                  const ParallelFor& parallel_for) {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    const uint32_t now = StampNow();
    const bool widen = options_.value_type != ValueType::kFloat32;
    parallel_for(n, 4 * RowWidth() + 50, [&](int64_t begin, int64_t end) {
      std::vector<float> wide(widen ? options_.dim : 0);
      ProbeAhead<true>(keys, nullptr, begin, end, [&](int64_t i, int64_t home) {
        const int64_t slot = FindSlot(keys[i], home);
        if (slot < 0) return;
        if (widen) {
          ReadValue(slot, wide.data());
          update(i, wide.data(), State(slot));
          WriteValue(wide.data(), slot);
        } else {
          update(i, Row(slot), State(slot));
        }
        Stamp(slot, now);
      });
    });
  }

  // Floats a stored value occupies: dim, or dim / 2 rounded up for 16-bit values. Kept in
  // members (set by SetLayout) because every probe computes row addresses.
  int64_t ValueWords() const { return value_words_; }
  int64_t RowWidth() const { return row_width_; }
  void SetLayout() {
    value_words_ =
        options_.value_type == ValueType::kFloat32 ? options_.dim : (options_.dim + 1) / 2;
    row_width_ = value_words_ + options_.state_dim;
  }
  float* Row(int64_t slot) {
    return pooled() ? rows_.Row(slot_rows_[slot]) : flat_rows_ + slot * RowWidth();
  }
  const float* Row(int64_t slot) const {
    return pooled() ? rows_.Row(slot_rows_[slot]) : flat_rows_ + slot * RowWidth();
  }
  bool pooled() const { return pooled_; }
  // A pooled row for a slot just claimed (its own row otherwise).
  void GiveRow(int64_t slot) {
    if (pooled()) slot_rows_[slot] = rows_.Take();
  }
  float* State(int64_t slot) { return Row(slot) + ValueWords(); }
  const float* State(int64_t slot) const { return Row(slot) + ValueWords(); }
  // out: [dim], widened. Inline for float32 rows: it runs once per key of every lookup.
  void ReadValue(int64_t slot, float* out) const {
    if (options_.value_type == ValueType::kFloat32) {
      CopyFloats(Row(slot), options_.dim, out);
    } else {
      WidenValue(slot, out);
    }
  }
  void WidenValue(int64_t slot, float* out) const;      // 16-bit rows only
  void WriteValue(const float* value, int64_t slot);     // value: [dim], rounded
  // Writes the key's initial value to `out` ([dim] floats, as a lookup reads it back) and to
  // the slot's row. Made in `out` and copied: reading the new row back waited for its line.
  void InitializeValue(int64_t key, int64_t slot, float* out) {
    initializer_.Fill(key, out, options_.dim);
    WriteValue(out, slot);
    if (options_.value_type != ValueType::kFloat32) ReadValue(slot, out);  // as rounded
  }
  struct Slot {
    int64_t key;
    std::atomic<uint64_t> meta;  // kOccupied | score << 32 | write stamp
  };
  // The slot's metadata word (table_math.h's row metadata layout), so that one line holds
  // all a probe or a write touches; bit 62 marks a slot being claimed.
  static constexpr uint64_t kOccupied = kRowLive;
  // An inserting thread owns the slot; the key and row are being written. Only seen inside
  // the exclusive lock's parallel insert pass.
  static constexpr uint64_t kClaimed = uint64_t{1} << 62;
  bool Occupied(int64_t slot) const {
    return slots_[slot].meta.load(std::memory_order_relaxed) & kOccupied;
  }
  uint64_t Score(int64_t slot) const {
    return (slots_[slot].meta.load(std::memory_order_relaxed) & kScoreBits) >> kScoreShift;
  }
  uint32_t WriteStamp(int64_t slot) const {
    return static_cast<uint32_t>(slots_[slot].meta.load(std::memory_order_relaxed) & kStampBits);
  }
  void Stamp(int64_t slot, uint32_t stamp) {  // a write; one writer per slot at a time
    std::atomic<uint64_t>& meta = slots_[slot].meta;
    meta.store((meta.load(std::memory_order_relaxed) & ~kStampBits) | stamp,
               std::memory_order_relaxed);
  }
  uint32_t StampAt(int64_t time_us) const;  // saturating ms since creation
  uint32_t StampNow() const { return StampAt(NowMicros()); }
  // Inline: every probe of every lookup starts here.
  int64_t Home(int64_t key) const {
    return static_cast<int64_t>(HashKey(key) & static_cast<uint64_t>(mask_));
  }
  int64_t FindSlot(int64_t key, int64_t home) const {  // -1 when absent
    for (int64_t slot = home;; slot = (slot + 1) & mask_) {
      if (!Occupied(slot)) return -1;
      if (slots_[slot].key == key) return slot;
    }
  }
  // Linear probing finds most keys in their home slot, so its row is worth fetching too:
  // with the slot where the slot's number is its row's, once the slot has arrived and names
  // it where rows are pooled.
  template <bool kForWrite, bool kPooled>
  void PrefetchHomeRow(int64_t home) const {
    if (kPooled && !Occupied(home)) return;
    const char* row = reinterpret_cast<const char*>(
        kPooled ? rows_.Row(slot_rows_[home]) : flat_rows_ + home * RowWidth());
    for (int64_t offset = 0; offset < ValueWords() * 4; offset += 64) {
      __builtin_prefetch(row + offset, kForWrite);
    }
  }
  // Calls probe(i, Home(keys[i])) for i = index[j] (or j when index is null), j in
  // [begin, end). The home slot of the key kAhead positions on is requested before each
  // probe, and its row (with the slot, or kRowAhead positions on once the slot has come
  // when rows are pooled), so a steady number of cache misses overlap. A rolling window: in
  // groups (request 32, then probe 32) the misses drained at the end of each group, 20-25%
  // slower on a 3.3M-key table. Without kHomeRows pooled rows are not requested (keys that
  // claim a free slot have no row yet).
  template <bool kForWrite, typename Probe, bool kHomeRows = true>
  void ProbeAhead(const int64_t* keys, const int64_t* index, int64_t begin, int64_t end,
                const Probe& probe) const {
    if (pooled()) {
      ProbeRun<kForWrite, true, kHomeRows>(keys, index, begin, end, probe);
    } else {
      ProbeRun<kForWrite, false, kHomeRows>(keys, index, begin, end, probe);
    }
  }
  template <bool kForWrite, bool kPooled, bool kHomeRows, typename Probe>
  void ProbeRun(const int64_t* keys, const int64_t* index, int64_t begin, int64_t end,
                const Probe& probe) const {
    constexpr int64_t kAhead = kPooled ? 32 : 16, kRowAhead = 16;
    int64_t home[kAhead];  // a ring; kAhead is a power of two
    const auto key_at = [&](int64_t j) { return keys[index ? index[j] : j]; };
    const auto request = [&](int64_t j) {
      const int64_t slot = home[j & (kAhead - 1)] = Home(key_at(j));
      __builtin_prefetch(&slots_[slot], kForWrite);
      if (kPooled) __builtin_prefetch(&slot_rows_[slot], kForWrite);
      if (!kPooled) PrefetchHomeRow<kForWrite, false>(slot);
    };
    const auto request_row = [&](int64_t j) {
      if (kPooled && kHomeRows) PrefetchHomeRow<kForWrite, true>(home[j & (kAhead - 1)]);
    };
    for (int64_t j = begin; j < std::min(end, begin + kAhead); ++j) request(j);
    if (kPooled) {
      for (int64_t j = begin; j < std::min(end, begin + kRowAhead); ++j) request_row(j);
    }
    for (int64_t j = begin; j < end; ++j) {
      const int64_t slot_home = home[j & (kAhead - 1)];
      if (j + kAhead < end) request(j + kAhead);
      if (kPooled && j + kRowAhead < end) request_row(j + kRowAhead);
      probe(index ? index[j] : j, slot_home);
    }
  }
  // Claims the first free slot of `key`'s probe run from `home` and writes the key; the
  // caller writes the row and publishes the metadata. For keys known to be absent (and
  // distinct); exclusive lock held, room reserved, safe in parallel.
  int64_t ClaimFreeSlot(int64_t key, int64_t home);
  // The key's slot, a new one with initial state and an unwritten value when absent (its
  // callers write the value). Exclusive lock; room reserved.
  int64_t FindOrInsertSlot(int64_t key, uint32_t now);
  // Thread-safe find-or-insert for the parallel insert pass (exclusive lock held by the
  // caller, room reserved). Returns -1 for a missing key refused by `admit`. A new key's
  // initial value also goes to `out`.
  template <typename Admit>
  int64_t ClaimSlot(int64_t key, int64_t home, uint32_t now, const Admit& admit, float* out,
                    bool* inserted);
  // Find-or-insert of keys[index[j]] for j in [0, count) (every i when index is null), rows
  // to values; parallel. Exclusive lock; room reserved.
  void InsertPass(const int64_t* keys, const int64_t* index, int64_t count, float* values,
                  uint64_t clock, float admit_probability, const ParallelFor& parallel_for);
  bool Admitted(int64_t key, uint64_t clock, float admit_probability) const;
  void Touch(int64_t slot, uint64_t clock);
  // Distinct keys among keys[i] with missing[i] that are not in the table.
  int64_t CountNewKeys(const int64_t* keys, const std::vector<uint8_t>& missing) const;
  // The `count` lowest-scored keys (all, when fewer are held), in no order, none in a slot
  // that `kept` (one a slot, when given) marks. Lock held.
  std::vector<int64_t> LowestScoredKeys(int64_t count,
                                        const std::vector<uint8_t>* kept = nullptr) const;
  // Makes room for `incoming` new keys (an upper bound is fine unless it would overflow
  // max_capacity): evicts or fails; grows the slot array. Exclusive lock.
  // Makes room for `incoming` new keys (evicting, growing); growth rehashes with parallel_for.
  Status Reserve(int64_t incoming, EvictedBuffer* evicted = nullptr,
                 const ParallelFor& parallel_for = SerialFor);
  void Rehash(int64_t slots, const ParallelFor& parallel_for = SerialFor);
  // Adds the row chunks `takes` new keys need; a failure is ResourceExhausted, rows kept.
  Status ReserveRows(int64_t takes);
  // Rehashes into more slots when `incoming` more keys would pass the load limit. Exclusive
  // lock.
  Status Grow(int64_t incoming, const ParallelFor& parallel_for);
  void EraseSlot(int64_t slot);
  // Backward-shift deletion of `slot` (later entries of its probe run move back into the
  // hole); leaves size_ alone. A pooled row goes back to the pool, or into `freed_rows`
  // for the caller to give back.
  void ShiftOut(int64_t slot, std::vector<int64_t>* freed_rows = nullptr);
  // Erases the keys[i] with erase[i] (clearing erase[i] for a key no longer there, as a
  // repeat of an erased key), in parallel, and returns how many it erased. The slot array is
  // cut at empty slots into ranges that no probe run crosses, and each range's keys are
  // erased in index order by one thread: a deletion moves entries within its run only.
  int64_t EraseInParallel(const int64_t* keys, uint8_t* erase, int64_t n,
                          const ParallelFor& parallel_for);
  // EraseInParallel calling on_erase(i, slot) for each key just before its slot is erased;
  // with kReadRows the keys' rows are requested ahead too.
  template <bool kReadRows, typename OnErase>
  int64_t EraseInRanges(const int64_t* keys, uint8_t* erase, int64_t n,
                        const ParallelFor& parallel_for, const OnErase& on_erase);
  void FillInitialState(float* state) const;

  // Read by every row access: kept together.
  const bool pooled_;
  float* flat_rows_ = nullptr;  // a row per slot: rows_'s one chunk, row = slot
  int64_t value_words_ = 0;
  int64_t row_width_ = 0;
  RowInitializer initializer_;
  mutable std::shared_mutex mutex_;
  std::atomic<uint64_t> clock_{0};
  int64_t size_ = 0;
  int64_t mask_ = 0;                      // slots - 1; slots is a power of two
  HugePageArray<Slot> slots_;
  // Pooled rows: each slot's row number (beside the slots: a 16-byte slot keeps four to a
  // cache line, and a probe run reads slots only).
  HugePageArray<int64_t> slot_rows_;
  RowPool rows_;
  int64_t created_us_ = 0;                // write stamps count milliseconds from here
};

// Sok>DynamicGatherRows on the host: rows ([n, dim]) row i receives the row of pair i ([n, 2]
// (table, key)) from the table it names, each table's keys looked up together (find-or-insert
// with `insert`, admitted with admit[t]); zeros for a pair naming no table.
Status ReadPairRowsOnHost(const std::vector<DynamicTable*>& tables, const int64_t* pairs,
                          int64_t n, int64_t dim, bool insert, const std::vector<float>& admit,
                          const TableContext& context, float* rows);

}  // namespace sok
