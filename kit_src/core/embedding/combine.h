// Output distribution's last stage: pool the rows gathered for each sample into one vector
// (sum, mean or sqrtn of weighted rows), and its gradient. Matches
// tf.nn.safe_embedding_lookup_sparse: an empty sample, or one whose weights sum to zero,
// pools to zeros.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kit_src/core/parallel.h"
#include "kit_src/core/status.h"

namespace sok {

enum class Combiner { kSum, kMean, kSqrtn };

// Parses "sum" / "mean" / "sqrtn".
Status ParseCombiner(const std::string& name, Combiner* combiner);

// One pooled lookup. Host memory; `position` indexes the rows matrix shared by all lookups.
template <typename T>
struct PooledLookup {
  const int64_t* row_splits = nullptr;  // [batch + 1] ids of sample s: [row_splits[s], row_splits[s+1])
  int64_t batch = 0;
  const int32_t* position = nullptr;    // [nnz] row of each id in the rows matrix
  const float* weights = nullptr;       // [nnz] per-id weights, or nullptr for all ones
  Combiner combiner = Combiner::kMean;
  T* output = nullptr;                  // forward: [batch, dim] pooled vectors (written)
  const T* output_grad = nullptr;       // backward: [batch, dim] gradient of `output`
};

// Checks that row_splits starts at 0, never decreases and ends at nnz.
Status ValidateRowSplits(const int64_t* row_splits, int64_t batch, int64_t nnz,
                         const std::string& what);

// Whether every sample holds exactly one id: row_splits ([batch + 1]) is 0, 1, ..., batch.
bool EverySampleHoldsOneId(const int64_t* row_splits, int64_t batch);

// row_splits ([num_rows + 1]) of a 2-D SparseTensor from its row ids, row_ids[i * stride] for
// i in [0, nnz) (the first column of its indices), which must not decrease and must lie in
// [0, num_rows): the order tf.nn.safe_embedding_lookup_sparse's segment sums require. Columns
// are not read: a row's ids are taken in the order given, gaps between columns allowed.
Status RowSplitsOfSortedRows(const int64_t* row_ids, int64_t stride, int64_t nnz,
                             int64_t num_rows, int64_t* row_splits, const std::string& what);

// Where row p of the (logical) rows matrix lives. `Rows` reads it, `MutableRows` writes it.
template <typename T>
struct DenseRows {  // one [num_rows, dim] matrix
  T* data;
  int64_t dim;
  T* operator()(int64_t p) const { return data + p * dim; }
};

// output[s] = combine over ids i of s of weights[i] * rows(position[i]), p in [0, num_rows).
template <typename T, typename Rows>
Status CombineForward(const Rows& rows, int64_t num_rows, int64_t dim,
                      const std::vector<PooledLookup<T>>& lookups,
                      const ParallelFor& parallel_for);

// rows_grad(p) (overwritten, for every p in [0, num_rows)) = sum over the uses of row p of
// their share of the output gradient. Uses are grouped by row first (a counting sort), so
// each row is written by one thread, once, with no atomics.
template <typename T, typename MutableRows>
Status CombineBackward(int64_t num_rows, int64_t dim, const std::vector<PooledLookup<T>>& lookups,
                       const MutableRows& rows_grad, const ParallelFor& parallel_for);

}  // namespace sok
