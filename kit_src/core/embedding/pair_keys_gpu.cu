#include "kit_src/core/embedding/pair_keys_gpu.cuh"

#include <cub/cub.cuh>

#include <algorithm>
#include <type_traits>

#include "kit_src/core/cuda_scratch.cuh"
#include "kit_src/core/embedding/row_owner.h"

namespace sok {
namespace {

constexpr int kThreads = 256;
int Blocks(int64_t n) { return GridBlocks(n, kThreads); }

#define SOK_GRID_LOOP(i, n)                                                          \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n);         \
       i += int64_t{gridDim.x} * blockDim.x)

__global__ void PairSortKeys(const GpuPartitionLookup* lookups, int32_t num_lookups, bool ids64,
                             int64_t total, int32_t num_workers, int table_bits, uint64_t* ids,
                             uint32_t* group, int32_t* order) {
  SOK_GRID_LOOP(i, total) {
    const GpuPartitionLookup& lookup = lookups[FindLookup(lookups, num_lookups, i)];
    const int64_t j = i - lookup.first;
    const int64_t id = ids64 ? static_cast<const int64_t*>(lookup.ids)[j]
                             : static_cast<const int32_t*>(lookup.ids)[j];
    const uint32_t worker = DynamicKeyOwner(id, lookup.owner, num_workers);
    ids[i] = static_cast<uint64_t>(id);
    group[i] = (worker << table_bits) | static_cast<uint32_t>(lookup.table);
    order[i] = static_cast<int32_t>(i);
  }
}

template <typename T>
__global__ void GatherByOrder(const T* from, const int32_t* order, int64_t n, T* to) {
  SOK_GRID_LOOP(k, n) { to[k] = from[order[k]]; }
}

__global__ void MarkPairHeads(const uint32_t* group, const uint64_t* ids, int64_t n, bool dedup,
                              int table_bits, int32_t* head, int64_t* worker_counts) {
  SOK_GRID_LOOP(k, n) {
    const bool is_head =
        !dedup || k == 0 || group[k] != group[k - 1] || ids[k] != ids[k - 1];
    head[k] = is_head;
    if (is_head) {
      atomicAdd(reinterpret_cast<unsigned long long*>(&worker_counts[group[k] >> table_bits]), 1ull);
    }
  }
}

__global__ void ScatterPairs(const uint32_t* group, const int64_t* ids, const int32_t* order,
                             const int32_t* slot, int64_t n, uint32_t table_mask,
                             int64_t* send_pairs, int32_t* position) {
  SOK_GRID_LOOP(k, n) {
    const int32_t unique = slot[k] - 1;
    position[order[k]] = unique;
    if (k == 0 || slot[k] != slot[k - 1]) {
      send_pairs[2 * int64_t{unique}] = group[k] & table_mask;
      send_pairs[2 * int64_t{unique} + 1] = ids[k];
    }
  }
}

__global__ void PairTables(const int64_t* pairs, int64_t n, int32_t num_tables, int32_t* table_of,
                           int32_t* order, int64_t* counts, LookupCheck* check) {
  SOK_GRID_LOOP(i, n) {
    const int64_t t = pairs[2 * i];
    order[i] = static_cast<int32_t>(i);
    if (t < 0 || t >= num_tables) {
      atomicMin(&check->first_bad, EncodeBad(0, BadKind::kBadKey, i));
      table_of[i] = num_tables;  // sorts last, belongs to no table's block
      continue;
    }
    table_of[i] = static_cast<int32_t>(t);
    atomicAdd(reinterpret_cast<unsigned long long*>(&counts[t]), 1ull);
  }
}

__global__ void DescribeBadPair(const int64_t* pairs, LookupCheck* check) {
  if (check->first_bad != kNoError) check->value_a = pairs[2 * static_cast<int64_t>(check->first_bad & ((1ull << 40) - 1))];
}

__global__ void GatherPairRowsKernel(const int64_t* pairs, const int32_t* order, int64_t n,
                                     int64_t dim, const float* grad, int64_t* indices,
                                     float* values) {
  SOK_GRID_LOOP(e, n * dim) {
    const int64_t k = e / dim, d = e - k * dim, from = order[k];
    if (d == 0) indices[k] = pairs[2 * from + 1];
    values[e] = grad[from * dim + d];
  }
}

template <typename T>
bool Get(const DeviceAllocate& allocate, int64_t count, T** out) {
  *out = static_cast<T*>(allocate(std::max<size_t>(static_cast<size_t>(count) * sizeof(T), 1)));
  return *out != nullptr;
}

int BitsFor(int64_t values) {  // bits to hold 0..values-1
  int bits = 1;
  while (bits < 32 && (int64_t{1} << bits) < values) ++bits;
  return bits;
}

}  // namespace

