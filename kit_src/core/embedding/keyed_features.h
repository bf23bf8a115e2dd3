// A batch of F features carried in one ragged tensor, feature-major (feature 0's B samples,
// then feature 1's, as TorchRec's KeyedJaggedTensor and FBGEMM TBE's indices / offsets lay a
// batch out): values [nnz] and row_splits [F * B + 1]. Splitting it into one ragged tensor a
// feature needs the F + 1 value offsets where features start (row_splits[f * B]) and each
// feature's row splits counted from its first value.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kit_src/core/embedding/combine.h"
#include "kit_src/core/embedding/key_partition.h"
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

// A packed batch crosses to a GPU in as few bytes as its contents allow, and the device widens
// it back into its `FeatureLayout`. Per feature: int64 ids that all fit in int32 cross as
// int32, and row splits whose samples each hold 0..255 values cross as one length byte a
// sample; otherwise values cross as they are and row splits as int64 counted from the
// feature's first value. (T1's batch, 26 features of one id a sample, crosses as 8.5 MB
// instead of 27.) The CPU kernel takes the same path, so every machine checks the coding.
enum class ValueCoding : int32_t { kRaw = 0, kInt32 = 1 };
enum class SplitCoding : int32_t { kRebased = 0, kLengths8 = 1 };

struct CompactFeature {
  ValueCoding values = ValueCoding::kRaw;
  SplitCoding splits = SplitCoding::kRebased;
  int64_t values_at = 0, splits_at = 0;  // byte offsets in the group's staged bytes
  // The least and greatest value read as an integer (an id), min_id > max_id when there are
  // none: where the values are ids, a lookup checks them against its table on the host.
  int64_t min_id = 0, max_id = -1;
};

// Features [first, first + features.size()) of a batch as staged: codings and offsets.
struct CompactGroup {
  int64_t first = 0;
  std::vector<CompactFeature> features;
  int64_t bytes = 0;
};

