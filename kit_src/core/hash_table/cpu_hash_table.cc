#include "kit_src/core/hash_table/cpu_hash_table.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include <mutex>
#include <string>

#include "Eigen/Core"
#include "kit_src/core/optimizers/rule_by_name.h"
#include "kit_src/core/optimizers/sum_duplicates.h"
#include "kit_src/core/optimizers/update_rules.h"

namespace sok {

CpuHashTable::CpuHashTable(const HashTableOptions& options, const RowInitializer& initializer)
    : DynamicTable(options), pooled_(options.pooled_rows), initializer_(initializer),
      created_us_(NowMicros()) {
  SetLayout();
  rows_.Reset(RowWidth());  // a row per slot: Rehash sizes it
  Rehash(SlotsForKeys(std::max<int64_t>(1, std::min(options.init_capacity, options.max_capacity))));
}

int64_t CpuHashTable::size() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return size_;
}

namespace {

// 16-bit storage (Eigen::half or Eigen::bfloat16) to float and back, round to nearest even.
template <typename Narrow>
void Widen(const float* row, int64_t dim, float* out) {
  const auto* value = reinterpret_cast<const Narrow*>(row);
  for (int64_t d = 0; d < dim; ++d) out[d] = static_cast<float>(value[d]);
}

template <typename Narrow>
void Round(const float* value, int64_t dim, float* row) {
  auto* stored = reinterpret_cast<Narrow*>(row);
  for (int64_t d = 0; d < dim; ++d) stored[d] = Narrow(value[d]);
}

}  // namespace

void CpuHashTable::WidenValue(int64_t slot, float* out) const {
  if (options_.value_type == ValueType::kFloat16) {
    Widen<Eigen::half>(Row(slot), options_.dim, out);
  } else {
    Widen<Eigen::bfloat16>(Row(slot), options_.dim, out);
  }
}

void CpuHashTable::WriteValue(const float* value, int64_t slot) {
  switch (options_.value_type) {
    case ValueType::kFloat32:
      std::memcpy(Row(slot), value, options_.dim * sizeof(float));
      return;
    case ValueType::kFloat16:
      Round<Eigen::half>(value, options_.dim, Row(slot));
      return;
    case ValueType::kBfloat16:
      Round<Eigen::bfloat16>(value, options_.dim, Row(slot));
      return;
  }
}

uint32_t CpuHashTable::StampAt(int64_t time_us) const { return WriteStampAt(created_us_, time_us); }

void CpuHashTable::Touch(int64_t slot, uint64_t clock) {
  if (options_.evict == EvictStrategy::kNone) return;  // scores only order evictions
  std::atomic<uint64_t>& meta = slots_[slot].meta;
  if (options_.evict == EvictStrategy::kLfu) {
    if (Score(slot) < kMaxScore) meta.fetch_add(uint64_t{1} << kScoreShift, std::memory_order_relaxed);
  } else {  // the occupied bit and the write stamp stay
    const uint64_t score = std::min(clock, kMaxScore) << kScoreShift;
    meta.store((meta.load(std::memory_order_relaxed) & ~kScoreBits) | score,
               std::memory_order_relaxed);
  }
}

void CpuHashTable::Rehash(int64_t num_slots, const ParallelFor& parallel_for) {
  // Allocated before anything moves: when host memory runs out the table is as it was.
  // Pooled rows stay where they are, the slots keep their numbers; a row per slot moves.
  HugePageArray<Slot> new_slots(num_slots);  // zeroed: every slot empty
  HugePageArray<int64_t> new_slot_rows(pooled() ? num_slots : 0);
  RowPool new_rows;
  if (!pooled()) {
    new_rows.Reset(RowWidth(), num_slots, /*chunked=*/false);  // one array, as the slots
    new_rows.ReserveCapacity(num_slots);
    rows_.Swap(new_rows);
    flat_rows_ = rows_.Row(0);
  }
  const RowPool& old_rows = pooled() ? rows_ : new_rows;
  HugePageArray<Slot> old_slots = std::move(slots_);
  HugePageArray<int64_t> old_slot_rows = std::move(slot_rows_);
  slots_ = std::move(new_slots);
  slot_rows_ = std::move(new_slot_rows);
  mask_ = num_slots - 1;
  const int64_t width = RowWidth();
  // Old slots in parallel: each key claims the first free slot of its probe run, as
  // ClaimSlot does (keys are distinct, and no slot empties meanwhile, so a claimed slot is
  // simply passed over). The layout then depends on the threads' timing; nothing reads it
  // but the probes.
  parallel_for(old_slots.size(), pooled() ? 40 : 2 * width + 20, [&](int64_t begin,
                                                                      int64_t end) {
    for (int64_t old = begin; old < end; ++old) {
      const uint64_t meta = old_slots[old].meta.load(std::memory_order_relaxed);
      if (!(meta & kOccupied)) continue;
      const int64_t key = old_slots[old].key;
      const int64_t slot = ClaimFreeSlot(key, Home(key));
      if (pooled()) {
        slot_rows_[slot] = old_slot_rows[old];
      } else {
        std::memcpy(rows_.Row(slot), old_rows.Row(old), width * sizeof(float));
      }
      slots_[slot].meta.store(meta, std::memory_order_release);
    }
  });
}

