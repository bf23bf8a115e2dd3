// One warp per bag; each lane owns dim/32 columns, so a row is read with coalesced loads.
#include "kit_src/core/embedding/pooled_lookup.cuh"

namespace sok {
namespace {

constexpr int kWarpsPerBlock = 8;

__device__ float BagDenominator(const PooledBatch& batch, int64_t begin, int64_t end) {
  if (!batch.mean) return 1.0f;
  if (batch.weights == nullptr) return static_cast<float>(end - begin);
  float total = 0.0f;
  for (int64_t i = begin; i < end; ++i) total += batch.weights[i];
  return total;
}

__global__ void ForwardKernel(const float* __restrict__ table, int64_t dim, PooledBatch batch,
                              float* __restrict__ output) {
  const int64_t bag = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.y;
  if (bag >= batch.bags) return;
  const int lane = threadIdx.x;
  const int64_t begin = batch.offsets[bag], end = batch.offsets[bag + 1];
  const float denominator = BagDenominator(batch, begin, end);
  const float inverse = denominator == 0.0f ? 0.0f : 1.0f / denominator;
  float* out = output + bag * dim;
  for (int64_t d0 = 0; d0 < dim; d0 += 32 * 4) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t i = begin; i < end; ++i) {
      const float w = batch.weights ? batch.weights[i] : 1.0f;
      const float* row = table + batch.ids[i] * dim;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int64_t d = d0 + k * 32 + lane;
        if (d < dim) acc[k] += w * __ldg(row + d);
      }
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int64_t d = d0 + k * 32 + lane;
      if (d < dim) out[d] = acc[k] * inverse;
    }
  }
}

__global__ void SgdBackwardKernel(float* __restrict__ table, int64_t dim, PooledBatch batch,
                                  const float* __restrict__ output_grad, float lr) {
  const int64_t bag = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.y;
  if (bag >= batch.bags) return;
  const int lane = threadIdx.x;
  const int64_t begin = batch.offsets[bag], end = batch.offsets[bag + 1];
  const float denominator = BagDenominator(batch, begin, end);
  if (denominator == 0.0f) return;
  const float* grad = output_grad + bag * dim;
  for (int64_t i = begin; i < end; ++i) {
    const float scale = -lr * (batch.weights ? batch.weights[i] : 1.0f) / denominator;
    float* row = table + batch.ids[i] * dim;
    for (int64_t d = lane; d < dim; d += 32) atomicAdd(row + d, scale * grad[d]);
  }
}

dim3 Grid(int64_t bags) { return dim3(static_cast<unsigned>((bags + kWarpsPerBlock - 1) / kWarpsPerBlock)); }

}  // namespace

cudaError_t PooledLookupForwardGpu(const float* table, int64_t dim, const PooledBatch& batch,
                                   float* output, cudaStream_t stream) {
  if (batch.bags == 0) return cudaSuccess;
  ForwardKernel<<<Grid(batch.bags), dim3(32, kWarpsPerBlock), 0, stream>>>(table, dim, batch,
                                                                           output);
  return cudaGetLastError();
}

cudaError_t PooledSgdBackwardGpu(float* table, int64_t dim, const PooledBatch& batch,
                                 const float* output_grad, float lr, cudaStream_t stream) {
  if (batch.bags == 0) return cudaSuccess;
  SgdBackwardKernel<<<Grid(batch.bags), dim3(32, kWarpsPerBlock), 0, stream>>>(table, dim, batch,
                                                                               output_grad, lr);
  return cudaGetLastError();
}

}  // namespace sok