namespace compact_detail {

// Small enough that one group of a few megabytes keeps every CPU thread busy.
constexpr int64_t kPieceBytes = 64 << 10;
constexpr int64_t kStagedAlign = 16;

// A shard of the staging work: values [begin, end) of a feature, or its row splits' entries
// [begin, end) of [0, batch + 1).
struct Piece {
  int64_t feature, begin, end;
  bool splits;
};

inline std::vector<Piece> Pieces(const std::vector<int64_t>& bounds, int64_t batch,
                                 int64_t element_bytes, int64_t first, int64_t end) {
  std::vector<Piece> pieces;
  const int64_t value_step = std::max<int64_t>(1, kPieceBytes / element_bytes);
  const int64_t split_step = kPieceBytes / 8;
  for (int64_t f = first; f < end; ++f) {
    for (int64_t begin = bounds[f]; begin < bounds[f + 1]; begin += value_step) {
      pieces.push_back({f, begin, std::min(begin + value_step, bounds[f + 1]), false});
    }
    for (int64_t begin = 0; begin <= batch; begin += split_step) {
      pieces.push_back({f, begin, std::min(begin + split_step, batch + 1), true});
    }
  }
  return pieces;
}

inline int64_t Aligned(int64_t bytes) {
  return (bytes + kStagedAlign - 1) / kStagedAlign * kStagedAlign;
}

// The least and greatest of a values piece's values read as integers of `element_bytes`.
struct IdRange {
  int64_t min = std::numeric_limits<int64_t>::max();
  int64_t max = std::numeric_limits<int64_t>::min();
};

template <typename T>
IdRange RangeOf(const T* values, int64_t begin, int64_t end) {
  T low = std::numeric_limits<T>::max(), high = std::numeric_limits<T>::min();
  for (int64_t i = begin; i < end; ++i) {  // branch-free: vectorises
    low = std::min(low, values[i]);
    high = std::max(high, values[i]);
  }
  return begin < end ? IdRange{low, high} : IdRange{};
}

inline IdRange PieceIdRange(const Piece& piece, const char* values, int64_t element_bytes) {
  if (piece.splits) return IdRange{};
  switch (element_bytes) {
    case 8:
      return RangeOf(reinterpret_cast<const int64_t*>(values), piece.begin, piece.end);
    case 4:
      return RangeOf(reinterpret_cast<const int32_t*>(values), piece.begin, piece.end);
    default:
      return IdRange{};  // 16-bit values are weights, never ids
  }
}

// A values piece of int64 ids in one pass: written as int32 into `out` (its first id's place)
// and its id range taken; false when an id does not fit int32 (`out` is then unusable).
inline bool NarrowPiece(const Piece& piece, const int64_t* ids, int32_t* out, IdRange* range) {
  int64_t low = std::numeric_limits<int64_t>::max(), high = std::numeric_limits<int64_t>::min();
  bool fits = true;
  for (int64_t i = piece.begin; i < piece.end; ++i) {  // branch-free: vectorises
    const int64_t id = ids[i];
    fits &= id == static_cast<int32_t>(id);
    out[i - piece.begin] = static_cast<int32_t>(id);
    low = std::min(low, id);
    high = std::max(high, id);
  }
  *range = piece.begin < piece.end ? IdRange{low, high} : IdRange{};
  return fits;
}

// Each feature's id range from its pieces' ranges.
inline void SetIdRanges(const std::vector<Piece>& pieces, const std::vector<IdRange>& ranges,
                        CompactGroup* group) {
  std::vector<IdRange> features(group->features.size());
  for (size_t p = 0; p < pieces.size(); ++p) {
    IdRange& range = features[pieces[p].feature - group->first];
    range.min = std::min(range.min, ranges[p].min);
    range.max = std::max(range.max, ranges[p].max);
  }
  for (size_t i = 0; i < features.size(); ++i) {
    const bool any = features[i].min <= features[i].max;
    group->features[i].min_id = any ? features[i].min : 0;
    group->features[i].max_id = any ? features[i].max : -1;
  }
}

// Whether a piece allows its feature's compact coding (branch-free loops: they vectorise).
template <typename Tsplits>
bool PieceFitsCompact(const Piece& piece, const char* values, bool narrowable,
                      const Tsplits* row_splits, int64_t batch) {
  bool fits = true;
  if (piece.splits) {
    const Tsplits* first = row_splits + piece.feature * batch;
    for (int64_t i = piece.begin; i < std::min(piece.end, batch); ++i) {
      const int64_t length = static_cast<int64_t>(first[i + 1]) - static_cast<int64_t>(first[i]);
      fits &= static_cast<uint64_t>(length) <= 255;
    }
    return fits;
  }
  if (!narrowable) return false;
  const int64_t* ids = reinterpret_cast<const int64_t*>(values);
  for (int64_t i = piece.begin; i < piece.end; ++i) {
    fits &= ids[i] == static_cast<int32_t>(ids[i]);
  }
  return fits;
}


// Places features [group->first, end) in the staged bytes by their codings (set already).
inline void LayOut(const std::vector<int64_t>& bounds, int64_t batch, int64_t element_bytes,
                   CompactGroup* group) {
  group->bytes = 0;
  for (size_t i = 0; i < group->features.size(); ++i) {
    const int64_t f = group->first + static_cast<int64_t>(i);
    CompactFeature& feature = group->features[i];
    const int64_t value_bytes = feature.values == ValueCoding::kInt32 ? 4 : element_bytes;
    feature.values_at = group->bytes;
    group->bytes += Aligned((bounds[f + 1] - bounds[f]) * value_bytes);
    feature.splits_at = group->bytes;
    group->bytes +=
        Aligned(feature.splits == SplitCoding::kLengths8 ? batch : (batch + 1) * 8);
  }
}

// Writes one piece of a feature into `staged` as `feature`'s codings say.
template <typename Tsplits>
void StagePiece(const Piece& piece, const CompactFeature& feature, const char* values,
                int64_t element_bytes, const Tsplits* row_splits,
                const std::vector<int64_t>& bounds, int64_t batch, char* staged) {
  if (piece.splits) {
    const Tsplits* splits = row_splits + piece.feature * batch;
    if (feature.splits == SplitCoding::kLengths8) {
      auto* lengths = reinterpret_cast<uint8_t*>(staged + feature.splits_at);
      for (int64_t i = piece.begin; i < std::min(piece.end, batch); ++i) {
        lengths[i] = static_cast<uint8_t>(splits[i + 1] - splits[i]);
      }
    } else {
      auto* out = reinterpret_cast<int64_t*>(staged + feature.splits_at);
      const int64_t base = splits[0];
      for (int64_t i = piece.begin; i < piece.end; ++i) {
        out[i] = static_cast<int64_t>(splits[i]) - base;
      }
    }
    return;
  }
  const int64_t at = piece.begin - bounds[piece.feature];
  if (feature.values == ValueCoding::kInt32) {
    const auto* ids = reinterpret_cast<const int64_t*>(values);
    auto* out = reinterpret_cast<int32_t*>(staged + feature.values_at) + at;
    for (int64_t i = piece.begin; i < piece.end; ++i) out[i - piece.begin] = ids[i];
  } else {
    std::memcpy(staged + feature.values_at + at * element_bytes,
                values + piece.begin * element_bytes, (piece.end - piece.begin) * element_bytes);
  }
}

}  // namespace compact_detail

