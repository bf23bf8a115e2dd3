// CUDA twins of the dynamic tables' key handling in key_partition.h (pair_keys) and of
// Sok>SplitDynamicGradient: ids travel as (table, id) pairs because a hash table's ids use all
// 64 bits. Scratch comes from the caller; no function here synchronises.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kit_src/core/embedding/lookup_gpu.cuh"
#include "kit_src/core/optimizers/sparse_apply.cuh"

namespace sok {

// The ids of every lookup sorted by (owner worker, table, id), with the run heads scanned.
struct SortedPairKeys {
  uint32_t* group = nullptr;         // [total] (worker << table_bits) | table, sorted
  int64_t* ids = nullptr;            // [total] the ids in the same order
  int32_t* order = nullptr;          // [total] each sorted id's index among all lookups' ids
  int32_t* slot = nullptr;           // [total] inclusive scan of the run heads
  int64_t* worker_counts = nullptr;  // [num_workers] heads per worker
};

// Phase 1 of Sok>PartitionKeys with pair_keys: two stable radix sorts (by id, then by worker
// and table) and the heads of equal (table, id) runs (every item without dedup). A dynamic
// table's id belongs to worker uint64(id) % num_workers, or to the table's owner when
// localized. The unique count is slot[total - 1].
cudaError_t SortPairKeys(const GpuPartitionLookup* lookups_device, int32_t num_lookups,
                         bool ids64, int64_t total, int32_t num_workers, int table_bits,
                         bool dedup, const DeviceAllocate& allocate, SortedPairKeys* out,
                         cudaStream_t stream);

// Phase 2: send_pairs ([unique, 2]) = (table, id) at each head; position[order[k]] = the
// head's index.
cudaError_t ScatterPairKeys(const SortedPairKeys& sorted, int64_t total, int table_bits,
                            int64_t* send_pairs, int32_t* position, cudaStream_t stream);

// The pairs ([n, 2]) grouped by table: counts[t] ([num_tables]) pairs name table t and
// order ([n]) lists the pairs table by table, stably. A pair naming no table is recorded in
// check (kBadKey, item = pair, value_a = its table).
cudaError_t GroupPairsByTable(const int64_t* pairs, int64_t n, int32_t num_tables,
                              const DeviceAllocate& allocate, int64_t* counts, int32_t* order,
                              LookupCheck* check, cudaStream_t stream);

// indices[k] = id of pair order[k], values row k = grad row order[k].
cudaError_t GatherPairRows(const int64_t* pairs, const int32_t* order, int64_t n, int64_t dim,
                           const float* grad, int64_t* indices, float* values,
                           cudaStream_t stream);

}  // namespace sok