int64_t CpuHashTable::ClaimFreeSlot(int64_t key, int64_t home) {
  for (int64_t slot = home;; slot = (slot + 1) & mask_) {
    uint64_t empty = 0;
    if (slots_[slot].meta.compare_exchange_strong(empty, kClaimed, std::memory_order_acq_rel)) {
      slots_[slot].key = key;
      return slot;
    }
  }
}

int64_t CpuHashTable::FindOrInsertSlot(int64_t key, uint32_t now) {
  int64_t slot = Home(key);
  for (; Occupied(slot); slot = (slot + 1) & mask_) {
    if (slots_[slot].key == key) return slot;
  }
  slots_[slot].key = key;
  GiveRow(slot);
  slots_[slot].meta.store(kOccupied | now, std::memory_order_relaxed);
  FillInitialState(State(slot));
  ++size_;
  return slot;
}

template <typename Admit>
int64_t CpuHashTable::ClaimSlot(int64_t key, int64_t home, uint32_t now, const Admit& admit,
                                float* out, bool* inserted) {
  *inserted = false;
  for (int64_t slot = home;; slot = (slot + 1) & mask_) {
    std::atomic<uint64_t>& meta = slots_[slot].meta;
    uint64_t seen = meta.load(std::memory_order_acquire);
    while (seen == kClaimed) seen = meta.load(std::memory_order_acquire);  // being written
    if (seen & kOccupied) {
      if (slots_[slot].key == key) return slot;
      continue;
    }
    if (!admit(key)) return -1;
    if (!meta.compare_exchange_strong(seen, kClaimed, std::memory_order_acq_rel)) {
      slot = (slot - 1) & mask_;  // another thread took it: look at the same slot again
      continue;
    }
    slots_[slot].key = key;
    GiveRow(slot);
    InitializeValue(key, slot, out);
    FillInitialState(State(slot));
    meta.store(kOccupied | now, std::memory_order_release);  // publishes key and row
    *inserted = true;
    return slot;
  }
}

bool CpuHashTable::Admitted(int64_t key, uint64_t clock, float admit_probability) const {
  return AdmitKey(key, clock, admit_probability);
}

void CpuHashTable::InsertPass(const int64_t* keys, const int64_t* index, int64_t count,
                              float* values, uint64_t clock, float admit_probability,
                              const ParallelFor& parallel_for) {
  const int64_t dim = options_.dim;
  std::atomic<int64_t> inserted_total{0};
  const auto admit = [&](int64_t key) { return Admitted(key, clock, admit_probability); };
  const uint32_t now = StampNow();
  parallel_for(count, 4 * dim + 150, [&](int64_t begin, int64_t end) {
    int64_t inserted_here = 0;
    ProbeAhead<true>(keys, index, begin, end, [&](int64_t i, int64_t home) {
      bool inserted = false;
      float* out = values + i * dim;
      const int64_t slot = ClaimSlot(keys[i], home, now, admit, out, &inserted);
      if (slot < 0) {  // refused by the filter: reads as zeros, not stored
        std::fill(out, out + dim, 0.0f);
        return;
      }
      inserted_here += inserted;
      if (!inserted) ReadValue(slot, out);
      Touch(slot, clock);
    });
    inserted_total.fetch_add(inserted_here, std::memory_order_relaxed);
  });
  size_ += inserted_total.load();
}

void CpuHashTable::FillInitialState(float* state) const {
  const int64_t first = std::min(options_.dim, options_.state_dim);
  std::fill(state, state + first, options_.state_initial_value);
  std::fill(state + first, state + options_.state_dim, 0.0f);
}

void CpuHashTable::EraseSlot(int64_t slot) {
  if (pooled()) rows_.ReserveGives(1);
  ShiftOut(slot);
  --size_;
}

void CpuHashTable::ShiftOut(int64_t slot, std::vector<int64_t>* freed_rows) {
  if (pooled()) {
    if (freed_rows != nullptr) {
      freed_rows->push_back(slot_rows_[slot]);
    } else {
      rows_.Give(slot_rows_[slot]);
    }
  }
  // Backward-shift deletion: pull later entries of the probe run into the hole.
  int64_t hole = slot;
  for (int64_t next = (hole + 1) & mask_; Occupied(next); next = (next + 1) & mask_) {
    const int64_t home = Home(slots_[next].key);
    const bool stays = hole <= next ? (hole < home && home <= next) : (hole < home || home <= next);
    if (stays) continue;
    slots_[hole].key = slots_[next].key;
    slots_[hole].meta.store(slots_[next].meta.load(std::memory_order_relaxed),
                            std::memory_order_relaxed);
    if (pooled()) {
      slot_rows_[hole] = slot_rows_[next];
    } else {
      std::memcpy(Row(hole), Row(next), RowWidth() * sizeof(float));
    }
    hole = next;
  }
  slots_[hole].meta.store(0, std::memory_order_relaxed);
}

