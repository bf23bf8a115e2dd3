#include "kit_src/core/embedding/combine.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <thread>

#include "kit_src/core/block_pool.h"
#include "kit_src/core/embedding/key_partition.h"
#include "kit_src/core/embedding/shard_rows.h"
#include "kit_src/core/embedding/weighted_row_sum.h"
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

// An id's share of its sample's output gradient: weight / denominator (0 where the forward
// pooled the sample to zeros).
float UseScale(const float* weights, float denominator, int64_t i) {
  return denominator == 0.0f ? 0.0f : (weights ? weights[i] : 1.0f) / denominator;
}

Status BadPosition(int64_t position, int64_t num_rows) {
  return Status::InvalidArgument("row position " + std::to_string(position) +
                                 " is out of range [0, " + std::to_string(num_rows) + ")");
}

// Pools sample s of `lookup` into out. row_of_id[i - first_id] is the address of the row of
// id i (ids of the sample are [row_splits[s], row_splits[s + 1])); the rows of ids up to
// `ahead` later, below `last_id`, are requested on the way.
template <typename T>
void PoolSample(int64_t dim, const PooledLookup<T>& lookup, int64_t s, const T* const* row_of_id,
                int64_t first_id, int64_t last_id, int64_t ahead, bool stream, T* out) {
  const int64_t begin = lookup.row_splits[s], end = lookup.row_splits[s + 1];
  const float denominator = Denominator(lookup.combiner, lookup.weights, begin, end);
  for (int64_t i = begin + ahead; i < std::min(end + ahead, last_id); ++i) {
    PrefetchRow(row_of_id[i - first_id], dim);
  }
  const int64_t n = denominator == 0.0f ? 0 : end - begin;
  WeightedRowSum(
      n, [&](int64_t k) { return row_of_id[begin + k - first_id]; },
      [&](int64_t k) { return (lookup.weights ? lookup.weights[begin + k] : 1.0f) / denominator; },
      dim, out, stream);
}

// A use of a row in the backward: which sample's output gradient, scaled by how much.
struct Use {
  uint32_t sample;
  float scale;
};
// The backward's counting sort: blocks of at least kUsesPerSortBlock uses, at most one per
// core (each block keeps a counter per row: more blocks than cores measured slower), rows
// scanned in chunks.
constexpr int64_t kUsesPerSortBlock = int64_t{1} << 17;
constexpr int64_t kRowsPerScanChunk = int64_t{1} << 14;

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
  // Blocks without an early exit vectorise; the first decrease is then sought in its block.
  constexpr int64_t kBlock = 512;
  for (int64_t first = 0; first < batch; first += kBlock) {
    const int64_t last = std::min(first + kBlock, batch);
    bool decreases = false;
    for (int64_t s = first; s < last; ++s) decreases |= row_splits[s + 1] < row_splits[s];
    if (!decreases) continue;
    for (int64_t s = first; s < last; ++s) {
      if (row_splits[s + 1] < row_splits[s]) {
        return Status::InvalidArgument(what + ": row_splits decrease at sample " +
                                       std::to_string(s));
      }
    }
  }
  return Status::Ok();
}

Status BindPooledPositions(const int32_t* position, int64_t positions,
                           const std::vector<int64_t>& weights_counts,
                           std::vector<PooledLookup<float>>* lookups) {
  int64_t offset = 0;
  for (size_t l = 0; l < lookups->size(); ++l) {
    PooledLookup<float>& lookup = (*lookups)[l];
    const std::string what = "lookup " + std::to_string(l);
    const int64_t nnz = lookup.row_splits[lookup.batch];
    if (nnz < 0 || offset + nnz > positions) {
      return Status::InvalidArgument(what + " has " + std::to_string(nnz) + " ids but only " +
                                     std::to_string(positions - offset) +
                                     " positions are left");
    }
    Status status = ValidateRowSplits(lookup.row_splits, lookup.batch, nnz, what);
    if (!status.ok()) return status;
    if (lookup.weights != nullptr && weights_counts[l] != nnz) {
      return Status::InvalidArgument("weights of " + what + " have " +
                                     std::to_string(weights_counts[l]) +
                                     " values but its ids have " + std::to_string(nnz) +
                                     "; weights must match the ids one to one");
    }
    lookup.position = position + offset;
    offset += nnz;
  }
  if (offset != positions) {
    return Status::InvalidArgument("the lookups have " + std::to_string(offset) +
                                   " ids but position has " + std::to_string(positions));
  }
  return Status::Ok();
}

