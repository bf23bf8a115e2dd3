// One warp per bag; each lane owns dim/32 columns, so a row is read with coalesced loads.
// Rows whose width is a multiple of 4 floats move as float4: a quarter of the load and
// (on sm_90, which has vector atomics) of the atomic instructions.
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

__global__ void ForwardKernelVec4(const float4* __restrict__ table, int64_t dim4,
                                  PooledBatch batch, float4* __restrict__ output) {
  const int64_t bag = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.y;
  if (bag >= batch.bags) return;
  const int64_t begin = batch.offsets[bag], end = batch.offsets[bag + 1];
  const float denominator = BagDenominator(batch, begin, end);
  const float inverse = denominator == 0.0f ? 0.0f : 1.0f / denominator;
  for (int64_t d = threadIdx.x; d < dim4; d += 32) {
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int64_t i = begin; i < end; ++i) {
      const float w = batch.weights ? batch.weights[i] : 1.0f;
      const float4 v = __ldg(table + batch.ids[i] * dim4 + d);
      acc.x += w * v.x;
      acc.y += w * v.y;
      acc.z += w * v.z;
      acc.w += w * v.w;
    }
    output[bag * dim4 + d] =
        make_float4(acc.x * inverse, acc.y * inverse, acc.z * inverse, acc.w * inverse);
  }
}

__global__ void SgdBackwardKernelVec4(float4* __restrict__ table, int64_t dim4,
                                      PooledBatch batch, const float4* __restrict__ output_grad,
                                      float lr) {
  const int64_t bag = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.y;
  if (bag >= batch.bags) return;
  const int64_t begin = batch.offsets[bag], end = batch.offsets[bag + 1];
  const float denominator = BagDenominator(batch, begin, end);
  if (denominator == 0.0f) return;
  for (int64_t d = threadIdx.x; d < dim4; d += 32) {
    const float4 g = output_grad[bag * dim4 + d];
    for (int64_t i = begin; i < end; ++i) {
      const float scale = -lr * (batch.weights ? batch.weights[i] : 1.0f) / denominator;
      float4* row = table + batch.ids[i] * dim4 + d;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      atomicAdd(row, make_float4(scale * g.x, scale * g.y, scale * g.z, scale * g.w));
#else
      float* r = reinterpret_cast<float*>(row);
      atomicAdd(r, scale * g.x);
      atomicAdd(r + 1, scale * g.y);
      atomicAdd(r + 2, scale * g.z);
      atomicAdd(r + 3, scale * g.w);
#endif
    }
  }
}

bool Vec4(int64_t dim, const void* a, const void* b) {
  return dim % 4 == 0 && reinterpret_cast<uintptr_t>(a) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(b) % 16 == 0;
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
  if (Vec4(dim, table, output)) {
    ForwardKernelVec4<<<Grid(batch.bags), dim3(32, kWarpsPerBlock), 0, stream>>>(
        reinterpret_cast<const float4*>(table), dim / 4, batch, reinterpret_cast<float4*>(output));
  } else {
    ForwardKernel<<<Grid(batch.bags), dim3(32, kWarpsPerBlock), 0, stream>>>(table, dim, batch,
                                                                             output);
  }
  return cudaGetLastError();
}

cudaError_t PooledSgdBackwardGpu(float* table, int64_t dim, const PooledBatch& batch,
                                 const float* output_grad, float lr, cudaStream_t stream) {
  if (batch.bags == 0) return cudaSuccess;
  if (Vec4(dim, table, output_grad)) {
    SgdBackwardKernelVec4<<<Grid(batch.bags), dim3(32, kWarpsPerBlock), 0, stream>>>(
        reinterpret_cast<float4*>(table), dim / 4, batch,
        reinterpret_cast<const float4*>(output_grad), lr);
  } else {
    SgdBackwardKernel<<<Grid(batch.bags), dim3(32, kWarpsPerBlock), 0, stream>>>(
        table, dim, batch, output_grad, lr);
  }
  return cudaGetLastError();
}

}  // namespace sok