template <bool kReadRows, typename OnErase>
int64_t CpuHashTable::EraseInRanges(const int64_t* keys, uint8_t* erase, int64_t n,
                                    const ParallelFor& parallel_for, const OnErase& on_erase) {
  // Range starts: the first empty slot at or after each of kRanges even cuts.
  constexpr int64_t kRanges = 64;
  const int64_t slots = mask_ + 1;
  std::vector<int64_t> starts;
  for (int64_t r = 0; r < kRanges; ++r) {
    int64_t slot = r * (slots / kRanges);
    for (int64_t step = 0; step < slots && Occupied(slot); ++step) slot = (slot + 1) & mask_;
    if (!Occupied(slot)) starts.push_back(slot);
  }
  if (starts.empty()) starts.push_back(0);  // no empty slot: one range, one thread
  std::sort(starts.begin(), starts.end());
  starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
  const int64_t ranges = static_cast<int64_t>(starts.size());
  // A key's run holds its home slot, so the range of its home is the range of its slot
  // (the last range wraps past the array's end to the first start).
  const auto range_of = [&](int64_t key) {
    const int64_t home = Home(key);
    const int64_t after = std::upper_bound(starts.begin(), starts.end(), home) - starts.begin();
    return after == 0 ? ranges - 1 : after - 1;
  };
  std::vector<int32_t> range(n);
  parallel_for(n, 60, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (erase[i]) range[i] = static_cast<int32_t>(range_of(keys[i]));
    }
  });
  // The keys of each range, in index order (a counting sort).
  std::vector<int64_t> first(ranges + 1, 0), order;
  for (int64_t i = 0; i < n; ++i) {
    if (erase[i]) ++first[range[i] + 1];
  }
  for (int64_t r = 0; r < ranges; ++r) first[r + 1] += first[r];
  order.resize(first[ranges]);
  if (pooled()) rows_.ReserveGives(first[ranges]);
  std::vector<int64_t> next(first.begin(), first.end() - 1);
  for (int64_t i = 0; i < n; ++i) {
    if (erase[i]) order[next[range[i]]++] = i;
  }
  std::atomic<int64_t> erased{0};
  parallel_for(ranges, 1000000, [&](int64_t begin, int64_t end) {
    int64_t here = 0;
    std::vector<int64_t> freed_rows;  // given back at once (RowPool::GiveMany)
    if (pooled()) freed_rows.reserve(first[end] - first[begin]);
    // The home slot of the key this many erasures on is requested, and its row (with the
    // slot, or kRowAhead on once the slot has come where rows are pooled) when read out.
    constexpr int64_t kAhead = 8, kRowAhead = 4;
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t j = first[r]; j < first[r + 1]; ++j) {
        if (j + kAhead < first[r + 1]) {
          const int64_t home = Home(keys[order[j + kAhead]]);
          __builtin_prefetch(&slots_[home], 1);
          if (pooled()) __builtin_prefetch(&slot_rows_[home], 0);
          if (kReadRows && !pooled()) PrefetchHomeRow<false, false>(home);
        }
        if (kReadRows && pooled() && j + kRowAhead < first[r + 1]) {
          PrefetchHomeRow<false, true>(Home(keys[order[j + kRowAhead]]));
        }
        const int64_t i = order[j];
        const int64_t slot = FindSlot(keys[i], Home(keys[i]));
        if (slot < 0) {
          erase[i] = 0;
        } else {
          on_erase(i, slot);
          ShiftOut(slot, &freed_rows);
          ++here;
        }
      }
    }
    if (pooled()) rows_.GiveMany(freed_rows.data(), static_cast<int64_t>(freed_rows.size()));
    erased.fetch_add(here, std::memory_order_relaxed);
  });
  size_ -= erased.load();
  return erased.load();
}

int64_t CpuHashTable::EraseInParallel(const int64_t* keys, uint8_t* erase, int64_t n,
                                      const ParallelFor& parallel_for) {
  return EraseInRanges<false>(keys, erase, n, parallel_for, [](int64_t, int64_t) {});
}

void CpuHashTable::TakeHeld(const int64_t* keys, int64_t n, float* values, float* state,
                            uint8_t* found, const ParallelFor& parallel_for) {
  const int64_t dim = options_.dim, state_dim = state != nullptr ? options_.state_dim : 0;
  std::fill(found, found + n, 1);
  EraseInRanges<true>(keys, found, n, parallel_for, [&](int64_t i, int64_t slot) {
    ReadValue(slot, values + i * dim);
    if (state_dim > 0) std::memcpy(state + i * state_dim, State(slot), state_dim * sizeof(float));
  });
  parallel_for(n, 2 * (dim + state_dim) + 10, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (!found[i]) ZeroRow(i, values, state, state_dim);
    }
  });
}

int64_t CpuHashTable::CountNewKeys(const int64_t* keys, const std::vector<uint8_t>& missing) const {
  std::vector<int64_t> new_keys;
  for (size_t i = 0; i < missing.size(); ++i) {
    if (missing[i] && FindSlot(keys[i], Home(keys[i])) < 0) new_keys.push_back(keys[i]);
  }
  std::sort(new_keys.begin(), new_keys.end());
  return std::unique(new_keys.begin(), new_keys.end()) - new_keys.begin();
}

Status CpuHashTable::HostAllocation(const std::function<void()>& allocate, int64_t bytes) {
  try {
    allocate();
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted("host memory exhausted: the dynamic table could not grow "
                                     "by " + std::to_string(bytes >> 20) + " MiB (it holds " +
                                     std::to_string(size_) + " keys); nothing was changed");
  }
  return Status::Ok();
}

