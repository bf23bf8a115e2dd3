#include "kit_src/core/embedding/key_partition.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>

#include "absl/container/flat_hash_map.h"
#include "kit_src/core/embedding/packed_key.h"
#include "kit_src/core/embedding/row_owner.h"

namespace sok {
namespace {

// The unique ids of one table and, per occurrence, the index of its id among them.
struct TableKeys {
  ScratchVector<int64_t> unique_ids;
  std::vector<int64_t> per_worker;  // [num_workers] unique ids owned by each worker
  Status status;
};


int32_t OwnerOf(const TablePlacement& table, int64_t id, int32_t num_workers) {
  if (table.dynamic) return static_cast<int32_t>(DynamicKeyOwner(id, table.owner, num_workers));
  return static_cast<int32_t>(StaticRowOwner(id, table.owner, num_workers));
}

// A dynamic table's keys are sent as they are.
int64_t LocalRowOf(const TablePlacement& table, int64_t id, int32_t num_workers) {
  return table.dynamic ? id : StaticLocalRow(id, table.owner, num_workers);
}

// Calls visit(id, slot) for every id of table `table_index`'s lookups in order, slot being
// where that occurrence's position goes; stops at the first visit that returns false.
template <typename Tindex, typename Visit>
inline void ForEachTableId(const std::vector<LookupIds<Tindex>>& lookups,
                           const std::vector<int64_t>& lookup_offsets, int32_t table_index,
                           int32_t* position, Visit&& visit) {
  for (size_t l = 0; l < lookups.size(); ++l) {
    const LookupIds<Tindex>& lookup = lookups[l];
    if (lookup.table != table_index) continue;
    int32_t* out = position + lookup_offsets[l];
    for (int64_t i = 0; i < lookup.count; ++i) {
      if (!visit(static_cast<int64_t>(lookup.ids[i]), out + i)) return;
    }
  }
}

// Dedup through a bitmap of the table's rows, for tables not much larger than the number of
// ids: no hashing, and the unique ids come out sorted, so the owner reads its shard in
// increasing row order (far fewer cache and TLB misses than first-seen order).
template <typename Tindex>
void CollectTableKeysSorted(const std::vector<LookupIds<Tindex>>& lookups,
                            const std::vector<int64_t>& lookup_offsets, int32_t table_index,
                            const TablePlacement& table, const PartitionOptions& options,
                            int32_t* position, TableKeys* keys) {
  const int64_t words = (table.rows + 63) / 64;
  ScratchVector<uint64_t> bits(words, 0);
  ForEachTableId(lookups, lookup_offsets, table_index, position, [&](int64_t id, int32_t*) {
    if (id < 0 || id >= table.rows) {
      keys->status = IdOutOfRange(table.name, id, table.rows);
      return false;
    }
    bits[id >> 6] |= uint64_t{1} << (id & 63);
    return true;
  });
  if (!keys->status.ok()) return;
  ScratchVector<int32_t> ids_before(words);  // unique ids in words [0, w)
  for (int64_t w = 0; w < words; ++w) {
    ids_before[w] = static_cast<int32_t>(keys->unique_ids.size());
    for (uint64_t word = bits[w]; word != 0; word &= word - 1) {
      const int64_t id = w * 64 + __builtin_ctzll(word);
      keys->unique_ids.push_back(id);
      keys->per_worker[OwnerOf(table, id, options.num_workers)] += 1;
    }
  }
  ForEachTableId(lookups, lookup_offsets, table_index, position, [&](int64_t id, int32_t* slot) {
    const uint64_t below = (uint64_t{1} << (id & 63)) - 1;
    *slot = ids_before[id >> 6] + __builtin_popcountll(bits[id >> 6] & below);
    return true;
  });
}

// Collects one table's unique ids; writes each occurrence's index among them to `position`.
template <typename Tindex>
void CollectTableKeys(const std::vector<LookupIds<Tindex>>& lookups,
                      const std::vector<int64_t>& lookup_offsets, int32_t table_index,
                      const TablePlacement& table, const PartitionOptions& options,
                      int32_t* position, TableKeys* keys) {
  keys->per_worker.assign(options.num_workers, 0);
  int64_t total = 0;
  for (const auto& lookup : lookups) total += lookup.table == table_index ? lookup.count : 0;
  keys->unique_ids.reserve(total);
  if (options.dedup && !table.dynamic && table.rows / 64 <= 4 * total + 1024) {
    CollectTableKeysSorted(lookups, lookup_offsets, table_index, table, options, position, keys);
    return;
  }
  absl::flat_hash_map<int64_t, int32_t> index_of;
  if (options.dedup) index_of.reserve(total);

  ForEachTableId(lookups, lookup_offsets, table_index, position, [&](int64_t id, int32_t* slot) {
    if (!table.dynamic && (id < 0 || id >= table.rows)) {
      keys->status = IdOutOfRange(table.name, id, table.rows);
      return false;
    }
    const int32_t next = static_cast<int32_t>(keys->unique_ids.size());
    if (options.dedup) {
      auto inserted = index_of.try_emplace(id, next);
      if (!inserted.second) {
        *slot = inserted.first->second;
        return true;
      }
    }
    keys->unique_ids.push_back(id);
    keys->per_worker[OwnerOf(table, id, options.num_workers)] += 1;
    *slot = next;
    return true;
  });
}

}  // namespace

Status PartitionKeyWidths(const std::vector<TablePlacement>& tables,
                          const PartitionOptions& options, bool on_gpu, PartitionKeyBits* bits) {
  const int32_t num_workers = options.num_workers;
  uint64_t max_local_rows = 1;
  for (const TablePlacement& table : tables) {
    max_local_rows =
        std::max<uint64_t>(max_local_rows, MostLocalRows(table.rows, table.owner, num_workers));
  }
  bits->row_bits = BitsToHold(max_local_rows);
  bits->table_bits = BitsToHold(tables.size());
  const int worker_bits = BitsToHold(num_workers);
  if (!on_gpu) return Status::Ok();
  if (options.pair_keys) {  // (worker, table) in 32 bits, ids in another 64
    if (bits->table_bits + worker_bits <= 32) return Status::Ok();
    return Status::InvalidArgument(std::to_string(tables.size()) + " tables and " +
                                   std::to_string(num_workers) +
                                   " workers do not fit a 32-bit sort key");
  }
  if (bits->row_bits <= kPackedRowBits && bits->row_bits + bits->table_bits + worker_bits <= 64) {
    return Status::Ok();
  }
  return Status::InvalidArgument("tables of " + std::to_string(max_local_rows) + " local rows, " +
                                 std::to_string(tables.size()) + " tables and " +
                                 std::to_string(num_workers) +
                                 " workers do not fit a 64-bit sort key");
}

Status IdOutOfRange(const std::string& table_name, int64_t id, int64_t rows) {
  // Plain string concatenation, no iostreams: TensorFlow's GPU wheel exports its own weak
  // std::ostringstream members, built by another libstdc++, and the loader binds ours to them
  // (a crash on this very error path there).
  return Status::InvalidArgument("id " + std::to_string(id) + " of table '" + table_name +
                                 "' is out of range [0, " + std::to_string(rows) +
                                 "); ids of a static table must index one of its rows");
}

template <typename Tindex>
Status CheckIdsInRange(const Tindex* ids, int64_t n, int64_t rows, const std::string& table_name,
                       const ParallelFor& parallel_for, Tindex* copy_to) {
  std::atomic<int64_t> first_bad{n};
  parallel_for(n, 2, [&](int64_t begin, int64_t end) {
    // The shard's copy first (it leaves the shard in cache), then a branch-free pass: it
    // vectorises.
    if (copy_to != nullptr) std::copy(ids + begin, ids + end, copy_to + begin);
    bool any_bad = false;
    for (int64_t i = begin; i < end; ++i) {
      any_bad |= static_cast<uint64_t>(static_cast<int64_t>(ids[i])) >= static_cast<uint64_t>(rows);
    }
    if (!any_bad) return;
    for (int64_t i = begin; i < end; ++i) {
      if (static_cast<uint64_t>(static_cast<int64_t>(ids[i])) < static_cast<uint64_t>(rows)) continue;
      int64_t seen = first_bad.load();
      while (i < seen && !first_bad.compare_exchange_weak(seen, i)) {
      }
      return;
    }
  });
  const int64_t bad = first_bad.load();
  return bad < n ? IdOutOfRange(table_name, static_cast<int64_t>(ids[bad]), rows) : Status::Ok();
}

template Status CheckIdsInRange<int32_t>(const int32_t*, int64_t, int64_t, const std::string&,
                                         const ParallelFor&, int32_t*);
template Status CheckIdsInRange<int64_t>(const int64_t*, int64_t, int64_t, const std::string&,
                                         const ParallelFor&, int64_t*);

template <typename Tindex>
Status PartitionKeys(const std::vector<LookupIds<Tindex>>& lookups,
                     const std::vector<TablePlacement>& tables, const PartitionOptions& options,
                     const ParallelFor& parallel_for, PartitionResult* result) {
  const int32_t num_workers = options.num_workers;
  const int64_t num_tables = static_cast<int64_t>(tables.size());
  if (num_tables > kMaxTablesPerGroup) {
    return Status::InvalidArgument("too many tables in one lookup group: " +
                                   std::to_string(num_tables));
  }
  std::vector<int64_t> lookup_offsets(lookups.size() + 1, 0);
  for (size_t l = 0; l < lookups.size(); ++l) {
    if (lookups[l].table < 0 || lookups[l].table >= num_tables) {
      return Status::InvalidArgument("lookup " + std::to_string(l) + " names table " +
                                     std::to_string(lookups[l].table) + " of " +
                                     std::to_string(num_tables));
    }
    lookup_offsets[l + 1] = lookup_offsets[l] + lookups[l].count;
  }
  if (lookup_offsets.back() > INT32_MAX) {
    return Status::InvalidArgument("more than 2^31 ids in one lookup call");
  }
  result->position.resize(lookup_offsets.back());

  // 1. Unique ids of each table, tables in parallel.
  std::vector<TableKeys> table_keys(num_tables);
  const int64_t ids_per_table = lookup_offsets.back() / std::max<int64_t>(num_tables, 1);
  parallel_for(num_tables, 50 * (ids_per_table + 1), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      CollectTableKeys(lookups, lookup_offsets, static_cast<int32_t>(t), tables[t], options,
                       result->position.data(), &table_keys[t]);
    }
  });
  for (const TableKeys& keys : table_keys) {
    if (!keys.status.ok()) return keys.status;
  }

  // 2. Where each (worker, table) block starts in the send buffer.
  std::vector<int64_t> block_start(num_workers * num_tables);
  result->splits.assign(num_workers, 0);
  int64_t cursor = 0;
  for (int32_t w = 0; w < num_workers; ++w) {
    for (int64_t t = 0; t < num_tables; ++t) {
      block_start[w * num_tables + t] = cursor;
      cursor += table_keys[t].per_worker[w];
      result->splits[w] += table_keys[t].per_worker[w];
    }
  }
  const int64_t key_width = options.pair_keys ? 2 : 1;
  result->send_keys.resize(cursor * key_width);

  // 3. Write the packed keys and turn each occurrence's index into a send-buffer position.
  parallel_for(num_tables, 20 * (ids_per_table + 1), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const TablePlacement& table = tables[t];
      const ScratchVector<int64_t>& unique_ids = table_keys[t].unique_ids;
      std::vector<int64_t> next(num_workers);
      for (int32_t w = 0; w < num_workers; ++w) next[w] = block_start[w * num_tables + t];
      ScratchVector<int32_t> slot(unique_ids.size());
      for (size_t j = 0; j < unique_ids.size(); ++j) {
        const int64_t id = unique_ids[j];
        const int64_t pos = next[OwnerOf(table, id, num_workers)]++;
        if (options.pair_keys) {
          result->send_keys[2 * pos] = t;
          result->send_keys[2 * pos + 1] = id;
        } else {
          result->send_keys[pos] =
              PackKey(static_cast<int32_t>(t), LocalRowOf(table, id, num_workers));
        }
        slot[j] = static_cast<int32_t>(pos);
      }
      for (size_t l = 0; l < lookups.size(); ++l) {
        if (lookups[l].table != t) continue;
        int32_t* position = result->position.data() + lookup_offsets[l];
        for (int64_t i = 0; i < lookups[l].count; ++i) position[i] = slot[position[i]];
      }
    }
  });
  return Status::Ok();
}

