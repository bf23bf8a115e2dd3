#include "kit_src/core/embedding/keyed_features_gpu.cuh"

#include <algorithm>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "kit_src/core/embedding/keyed_features.h"

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

template <typename T>
__device__ void CopyValues(const CompactFeatureTarget& target, int64_t begin, int64_t step) {
  const T* from = reinterpret_cast<const T*>(target.staged_values);
  T* to = reinterpret_cast<T*>(target.values);
  for (int64_t i = begin; i < target.count; i += step) to[i] = from[i];
}

// blockIdx.y: the feature; its values widened (int32 ids to int64) or copied.
__global__ void ExpandValuesKernel(CompactFeatureTargets targets, int64_t element_bytes) {
  const CompactFeatureTarget& target = targets.feature[blockIdx.y];
  const int64_t begin = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  if (target.value_coding == static_cast<int32_t>(ValueCoding::kInt32)) {
    const int32_t* from = reinterpret_cast<const int32_t*>(target.staged_values);
    int64_t* to = reinterpret_cast<int64_t*>(target.values);
    for (int64_t i = begin; i < target.count; i += step) to[i] = from[i];
  } else if (element_bytes == 8) {
    CopyValues<int64_t>(target, begin, step);
  } else if (element_bytes == 4) {
    CopyValues<int32_t>(target, begin, step);
  } else {
    CopyValues<uint16_t>(target, begin, step);
  }
}

constexpr int kScanThreads = 256;
constexpr int kScanItems = 8;
constexpr int64_t kScanTile = kScanThreads * kScanItems;

__device__ bool SplitsAsLengths(const CompactFeatureTarget& target) {
  return target.split_coding == static_cast<int32_t>(SplitCoding::kLengths8);
}

// One tile of a feature's length bytes, kScanItems a thread, zero past the batch.
__device__ void LoadLengthTile(const CompactFeatureTarget& target, int64_t batch, int64_t tile,
                               int64_t (&items)[kScanItems]) {
  const uint8_t* lengths = reinterpret_cast<const uint8_t*>(target.staged_splits);
  const int64_t first = tile * kScanTile + threadIdx.x * kScanItems;
#pragma unroll
  for (int k = 0; k < kScanItems; ++k) items[k] = first + k < batch ? lengths[first + k] : 0;
}

// blockIdx.y: the feature, blockIdx.x: a tile of its length bytes; the tile's sum.
__global__ void __launch_bounds__(kScanThreads)
    TileSumsKernel(CompactFeatureTargets targets, int64_t batch, int64_t tiles,
                   int64_t* tile_sums) {
  const CompactFeatureTarget& target = targets.feature[blockIdx.y];
  if (!SplitsAsLengths(target)) return;
  using Reduce = cub::BlockReduce<int64_t, kScanThreads>;
  __shared__ typename Reduce::TempStorage reduce;
  int64_t items[kScanItems];
  LoadLengthTile(target, batch, blockIdx.x, items);
  int64_t sum = 0;
#pragma unroll
  for (int k = 0; k < kScanItems; ++k) sum += items[k];
  sum = Reduce(reduce).Sum(sum);
  if (threadIdx.x == 0) tile_sums[blockIdx.y * tiles + blockIdx.x] = sum;
}

// blockIdx.x: the feature; its tile sums become each tile's offset (an exclusive sum).
__global__ void __launch_bounds__(kScanThreads)
    TileOffsetsKernel(CompactFeatureTargets targets, int64_t tiles, int64_t* tile_sums) {
  if (!SplitsAsLengths(targets.feature[blockIdx.x])) return;
  using Scan = cub::BlockScan<int64_t, kScanThreads>;
  __shared__ typename Scan::TempStorage scan;
  int64_t* sums = tile_sums + blockIdx.x * tiles;
  int64_t running = 0;
  for (int64_t chunk = 0; chunk < tiles; chunk += kScanThreads) {
    const int64_t t = chunk + threadIdx.x;
    int64_t value = t < tiles ? sums[t] : 0, chunk_total = 0;
    Scan(scan).ExclusiveSum(value, value, chunk_total);
    if (t < tiles) sums[t] = running + value;
    running += chunk_total;
    __syncthreads();  // the scan's shared memory is reused by the next chunk
  }
}

