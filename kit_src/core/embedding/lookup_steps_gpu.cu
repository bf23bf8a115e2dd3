#include "kit_src/core/embedding/lookup_steps_gpu.cuh"

#include <cub/cub.cuh>

#include <algorithm>
#include <string>

#include "kit_src/core/embedding/lookup_check.h"
#include "kit_src/core/embedding/packed_key.h"
#include "kit_src/core/embedding/pair_keys_gpu.cuh"
#include "kit_src/core/embedding/row_owner.h"

namespace sok {

namespace {

// Dynamic tables' (table, id) pairs (pair_keys_gpu.cuh); ids need no range check.
Status PartitionPairsGpu(GpuCall* call, const PartitionOptions& options,
                         const PartitionKeyBits& bits, const GpuPartitionLookup* lookups_device,
                         int32_t num_lookups, bool ids64, int64_t total,
                         const AllocatePartition& allocate) {
  const int32_t num_workers = options.num_workers;
  const cudaStream_t stream = call->stream();
  int64_t* host = nullptr;  // [0] the unique count (int32), [1 ..] per-worker counts
  SOK_RETURN_IF_ERROR(call->Pinned(1 + num_workers, &host));
  SortedPairKeys sorted;
  SOK_RETURN_IF_ERROR(CudaStatus(SortPairKeys(lookups_device, num_lookups, ids64, total,
                                              num_workers, bits.table_bits, options.dedup,
                                              call->Scratch(), &sorted, stream),
                                 "partition pairs"));
  host[0] = 0;
  int32_t* unique = reinterpret_cast<int32_t*>(host);
  if (total > 0) {
    cudaMemcpyAsync(unique, sorted.slot + total - 1, sizeof(int32_t), cudaMemcpyDeviceToHost,
                    stream);
  }
  cudaMemcpyAsync(host + 1, sorted.worker_counts, num_workers * sizeof(int64_t),
                  cudaMemcpyDeviceToHost, stream);
  // The one synchronisation: the unique count sizes send_keys.
  SOK_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "partition pairs"));
  const std::vector<int32_t> splits(host + 1, host + 1 + num_workers);
  int64_t* send_keys = nullptr;
  int32_t* position = nullptr;
  SOK_RETURN_IF_ERROR(allocate(*unique, splits, {}, &send_keys, &position));
  return CudaStatus(ScatterPairKeys(sorted, total, bits.table_bits, send_keys, position, stream),
                    "scatter pairs");
}

}  // namespace

