// GPU functors of Sok>PoolFromTables, Sok>SpreadPooledGrad and Sok>PooledGradShares
// (pool_from_tables_functor.h): kit_src/core/embedding/lookup_gpu.cu on TensorFlow's stream,
// the lookups by value in the kernels' parameters. Nothing waits for the device: bad input is
// left in the check record for Sok>CheckGatheredIds.
#include <vector>

#include "kit_src/tf/kernels/gpu_op_util.h"
#include "kit_src/tf/kernels/pool_from_tables_functor.h"

namespace sok::functor {
namespace {

// The lookups as the device kernels take them.
std::vector<GpuPooledLookup> DeviceLookups(const std::vector<PooledLookup<float>>& lookups) {
  std::vector<GpuPooledLookup> device(lookups.size());
  for (size_t l = 0; l < lookups.size(); ++l) {
    const PooledLookup<float>& lookup = lookups[l];
    GpuPooledLookup& d = device[l];
    d.row_splits = lookup.row_splits;
    d.batch = lookup.batch;
    d.weights = lookup.weights;
    d.combiner = static_cast<int32_t>(lookup.combiner);
    d.output = lookup.output;
    d.output_grad = lookup.output_grad;
    d.stride = lookup.stride;
  }
  return device;
}

}  // namespace

template <>
tf::Status PoolFromTables<GpuDevice>::operator()(tf::OpKernelContext* ctx,
                                                 const std::vector<LookupTable<float>>& tables,
                                                 const std::vector<PooledLookup<float>>& lookups,
                                                 int64_t dim, LookupCheck* check) {
  std::vector<GpuPooledLookup> device = DeviceLookups(lookups);
  for (size_t l = 0; l < lookups.size(); ++l) {
    device[l].ids = tables[l].ids;
    device[l].ids_count = tables[l].count;
    device[l].weights_count = lookups[l].weights ? tables[l].count : 0;
    device[l].table = GpuShard{tables[l].data, tables[l].rows};
  }
  return CudaToTf(PoolFromTablesGpu(device, dim, check, GpuStream(ctx)), "pool from tables");
}

template <>
tf::Status SpreadPooledGrad<GpuDevice>::operator()(tf::OpKernelContext* ctx,
                                                   const std::vector<PooledLookup<float>>& lookups,
                                                   const std::vector<int64_t>& id_counts,
                                                   const std::vector<float*>& id_grads,
                                                   int64_t dim) {
  std::vector<GpuPooledLookup> device = DeviceLookups(lookups);
  for (size_t l = 0; l < lookups.size(); ++l) {
    device[l].ids_count = id_counts[l];
    device[l].id_grads = id_grads[l];
  }
  return CudaToTf(SpreadPooledGradGpu(device, dim, GpuStream(ctx)), "spread pooled grad");
}

template <>
tf::Status PooledGradShares<GpuDevice>::operator()(
    tf::OpKernelContext* ctx, const std::vector<PooledLookup<float>>& lookups,
    const std::vector<int64_t>& id_counts, const std::vector<int64_t>& row_first,
    const std::vector<int64_t>& row_step, const std::vector<int64_t*>& use_rows,
    const std::vector<float*>& use_scales) {
  std::vector<GpuPooledLookup> device = DeviceLookups(lookups);
  for (size_t l = 0; l < lookups.size(); ++l) {
    device[l].ids_count = id_counts[l];
    device[l].use_rows = use_rows[l];
    device[l].use_scales = use_scales[l];
    device[l].share_row_first = row_first[l];
    device[l].share_row_step = row_step[l];
  }
  return CudaToTf(PooledGradSharesGpu(device, GpuStream(ctx)), "pooled grad shares");
}

}  // namespace sok::functor
