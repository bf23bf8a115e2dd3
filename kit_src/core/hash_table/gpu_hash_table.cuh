// A dynamic table in GPU memory with the contract of dynamic_table.h: int64 keys
// over their whole range, float32 / float16 / bfloat16 rows with float32 optimizer state,
// initial rows from the same (seed, key) function, max_capacity with LRU / LFU eviction,
// growth, erase, export of everything or of the rows written since a moment, the
// low-frequency filter.
//
// Layout: a slot array maps keys to rows by open addressing with linear probing; a slot is
// 16 bytes (the key and its row number) and a slot's row word doubles as its state (empty,
// erased, being claimed) so no key value is reserved. Rows live in a dense pool: per row its
// key, a metadata word (live bit, eviction score, write stamp; table_math.h), the value and
// the optimizer state. Growing the slot array moves 16-byte slots only; erased rows go on a
// free list that inserts take from first, and erased slots are cleared when the slot array
// is rebuilt, which happens before they could crowd it (they count towards its load).
//
// No call synchronises while the table has room: the host keeps lower bounds on the room
// left (keys before max_capacity, slots before the load limit, rows in the pool), lowered by
// each call's key count. After each insert the counters are copied to pinned memory behind
// an event; when a bound runs out, the newest copy the stream has passed (less what later
// calls reserved) raises it again without waiting. Only when that leaves too little room are
// the exact counters read (one synchronisation), the call's new keys counted, and keys evicted
// or arrays rebuilt or grown. Export synchronises to size its output. Every call is ordered
// on the context's stream; the table's own mutex serialises callers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "kit_src/core/gpu_memory.h"
#include "kit_src/core/hash_table/dynamic_table.h"
#include "kit_src/core/hash_table/row_initializer.h"
#include "kit_src/core/status.h"

namespace sok {

class GpuHashTable final : public DynamicTable {
 public:
  // Allocates through `memory`, which must outlive the table.
  GpuHashTable(const HashTableOptions& options, const RowInitializer& initializer,
               GpuMemory* memory);
  ~GpuHashTable();
  GpuHashTable(const GpuHashTable&) = delete;
  GpuHashTable& operator=(const GpuHashTable&) = delete;

  // The allocation the constructor made; a table that failed it refuses every call.
  Status Init(cudaStream_t stream);

  // DynamicTable, in GPU memory, every call ordered on the context's stream. Size, Erase and
  // the lookups do not synchronise while the table has room; Export synchronises twice (its
  // row count sizes the outputs). Plain SGD on float rows of a multiple of 4 without state
  // adds each use's share by atomics (equal to summing duplicates first, up to float
  // rounding); other rules claim rows. ApplySparseUpdate reads the hyper-parameters in device memory (no step waits for a
  // copy): what the rule's type needs with any values is checked before anything runs, and
  // the kernel refuses values that need more state than the rows keep.
  bool in_device_memory() const override { return true; }
  SOK_DYNAMIC_TABLE_OPERATIONS;

  struct Counters;  // device-side counts (gpu_hash_table.cu)

 private:
  // The lookup behind Find (insert false) and FindOrInsert.
  Status Lookup(const TableKeys& keys, bool insert, float* values, float admit_probability,
                cudaStream_t stream, EvictedRows* evicted);
  // As CpuHashTable::EnsureState.
  Status EnsureState(int64_t state_dim, float initial_value, cudaStream_t stream);
  struct Exact {  // the counters as read on the host
    int64_t size = 0, used = 0, next_row = 0, free_count = 0;
  };
  Status ReadCounters(Exact* exact, cudaStream_t stream);
  // Makes room for the new keys among `keys` (admitted at `clock`): lowers the bounds, or
  // reads the counters and evicts, rebuilds or grows; fails (changing nothing) when full.
  Status Reserve(const TableKeys& keys, float admit_probability, uint64_t clock,
                 cudaStream_t stream, EvictedRows* evicted = nullptr);
  Status CountNewKeys(const TableKeys& keys, float admit_probability, uint64_t clock,
                      int64_t* count, cudaStream_t stream);
  // Evicts the `count` lowest-scored rows, none of `keep`'s keys (when given).
  Status Evict(int64_t count, int64_t next_row, cudaStream_t stream, EvictedRows* evicted,
               const TableKeys* keep = nullptr);
  // *lowest (scratch): the rows of the `count` lowest of `scores` ([n], row r's at r), lowest
  // first, equal scores by row.
  Status LowestRows(const uint64_t* scores, const int64_t* rows, int64_t n, int64_t count,
                    cudaStream_t stream, int64_t** lowest);
  Status Rebuild(int64_t slots, int64_t next_row, cudaStream_t stream);
  Status GrowRows(int64_t rows, int64_t next_row, cudaStream_t stream);
  void SetBounds(const Exact& exact);
  // rows ([keys.n], device): each selected key's row, -1 when missing (or not admitted); with
  // `insert`, missing keys get rows (reserved first) initialised as new.
  // Without initial_values the fresh rows' values are left for the caller to write.
  Status FindRows(const TableKeys& keys, bool insert, float admit_probability, uint64_t clock,
                  uint32_t now, int64_t* rows, cudaStream_t stream, bool initial_values = true);
  uint32_t StampNow() const;
  uint32_t StampAt(int64_t time_us) const;
  template <typename T>
  Status Scratch(int64_t count, T** out);
  void FreeScratch();

  RowInitializer initializer_;
  GpuMemory* memory_;
  std::mutex mutex_;
  Status init_status_;
  int64_t created_us_ = 0;
  uint64_t clock_ = 0;
  // Device arrays.
  Counters* counters_ = nullptr;
  void* slots_ = nullptr;           // [num_slots] (key, row) pairs
  int64_t num_slots_ = 0;           // a power of two
  int64_t row_capacity_ = 0;        // rows in the pool; each array has one more (row_capacity_
                                    // itself: where updates of missing keys go, never read)
  int64_t* row_keys_ = nullptr;     // [row_capacity_ + 1]
  uint64_t* row_meta_ = nullptr;    // [row_capacity_ + 1], 0 for a free row
  void* values_ = nullptr;          // [row_capacity_ + 1, dim] of the value type
  float* state_ = nullptr;          // [row_capacity_ + 1, state_dim]
  int64_t* free_rows_ = nullptr;    // [row_capacity_]
  void* row_claims_ = nullptr;      // [row_capacity_ + 1] per row the (head, uses) claim of
                                    // a running update, zero between updates
  // Lower bounds on the room left, exact after ReadCounters.
  int64_t spare_keys_ = 0, spare_slots_ = 0, spare_rows_ = 0;
  // Copies of the counters taken after inserts, and what calls reserved after each.
  struct Snapshot {
    Counters* host = nullptr;  // pinned
    cudaEvent_t taken = nullptr;
    bool pending = false;
    int64_t reserved_after = 0;
  };
  static constexpr int kSnapshots = 4;
  Snapshot snapshots_[kSnapshots];
  int next_snapshot_ = 0;
  // Raises the bounds from the newest snapshot the stream has passed; true if it found one.
  bool RefreshFromSnapshot();
  void TakeSnapshot(int64_t reserved, cudaStream_t stream);
  void DropSnapshots();
  std::vector<void*> scratch_;      // this call's scratch, freed (stream-ordered) at its end
};

}  // namespace sok