std::vector<int64_t> CpuHashTable::LowestScoredKeys(int64_t count,
                                                   const std::vector<uint8_t>* kept) const {
  std::vector<std::pair<uint64_t, int64_t>> scored;
  scored.reserve(size_);
  for (int64_t s = 0; s <= mask_; ++s) {
    if (!Occupied(s) || (kept != nullptr && (*kept)[s])) continue;
    const uint64_t order = options_.evict_newest_of_equals
                               ? (Score(s) << 32) | (~uint64_t{WriteStamp(s)} & kStampBits)
                               : Score(s);
    scored.emplace_back(order, slots_[s].key);
  }
  count = std::min<int64_t>(count, scored.size());
  std::vector<int64_t> keys;
  if (count <= 0) return keys;
  std::nth_element(scored.begin(), scored.begin() + (count - 1), scored.end());
  for (int64_t v = 0; v < count; ++v) keys.push_back(scored[v].second);
  return keys;
}

Status CpuHashTable::Reserve(int64_t incoming, EvictedBuffer* evicted,
                             const ParallelFor& parallel_for) {
  const int64_t overflow = size_ + incoming - options_.max_capacity;
  const bool refused =
      options_.evict == EvictStrategy::kNone || incoming > options_.max_capacity;
  if (overflow > 0 && refused) {
    return Status::ResourceExhausted(
        "dynamic table is full: it holds " + std::to_string(size_) + " keys, " +
        std::to_string(incoming) + " new keys arrived and max_capacity is " +
        std::to_string(options_.max_capacity) +
        "; raise max_capacity or set evict_strategy ('lru' or 'lfu')");
  }
  SOK_RETURN_IF_ERROR(ReserveRows(incoming));  // before an eviction: a failure loses no key
  if (overflow > 0) EvictLowestScored(overflow, evicted);
  return Grow(incoming, parallel_for);
}

void CpuHashTable::EvictLowestScored(int64_t count, EvictedBuffer* evicted) {
  for (const int64_t key : LowestScoredKeys(count)) {
    const int64_t slot = FindSlot(key, Home(key));
    if (evicted != nullptr) {
      evicted->keys.push_back(key);
      evicted->values.resize(evicted->values.size() + options_.dim);
      ReadValue(slot, evicted->values.data() + evicted->values.size() - options_.dim);
    }
    EraseSlot(slot);
  }
}

Status CpuHashTable::HandOut(const EvictedBuffer& buffer, EvictedRows* evicted) {
  if (evicted == nullptr || buffer.keys.empty()) return Status::Ok();
  evicted->count = static_cast<int64_t>(buffer.keys.size());
  int64_t* evicted_keys = nullptr;
  float* evicted_values = nullptr;
  SOK_RETURN_IF_ERROR(evicted->allocate(evicted->count, &evicted_keys, &evicted_values));
  std::copy(buffer.keys.begin(), buffer.keys.end(), evicted_keys);
  std::copy(buffer.values.begin(), buffer.values.end(), evicted_values);
  return Status::Ok();
}

Status CpuHashTable::LookupRows(const int64_t* keys, int64_t n, bool insert, float* values,
                                const ParallelFor& parallel_for, float admit_probability,
                                EvictedBuffer* evicted) {
  const int64_t dim = options_.dim;
  const uint64_t clock = clock_.fetch_add(1) + 1;
  if (!insert) {  // reads only: missing keys read as zeros
    std::shared_lock<std::shared_mutex> lock(mutex_);
    parallel_for(n, 4 * dim + 100, [&](int64_t begin, int64_t end) {
      ProbeAhead<false>(keys, nullptr, begin, end, [&](int64_t i, int64_t home) {
        const int64_t slot = FindSlot(keys[i], home);
        float* out = values + i * dim;
        if (slot < 0) {
          std::fill(out, out + dim, 0.0f);
        } else {
          ReadValue(slot, out);
        }
      });
    });
    return Status::Ok();
  }
  std::unique_lock<std::shared_mutex> lock(mutex_);
  if (size_ + n <= options_.max_capacity &&
      static_cast<double>(size_ + n) <= static_cast<double>(mask_ + 1) * kMaxSlotLoad) {
    // Room for every key even if all are new: one parallel find-or-insert pass.
    SOK_RETURN_IF_ERROR(ReserveRows(n));
    InsertPass(keys, nullptr, n, values, clock, admit_probability, parallel_for);
    return Status::Ok();
  }
  // Find the present keys first, so growth and eviction see the true number of new keys.
  std::vector<uint8_t> missing(n, 0);
  std::atomic<int64_t> num_missing{0};
  parallel_for(n, 4 * dim + 100, [&](int64_t begin, int64_t end) {
    int64_t missed = 0;
    ProbeAhead<false>(keys, nullptr, begin, end, [&](int64_t i, int64_t home) {
      const int64_t slot = FindSlot(keys[i], home);
      if (slot < 0) {
        missing[i] = 1;
        ++missed;
        return;
      }
      ReadValue(slot, values + i * dim);
      Touch(slot, clock);
    });
    num_missing.fetch_add(missed, std::memory_order_relaxed);
  });
  const int64_t missed = num_missing.load();
  if (missed == 0) return Status::Ok();
  std::vector<int64_t> missing_index;
  missing_index.reserve(missed);
  for (int64_t i = 0; i < n; ++i) {
    if (!missing[i]) continue;
    if (Admitted(keys[i], clock, admit_probability)) {
      missing_index.push_back(i);
    } else {
      missing[i] = 0;
      std::fill(values + i * dim, values + (i + 1) * dim, 0.0f);
    }
  }
  // The admitted count bounds the new keys; count them exactly only when that bound would
  // overflow max_capacity.
  const int64_t admitted = static_cast<int64_t>(missing_index.size());
  const int64_t incoming = size_ + admitted > options_.max_capacity ? CountNewKeys(keys, missing)
                                                                    : admitted;
  Status status = Reserve(incoming, evicted, parallel_for);
  if (!status.ok()) return status;
  InsertPass(keys, missing_index.data(), admitted, values, clock, 1.0f, parallel_for);
  return Status::Ok();
}

