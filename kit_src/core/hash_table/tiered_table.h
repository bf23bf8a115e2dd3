// A dynamic table over two tiers: a budgeted hot table (GPU memory on a GPU) holds the rows
// in use, with their optimizer state, and a host table holds the rest. A row lives in exactly
// one tier. Every find-or-insert first brings the batch's rows into the hot tier: the hot
// table marks the batch's keys it lacks and counts its uses of its own keys; keys new to the
// whole table are admitted and initialised by the host table, which keeps the whole table's
// max_capacity (it holds the coldest rows, so the keys it evicts are the whole table's least
// used); when the hot tier is full, its least-used rows other than the batch's move down to
// the host with their state (write-back), a sixteenth of the budget at once so that the sort
// that picks them runs rarely; then the batch's host rows move up. The hot tier ranks rows by
// use count, halved each time as many rows as it holds have moved down, and among equal
// counts the most recently written go first: often-used rows stay hot, rows used once pass
// through, and rows used often long ago give way. Updates run on the hot tier, where the batch's
// rows are, at the hot table's speed; an update of a row that moved down since its lookup is
// applied on the host. Moving a row copies its floats, so the tiers change where a row
// lives, never its value.
//
// Only the batch's misses cross to the host: the hot table says which keys it lacks, and
// the host table's work is on those. Calls take and hand out pointers in the hot tier's
// memory; `TierMemory` copies between it and the host.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <vector>

#include "kit_src/core/hash_table/cpu_hash_table.h"
#include "kit_src/core/hash_table/dynamic_table.h"
#include "kit_src/core/status.h"

namespace sok {

// Memory of the hot tier as the tiered table sees it: allocations and copies to and from
// the host, each finished (on the context's stream) before it returns.
class TierMemory {
 public:
  virtual ~TierMemory() = default;
  virtual Status Allocate(int64_t bytes, void** out) = 0;
  virtual void Free(void* pointer) = 0;
  virtual Status ToHost(void* host, const void* hot, int64_t bytes,
                        const TableContext& context) = 0;
  virtual Status FromHost(void* hot, const void* host, int64_t bytes,
                          const TableContext& context) = 0;
  virtual Status Copy(void* to, const void* from, int64_t bytes, const TableContext& context) = 0;
  // Host memory that calls reuse for their copies: pinned on a GPU, so copies run at the
  // link's speed, and kept, so no call pays for fresh pages.
  virtual Status AllocateHost(int64_t bytes, void** out) = 0;
  virtual void FreeHost(void* pointer) = 0;
  // out row positions[j] = rows row j (count rows of dim; positions and rows on the host).
  virtual Status ScatterRows(float* out, const int64_t* positions, const float* rows,
                             int64_t count, int64_t dim, const TableContext& context) = 0;
  // The selected keys of `keys` that `flags` (one a key, in hot memory) marks, on the host:
  // with `distinct`, sorted and each once; otherwise one a flagged key, in any order, with
  // its index in the call in `positions` (when not null). Only these cross to the host.
  virtual Status Flagged(const TableKeys& keys, const uint8_t* flags, bool distinct,
                         std::vector<int64_t>* out, std::vector<int64_t>* positions,
                         const TableContext& context) = 0;
  // How many keys of `keys` are selected (all but another table's, with stride 2) and how
  // many of those `flags` (one a key, in hot memory) marks, read back with one wait: the
  // one host decision a call whose rows are all hot needs.
  virtual Status Tally(const TableKeys& keys, const uint8_t* flags, int64_t* selected,
                       int64_t* flagged, const TableContext& context) = 0;
};

// Hot-tier memory for one call, freed when it ends.
class TierScratch {
 public:
  explicit TierScratch(TierMemory* memory) : memory_(memory) {}
  ~TierScratch() {
    for (void* pointer : owned_) memory_->Free(pointer);
  }
  TierScratch(const TierScratch&) = delete;
  TierScratch& operator=(const TierScratch&) = delete;
  template <typename T>
  Status Get(int64_t count, T** out) {
    void* pointer = nullptr;
    SOK_RETURN_IF_ERROR(memory_->Allocate(std::max<int64_t>(count, 1) * sizeof(T), &pointer));
    owned_.push_back(pointer);
    *out = static_cast<T*>(pointer);
    return Status::Ok();
  }