Status PartitionKeysGpu(GpuCall* call, const std::vector<PartitionInput>& inputs,
                        const std::vector<TablePlacement>& tables,
                        const PartitionOptions& options, const PartitionKeyBits& bits,
                        bool ids64, int64_t total, const AllocatePartition& allocate) {
  const int n = static_cast<int>(inputs.size());
  std::vector<GpuPartitionLookup> lookups(n);
  for (int l = 0; l < n; ++l) {
    const TablePlacement& table = tables[inputs[l].table];
    lookups[l] = GpuPartitionLookup{inputs[l].ids, inputs[l].count, inputs[l].first,
                                    inputs[l].table, table.owner, table.rows};
  }
  const cudaStream_t stream = call->stream();
  GpuPartitionLookup* lookups_device = nullptr;
  SOK_RETURN_IF_ERROR(call->Upload(lookups, &lookups_device));
  if (options.pair_keys) {
    return PartitionPairsGpu(call, options, bits, lookups_device, n, ids64, total, allocate);
  }
  // One worker: each table's key count too, for Sok>SplitGradientByTable (no count, no
  // synchronisation there).
  const int64_t num_workers = options.num_workers;
  const int64_t num_tables =
      num_workers == 1 && tables.size() <= kMaxCountedTables ? static_cast<int64_t>(tables.size())
                                                             : 0;
  struct HostView {
    LookupCheck check;
    int32_t unique;
    int32_t pad;
    int64_t counts[1];  // [num_workers], then [num_tables]
  };
  HostView* host = nullptr;
  GpuCheck check;
  SOK_RETURN_IF_ERROR(call->Pinned(sizeof(HostView) + 8 * (num_workers + num_tables),
                                   reinterpret_cast<char**>(&host)));
  SOK_RETURN_IF_ERROR(check.Init(call));
  SortedPartitionKeys sorted;
  const int key_bits = bits.row_bits + bits.table_bits + BitsToHold(num_workers);
  SOK_RETURN_IF_ERROR(CudaStatus(
      SortPartitionKeys(lookups_device, n, ids64, total, static_cast<int32_t>(num_workers),
                        bits.table_bits, bits.row_bits, key_bits, options.dedup,
                        static_cast<int32_t>(num_tables), call->Scratch(), check.device,
                        &sorted, stream),
      "partition keys"));
  host->unique = 0;
  if (total > 0) {
    cudaMemcpyAsync(&host->unique, sorted.slot + total - 1, sizeof(int32_t),
                    cudaMemcpyDeviceToHost, stream);
  }
  cudaMemcpyAsync(&host->check, check.device, sizeof(LookupCheck), cudaMemcpyDeviceToHost,
                  stream);
  cudaMemcpyAsync(host->counts, sorted.worker_counts,
                  (num_workers + num_tables) * sizeof(int64_t), cudaMemcpyDeviceToHost, stream);
  // The one synchronisation: the unique count sizes send_keys.
  SOK_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "partition keys"));
  if (host->check.first_bad != kNoError) {
    const TablePlacement& table = tables[inputs[BadGroup(host->check.first_bad)].table];
    return IdOutOfRange(table.name, host->check.value_a, table.rows);
  }
  const std::vector<int32_t> splits(host->counts, host->counts + num_workers);
  const std::vector<int32_t> table_counts(host->counts + num_workers,
                                          host->counts + num_workers + num_tables);
  int64_t* send_keys = nullptr;
  int32_t* position = nullptr;
  SOK_RETURN_IF_ERROR(allocate(host->unique, splits, table_counts, &send_keys, &position));
  return CudaStatus(ScatterPartition(sorted.sorted, sorted.order, sorted.slot, total,
                                     bits.row_bits, bits.table_bits, send_keys, position,
                                     stream),
                    "scatter partition");
}

Status GatherShardRowsOnGpu(GpuCall* call, const std::vector<GpuShard>& shards, int64_t dim,
                            const int64_t* keys, int64_t n, void* rows, bool rows16,
                            std::function<Status()>* verdict) {
  const int32_t num_tables = static_cast<int32_t>(shards.size());
  GpuShard* shards_device = nullptr;
  GpuCheck check;
  SOK_RETURN_IF_ERROR(call->Upload(shards, &shards_device));
  SOK_RETURN_IF_ERROR(check.Init(call));
  const cudaStream_t stream = call->stream();
  const cudaError_t gathered =
      rows16 ? GatherShardRows16Gpu(shards_device, num_tables, dim, keys, n,
                                    static_cast<uint16_t*>(rows), check.device, stream)
             : GatherShardRowsGpu(shards_device, num_tables, dim, keys, n,
                                  static_cast<float*>(rows), check.device, stream);
  SOK_RETURN_IF_ERROR(CudaStatus(gathered, "gather shard rows"));
  GpuRowSource source;
  source.keys = keys;
  SOK_RETURN_IF_ERROR(CudaStatus(
      DescribePooledError(nullptr, 0, nullptr, nullptr, 0, source, check.device, stream),
      "describe"));
  SOK_RETURN_IF_ERROR(check.CopyToHost(call));
  const LookupCheck* host = check.host;
  *verdict = [host, num_tables]() { return PooledCheckStatus(*host, 0, num_tables); };
  return Status::Ok();
}

