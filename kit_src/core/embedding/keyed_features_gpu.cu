#include "kit_src/core/embedding/keyed_features_gpu.cuh"

#include <algorithm>

namespace sok {
namespace {

template <typename Tsplits>
__global__ void GatherBoundsKernel(const Tsplits* row_splits, int64_t batch,
                                   int64_t num_features, int64_t* bounds) {
  const int64_t f = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (f <= num_features) bounds[f] = static_cast<int64_t>(row_splits[f * batch]);
}

template <typename Tsplits>
__global__ void RebaseKernel(const Tsplits* row_splits, int64_t batch,
                             FeatureRowSplitsTargets targets) {
  const int64_t per_feature = batch + 1;
  const int64_t total = per_feature * targets.count;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t local = i / per_feature, row = i - local * per_feature;
    const Tsplits* first = row_splits + (targets.first_feature + local) * batch;
    targets.out[local][row] = static_cast<int64_t>(first[row]) - static_cast<int64_t>(first[0]);
  }
}

}  // namespace

template <typename Tsplits>
cudaError_t FeatureBoundsGpu(const Tsplits* row_splits, int64_t batch, int64_t num_features,
                             int64_t* bounds, cudaStream_t stream) {
  const int threads = 128;
  const int blocks = static_cast<int>((num_features + 1 + threads - 1) / threads);
  GatherBoundsKernel<<<blocks, threads, 0, stream>>>(row_splits, batch, num_features, bounds);
  return cudaGetLastError();
}

template <typename Tsplits>
cudaError_t RebaseFeatureRowSplitsGpu(const Tsplits* row_splits, int64_t batch,
                                      const FeatureRowSplitsTargets& targets,
                                      cudaStream_t stream) {
  const int64_t total = (batch + 1) * targets.count;
  if (total == 0) return cudaSuccess;
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((total + threads - 1) / threads, 4096));
  RebaseKernel<<<blocks, threads, 0, stream>>>(row_splits, batch, targets);
  return cudaGetLastError();
}

#define SOK_INSTANTIATE(T)                                                                  \
  template cudaError_t FeatureBoundsGpu<T>(const T*, int64_t, int64_t, int64_t*,            \
                                           cudaStream_t);                                   \
  template cudaError_t RebaseFeatureRowSplitsGpu<T>(const T*, int64_t,                      \
                                                    const FeatureRowSplitsTargets&,         \
                                                    cudaStream_t);
SOK_INSTANTIATE(int32_t)
SOK_INSTANTIATE(int64_t)
#undef SOK_INSTANTIATE

}  // namespace sok
