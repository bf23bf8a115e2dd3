// One block per sample: the sample's [F, D] features (and, backward, its pair gradients) are
// staged in shared memory as float, so every dot product reads on-chip data and half inputs
// are summed in float.
#include "kit_src/core/interaction/dot_interaction.cuh"

#include <algorithm>

#include "kit_src/core/value_storage.cuh"

namespace sok {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void ForwardKernel(const T* __restrict__ features, T* __restrict__ output,
                              int num_features, int dim) {
  extern __shared__ float x[];  // [F, D]
  const int64_t b = blockIdx.x;
  const int width = dim + num_features * (num_features - 1) / 2;
  const T* in = features + b * num_features * dim;
  T* out = output + b * width;
  for (int k = threadIdx.x; k < num_features * dim; k += blockDim.x) x[k] = Widen(in[k]);
  __syncthreads();
  for (int k = threadIdx.x; k < dim; k += blockDim.x) out[k] = in[k];
  const int pairs = num_features * (num_features - 1) / 2;
  // Warp w computes pairs w, w + warps, ...: lanes split the D products, then a shuffle sum.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int p = warp; p < pairs; p += warps) {
    // Pair p of the row-major lower triangle: row i has i pairs, starting at i(i-1)/2.
    int i = static_cast<int>((1.0f + sqrtf(1.0f + 8.0f * p)) * 0.5f);
    while (i * (i - 1) / 2 > p) --i;
    while ((i + 1) * i / 2 <= p) ++i;
    const int j = p - i * (i - 1) / 2;
    float sum = 0.0f;
    for (int d = lane; d < dim; d += 32) sum += x[i * dim + d] * x[j * dim + d];
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_down_sync(0xffffffff, sum, offset);
    if (lane == 0) out[dim + p] = Narrow<T>(sum);
  }
}

template <typename T>
__global__ void BackwardKernel(const T* __restrict__ features, const T* __restrict__ output_grad,
                               T* __restrict__ features_grad, int num_features, int dim) {
  extern __shared__ float shared[];
  float* x = shared;                          // [F, D]
  float* g = shared + num_features * dim;     // [F, F] symmetric pair gradients, 0 diagonal
  const int64_t b = blockIdx.x;
  const int width = dim + num_features * (num_features - 1) / 2;
  const T* in = features + b * num_features * dim;
  const T* grad = output_grad + b * width;
  for (int k = threadIdx.x; k < num_features * dim; k += blockDim.x) x[k] = Widen(in[k]);
  for (int k = threadIdx.x; k < num_features * num_features; k += blockDim.x) {
    const int i = k / num_features, j = k % num_features;
    g[k] = i == j ? 0.0f
                  : Widen(grad[dim + (i > j ? i * (i - 1) / 2 + j : j * (j - 1) / 2 + i)]);
  }
  __syncthreads();
  T* dx = features_grad + b * num_features * dim;
  for (int k = threadIdx.x; k < num_features * dim; k += blockDim.x) {
    const int i = k / dim, d = k % dim;
    float sum = i == 0 ? Widen(grad[d]) : 0.0f;  // x[0] is copied to the output
    for (int j = 0; j < num_features; ++j) sum += g[i * num_features + j] * x[j * dim + d];
    dx[k] = Narrow<T>(sum);
  }
}

// Backward for up to kMaxFeatures features: dx[i, d] = sum_j g[i, j] x[j, d] (+ grad[d] for
// i = 0). A thread owns column d: it keeps x[:, d] in registers (read once from global
// memory), and the pair gradients, staged in shared memory with rows padded to a multiple of
// 4, are read as float4 broadcasts, so shared memory serves about a quarter of a load per
// multiply-add (the staged kernel above reads two).
constexpr int kMaxRegisterFeatures = 32;

