#include "kit_src/core/hash_table/cpu_hash_table.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>

namespace sok {
namespace {

constexpr double kMaxLoad = 0.7;

int64_t SlotsFor(int64_t keys) {
  int64_t slots = 16;
  while (static_cast<double>(slots) * kMaxLoad < static_cast<double>(keys)) slots *= 2;
  return slots;
}

uint64_t HashKey(int64_t key) {
  uint64_t x = static_cast<uint64_t>(key);
  x = (x ^ (x >> 33)) * 0xff51afd7ed558ccdULL;
  x = (x ^ (x >> 33)) * 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

}  // namespace

CpuHashTable::CpuHashTable(const HashTableOptions& options, const RowInitializer& initializer)
    : options_(options), initializer_(initializer) {
  Rehash(SlotsFor(std::max<int64_t>(1, std::min(options.init_capacity, options.max_capacity))));
}

int64_t CpuHashTable::size() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return size_;
}

int64_t CpuHashTable::Home(int64_t key) const {
  return static_cast<int64_t>(HashKey(key) & static_cast<uint64_t>(mask_));
}

int64_t CpuHashTable::FindSlot(int64_t key) const {
  for (int64_t slot = Home(key);; slot = (slot + 1) & mask_) {
    if (!occupied_[slot]) return -1;
    if (keys_[slot] == key) return slot;
  }
}

void CpuHashTable::Touch(int64_t slot, uint64_t clock) {
  if (options_.evict == EvictStrategy::kLfu) {
    scores_[slot].fetch_add(1, std::memory_order_relaxed);
  } else {
    scores_[slot].store(clock, std::memory_order_relaxed);
  }
}

void CpuHashTable::Rehash(int64_t slots) {
  std::vector<int64_t> old_keys = std::move(keys_);
  std::vector<uint8_t> old_occupied = std::move(occupied_);
  std::vector<float> old_values = std::move(values_);
  std::unique_ptr<std::atomic<uint64_t>[]> old_scores = std::move(scores_);
  const int64_t width = RowWidth();
  keys_.assign(slots, 0);
  occupied_.assign(slots, 0);
  values_.assign(slots * width, 0.0f);
  scores_.reset(new std::atomic<uint64_t>[slots]);
  for (int64_t s = 0; s < slots; ++s) scores_[s].store(0, std::memory_order_relaxed);
  mask_ = slots - 1;
  for (size_t old = 0; old < old_occupied.size(); ++old) {
    if (!old_occupied[old]) continue;
    int64_t slot = Home(old_keys[old]);
    while (occupied_[slot]) slot = (slot + 1) & mask_;
    occupied_[slot] = 1;
    keys_[slot] = old_keys[old];
    scores_[slot].store(old_scores[old].load(std::memory_order_relaxed), std::memory_order_relaxed);
    std::memcpy(Row(slot), old_values.data() + old * width, width * sizeof(float));
  }
}

int64_t CpuHashTable::InsertNew(int64_t key) {
  int64_t slot = Home(key);
  while (occupied_[slot]) slot = (slot + 1) & mask_;
  occupied_[slot] = 1;
  keys_[slot] = key;
  float* row = Row(slot);
  initializer_.Fill(key, row, options_.dim);
  std::fill(row + options_.dim, row + RowWidth(), options_.state_initial_value);
  scores_[slot].store(0, std::memory_order_relaxed);
  ++size_;
  return slot;
}

void CpuHashTable::EraseSlot(int64_t slot) {
  // Backward-shift deletion: pull later entries of the probe run into the hole.
  const int64_t width = RowWidth();
  int64_t hole = slot;
  for (int64_t next = (hole + 1) & mask_; occupied_[next]; next = (next + 1) & mask_) {
    const int64_t home = Home(keys_[next]);
    const bool stays = hole <= next ? (hole < home && home <= next) : (hole < home || home <= next);
    if (stays) continue;
    keys_[hole] = keys_[next];
    scores_[hole].store(scores_[next].load(std::memory_order_relaxed), std::memory_order_relaxed);
    std::memcpy(Row(hole), Row(next), width * sizeof(float));
    hole = next;
  }
  occupied_[hole] = 0;
  --size_;
}

Status CpuHashTable::Reserve(int64_t incoming) {
  const int64_t overflow = size_ + incoming - options_.max_capacity;
  if (overflow > 0) {
    if (options_.evict == EvictStrategy::kNone || incoming > options_.max_capacity) {
      return Status::ResourceExhausted(
          "dynamic table is full: it holds " + std::to_string(size_) + " keys, " +
          std::to_string(incoming) + " new keys arrived and max_capacity is " +
          std::to_string(options_.max_capacity) +
          "; raise max_capacity or set evict_strategy ('lru' or 'lfu')");
    }
    // Evict the `overflow` lowest-scored keys.
    std::vector<std::pair<uint64_t, int64_t>> scored;
    scored.reserve(size_);
    for (int64_t s = 0; s <= mask_; ++s) {
      if (occupied_[s]) scored.emplace_back(scores_[s].load(std::memory_order_relaxed), keys_[s]);
    }
    std::nth_element(scored.begin(), scored.begin() + (overflow - 1), scored.end());
    for (int64_t v = 0; v < overflow; ++v) EraseSlot(FindSlot(scored[v].second));
  }
  if (static_cast<double>(size_ + incoming) > static_cast<double>(mask_ + 1) * kMaxLoad) {
    Rehash(SlotsFor(size_ + incoming));
  }
  return Status::Ok();
}

Status CpuHashTable::Lookup(const int64_t* keys, int64_t n, bool insert, float* values,
                            const ParallelFor& parallel_for) {
  const int64_t dim = options_.dim;
  const uint64_t clock = clock_.fetch_add(1) + 1;
  std::vector<uint8_t> missing(n, 0);
  bool any_missing = false;
  {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    std::atomic<bool> missed{false};
    parallel_for(n, 4 * dim + 100, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t slot = FindSlot(keys[i]);
        if (slot < 0) {
          missing[i] = 1;
          missed.store(true, std::memory_order_relaxed);
          continue;
        }
        std::memcpy(values + i * dim, Row(slot), dim * sizeof(float));
        if (insert) Touch(slot, clock);
      }
    });
    any_missing = missed.load();
  }
  if (!any_missing) return Status::Ok();
  if (!insert) {
    for (int64_t i = 0; i < n; ++i) {
      if (missing[i]) std::fill(values + i * dim, values + (i + 1) * dim, 0.0f);
    }
    return Status::Ok();
  }
  std::unique_lock<std::shared_mutex> lock(mutex_);
  // Another call may have inserted some of them meanwhile, and `keys` may repeat a key.
  std::vector<int64_t> new_keys;
  for (int64_t i = 0; i < n; ++i) {
    if (missing[i] && FindSlot(keys[i]) < 0) new_keys.push_back(keys[i]);
  }
  std::sort(new_keys.begin(), new_keys.end());
  new_keys.erase(std::unique(new_keys.begin(), new_keys.end()), new_keys.end());
  Status status = Reserve(static_cast<int64_t>(new_keys.size()));
  if (!status.ok()) return status;
  for (int64_t key : new_keys) InsertNew(key);
  for (int64_t i = 0; i < n; ++i) {
    if (!missing[i]) continue;
    const int64_t slot = FindSlot(keys[i]);
    std::memcpy(values + i * dim, Row(slot), dim * sizeof(float));
    Touch(slot, clock);
  }
  return Status::Ok();
}

