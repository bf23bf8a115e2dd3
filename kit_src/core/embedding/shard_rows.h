// The owner's side of a lookup: read the rows that packed keys name from the local shards of
// the group's tables, and route the rows' gradients back to the table each key names.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kit_src/core/embedding/packed_key.h"
#include "kit_src/core/parallel.h"
#include "kit_src/core/status.h"

namespace sok {

// One table's local shard: [rows, dim] row-major, host memory.
template <typename T>
struct ShardView {
  const T* data = nullptr;
  int64_t rows = 0;
};

// Fails unless every packed key names a row of one of the shards.
template <typename T>
Status ValidatePackedKeys(const std::vector<ShardView<T>>& shards, const int64_t* keys, int64_t n);

// Row p of the logical matrix of keys' rows, read in place from the shards (for pooling
// straight from the tables when no exchange needs the rows gathered first).
template <typename T>
struct PackedKeyRows {
  const int64_t* keys;      // [n] packed keys, validated
  const T* const* bases;    // per table: its shard's first row
  int64_t dim;
  const T* operator()(int64_t p) const {
    return bases[PackedTable(keys[p])] + PackedRow(keys[p]) * dim;
  }
};

// out[i] = shards[PackedTable(keys[i])] row PackedRow(keys[i]); out is [n, dim].
template <typename T>
Status GatherShardRows(const std::vector<ShardView<T>>& shards, int64_t dim, const int64_t* keys,
                       int64_t n, T* out, const ParallelFor& parallel_for);

// A lookup whose samples hold exactly one id each, on one worker: sample i's output is row
// ids[i] of its table, whatever the combiner, with no dedup and no exchange.
template <typename T, typename Tindex>
struct SingleIdLookup {
  const Tindex* ids = nullptr;  // [count] rows of the table
  int64_t count = 0;
  const ShardView<T>* table = nullptr;
  const std::string* table_name = nullptr;  // for the out-of-range error
  T* output = nullptr;          // [count, dim]
};

// Fills every lookup's output; fails with IdOutOfRange, before writing, on an id outside
// its table.
template <typename T, typename Tindex>
Status GatherSingleIds(const std::vector<SingleIdLookup<T, Tindex>>& lookups, int64_t dim,
                       const ParallelFor& parallel_for);

// counts[t] = number of keys naming table t; fails on a key naming no table of `num_tables`.
Status CountKeysPerTable(const int64_t* keys, int64_t n, int32_t num_tables,
                         std::vector<int64_t>* counts);

// For keys laid out table by table (one worker's send buffer): first[t] is where table t's
// keys start and counts[t] how many there are. Fails if the keys are not grouped by table.
Status TableBlocks(const int64_t* keys, int64_t n, int32_t num_tables,
                   std::vector<int64_t>* first, std::vector<int64_t>* counts);

// Where each table's keys start, from one count a table given with the keys: first[t].
// Fails on a negative count or counts that do not add up to the n keys.
Status TableFirstsOfCounts(const int32_t* counts, int32_t num_tables, int64_t n,
                           std::vector<int64_t>* first);

// Where a gradient split by table goes (Sok>SplitGradientByTable's outputs on either device).
class TableGradientOutputs {
 public:
  virtual ~TableGradientOutputs() = default;
  // Table t's keys are rows [first, first + count) of the keys and the gradient: its indices
  // to fill, and its values handed out as that block of the gradient without a copy where
  // possible (*values null), else rows to fill with the block.
  virtual Status Block(int64_t t, int64_t first, int64_t count, int64_t** indices,
                       float** values) = 0;
  // New outputs for table t's `count` keys.
  virtual Status Table(int64_t t, int64_t count, int64_t** indices, float** values) = 0;
};

// Splits keys ([n] packed keys) and grad ([n, dim]) by the table each key names into
// `outputs`. given_first (TableFirstsOfCounts, or empty) says where each table's block starts
// when the caller knows the keys come grouped by table; fails when they do not.
Status SplitGradientByTable(const int64_t* keys, int64_t n, int64_t dim, const float* grad,
                            int32_t num_tables, const std::vector<int64_t>& given_first,
                            TableGradientOutputs* outputs, const ParallelFor& parallel_for);

// Splits the rows' gradient ([n, dim]) by table: for table t, indices[t] receives the local
// rows and values[t] ([counts[t], dim]) their gradients, in key order.
template <typename T>
void SplitGradientByTable(const int64_t* keys, int64_t n, int64_t dim, const T* grad,
                          const std::vector<int64_t*>& indices, const std::vector<T*>& values,
                          const ParallelFor& parallel_for);

}  // namespace sok
