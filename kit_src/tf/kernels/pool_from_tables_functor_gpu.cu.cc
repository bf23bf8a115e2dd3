// GPU functors of Sok>PoolFromTables, Sok>SpreadPooledGrad and Sok>PooledGradShares (pool_from_tables_functor.h):
// kit_src/core/embedding/lookup_gpu.cu on TensorFlow's stream. Nothing waits for the device:
// bad input is left in the check record for Sok>CheckGatheredIds.
#include <memory>
#include <vector>

#include "kit_src/tf/kernels/gpu_op_util.h"
#include "kit_src/tf/kernels/pool_from_tables_functor.h"

namespace sok::functor {
namespace {

// The lookups as the device kernels take them, laid end to end by sample.
std::vector<GpuPooledLookup> DeviceLookups(const std::vector<PooledLookup<float>>& lookups,
                                           int64_t* samples) {
  std::vector<GpuPooledLookup> device(lookups.size());
  *samples = 0;
  for (size_t l = 0; l < lookups.size(); ++l) {
    const PooledLookup<float>& lookup = lookups[l];
    GpuPooledLookup& d = device[l];
    d.row_splits = lookup.row_splits;
    d.batch = lookup.batch;
    d.first_sample = *samples;
    d.weights = lookup.weights;
    d.combiner = static_cast<int32_t>(lookup.combiner);
    d.output = lookup.output;
    d.output_grad = lookup.output_grad;
    d.stride = lookup.stride;
    *samples += lookup.batch;
  }
  return device;
}

// Uploads the lookups, launches, and keeps the upload until the stream has passed.
template <typename Launch>
tf::Status Run(tf::OpKernelContext* ctx, const std::vector<GpuPooledLookup>& lookups,
               Launch launch) {
  auto memory = std::make_shared<GpuCallMemory>();
  GpuPooledLookup* lookups_device = nullptr;
  TF_RETURN_IF_ERROR(memory->Upload(ctx, lookups, &lookups_device));
  TF_RETURN_IF_ERROR(CudaToTf(launch(lookups_device), ctx->op_kernel().type_string().c_str()));
  return ReleaseAfterStream(ctx, memory);
}

}  // namespace

template <>
tf::Status PoolFromTables<GpuDevice>::operator()(tf::OpKernelContext* ctx,
                                                 const std::vector<LookupTable<float>>& tables,
                                                 const std::vector<PooledLookup<float>>& lookups,
                                                 int64_t dim, LookupCheck* check) {
  int64_t samples = 0;
  std::vector<GpuPooledLookup> device = DeviceLookups(lookups, &samples);
  for (size_t l = 0; l < lookups.size(); ++l) {
    device[l].ids = tables[l].ids;
    device[l].ids_count = tables[l].count;
    device[l].weights_count = lookups[l].weights ? tables[l].count : 0;
    device[l].table = GpuShard{tables[l].data, tables[l].rows};
  }
  const cudaStream_t stream = GpuStream(ctx);
  TF_RETURN_IF_ERROR(CudaToTf(ResetLookupCheck(check, stream), "reset check"));
  const int32_t n = static_cast<int32_t>(device.size());
  return Run(ctx, device, [&](const GpuPooledLookup* lookups_device) {
    return PoolFromTablesGpu(lookups_device, n, samples, dim, check, stream);
  });
}

template <>
tf::Status SpreadPooledGrad<GpuDevice>::operator()(tf::OpKernelContext* ctx,
                                                   const std::vector<PooledLookup<float>>& lookups,
                                                   const std::vector<int64_t>& id_counts,
                                                   const std::vector<float*>& id_grads,
                                                   int64_t dim) {
  int64_t samples = 0;
  std::vector<GpuPooledLookup> device = DeviceLookups(lookups, &samples);
  for (size_t l = 0; l < lookups.size(); ++l) {
    device[l].ids_count = id_counts[l];
    device[l].id_grads = id_grads[l];
  }
  const int32_t n = static_cast<int32_t>(device.size());
  return Run(ctx, device, [&](const GpuPooledLookup* lookups_device) {
    return SpreadPooledGradGpu(lookups_device, n, samples, dim, GpuStream(ctx));
  });
}

template <>
tf::Status PooledGradShares<GpuDevice>::operator()(
    tf::OpKernelContext* ctx, const std::vector<PooledLookup<float>>& lookups,
    const std::vector<int64_t>& id_counts, const std::vector<int64_t>& row_first,
    const std::vector<int64_t>& row_step, const std::vector<int64_t*>& use_rows,
    const std::vector<float*>& use_scales) {
  int64_t samples = 0;
  std::vector<GpuPooledLookup> device = DeviceLookups(lookups, &samples);
  for (size_t l = 0; l < lookups.size(); ++l) {
    device[l].ids_count = id_counts[l];
    device[l].use_rows = use_rows[l];
    device[l].use_scales = use_scales[l];
    device[l].share_row_first = row_first[l];
    device[l].share_row_step = row_step[l];
  }
  const int32_t n = static_cast<int32_t>(device.size());
  return Run(ctx, device, [&](const GpuPooledLookup* lookups_device) {
    return PooledGradSharesGpu(lookups_device, n, samples, GpuStream(ctx));
  });
}

}  // namespace sok::functor
