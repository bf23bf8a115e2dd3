// Forward: one warp per bag; each lane owns dim/32 columns, so a row is read with coalesced
// loads. Rows whose width is a multiple of 4 floats move as float4.
// Backward (SGD): power-law ids make the hottest rows take thousands of atomic adds a step,
// serialised on one address. Each block therefore sorts a chunk of the batch's lookups by id
// in shared memory and adds each run of equal ids once: the hottest row then takes one
// atomic per chunk instead of one per use. Other widths use one atomic per use.
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>

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

constexpr int kSortThreads = 256, kSortItems = 4, kChunk = kSortThreads * kSortItems;

// The bag that lookup i belongs to: offsets[bag] <= i < offsets[bag + 1].
__device__ int64_t BagOf(const int64_t* offsets, int64_t bags, int64_t i) {
  int64_t low = 0, high = bags;  // offsets[low] <= i < offsets[high]
  while (high - low > 1) {
    const int64_t mid = (low + high) / 2;
    if (offsets[mid] <= i) low = mid; else high = mid;
  }
  return low;
}

__global__ void __launch_bounds__(kSortThreads)
SgdBackwardSortedKernel(float4* __restrict__ table, int64_t dim4, PooledBatch batch, int64_t nnz,
                        const float4* __restrict__ output_grad, float lr) {
  using Sort = cub::BlockRadixSort<uint32_t, kSortThreads, kSortItems, int32_t>;
  using Scan = cub::BlockScan<int32_t, kSortThreads>;
  __shared__ union {
    typename Sort::TempStorage sort;
    typename Scan::TempStorage scan;
  } temp;
  __shared__ int32_t order[kChunk];      // chunk-local lookup index, sorted by id
  __shared__ int32_t run_start[kChunk + 1];
  __shared__ int32_t bag_of[kChunk];     // per chunk-local lookup: its bag
  __shared__ float scale_of[kChunk];     // per chunk-local lookup: -lr * its share
  __shared__ int32_t num_runs;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kChunk;
  const int count = static_cast<int>(nnz - first < kChunk ? nnz - first : kChunk);
  // Each thread's lookups are consecutive: one binary search finds the first one's bag.
  int64_t bag = -1;
  for (int k = 0; k < kSortItems; ++k) {
    const int local = threadIdx.x * kSortItems + k;
    if (local >= count) break;
    const int64_t i = first + local;
    if (bag < 0) {
      bag = BagOf(batch.offsets, batch.bags, i);
    } else {
      while (batch.offsets[bag + 1] <= i) ++bag;
    }
    const float denominator =
        BagDenominator(batch, batch.offsets[bag], batch.offsets[bag + 1]);
    bag_of[local] = static_cast<int32_t>(bag);
    scale_of[local] = denominator == 0.0f
                          ? 0.0f
                          : -lr * (batch.weights ? batch.weights[i] : 1.0f) / denominator;
  }
  // Sort the chunk's lookups by (the low 32 bits of) their id; padding sorts last.
  uint32_t keys[kSortItems];
  int32_t values[kSortItems];
  for (int k = 0; k < kSortItems; ++k) {
    const int local = threadIdx.x * kSortItems + k;
    keys[k] = local < count ? static_cast<uint32_t>(batch.ids[first + local]) : 0xffffffffu;
    values[k] = local;
  }
  Sort(temp.sort).SortBlockedToStriped(keys, values);
  __syncthreads();
  // Runs of equal ids (full 64-bit comparison: equal low bits alone do not merge ids).
  int32_t starts[kSortItems], run_index[kSortItems];
  for (int k = 0; k < kSortItems; ++k) {
    const int sorted = k * kSortThreads + threadIdx.x;  // striped layout
    order[sorted] = values[k];
  }
  __syncthreads();
  for (int k = 0; k < kSortItems; ++k) {
    const int sorted = threadIdx.x * kSortItems + k;  // blocked again, for the scan
    starts[k] = sorted < count &&
                (sorted == 0 || batch.ids[first + order[sorted]] !=
                                    batch.ids[first + order[sorted - 1]]);
  }
  int32_t total = 0;
  Scan(temp.scan).ExclusiveSum(starts, run_index, total);
  for (int k = 0; k < kSortItems; ++k) {
    const int sorted = threadIdx.x * kSortItems + k;
    if (starts[k]) run_start[run_index[k]] = sorted;
  }
  if (threadIdx.x == 0) {
    num_runs = total;
    run_start[total] = count;
  }
  __syncthreads();
  // One warp per run: sum the run's scaled bag gradients, then one atomic per float4.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = kSortThreads / 32;
  for (int run = warp; run < num_runs; run += warps) {
    const int begin = run_start[run], end = run_start[run + 1];
    const int64_t id = batch.ids[first + order[begin]];
    for (int64_t d = lane; d < dim4; d += 32) {
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int j = begin; j < end; ++j) {
        const float scale = scale_of[order[j]];
        const float4 g = output_grad[static_cast<int64_t>(bag_of[order[j]]) * dim4 + d];
        acc.x += scale * g.x;
        acc.y += scale * g.y;
        acc.z += scale * g.z;
        acc.w += scale * g.w;
      }
      float4* row = table + id * dim4 + d;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      atomicAdd(row, acc);
#else
      float* r = reinterpret_cast<float*>(row);
      atomicAdd(r, acc.x);
      atomicAdd(r + 1, acc.y);
      atomicAdd(r + 2, acc.z);
      atomicAdd(r + 3, acc.w);
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
    const int64_t nnz = batch.nnz;
    if (nnz == 0) return cudaSuccess;
    SgdBackwardSortedKernel<<<static_cast<unsigned>((nnz + kChunk - 1) / kChunk), kSortThreads,
                              0, stream>>>(reinterpret_cast<float4*>(table), dim / 4, batch, nnz,
                                           reinterpret_cast<const float4*>(output_grad), lr);
  } else {
    SgdBackwardKernel<<<Grid(batch.bags), dim3(32, kWarpsPerBlock), 0, stream>>>(
        table, dim, batch, output_grad, lr);
  }
  return cudaGetLastError();
}

}  // namespace sok
