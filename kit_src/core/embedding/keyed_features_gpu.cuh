// GPU halves of keyed_features.h: the F + 1 feature offsets gathered on the device, and every
// feature's rebased row splits in one launch (kFeaturesPerLaunch features a launch).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace sok {

constexpr int kFeaturesPerLaunch = 32;

struct FeatureRowSplitsTargets {
  int64_t* out[kFeaturesPerLaunch];  // [B + 1] each
  int64_t first_feature = 0;
  int count = 0;
};

template <typename Tsplits>
cudaError_t FeatureBoundsGpu(const Tsplits* row_splits, int64_t batch, int64_t num_features,
                             int64_t* bounds, cudaStream_t stream);

template <typename Tsplits>
cudaError_t RebaseFeatureRowSplitsGpu(const Tsplits* row_splits, int64_t batch,
                                      const FeatureRowSplitsTargets& targets,
                                      cudaStream_t stream);

}  // namespace sok