bool EverySampleHoldsOneId(const int64_t* row_splits, int64_t batch) {
  // Blocks without an early exit vectorise; a batch of longer samples fails in its first.
  constexpr int64_t kBlock = 512;
  for (int64_t first = 0; first <= batch; first += kBlock) {
    const int64_t last = std::min(first + kBlock, batch + 1);
    bool iota = true;
    for (int64_t s = first; s < last; ++s) iota &= row_splits[s] == s;
    if (!iota) return false;
  }
  return true;
}

std::vector<PooledLookup<float>> WithOneIdRowSplits(std::vector<PooledLookup<float>> lookups,
                                                    std::vector<std::vector<int64_t>>* storage) {
  for (PooledLookup<float>& lookup : lookups) {
    if (lookup.row_splits != nullptr) continue;
    storage->emplace_back(lookup.batch + 1);
    std::iota(storage->back().begin(), storage->back().end(), int64_t{0});
    lookup.row_splits = storage->back().data();  // a vector's buffer stays put when moved
  }
  return lookups;
}

Status RowSplitsOfSortedRows(const int64_t* row_ids, int64_t stride, int64_t nnz,
                             int64_t num_rows, int64_t* row_splits, const std::string& what) {
  row_splits[0] = 0;
  int64_t row = 0;  // row_splits[0..row] written
  for (int64_t i = 0; i < nnz; ++i) {
    const int64_t id_row = row_ids[i * stride];
    if (id_row < row || id_row >= num_rows) {
      const bool out_of_range = id_row < 0 || id_row >= num_rows;
      return Status::InvalidArgument(
          what + ": entry " + std::to_string(i) + " is in row " + std::to_string(id_row) +
          (out_of_range ? ", outside [0, " + std::to_string(num_rows) + ") (dense_shape[0])"
                        : " after an entry of row " + std::to_string(row) +
                              "; rows must be in order (tf.sparse.reorder sorts them)"));
    }
    while (row < id_row) row_splits[++row] = i;
  }
  while (row < num_rows) row_splits[++row] = nnz;
  return Status::Ok();
}

// Lookups laid end to end: global sample number g is sample g - first[l] of lookup l, whose
// ids are, among all lookups' ids, use_first[l] + [row_splits[s], row_splits[s + 1]).
template <typename T>
struct SampleSpace {
  explicit SampleSpace(const std::vector<PooledLookup<T>>& lookups) : lookups(lookups) {
    first.push_back(0);
    use_first.push_back(0);
    for (const PooledLookup<T>& lookup : lookups) {
      first.push_back(first.back() + lookup.batch);
      use_first.push_back(use_first.back() + lookup.row_splits[lookup.batch]);
    }
  }
  int64_t samples() const { return first.back(); }
  int64_t uses() const { return use_first.back(); }
  // The first global sample whose ids start at or after use u.
  int64_t SampleAtUse(int64_t u) const {
    size_t l = std::upper_bound(use_first.begin(), use_first.end(), u) - use_first.begin() - 1;
    if (l >= lookups.size()) return samples();
    const int64_t* splits = lookups[l].row_splits;
    return first[l] + (std::lower_bound(splits, splits + lookups[l].batch, u - use_first[l]) - splits);
  }
  // visit(lookup, s, g) for the samples of global numbers g in [begin, end).
  template <typename Visit>
  void ForSamples(int64_t begin, int64_t end, Visit visit) const {
    size_t l = std::upper_bound(first.begin(), first.end(), begin) - first.begin() - 1;
    for (int64_t g = begin; g < end; ++l) {
      const int64_t last = std::min(end, first[l + 1]);
      for (; g < last; ++g) visit(lookups[l], g - first[l], g);
    }
  }

  // visit(l, s, i, share) for every id i of the samples g in [begin, end): lookup l, its
  // sample s and the id's share of the sample's pooled gradient (UseScale).
  template <typename Visit>
  void ForUses(int64_t begin, int64_t end, Visit visit) const {
    ForSamples(begin, end, [&](const PooledLookup<T>& lookup, int64_t s, int64_t) {
      const size_t l = &lookup - lookups.data();
      const int64_t first_id = lookup.row_splits[s], end_id = lookup.row_splits[s + 1];
      const float denominator = Denominator(lookup.combiner, lookup.weights, first_id, end_id);
      for (int64_t i = first_id; i < end_id; ++i) {
        visit(l, s, i, UseScale(lookup.weights, denominator, i));
      }
    });
  }

  const std::vector<PooledLookup<T>>& lookups;
  std::vector<int64_t> first, use_first;
};