 protected:
  TierMemory* memory_;

 private:
  std::vector<void*> owned_;
};

// Both tiers in host memory: what a CPU device runs, and how the tier logic is tested
// without a GPU.
std::unique_ptr<TierMemory> NewHostTierMemory();
class GpuMemory;
// Owns `memory`, the allocator the hot table draws from.
std::unique_ptr<TierMemory> NewGpuTierMemory(std::shared_ptr<GpuMemory> memory);  // tier_memory_gpu.cu

// The hot table's options: as many rows as `hot_bytes` holds without state, no eviction of
// its own (the tiered table makes room before it inserts).
HashTableOptions HotTierOptions(const HashTableOptions& options, int64_t hot_bytes);
// The host table's options: the whole table's, its rows pooled (rows for the keys it holds,
// not for its slots: the keys that spill to host memory are the table's bulk).
HashTableOptions ColdTierOptions(const HashTableOptions& options);
// Whether `hot_bytes` holds max_capacity rows with the widest state a rule keeps (3 x dim):
// then the table needs no host tier.
bool BudgetHoldsTable(const HashTableOptions& options, int64_t hot_bytes);
// Fails, naming the budget, when it holds no row.
Status CheckHotBudget(const HashTableOptions& options, int64_t hot_bytes);

class TieredTable final : public DynamicTable {
 public:
  // `hot` (built with HotTierOptions) and `cold` (built with ColdTierOptions) are
  // empty; `memory` is hot's memory.
  TieredTable(const HashTableOptions& options, int64_t hot_bytes, std::shared_ptr<DynamicTable> hot,
              std::unique_ptr<CpuHashTable> cold, std::unique_ptr<TierMemory> memory);
  ~TieredTable() override;

  bool in_device_memory() const override { return hot_->in_device_memory(); }
  SOK_DYNAMIC_TABLE_OPERATIONS;
  bool Tiers(TierCounts* counts, const TableContext& context) override;

  // Rows the hot tier holds at the current row width (value and state).
  int64_t hot_row_budget() const;
  int64_t hot_size() const { return hot_size_; }  // exact after ExactHotSize
  int64_t cold_size() const { return cold_->size(); }

  // Bytes of a row of `dim` values of `value_type` and `state_dim` floats of state.
  static int64_t RowBytes(int64_t dim, ValueType value_type, int64_t state_dim);