namespace {

// Table t's keys are rows [first, first + count) of keys and grad: its indices unpacked from
// the keys, its values that block of grad (copied only where it is not handed out as it is).
Status HandOutBlock(GpuCall* call, const int64_t* keys, const float* grad, int64_t dim,
                    int64_t t, int64_t first, int64_t count, TableGradientOutputs* outputs) {
  int64_t* indices = nullptr;
  float* values = nullptr;
  SOK_RETURN_IF_ERROR(outputs->Block(t, first, count, &indices, &values));
  return CudaStatus(GatherGradientRows(keys + first, nullptr, count, dim, grad + first * dim,
                                       indices, values, call->stream()),
                    "split gradient");
}

// The order that lists the n keys table by table, stably: a radix sort by table.
Status OrderByTable(GpuCall* call, const int64_t* keys, int64_t n, int32_t num_tables,
                    int32_t** order) {
  const cudaStream_t stream = call->stream();
  int32_t *table_of = nullptr, *sorted_tables = nullptr, *iota = nullptr;
  SOK_RETURN_IF_ERROR(call->Device(n, &table_of));
  SOK_RETURN_IF_ERROR(call->Device(n, &sorted_tables));
  SOK_RETURN_IF_ERROR(call->Device(n, &iota));
  SOK_RETURN_IF_ERROR(call->Device(n, order));
  SOK_RETURN_IF_ERROR(CudaStatus(TableSortKeys(keys, n, table_of, iota, stream), "sort"));
  size_t sort_bytes = 0;
  const int bits = std::max(BitsToHold(num_tables), 1);
  cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, table_of, sorted_tables, iota, *order,
                                  static_cast<int>(n), 0, bits, stream);
  char* temp = nullptr;
  SOK_RETURN_IF_ERROR(call->Device(sort_bytes, &temp));
  cub::DeviceRadixSort::SortPairs(temp, sort_bytes, table_of, sorted_tables, iota, *order,
                                  static_cast<int>(n), 0, bits, stream);
  return Status::Ok();
}

}  // namespace

Status SplitGradientByTableGpu(GpuCall* call, const int64_t* keys, int64_t n, int64_t dim,
                               const float* grad, int32_t num_tables,
                               const std::vector<int64_t>& given_first,
                               const int32_t* given_counts, TableGradientOutputs* outputs) {
  const cudaStream_t stream = call->stream();
  if (!given_first.empty()) {
    for (int32_t t = 0; t < num_tables; ++t) {
      SOK_RETURN_IF_ERROR(
          HandOutBlock(call, keys, grad, dim, t, given_first[t], given_counts[t], outputs));
    }
    return Status::Ok();
  }
  int64_t* counts = nullptr;
  int32_t* grouped = nullptr;
  struct HostView {
    LookupCheck check;
    int32_t grouped;
    int32_t pad;
    int64_t counts[1];
  };
  HostView* host = nullptr;
  GpuCheck check;
  SOK_RETURN_IF_ERROR(call->Device(num_tables, &counts));
  SOK_RETURN_IF_ERROR(call->Device(1, &grouped));
  SOK_RETURN_IF_ERROR(
      call->Pinned(sizeof(HostView) + 8 * num_tables, reinterpret_cast<char**>(&host)));
  SOK_RETURN_IF_ERROR(check.Init(call));
  SOK_RETURN_IF_ERROR(CudaStatus(
      CountKeysPerTableGpu(keys, n, num_tables, counts, grouped, check.device, stream),
      "count keys"));
  GpuRowSource source;
  source.keys = keys;
  SOK_RETURN_IF_ERROR(CudaStatus(
      DescribePooledError(nullptr, 0, nullptr, nullptr, 0, source, check.device, stream),
      "describe"));
  cudaMemcpyAsync(&host->check, check.device, sizeof(LookupCheck), cudaMemcpyDeviceToHost,
                  stream);
  cudaMemcpyAsync(&host->grouped, grouped, sizeof(int32_t), cudaMemcpyDeviceToHost, stream);
  cudaMemcpyAsync(host->counts, counts, num_tables * sizeof(int64_t), cudaMemcpyDeviceToHost,
                  stream);
  // The one synchronisation: the counts size the outputs.
  SOK_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "split gradient"));
  if (host->check.first_bad != kNoError) {
    const int64_t key = host->check.value_a;
    return Status::InvalidArgument("key " + std::to_string(key) + " names table " +
                                   std::to_string(PackedTable(key)) + " of " +
                                   std::to_string(num_tables));
  }
  int32_t* order = nullptr;
  if (!host->grouped) SOK_RETURN_IF_ERROR(OrderByTable(call, keys, n, num_tables, &order));
  int64_t start = 0;
  for (int32_t t = 0; t < num_tables; ++t) {
    const int64_t count = host->counts[t];
    if (order == nullptr) {
      SOK_RETURN_IF_ERROR(HandOutBlock(call, keys, grad, dim, t, start, count, outputs));
    } else {
      int64_t* indices = nullptr;
      float* values = nullptr;
      SOK_RETURN_IF_ERROR(outputs->Table(t, count, &indices, &values));
      SOK_RETURN_IF_ERROR(CudaStatus(GatherGradientRows(keys, order + start, count, dim, grad,
                                                        indices, values, stream),
                                     "split gradient"));
    }
    start += count;
  }
  return Status::Ok();
}

