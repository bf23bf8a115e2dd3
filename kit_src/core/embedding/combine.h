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
                                        // (pooling from the tables: null for one id a sample)
  int64_t batch = 0;
  const int32_t* position = nullptr;    // [nnz] row of each id in the rows matrix
  const float* weights = nullptr;       // [nnz] per-id weights, or nullptr for all ones
  Combiner combiner = Combiner::kMean;
  T* output = nullptr;                  // forward: [batch, dim] pooled vectors (written)
  const T* output_grad = nullptr;       // backward: [batch, dim] gradient of `output`
  int64_t stride = 0;                   // elements from one sample's output row to the next's
                                        // (0: dim; lookups interleaved in a [batch, N, dim]
                                        // output: N * dim)
};

template <typename T>
inline int64_t OutputStride(const PooledLookup<T>& lookup, int64_t dim) {
  return lookup.stride > 0 ? lookup.stride : dim;
}

// A lookup's own table when pooling straight from the tables (one worker: no dedup, no
// exchange): [rows, dim] row-major, and the lookup's `count` ids, each a row of it.
template <typename T>
struct LookupTable {
  const T* data = nullptr;
  int64_t rows = 0;
  const int64_t* ids = nullptr;
  int64_t count = 0;
  const std::string* name = nullptr;  // for the out-of-range error
};

// Checks that row_splits starts at 0, never decreases and ends at nnz.
Status ValidateRowSplits(const int64_t* row_splits, int64_t batch, int64_t nnz,
                         const std::string& what);

// Binds each lookup to its run of the `positions` (runs one after another in lookup order),
// checking on the host: row splits that start at 0, never decrease and fit the positions
// left, weights one an id (weights_counts[l], where lookup l has weights), and every position
// used. Sets lookups[l].position.
Status BindPooledPositions(const int32_t* position, int64_t positions,
                           const std::vector<int64_t>& weights_counts,
                           std::vector<PooledLookup<float>>* lookups);

// Whether every sample holds exactly one id: row_splits ([batch + 1]) is 0, 1, ..., batch.
bool EverySampleHoldsOneId(const int64_t* row_splits, int64_t batch);

// lookups, each null row_splits (one id a sample) replaced by 0, 1, ..., batch held in
// `storage`, for the host functions below, which read every sample's bounds.
std::vector<PooledLookup<float>> WithOneIdRowSplits(std::vector<PooledLookup<float>> lookups,
                                                    std::vector<std::vector<int64_t>>* storage);

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

// The same with each lookup's rows read straight from its table at its ids (tables[l] for
// lookups[l], whose `position` is unused): row_splits are checked against the ids first; an
// id outside its table fails with IdOutOfRange naming the table.
template <typename T>
Status PoolFromTables(const std::vector<LookupTable<T>>& tables, int64_t dim,
                      const std::vector<PooledLookup<T>>& lookups,
                      const ParallelFor& parallel_for);

// PoolFromTables' gradient for each id's row: id_grads[l] row i ([count, dim], written) =
// weights[i] / denominator * output_grad of the sample holding id i (0 where the forward
// pooled to zeros). Repeated ids keep one row each: their sum is the table row's gradient.
// Null row_splits: one id a sample; others must run from 0 to id_counts[l] without
// decreasing, checked first.
Status SpreadPooledGrad(int64_t dim, const std::vector<PooledLookup<float>>& lookups,
                        const std::vector<int64_t>& id_counts,
                        const std::vector<float*>& id_grads, const ParallelFor& parallel_for);

// SpreadPooledGrad's rows as shares, for an update that reads the output gradient itself:
// id i of lookup l takes use_scales[l][i] times row use_rows[l][i] of its output gradient
// viewed as a [rows, dim] matrix (row_first[l] + s * row_step[l] for its sample s). Row
// splits as SpreadPooledGrad's.
Status PooledGradShares(const std::vector<PooledLookup<float>>& lookups,
                        const std::vector<int64_t>& id_counts,
                        const std::vector<int64_t>& row_first,
                        const std::vector<int64_t>& row_step,
                        const std::vector<int64_t*>& use_rows,
                        const std::vector<float*>& use_scales, const ParallelFor& parallel_for);

// rows_grad(p) (overwritten, for every p in [0, num_rows)) = sum over the uses of row p of
// their share of the output gradient. Uses are grouped by row first (a counting sort), so
// each row is written by one thread, once, with no atomics.
template <typename T, typename MutableRows>
Status CombineBackward(int64_t num_rows, int64_t dim, const std::vector<PooledLookup<T>>& lookups,
                       const MutableRows& rows_grad, const ParallelFor& parallel_for);

}  // namespace sok