Status CpuHashTable::Assign(const int64_t* keys, int64_t n, const float* values,
                            const float* state) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  std::vector<int64_t> new_keys;
  for (int64_t i = 0; i < n; ++i) {
    if (FindSlot(keys[i]) < 0) new_keys.push_back(keys[i]);
  }
  std::sort(new_keys.begin(), new_keys.end());
  new_keys.erase(std::unique(new_keys.begin(), new_keys.end()), new_keys.end());
  Status status = Reserve(static_cast<int64_t>(new_keys.size()));
  if (!status.ok()) return status;
  for (int64_t key : new_keys) InsertNew(key);
  const uint64_t clock = clock_.fetch_add(1) + 1;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t slot = FindSlot(keys[i]);
    float* row = Row(slot);
    std::memcpy(row, values + i * options_.dim, options_.dim * sizeof(float));
    if (state != nullptr) {
      std::memcpy(row + options_.dim, state + i * options_.state_dim,
                  options_.state_dim * sizeof(float));
    }
    Touch(slot, clock);
  }
  return Status::Ok();
}

void CpuHashTable::EnsureState(int64_t state_dim, float initial_value) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  if (options_.state_dim >= state_dim) return;
  const int64_t old_width = RowWidth(), dim = options_.dim, slots = mask_ + 1;
  std::vector<float> old_values = std::move(values_);
  options_.state_dim = state_dim;
  options_.state_initial_value = initial_value;
  values_.assign(slots * RowWidth(), initial_value);
  for (int64_t s = 0; s < slots; ++s) {
    if (occupied_[s]) std::memcpy(Row(s), old_values.data() + s * old_width, dim * sizeof(float));
  }
}

int64_t CpuHashTable::Erase(const int64_t* keys, int64_t n) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  int64_t erased = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t slot = FindSlot(keys[i]);
    if (slot >= 0) {
      EraseSlot(slot);
      ++erased;
    }
  }
  return erased;
}

void CpuHashTable::Export(std::vector<int64_t>* keys, std::vector<float>* values,
                          std::vector<float>* state) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  const int64_t dim = options_.dim, state_dim = options_.state_dim, width = RowWidth();
  keys->clear();
  values->clear();
  if (state) state->clear();
  for (int64_t s = 0; s <= mask_; ++s) {
    if (!occupied_[s]) continue;
    keys->push_back(keys_[s]);
    const float* row = values_.data() + s * width;
    values->insert(values->end(), row, row + dim);
    if (state) state->insert(state->end(), row + dim, row + dim + state_dim);
  }
}

}  // namespace sok