template Status PartitionKeys<int32_t>(const std::vector<LookupIds<int32_t>>&,
                                       const std::vector<TablePlacement>&,
                                       const PartitionOptions&, const ParallelFor&,
                                       PartitionResult*);
template Status PartitionKeys<int64_t>(const std::vector<LookupIds<int64_t>>&,
                                       const std::vector<TablePlacement>&,
                                       const PartitionOptions&, const ParallelFor&,
                                       PartitionResult*);

Status PlaceTables(const std::vector<int64_t>& rows, const std::vector<int64_t>& owners,
                   const std::vector<std::string>& names, const std::vector<bool>& dynamic,
                   int64_t num_workers, std::vector<TablePlacement>* tables) {
  if (!dynamic.empty() && dynamic.size() != rows.size()) {
    return Status::InvalidArgument("table_dynamic needs one entry per table");
  }
  if (rows.size() != owners.size() || rows.size() != names.size()) {
    return Status::InvalidArgument(
        "table_rows, table_owner and table_names must have one entry per table");
  }
  for (size_t t = 0; t < rows.size(); ++t) {
    if (owners[t] >= num_workers) {
      return Status::InvalidArgument("table '" + names[t] + "' is placed on worker " +
                                     std::to_string(owners[t]) + " but there are " +
                                     std::to_string(num_workers));
    }
    tables->push_back(TablePlacement{rows[t], static_cast<int32_t>(owners[t]), names[t],
                                     !dynamic.empty() && dynamic[t]});
  }
  return Status::Ok();
}

