// A dynamic table in GPU memory with the CPU table's contract (cpu_hash_table.h): int64 keys
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
// or arrays rebuilt or grown. Export synchronises to size its output. Every call is ordered on the stream it is given; the
// table's own mutex serialises callers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "kit_src/core/gpu_memory.h"
#include "kit_src/core/hash_table/cpu_hash_table.h"
#include "kit_src/core/status.h"

namespace sok {

// The keys of one call, in device memory: key i is data[i] (stride 1), or data[2 i + 1] of
// a (table, key) pair when data[2 i] == table (stride 2; the other pairs are skipped).
struct GpuKeys {
  const int64_t* data = nullptr;
  int64_t n = 0;
  int stride = 1;
  int64_t table = 0;
};

class GpuHashTable {
 public:
  // Allocates through `memory`, which must outlive the table.
  GpuHashTable(const HashTableOptions& options, const RowInitializer& initializer,
               GpuMemory* memory);
  ~GpuHashTable();
  GpuHashTable(const GpuHashTable&) = delete;
  GpuHashTable& operator=(const GpuHashTable&) = delete;

  // The allocation the constructor made; a table that failed it refuses every call.
  Status Init(cudaStream_t stream);

  int64_t dim() const { return options_.dim; }
  int64_t state_dim() const { return options_.state_dim; }

  // The live key count, written to *size_device (stream-ordered, no synchronisation).
  Status Size(int64_t* size_device, cudaStream_t stream);

  // values ([keys.n, dim], device) row i receives key i's row; a missing key is inserted with
  // its initial row when `insert` (admitted with `admit_probability`), else it reads as zeros.
  // Rows of pairs naming another table are left as they are.
  // When a find-or-insert evicts keys to make room and `evicted` is given, the evicted keys
  // and their rows (float32) go to the arrays evicted->allocate hands out for their count
  // (called once, only when the lookup evicts; device memory).
  struct Evicted {
    std::function<Status(int64_t count, int64_t** keys, float** values)> allocate;
    int64_t count = 0;
  };
  Status Lookup(const GpuKeys& keys, bool insert, float* values, float admit_probability,
                cudaStream_t stream, Evicted* evicted = nullptr);

  // Inserts or overwrites the values ([n, dim]) and, when `state` ([n, state_dim]) is not
  // null, the optimizer state of `keys` (distinct).
  Status Assign(const int64_t* keys, int64_t n, const float* values, const float* state,
                cudaStream_t stream);

  // As CpuHashTable::EnsureState.
  Status EnsureState(int64_t state_dim, float initial_value, cudaStream_t stream);

  // Replaces the whole content (all or nothing), as CpuHashTable::Replace.
  Status Replace(const int64_t* keys, int64_t n, const float* values, const float* state,
                 int64_t state_dim, cudaStream_t stream);

  // Removes the present keys; *erased_device (device) receives how many were.
  Status Erase(const int64_t* keys, int64_t n, int64_t* erased_device, cudaStream_t stream);

  // Hands out the output arrays for `n` keys: keys [n], values [n, dim], state
  // [n, state_dim] (state only when asked for), device memory.
  using ExportOutputs =
      std::function<Status(int64_t n, int64_t** keys, float** values, float** state)>;
  // Every key with its value (and state), in row order; with `written_after_us`, only rows
  // written since then (CpuHashTable::Export's rule). Synchronises twice.
  Status Export(int64_t written_after_us, bool with_state, const ExportOutputs& outputs,
                cudaStream_t stream);

  // One optimizer step (Sok>DynamicApply's rule and hyper-parameters, in device memory: the
  // kernels read them, no step waits for a copy) of the rows of `keys` ([n], duplicates
  // summed) with gradients `grads` ([n, dim]); missing keys are skipped, and so is every row
  // when the values need more state than the rows keep. Widens the state first (EnsureState).
  // Plain SGD on float rows of a multiple of 4 without state adds each use's share by atomics
  // (equal to summing duplicates first, up to float rounding); other rules claim rows.
  Status Apply(const std::string& rule, const float* hyper, int64_t hyper_count, bool nesterov,
               int64_t state_dim, float state_initial_value, const int64_t* keys, int64_t n,
               const float* grads, cudaStream_t stream);

  struct Counters;  // device-side counts (gpu_hash_table.cu)

 private:
  struct Exact {  // the counters as read on the host
    int64_t size = 0, used = 0, next_row = 0, free_count = 0;
  };
  Status ReadCounters(Exact* exact, cudaStream_t stream);
  // Makes room for the new keys among `keys` (admitted at `clock`): lowers the bounds, or
  // reads the counters and evicts, rebuilds or grows; fails (changing nothing) when full.
  Status Reserve(const GpuKeys& keys, float admit_probability, uint64_t clock,
                 cudaStream_t stream, Evicted* evicted = nullptr);
  Status CountNewKeys(const GpuKeys& keys, float admit_probability, uint64_t clock,
                      int64_t* count, cudaStream_t stream);
  Status Evict(int64_t count, int64_t next_row, cudaStream_t stream, Evicted* evicted);
  Status Rebuild(int64_t slots, int64_t next_row, cudaStream_t stream);
  Status GrowRows(int64_t rows, int64_t next_row, cudaStream_t stream);
  void SetBounds(const Exact& exact);
  // rows ([keys.n], device): each selected key's row, -1 when missing (or not admitted); with
  // `insert`, missing keys get rows (reserved first) initialised as new.
  // Without initial_values the fresh rows' values are left for the caller to write.
  Status FindOrInsert(const GpuKeys& keys, bool insert, float admit_probability,
                      uint64_t clock, uint32_t now, int64_t* rows, cudaStream_t stream,
                      bool initial_values = true);
  uint32_t StampNow() const;
  uint32_t StampAt(int64_t time_us) const;
  template <typename T>
  Status Scratch(int64_t count, T** out);
  void FreeScratch();

  HashTableOptions options_;
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
