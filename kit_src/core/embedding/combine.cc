#include "kit_src/core/embedding/combine.h"


#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>

#include "kit_src/core/block_pool.h"
#include "kit_src/core/embedding/shard_rows.h"
#include "kit_src/core/prefetch.h"

namespace sok {
namespace {

// The factor dividing a sample's weighted sum; 0 means "pool to zeros".
float Denominator(Combiner combiner, const float* weights, int64_t begin, int64_t end) {
  if (combiner == Combiner::kSum) return 1.0f;
  if (weights == nullptr) {
    const float n = static_cast<float>(end - begin);
    return combiner == Combiner::kMean ? n : std::sqrt(n);
  }
  float total = 0.0f;
  for (int64_t i = begin; i < end; ++i) {
    total += combiner == Combiner::kMean ? weights[i] : weights[i] * weights[i];
  }
  return combiner == Combiner::kMean ? total : std::sqrt(total);
}

Status BadPosition(int64_t position, int64_t num_rows) {
  return Status::InvalidArgument("row position " + std::to_string(position) +
                                 " is out of range [0, " + std::to_string(num_rows) + ")");
}

template <typename T, typename Rows>
bool PoolSample(const Rows& rows, int64_t num_rows, int64_t dim, const PooledLookup<T>& lookup,
                int64_t s, T* out) {
  const int64_t begin = lookup.row_splits[s], end = lookup.row_splits[s + 1];
  const float denominator = Denominator(lookup.combiner, lookup.weights, begin, end);
  if (begin == end || denominator == 0.0f) {
    std::fill(out, out + dim, T(0));
    return true;
  }
  for (int64_t i = begin; i < end; ++i) {
    const int32_t p = lookup.position[i];
    if (p < 0 || p >= num_rows) {
      std::fill(out, out + dim, T(0));
      return false;
    }
    const T scale = static_cast<T>((lookup.weights ? lookup.weights[i] : 1.0f) / denominator);
    const T* row = rows(p);
    if (i == begin) {  // the first row initialises the output: one pass less over it
      for (int64_t d = 0; d < dim; ++d) out[d] = scale * row[d];
    } else {
      for (int64_t d = 0; d < dim; ++d) out[d] += scale * row[d];
    }
  }
  return true;
}

// A use of a row in the backward: which sample's output gradient, scaled by how much.
struct Use {
  uint32_t sample;
  float scale;
};

// Rows are scattered over large tables, so pooling waits on memory: the rows of a sample
// some samples ahead are requested first.
template <typename T, typename Rows>
void PrefetchSample(const Rows& rows, int64_t num_rows, int64_t dim,
                    const PooledLookup<T>& lookup, int64_t s, int64_t end) {
  if (s >= end) return;
  for (int64_t i = lookup.row_splits[s]; i < lookup.row_splits[s + 1]; ++i) {
    const int32_t p = lookup.position[i];
    if (p < 0 || p >= num_rows) return;
    PrefetchRow(rows(p), dim);
  }
}

template <typename T>
Status CheckPositions(int64_t num_rows, const std::vector<PooledLookup<T>>& lookups) {
  for (const PooledLookup<T>& lookup : lookups) {
    const int64_t nnz = lookup.row_splits[lookup.batch];
    for (int64_t i = 0; i < nnz; ++i) {
      if (lookup.position[i] < 0 || lookup.position[i] >= num_rows) {
        return BadPosition(lookup.position[i], num_rows);
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Status ParseCombiner(const std::string& name, Combiner* combiner) {
  if (name == "sum") {
    *combiner = Combiner::kSum;
  } else if (name == "mean") {
    *combiner = Combiner::kMean;
  } else if (name == "sqrtn") {
    *combiner = Combiner::kSqrtn;
  } else {
    return Status::InvalidArgument("unknown combiner '" + name +
                                   "'; valid combiners are 'sum', 'mean' and 'sqrtn'");
  }
  return Status::Ok();
}

Status ValidateRowSplits(const int64_t* row_splits, int64_t batch, int64_t nnz,
                         const std::string& what) {
  if (row_splits[0] != 0 || row_splits[batch] != nnz) {
    return Status::InvalidArgument(what + ": row_splits must start at 0 and end at the " +
                                   std::to_string(nnz) + " ids, got [" +
                                   std::to_string(row_splits[0]) + ", ..., " +
                                   std::to_string(row_splits[batch]) + "]");
  }
  for (int64_t s = 0; s < batch; ++s) {
    if (row_splits[s + 1] < row_splits[s]) {
      return Status::InvalidArgument(what + ": row_splits decrease at sample " +
                                     std::to_string(s));
    }
  }
  return Status::Ok();
}

template <typename T, typename Rows>
Status CombineForward(const Rows& rows, int64_t num_rows, int64_t dim,
                      const std::vector<PooledLookup<T>>& lookups,
                      const ParallelFor& parallel_for) {
  // One parallel loop over the samples of all lookups: one synchronisation per call.
  std::vector<int64_t> first_sample(lookups.size() + 1, 0);
  int64_t total_nnz = 0;
  for (size_t l = 0; l < lookups.size(); ++l) {
    first_sample[l + 1] = first_sample[l] + lookups[l].batch;
    total_nnz += lookups[l].row_splits[lookups[l].batch];
  }
  const int64_t total = first_sample.back();
  const int64_t ids_per_sample = total_nnz / std::max<int64_t>(total, 1);
  const int64_t cost = dim * (2 + ids_per_sample) * 4;
  const int64_t samples_ahead = std::max<int64_t>(
      1, PrefetchDistance(dim * sizeof(T)) / std::max<int64_t>(ids_per_sample, 1));
  std::atomic<bool> ok{true};
  parallel_for(total, cost, [&](int64_t begin, int64_t end) {
    size_t l = std::upper_bound(first_sample.begin(), first_sample.end(), begin) -
               first_sample.begin() - 1;
    for (int64_t g = begin; g < end; ++l) {
      const PooledLookup<T>& lookup = lookups[l];
      const int64_t last = std::min(end, first_sample[l + 1]) - first_sample[l];
      for (int64_t s = g - first_sample[l]; s < last; ++s) {
        PrefetchSample(rows, num_rows, dim, lookup, s + samples_ahead, last);
        if (!PoolSample(rows, num_rows, dim, lookup, s, lookup.output + s * dim)) ok = false;
      }
      g = first_sample[l] + last;
    }
  });
  if (!ok) return CheckPositions(num_rows, lookups);
  return Status::Ok();
}

template <typename T, typename MutableRows>
Status CombineBackward(int64_t num_rows, int64_t dim, const std::vector<PooledLookup<T>>& lookups,
                       const MutableRows& rows_grad, const ParallelFor& parallel_for) {
  Status status = CheckPositions(num_rows, lookups);
  if (!status.ok()) return status;
  // The gradient row of every sample of every lookup, by global sample number.
  ScratchVector<const T*> sample_grad;
  int64_t total_uses = 0;
  for (const PooledLookup<T>& lookup : lookups) {
    for (int64_t s = 0; s < lookup.batch; ++s) sample_grad.push_back(lookup.output_grad + s * dim);
    total_uses += lookup.row_splits[lookup.batch];
  }
  if (sample_grad.size() > std::numeric_limits<uint32_t>::max()) {
    return Status::InvalidArgument("a combine backward of " + std::to_string(sample_grad.size()) +
                                   " samples exceeds 2^32");
  }
  // Counting sort of the uses by row: uses of row p go to [first_use[p], first_use[p + 1]).
  ScratchVector<int64_t> first_use(num_rows + 1, 0);
  for (const PooledLookup<T>& lookup : lookups) {
    const int64_t nnz = lookup.row_splits[lookup.batch];
    for (int64_t i = 0; i < nnz; ++i) first_use[lookup.position[i] + 1] += 1;
  }
  for (int64_t p = 0; p < num_rows; ++p) first_use[p + 1] += first_use[p];
  ScratchVector<Use> uses(total_uses);
  ScratchVector<int64_t> next(first_use.begin(), first_use.end() - 1);
  uint32_t sample = 0;
  for (const PooledLookup<T>& lookup : lookups) {
    for (int64_t s = 0; s < lookup.batch; ++s, ++sample) {
      const int64_t begin = lookup.row_splits[s], end = lookup.row_splits[s + 1];
      const float denominator = Denominator(lookup.combiner, lookup.weights, begin, end);
      for (int64_t i = begin; i < end; ++i) {
        const float weight = lookup.weights ? lookup.weights[i] : 1.0f;
        uses[next[lookup.position[i]]++] = {sample, denominator == 0.0f ? 0.0f : weight / denominator};
      }
    }
  }
  const int64_t uses_per_row = total_uses / std::max<int64_t>(num_rows, 1) + 1;
  parallel_for(num_rows, dim * (uses_per_row + 1) * 2, [&](int64_t begin, int64_t end) {
    const int64_t end_use = first_use[end];
    const int64_t ahead = PrefetchDistance(dim * sizeof(T));
    for (int64_t p = begin; p < end; ++p) {
      T* out = rows_grad(p);
      std::fill(out, out + dim, T(0));
      for (int64_t k = first_use[p]; k < first_use[p + 1]; ++k) {
        // The uses' gradient rows are scattered over the batch: request them early.
        if (k + ahead < end_use) PrefetchRow(sample_grad[uses[k + ahead].sample], dim);
        const T scale = static_cast<T>(uses[k].scale);
        const T* grad = sample_grad[uses[k].sample];
        for (int64_t d = 0; d < dim; ++d) out[d] += scale * grad[d];
      }
    }
  });
  return Status::Ok();
}

template Status CombineForward<float, DenseRows<const float>>(
    const DenseRows<const float>&, int64_t, int64_t, const std::vector<PooledLookup<float>>&,
    const ParallelFor&);
template Status CombineForward<float, PackedKeyRows<float>>(
    const PackedKeyRows<float>&, int64_t, int64_t, const std::vector<PooledLookup<float>>&,
    const ParallelFor&);
template Status CombineBackward<float, DenseRows<float>>(
    int64_t, int64_t, const std::vector<PooledLookup<float>>&, const DenseRows<float>&,
    const ParallelFor&);

}  // namespace sok