// Pools every sample of every lookup; row_of_id(l, i) is the row of id i of lookup l, or
// null when it names none (then false is returned and the outputs are unspecified).
template <typename T, typename RowOfId>
bool PoolSamples(const RowOfId& row_of_id_at, int64_t dim,
                 const std::vector<PooledLookup<T>>& lookups, const ParallelFor& parallel_for) {
  // One parallel loop over the samples of all lookups: one synchronisation per call.
  const SampleSpace<T> space(lookups);
  const std::vector<int64_t>& first_sample = space.first;
  const int64_t cost = dim * (2 + space.uses() / std::max<int64_t>(space.samples(), 1)) * 4;
  const int64_t ahead = PrefetchDistance(dim * sizeof(T));
  const bool stream = WorthStreaming(space.samples() * dim * int64_t{sizeof(T)});
  std::atomic<bool> ok{true};
  parallel_for(space.samples(), cost, [&](int64_t begin, int64_t end) {
    // Rows are scattered over large tables, so pooling waits on memory. The rows' addresses
    // are resolved first (one pass over the ids), so that the pooling can request rows
    // well ahead without waiting on the id -> row indirection.
    ScratchVector<const T*> row_of_id;
    size_t l = std::upper_bound(first_sample.begin(), first_sample.end(), begin) -
               first_sample.begin() - 1;
    for (int64_t g = begin; g < end; ++l) {
      const PooledLookup<T>& lookup = lookups[l];
      const int64_t first = g - first_sample[l];
      const int64_t last = std::min(end, first_sample[l + 1]) - first_sample[l];
      g = first_sample[l] + last;
      const int64_t first_id = lookup.row_splits[first], last_id = lookup.row_splits[last];
      row_of_id.resize(last_id - first_id);
      for (int64_t i = first_id; i < last_id; ++i) {
        const T* row = row_of_id_at(l, i);
        if (row == nullptr) {
          ok = false;
          return;
        }
        row_of_id[i - first_id] = row;
      }
      for (int64_t k = 0; k < std::min(ahead, last_id - first_id); ++k) {
        PrefetchRow(row_of_id[k], dim);
      }
      for (int64_t s = first; s < last; ++s) {
        PoolSample(dim, lookup, s, row_of_id.data(), first_id, last_id, ahead, stream,
                   lookup.output + s * OutputStride(lookup, dim));
      }
    }
    StreamedStoresDone();
  });
  return ok;
}

template <typename T, typename Rows>
Status CombineForward(const Rows& rows, int64_t num_rows, int64_t dim,
                      const std::vector<PooledLookup<T>>& lookups,
                      const ParallelFor& parallel_for) {
  const auto row_of_id = [&](size_t l, int64_t i) -> const T* {
    const int32_t p = lookups[l].position[i];
    return p < 0 || p >= num_rows ? nullptr : rows(p);
  };
  if (!PoolSamples(row_of_id, dim, lookups, parallel_for)) return CheckPositions(num_rows, lookups);
  return Status::Ok();
}

template <typename T>
Status PoolFromTables(const std::vector<LookupTable<T>>& tables, int64_t dim,
                      const std::vector<PooledLookup<T>>& lookups,
                      const ParallelFor& parallel_for) {
  for (size_t l = 0; l < lookups.size(); ++l) {
    Status status = ValidateRowSplits(lookups[l].row_splits, lookups[l].batch, tables[l].count,
                                      "lookup " + std::to_string(l));
    if (!status.ok()) return status;
  }
  const auto row_of_id = [&](size_t l, int64_t i) -> const T* {
    const int64_t id = tables[l].ids[i];
    return id < 0 || id >= tables[l].rows ? nullptr : tables[l].data + id * dim;
  };
  if (PoolSamples(row_of_id, dim, lookups, parallel_for)) return Status::Ok();
  for (const LookupTable<T>& table : tables) {  // the first bad id, for the message
    for (int64_t i = 0; i < table.count; ++i) {
      if (table.ids[i] < 0 || table.ids[i] >= table.rows) {
        return IdOutOfRange(*table.name, table.ids[i], table.rows);
      }
    }
  }
  return Status::Ok();
}

namespace {

// The lookups as the host reads them: one-id row splits filled in (held in `storage`), every
// lookup's row splits checked against its ids.
Status HostRowSplits(const std::vector<PooledLookup<float>>& lookups,
                     const std::vector<int64_t>& id_counts,
                     std::vector<std::vector<int64_t>>* storage,
                     std::vector<PooledLookup<float>>* host) {
  *host = WithOneIdRowSplits(lookups, storage);
  for (size_t l = 0; l < host->size(); ++l) {
    SOK_RETURN_IF_ERROR(ValidateRowSplits((*host)[l].row_splits, (*host)[l].batch, id_counts[l],
                                          "lookup " + std::to_string(l)));
  }
  return Status::Ok();
}

}  // namespace