cudaError_t SortPairKeys(const GpuPartitionLookup* lookups_device, int32_t num_lookups,
                         bool ids64, int64_t total, int32_t num_workers, int table_bits,
                         bool dedup, const DeviceAllocate& allocate, SortedPairKeys* out,
                         cudaStream_t stream) {
  uint64_t *ids = nullptr, *ids_by_id = nullptr, *sorted_ids = nullptr;
  uint32_t *group = nullptr, *group_by_id = nullptr;
  int32_t *order = nullptr, *order_by_id = nullptr, *head = nullptr;
  if (!(Get(allocate, total, &ids) && Get(allocate, total, &ids_by_id) &&
        Get(allocate, total, &sorted_ids) && Get(allocate, total, &group) &&
        Get(allocate, total, &group_by_id) && Get(allocate, total, &out->group) &&
        Get(allocate, total, &order) && Get(allocate, total, &order_by_id) &&
        Get(allocate, total, &out->order) && Get(allocate, total, &head) &&
        Get(allocate, total, &out->slot) && Get(allocate, num_workers, &out->worker_counts))) {
    return cudaErrorMemoryAllocation;
  }
  out->ids = reinterpret_cast<int64_t*>(sorted_ids);
  cudaMemsetAsync(out->worker_counts, 0, num_workers * sizeof(int64_t), stream);
  if (total == 0) return cudaGetLastError();
  const int items = static_cast<int>(total);
  const int group_bits = table_bits + BitsFor(num_workers);
  PairSortKeys<<<Blocks(total), kThreads, 0, stream>>>(lookups_device, num_lookups, ids64, total,
                                                       num_workers, table_bits, ids, group, order);
  size_t by_id = 0, by_group = 0, scan = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, by_id, ids, ids_by_id, order, order_by_id, items, 0,
                                  64, stream);
  cub::DeviceRadixSort::SortPairs(nullptr, by_group, group_by_id, out->group, order_by_id,
                                  out->order, items, 0, group_bits, stream);
  cub::DeviceScan::InclusiveSum(nullptr, scan, head, out->slot, items, stream);
  char* temp = nullptr;
  if (!Get(allocate, std::max({by_id, by_group, scan}), &temp)) return cudaErrorMemoryAllocation;
  // Least significant key first: radix sort is stable, so the second sort keeps id order
  // within each (worker, table).
  cub::DeviceRadixSort::SortPairs(temp, by_id, ids, ids_by_id, order, order_by_id, items, 0, 64,
                                  stream);
  GatherByOrder<<<Blocks(total), kThreads, 0, stream>>>(group, order_by_id, total, group_by_id);
  cub::DeviceRadixSort::SortPairs(temp, by_group, group_by_id, out->group, order_by_id,
                                  out->order, items, 0, group_bits, stream);
  GatherByOrder<<<Blocks(total), kThreads, 0, stream>>>(ids, out->order, total, sorted_ids);
  MarkPairHeads<<<Blocks(total), kThreads, 0, stream>>>(out->group, sorted_ids, total, dedup,
                                                        table_bits, head, out->worker_counts);
  cub::DeviceScan::InclusiveSum(temp, scan, head, out->slot, items, stream);
  return cudaGetLastError();
}

cudaError_t ScatterPairKeys(const SortedPairKeys& sorted, int64_t total, int table_bits,
                            int64_t* send_pairs, int32_t* position, cudaStream_t stream) {
  if (total == 0) return cudaSuccess;
  ScatterPairs<<<Blocks(total), kThreads, 0, stream>>>(sorted.group, sorted.ids, sorted.order,
                                                       sorted.slot, total,
                                                       (1u << table_bits) - 1, send_pairs,
                                                       position);
  return cudaGetLastError();
}

cudaError_t GroupPairsByTable(const int64_t* pairs, int64_t n, int32_t num_tables,
                              const DeviceAllocate& allocate, int64_t* counts, int32_t* order,
                              LookupCheck* check, cudaStream_t stream) {
  cudaMemsetAsync(counts, 0, num_tables * sizeof(int64_t), stream);
  if (n == 0) return cudaGetLastError();
  int32_t *table_of = nullptr, *sorted_tables = nullptr, *unsorted = nullptr;
  if (!(Get(allocate, n, &table_of) && Get(allocate, n, &sorted_tables) &&
        Get(allocate, n, &unsorted))) {
    return cudaErrorMemoryAllocation;
  }
  PairTables<<<Blocks(n), kThreads, 0, stream>>>(pairs, n, num_tables, table_of, unsorted, counts,
                                                 check);
  DescribeBadPair<<<1, 1, 0, stream>>>(pairs, check);
  if (num_tables == 1) {  // already one block
    return cudaMemcpyAsync(order, unsorted, n * sizeof(int32_t), cudaMemcpyDeviceToDevice, stream);
  }
  size_t bytes = 0;
  const int bits = BitsFor(num_tables + 1);
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, table_of, sorted_tables, unsorted, order,
                                  static_cast<int>(n), 0, bits, stream);
  char* temp = nullptr;
  if (!Get(allocate, bytes, &temp)) return cudaErrorMemoryAllocation;
  cub::DeviceRadixSort::SortPairs(temp, bytes, table_of, sorted_tables, unsorted, order,
                                  static_cast<int>(n), 0, bits, stream);
  return cudaGetLastError();
}

cudaError_t GatherPairRows(const int64_t* pairs, const int32_t* order, int64_t n, int64_t dim,
                           const float* grad, int64_t* indices, float* values,
                           cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  GatherPairRowsKernel<<<Blocks(n * dim), kThreads, 0, stream>>>(pairs, order, n, dim, grad,
                                                                 indices, values);
  return cudaGetLastError();
}

}  // namespace sok