Status CpuHashTable::InsertOrAssign(const int64_t* keys, int64_t n, const float* values,
                                    const float* state, const TableContext&) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  const std::vector<uint8_t> all(n, 1);
  const int64_t incoming = size_ + n > options_.max_capacity ? CountNewKeys(keys, all) : n;
  Status status = Reserve(incoming);
  if (!status.ok()) return status;
  const uint64_t clock = clock_.fetch_add(1) + 1;
  const uint32_t now = StampNow();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t slot = FindOrInsertSlot(keys[i], now);
    Stamp(slot, now);
    WriteValue(values + i * options_.dim, slot);
    if (state != nullptr) {
      std::memcpy(State(slot), state + i * options_.state_dim,
                  options_.state_dim * sizeof(float));
    }
    Touch(slot, clock);
  }
  return Status::Ok();
}

Status CpuHashTable::EnsureState(int64_t state_dim, float initial_value) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  if (options_.state_dim >= state_dim) return Status::Ok();
  const int64_t wide = ValueWords() + state_dim;
  const int64_t rows = pooled() ? rows_.used() : mask_ + 1;
  SOK_RETURN_IF_ERROR(HostAllocation([&] { rows_.Widen(wide, rows); }, rows * wide * 4));
  if (!pooled()) flat_rows_ = rows_.Row(0);
  options_.state_dim = state_dim;
  SetLayout();
  options_.state_initial_value = initial_value;
  for (int64_t s = 0; s <= mask_; ++s) {
    if (Occupied(s)) FillInitialState(State(s));
  }
  return Status::Ok();
}

Status CpuHashTable::Replace(const int64_t* keys, int64_t n, const float* values,
                             const float* state, int64_t state_dim, const TableContext&) {
  if (n > options_.max_capacity) {
    return Status::ResourceExhausted("restoring " + std::to_string(n) +
                                     " keys into a table whose max_capacity is " +
                                     std::to_string(options_.max_capacity));
  }
  SOK_RETURN_IF_ERROR(EnsureState(state_dim, options_.state_initial_value));
  std::unique_lock<std::shared_mutex> lock(mutex_);
  const int64_t slots = SlotsForKeys(std::max<int64_t>(n, 1));
  // Rehash keeps occupied slots; pooled rows are all reused, numbered afresh.
  const int64_t rows = pooled() ? n : slots;
  SOK_RETURN_IF_ERROR(HostAllocation(
      [&] {
        Rehash(slots);
        if (pooled()) rows_.ReserveCapacity(n);
      },
      slots * static_cast<int64_t>(sizeof(Slot) + 8) + rows * RowWidth() * 4));
  for (int64_t s = 0; s <= mask_; ++s) slots_[s].meta.store(0, std::memory_order_relaxed);
  rows_.Clear();
  size_ = 0;
  const uint32_t now = StampNow();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t slot = FindOrInsertSlot(keys[i], now);
    WriteValue(values + i * options_.dim, slot);
    if (state != nullptr && state_dim > 0) {
      std::memcpy(State(slot), state + i * state_dim,
                  std::min(state_dim, options_.state_dim) * sizeof(float));
    }
  }
  return Status::Ok();
}

Status CpuHashTable::Erase(const int64_t* keys, int64_t n, int64_t* erased,
                           const TableContext&) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  *erased = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t slot = FindSlot(keys[i], Home(keys[i]));
    if (slot >= 0) {
      EraseSlot(slot);
      ++*erased;
    }
  }
  return Status::Ok();
}

Status CpuHashTable::Take(const int64_t* keys, int64_t n, float* values, float* state,
                          uint8_t* found, const TableContext& context) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  TakeHeld(keys, n, values, state, found, context.parallel_for);
  return Status::Ok();
}

void CpuHashTable::ReadHeld(const int64_t* keys, int64_t n, float* values, float* state,
                            uint8_t* found, const ParallelFor& parallel_for) const {
  const int64_t dim = options_.dim, state_dim = state != nullptr ? options_.state_dim : 0;
  parallel_for(n, 2 * (dim + state_dim) + 100, [&](int64_t begin, int64_t end) {
    ProbeAhead<false>(keys, nullptr, begin, end, [&](int64_t i, int64_t home) {
      const int64_t slot = FindSlot(keys[i], home);
      found[i] = slot >= 0;
      if (slot < 0) return ZeroRow(i, values, state, state_dim);
      ReadValue(slot, values + i * dim);
      if (state_dim > 0) std::memcpy(state + i * state_dim, State(slot), state_dim * sizeof(float));
    });
  });
}

void CpuHashTable::ZeroRow(int64_t i, float* values, float* state, int64_t state_dim) const {
  std::fill(values + i * options_.dim, values + (i + 1) * options_.dim, 0.0f);
  if (state_dim > 0) std::fill(state + i * state_dim, state + (i + 1) * state_dim, 0.0f);
}

