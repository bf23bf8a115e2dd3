// A batch of F features carried in one ragged tensor, feature-major (feature 0's B samples,
// then feature 1's, as TorchRec's KeyedJaggedTensor and FBGEMM TBE's indices / offsets lay a
// batch out): values [nnz] and row_splits [F * B + 1]. Splitting it into one ragged tensor a
// feature needs the F + 1 value offsets where features start (row_splits[f * B]) and each
// feature's row splits counted from its first value.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kit_src/core/parallel.h"
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

// Where each feature lands in one buffer of values and one of row splits, every feature's
// start aligned to `align` bytes (so each can be handed out as a slice of the buffer).
// Features [f, g) occupy values [value_start[f], value_start[g]) (value_total for g = F),
// and likewise row splits.
struct FeatureLayout {
  std::vector<int64_t> value_start;  // in elements
  std::vector<int64_t> split_start;  // in int64s
  int64_t value_total = 0, split_total = 0;
};

inline FeatureLayout AlignedFeatureLayout(const std::vector<int64_t>& bounds, int64_t batch,
                                          int64_t element_bytes, int64_t align) {
  const auto round_up = [](int64_t count, int64_t unit) {
    return (count + unit - 1) / unit * unit;
  };
  const int64_t value_unit = std::max<int64_t>(1, align / element_bytes);
  const int64_t split_unit = std::max<int64_t>(1, align / 8);
  FeatureLayout layout;
  for (size_t f = 0; f + 1 < bounds.size(); ++f) {
    layout.value_start.push_back(layout.value_total);
    layout.value_total += round_up(bounds[f + 1] - bounds[f], value_unit);
    layout.split_start.push_back(layout.split_total);
    layout.split_total += round_up(batch + 1, split_unit);
  }
  return layout;
}

// Consecutive feature groups of about `group_bytes` staged bytes each (values and row splits):
// group k is features [first[k], first[k + 1]).
inline std::vector<int64_t> FeatureGroups(const FeatureLayout& layout, int64_t element_bytes,
                                          int64_t group_bytes) {
  const int64_t features = static_cast<int64_t>(layout.value_start.size());
  std::vector<int64_t> first{0};
  int64_t bytes = 0;
  for (int64_t f = 0; f < features; ++f) {
    const int64_t values_end = f + 1 < features ? layout.value_start[f + 1] : layout.value_total;
    const int64_t splits_end = f + 1 < features ? layout.split_start[f + 1] : layout.split_total;
    bytes += (values_end - layout.value_start[f]) * element_bytes +
             (splits_end - layout.split_start[f]) * 8;
    if (bytes >= group_bytes && f + 1 < features) {
      first.push_back(f + 1);
      bytes = 0;
    }
  }
  first.push_back(features);
  return first;
}

// Copies features [first_feature, end_feature) of a packed batch into `layout`: each
// feature's values, and its row splits counted from its first value, in shards of about a
// megabyte run by `parallel_for`.
template <typename Tsplits>
void StageFeatures(const char* values, int64_t element_bytes, const Tsplits* row_splits,
                   const std::vector<int64_t>& bounds, int64_t batch,
                   const FeatureLayout& layout, char* staged_values, int64_t* staged_splits,
                   const ParallelFor& parallel_for, int64_t first_feature,
                   int64_t end_feature) {
  struct Piece {
    int64_t feature, begin, end;  // values [begin, end) of the feature, or its splits (end < 0)
  };
  constexpr int64_t kPieceBytes = 1 << 20;
  std::vector<Piece> pieces;
  for (int64_t f = first_feature; f < end_feature; ++f) {
    const int64_t step = std::max<int64_t>(1, kPieceBytes / element_bytes);
    for (int64_t begin = bounds[f]; begin < bounds[f + 1]; begin += step) {
      pieces.push_back({f, begin, std::min(begin + step, bounds[f + 1])});
    }
    pieces.push_back({f, 0, -1});
  }
  parallel_for(static_cast<int64_t>(pieces.size()), kPieceBytes, [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p) {
      const Piece& piece = pieces[p];
      if (piece.end < 0) {
        RebaseFeatureRowSplits(row_splits, batch, piece.feature,
                               staged_splits + layout.split_start[piece.feature]);
        continue;
      }
      const int64_t at = layout.value_start[piece.feature] + (piece.begin - bounds[piece.feature]);
      std::memcpy(staged_values + at * element_bytes, values + piece.begin * element_bytes,
                  (piece.end - piece.begin) * element_bytes);
    }
  });
}

}  // namespace sok
