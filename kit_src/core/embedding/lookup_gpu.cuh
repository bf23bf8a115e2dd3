// CUDA twins of the fused lookup's core (key_partition.h, shard_rows.h, combine.h): the same
// layouts and results on device pointers and a stream. No function here synchronises; bad
// input is recorded in a device-side LookupCheck (the first bad item wins), every kernel after
// the check skips its work when one is recorded, and the caller reads the record once the
// stream has passed (TensorFlow's kernels turn it into the CPU kernels' error messages).
// Scratch memory comes from the caller (TensorFlow's allocator in the op library).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "kit_src/core/embedding/lookup_check.h"
#include "kit_src/core/gpu_call.h"

namespace sok {

// Resets a check record (stream-ordered).
cudaError_t ResetLookupCheck(LookupCheck* check, cudaStream_t stream);

// A check record on the device, reset, and its pinned host copy (after CopyToHost, once the
// stream has passed).
struct GpuCheck {
  LookupCheck* device = nullptr;
  LookupCheck* host = nullptr;
  Status Init(GpuCall* call) {
    SOK_RETURN_IF_ERROR(call->Device(1, &device));
    SOK_RETURN_IF_ERROR(call->Pinned(1, &host));
    return CudaStatus(ResetLookupCheck(device, call->stream()), "reset check");
  }
  Status CopyToHost(GpuCall* call) {
    return CudaStatus(cudaMemcpyAsync(host, device, sizeof(LookupCheck), cudaMemcpyDeviceToHost,
                                      call->stream()),
                      "check copy");
  }
};

// One table's rows on the device: [rows, dim] row-major.
struct GpuShard {
  const float* data = nullptr;
  int64_t rows = 0;
};

// ---- Input distribution (Sok>PartitionKeys) ----

// One lookup's ids (device) and its table's placement.
struct GpuPartitionLookup {
  const void* ids = nullptr;  // [count] int32 or int64
  int64_t count = 0;
  int64_t first = 0;          // where its ids start among all lookups' ids
  int32_t table = 0;
  int32_t owner = -1;         // -1 distributed, >= 0 localized on that worker
  int64_t rows = 0;           // global rows of the table
};

// The last of `count` items, in increasing order of start(item), whose start is at or before
// i: the one holding item i of all items' elements laid end to end (an empty item starts where
// the next one does, so it is never the answer).
template <typename Item, typename Start>
__device__ __forceinline__ int32_t FindByStart(const Item* items, int32_t count, int64_t i,
                                               Start start) {
  int32_t lo = 0, hi = count - 1;
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    if (start(items[mid]) <= i) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// The lookup among `count` descriptors (sorted by their `first` field) whose ids hold item i
// of all lookups' ids laid end to end.
template <typename Lookup>
__device__ __forceinline__ int32_t FindLookup(const Lookup* lookups, int32_t count, int64_t i) {
  return FindByStart(lookups, count, i, [](const Lookup& lookup) { return lookup.first; });
}

// Phase 1 of the partition: every id (all lookups laid end to end, `total` of them) becomes a
// sort key (worker, table, local row) packed in `key_bits` bits; bad ids are recorded in
// `check` (group = lookup). ids64: the lookups' ids are int64 (else int32).
// `sort_keys` and `order` are [total]; `order` is filled with 0..total-1.
cudaError_t BuildPartitionSortKeys(const GpuPartitionLookup* lookups_device, int32_t num_lookups,
                                   bool ids64, int64_t total, int32_t num_workers,
                                   int table_bits, int row_bits, uint64_t* sort_keys,
                                   int32_t* order, LookupCheck* check, cudaStream_t stream);

// Phase 2, after the sort: head[k] is 1 where sorted key k starts a new unique key (every key
// with !dedup); per-worker counts are added to worker_counts ([num_workers], zeroed here) and,
// with one worker and a non-null table_counts, per-table counts to table_counts
// ([num_tables], zeroed here; the caller keeps num_tables small enough for shared memory).
cudaError_t MarkUniqueKeys(const uint64_t* sorted, int64_t total, bool dedup, int row_bits,
                           int table_bits, int32_t num_workers, int32_t num_tables,
                           int32_t* head, int64_t* worker_counts, int64_t* table_counts,
                           cudaStream_t stream);

// Phase 3, after an inclusive scan of head into slot (slot[k] - 1 is the unique index of
// sorted key k): position[order[k]] = slot[k] - 1 and send_keys[slot[k] - 1] = PackKey(table,
// local row) at the heads.
cudaError_t ScatterPartition(const uint64_t* sorted, const int32_t* order, const int32_t* slot,
                             int64_t total, int row_bits, int table_bits, int64_t* send_keys,
                             int32_t* position, cudaStream_t stream);

// Phases 1 and 2 and the scan in one call (the CPU's PartitionKeys in key_partition.h is its
// twin): every static lookup's id sorted by (owner worker, table, local row) with CUB's radix
// sort, the heads of equal keys marked (every key without dedup) and scanned. Scratch comes
// from `allocate`; nothing synchronises. key_bits: the sort keys' width (worker, table and
// row bits). The unique count is out->slot[total - 1]; bad ids are
// in `check` (described: DescribeBadId). With num_tables > 0 (one worker, num_tables small
// enough for shared memory) each table's key count is taken too.
struct SortedPartitionKeys {
  uint64_t* sorted = nullptr;         // [total] sort keys, sorted
  int32_t* order = nullptr;           // [total] each sorted key's index among all ids
  int32_t* slot = nullptr;            // [total] inclusive scan of the heads
  int64_t* worker_counts = nullptr;   // [num_workers] unique keys for each worker
  int64_t* table_counts = nullptr;    // [num_tables], or null
};
cudaError_t SortPartitionKeys(const GpuPartitionLookup* lookups_device, int32_t num_lookups,
                              bool ids64, int64_t total, int32_t num_workers, int table_bits,
                              int row_bits, int key_bits, bool dedup, int32_t num_tables,
                              const DeviceAllocate& allocate, LookupCheck* check,
                              SortedPartitionKeys* out, cudaStream_t stream);

// ---- Owner side (Sok>GatherShardRows, Sok>GatherSingleIds, Sok>SplitGradientByTable) ----

// out[i] = row PackedRow(keys[i]) of shard PackedTable(keys[i]); bad keys give zero rows and
// are recorded (group 0, kBadKey).
cudaError_t GatherShardRowsGpu(const GpuShard* shards_device, int32_t num_tables, int64_t dim,
                               const int64_t* keys, int64_t n, float* out, LookupCheck* check,
                               cudaStream_t stream);

// The same for 16-bit tables (float16, bfloat16), whose GpuShard::data points at 16-bit rows:
// rows copied bit for bit (an even width as 32-bit word pairs through the kernel above).
cudaError_t GatherShardRows16Gpu(const GpuShard* shards_device, int32_t num_tables, int64_t dim,
                                 const int64_t* keys, int64_t n, uint16_t* out,
                                 LookupCheck* check, cudaStream_t stream);

// One lookup of the one-id path: output row i = table row ids[i].
struct GpuSingleIdLookup {
  const void* ids = nullptr;  // [count] int32 or int64
  int64_t count = 0;
  int64_t first = 0;          // where its ids start among all lookups' ids
  GpuShard table;
  float* output = nullptr;    // [count, dim]
};

// Up to kSingleIdBatch items of the one-id path travel by value in a kernel's parameters:
// nothing to upload to device memory, nothing to hold until the stream has passed.
constexpr int kSingleIdBatch = 32;
template <typename Item, int kCapacity = kSingleIdBatch>
struct GpuBatch {
  Item items[kCapacity];     // each item's `first` counts from this batch's first id
  int32_t count = 0;         // items in the batch
  int32_t first_group = 0;   // the first one's index among all lookups (the check's group)
  int64_t total = 0;         // the batch's ids (samples, for pooled lookups)
};
using GpuSingleIdBatch = GpuBatch<GpuSingleIdLookup>;

// One lookup's ids for the gradient's guard (below).
struct GpuIdCopy {
  const int64_t* ids = nullptr;
  int64_t count = 0;
  int64_t first = 0;
  int64_t* output = nullptr;  // [count]
};

// Each batch lookup's output row i = table row ids[i]; an id outside the table gives a zero
// row and is recorded (group = first_group + lookup, kBadId) where check is not null.
cudaError_t GatherSingleIdsGpu(const GpuSingleIdBatch& batch, bool ids64, int64_t dim,
                               LookupCheck* check, cudaStream_t stream);

// Where the recorded kBadId falls in this batch: value_a the id, value_b its table's rows.
cudaError_t DescribeBadSingleId(const GpuSingleIdBatch& batch, bool ids64, LookupCheck* check,
                                cudaStream_t stream);

// The gradient's guard of the one-id path: each item's ids copied to its output, or -1
// everywhere when `check` holds an error: no sparse update then writes a row (they skip or
// refuse -1), and nothing waits for the check.
cudaError_t GuardSingleIds(const GpuBatch<GpuIdCopy>& batch, const LookupCheck* check,
                           cudaStream_t stream);

// One SparseTensor's row splits: row_splits[r] = how many of its entries lie in rows below r,
// r in [0, rows], by a binary search of the first column of indices ([nnz, 2], rows in order).
struct GpuRowSplits {
  const int64_t* indices = nullptr;
  int64_t nnz = 0;
  int64_t rows = 0;
  int64_t first = 0;              // where its rows + 1 splits start among the batch's
  int64_t* row_splits = nullptr;  // [rows + 1]
};

// Sok>SparseRowSplits on the GPU: no order check (it would make the step wait for the device);
// entries out of order give wrong rows, as TensorFlow's own GPU lookups do.
cudaError_t SparseRowSplitsGpu(const GpuBatch<GpuRowSplits>& batch, cudaStream_t stream);

// Fills a kBadId record of the partition: value_a the id (ids of lookup = group, at item -
// first), value_b its table's rows.
cudaError_t DescribeBadId(const GpuPartitionLookup* partition_lookups, bool ids64,
                          LookupCheck* check, cudaStream_t stream);

// counts[t] ([num_tables], zeroed here) = keys naming table t; a key naming no table is
// recorded (kBadKey); grouped[0] = 1 when the keys are laid out table by table.
cudaError_t CountKeysPerTableGpu(const int64_t* keys, int64_t n, int32_t num_tables,
                                 int64_t* counts, int32_t* grouped, LookupCheck* check,
                                 cudaStream_t stream);

// table_of[i] = PackedTable(keys[i]) as a sort key, and iota into order.
cudaError_t TableSortKeys(const int64_t* keys, int64_t n, int32_t* table_of, int32_t* order,
                          cudaStream_t stream);

// For keys ordered by `order` (n of them, grouped by table), indices[k] = PackedRow(keys[order[k]])
// and values row k = grad row order[k] (order may be null: the identity; values may be null:
// indices only, the caller hands out a block of grad itself).
cudaError_t GatherGradientRows(const int64_t* keys, const int32_t* order, int64_t n, int64_t dim,
                               const float* grad, int64_t* indices, float* values,
                               cudaStream_t stream);

// ---- Combine (Sok>CombineForward / CombineFromShards / CombineBackward) ----

// One pooled lookup on the device.
struct GpuPooledLookup {
  const int64_t* row_splits = nullptr;  // [batch + 1]; pooling from the tables: null for one
                                        // id a sample (batch == ids_count)
  int64_t batch = 0;
  int64_t first_sample = 0;             // among all lookups' samples
  const float* weights = nullptr;       // [weights_count], or null for all ones
  int64_t weights_count = 0;
  int32_t combiner = 0;                 // Combiner: 0 sum, 1 mean, 2 sqrtn
  float* output = nullptr;              // forward: [batch, dim]
  const float* output_grad = nullptr;   // backward: [batch, dim]
  int64_t stride = 0;                   // floats from one sample's output (gradient) row to
                                        // the next's; 0: dim
  // Pooling straight from the lookup's own table (PoolFromTablesGpu): its ids and table, and
  // in the backward where each id's gradient row goes.
  const int64_t* ids = nullptr;         // [ids_count]
  int64_t ids_count = 0;
  GpuShard table;
  float* id_grads = nullptr;            // [ids_count, dim]
  // Or each id's share of the output gradient (PooledGradSharesGpu): the row of the gradient,
  // viewed as a [rows, dim] matrix, that id i takes (share_row_first + s * share_row_step for
  // its sample s), and its scale.
  int64_t* use_rows = nullptr;          // [ids_count]
  float* use_scales = nullptr;          // [ids_count]
  int64_t share_row_first = 0, share_row_step = 1;
};

// Where the rows a position names live: a dense [num_rows, dim] matrix, or (keys non-null)
// the shards' rows that packed keys[p] names.
struct GpuRowSource {
  const float* rows = nullptr;
  const int64_t* keys = nullptr;
  const GpuShard* shards = nullptr;  // device array of num_tables
  int32_t num_tables = 0;
};

// Checks the lookups against the positions (row_splits start at 0 and never decrease, ids
// fit the positions left, weights match the ids, positions inside [0, num_rows), packed keys
// name rows of their shards) and writes use_first ([num_lookups + 1], device) where each
// lookup's positions start. samples = all lookups' samples.
cudaError_t CheckPooledLookups(const GpuPooledLookup* lookups_device, int32_t num_lookups,
                               int64_t samples, const int32_t* position, int64_t positions,
                               int64_t num_rows, const GpuRowSource& source, int64_t* use_first,
                               LookupCheck* check, cudaStream_t stream);

// output[s] = combine of the weighted rows of sample s (nothing is done if check recorded an
// error).
cudaError_t CombineForwardGpu(const GpuPooledLookup* lookups_device, int32_t num_lookups,
                              int64_t samples, const int64_t* use_first, const int32_t* position,
                              const GpuRowSource& source, int64_t num_rows, int64_t dim,
                              LookupCheck* check, cudaStream_t stream);

// rows_grad ([num_rows, dim], overwritten) = sum over the uses of each row of their share of
// the output gradients. The uses are radix-sorted by the row they name and summed in chunks
// of consecutive sorted uses, so a row's sum is written once per chunk it spans (an atomic
// only where a row's uses cross a chunk's edge): a hot id's uses do not contend on one row.
cudaError_t CombineBackwardGpu(const GpuPooledLookup* lookups_device, int32_t num_lookups,
                               int64_t samples, const int64_t* use_first, const int32_t* position,
                               int64_t positions, int64_t num_rows, int64_t dim,
                               const DeviceAllocate& allocate, float* rows_grad,
                               LookupCheck* check, cudaStream_t stream);

// Pooled lookups straight from their tables (below) travel kPooledBatch a launch by value in
// the kernels' parameters (first_sample counted from the batch's first sample): nothing is
// uploaded, nothing held until the stream has passed.
constexpr int kPooledBatch = 16;
using GpuPooledBatch = GpuBatch<GpuPooledLookup, kPooledBatch>;

// One worker, static tables: output[s] of each lookup = combine of the weighted rows of its
// table at its ids, no dedup and no exchange (each lookup's first_sample is ignored). With a
// check record: reset, then checks (row_splits start at 0, end at ids_count and never
// decrease: kRowSplitsEnds / kRowSplitsDecrease, group = lookup); an id outside its table
// pools as a zero row and is recorded (kBadId, item = the id's index); then value_a / value_b
// are described (the id and its table's rows; row_splits[0] and row_splits[batch]). Nothing
// waits: the caller reads `check` once the stream has passed. With check null the caller has
// checked ids and row splits on the host: nothing is checked or recorded here (an id outside
// its table would still pool as zeros, row splits are clamped to the ids).
cudaError_t PoolFromTablesGpu(const std::vector<GpuPooledLookup>& lookups, int64_t dim,
                              LookupCheck* check, cudaStream_t stream);

// PoolFromTablesGpu's gradient for each id's row: id_grads row i = weight / denominator *
// output_grad row of the sample holding id i (zeros where the forward pooled to zeros).
cudaError_t SpreadPooledGradGpu(const std::vector<GpuPooledLookup>& lookups, int64_t dim,
                                cudaStream_t stream);

// PooledGradShares (combine.h) on the device: use_rows / use_scales of every lookup.
cudaError_t PooledGradSharesGpu(const std::vector<GpuPooledLookup>& lookups,
                                cudaStream_t stream);

// Fills value_a / value_b of the record the combine checks left.
cudaError_t DescribePooledError(const GpuPooledLookup* lookups_device, int32_t num_lookups,
                                const int64_t* use_first,
                                const int32_t* position, int64_t positions,
                                const GpuRowSource& source, LookupCheck* check,
                                cudaStream_t stream);

}  // namespace sok