void CpuHashTable::EraseTaken(const int64_t* keys, int64_t n, float* values, float* state,
                              uint8_t* found, const ParallelFor& parallel_for) {
  // Erasing moves other rows, so it follows the reads; a key repeated is found once, as if
  // taken one at a time.
  std::vector<uint8_t> erased(n);
  for (int64_t i = 0; i < n; ++i) erased[i] = found[i] == 1;
  EraseInParallel(keys, erased.data(), n, parallel_for);
  const int64_t state_dim = state != nullptr ? options_.state_dim : 0;
  for (int64_t i = 0; i < n; ++i) {
    if (found[i] == 1 && !erased[i]) {  // a repeat of a key taken before it
      found[i] = 0;
      ZeroRow(i, values, state, state_dim);
    }
  }
}

Status CpuHashTable::TakeOrAdmit(const int64_t* keys, int64_t n, float admit_probability,
                                 float* values, float* state, uint8_t* found,
                                 EvictedRows* evicted, const TableContext& context) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  const uint64_t clock = clock_.fetch_add(1) + 1;  // as the find-or-insert it stands for
  const int64_t dim = options_.dim, state_dim = state != nullptr ? options_.state_dim : 0;
  const int64_t held_before = size_;
  // Where new keys could be refused (a full table that cannot evict), the refusal comes
  // before any change, so the held keys are read first and erased once the new keys are
  // counted; otherwise each held key is read and erased in one visit.
  const bool may_refuse =
      size_ + n > options_.max_capacity &&
      (options_.evict == EvictStrategy::kNone || n > options_.max_capacity);
  if (may_refuse) {
    ReadHeld(keys, n, values, state, found, context.parallel_for);
  } else {
    TakeHeld(keys, n, values, state, found, context.parallel_for);
  }
  // Keys not held that the filter admits get the rows an insert would have given them
  // (found 2 until the held keys are erased).
  std::atomic<int64_t> admitted{0};
  context.parallel_for(n, 4 * dim + 200, [&](int64_t begin, int64_t end) {
    int64_t here = 0;
    for (int64_t i = begin; i < end; ++i) {
      if (found[i] || !Admitted(keys[i], clock, admit_probability)) continue;
      float* value = values + i * dim;
      initializer_.Fill(keys[i], value, dim);
      RoundToStorage(value);
      if (state_dim > 0) FillInitialState(state + i * state_dim);
      found[i] = 2;
      ++here;
    }
    admitted.fetch_add(here, std::memory_order_relaxed);
  });
  // Room for the admitted keys among the keys held, as find-or-insert makes it: the taken
  // keys leave the table but stay in the whole table's count.
  const int64_t overflow = held_before + admitted.load() - options_.max_capacity;
  if (may_refuse) {
    const bool refused =
        options_.evict == EvictStrategy::kNone || admitted.load() > options_.max_capacity;
    if (overflow > 0 && refused) {
      return Status::ResourceExhausted(
          "dynamic table is full: it holds " + std::to_string(size_) + " keys, " +
          std::to_string(admitted.load()) + " new keys arrived and max_capacity is " +
          std::to_string(options_.max_capacity) +
          "; raise max_capacity or set evict_strategy ('lru' or 'lfu')");
    }
    EraseTaken(keys, n, values, state, found, context.parallel_for);
  }
  EvictedBuffer buffer;
  if (overflow > 0) EvictLowestScored(overflow, evicted != nullptr ? &buffer : nullptr);
  for (int64_t i = 0; i < n; ++i) found[i] = found[i] != 0;
  return HandOut(buffer, evicted);
}

void CpuHashTable::RoundToStorage(float* value) const {
  const int64_t dim = options_.dim;
  if (options_.value_type == ValueType::kFloat32) return;
  std::vector<float> stored((dim + 1) / 2);
  if (options_.value_type == ValueType::kFloat16) {
    Round<Eigen::half>(value, dim, stored.data());
    Widen<Eigen::half>(stored.data(), dim, value);
  } else {
    Round<Eigen::bfloat16>(value, dim, stored.data());
    Widen<Eigen::bfloat16>(stored.data(), dim, value);
  }
}