Status SpreadPooledGrad(int64_t dim, const std::vector<PooledLookup<float>>& lookups,
                        const std::vector<int64_t>& id_counts,
                        const std::vector<float*>& id_grads, const ParallelFor& parallel_for) {
  std::vector<std::vector<int64_t>> storage;
  std::vector<PooledLookup<float>> host;
  SOK_RETURN_IF_ERROR(HostRowSplits(lookups, id_counts, &storage, &host));
  const SampleSpace<float> space(host);
  const int64_t cost = dim * (1 + space.uses() / std::max<int64_t>(space.samples(), 1)) * 2;
  parallel_for(space.samples(), cost, [&](int64_t begin, int64_t end) {
    space.ForUses(begin, end, [&](size_t l, int64_t s, int64_t i, float scale) {
      const float* grad = host[l].output_grad + s * OutputStride(host[l], dim);
      float* out = id_grads[l] + i * dim;
      for (int64_t d = 0; d < dim; ++d) out[d] = scale * grad[d];
    });
  });
  return Status::Ok();
}

Status PooledGradShares(const std::vector<PooledLookup<float>>& lookups,
                        const std::vector<int64_t>& id_counts,
                        const std::vector<int64_t>& row_first,
                        const std::vector<int64_t>& row_step,
                        const std::vector<int64_t*>& use_rows,
                        const std::vector<float*>& use_scales, const ParallelFor& parallel_for) {
  std::vector<std::vector<int64_t>> storage;
  std::vector<PooledLookup<float>> host;
  SOK_RETURN_IF_ERROR(HostRowSplits(lookups, id_counts, &storage, &host));
  const SampleSpace<float> space(host);
  const int64_t cost = 4 * (1 + space.uses() / std::max<int64_t>(space.samples(), 1));
  parallel_for(space.samples(), cost, [&](int64_t begin, int64_t end) {
    space.ForUses(begin, end, [&](size_t l, int64_t s, int64_t i, float scale) {
      use_rows[l][i] = row_first[l] + s * row_step[l];
      use_scales[l][i] = scale;
    });
  });
  return Status::Ok();
}

// The uses of every row, grouped by row: the uses of row p are uses[first_use[p] ..
// first_use[p + 1]). A counting sort, in parallel: the samples are cut into blocks of about
// equal uses, each block counts its uses per row, and a row's uses are laid out block after
// block, so the blocks then fill disjoint slots.
template <typename T>
Status SortUsesByRow(const SampleSpace<T>& space, int64_t num_rows,
                     const ParallelFor& parallel_for, ScratchVector<int64_t>* first_use,
                     ScratchVector<Use>* uses) {
  const int64_t total_uses = space.uses();
  if (space.samples() > std::numeric_limits<uint32_t>::max() ||
      total_uses > std::numeric_limits<uint32_t>::max()) {
    return Status::InvalidArgument("a combine backward of " + std::to_string(space.samples()) +
                                   " samples and " + std::to_string(total_uses) +
                                   " ids exceeds 2^32");
  }
  const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t num_blocks = std::clamp<int64_t>(total_uses / kUsesPerSortBlock, 1, cores);
  std::vector<int64_t> block_first(num_blocks + 1, space.samples());
  for (int64_t b = 0; b < num_blocks; ++b) {
    block_first[b] = space.SampleAtUse(total_uses * b / num_blocks);
  }
  std::vector<ScratchVector<uint32_t>> cursor(num_blocks);
  parallel_for(num_blocks, total_uses / num_blocks * 4, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      cursor[b].assign(num_rows, 0);
      space.ForSamples(block_first[b], block_first[b + 1],
                       [&](const PooledLookup<T>& lookup, int64_t s, int64_t) {
                         for (int64_t i = lookup.row_splits[s]; i < lookup.row_splits[s + 1]; ++i) {
                           cursor[b][lookup.position[i]] += 1;
                         }
                       });
    }
  });
  // Counts become each block's first slot for each row: a scan over rows, in chunks.
  first_use->assign(num_rows + 1, 0);
  const int64_t num_chunks = (num_rows + kRowsPerScanChunk - 1) / kRowsPerScanChunk;
  std::vector<int64_t> chunk_first(num_chunks + 1, 0);
  parallel_for(num_chunks, kRowsPerScanChunk * num_blocks, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      for (int64_t p = c * kRowsPerScanChunk; p < std::min(num_rows, (c + 1) * kRowsPerScanChunk); ++p) {
        for (int64_t b = 0; b < num_blocks; ++b) chunk_first[c + 1] += cursor[b][p];
      }
    }
  });
  for (int64_t c = 0; c < num_chunks; ++c) chunk_first[c + 1] += chunk_first[c];
  parallel_for(num_chunks, kRowsPerScanChunk * num_blocks, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      int64_t next = chunk_first[c];
      for (int64_t p = c * kRowsPerScanChunk; p < std::min(num_rows, (c + 1) * kRowsPerScanChunk); ++p) {
        (*first_use)[p] = next;
        for (int64_t b = 0; b < num_blocks; ++b) {
          const uint32_t count = cursor[b][p];
          cursor[b][p] = static_cast<uint32_t>(next);
          next += count;
        }
      }
    }
  });
  (*first_use)[num_rows] = total_uses;
  uses->resize(total_uses);
  parallel_for(num_blocks, total_uses / num_blocks * 8, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      space.ForSamples(block_first[b], block_first[b + 1],
                       [&](const PooledLookup<T>& lookup, int64_t s, int64_t g) {
        const int64_t first = lookup.row_splits[s], last = lookup.row_splits[s + 1];
        const float denominator = Denominator(lookup.combiner, lookup.weights, first, last);
        for (int64_t i = first; i < last; ++i) {
          const float weight = lookup.weights ? lookup.weights[i] : 1.0f;
          (*uses)[cursor[b][lookup.position[i]]++] = {
              static_cast<uint32_t>(g), denominator == 0.0f ? 0.0f : weight / denominator};
        }
      });
    }
  });
  return Status::Ok();
}