template <typename T>
__global__ void BackwardColumnKernel(const T* __restrict__ features,
                                     const T* __restrict__ output_grad,
                                     T* __restrict__ features_grad, int num_features, int dim) {
  extern __shared__ float4 g4[];                  // [F, padded / 4]
  float* g = reinterpret_cast<float*>(g4);
  const int padded = (num_features + 3) & ~3;
  const int64_t b = blockIdx.x;
  const int width = dim + num_features * (num_features - 1) / 2;
  const T* in = features + b * num_features * dim;
  const T* grad = output_grad + b * width;
  for (int k = threadIdx.x; k < num_features * padded; k += blockDim.x) {
    const int i = k / padded, j = k % padded;
    g[k] = (i == j || j >= num_features)
               ? 0.0f
               : Widen(grad[dim + (i > j ? i * (i - 1) / 2 + j : j * (j - 1) / 2 + i)]);
  }
  __syncthreads();
  T* dx = features_grad + b * num_features * dim;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    float x[kMaxRegisterFeatures];
#pragma unroll
    for (int j = 0; j < kMaxRegisterFeatures; ++j) {
      x[j] = j < num_features ? Widen(in[j * dim + d]) : 0.0f;
    }
    for (int i = 0; i < num_features; ++i) {
      float sum = i == 0 ? Widen(grad[d]) : 0.0f;  // x[0] is copied to the output
      const float4* row = g4 + i * (padded / 4);
#pragma unroll
      for (int q = 0; q < kMaxRegisterFeatures / 4; ++q) {
        if (4 * q < padded) {
          const float4 w = row[q];
          sum += w.x * x[4 * q] + w.y * x[4 * q + 1] + w.z * x[4 * q + 2] + w.w * x[4 * q + 3];
        }
      }
      dx[i * dim + d] = Narrow<T>(sum);
    }
  }
}

// Dynamic shared memory above the default 48 KiB must be asked for per kernel (Hopper gives up
// to 227 KiB a block); more than the device has is refused before the launch.
template <typename Kernel>
cudaError_t AllowSharedMemory(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  int device = 0, limit = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status == cudaSuccess) {
    status = cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  }
  if (status != cudaSuccess) return status;
  if (bytes > static_cast<size_t>(limit)) return cudaErrorInvalidValue;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(bytes));
}

}  // namespace

template <typename T>
cudaError_t DotInteractionForwardGpu(const InteractionShape& shape, const T* features, T* output,
                                     cudaStream_t stream) {
  if (shape.num_features < 1 || shape.dim < 0) return cudaErrorInvalidValue;
  if (shape.batch == 0) return cudaSuccess;
  const size_t shared = shape.num_features * shape.dim * sizeof(float);
  const cudaError_t allowed = AllowSharedMemory(ForwardKernel<T>, shared);
  if (allowed != cudaSuccess) return allowed;
  ForwardKernel<T><<<shape.batch, kThreads, shared, stream>>>(
      features, output, static_cast<int>(shape.num_features), static_cast<int>(shape.dim));
  return cudaGetLastError();
}

template <typename T>
cudaError_t DotInteractionBackwardGpu(const InteractionShape& shape, const T* features,
                                      const T* output_grad, T* features_grad,
                                      cudaStream_t stream) {
  if (shape.num_features < 1 || shape.dim < 0) return cudaErrorInvalidValue;
  if (shape.batch == 0) return cudaSuccess;
  if (shape.num_features <= kMaxRegisterFeatures) {
    const int64_t padded = (shape.num_features + 3) & ~3;
    const int threads = static_cast<int>(std::min<int64_t>(
        kThreads, std::max<int64_t>(32, (shape.dim + 31) / 32 * 32)));
    BackwardColumnKernel<T><<<shape.batch, threads, shape.num_features * padded * sizeof(float),
                              stream>>>(features, output_grad, features_grad,
                                        static_cast<int>(shape.num_features),
                                        static_cast<int>(shape.dim));
    return cudaGetLastError();
  }
  const size_t shared =
      (shape.num_features * shape.dim + shape.num_features * shape.num_features) * sizeof(float);
  const cudaError_t allowed = AllowSharedMemory(BackwardKernel<T>, shared);
  if (allowed != cudaSuccess) return allowed;
  BackwardKernel<T><<<shape.batch, kThreads, shared, stream>>>(
      features, output_grad, features_grad, static_cast<int>(shape.num_features),
      static_cast<int>(shape.dim));
  return cudaGetLastError();
}

template cudaError_t DotInteractionForwardGpu<float>(const InteractionShape&, const float*,
                                                     float*, cudaStream_t);
template cudaError_t DotInteractionForwardGpu<__half>(const InteractionShape&, const __half*,
                                                      __half*, cudaStream_t);
template cudaError_t DotInteractionBackwardGpu<float>(const InteractionShape&, const float*,
                                                      const float*, float*, cudaStream_t);
template cudaError_t DotInteractionBackwardGpu<__half>(const InteractionShape&, const __half*,
                                                       const __half*, __half*, cudaStream_t);

}  // namespace sok