Status CpuHashTable::InsertNew(const int64_t* keys, int64_t n, const float* values,
                               const float* state, const TableContext& context) {
  {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    const double load = static_cast<double>(size_ + n) / static_cast<double>(mask_ + 1);
    const bool room = size_ + n <= options_.max_capacity && load <= kMaxSlotLoad;
    if (room) {
      SOK_RETURN_IF_ERROR(ReserveRows(n));
      const int64_t dim = options_.dim, state_dim = options_.state_dim;
      const uint64_t clock = clock_.fetch_add(1) + 1;
      const uint32_t now = StampNow();
      context.parallel_for(n, 2 * (dim + state_dim) + 100, [&](int64_t begin, int64_t end) {
        // Pooled: the shard's rows are taken at once and requested kAhead keys before their
        // writes (a row per slot comes with the slot).
        constexpr int64_t kAhead = 16;
        std::vector<int64_t> rows(pooled() ? end - begin : 0);
        if (pooled()) rows_.TakeMany(end - begin, rows.data());
        const auto request = [&](int64_t i) {
          const char* row = reinterpret_cast<const char*>(rows_.Row(rows[i - begin]));
          for (int64_t offset = 0; offset < RowWidth() * 4; offset += 64) {
            __builtin_prefetch(row + offset, 1);
          }
        };
        for (int64_t i = begin; pooled() && i < std::min(end, begin + kAhead); ++i) request(i);
        const auto claim = [&](int64_t i, int64_t home) {
          const int64_t slot = ClaimFreeSlot(keys[i], home);
          if (pooled()) {
            slot_rows_[slot] = rows[i - begin];
            if (i + kAhead < end) request(i + kAhead);
          }
          WriteValue(values + i * dim, slot);
          if (state != nullptr) {
            std::memcpy(State(slot), state + i * state_dim, state_dim * sizeof(float));
          } else {
            FillInitialState(State(slot));
          }
          slots_[slot].meta.store(kOccupied | now, std::memory_order_release);
          Touch(slot, clock);
        };
        ProbeAhead<true, decltype(claim), /*kHomeRows=*/false>(keys, nullptr, begin, end, claim);
      });
      size_ += n;
      return Status::Ok();
    }
  }
  return InsertOrAssign(keys, n, values, state, context);  // growth or eviction first
}

Status CpuHashTable::GrowFor(int64_t incoming) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  SOK_RETURN_IF_ERROR(ReserveRows(incoming));
  return Grow(incoming, SerialFor);
}

Status CpuHashTable::Grow(int64_t incoming, const ParallelFor& parallel_for) {
  if (static_cast<double>(size_ + incoming) <= static_cast<double>(mask_ + 1) * kMaxSlotLoad) {
    return Status::Ok();
  }
  const int64_t slots = SlotsForKeys(size_ + incoming);
  const int64_t row_bytes = pooled() ? 8 : RowWidth() * 4;
  return HostAllocation([&] { Rehash(slots, parallel_for); },
                        slots * (static_cast<int64_t>(sizeof(Slot)) + row_bytes));
}

Status CpuHashTable::ReserveRows(int64_t takes) {
  if (!pooled()) return Status::Ok();  // a row per slot: Grow makes them
  return HostAllocation([&] { rows_.Reserve(takes); }, rows_.GrowthBytes(takes));
}

Status CpuHashTable::Absent(const TableKeys& keys, uint8_t* absent, const TableContext&) {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  for (int64_t i = 0; i < keys.n; ++i) {
    int64_t key = 0;
    absent[i] = KeyAt(keys, i, &key) && FindSlot(key, Home(key)) < 0;
  }
  return Status::Ok();
}

Status CpuHashTable::EvictLowest(int64_t count, const TableKeys& keep,
                                 const ExportOutputs& outputs, const TableContext&) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  std::vector<uint8_t> kept(keep.n > 0 ? mask_ + 1 : 0, 0);  // by slot, when there are keys
  for (int64_t i = 0; i < keep.n; ++i) {
    int64_t key = 0;
    if (!KeyAt(keep, i, &key)) continue;
    const int64_t slot = FindSlot(key, Home(key));
    if (slot >= 0) kept[slot] = 1;
  }
  const std::vector<int64_t> lowest = LowestScoredKeys(count, keep.n > 0 ? &kept : nullptr);
  const int64_t n = static_cast<int64_t>(lowest.size()), dim = options_.dim;
  const int64_t state_dim = options_.state_dim;
  int64_t* keys = nullptr;
  float *values = nullptr, *state = nullptr;
  SOK_RETURN_IF_ERROR(outputs(n, &keys, &values, &state));
  for (int64_t j = 0; j < n; ++j) {
    const int64_t slot = FindSlot(lowest[j], Home(lowest[j]));
    keys[j] = lowest[j];
    ReadValue(slot, values + j * dim);
    if (state != nullptr) std::memcpy(state + j * state_dim, State(slot), state_dim * sizeof(float));
    EraseSlot(slot);
  }
  return Status::Ok();
}

Status CpuHashTable::AgeScores(const TableContext& context) {
  if (options_.evict != EvictStrategy::kLfu) return Status::Ok();
  std::unique_lock<std::shared_mutex> lock(mutex_);
  context.parallel_for(mask_ + 1, 4, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      if (!Occupied(s)) continue;
      std::atomic<uint64_t>& meta = slots_[s].meta;
      const uint64_t seen = meta.load(std::memory_order_relaxed);
      meta.store((seen & ~kScoreBits) | ((Score(s) >> 1) << kScoreShift),
                 std::memory_order_relaxed);
    }
  });
  return Status::Ok();
}

Status CpuHashTable::Export(int64_t written_after_us, bool with_state,
                           const ExportOutputs& outputs, const TableContext&) {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  const int64_t dim = options_.dim, state_dim = options_.state_dim;
  // Stamps are milliseconds: keep every row stamped in the threshold's millisecond or later.
  const bool all = written_after_us == kExportAll || written_after_us < created_us_;
  const uint32_t since = all ? 0 : StampAt(written_after_us);
  const auto exported = [&](int64_t s) {
    return Occupied(s) && (all || WriteStamp(s) >= since);
  };
  int64_t n = 0;
  for (int64_t s = 0; s <= mask_; ++s) n += exported(s);
  int64_t* keys = nullptr;
  float *values = nullptr, *state = nullptr;
  SOK_RETURN_IF_ERROR(outputs(n, &keys, &values, with_state ? &state : nullptr));
  int64_t i = 0;
  for (int64_t s = 0; s <= mask_; ++s) {
    if (!exported(s)) continue;
    keys[i] = slots_[s].key;
    ReadValue(s, values + i * dim);
    if (with_state) std::memcpy(state + i * state_dim, State(s), state_dim * sizeof(float));
    ++i;
  }
  return Status::Ok();
}

