// Input distribution of a fused lookup: the ids of every lookup in a group are deduplicated
// per table, mapped to the worker that owns them and to the row inside that worker's shard,
// and laid out grouped by destination worker (then by table) for one all-to-all.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kit_src/core/block_pool.h"
#include "kit_src/core/parallel.h"
#include "kit_src/core/status.h"

namespace sok {

// Where a static table's rows live.
struct TablePlacement {
  int64_t rows = 0;       // rows of the whole (global) table; valid ids are [0, rows)
  int32_t owner = -1;     // -1: distributed, row r on worker r % num_workers at local row
                          // r / num_workers; >= 0: localized, every row on that worker
  std::string name;       // for error messages
  bool dynamic = false;   // hash table: any int64 id is valid, owner uint64(id) % num_workers
};

// The placements of the tables an op's attrs describe (one entry of rows, owners, names and,
// unless empty, dynamic a table); fails on lists of other lengths or an owner beyond the
// workers.
Status PlaceTables(const std::vector<int64_t>& rows, const std::vector<int64_t>& owners,
                   const std::vector<std::string>& names, const std::vector<bool>& dynamic,
                   int64_t num_workers, std::vector<TablePlacement>* tables);

// The ids of one lookup (host memory, `count` entries) and the table they index.
template <typename Tindex>
struct LookupIds {
  const Tindex* ids = nullptr;
  int64_t count = 0;
  int32_t table = 0;
};

struct PartitionOptions {
  int32_t num_workers = 1;  // workers taking part in the all-to-all
  bool dedup = true;        // send each (table, id) once per step instead of once per use
  bool pair_keys = false;   // send (table, id) pairs instead of PackKey(table, local row),
                            // for dynamic tables whose ids need all 64 bits
};

struct PartitionResult {
  ScratchVector<int64_t> send_keys;      // [K] PackKey(table, local row), or [K, 2] (table, id)
                                        // pairs with pair_keys; grouped by worker
  std::vector<int64_t> splits;          // [num_workers] keys sent to each worker
  ScratchVector<int32_t> position;      // [sum of counts] where each id's row is in send_keys
};

// One ids input of a partition as the ops hand it over (host or device memory, by device;
// int64, or int32 on the CPU).
struct PartitionInput {
  const void* ids = nullptr;
  int64_t count = 0;
  int64_t first = 0;  // where its ids start among all inputs' ids
  int32_t table = 0;
};

// Makes a partition's outputs once their sizes are known: the unique keys, the keys for each
// worker (splits) and, on one worker, each table's key count (empty otherwise); returns where
// the keys and the positions go.
using AllocatePartition = std::function<Status(
    int64_t unique_keys, const std::vector<int32_t>& splits,
    const std::vector<int32_t>& table_counts, int64_t** send_keys, int32_t** position)>;

// The bit widths of the GPU's sort keys (rows, tables) for these tables.
struct PartitionKeyBits {
  int row_bits = 0;
  int table_bits = 0;
};

// The widths for `tables` and `options`. on_gpu: the GPU sorts keys of these widths, so they
// must fit its sort key (64 bits with the worker, or pair keys' (worker, table) in 32); fails
// naming the counts that do not.
Status PartitionKeyWidths(const std::vector<TablePlacement>& tables,
                          const PartitionOptions& options, bool on_gpu, PartitionKeyBits* bits);

// The error for an id outside [0, rows) of a static table: names the table, the id and the
// valid range.
Status IdOutOfRange(const std::string& table_name, int64_t id, int64_t rows);

// IdOutOfRange for the first of `n` ids outside [0, rows), checked in shards run by
// `parallel_for`; OK when all are inside. With copy_to, the ids are also copied there in the
// same pass (its contents are unspecified on an error).
template <typename Tindex>
Status CheckIdsInRange(const Tindex* ids, int64_t n, int64_t rows, const std::string& table_name,
                       const ParallelFor& parallel_for, Tindex* copy_to = nullptr);

// Fills `result`. Fails with InvalidArgument naming the table, the id and the valid range
// when an id is outside [0, rows) of its table; `result` is then unspecified.
template <typename Tindex>
Status PartitionKeys(const std::vector<LookupIds<Tindex>>& lookups,
                     const std::vector<TablePlacement>& tables, const PartitionOptions& options,
                     const ParallelFor& parallel_for, PartitionResult* result);

// PartitionKeys of the ops' inputs (int64 ids, or int32 with !ids64) into the outputs
// `allocate` makes once their sizes are known: with one worker and packed keys, each table's
// key count too. The twin of PartitionKeysGpu (lookup_steps_gpu.cuh).
Status PartitionKeysInto(const std::vector<PartitionInput>& inputs, bool ids64,
                         const std::vector<TablePlacement>& tables,
                         const PartitionOptions& options, const ParallelFor& parallel_for,
                         const AllocatePartition& allocate);

// The owner's side of pair keys ([n, 2] (table, id) pairs; pair_keys_gpu.cuh has the CUDA
// twins): counts[t] ([num_tables]) pairs name table t and order ([n]) lists the pairs table by
// table, stably. Returns the index of the first pair naming no table, or -1 when there is none
// (counts and order are then unspecified).
int64_t GroupPairsByTable(const int64_t* pairs, int64_t n, int32_t num_tables, int64_t* counts,
                          int32_t* order);

// indices[k] = id of pair order[k], values row k = grad row order[k] ([n, dim]).
void GatherPairRows(const int64_t* pairs, const int32_t* order, int64_t n, int64_t dim,
                    const float* grad, int64_t* indices, float* values);

}  // namespace sok
