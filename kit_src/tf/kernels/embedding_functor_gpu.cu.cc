// The GPU work of the fused lookup chain's ops (embedding_functor.h): the same results and
// error messages as the CPU's, the work in kit_src/core/embedding (lookup_steps_gpu.cuh,
// lookup_gpu.cuh) on TensorFlow's stream. Bad input is found by the device kernels and
// reported once the stream has passed (no host thread waits), except in Sok>PartitionKeys and
// Sok>SplitGradientByTable, whose output sizes depend on the data: they synchronise once.
#include <memory>
#include <string>
#include <vector>

#include "kit_src/core/embedding/lookup_steps_gpu.cuh"
#include "kit_src/tf/kernels/embedding_functor.h"
#include "kit_src/tf/kernels/gpu_op_util.h"

namespace sok {

namespace {

GpuShard ShardOf(const TableRows& table) {
  return GpuShard{static_cast<const float*>(table.data), table.rows};
}

std::vector<GpuShard> ShardsOf(const std::vector<TableRows>& tables) {
  std::vector<GpuShard> shards;
  for (const TableRows& table : tables) shards.push_back(ShardOf(table));
  return shards;
}

// Finishes an async op whose core step enqueued its work (`enqueued`) and left a verdict to
// read once the stream has passed (none: the op is done once enqueued).
void FinishStep(tf::OpKernelContext* ctx, DoneCallback done,
                const std::shared_ptr<GpuCallMemory>& memory, const Status& enqueued,
                const std::function<Status()>& verdict) {
  OP_REQUIRES_OK_ASYNC(ctx, ToTfStatus(enqueued), done);
  if (!verdict) {
    OP_REQUIRES_OK_ASYNC(ctx, ReleaseAfterStream(ctx, memory), done);
    done();
    return;
  }
  FinishAfterStream(ctx, done, memory, [verdict]() { return ToTfStatus(verdict()); });
}

// A combine op's lookups as the core's (first_sample is the core's to set).
std::vector<GpuPooledLookup> GpuLookupsOf(const std::vector<PooledArgs>& args) {
  std::vector<GpuPooledLookup> lookups;
  for (const PooledArgs& arg : args) {
    GpuPooledLookup lookup;
    lookup.row_splits = arg.row_splits;
    lookup.batch = arg.batch;
    lookup.weights = arg.weights;
    lookup.weights_count = arg.weights_count;
    lookup.combiner = static_cast<int32_t>(arg.combiner);
    lookup.output = arg.output;
    lookup.output_grad = arg.output_grad;
    lookups.push_back(lookup);
  }
  return lookups;
}

}  // namespace

namespace functor {

// ------------------------------------------------------------------ Sok>PartitionKeys

template <>
tf::Status PartitionKeys<GpuDevice>::operator()(tf::OpKernelContext* ctx,
                                                const PartitionAttrs& attrs,
                                                const PartitionKeyBits& bits,
                                                const std::vector<PartitionInput>& inputs,
                                                bool ids64, int64_t total,
                                                const AllocatePartition& allocate) {
  GpuCallMemory memory(ctx);
  return ToTfStatus(PartitionKeysGpu(&memory, inputs, attrs.tables, attrs.options, bits, ids64,
                                     total, allocate));
}

// ------------------------------------------------------------------ Sok>GatherShardRows

// 16-bit tables: GpuShard::data points at their 16-bit rows, copied bit for bit.
#define SOK_GATHER_SHARD_ROWS_GPU(T)                                                          \
  template <>                                                                                 \
  void GatherShardRows<GpuDevice, T>::operator()(                                             \
      tf::OpKernelContext* ctx, DoneCallback done, const std::vector<TableRows>& tables,      \
      int64_t dim, const int64_t* keys, int64_t n, T* rows) {                                 \
    auto memory = std::make_shared<GpuCallMemory>(ctx);                                       \
    std::function<Status()> verdict;                                                          \
    const Status enqueued = GatherShardRowsOnGpu(memory.get(), ShardsOf(tables), dim, keys,  \
                                                 n, rows, sizeof(T) == 2, &verdict);          \
    FinishStep(ctx, done, memory, enqueued, verdict);                                         \
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
    OP_REQUIRES_OK_ASYNC(ctx, ToTfStatus(DeferredIdError::Take()), done);
  }
  auto memory = std::make_shared<GpuCallMemory>(ctx);
  LookupCheck* host = nullptr;
  OP_REQUIRES_OK_ASYNC(ctx, ToTfStatus(memory->Pinned(1, &host)), done);
  OP_REQUIRES_OK_ASYNC(ctx, CudaToTf(cudaMemcpyAsync(host, check.data(), sizeof(LookupCheck),
                                                     cudaMemcpyDeviceToHost, GpuStream(ctx)),
                                     "check copy"),
                       done);
  const std::vector<std::string> names = table_names;
  if (deferred) {
    OP_REQUIRES_OK_ASYNC(ctx, CudaToTf(cudaGetLastError(), "check copy"), done);
    AfterStream(ctx, memory, [host, names]() {
      const Status status = GatheredIdsStatus(*host, names);
      if (!status.ok()) DeferredIdError::Record(status);
    });
    done();
    return;
  }
  FinishAfterStream(ctx, done, memory,
                    [host, names]() { return ToTfStatus(GatheredIdsStatus(*host, names)); });
}

// ------------------------------------------------------------------ Sok>SplitGradientByTable

// With table_counts (Sok>PartitionKeys' own, keys grouped by table), hands out blocks of the
// gradient without counting or waiting; otherwise counts on the device and waits once.
template <>
tf::Status SplitGradientByTable<GpuDevice>::operator()(tf::OpKernelContext* ctx,
                                                       const tf::Tensor& keys,
                                                       const tf::Tensor& grad,
                                                       int64_t num_tables,
                                                       const std::vector<int64_t>& given_first,
                                                       GradientSplitOutputs<GpuDevice>* outputs) {
  GpuCallMemory memory(ctx);
  return ToTfStatus(SplitGradientByTableGpu(
      &memory, keys.flat<int64_t>().data(), keys.NumElements(), grad.dim_size(1),
      grad.flat<float>().data(), static_cast<int32_t>(num_tables), given_first,
      ctx->input(2).flat<int32_t>().data(), outputs));
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
  const int32_t* positions = PositionsOf(position);
  const int64_t num_rows = source.num_rows, dim = source.dim;
  const cudaStream_t stream = GpuStream(ctx);
  auto memory = std::make_shared<GpuCallMemory>(ctx);
  std::function<Status()> verdict;
  const Status enqueued = CombineGpu(
      memory.get(), GpuLookupsOf(lookups), positions, position.NumElements(), num_rows, rows,
      ShardsOf(source.tables), validate,
      [&](const GpuPooledLookup* device, int32_t n, int64_t samples, const int64_t* use_first,
          const GpuRowSource& src, LookupCheck* check) {
        return CombineForwardGpu(device, n, samples, use_first, positions, src, num_rows, dim,
                                 check, stream);
      },
      &verdict);
  FinishStep(ctx, done, memory, enqueued, verdict);
}

template <>
void CombineBackward<GpuDevice>::operator()(tf::OpKernelContext* ctx, DoneCallback done,
                                            const std::vector<PooledArgs>& lookups,
                                            const tf::Tensor& position, int64_t num_rows,
                                            int64_t dim, float* rows_grad, bool validate) {
  const cudaStream_t stream = GpuStream(ctx);
  auto memory = std::make_shared<GpuCallMemory>(ctx);
  std::function<Status()> verdict;
  const Status enqueued = CombineGpu(
      memory.get(), GpuLookupsOf(lookups), PositionsOf(position), position.NumElements(),
      num_rows, GpuRowSource(), {}, validate,
      [&](const GpuPooledLookup* device, int32_t n, int64_t samples, const int64_t* use_first,
          const GpuRowSource&, LookupCheck* check) {
        return CombineBackwardGpu(device, n, samples, use_first, PositionsOf(position),
                                  position.NumElements(), num_rows, dim, memory->Scratch(),
                                  rows_grad, check, stream);
      },
      &verdict);
  FinishStep(ctx, done, memory, enqueued, verdict);
}

}  // namespace functor
}  // namespace sok
