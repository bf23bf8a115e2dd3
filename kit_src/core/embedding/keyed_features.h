// A batch of F features carried in one ragged tensor, feature-major (feature 0's B samples,
// then feature 1's, as TorchRec's KeyedJaggedTensor and FBGEMM TBE's indices / offsets lay a
// batch out): values [nnz] and row_splits [F * B + 1]. Splitting it into one ragged tensor a
// feature needs the F + 1 value offsets where features start (row_splits[f * B]) and each
// feature's row splits counted from its first value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kit_src/core/status.h"

namespace sok {

// Rows of the packed batch must split evenly into `num_features` features.
inline Status FeatureBatch(int64_t rows, int64_t num_features, int64_t* batch) {
  if (rows < 0 || num_features <= 0 || rows % num_features != 0) {
    return Status::InvalidArgument("the packed batch has " + std::to_string(rows) +
                                   " rows, which do not split into " +
                                   std::to_string(num_features) +
                                   " features of one batch size each (feature-major rows)");
  }
  *batch = rows / num_features;
  return Status::Ok();
}

// bounds (F + 1 values, row_splits[f * B]) must start at 0, never decrease and end at the
// number of values.
inline Status CheckFeatureBounds(const std::vector<int64_t>& bounds, int64_t num_values) {
  for (size_t f = 0; f + 1 < bounds.size(); ++f) {
    if (bounds[f] > bounds[f + 1] || bounds[f] < 0) {
      return Status::InvalidArgument("the packed batch's row_splits decrease at feature " +
                                     std::to_string(f) + " (" + std::to_string(bounds[f]) +
                                     " then " + std::to_string(bounds[f + 1]) + ")");
    }
  }
  if (bounds.front() != 0 || bounds.back() != num_values) {
    return Status::InvalidArgument("the packed batch's row_splits run from " +
                                   std::to_string(bounds.front()) + " to " +
                                   std::to_string(bounds.back()) + ", not from 0 to its " +
                                   std::to_string(num_values) + " values");
  }
  return Status::Ok();
}

template <typename Tsplits>
void FeatureBounds(const Tsplits* row_splits, int64_t batch, int64_t num_features,
                   int64_t* bounds) {
  for (int64_t f = 0; f <= num_features; ++f) bounds[f] = row_splits[f * batch];
}

// out[i] = row_splits[feature * B + i] - row_splits[feature * B], i in [0, B].
template <typename Tsplits>
void RebaseFeatureRowSplits(const Tsplits* row_splits, int64_t batch, int64_t feature,
                            int64_t* out) {
  const Tsplits* first = row_splits + feature * batch;
  const int64_t base = first[0];
  for (int64_t i = 0; i <= batch; ++i) out[i] = static_cast<int64_t>(first[i]) - base;
}

}  // namespace sok