// blockIdx.y: the feature, blockIdx.x: a tile; its row splits as its tile's offset plus the
// running sum of the tile's length bytes, or copied. Summed lengths are kept within the
// feature's values (a staged batch handed in from outside could claim more), so no later
// kernel reads past them.
__global__ void __launch_bounds__(kScanThreads)
    WriteSplitsKernel(CompactFeatureTargets targets, int64_t batch, int64_t tiles,
                      const int64_t* tile_offsets) {
  const CompactFeatureTarget& target = targets.feature[blockIdx.y];
  if (!SplitsAsLengths(target)) {
    const int64_t* from = reinterpret_cast<const int64_t*>(target.staged_splits);
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i <= batch;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      target.splits[i] = from[i];
    }
    return;
  }
  using Scan = cub::BlockScan<int64_t, kScanThreads>;
  __shared__ typename Scan::TempStorage scan;
  int64_t items[kScanItems];
  LoadLengthTile(target, batch, blockIdx.x, items);
  Scan(scan).InclusiveSum(items, items);
  const int64_t offset = tile_offsets[blockIdx.y * tiles + blockIdx.x];
  const int64_t first = blockIdx.x * kScanTile + threadIdx.x * kScanItems;
#pragma unroll
  for (int k = 0; k < kScanItems; ++k) {
    if (first + k < batch) target.splits[first + k + 1] = min(offset + items[k], target.count);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) target.splits[0] = 0;
}

int64_t ScanTiles(int64_t batch) {
  return std::max<int64_t>(1, (batch + kScanTile - 1) / kScanTile);
}

}  // namespace

int64_t ExpandCompactScratch(int64_t batch) { return kFeaturesPerLaunch * ScanTiles(batch); }

cudaError_t ExpandCompactFeaturesGpu(const CompactFeatureTargets& targets, int64_t batch,
                                     int64_t element_bytes, int64_t* scratch,
                                     cudaStream_t stream) {
  if (targets.count == 0) return cudaSuccess;
  int64_t most = 0;
  for (int i = 0; i < targets.count; ++i) most = std::max(most, targets.feature[i].count);
  const int threads = 256;
  if (most > 0) {
    const int blocks = static_cast<int>(std::min<int64_t>((most + threads - 1) / threads, 512));
    ExpandValuesKernel<<<dim3(blocks, targets.count), threads, 0, stream>>>(targets,
                                                                            element_bytes);
  }
  // Row splits: every tile of every feature at once (a block a feature would walk a
  // million-sample batch's tiles one after another).
  const int64_t tiles = ScanTiles(batch);
  const dim3 grid(static_cast<unsigned>(tiles), targets.count);
  TileSumsKernel<<<grid, kScanThreads, 0, stream>>>(targets, batch, tiles, scratch);
  TileOffsetsKernel<<<targets.count, kScanThreads, 0, stream>>>(targets, tiles, scratch);
  WriteSplitsKernel<<<grid, kScanThreads, 0, stream>>>(targets, batch, tiles, scratch);
  return cudaGetLastError();
}

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