Status CombineGpu(GpuCall* call, const std::vector<GpuPooledLookup>& lookups,
                  const int32_t* positions, int64_t num_positions, int64_t num_rows,
                  GpuRowSource source, const std::vector<GpuShard>& shards, bool validate,
                  const CombineLaunch& launch, std::function<Status()>* verdict) {
  std::vector<GpuPooledLookup> placed = lookups;
  // A weights count of another length than the ids' is known on the host only after the
  // check; the CPU's message names it, so keep each lookup's count.
  std::vector<int64_t> weight_counts;
  int64_t samples = 0;
  for (GpuPooledLookup& lookup : placed) {
    lookup.first_sample = samples;
    samples += lookup.batch;
    weight_counts.push_back(lookup.weights_count);
  }
  const cudaStream_t stream = call->stream();
  const int32_t n = static_cast<int32_t>(placed.size());
  GpuPooledLookup* lookups_device = nullptr;
  int64_t* use_first = nullptr;
  GpuCheck check;
  SOK_RETURN_IF_ERROR(call->Upload(placed, &lookups_device));
  if (!shards.empty()) {
    GpuShard* shards_device = nullptr;
    SOK_RETURN_IF_ERROR(call->Upload(shards, &shards_device));
    source.shards = shards_device;
  }
  SOK_RETURN_IF_ERROR(call->Device(n + 1, &use_first));
  SOK_RETURN_IF_ERROR(check.Init(call));
  SOK_RETURN_IF_ERROR(CudaStatus(CheckPooledLookups(lookups_device, n, samples, positions,
                                                    num_positions, num_rows, source, use_first,
                                                    check.device, stream),
                                 "combine check"));
  SOK_RETURN_IF_ERROR(
      CudaStatus(launch(lookups_device, n, samples, use_first, source, check.device), "combine"));
  if (!validate) return Status::Ok();  // inputs built by lookup_sparse: no verdict
  SOK_RETURN_IF_ERROR(CudaStatus(DescribePooledError(lookups_device, n, use_first, positions,
                                                     num_positions, source, check.device,
                                                     stream),
                                 "describe"));
  SOK_RETURN_IF_ERROR(check.CopyToHost(call));
  const LookupCheck* host = check.host;
  const int32_t num_tables = static_cast<int32_t>(shards.size());
  *verdict = [host, num_rows, num_tables, weight_counts]() {
    return CombineCheckStatus(*host, num_rows, num_tables, weight_counts);
  };
  return Status::Ok();
}

}  // namespace sok