// Features [first, end) planned with the most compact codings their type allows (int32 ids
// where `narrowable`, one length byte a sample), laid out.
inline CompactGroup CompactestGroup(const std::vector<int64_t>& bounds, int64_t batch,
                                    int64_t element_bytes, bool narrowable, int64_t first,
                                    int64_t end) {
  CompactGroup group;
  group.first = first;
  group.features.resize(end - first);
  for (CompactFeature& feature : group.features) {
    feature.values = narrowable ? ValueCoding::kInt32 : ValueCoding::kRaw;
    feature.splits = SplitCoding::kLengths8;
  }
  compact_detail::LayOut(bounds, batch, element_bytes, &group);
  return group;
}

// The codings features [first, end) allow and where each lands in the staged bytes; the batch
// is read in shards run by `parallel_for`. `narrowable`: the values are int64 ids. With
// `id_ranges` (the values are ids bound for a plan), each feature's id range is taken too.
template <typename Tsplits>
CompactGroup PlanCompactGroup(const char* values, int64_t element_bytes, bool narrowable,
                              const Tsplits* row_splits, const std::vector<int64_t>& bounds,
                              int64_t batch, int64_t first, int64_t end, bool id_ranges,
                              const ParallelFor& parallel_for) {
  using namespace compact_detail;
  const std::vector<Piece> pieces = Pieces(bounds, batch, element_bytes, first, end);
  std::vector<char> fits(pieces.size(), 0);
  std::vector<IdRange> ranges(pieces.size());
  parallel_for(static_cast<int64_t>(pieces.size()), kPieceBytes, [&](int64_t begin, int64_t last) {
    for (int64_t p = begin; p < last; ++p) {
      fits[p] = PieceFitsCompact(pieces[p], values, narrowable, row_splits, batch);
      if (id_ranges) ranges[p] = PieceIdRange(pieces[p], values, element_bytes);
    }
  });
  CompactGroup group = CompactestGroup(bounds, batch, element_bytes, narrowable, first, end);
  for (size_t p = 0; p < pieces.size(); ++p) {
    if (fits[p]) continue;
    CompactFeature& feature = group.features[pieces[p].feature - first];
    if (pieces[p].splits) {
      feature.splits = SplitCoding::kRebased;
    } else {
      feature.values = ValueCoding::kRaw;
    }
  }
  LayOut(bounds, batch, element_bytes, &group);
  if (id_ranges) SetIdRanges(pieces, ranges, &group);
  return group;
}

// Writes `group`'s features into `staged` (group.bytes) as planned, in shards run by
// `parallel_for`.
template <typename Tsplits>
void StageCompactGroup(const char* values, int64_t element_bytes, const Tsplits* row_splits,
                       const std::vector<int64_t>& bounds, int64_t batch,
                       const CompactGroup& group, char* staged,
                       const ParallelFor& parallel_for) {
  using namespace compact_detail;
  const int64_t end = group.first + static_cast<int64_t>(group.features.size());
  const std::vector<Piece> pieces = Pieces(bounds, batch, element_bytes, group.first, end);
  parallel_for(static_cast<int64_t>(pieces.size()), kPieceBytes, [&](int64_t begin, int64_t last) {
    for (int64_t p = begin; p < last; ++p) {
      StagePiece(pieces[p], group.features[pieces[p].feature - group.first], values,
                 element_bytes, row_splits, bounds, batch, staged);
    }
  });
}

