#include "kit_src/core/embedding/combine.h"

#include <algorithm>
#include <cmath>
#include <cstring>

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

template <typename T>
bool PoolSample(const T* rows, int64_t num_rows, int64_t dim, const PooledLookup<T>& lookup,
                int64_t s, T* out) {
  const int64_t begin = lookup.row_splits[s], end = lookup.row_splits[s + 1];
  std::fill(out, out + dim, T(0));
  const float denominator = Denominator(lookup.combiner, lookup.weights, begin, end);
  if (denominator == 0.0f) return true;
  for (int64_t i = begin; i < end; ++i) {
    const int32_t p = lookup.position[i];
    if (p < 0 || p >= num_rows) return false;
    const T scale = static_cast<T>((lookup.weights ? lookup.weights[i] : 1.0f) / denominator);
    const T* row = rows + static_cast<int64_t>(p) * dim;
    for (int64_t d = 0; d < dim; ++d) out[d] += scale * row[d];
  }
  return true;
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

template <typename T>
Status CombineForward(const T* rows, int64_t num_rows, int64_t dim,
                      const std::vector<PooledLookup<T>>& lookups,
                      const ParallelFor& parallel_for) {
  for (const PooledLookup<T>& lookup : lookups) {
    const int64_t nnz = lookup.row_splits[lookup.batch];
    const int64_t cost = dim * (2 + nnz / std::max<int64_t>(lookup.batch, 1)) * 2;
    bool ok = true;
    parallel_for(lookup.batch, cost, [&](int64_t begin, int64_t end) {
      for (int64_t s = begin; s < end; ++s) {
        if (!PoolSample(rows, num_rows, dim, lookup, s, lookup.output + s * dim)) ok = false;
      }
    });
    if (!ok) {
      for (int64_t i = 0; i < nnz; ++i) {
        if (lookup.position[i] < 0 || lookup.position[i] >= num_rows) {
          return BadPosition(lookup.position[i], num_rows);
        }
      }
    }
  }
  return Status::Ok();
}

template <typename T>
Status CombineBackward(int64_t num_rows, int64_t dim, const std::vector<PooledLookup<T>>& lookups,
                       T* rows_grad, const ParallelFor& parallel_for) {
  for (const PooledLookup<T>& lookup : lookups) {
    const int64_t nnz = lookup.row_splits[lookup.batch];
    for (int64_t i = 0; i < nnz; ++i) {
      if (lookup.position[i] < 0 || lookup.position[i] >= num_rows) {
        return BadPosition(lookup.position[i], num_rows);
      }
    }
  }
  int64_t total_nnz = 0;
  for (const PooledLookup<T>& lookup : lookups) total_nnz += lookup.row_splits[lookup.batch];
  // Column blocks of 8 values: wide enough to vectorise, and they never overlap.
  constexpr int64_t kBlock = 8;
  const int64_t num_blocks = (dim + kBlock - 1) / kBlock;
  parallel_for(num_blocks, (total_nnz + num_rows) * kBlock * 2, [&](int64_t first, int64_t last) {
    const int64_t d0 = first * kBlock, d1 = std::min(dim, last * kBlock);
    for (int64_t r = 0; r < num_rows; ++r) {
      std::fill(rows_grad + r * dim + d0, rows_grad + r * dim + d1, T(0));
    }
    for (const PooledLookup<T>& lookup : lookups) {
      for (int64_t s = 0; s < lookup.batch; ++s) {
        const int64_t begin = lookup.row_splits[s], end = lookup.row_splits[s + 1];
        const float denominator = Denominator(lookup.combiner, lookup.weights, begin, end);
        if (denominator == 0.0f) continue;
        const T* grad = lookup.output_grad + s * dim;
        for (int64_t i = begin; i < end; ++i) {
          const T scale =
              static_cast<T>((lookup.weights ? lookup.weights[i] : 1.0f) / denominator);
          T* out = rows_grad + static_cast<int64_t>(lookup.position[i]) * dim;
          for (int64_t d = d0; d < d1; ++d) out[d] += scale * grad[d];
        }
      }
    }
  });
  return Status::Ok();
}

template Status CombineForward<float>(const float*, int64_t, int64_t,
                                      const std::vector<PooledLookup<float>>&,
                                      const ParallelFor&);
template Status CombineBackward<float>(int64_t, int64_t, const std::vector<PooledLookup<float>>&,
                                       float*, const ParallelFor&);

}  // namespace sok
