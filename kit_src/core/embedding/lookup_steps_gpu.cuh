// The fused lookup chain's GPU steps as whole operations, the device twins of the CPU's
// PartitionKeys (key_partition.h), GatherShardRows and SplitGradientByTable (shard_rows.h)
// and the combines (combine.h): each enqueues lookup_gpu.cuh's kernels on a GpuCall's stream.
// Bad input is recorded on the device and named, with the CPU's message, once the stream has
// passed, except where an output's size depends on the data: PartitionKeysGpu and
// SplitGradientByTableGpu synchronise once and fail at once.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "kit_src/core/embedding/key_partition.h"
#include "kit_src/core/embedding/lookup_gpu.cuh"
#include "kit_src/core/embedding/shard_rows.h"
#include "kit_src/core/gpu_call.h"

namespace sok {

// PartitionKeysGpu counts each table's keys (one worker) in shared memory up to this many
// tables; above, the table counts it hands to `allocate` are empty.
constexpr size_t kMaxCountedTables = 4096;

// Sorts every id by (owner worker, table, local row), or (worker, table, id) with pair_keys,
// marks and scans the heads of equal keys (every key without dedup), and synchronises once:
// the unique count sizes the outputs `allocate` makes, which are then filled on the stream.
// Fails naming the first id outside its table.
Status PartitionKeysGpu(GpuCall* call, const std::vector<PartitionInput>& inputs,
                        const std::vector<TablePlacement>& tables,
                        const PartitionOptions& options, const PartitionKeyBits& bits,
                        bool ids64, int64_t total, const AllocatePartition& allocate);

// rows[i] = the row of the shards that packed keys[i] names (a 16-bit table's rows copied bit
// for bit, rows16). Once the stream has passed, *verdict names a bad key.
Status GatherShardRowsOnGpu(GpuCall* call, const std::vector<GpuShard>& shards, int64_t dim,
                            const int64_t* keys, int64_t n, void* rows, bool rows16,
                            std::function<Status()>* verdict);

// SplitGradientByTable (shard_rows.h) of device keys and grad. With given_first and
// given_counts (the keys grouped by table, as the partition laid them out) hands out blocks
// without counting or waiting; otherwise counts each table's keys on the device and
// synchronises once (the counts size the outputs), failing on a key naming no table.
Status SplitGradientByTableGpu(GpuCall* call, const int64_t* keys, int64_t n, int64_t dim,
                               const float* grad, int32_t num_tables,
                               const std::vector<int64_t>& given_first,
                               const int32_t* given_counts, TableGradientOutputs* outputs);

// What a combine runs after its checks: the pooling or the scatter of num_lookups lookups
// holding `samples` samples in all.
using CombineLaunch = std::function<cudaError_t(
    const GpuPooledLookup* lookups_device, int32_t num_lookups, int64_t samples,
    const int64_t* use_first, const GpuRowSource& source, LookupCheck* check)>;

// A combine op's lookups over `positions` into num_rows rows of `source` (with `shards`, the
// local shards its packed keys name): uploads and checks them on the device, then `launch`.
// With `validate`, *verdict names the first bad input once the stream has passed; without
// (inputs built by lookup_sparse) the kernels stay in bounds and *verdict stays empty.
Status CombineGpu(GpuCall* call, const std::vector<GpuPooledLookup>& lookups,
                  const int32_t* positions, int64_t num_positions, int64_t num_rows,
                  GpuRowSource source, const std::vector<GpuShard>& shards, bool validate,
                  const CombineLaunch& launch, std::function<Status()>* verdict);

}  // namespace sok