template <typename T, typename MutableRows>
Status CombineBackward(int64_t num_rows, int64_t dim, const std::vector<PooledLookup<T>>& lookups,
                       const MutableRows& rows_grad, const ParallelFor& parallel_for) {
  Status status = CheckPositions(num_rows, lookups);
  if (!status.ok()) return status;
  const SampleSpace<T> space(lookups);
  ScratchVector<const T*> sample_grad(space.samples());  // each sample's gradient row
  space.ForSamples(0, space.samples(), [&](const PooledLookup<T>& lookup, int64_t s, int64_t g) {
    sample_grad[g] = lookup.output_grad + s * OutputStride(lookup, dim);
  });
  ScratchVector<int64_t> first_use;
  ScratchVector<Use> uses;
  status = SortUsesByRow(space, num_rows, parallel_for, &first_use, &uses);
  if (!status.ok()) return status;
  const int64_t uses_per_row = space.uses() / std::max<int64_t>(num_rows, 1) + 1;
  const bool stream = WorthStreaming(num_rows * dim * int64_t{sizeof(T)});
  parallel_for(num_rows, dim * (uses_per_row + 1) * 2, [&](int64_t begin, int64_t end) {
    const int64_t end_use = first_use[end];
    const int64_t ahead = PrefetchDistance(dim * sizeof(T));
    for (int64_t p = begin; p < end; ++p) {
      const Use* row_uses = uses.data() + first_use[p];
      const int64_t count = first_use[p + 1] - first_use[p];
      // The uses' gradient rows are scattered over the batch: request them early.
      for (int64_t k = first_use[p] + ahead; k < std::min(first_use[p + 1] + ahead, end_use); ++k) {
        PrefetchRow(sample_grad[uses[k].sample], dim);
      }
      WeightedRowSum(
          count, [&](int64_t k) { return sample_grad[row_uses[k].sample]; },
          [&](int64_t k) { return row_uses[k].scale; }, dim, rows_grad(p), stream);
    }
    StreamedStoresDone();
  });
  return Status::Ok();
}

template Status CombineForward<float, DenseRows<const float>>(
    const DenseRows<const float>&, int64_t, int64_t, const std::vector<PooledLookup<float>>&,
    const ParallelFor&);
template Status CombineForward<float, PackedKeyRows<float>>(
    const PackedKeyRows<float>&, int64_t, int64_t, const std::vector<PooledLookup<float>>&,
    const ParallelFor&);
template Status PoolFromTables<float>(const std::vector<LookupTable<float>>&, int64_t,
                                      const std::vector<PooledLookup<float>>&,
                                      const ParallelFor&);
template Status CombineBackward<float, DenseRows<float>>(
    int64_t, int64_t, const std::vector<PooledLookup<float>>&, const DenseRows<float>&,
    const ParallelFor&);

}  // namespace sok
