#include "kit_src/core/embedding/shard_rows.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "kit_src/core/block_pool.h"
#include "kit_src/core/embedding/key_partition.h"
#include "kit_src/core/embedding/packed_key.h"
#include "kit_src/core/embedding/weighted_row_sum.h"
#include "kit_src/core/prefetch.h"

namespace sok {

template <typename T>
Status ValidatePackedKeys(const std::vector<ShardView<T>>& shards, const int64_t* keys,
                          int64_t n) {
  const int32_t num_tables = static_cast<int32_t>(shards.size());
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = PackedTable(keys[i]);
    if (keys[i] < 0 || t >= num_tables || PackedRow(keys[i]) >= shards[t].rows) {
      return Status::InvalidArgument(
          "key " + std::to_string(keys[i]) + " (table " + std::to_string(t) + ", local row " +
          std::to_string(PackedRow(keys[i])) + ") names no row of the " +
          std::to_string(num_tables) + " local shards");
    }
  }
  return Status::Ok();
}

template <typename T>
Status GatherShardRows(const std::vector<ShardView<T>>& shards, int64_t dim, const int64_t* keys,
                       int64_t n, T* out, const ParallelFor& parallel_for) {
  Status status = ValidatePackedKeys(shards, keys, n);  // before touching memory
  if (!status.ok()) return status;
  parallel_for(n, dim * 2, [&](int64_t begin, int64_t end) {
    const int64_t ahead = PrefetchDistance(dim * sizeof(T));
    for (int64_t i = begin; i < end; ++i) {
      if (i + ahead < end) {
        PrefetchRow(shards[PackedTable(keys[i + ahead])].data + PackedRow(keys[i + ahead]) * dim, dim);
      }
      const ShardView<T>& shard = shards[PackedTable(keys[i])];
      std::memcpy(out + i * dim, shard.data + PackedRow(keys[i]) * dim, dim * sizeof(T));
    }
  });
  return Status::Ok();
}

template <typename T, typename Tindex>
Status GatherSingleIds(const std::vector<SingleIdLookup<T, Tindex>>& lookups, int64_t dim,
                       const ParallelFor& parallel_for) {
  std::vector<int64_t> first(lookups.size() + 1, 0);  // one parallel loop over all lookups
  for (size_t l = 0; l < lookups.size(); ++l) {
    const SingleIdLookup<T, Tindex>& lookup = lookups[l];
    for (int64_t i = 0; i < lookup.count; ++i) {  // validate before touching memory
      const int64_t id = static_cast<int64_t>(lookup.ids[i]);
      if (id < 0 || id >= lookup.table->rows) {
        return IdOutOfRange(*lookup.table_name, id, lookup.table->rows);
      }
    }
    first[l + 1] = first[l] + lookup.count;
  }
  const int64_t ahead = PrefetchDistance(dim * sizeof(T));
  const bool stream = WorthStreaming(first.back() * dim * int64_t{sizeof(T)});
  parallel_for(first.back(), dim * 2, [&](int64_t begin, int64_t end) {
    size_t l = std::upper_bound(first.begin(), first.end(), begin) - first.begin() - 1;
    for (int64_t g = begin; g < end; ++l) {
      const SingleIdLookup<T, Tindex>& lookup = lookups[l];
      const int64_t last = std::min(end, first[l + 1]) - first[l];
      const T* table = lookup.table->data;
      for (int64_t i = g - first[l]; i < last; ++i) {
        if (i + ahead < last) PrefetchRow(table + static_cast<int64_t>(lookup.ids[i + ahead]) * dim, dim);
        const T* row = table + static_cast<int64_t>(lookup.ids[i]) * dim;
        CopyRow(row, dim, lookup.output + i * dim, stream);
      }
      g = first[l] + last;
    }
    StreamedStoresDone();
  });
  return Status::Ok();
}

template Status ValidatePackedKeys<float>(const std::vector<ShardView<float>>&, const int64_t*,
                                          int64_t);
template Status GatherSingleIds<float, int32_t>(const std::vector<SingleIdLookup<float, int32_t>>&,
                                                int64_t, const ParallelFor&);
template Status GatherSingleIds<float, int64_t>(const std::vector<SingleIdLookup<float, int64_t>>&,
                                                int64_t, const ParallelFor&);

Status CountKeysPerTable(const int64_t* keys, int64_t n, int32_t num_tables,
                         std::vector<int64_t>* counts) {
  counts->assign(num_tables, 0);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = PackedTable(keys[i]);
    if (keys[i] < 0 || t >= num_tables) {
      return Status::InvalidArgument("key " + std::to_string(keys[i]) + " names table " +
                                     std::to_string(t) + " of " + std::to_string(num_tables));
    }
    (*counts)[t] += 1;
  }
  return Status::Ok();
}