Status CpuHashTable::Size(int64_t* size_out, const TableContext&) {
  *size_out = size();
  return Status::Ok();
}

Status CpuHashTable::Find(const TableKeys& keys, float* values, const TableContext& context) {
  return LookupKeys(keys, false, values, 1.0f, nullptr, context.parallel_for);
}

Status CpuHashTable::FindOrInsert(const TableKeys& keys, float* values, float admit_probability,
                                  EvictedRows* evicted, const TableContext& context) {
  return LookupKeys(keys, true, values, admit_probability, evicted, context.parallel_for);
}

Status CpuHashTable::LookupKeys(const TableKeys& keys, bool insert, float* values,
                                float admit_probability, EvictedRows* evicted,
                                const ParallelFor& parallel_for) {
  EvictedBuffer buffer;
  EvictedBuffer* evicted_buffer = evicted ? &buffer : nullptr;
  if (keys.stride == 1) {
    SOK_RETURN_IF_ERROR(LookupRows(keys.data, keys.n, insert, values, parallel_for,
                                   admit_probability, evicted_buffer));
  } else {  // the pairs naming this table, looked up together and put back in place
    std::vector<int64_t> positions, own_keys;
    for (int64_t i = 0; i < keys.n; ++i) {
      int64_t key = 0;
      if (!KeyAt(keys, i, &key)) continue;
      positions.push_back(i);
      own_keys.push_back(key);
    }
    const int64_t dim = options_.dim, count = static_cast<int64_t>(own_keys.size());
    std::vector<float> rows(count * dim);
    SOK_RETURN_IF_ERROR(LookupRows(own_keys.data(), count, insert, rows.data(), parallel_for,
                                   admit_probability, evicted_buffer));
    for (int64_t j = 0; j < count; ++j) {
      CopyFloats(rows.data() + j * dim, dim, values + positions[j] * dim);
    }
  }
  return HandOut(buffer, evicted);
}

Status CpuHashTable::ApplySparseUpdate(const SparseUpdate& update, const TableContext& context) {
  const int64_t dim = options_.dim;
  // The rule must find the state it reads and writes (past it lies the next row).
  bool fits = true;
  SOK_RETURN_IF_ERROR(VisitRule(update.rule, update.hyper, update.hyper_count, update.nesterov,
                                [&](const auto& rule) {
    fits = RuleStateFloats(rule, dim) <= std::max(update.state_dim, state_dim());
  }));
  if (!fits || update.state_dim % dim != 0 || update.state_dim > 3 * dim) {
    return Status::InvalidArgument("rule " + update.rule + " does not fit a state of " +
                                   std::to_string(update.state_dim) + " floats per key");
  }
  // Sum the gradients of duplicate keys so each row is updated once.
  std::vector<int64_t> unique_keys;
  std::vector<float> summed;
  SumDuplicates(update.keys, GradientUses{update.grads}, update.n, dim, &unique_keys, &summed);
  SOK_RETURN_IF_ERROR(EnsureState(update.state_dim, update.state_initial_value));
  const float* g = summed.data();
  return VisitRule(update.rule, update.hyper, update.hyper_count, update.nesterov,
                   [&](const auto& rule) {
    UpdateRows(
        unique_keys.data(), static_cast<int64_t>(unique_keys.size()),
        [&](int64_t i, float* w, float* state) { ApplyRule(w, state, g + i * dim, dim, rule); },
        context.parallel_for);
  });
}

Status ReadPairRowsOnHost(const std::vector<DynamicTable*>& tables, const int64_t* pairs,
                          int64_t n, int64_t dim, bool insert, const std::vector<float>& admit,
                          const TableContext& context, float* rows) {
  const int64_t num_tables = static_cast<int64_t>(tables.size());
  std::vector<std::vector<int64_t>> positions(num_tables);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = pairs[2 * i];
    if (t >= 0 && t < num_tables) {
      positions[t].push_back(i);
    } else {
      std::fill(rows + i * dim, rows + (i + 1) * dim, 0.0f);
    }
  }
  for (int64_t t = 0; t < num_tables; ++t) {
    const int64_t count = static_cast<int64_t>(positions[t].size());
    if (count == 0) continue;
    std::vector<int64_t> keys(count);
    for (int64_t j = 0; j < count; ++j) keys[j] = pairs[2 * positions[t][j] + 1];
    std::vector<float> values(count * dim);
    const TableKeys view{keys.data(), count, 1, 0};
    SOK_RETURN_IF_ERROR(insert
                            ? tables[t]->FindOrInsert(view, values.data(), admit[t], nullptr,
                                                      context)
                            : tables[t]->Find(view, values.data(), context));
    for (int64_t j = 0; j < count; ++j) {
      CopyFloats(values.data() + j * dim, dim, rows + positions[t][j] * dim);
    }
  }
  return Status::Ok();
}

}  // namespace sok
