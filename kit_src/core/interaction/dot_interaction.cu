// One block per sample: the sample's [F, D] features (and, backward, its pair gradients) are
// staged in shared memory as float, so every dot product reads on-chip data and half inputs
// are summed in float.
#include "kit_src/core/interaction/dot_interaction.cuh"

namespace sok {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float Widen(float x) { return x; }
__device__ __forceinline__ float Widen(__half x) { return __half2float(x); }
template <typename T>
__device__ __forceinline__ T Narrow(float x);
template <>
__device__ __forceinline__ float Narrow<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half Narrow<__half>(float x) { return __float2half_rn(x); }

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