namespace {

template <typename Tindex>
Status PartitionInputs(const std::vector<PartitionInput>& inputs,
                       const std::vector<TablePlacement>& tables, const PartitionOptions& options,
                       const ParallelFor& parallel_for, PartitionResult* result) {
  std::vector<LookupIds<Tindex>> lookups;
  for (const PartitionInput& input : inputs) {
    lookups.push_back(
        LookupIds<Tindex>{static_cast<const Tindex*>(input.ids), input.count, input.table});
  }
  return PartitionKeys(lookups, tables, options, parallel_for, result);
}

}  // namespace

Status PartitionKeysInto(const std::vector<PartitionInput>& inputs, bool ids64,
                         const std::vector<TablePlacement>& tables,
                         const PartitionOptions& options, const ParallelFor& parallel_for,
                         const AllocatePartition& allocate) {
  PartitionResult result;
  SOK_RETURN_IF_ERROR(
      ids64 ? PartitionInputs<int64_t>(inputs, tables, options, parallel_for, &result)
            : PartitionInputs<int32_t>(inputs, tables, options, parallel_for, &result));
  const int64_t stride = options.pair_keys ? 2 : 1;
  const int64_t unique = static_cast<int64_t>(result.send_keys.size()) / stride;
  const std::vector<int32_t> splits(result.splits.begin(), result.splits.end());
  std::vector<int32_t> table_counts;
  if (options.num_workers == 1 && !options.pair_keys) {
    table_counts.assign(tables.size(), 0);
    for (int64_t key : result.send_keys) ++table_counts[PackedTable(key)];
  }
  int64_t* send_keys = nullptr;
  int32_t* position = nullptr;
  SOK_RETURN_IF_ERROR(allocate(unique, splits, table_counts, &send_keys, &position));
  if (unique > 0) {
    std::memcpy(send_keys, result.send_keys.data(), unique * stride * sizeof(int64_t));
  }
  if (!result.position.empty()) {
    std::memcpy(position, result.position.data(), result.position.size() * sizeof(int32_t));
  }
  return Status::Ok();
}

int64_t GroupPairsByTable(const int64_t* pairs, int64_t n, int32_t num_tables, int64_t* counts,
                          int32_t* order) {
  std::fill(counts, counts + num_tables, 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t table = pairs[2 * i];
    if (table < 0 || table >= num_tables) return i;
    ++counts[table];
  }
  std::vector<int64_t> next(num_tables, 0);
  for (int32_t t = 1; t < num_tables; ++t) next[t] = next[t - 1] + counts[t - 1];
  for (int64_t i = 0; i < n; ++i) order[next[pairs[2 * i]]++] = static_cast<int32_t>(i);
  return -1;
}

void GatherPairRows(const int64_t* pairs, const int32_t* order, int64_t n, int64_t dim,
                    const float* grad, int64_t* indices, float* values) {
  for (int64_t k = 0; k < n; ++k) {
    indices[k] = pairs[2 * order[k] + 1];
    std::memcpy(values + k * dim, grad + order[k] * dim, dim * sizeof(float));
  }
}

}  // namespace sok
