// The interface every dynamic table implements (CpuHashTable in host memory, GpuHashTable in
// GPU memory), so the ops, and any table kind to come, see one contract: int64 keys over their
// whole range to float rows with the optimizer's state beside them, created on first use from
// a (seed, key) initializer, bounded by max_capacity with LRU / LFU eviction.
//
// Every pointer a call takes or hands out lies in the table's memory (`in_device_memory()`):
// host memory for a host table, the GPU's for a GPU table. Outputs whose size depends on the
// data (exported rows, evicted rows) come from callbacks the caller supplies, called once the
// size is known. A call runs on its context: a GPU table's work is enqueued on the context's
// stream (nothing waits for it unless documented), a host table's work is split by the
// context's ParallelFor.
#pragma once

#include <climits>
#include <cstdint>
#include <functional>
#include <string>

#include "kit_src/core/hash_table/table_math.h"
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
  ValueType value_type = ValueType::kFloat32;  // storage of each row's value
  // Host table: rows for the keys held, each slot naming its row (memory), rather than a
  // row per slot found from the slot's position (speed: a probe fetches slot and row at
  // once). A tiered table's host tier pools its rows.
  bool pooled_rows = false;
  // Eviction among keys of equal score: the most recently written first (the hot tier of a
  // tiered table: of rows used equally often, one that just arrived is the likelier to be
  // used once), rather than in table order.
  bool evict_newest_of_equals = false;
};

// Where a table call runs: the GPU stream (a cudaStream_t) for a GPU table, the threads for a
// host table.
struct TableContext {
  void* stream = nullptr;
  ParallelFor parallel_for = SerialFor;
};

// The keys of one call: key i is data[i] (stride 1), or data[2 i + 1] of a (table, key) pair
// when data[2 i] == table (stride 2; the call leaves the other pairs' rows as they are).
struct TableKeys {
  const int64_t* data = nullptr;
  int64_t n = 0;
  int stride = 1;
  int64_t table = 0;
};

#ifdef __CUDACC__
#define SOK_TABLE_KEYS_FN __host__ __device__ __forceinline__
#else
#define SOK_TABLE_KEYS_FN inline
#endif

// Whether key i of `keys` is the call's (stride 2: of its table), and which.
SOK_TABLE_KEYS_FN bool KeyAt(const TableKeys& keys, int64_t i, int64_t* key) {
  if (keys.stride == 1) {
    *key = keys.data[i];
    return true;
  }
  if (keys.data[2 * i] != keys.table) return false;
  *key = keys.data[2 * i + 1];
  return true;
}

// Hands out the arrays for `count` evicted keys and their rows ([count, dim], float32);
// called at most once, only when a find-or-insert evicts. With `allocate_state`, called
// after `allocate`, the rows' optimizer state ([count, state_dim]) is handed out too.
struct EvictedRows {
  std::function<Status(int64_t count, int64_t** keys, float** values)> allocate;
  std::function<Status(int64_t count, float** state)> allocate_state;
  int64_t count = 0;  // set by the call
};

// Hands out the output arrays for `n` exported keys: keys [n], values [n, dim], state
// [n, state_dim] (only when state is asked for).
using ExportOutputs =
    std::function<Status(int64_t n, int64_t** keys, float** values, float** state)>;

// One optimizer step of a table's rows (Sok>DynamicApply's rule and hyper-parameters).
struct SparseUpdate {
  std::string rule;
  const float* hyper = nullptr;  // [hyper_count]
  int64_t hyper_count = 0;
  bool nesterov = false;
  int64_t state_dim = 0;            // floats of state a row needs for the rule
  float state_initial_value = 0.0f;  // a new state's first dim floats
  const int64_t* keys = nullptr;    // [n], duplicates summed
  int64_t n = 0;
  const float* grads = nullptr;     // [n, dim]
};

// Where a tiered table's rows are and how they moved (tiered_table.h), counted since creation.
struct TierCounts {
  int64_t hot_keys = 0, host_keys = 0;
  int64_t ids_looked_up = 0;  // ids of the find-or-inserts (training lookups)
  int64_t hot_hits = 0;       // of them, ids the hot tier served with no row moving up
  int64_t moved_up = 0, moved_down = 0;  // rows moved host -> hot and hot -> host
  // Nanoseconds the training lookups took, and of them the miss path's stages: the host
  // table's take of the misses (with admission and eviction), the rows moving down (the hot
  // tier's eviction and the copies down; the host inserts are write_back_ns) and the rows moving
  // up (copies and the hot tier's inserts). Each includes the waits for the GPU it makes.
  int64_t lookup_ns = 0, take_up_ns = 0, move_down_ns = 0, move_up_ns = 0;
  // The host inserts of the rows moved down, run beside the step, and the time calls spent
  // waiting for them (the part of the inserts the step did not hide).
  int64_t write_back_ns = 0, write_back_wait_ns = 0;
};

class DynamicTable {
 public:
  explicit DynamicTable(const HashTableOptions& options) : options_(options) {}
  virtual ~DynamicTable() = default;

  const HashTableOptions& options() const { return options_; }
  int64_t dim() const { return options_.dim; }
  int64_t state_dim() const { return options_.state_dim; }
  int64_t max_capacity() const { return options_.max_capacity; }
  virtual bool in_device_memory() const = 0;

