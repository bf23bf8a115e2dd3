// GPU functors of the dynamic table ops (dynamic_table_functor.h): the table
// (kit_src/core/hash_table/gpu_hash_table.cuh) draws its arrays from TensorFlow's GPU
// allocator and runs on TensorFlow's stream; pair keys are grouped by the CUDA twins in
// kit_src/core/embedding/pair_keys_gpu.cuh.
#include <memory>
#include <vector>

#include "kit_src/core/embedding/pair_keys_gpu.cuh"
#include "kit_src/core/hash_table/gpu_hash_table.cuh"
#include "kit_src/tf/kernels/dynamic_table_functor.h"
#include "kit_src/tf/kernels/gpu_op_util.h"

namespace sok::functor {
namespace {

// The table and the allocator it draws from, freed together (table first).
struct GpuTableHolder {
  std::unique_ptr<TfGpuMemory> memory;
  std::unique_ptr<GpuHashTable> table;
  ~GpuTableHolder() { table.reset(); }
};

}  // namespace

template <>
tf::Status NewDynamicTable<GpuDevice>::operator()(tf::OpKernelContext* ctx,
                                                  const HashTableOptions& options,
                                                  const RowInitializer& initializer,
                                                  std::shared_ptr<DynamicTable>* table) {
  auto holder = std::make_shared<GpuTableHolder>();
  holder->memory = std::make_unique<TfGpuMemory>(ctx->device()->GetAllocator({}));
  holder->table = std::make_unique<GpuHashTable>(options, initializer, holder->memory.get());
  TF_RETURN_IF_ERROR(ToTfStatus(holder->table->Init(GpuStream(ctx))));
  // The table shares the holder's ownership.
  *table = std::shared_ptr<DynamicTable>(holder, holder->table.get());
  return tf::Status();
}

template <>
std::unique_ptr<TierMemory> NewTierMemory<GpuDevice>::operator()(tf::OpKernelContext* ctx) {
  return NewGpuTierMemory(std::make_shared<TfGpuMemory>(ctx->device()->GetAllocator({})));
}

template <>
TableContext TableContextOf<GpuDevice>::operator()(tf::OpKernelContext* ctx) {
  TableContext context;
  context.stream = GpuStream(ctx);
  context.parallel_for = CpuParallelFor(ctx);  // a tiered table's host tier
  return context;
}

template <>
tf::Status GroupPairs<GpuDevice>::operator()(tf::OpKernelContext* ctx, const int64_t* pairs,
                                             int64_t n, int32_t num_tables,
                                             tf::Tensor* order_memory, PairGroups* groups) {
  const cudaStream_t stream = GpuStream(ctx);
  GpuCallMemory memory(ctx);
  GpuCheck check;
  int64_t *counts = nullptr, *host_counts = nullptr;
  TF_RETURN_IF_ERROR(ToTfStatus(check.Init(&memory)));
  TF_RETURN_IF_ERROR(ToTfStatus(memory.Device(num_tables, &counts)));
  TF_RETURN_IF_ERROR(ToTfStatus(memory.Pinned(num_tables, &host_counts)));
  groups->order = order_memory->flat<int32_t>().data();
  TF_RETURN_IF_ERROR(CudaToTf(GroupPairsByTable(pairs, n, num_tables, memory.Scratch(),
                                                counts, groups->order, check.device, stream),
                              "group pairs"));
  TF_RETURN_IF_ERROR(ToTfStatus(check.CopyToHost(&memory)));
  TF_RETURN_IF_ERROR(CudaToTf(cudaMemcpyAsync(host_counts, counts, num_tables * sizeof(int64_t),
                                              cudaMemcpyDeviceToHost, stream),
                              "group pairs"));
  TF_RETURN_IF_ERROR(CudaToTf(cudaStreamSynchronize(stream), "group pairs"));
  if (check.host->first_bad != kNoError) {
    return PairNamesNoTable(BadItem(check.host->first_bad), check.host->value_a, num_tables);
  }
  groups->counts.assign(host_counts, host_counts + num_tables);
  return tf::Status();
}

template <>
tf::Status GatherPairRows<GpuDevice>::operator()(tf::OpKernelContext* ctx, const int64_t* pairs,
                                                 const int32_t* order, int64_t n, int64_t dim,
                                                 const float* grad, int64_t* indices,
                                                 float* values) {
  return CudaToTf(::sok::GatherPairRows(pairs, order, n, dim, grad, indices, values,
                                        GpuStream(ctx)),
                  "split gradient");
}

// Zeros first, then each table fills the rows of the pairs naming it in place (a strided view
// of the pairs: nothing is gathered or waited for).
template <>
tf::Status ReadPairRows<GpuDevice>::operator()(tf::OpKernelContext* ctx,
                                               const std::vector<DynamicTable*>& tables,
                                               const int64_t* pairs, int64_t n, int64_t dim,
                                               bool insert, const std::vector<float>& admit,
                                               float* rows) {
  if (n == 0) return tf::Status();
  const TableContext context = TableContextOf<GpuDevice>()(ctx);
  TF_RETURN_IF_ERROR(CudaToTf(cudaMemsetAsync(rows, 0, n * dim * sizeof(float), GpuStream(ctx)),
                              "gather rows"));
  for (size_t t = 0; t < tables.size(); ++t) {
    const TableKeys view{pairs, n, 2, static_cast<int64_t>(t)};
    const Status status = insert ? tables[t]->FindOrInsert(view, rows, admit[t], nullptr, context)
                                 : tables[t]->Find(view, rows, context);
    TF_RETURN_IF_ERROR(ToTfStatus(status));
  }
  return tf::Status();
}

}  // namespace sok::functor
