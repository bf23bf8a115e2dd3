// The GPU work of the fused lookup chain's ops (embedding_functor.h): the same results and
// error messages as the CPU's, the work in kit_src/core/embedding/lookup_gpu.cu on
// TensorFlow's stream. Bad input is found by the device kernels and reported once the stream
// has passed (no host thread waits), except in Sok>PartitionKeys and Sok>SplitGradientByTable,
// whose output sizes depend on the data: they synchronise once.
#include <cub/cub.cuh>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "kit_src/core/embedding/pair_keys_gpu.cuh"
#include "kit_src/core/embedding/row_owner.h"
#include "kit_src/tf/kernels/embedding_functor.h"
#include "kit_src/tf/kernels/gpu_op_util.h"

namespace sok {

namespace {

// Sok>PartitionKeys counts each table's keys (one worker) in shared memory up to this many
// tables; above, its table_counts output is empty.
constexpr size_t kMaxCountedTables = 4096;

GpuShard ShardOf(const TableRows& table) {
  return GpuShard{static_cast<const float*>(table.data), table.rows};
}

// The CPU's message for what the combine and gather checks recorded.
tf::Status PooledError(const LookupCheck& check, int64_t num_rows, int32_t num_tables) {
  if (check.first_bad == kNoError) return tf::Status();
  const int64_t l = BadGroup(check.first_bad), item = BadItem(check.first_bad);
  const std::string what = "lookup " + std::to_string(l);
  switch (BadKindOf(check.first_bad)) {
    case BadKind::kPositionsLeft:
      return tf::errors::InvalidArgument(
          "lookup ", l, " has ", check.value_a, " ids but only ", check.value_b,
          " positions are left");
    case BadKind::kRowSplitsEnds:
      return ToTfStatus(Status::InvalidArgument(
          what + ": row_splits must start at 0 and end at the " + std::to_string(check.value_b) +
          " ids, got [" + std::to_string(check.value_a) + ", ..., " +
          std::to_string(check.value_b) + "]"));
    case BadKind::kRowSplitsDecrease:
      return tf::errors::InvalidArgument(what, ": row_splits decrease at sample ", item);
    case BadKind::kWeightsCount:
      break;
    case BadKind::kBadPosition:
      return tf::errors::InvalidArgument("row position ", check.value_a, " is out of range [0, ",
                                         num_rows, ")");
    case BadKind::kBadKey:
      return tf::errors::InvalidArgument(
          "key ", check.value_a, " (table ", PackedTable(check.value_a), ", local row ",
          PackedRow(check.value_a), ") names no row of the ", num_tables, " local shards");
    default:
      break;
  }
  return tf::errors::InvalidArgument("bad input (", what, ", item ", item, ")");
}

// The launch of a combine op after its checks: the pooling or the scatter.
using CombineLaunch = std::function<cudaError_t(const GpuPooledLookup* lookups_device,
                                                const int64_t* use_first,
                                                const GpuRowSource& source, LookupCheck* check,
                                                GpuCallMemory* memory)>;

// Uploads a combine op's lookups, checks them on the device, launches `launch`, and finishes
// the op once the stream has passed (with `validate`: with the checks' verdict).
void RunCombine(tf::OpKernelContext* ctx, DoneCallback done,
                const std::vector<PooledArgs>& args, const tf::Tensor& position,
                int64_t num_rows, GpuRowSource source, const std::vector<TableRows>& tables,
                bool validate, const CombineLaunch& launch) {
  std::vector<GpuPooledLookup> lookups;
  int64_t samples = 0;
  // A weights count of another length than the ids' is known on the host only after the
  // check; the CPU's message names it, so keep each lookup's count.
  std::vector<int64_t> weight_counts;
  for (const PooledArgs& arg : args) {
    GpuPooledLookup lookup;
    lookup.row_splits = arg.row_splits;
    lookup.batch = arg.batch;
    lookup.first_sample = samples;
    lookup.weights = arg.weights;
    lookup.weights_count = arg.weights_count;
    lookup.combiner = static_cast<int32_t>(arg.combiner);
    lookup.output = arg.output;
    lookup.output_grad = arg.output_grad;
    lookups.push_back(lookup);
    weight_counts.push_back(arg.weights_count);
    samples += arg.batch;
  }
  std::vector<GpuShard> shards;
  for (const TableRows& table : tables) shards.push_back(ShardOf(table));
  auto memory = std::make_shared<GpuCallMemory>();
  const cudaStream_t stream = GpuStream(ctx);
  const int32_t n = static_cast<int32_t>(lookups.size());
  GpuPooledLookup* lookups_device = nullptr;
  GpuShard* shards_device = nullptr;
  int64_t* use_first = nullptr;
  GpuCheck check;
  OP_REQUIRES_OK_ASYNC(ctx, memory->Upload(ctx, lookups, &lookups_device), done);
  if (!shards.empty()) {
    OP_REQUIRES_OK_ASYNC(ctx, memory->Upload(ctx, shards, &shards_device), done);
    source.shards = shards_device;
  }
  OP_REQUIRES_OK_ASYNC(ctx, memory->Device(ctx, n + 1, &use_first), done);
  OP_REQUIRES_OK_ASYNC(ctx, check.Init(ctx, memory.get()), done);
  const int32_t* positions = PositionsOf(position);
  const int64_t num_positions = position.NumElements();
  OP_REQUIRES_OK_ASYNC(ctx, CudaToTf(CheckPooledLookups(lookups_device, n, samples, positions,
                                                        num_positions, num_rows, source,
                                                        use_first, check.device, stream),
                                     "combine check"),
                       done);
  OP_REQUIRES_OK_ASYNC(ctx, CudaToTf(launch(lookups_device, use_first, source, check.device,
                                            memory.get()),
                                     "combine"),
                       done);
  if (!validate) {  // inputs built by lookup_sparse: the kernels stay in bounds, no verdict
    OP_REQUIRES_OK_ASYNC(ctx, ReleaseAfterStream(ctx, memory), done);
    done();
    return;
  }
  OP_REQUIRES_OK_ASYNC(ctx, CudaToTf(DescribePooledError(lookups_device, n, use_first, positions,
                                                         num_positions, source, check.device,
                                                         stream),
                                     "describe"),
                       done);
  OP_REQUIRES_OK_ASYNC(ctx, check.CopyToHost(ctx), done);
  const LookupCheck* host = check.host;
  const int32_t num_tables = static_cast<int32_t>(shards.size());
  FinishAfterStream(ctx, done, memory, [host, num_rows, num_tables, weight_counts]() {
    if (host->first_bad != kNoError && BadKindOf(host->first_bad) == BadKind::kWeightsCount) {
      const int64_t l = BadGroup(host->first_bad);
      return tf::errors::InvalidArgument("weights of lookup ", l, " have ", weight_counts[l],
                                         " values but its ids have ", host->value_a,
                                         "; weights must match the ids one to one");
    }
    if (host->first_bad != kNoError && BadKindOf(host->first_bad) == BadKind::kPositionsLeft &&
        BadGroup(host->first_bad) == static_cast<int64_t>(weight_counts.size())) {
      return tf::errors::InvalidArgument("the lookups have ", host->value_a,
                                         " ids but position has ", host->value_b);
    }
    return PooledError(*host, num_rows, num_tables);
  });
}

// Sok>PartitionKeys of dynamic tables: (table, id) pairs (pair_keys_gpu.cuh); ids need no
// range check.
tf::Status PartitionPairs(tf::OpKernelContext* ctx, const PartitionAttrs& attrs,
                          const PartitionKeyBits& bits, const GpuPartitionLookup* lookups_device,
                          int32_t num_lookups, bool ids64, int64_t total,
                          GpuCallMemory* memory, const AllocatePartition& allocate) {
  const int32_t num_workers = attrs.options.num_workers;
  const cudaStream_t stream = GpuStream(ctx);
  int64_t* host = nullptr;  // [0] the unique count (int32), [1 ..] per-worker counts
  TF_RETURN_IF_ERROR(memory->Pinned(ctx, 1 + num_workers, &host));
  SortedPairKeys sorted;
  TF_RETURN_IF_ERROR(CudaToTf(SortPairKeys(lookups_device, num_lookups, ids64, total,
                                           num_workers, bits.table_bits, attrs.options.dedup,
                                           ScratchFrom(ctx, memory), &sorted, stream),
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
  TF_RETURN_IF_ERROR(CudaToTf(cudaStreamSynchronize(stream), "partition pairs"));
  const std::vector<int32_t> splits(host + 1, host + 1 + num_workers);
  int64_t* send_keys = nullptr;
  int32_t* position = nullptr;
  TF_RETURN_IF_ERROR(allocate(*unique, splits, {}, &send_keys, &position));
  return CudaToTf(ScatterPairKeys(sorted, total, bits.table_bits, send_keys, position, stream),
                  "scatter pairs");
}

}  // namespace

namespace functor {

// ------------------------------------------------------------------ Sok>PartitionKeys

// The core's SortPartitionKeys (lookup_gpu.cuh) sorts every id by (owner worker, table, local
// row), marks the first of each run of equal keys (every key without dedup) and scans the
// marks into each id's position; ScatterPartition lays out the keys. Synchronises once: the
// number of unique keys sizes send_keys.
template <>
tf::Status PartitionKeys<GpuDevice>::operator()(tf::OpKernelContext* ctx,
                                                const PartitionAttrs& attrs,
                                                const PartitionKeyBits& bits,
                                                const std::vector<PartitionInput>& inputs,
                                                bool ids64, int64_t total,
                                                const AllocatePartition& allocate) {
  const int n = static_cast<int>(inputs.size());
  std::vector<GpuPartitionLookup> lookups(n);
  for (int l = 0; l < n; ++l) {
    const TablePlacement& table = attrs.tables[inputs[l].table];
    lookups[l] = GpuPartitionLookup{inputs[l].ids, inputs[l].count, inputs[l].first,
                                    inputs[l].table, table.owner, table.rows};
  }
  const cudaStream_t stream = GpuStream(ctx);
  GpuCallMemory memory;
  GpuPartitionLookup* lookups_device = nullptr;
  TF_RETURN_IF_ERROR(memory.Upload(ctx, lookups, &lookups_device));
  if (attrs.options.pair_keys) {
    return PartitionPairs(ctx, attrs, bits, lookups_device, n, ids64, total, &memory, allocate);
  }
  // One worker: each table's key count too, for Sok>SplitGradientByTable (no count, no
  // synchronisation there).
  const int64_t num_workers = attrs.options.num_workers;
  const int64_t num_tables = num_workers == 1 && attrs.tables.size() <= kMaxCountedTables
                                 ? static_cast<int64_t>(attrs.tables.size())
                                 : 0;
  struct HostView {
    LookupCheck check;
    int32_t unique;
    int32_t pad;
    int64_t counts[1];  // [num_workers], then [num_tables]
  };
  HostView* host = nullptr;
  GpuCheck check;
  TF_RETURN_IF_ERROR(memory.Pinned(ctx, sizeof(HostView) + 8 * (num_workers + num_tables),
                                   reinterpret_cast<char**>(&host)));
  TF_RETURN_IF_ERROR(check.Init(ctx, &memory));
  SortedPartitionKeys sorted;
  const int key_bits = bits.row_bits + bits.table_bits + BitsToHold(num_workers);
  TF_RETURN_IF_ERROR(CudaToTf(SortPartitionKeys(lookups_device, n, ids64, total,
                                                static_cast<int32_t>(num_workers),
                                                bits.table_bits, bits.row_bits, key_bits,
                                                attrs.options.dedup,
                                                static_cast<int32_t>(num_tables),
                                                ScratchFrom(ctx, &memory), check.device, &sorted,
                                                stream),
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
  TF_RETURN_IF_ERROR(CudaToTf(cudaStreamSynchronize(stream), "partition keys"));
  if (host->check.first_bad != kNoError) {
    const TablePlacement& table = attrs.tables[inputs[BadGroup(host->check.first_bad)].table];
    return ToTfStatus(IdOutOfRange(table.name, host->check.value_a, table.rows));
  }
  const std::vector<int32_t> splits(host->counts, host->counts + num_workers);
  const std::vector<int32_t> table_counts(host->counts + num_workers,
                                          host->counts + num_workers + num_tables);
  int64_t* send_keys = nullptr;
  int32_t* position = nullptr;
  TF_RETURN_IF_ERROR(allocate(host->unique, splits, table_counts, &send_keys, &position));
  return CudaToTf(ScatterPartition(sorted.sorted, sorted.order, sorted.slot, total,
                                   bits.row_bits, bits.table_bits, send_keys, position, stream),
                  "scatter partition");
}

// ------------------------------------------------------------------ Sok>GatherShardRows

namespace {

// 16-bit tables: GpuShard::data points at their 16-bit rows, copied bit for bit.
void GatherShardRowsOnGpu(tf::OpKernelContext* ctx, DoneCallback done,
                          const std::vector<TableRows>& tables, int64_t dim, const int64_t* keys,
                          int64_t n, void* rows, bool rows16) {
  std::vector<GpuShard> shards;
  for (const TableRows& table : tables) shards.push_back(ShardOf(table));
  const int32_t num_tables = static_cast<int32_t>(shards.size());
  auto memory = std::make_shared<GpuCallMemory>();
  GpuShard* shards_device = nullptr;
  GpuCheck check;
  OP_REQUIRES_OK_ASYNC(ctx, memory->Upload(ctx, shards, &shards_device), done);
  OP_REQUIRES_OK_ASYNC(ctx, check.Init(ctx, memory.get()), done);
  const cudaStream_t stream = GpuStream(ctx);
  const cudaError_t gathered =
      rows16
          ? GatherShardRows16Gpu(shards_device, num_tables, dim, keys, n,
                                 reinterpret_cast<uint16_t*>(rows), check.device, stream)
          : GatherShardRowsGpu(shards_device, num_tables, dim, keys, n,
                               reinterpret_cast<float*>(rows), check.device, stream);
  OP_REQUIRES_OK_ASYNC(ctx, CudaToTf(gathered, "gather shard rows"), done);
  GpuRowSource source;
  source.keys = keys;
  OP_REQUIRES_OK_ASYNC(ctx, CudaToTf(DescribePooledError(nullptr, 0, nullptr, nullptr, 0,
                                                         source, check.device, stream),
                                     "describe"),
                       done);
  OP_REQUIRES_OK_ASYNC(ctx, check.CopyToHost(ctx), done);
  const LookupCheck* host = check.host;
  FinishAfterStream(ctx, done, memory, [host, num_tables]() {
    return PooledError(*host, 0, num_tables);
  });
}

}  // namespace

#define SOK_GATHER_SHARD_ROWS_GPU(T)                                                          \
  template <>                                                                                 \
  void GatherShardRows<GpuDevice, T>::operator()(                                             \
      tf::OpKernelContext* ctx, DoneCallback done, const std::vector<TableRows>& tables,      \
      int64_t dim, const int64_t* keys, int64_t n, T* rows) {                                 \
    GatherShardRowsOnGpu(ctx, done, tables, dim, keys, n, rows, sizeof(T) == 2);              \
  }
SOK_GATHER_SHARD_ROWS_GPU(float)
SOK_GATHER_SHARD_ROWS_GPU(Eigen::half)
SOK_GATHER_SHARD_ROWS_GPU(tf::bfloat16)
#undef SOK_GATHER_SHARD_ROWS_GPU

// ------------------------------------------------------------------ Sok>GatherSingleIds

// Enqueues the gather and returns: the lookups travel by value in the kernels' parameters,
// kSingleIdBatch a launch.
template <>
tf::Status GatherSingleIds<GpuDevice, int64_t>::operator()(
    tf::OpKernelContext* ctx, const std::vector<SingleIdArgs>& lookups, int64_t dim,
    int64_t* check_out) {
  const int n = static_cast<int>(lookups.size());
  std::vector<GpuSingleIdBatch> batches((n + kSingleIdBatch - 1) / kSingleIdBatch);
  for (int l = 0; l < n; ++l) {
    GpuSingleIdBatch& batch = batches[l / kSingleIdBatch];
    batch.first_group = l - l % kSingleIdBatch;
    batch.items[batch.count++] = GpuSingleIdLookup{lookups[l].ids, lookups[l].count,
                                                    batch.total, ShardOf(lookups[l].table),
                                                    lookups[l].output};
    batch.total += lookups[l].count;
  }
  auto* check = reinterpret_cast<LookupCheck*>(check_out);
  const cudaStream_t stream = GpuStream(ctx);
  if (check != nullptr) {
    TF_RETURN_IF_ERROR(CudaToTf(ResetLookupCheck(check, stream), "reset check"));
  }
  for (const GpuSingleIdBatch& batch : batches) {
    TF_RETURN_IF_ERROR(CudaToTf(GatherSingleIdsGpu(batch, /*ids64=*/true, dim, check, stream),
                                "gather single ids"));
  }
  if (check == nullptr) return tf::Status();
  for (const GpuSingleIdBatch& batch : batches) {
    TF_RETURN_IF_ERROR(CudaToTf(DescribeBadSingleId(batch, true, check, stream), "describe"));
  }
  return tf::Status();
}

// ------------------------------------------------------------------ Sok>GuardIds

// One launch a kSingleIdBatch of lookups; nothing waits for the check.
template <>
tf::Status GuardIds<GpuDevice>::operator()(tf::OpKernelContext* ctx, int n,
                                           const tf::Tensor& check) {
  std::vector<GpuBatch<GpuIdCopy>> batches((n + kSingleIdBatch - 1) / kSingleIdBatch);
  for (int l = 0; l < n; ++l) {
    const tf::Tensor& ids = ctx->input(l);
    tf::Tensor* out = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(l, ids.shape(), &out));
    GpuBatch<GpuIdCopy>& batch = batches[l / kSingleIdBatch];
    batch.items[batch.count++] = GpuIdCopy{ids.flat<int64_t>().data(), ids.NumElements(),
                                           batch.total, out->flat<int64_t>().data()};
    batch.total += ids.NumElements();
  }
  // A deferred check's error not raised yet: no step updates anything until it is (-1 is
  // int64's all-ones bit pattern).
  if (DeferredIdError::Pending()) {
    for (int l = 0; l < n; ++l) {
      tf::Tensor* out = ctx->mutable_output(l);
      TF_RETURN_IF_ERROR(CudaToTf(cudaMemsetAsync(out->data(), 0xff, out->TotalBytes(),
                                                  GpuStream(ctx)),
                                  "guard ids"));
    }
    return tf::Status();
  }
  const auto* record = reinterpret_cast<const LookupCheck*>(check.flat<int64_t>().data());
  for (const GpuBatch<GpuIdCopy>& batch : batches) {
    TF_RETURN_IF_ERROR(CudaToTf(GuardSingleIds(batch, record, GpuStream(ctx)), "guard ids"));
  }
  return tf::Status();
}

// ------------------------------------------------------------------ Sok>SparseRowSplits

// A launch a kSingleIdBatch of SparseTensors.
template <>
tf::Status SparseRowSplits<GpuDevice>::operator()(tf::OpKernelContext* ctx,
                                                  const std::vector<RowSplitsArgs>& tensors) {
  const int n = static_cast<int>(tensors.size());
  std::vector<GpuBatch<GpuRowSplits>> batches((n + kSingleIdBatch - 1) / kSingleIdBatch);
  for (int l = 0; l < n; ++l) {
    GpuBatch<GpuRowSplits>& batch = batches[l / kSingleIdBatch];
    batch.items[batch.count++] = GpuRowSplits{tensors[l].indices, tensors[l].nnz,
                                              tensors[l].rows, batch.total,
                                              tensors[l].row_splits};
    batch.total += tensors[l].rows + 1;
  }
  for (const GpuBatch<GpuRowSplits>& batch : batches) {
    TF_RETURN_IF_ERROR(CudaToTf(SparseRowSplitsGpu(batch, GpuStream(ctx)), "row splits"));
  }
  return tf::Status();
}

// ------------------------------------------------------------------ Sok>CheckGatheredIds

template <>
void CheckGatheredIds<GpuDevice>::operator()(tf::OpKernelContext* ctx, DoneCallback done,
                                             const tf::Tensor& check,
                                             const std::vector<std::string>& table_names,
                                             bool deferred) {
  if (deferred) {  // an earlier step's error, found since; nothing waits for this one's
    OP_REQUIRES_OK_ASYNC(ctx, DeferredIdError::Take(), done);
  }
  auto memory = std::make_shared<GpuCallMemory>();
  LookupCheck* host = nullptr;
  OP_REQUIRES_OK_ASYNC(ctx, memory->Pinned(ctx, 1, &host), done);
  OP_REQUIRES_OK_ASYNC(ctx, CudaToTf(cudaMemcpyAsync(host, check.data(), sizeof(LookupCheck),
                                                     cudaMemcpyDeviceToHost, GpuStream(ctx)),
                                     "check copy"),
                       done);
  const std::vector<std::string> names = table_names;
  if (deferred) {
    OP_REQUIRES_OK_ASYNC(ctx, CudaToTf(cudaGetLastError(), "check copy"), done);
    AfterStream(ctx, memory, [host, names]() {
      const tf::Status status = GatheredIdsStatus(*host, names);
      if (!status.ok()) DeferredIdError::Record(status);
    });
    done();
    return;
  }
  FinishAfterStream(ctx, done, memory, [host, names]() { return GatheredIdsStatus(*host, names); });
}

// ------------------------------------------------------------------ Sok>SplitGradientByTable

namespace {

// Table t's keys are rows [first, first + count) of keys and grad: its indices unpacked from
// the keys, its values that block of grad (copied only where it is not aligned).
tf::Status HandOutBlock(tf::OpKernelContext* ctx, const tf::Tensor& keys, const tf::Tensor& grad,
                        int64_t t, int64_t first, int64_t count,
                        GradientSplitOutputs<GpuDevice>* outputs) {
  const int64_t dim = grad.dim_size(1);
  int64_t* indices = nullptr;
  float* values = nullptr;
  TF_RETURN_IF_ERROR(outputs->Block(t, first, count, &indices, &values));
  return CudaToTf(GatherGradientRows(keys.flat<int64_t>().data() + first, nullptr, count, dim,
                                     grad.flat<float>().data() + first * dim, indices, values,
                                     GpuStream(ctx)),
                  "split gradient");
}

}  // namespace

// With table_counts (Sok>PartitionKeys' own, keys grouped by table), hands out blocks of the
// gradient without counting or waiting. Otherwise counts the keys of each table on the device
// and synchronises once (the counts size the outputs); keys grouped by table (one worker's
// own) hand out blocks, others are ordered by a stable radix sort by table.
template <>
tf::Status SplitGradientByTable<GpuDevice>::operator()(tf::OpKernelContext* ctx,
                                                       const tf::Tensor& keys,
                                                       const tf::Tensor& grad,
                                                       int64_t num_tables,
                                                       const std::vector<int64_t>& given_first,
                                                       GradientSplitOutputs<GpuDevice>* outputs) {
  const int64_t n = keys.NumElements(), dim = grad.dim_size(1);
  const int64_t* key_data = keys.flat<int64_t>().data();
  const cudaStream_t stream = GpuStream(ctx);
  if (!given_first.empty()) {
    const auto& counts = ctx->input(2).flat<int32_t>();
    for (int64_t t = 0; t < num_tables; ++t) {
      TF_RETURN_IF_ERROR(HandOutBlock(ctx, keys, grad, t, given_first[t], counts(t), outputs));
    }
    return tf::Status();
  }
  GpuCallMemory memory;
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
  TF_RETURN_IF_ERROR(memory.Device(ctx, num_tables, &counts));
  TF_RETURN_IF_ERROR(memory.Device(ctx, 1, &grouped));
  TF_RETURN_IF_ERROR(memory.Pinned(ctx, sizeof(HostView) + 8 * num_tables,
                                   reinterpret_cast<char**>(&host)));
  TF_RETURN_IF_ERROR(check.Init(ctx, &memory));
  TF_RETURN_IF_ERROR(CudaToTf(CountKeysPerTableGpu(key_data, n, static_cast<int32_t>(num_tables),
                                                   counts, grouped, check.device, stream),
                              "count keys"));
  GpuRowSource source;
  source.keys = key_data;
  TF_RETURN_IF_ERROR(CudaToTf(DescribePooledError(nullptr, 0, nullptr, nullptr, 0, source,
                                                  check.device, stream),
                              "describe"));
  cudaMemcpyAsync(&host->check, check.device, sizeof(LookupCheck), cudaMemcpyDeviceToHost,
                  stream);
  cudaMemcpyAsync(&host->grouped, grouped, sizeof(int32_t), cudaMemcpyDeviceToHost, stream);
  cudaMemcpyAsync(host->counts, counts, num_tables * sizeof(int64_t), cudaMemcpyDeviceToHost,
                  stream);
  // The one synchronisation: the counts size the outputs.
  TF_RETURN_IF_ERROR(CudaToTf(cudaStreamSynchronize(stream), "split gradient"));
  if (host->check.first_bad != kNoError) {
    const int64_t key = host->check.value_a;
    return tf::errors::InvalidArgument("key ", key, " names table ", PackedTable(key), " of ",
                                       num_tables);
  }
  int32_t* order = nullptr;
  if (!host->grouped) {
    int32_t *table_of = nullptr, *sorted_tables = nullptr, *iota = nullptr;
    TF_RETURN_IF_ERROR(memory.Device(ctx, n, &table_of));
    TF_RETURN_IF_ERROR(memory.Device(ctx, n, &sorted_tables));
    TF_RETURN_IF_ERROR(memory.Device(ctx, n, &iota));
    TF_RETURN_IF_ERROR(memory.Device(ctx, n, &order));
    TF_RETURN_IF_ERROR(CudaToTf(TableSortKeys(key_data, n, table_of, iota, stream), "sort"));
    size_t sort_bytes = 0;
    const int bits = std::max(BitsToHold(num_tables), 1);
    cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, table_of, sorted_tables, iota, order,
                                    static_cast<int>(n), 0, bits, stream);
    char* temp = nullptr;
    TF_RETURN_IF_ERROR(memory.Device(ctx, sort_bytes, &temp));
    cub::DeviceRadixSort::SortPairs(temp, sort_bytes, table_of, sorted_tables, iota, order,
                                    static_cast<int>(n), 0, bits, stream);
  }
  int64_t start = 0;
  for (int64_t t = 0; t < num_tables; ++t) {
    const int64_t count = host->counts[t];
    if (order == nullptr) {
      TF_RETURN_IF_ERROR(HandOutBlock(ctx, keys, grad, t, start, count, outputs));
    } else {
      int64_t* indices = nullptr;
      float* values = nullptr;
      TF_RETURN_IF_ERROR(outputs->Table(t, count, &indices, &values));
      TF_RETURN_IF_ERROR(CudaToTf(GatherGradientRows(key_data, order + start, count, dim,
                                                     grad.flat<float>().data(), indices, values,
                                                     stream),
                                  "split gradient"));
    }
    start += count;
  }
  return tf::Status();
}

// ------------------------------------------------------------------ combine ops

template <>
void CombineForward<GpuDevice>::operator()(tf::OpKernelContext* ctx, DoneCallback done,
                                           const std::vector<PooledArgs>& lookups,
                                           const tf::Tensor& position,
                                           const PooledSource& source, bool validate) {
  GpuRowSource rows;
  rows.rows = source.rows;
  rows.keys = source.keys;
  rows.num_tables = static_cast<int32_t>(source.tables.size());
  const int32_t n = static_cast<int32_t>(lookups.size());
  int64_t samples = 0;
  for (const PooledArgs& lookup : lookups) samples += lookup.batch;
  const int32_t* positions = PositionsOf(position);
  const int64_t num_rows = source.num_rows, dim = source.dim;
  const cudaStream_t stream = GpuStream(ctx);
  RunCombine(ctx, done, lookups, position, num_rows, rows, source.tables, validate,
             [&](const GpuPooledLookup* device, const int64_t* use_first,
                 const GpuRowSource& src, LookupCheck* check, GpuCallMemory*) {
               return CombineForwardGpu(device, n, samples, use_first, positions, src, num_rows,
                                        dim, check, stream);
             });
}

template <>
void CombineBackward<GpuDevice>::operator()(tf::OpKernelContext* ctx, DoneCallback done,
                                            const std::vector<PooledArgs>& lookups,
                                            const tf::Tensor& position, int64_t num_rows,
                                            int64_t dim, float* rows_grad, bool validate) {
  const int32_t n = static_cast<int32_t>(lookups.size());
  int64_t samples = 0;
  for (const PooledArgs& lookup : lookups) samples += lookup.batch;
  const cudaStream_t stream = GpuStream(ctx);
  RunCombine(ctx, done, lookups, position, num_rows, GpuRowSource(), {}, validate,
             [&](const GpuPooledLookup* device, const int64_t* use_first, const GpuRowSource&,
                 LookupCheck* check, GpuCallMemory* memory) {
               return CombineBackwardGpu(device, n, samples, use_first, PositionsOf(position),
                                         position.NumElements(), num_rows, dim,
                                         ScratchFrom(ctx, memory), rows_grad, check, stream);
             });
}

}  // namespace functor
}  // namespace sok