std::vector<CompactFeatureTarget> CompactGroupTargets(const char* device,
                                                      const CompactGroup& group,
                                                      const std::vector<int64_t>& bounds,
                                                      int64_t element, const FeatureLayout& layout,
                                                      char* values, int64_t* splits) {
  std::vector<CompactFeatureTarget> targets;
  for (size_t i = 0; i < group.features.size(); ++i) {
    const int64_t f = group.first + static_cast<int64_t>(i);
    const CompactFeature& feature = group.features[i];
    CompactFeatureTarget target;
    target.staged_values = device + feature.values_at;
    target.staged_splits = device + feature.splits_at;
    target.values = values + layout.value_start[f] * element;
    target.splits = splits + layout.split_start[f];
    target.count = bounds[f + 1] - bounds[f];
    target.value_coding = static_cast<int32_t>(feature.values);
    target.split_coding = static_cast<int32_t>(feature.splits);
    targets.push_back(target);
  }
  return targets;
}

Status UploadCompactGroup(GpuCall* call, const char* staged, const CompactGroup& group,
                          const std::vector<int64_t>& bounds, int64_t element,
                          const FeatureLayout& layout, char* values, int64_t* splits,
                          std::vector<CompactFeatureTarget>* targets) {
  char* device = nullptr;
  SOK_RETURN_IF_ERROR(call->Device(group.bytes, &device));
  if (group.bytes > 0) {
    SOK_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(device, staged, group.bytes,
                                                   cudaMemcpyHostToDevice, call->stream()),
                                   "packed batch upload"));
  }
  const std::vector<CompactFeatureTarget> added =
      CompactGroupTargets(device, group, bounds, element, layout, values, splits);
  targets->insert(targets->end(), added.begin(), added.end());
  return Status::Ok();
}

Status ExpandCompactTargetsGpu(GpuCall* call, const std::vector<CompactFeatureTarget>& targets,
                               int64_t batch, int64_t element) {
  int64_t* scratch = nullptr;
  SOK_RETURN_IF_ERROR(call->Device(ExpandCompactScratch(batch), &scratch));
  for (size_t first = 0; first < targets.size(); first += kFeaturesPerLaunch) {
    CompactFeatureTargets launch;
    launch.count = static_cast<int>(std::min<size_t>(kFeaturesPerLaunch, targets.size() - first));
    std::copy(targets.begin() + first, targets.begin() + first + launch.count, launch.feature);
    SOK_RETURN_IF_ERROR(CudaStatus(
        ExpandCompactFeaturesGpu(launch, batch, element, scratch, call->stream()),
        "packed batch widen"));
  }
  return Status::Ok();
}

template <typename Tsplits>
Status FeatureBoundsToHost(GpuCall* call, const Tsplits* row_splits, int64_t batch,
                           int64_t num_features, std::vector<int64_t>* bounds) {
  int64_t* device = nullptr;
  int64_t* host = nullptr;
  SOK_RETURN_IF_ERROR(call->Device(num_features + 1, &device));
  SOK_RETURN_IF_ERROR(call->Pinned(num_features + 1, &host));
  const cudaStream_t stream = call->stream();
  SOK_RETURN_IF_ERROR(CudaStatus(
      FeatureBoundsGpu(row_splits, batch, num_features, device, stream), "feature bounds"));
  SOK_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(host, device,
                                                 (num_features + 1) * sizeof(int64_t),
                                                 cudaMemcpyDeviceToHost, stream),
                                 "feature bounds copy"));
  SOK_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "feature bounds wait"));
  bounds->assign(host, host + num_features + 1);
  return Status::Ok();
}

#define SOK_INSTANTIATE(T)                                                                  \
  template Status FeatureBoundsToHost<T>(GpuCall*, const T*, int64_t, int64_t,              \
                                         std::vector<int64_t>*);                            \
  template cudaError_t FeatureBoundsGpu<T>(const T*, int64_t, int64_t, int64_t*,            \
                                           cudaStream_t);                                   \
  template cudaError_t RebaseFeatureRowSplitsGpu<T>(const T*, int64_t,                      \
                                                    const FeatureRowSplitsTargets&,         \
                                                    cudaStream_t);
SOK_INSTANTIATE(int32_t)
SOK_INSTANTIATE(int64_t)
#undef SOK_INSTANTIATE

}  // namespace sok