  // The live key count, written to *size.
  virtual Status Size(int64_t* size, const TableContext& context) = 0;

  // values ([keys.n, dim]) row i receives key i's row; a missing key reads as zeros and is not
  // stored. A read only: eviction scores do not change.
  virtual Status Find(const TableKeys& keys, float* values, const TableContext& context) = 0;

  // As Find, but a missing key is inserted with its initial row (admitted with
  // `admit_probability`, drawn per key and call: the low-frequency filter; one not admitted
  // reads as zeros), and each key counts as a use for eviction scores. Beyond max_capacity
  // the lowest-scored keys are evicted (to `evicted` when given) or, with no eviction, the
  // call fails with ResourceExhausted and changes nothing.
  virtual Status FindOrInsert(const TableKeys& keys, float* values, float admit_probability,
                              EvictedRows* evicted, const TableContext& context) = 0;

  // Inserts or overwrites the values ([n, dim]) and, when `state` ([n, state_dim]) is not
  // null, the optimizer state of `keys` (distinct).
  virtual Status InsertOrAssign(const int64_t* keys, int64_t n, const float* values,
                                const float* state, const TableContext& context) = 0;

  // Replaces the whole content with `keys`, `values` ([n, dim]) and `state` ([n, state_dim],
  // or null for initial state), widening the state first; all or nothing.
  virtual Status Replace(const int64_t* keys, int64_t n, const float* values,
                         const float* state, int64_t state_dim,
                         const TableContext& context) = 0;

  // Removes the keys that are present; *erased receives how many were.
  virtual Status Erase(const int64_t* keys, int64_t n, int64_t* erased,
                       const TableContext& context) = 0;

  // Every key with its value (and state when asked for); with `written_after_us`, only the
  // rows last written (inserted, assigned or updated) after that time, in microseconds since
  // the Unix epoch, kept to the millisecond.
  virtual Status Export(int64_t written_after_us, bool with_state, const ExportOutputs& outputs,
                        const TableContext& context) = 0;

  // Widens the state first; keys missing (evicted since their lookup) are skipped. Fails,
  // changing nothing, when the rule does not fit `update.state_dim`.
  virtual Status ApplySparseUpdate(const SparseUpdate& update, const TableContext& context) = 0;

  // Removes the present keys among `keys` (distinct) and hands out their rows: values
  // ([n, dim], widened), state ([n, state_dim], or null to drop it) and found[i] (1 when key i
  // was present); a missing key's rows read as zeros. How a row moves between tables.
  virtual Status Take(const int64_t* keys, int64_t n, float* values, float* state,
                      uint8_t* found, const TableContext& context) = 0;

  // absent[i] = 1 when key i is selected and not held, else 0 ([keys.n] bytes). A read only.
  virtual Status Absent(const TableKeys& keys, uint8_t* absent, const TableContext& context) = 0;

  // Removes the `count` lowest-scored keys other than the selected keys of `keep` (all of
  // those, when fewer are held) and hands them out with their values and state (`outputs` is
  // called once, with the count removed).
  virtual Status EvictLowest(int64_t count, const TableKeys& keep, const ExportOutputs& outputs,
                             const TableContext& context) = 0;

  // With LFU scores, halves every key's use count, so that keys used often long ago give way
  // to keys in use now; other scores stay as they are.
  virtual Status AgeScores(const TableContext& context) = 0;

  // A tiered table's counts; false for a table of one tier.
  virtual bool Tiers(TierCounts* counts, const TableContext& context) { return false; }

 protected:
  HashTableOptions options_;  // state_dim and state_initial_value change as the state widens
};

// Declares DynamicTable's operations in the body of a class that implements them.
#define SOK_DYNAMIC_TABLE_OPERATIONS                                                        \
  Status Size(int64_t* size, const TableContext& context) override;                         \
  Status Find(const TableKeys& keys, float* values, const TableContext& context) override;  \
  Status FindOrInsert(const TableKeys& keys, float* values, float admit_probability,        \
                      EvictedRows* evicted, const TableContext& context) override;          \
  Status InsertOrAssign(const int64_t* keys, int64_t n, const float* values,                \
                        const float* state, const TableContext& context) override;          \
  Status Replace(const int64_t* keys, int64_t n, const float* values, const float* state,   \
                 int64_t state_dim, const TableContext& context) override;                  \
  Status Erase(const int64_t* keys, int64_t n, int64_t* erased,                             \
               const TableContext& context) override;                                       \
  Status Export(int64_t written_after_us, bool with_state, const ExportOutputs& outputs,    \
                const TableContext& context) override;                                      \
  Status ApplySparseUpdate(const SparseUpdate& update, const TableContext& context) override; \
  Status Take(const int64_t* keys, int64_t n, float* values, float* state, uint8_t* found,  \
              const TableContext& context) override;                                       \
  Status Absent(const TableKeys& keys, uint8_t* absent, const TableContext& context) override; \
  Status EvictLowest(int64_t count, const TableKeys& keep, const ExportOutputs& outputs,     \
                     const TableContext& context) override;                                  \
  Status AgeScores(const TableContext& context) override

inline constexpr int64_t kExportAll = INT64_MIN;  // Export's written_after_us: every row

}  // namespace sok