// PlanCompactGroup and StageCompactGroup in one read of the batch, for the common case where
// every feature of `group` (CompactestGroup's plan) takes its compact codings: each piece is
// checked and, while still in cache, written (and its id range taken). Returns false when a
// piece does not fit; the staged bytes are then unusable and the caller plans and stages in
// two passes.
template <typename Tsplits>
bool StageIfCompactest(const char* values, int64_t element_bytes, bool narrowable,
                       const Tsplits* row_splits, const std::vector<int64_t>& bounds,
                       int64_t batch, CompactGroup* group, char* staged,
                       const ParallelFor& parallel_for) {
  using namespace compact_detail;
  const int64_t end = group->first + static_cast<int64_t>(group->features.size());
  const std::vector<Piece> pieces = Pieces(bounds, batch, element_bytes, group->first, end);
  std::vector<IdRange> ranges(pieces.size());
  std::atomic<bool> all_fit{true};
  parallel_for(static_cast<int64_t>(pieces.size()), kPieceBytes, [&](int64_t begin, int64_t last) {
    for (int64_t p = begin; p < last && all_fit; ++p) {
      const Piece& piece = pieces[p];
      if (!piece.splits && narrowable) {  // checked, written and ranged in one pass
        const CompactFeature& feature = group->features[piece.feature - group->first];
        int32_t* out = reinterpret_cast<int32_t*>(staged + feature.values_at) +
                       (piece.begin - bounds[piece.feature]);
        if (!NarrowPiece(piece, reinterpret_cast<const int64_t*>(values), out, &ranges[p])) {
          all_fit = false;
          return;
        }
        continue;
      }
      const bool raw_values = !piece.splits && !narrowable;  // planned raw: nothing to fit
      if (!raw_values && !PieceFitsCompact(pieces[p], values, narrowable, row_splits, batch)) {
        all_fit = false;
        return;
      }
      StagePiece(pieces[p], group->features[pieces[p].feature - group->first], values,
                 element_bytes, row_splits, bounds, batch, staged);
      ranges[p] = PieceIdRange(pieces[p], values, element_bytes);
    }
  });
  if (all_fit) SetIdRanges(pieces, ranges, group);
  return all_fit;
}

// A batch staged ahead of its step (Sok>StageFeatures, in the input pipeline) travels as its
// staged bytes and this plan, one int64 vector: [batch, F, then per feature: value count,
// value coding, split coding, values_at, splits_at, min_id, max_id] (Sok>UnpackStagedFeatures
// reads it back).
constexpr int64_t kStagedPlanHeader = 2;
constexpr int64_t kStagedPlanPerFeature = 7;

inline std::vector<int64_t> EncodeStagedPlan(const CompactGroup& group,
                                             const std::vector<int64_t>& bounds, int64_t batch) {
  std::vector<int64_t> plan{batch, static_cast<int64_t>(group.features.size())};
  for (size_t i = 0; i < group.features.size(); ++i) {
    const CompactFeature& feature = group.features[i];
    const int64_t f = group.first + static_cast<int64_t>(i);
    plan.insert(plan.end(), {bounds[f + 1] - bounds[f], static_cast<int64_t>(feature.values),
                             static_cast<int64_t>(feature.splits), feature.values_at,
                             feature.splits_at, feature.min_id, feature.max_id});
  }
  return plan;
}

// The plan of `staged_bytes` staged bytes of `num_features` features of `element_bytes` ids,
// checked so that every feature's values and row splits lie inside the staged bytes; `bounds`
// (F + 1) are the features' value offsets as the packed batch had them.
inline Status DecodeStagedPlan(const int64_t* plan, int64_t plan_size, int64_t num_features,
                               int64_t element_bytes, int64_t staged_bytes, CompactGroup* group,
                               std::vector<int64_t>* bounds, int64_t* batch) {
  const auto invalid = [](const std::string& what) {
    return Status::InvalidArgument("the staged batch's plan " + what +
                                   " (stage it with sok.stage_features)");
  };
  if (plan_size < kStagedPlanHeader) {
    return invalid("has " + std::to_string(plan_size) + " entries, not 2 + 7 per feature");
  }
  if (plan[1] != num_features) {
    return Status::InvalidArgument("the staged batch holds " + std::to_string(plan[1]) +
                                   " features, but it is looked up in " +
                                   std::to_string(num_features) + " tables");
  }
  if (plan_size != kStagedPlanHeader + kStagedPlanPerFeature * num_features) {
    return invalid("has " + std::to_string(plan_size) + " entries, not 2 + 7 per feature");
  }
  *batch = plan[0];
  if (*batch < 0 || *batch > staged_bytes) {
    return invalid("gives a batch of " + std::to_string(*batch));
  }
  group->first = 0;
  group->features.assign(num_features, CompactFeature());
  group->bytes = staged_bytes;
  bounds->assign(1, 0);
  for (int64_t f = 0; f < num_features; ++f) {
    const int64_t* entry = plan + kStagedPlanHeader + kStagedPlanPerFeature * f;
    const int64_t count = entry[0];
    CompactFeature& feature = (*group).features[f];
    const bool int32_ids = entry[1] == static_cast<int64_t>(ValueCoding::kInt32);
    if (!(entry[1] == static_cast<int64_t>(ValueCoding::kRaw) || (int32_ids && element_bytes == 8)) ||
        (entry[2] != static_cast<int64_t>(SplitCoding::kRebased) &&
         entry[2] != static_cast<int64_t>(SplitCoding::kLengths8))) {
      return invalid("gives feature " + std::to_string(f) + " unknown codings " +
                     std::to_string(entry[1]) + ", " + std::to_string(entry[2]));
    }
    feature.values = static_cast<ValueCoding>(entry[1]);
    feature.splits = static_cast<SplitCoding>(entry[2]);
    feature.values_at = entry[3];
    feature.splits_at = entry[4];
    feature.min_id = entry[5];
    feature.max_id = entry[6];
    const int64_t value_bytes = int32_ids ? 4 : element_bytes;
    const int64_t split_bytes =
        feature.splits == SplitCoding::kLengths8 ? *batch : (*batch + 1) * 8;
    const bool inside = count >= 0 && count <= staged_bytes && feature.values_at >= 0 &&
                        feature.splits_at >= 0 &&
                        feature.values_at % compact_detail::kStagedAlign == 0 &&
                        feature.splits_at % compact_detail::kStagedAlign == 0 &&
                        feature.values_at <= staged_bytes - count * value_bytes &&
                        feature.splits_at <= staged_bytes - split_bytes;
    if (!inside) {
      return invalid("places feature " + std::to_string(f) + " (" + std::to_string(count) +
                     " values at byte " + std::to_string(feature.values_at) +
                     ", row splits at byte " + std::to_string(feature.splits_at) +
                     ") outside its " + std::to_string(staged_bytes) + " bytes");
    }
    bounds->push_back(bounds->back() + count);
  }
  return Status::Ok();
}