 private:
  // Hot-tier scratch freed at scope end.
  class HotBuffer;
  // Reads the hot tier's key count (one wait for the stream) when only a bound is known.
  Status ExactHotSize(const TableContext& context);
  // While the host tier is empty and `incoming` more keys fit the hot tier (and
  // max_capacity), the hot table serves calls alone, as a one-tier table: nothing crosses to
  // the host and nothing waits. False (with an exact hot size) otherwise.
  Status HotTierAlone(int64_t incoming, const TableContext& context, bool* alone);
  // Whether every selected key of `keys` is in the hot tier (the common case once a working
  // set is hot): the hot table's absent flags (kept in `buffer` for Split), tallied where
  // they are; `selected` counts the keys.
  Status AllHot(const TableKeys& keys, HotBuffer* buffer, uint8_t** hot_flags, bool* all_hot,
                int64_t* selected, const TableContext& context, int64_t* absent_ids = nullptr);
  // The distinct keys of the call that the hot tier holds (`hot_flags` as AllHot's).
  Status DistinctHotKeys(const TableKeys& keys, const uint8_t* hot_flags, int64_t* count,
                         const TableContext& context);
  // The selected keys of `keys` on the host, with absent[j] = 1 where the hot tier lacks
  // key[j] (a call's keys and flags; `position` j's index in the call). `hot_flags`: the hot
  // table's absent flags when AllHot has them, else null (asked here).
  Status Split(const TableKeys& keys, const uint8_t* hot_flags, std::vector<int64_t>* key,
               std::vector<uint8_t>* absent, std::vector<int64_t>* position,
               const TableContext& context);
  // How many hot rows to move down so that `incoming` more fit: the overflow and a sixteenth
  // of the budget more, none of the batch's `keep` (fewer than the overflow: no room).
  int64_t DemoteCount(int64_t incoming, int64_t keep) const;
  // Moves the `count` least used hot rows, none of `keep`'s keys, to the host: their copy
  // down before it returns, their insertion into the host table in the background
  // (`write_back_`).
  Status Demote(int64_t count, const TableKeys& keep, const TableContext& context);
  // The misses' rows on their way up (keys distinct, on the host, none hot), in the staging
  // buffers.
  struct RowsUp {
    float* values = nullptr;
    float* state = nullptr;
    uint8_t* found = nullptr;  // held or admitted: moves up
    int64_t state_dim = 0;
  };
  // The host table's TakeOrAdmit of a lookup's distinct misses into `up`.
  Status TakeUp(const std::vector<int64_t>& keys, float admit_probability,
                EvictedRows* evicted, RowsUp* up, const TableContext& context);
  // Inserts the rows of `up` into the hot table.
  Status MoveUp(const std::vector<int64_t>& keys, const RowsUp& up, const TableContext& context);
  // Returns the rows of `up` to the host table (when making room in the hot table failed).
  Status PutBack(const std::vector<int64_t>& keys, const RowsUp& up,
                 const TableContext& context);
  // Writes `count` rows of host arrays (keys, values [count, dim], state [count, state_dim]
  // when `with_state`) into the hot table.
  Status AssignHot(const int64_t* keys, const float* values, const float* state, int64_t count,
                   bool with_state, const TableContext& context);
  // Host staging arrays that calls reuse (TierMemory::AllocateHost): `count` elements of
  // array `which`, grown when too small (its contents are not kept).
  enum Staging { kUpValues, kUpState, kUpFound, kDownKeys, kDownValues, kDownState, kStagings };
  template <typename T>
  Status Stage(Staging which, int64_t count, T** out);
  // The host table may hold what the hot tier leaves of max_capacity.
  void LendCapacity() { cold_->SetMaxCapacity(options_.max_capacity - hot_size()); }
  // Widens the host table's state to the hot table's.
  Status MatchColdState(const SparseUpdate& update, const TableContext& context);
  // Copies host rows to the caller's evicted output (in hot memory).
  Status HandOutEvicted(const std::vector<int64_t>& keys, const std::vector<float>& values,
                        EvictedRows* evicted, const TableContext& context);

  int64_t hot_bytes_;
  std::shared_ptr<DynamicTable> hot_;
  std::unique_ptr<CpuHashTable> cold_;
  std::unique_ptr<TierMemory> memory_;
  void* staging_[kStagings] = {};
  int64_t staging_bytes_[kStagings] = {};
  std::mutex mutex_;
  // The hot tier's key count: exact, or (after calls that let the hot table insert) an
  // upper bound that ExactHotSize reads back.
  int64_t hot_size_ = 0;
  bool hot_size_exact_ = true;
  TierCounts counts_;  // the movement counts; the key counts are filled in by Tiers
  // The host table's insertion of the rows last moved down (from the kDown staging arrays),
  // when one may still run: every call but a hot update waits for it before it reads the
  // host tier or the staging.
  std::future<Status> write_back_;
  std::function<Status()> pending_write_back_;  // that insertion, to retry should it fail
  int64_t write_back_ns_ = 0;  // its time, written by it and read once it is joined
  Status FinishWriteBack();
  int64_t moved_since_aging_ = 0;  // rows moved down since the hot tier's counts last halved
};

}  // namespace sok