Status TableBlocks(const int64_t* keys, int64_t n, int32_t num_tables,
                   std::vector<int64_t>* first, std::vector<int64_t>* counts) {
  Status status = CountKeysPerTable(keys, n, num_tables, counts);
  if (!status.ok()) return status;
  first->assign(num_tables, 0);
  for (int32_t t = 1; t < num_tables; ++t) (*first)[t] = (*first)[t - 1] + (*counts)[t - 1];
  for (int64_t p = 0; p < n; ++p) {
    const int32_t t = PackedTable(keys[p]);
    if (p < (*first)[t] || p >= (*first)[t] + (*counts)[t]) {
      return Status::InvalidArgument("keys are not grouped by table (key " + std::to_string(p) +
                                     " of table " + std::to_string(t) + ")");
    }
  }
  return Status::Ok();
}

Status TableFirstsOfCounts(const int32_t* counts, int32_t num_tables, int64_t n,
                           std::vector<int64_t>* first) {
  first->clear();
  int64_t total = 0;
  for (int32_t t = 0; t < num_tables; ++t) {
    if (counts[t] < 0) {
      return Status::InvalidArgument("table_counts[" + std::to_string(t) + "] = " +
                                     std::to_string(counts[t]) + " is negative");
    }
    first->push_back(total);
    total += counts[t];
  }
  if (total != n) {
    return Status::InvalidArgument("table_counts add up to " + std::to_string(total) +
                                   ", not the " + std::to_string(n) + " keys");
  }
  return Status::Ok();
}

template <typename T>
void SplitGradientByTable(const int64_t* keys, int64_t n, int64_t dim, const T* grad,
                          const std::vector<int64_t*>& indices, const std::vector<T*>& values,
                          const ParallelFor& parallel_for) {
  ScratchVector<int64_t> destination(n);
  std::vector<int64_t> next(indices.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = PackedTable(keys[i]);
    destination[i] = next[t]++;
    indices[t][destination[i]] = PackedRow(keys[i]);
  }
  parallel_for(n, dim * 2, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      std::memcpy(values[PackedTable(keys[i])] + destination[i] * dim, grad + i * dim,
                  dim * sizeof(T));
    }
  });
}

Status SplitGradientByTable(const int64_t* keys, int64_t n, int64_t dim, const float* grad,
                            int32_t num_tables, const std::vector<int64_t>& given_first,
                            TableGradientOutputs* outputs, const ParallelFor& parallel_for) {
  std::vector<int64_t> first, counts;
  const bool grouped = TableBlocks(keys, n, num_tables, &first, &counts).ok();
  if (!given_first.empty() && !(grouped && given_first == first)) {
    return Status::InvalidArgument(
        "table_counts do not describe the keys: they must come grouped by table, with these "
        "counts");
  }
  if (grouped) {  // one worker's own keys: each table's gradient is a block of grad
    for (int32_t t = 0; t < num_tables; ++t) {
      int64_t* indices = nullptr;
      float* values = nullptr;
      SOK_RETURN_IF_ERROR(outputs->Block(t, first[t], counts[t], &indices, &values));
      for (int64_t j = 0; j < counts[t]; ++j) indices[j] = PackedRow(keys[first[t] + j]);
      if (values != nullptr && counts[t] > 0) {
        std::memcpy(values, grad + first[t] * dim, counts[t] * dim * sizeof(float));
      }
    }
    return Status::Ok();
  }
  SOK_RETURN_IF_ERROR(CountKeysPerTable(keys, n, num_tables, &counts));
  std::vector<int64_t*> indices(num_tables);
  std::vector<float*> values(num_tables);
  for (int32_t t = 0; t < num_tables; ++t) {
    SOK_RETURN_IF_ERROR(outputs->Table(t, counts[t], &indices[t], &values[t]));
  }
  SplitGradientByTable(keys, n, dim, grad, indices, values, parallel_for);
  return Status::Ok();
}

template Status GatherShardRows<float>(const std::vector<ShardView<float>>&, int64_t,
                                       const int64_t*, int64_t, float*, const ParallelFor&);
// 16-bit tables (float16, bfloat16): the gather copies their rows as words.
template Status GatherShardRows<uint16_t>(const std::vector<ShardView<uint16_t>>&, int64_t,
                                          const int64_t*, int64_t, uint16_t*,
                                          const ParallelFor&);
template void SplitGradientByTable<float>(const int64_t*, int64_t, int64_t, const float*,
                                          const std::vector<int64_t*>&,
                                          const std::vector<float*>&, const ParallelFor&);

}  // namespace sok