// A staged batch's ids against their tables' rows (`limits[f]`, -1: any id), from the id
// ranges its plan carries: the first feature with an id outside [0, rows) fails, naming its
// table (`names[f]`, as many as `limits`) and the id. Empty `limits`: nothing to check.
inline Status CheckStagedIdRanges(const CompactGroup& group, const std::vector<int64_t>& bounds,
                                  const std::vector<int64_t>& limits,
                                  const std::vector<std::string>& names) {
  for (size_t i = 0; i < group.features.size() && i < limits.size(); ++i) {
    const CompactFeature& feature = group.features[i];
    const int64_t f = group.first + static_cast<int64_t>(i);
    if (limits[f] < 0 || bounds[f + 1] == bounds[f]) continue;
    if (feature.min_id < 0 || feature.max_id >= limits[f]) {
      return IdOutOfRange(names[f], feature.min_id < 0 ? feature.min_id : feature.max_id,
                          limits[f]);
    }
  }
  return Status::Ok();
}

// The host's widening of one staged feature (`count` values) into its values and int64 row
// splits [batch + 1]; the GPU's is ExpandCompactFeaturesGpu.
inline void ExpandCompactFeature(const char* staged, const CompactFeature& feature, int64_t count,
                                 int64_t element_bytes, int64_t batch, char* values,
                                 int64_t* splits) {
  if (feature.values == ValueCoding::kInt32) {
    const auto* ids = reinterpret_cast<const int32_t*>(staged + feature.values_at);
    auto* out = reinterpret_cast<int64_t*>(values);
    for (int64_t i = 0; i < count; ++i) out[i] = ids[i];
  } else if (count > 0) {
    std::memcpy(values, staged + feature.values_at, count * element_bytes);
  }
  if (feature.splits == SplitCoding::kLengths8) {
    const auto* lengths = reinterpret_cast<const uint8_t*>(staged + feature.splits_at);
    splits[0] = 0;
    for (int64_t i = 0; i < batch; ++i) splits[i + 1] = splits[i] + lengths[i];
  } else {
    std::memcpy(splits, staged + feature.splits_at, (batch + 1) * sizeof(int64_t));
  }
}

// Every feature of a staged group widened in host memory into `layout` (values: bytes of
// element-sized values; splits: int64); with `check`, each feature's row splits must then
// run from 0 to its values without decreasing.
inline Status ExpandCompactGroup(const char* staged, const CompactGroup& group,
                                 const std::vector<int64_t>& bounds, int64_t batch,
                                 int64_t element, const FeatureLayout& layout, bool check,
                                 char* values, int64_t* splits) {
  for (size_t f = 0; f < group.features.size(); ++f) {
    const int64_t count = bounds[f + 1] - bounds[f];
    int64_t* feature_splits = splits + layout.split_start[f];
    ExpandCompactFeature(staged, group.features[f], count, element, batch,
                         values + layout.value_start[f] * element, feature_splits);
    if (check) {
      SOK_RETURN_IF_ERROR(ValidateRowSplits(
          feature_splits, batch, count, "feature " + std::to_string(f) + " of the staged batch"));
    }
  }
  return Status::Ok();
}

}  // namespace sok
