// GPU halves of keyed_features.h: the F + 1 feature offsets gathered on the device, every
// feature's rebased row splits in one launch, and a compactly staged batch widened back
// (kFeaturesPerLaunch features a launch).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kit_src/core/embedding/keyed_features.h"
#include "kit_src/core/gpu_call.h"

namespace sok {

constexpr int kFeaturesPerLaunch = 32;

struct FeatureRowSplitsTargets {
  int64_t* out[kFeaturesPerLaunch];  // [B + 1] each
  int64_t first_feature = 0;
  int count = 0;
};

// One feature of a compactly staged batch (keyed_features.h, CompactFeature) on the device:
// its staged values and row splits, and where they widen to.
struct CompactFeatureTarget {
  const char* staged_values = nullptr;
  const char* staged_splits = nullptr;
  char* values = nullptr;    // `count` values of the batch's element type
  int64_t* splits = nullptr;  // [batch + 1]
  int64_t count = 0;
  int32_t value_coding = 0, split_coding = 0;  // ValueCoding, SplitCoding
};

struct CompactFeatureTargets {
  CompactFeatureTarget feature[kFeaturesPerLaunch];
  int count = 0;
};

// ExpandCompactFeature (keyed_features.h) of every target: four launches, the row splits'
// scan spread over tiles of every feature. `scratch`: ExpandCompactScratch(batch) int64s on
// the device.
int64_t ExpandCompactScratch(int64_t batch);
cudaError_t ExpandCompactFeaturesGpu(const CompactFeatureTargets& targets, int64_t batch,
                                     int64_t element_bytes, int64_t* scratch,
                                     cudaStream_t stream);

template <typename Tsplits>
cudaError_t FeatureBoundsGpu(const Tsplits* row_splits, int64_t batch, int64_t num_features,
                             int64_t* bounds, cudaStream_t stream);

template <typename Tsplits>
cudaError_t RebaseFeatureRowSplitsGpu(const Tsplits* row_splits, int64_t batch,
                                      const FeatureRowSplitsTargets& targets,
                                      cudaStream_t stream);

// Where each feature of a group, its staged bytes at `device`, widens to in `layout`: values
// (bytes of element-sized values) and splits (int64) of the outputs.
std::vector<CompactFeatureTarget> CompactGroupTargets(const char* device,
                                                      const CompactGroup& group,
                                                      const std::vector<int64_t>& bounds,
                                                      int64_t element, const FeatureLayout& layout,
                                                      char* values, int64_t* splits);

// Copies a group staged in pinned memory (`staged`) to the device and adds its features'
// widening to `targets`.
Status UploadCompactGroup(GpuCall* call, const char* staged, const CompactGroup& group,
                          const std::vector<int64_t>& bounds, int64_t element,
                          const FeatureLayout& layout, char* values, int64_t* splits,
                          std::vector<CompactFeatureTarget>* targets);

// Widens every target, kFeaturesPerLaunch a launch.
Status ExpandCompactTargetsGpu(GpuCall* call, const std::vector<CompactFeatureTarget>& targets,
                               int64_t batch, int64_t element);

// bounds[f] = row_splits[f * batch], f in [0, num_features], copied to the host: waits for
// the stream.
template <typename Tsplits>
Status FeatureBoundsToHost(GpuCall* call, const Tsplits* row_splits, int64_t batch,
                           int64_t num_features, std::vector<int64_t>* bounds);

}  // namespace sok
