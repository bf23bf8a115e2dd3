#include "kit_src/core/embedding/lookup_gpu.cuh"

#include <cub/cub.cuh>

#include <algorithm>
#include <type_traits>

#include "kit_src/core/cuda_atomic.cuh"
#include "kit_src/core/cuda_scratch.cuh"
#include "kit_src/core/embedding/packed_key.h"
#include "kit_src/core/embedding/row_owner.h"

namespace sok {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ int64_t GlobalThread() {
  return blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
}
__device__ __forceinline__ int64_t GridThreads() { return int64_t{gridDim.x} * blockDim.x; }

__device__ __forceinline__ void RecordBad(LookupCheck* check, unsigned long long code) {
  atomicMin(&check->first_bad, code);
}
__device__ __forceinline__ bool CheckFailed(const LookupCheck* check) {
  return *static_cast<const volatile unsigned long long*>(&check->first_bad) != kNoError;
}

__device__ __forceinline__ int64_t ReadId(const void* ids, bool ids64, int64_t i) {
  return ids64 ? static_cast<const int64_t*>(ids)[i]
               : static_cast<int64_t>(static_cast<const int32_t*>(ids)[i]);
}

__device__ __forceinline__ int32_t FindSampleLookup(const GpuPooledLookup* lookups, int32_t count,
                                                    int64_t g) {
  int32_t lo = 0, hi = count - 1;
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    if (lookups[mid].first_sample <= g) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Rows are copied by groups of `group` lanes (a power of two up to 32), float4 where dim allows.
int RowGroup(int64_t dim, int vector) { return RowLanes((dim + vector - 1) / vector); }

template <int kVec>
struct Vec;
template <>
struct Vec<1> {
  using type = float;
  __device__ static float Zero() { return 0.0f; }
  __device__ static void Fma(float& acc, float s, float x) { acc += s * x; }
  __device__ static float Scale(float s, float x) { return s * x; }
};
template <>
struct Vec<4> {
  using type = float4;
  __device__ static float4 Zero() { return make_float4(0, 0, 0, 0); }
  __device__ static void Fma(float4& acc, float s, float4 x) {
    acc.x += s * x.x; acc.y += s * x.y; acc.z += s * x.z; acc.w += s * x.w;
  }
  __device__ static float4 Scale(float s, float4 x) {
    return make_float4(s * x.x, s * x.y, s * x.z, s * x.w);
  }
};

template <int kVec>
__device__ __forceinline__ void CopyRow(const float* from, float* to, int64_t dim, int lane,
                                        int group) {
  using V = typename Vec<kVec>::type;
  for (int64_t d = lane * kVec; d < dim; d += group * kVec) {
    *reinterpret_cast<V*>(to + d) = __ldg(reinterpret_cast<const V*>(from + d));
  }
}
template <int kVec>
__device__ __forceinline__ void ZeroRow(float* to, int64_t dim, int lane, int group) {
  using V = typename Vec<kVec>::type;
  for (int64_t d = lane * kVec; d < dim; d += group * kVec) {
    *reinterpret_cast<V*>(to + d) = Vec<kVec>::Zero();
  }
}

// ---------------------------------------------------------------- partition

__global__ void PartitionSortKeysKernel(const GpuPartitionLookup* lookups, int32_t num_lookups,
                                        bool ids64, int64_t total, int32_t num_workers,
                                        int table_bits, int row_bits, uint64_t* sort_keys,
                                        int32_t* order, LookupCheck* check) {
  for (int64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const int32_t l = FindLookup(lookups, num_lookups, i);
    const GpuPartitionLookup& lookup = lookups[l];
    const int64_t id = ReadId(lookup.ids, ids64, i - lookup.first);
    order[i] = static_cast<int32_t>(i);
    if (id < 0 || id >= lookup.rows) {
      RecordBad(check, EncodeBad(l, BadKind::kBadId, i - lookup.first));
      sort_keys[i] = ~0ull;
      continue;
    }
    const uint64_t worker = StaticRowOwner(id, lookup.owner, num_workers);
    const uint64_t row = StaticLocalRow(id, lookup.owner, num_workers);
    sort_keys[i] = (worker << (table_bits + row_bits)) |
                   (static_cast<uint64_t>(lookup.table) << row_bits) | row;
  }
}

// local_counts: [num_workers] heads per worker, then (num_tables > 0, one worker) per table.
__global__ void MarkUniqueKernel(const uint64_t* sorted, int64_t total, bool dedup,
                                 int row_bits, int worker_shift, int32_t num_workers,
                                 int32_t num_tables, int32_t* head, int64_t* worker_counts,
                                 int64_t* table_counts) {
  extern __shared__ unsigned long long local_counts[];
  const uint64_t table_mask = (uint64_t{1} << (worker_shift - row_bits)) - 1;
  for (int w = threadIdx.x; w < num_workers + num_tables; w += blockDim.x) local_counts[w] = 0;
  __syncthreads();
  for (int64_t k = GlobalThread(); k < total; k += GridThreads()) {
    const bool is_head = !dedup || k == 0 || sorted[k] != sorted[k - 1];
    head[k] = is_head;
    if (!is_head) continue;
    atomicAdd(&local_counts[sorted[k] >> worker_shift], 1ull);
    if (num_tables > 0) {
      atomicAdd(&local_counts[num_workers + ((sorted[k] >> row_bits) & table_mask)], 1ull);
    }
  }
  __syncthreads();
  for (int w = threadIdx.x; w < num_workers + num_tables; w += blockDim.x) {
    int64_t* counts = w < num_workers ? worker_counts + w : table_counts + (w - num_workers);
    if (local_counts[w]) atomicAdd(reinterpret_cast<unsigned long long*>(counts), local_counts[w]);
  }
}

__global__ void ScatterPartitionKernel(const uint64_t* sorted, const int32_t* order,
                                       const int32_t* slot, int64_t total, int row_bits,
                                       int table_bits, int64_t* send_keys, int32_t* position) {
  const uint64_t row_mask = (uint64_t{1} << row_bits) - 1;
  const uint64_t table_mask = (uint64_t{1} << table_bits) - 1;
  for (int64_t k = GlobalThread(); k < total; k += GridThreads()) {
    const int32_t unique = slot[k] - 1;
    position[order[k]] = unique;
    if (k == 0 || slot[k] != slot[k - 1]) {
      const uint64_t key = sorted[k];
      send_keys[unique] = (static_cast<int64_t>((key >> row_bits) & table_mask) << kPackedRowBits) |
                          static_cast<int64_t>(key & row_mask);
    }
  }
}

// ---------------------------------------------------------------- owner side

__device__ __forceinline__ const float* ShardRow(const GpuShard* shards, int32_t num_tables,
                                                 int64_t key, int64_t dim) {
  const int64_t t = key >> kPackedRowBits, row = key & kPackedRowMask;
  if (key < 0 || t >= num_tables || row >= shards[t].rows) return nullptr;
  return shards[t].data + row * dim;
}

template <int kVec>
__global__ void GatherShardRowsKernel(const GpuShard* shards, int32_t num_tables, int64_t dim,
                                      const int64_t* keys, int64_t n, float* out, int group,
                                      LookupCheck* check) {
  const int lane = threadIdx.x % group;
  for (int64_t i = GlobalThread() / group; i < n; i += GridThreads() / group) {
    const float* row = ShardRow(shards, num_tables, keys[i], dim);
    if (row == nullptr) {
      if (lane == 0) RecordBad(check, EncodeBad(0, BadKind::kBadKey, i));
      ZeroRow<kVec>(out + i * dim, dim, lane, group);
    } else {
      CopyRow<kVec>(row, out + i * dim, dim, lane, group);
    }
  }
}

// 16-bit rows of odd width, one value per thread.
__global__ void GatherShardRows16Kernel(const GpuShard* shards, int32_t num_tables, int64_t dim,
                                        const int64_t* keys, int64_t n, uint16_t* out,
                                        LookupCheck* check) {
  for (int64_t e = GlobalThread(); e < n * dim; e += GridThreads()) {
    const int64_t i = e / dim, key = keys[i];
    const int64_t t = key >> kPackedRowBits, row = key & kPackedRowMask;
    if (key < 0 || t >= num_tables || row >= shards[t].rows) {
      if (e % dim == 0) RecordBad(check, EncodeBad(0, BadKind::kBadKey, i));
      out[e] = 0;
    } else {
      out[e] = reinterpret_cast<const uint16_t*>(shards[t].data)[row * dim + e % dim];
    }
  }
}

template <int kVec>
__global__ void GatherSingleIdsKernel(const __grid_constant__ GpuSingleIdBatch batch, bool ids64,
                                      int64_t dim, int group, LookupCheck* check) {
  const int lane = threadIdx.x % group;
  for (int64_t i = GlobalThread() / group; i < batch.total; i += GridThreads() / group) {
    const int32_t l = FindLookup(batch.items, batch.count, i);
    const GpuSingleIdLookup& lookup = batch.items[l];
    const int64_t j = i - lookup.first;
    const int64_t id = ReadId(lookup.ids, ids64, j);
    float* out = lookup.output + j * dim;
    if (id < 0 || id >= lookup.table.rows) {
      if (lane == 0 && check != nullptr) {
        RecordBad(check, EncodeBad(batch.first_group + l, BadKind::kBadId, j));
      }
      ZeroRow<kVec>(out, dim, lane, group);
    } else {
      CopyRow<kVec>(lookup.table.data + id * dim, out, dim, lane, group);
    }
  }
}

__global__ void DescribeBadSingleIdKernel(const __grid_constant__ GpuSingleIdBatch batch,
                                          bool ids64, LookupCheck* check) {
  const unsigned long long code = check->first_bad;
  if (code == kNoError || static_cast<BadKind>((code >> 40) & 15) != BadKind::kBadId) return;
  const int64_t l = static_cast<int64_t>(code >> 44) - batch.first_group;
  if (l < 0 || l >= batch.count) return;
  check->value_a = ReadId(batch.items[l].ids, ids64, static_cast<int64_t>(code & ((1ull << 40) - 1)));
  check->value_b = batch.items[l].table.rows;
}

__global__ void GuardSingleIdsKernel(const __grid_constant__ GpuBatch<GpuIdCopy> batch,
                                     const LookupCheck* check) {
  const bool failed = check->first_bad != kNoError;
  for (int64_t i = GlobalThread(); i < batch.total; i += GridThreads()) {
    const GpuIdCopy& copy = batch.items[FindLookup(batch.items, batch.count, i)];
    const int64_t j = i - copy.first;
    copy.output[j] = failed ? -1 : copy.ids[j];
  }
}

__global__ void SparseRowSplitsKernel(const __grid_constant__ GpuBatch<GpuRowSplits> batch) {
  for (int64_t i = GlobalThread(); i < batch.total; i += GridThreads()) {
    const GpuRowSplits& item = batch.items[FindLookup(batch.items, batch.count, i)];
    const int64_t r = i - item.first;
    int64_t low = 0, high = item.nnz;  // the first entry whose row is >= r
    while (low < high) {
      const int64_t mid = low + (high - low) / 2;
      if (item.indices[2 * mid] < r) {
        low = mid + 1;
      } else {
        high = mid;
      }
    }
    item.row_splits[r] = low;
  }
}

__global__ void DescribeBadIdKernel(const GpuPartitionLookup* lookups, bool ids64,
                                    LookupCheck* check) {
  const unsigned long long code = check->first_bad;
  if (code == kNoError || static_cast<BadKind>((code >> 40) & 15) != BadKind::kBadId) return;
  const int64_t l = static_cast<int64_t>(code >> 44);
  const int64_t j = static_cast<int64_t>(code & ((1ull << 40) - 1));
  check->value_a = ReadId(lookups[l].ids, ids64, j);
  check->value_b = lookups[l].rows;
}

__global__ void CountKeysKernel(const int64_t* keys, int64_t n, int32_t num_tables,
                                int64_t* counts, int32_t* grouped, LookupCheck* check) {
  extern __shared__ unsigned long long table_counts[];
  for (int t = threadIdx.x; t < num_tables; t += blockDim.x) table_counts[t] = 0;
  __syncthreads();
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const int64_t key = keys[i], t = key >> kPackedRowBits;
    if (key < 0 || t >= num_tables) {
      RecordBad(check, EncodeBad(0, BadKind::kBadKey, i));
      continue;
    }
    atomicAdd(&table_counts[t], 1ull);
    if (i > 0 && (keys[i - 1] >> kPackedRowBits) > t) *grouped = 0;
  }
  __syncthreads();
  for (int t = threadIdx.x; t < num_tables; t += blockDim.x) {
    if (table_counts[t]) atomicAdd(reinterpret_cast<unsigned long long*>(&counts[t]), table_counts[t]);
  }
}

__global__ void TableSortKeysKernel(const int64_t* keys, int64_t n, int32_t* table_of,
                                    int32_t* order) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    table_of[i] = static_cast<int32_t>(keys[i] >> kPackedRowBits);
    order[i] = static_cast<int32_t>(i);
  }
}

template <int kVec>
__global__ void GatherGradientRowsKernel(const int64_t* keys, const int32_t* order, int64_t n,
                                         int64_t dim, const float* grad, int64_t* indices,
                                         float* values, int group) {
  const int lane = threadIdx.x % group;
  for (int64_t k = GlobalThread() / group; k < n; k += GridThreads() / group) {
    const int64_t from = order ? order[k] : k;
    if (lane == 0) indices[k] = keys[from] & kPackedRowMask;
    if (values != nullptr) CopyRow<kVec>(grad + from * dim, values + k * dim, dim, lane, group);
  }
}

// ---------------------------------------------------------------- combine

__global__ void CheckLookupHeaders(const GpuPooledLookup* lookups, int32_t num_lookups,
                                   int64_t positions, int64_t* use_first, LookupCheck* check) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  int64_t offset = 0;
  use_first[0] = 0;
  for (int32_t l = 0; l < num_lookups; ++l) {
    const GpuPooledLookup& lookup = lookups[l];
    const int64_t nnz = lookup.row_splits[lookup.batch];
    if (nnz < 0 || offset + nnz > positions) {
      RecordBad(check, EncodeBad(l, BadKind::kPositionsLeft, 0));
    } else if (lookup.row_splits[0] != 0) {
      RecordBad(check, EncodeBad(l, BadKind::kRowSplitsEnds, 0));
    } else if (lookup.weights != nullptr && lookup.weights_count != nnz) {
      RecordBad(check, EncodeBad(l, BadKind::kWeightsCount, 0));
    }
    offset += nnz > 0 ? nnz : 0;
    use_first[l + 1] = offset;
  }
  if (offset != positions) RecordBad(check, EncodeBad(num_lookups, BadKind::kPositionsLeft, 0));
}

// Records the first sample whose row splits decrease (lookup = first_group + its index).
__device__ __forceinline__ void CheckRowSplitsOf(const GpuPooledLookup* lookups,
                                                 int32_t num_lookups, int64_t samples,
                                                 int32_t first_group, LookupCheck* check) {
  for (int64_t g = GlobalThread(); g < samples; g += GridThreads()) {
    const int32_t l = FindSampleLookup(lookups, num_lookups, g);
    const int64_t s = g - lookups[l].first_sample;
    const int64_t* splits = lookups[l].row_splits;
    if (splits != nullptr && splits[s + 1] < splits[s]) {
      RecordBad(check, EncodeBad(first_group + l, BadKind::kRowSplitsDecrease, s));
    }
  }
}

__global__ void CheckRowSplitsKernel(const GpuPooledLookup* lookups, int32_t num_lookups,
                                     int64_t samples, LookupCheck* check) {
  CheckRowSplitsOf(lookups, num_lookups, samples, 0, check);
}

__device__ __forceinline__ float Denominator(const GpuPooledLookup& lookup, int64_t begin,
                                             int64_t end) {
  if (lookup.combiner == 0) return 1.0f;
  if (lookup.weights == nullptr) {
    const float n = static_cast<float>(end - begin);
    return lookup.combiner == 1 ? n : sqrtf(n);
  }
  float total = 0.0f;
  for (int64_t i = begin; i < end; ++i) {
    const float w = lookup.weights[i];
    total += lookup.combiner == 1 ? w : w * w;
  }
  return lookup.combiner == 1 ? total : sqrtf(total);
}

// Id i's share of its sample's pooled row: its weight (1 without weights) over the sample's
// denominator, or 0 where that is 0 (the forward pools such a sample to zeros).
__device__ __forceinline__ float IdScale(const GpuPooledLookup& lookup, int64_t i,
                                         float denominator) {
  return denominator == 0.0f ? 0.0f : (lookup.weights ? lookup.weights[i] : 1.0f) / denominator;
}

// A sample of a lookup pooled from its table: its lookup l, its index s there, its ids
// [begin, end) clamped to the lookup's ids (row splits found bad, or checked on the host
// alone, must not make a kernel read or write outside its buffers) and their denominator.
struct PooledSample {
  int32_t l;
  int64_t s, begin, end;
  float denominator;
};

__device__ __forceinline__ PooledSample LocateSample(const GpuPooledLookup* lookups,
                                                     int32_t num_lookups, int64_t g) {
  PooledSample sample;
  sample.l = FindSampleLookup(lookups, num_lookups, g);
  const GpuPooledLookup& lookup = lookups[sample.l];
  sample.s = g - lookup.first_sample;
  if (lookup.row_splits == nullptr) {  // one id a sample
    sample.begin = sample.s;
    sample.end = sample.s + 1;
  } else {
    sample.begin = max(lookup.row_splits[sample.s], int64_t{0});
    sample.end = max(min(lookup.row_splits[sample.s + 1], lookup.ids_count), sample.begin);
  }
  sample.denominator = Denominator(lookup, sample.begin, sample.end);
  return sample;
}

// The row position p names, or null (recorded) when p or its packed key names no row.
__device__ __forceinline__ const float* SourceRow(const GpuRowSource& source, int64_t num_rows,
                                                  int32_t p, int64_t dim, int32_t l, int64_t use,
                                                  LookupCheck* check) {
  if (p < 0 || p >= num_rows) {
    RecordBad(check, EncodeBad(l, BadKind::kBadPosition, use));
    return nullptr;
  }
  if (source.keys == nullptr) return source.rows + int64_t{p} * dim;
  const float* row = ShardRow(source.shards, source.num_tables, source.keys[p], dim);
  if (row == nullptr) RecordBad(check, EncodeBad(0, BadKind::kBadKey, p));
  return row;
}

// The row of id i of a lookup pooled straight from its table, or null (recorded, where there
// is a record) when the id is outside the table.
__device__ __forceinline__ const float* TableRow(const GpuPooledLookup& lookup, int64_t i,
                                                 int64_t dim, int32_t l, LookupCheck* check) {
  const int64_t id = lookup.ids[i];
  if (id < 0 || id >= lookup.table.rows) {
    if (check != nullptr) RecordBad(check, EncodeBad(l, BadKind::kBadId, i));
    return nullptr;
  }
  return lookup.table.data + id * dim;
}

__device__ __forceinline__ int64_t Stride(const GpuPooledLookup& lookup, int64_t dim) {
  return lookup.stride > 0 ? lookup.stride : dim;
}

template <int kVec>
__global__ void PoolKernel(const GpuPooledLookup* lookups, int32_t num_lookups, int64_t samples,
                           const int64_t* use_first, const int32_t* position,
                           GpuRowSource source, int64_t num_rows, int64_t dim, int group,
                           LookupCheck* check) {
  if (CheckFailed(check)) return;
  using V = typename Vec<kVec>::type;
  const int lane = threadIdx.x % group;
  for (int64_t g = GlobalThread() / group; g < samples; g += GridThreads() / group) {
    const int32_t l = FindSampleLookup(lookups, num_lookups, g);
    const GpuPooledLookup& lookup = lookups[l];
    const int64_t s = g - lookup.first_sample;
    const int64_t begin = lookup.row_splits[s], end = lookup.row_splits[s + 1];
    const int32_t* pos = position + use_first[l];
    const float denominator = Denominator(lookup, begin, end);
    float* out = lookup.output + s * Stride(lookup, dim);
    for (int64_t d = lane * kVec; d < dim; d += group * kVec) {
      V acc = Vec<kVec>::Zero();
      if (denominator != 0.0f) {
        for (int64_t i = begin; i < end; ++i) {
          const float* row = SourceRow(source, num_rows, pos[i], dim, l, i, check);
          if (row == nullptr) continue;
          const float scale = (lookup.weights ? lookup.weights[i] : 1.0f) / denominator;
          Vec<kVec>::Fma(acc, scale, __ldg(reinterpret_cast<const V*>(row + d)));
        }
      }
      *reinterpret_cast<V*>(out + d) = acc;
    }
  }
}

// Pooling straight from the tables. The batch's descriptors are staged in shared memory from
// the parameters (the per-sample search over them is otherwise a chain of dependent loads),
// and each lane holds kChunks vectors of a row and reads kIdsAhead ids' rows before adding
// them, so that several loads are in flight where a sample holds one id or few.
constexpr int kChunks = 4;
constexpr int kIdsAhead = 4;

// Lanes a sample for pooling from the tables: each lane takes up to kChunks vectors of a row.
int TableRowGroup(int64_t dim, int vector) {
  const int64_t width = (dim + vector - 1) / vector;
  return RowLanes((width + kChunks - 1) / kChunks);
}

// The block's copy of a batch's lookups (all threads must call it).
__device__ __forceinline__ const GpuPooledLookup* StageLookups(const GpuPooledBatch& batch,
                                                               GpuPooledLookup* shared) {
  for (int32_t l = threadIdx.x; l < batch.count; l += blockDim.x) shared[l] = batch.items[l];
  __syncthreads();
  return shared;
}

template <int kVec>
__global__ void __launch_bounds__(kThreads, 3)
    PoolFromTablesKernel(const __grid_constant__ GpuPooledBatch batch, int64_t dim, int group,
                         LookupCheck* check) {
  __shared__ GpuPooledLookup shared[kPooledBatch];
  const GpuPooledLookup* lookups = StageLookups(batch, shared);
  // After the staging's barrier: other blocks of this launch may record a bad id meanwhile,
  // so threads of one block can read different verdicts, and none may leave before it.
  if (check != nullptr && CheckFailed(check)) return;
  using V = typename Vec<kVec>::type;
  const int lane = threadIdx.x % group;
  const int64_t span = int64_t{group} * kVec * kChunks;  // a row's floats one pass covers
  for (int64_t g = GlobalThread() / group; g < batch.total; g += GridThreads() / group) {
    const PooledSample sample = LocateSample(lookups, batch.count, g);
    const int32_t l = sample.l;
    const GpuPooledLookup& lookup = lookups[l];
    const int64_t begin = sample.begin, end = sample.end;
    const float denominator = sample.denominator;
    float* out = lookup.output + sample.s * Stride(lookup, dim);
    for (int64_t first = 0; first < dim; first += span) {
      V acc[kChunks];
#pragma unroll
      for (int c = 0; c < kChunks; ++c) acc[c] = Vec<kVec>::Zero();
      for (int64_t i0 = denominator != 0.0f ? begin : end; i0 < end; i0 += kIdsAhead) {
        const float* rows[kIdsAhead];
        float scales[kIdsAhead];
#pragma unroll
        for (int u = 0; u < kIdsAhead; ++u) {
          const int64_t i = i0 + u;
          rows[u] = i < end ? TableRow(lookup, i, dim, batch.first_group + l, check) : nullptr;
          scales[u] = rows[u] == nullptr ? 0.0f
                      : (lookup.weights ? lookup.weights[i] : 1.0f) / denominator;
        }
#pragma unroll
        for (int u = 0; u < kIdsAhead; ++u) {
          if (rows[u] == nullptr) continue;
#pragma unroll
          for (int c = 0; c < kChunks; ++c) {
            const int64_t d = first + (int64_t{c} * group + lane) * kVec;
            if (d < dim) {
              Vec<kVec>::Fma(acc[c], scales[u], __ldg(reinterpret_cast<const V*>(rows[u] + d)));
            }
          }
        }
      }
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int64_t d = first + (int64_t{c} * group + lane) * kVec;
        if (d < dim) *reinterpret_cast<V*>(out + d) = acc[c];
      }
    }
  }
}

// Each batch lookup's row_splits against its ids: start at 0, end at ids_count, and never
// decrease.
__global__ void CheckPooledBatchKernel(const __grid_constant__ GpuPooledBatch batch,
                                       LookupCheck* check) {
  const int64_t l = GlobalThread();
  if (l < batch.count) {
    const GpuPooledLookup& lookup = batch.items[l];
    if (lookup.row_splits != nullptr &&
        (lookup.row_splits[0] != 0 || lookup.row_splits[lookup.batch] != lookup.ids_count)) {
      RecordBad(check, EncodeBad(batch.first_group + l, BadKind::kRowSplitsEnds, 0));
    }
  }
  CheckRowSplitsOf(batch.items, batch.count, batch.total, batch.first_group, check);
}

__global__ void DescribeTableLookupError(const __grid_constant__ GpuPooledBatch batch,
                                         LookupCheck* check) {
  if (check->first_bad == kNoError) return;
  const int64_t l = BadGroup(check->first_bad) - batch.first_group;
  if (l < 0 || l >= batch.count) return;
  const GpuPooledLookup& lookup = batch.items[l];
  if (BadKindOf(check->first_bad) == BadKind::kBadId) {
    check->value_a = lookup.ids[BadItem(check->first_bad)];
    check->value_b = lookup.table.rows;
  } else {
    check->value_a = lookup.row_splits[0];
    check->value_b = lookup.row_splits[lookup.batch];
  }
}

template <int kVec>
__global__ void __launch_bounds__(kThreads, 4)
    SpreadPooledGradKernel(const __grid_constant__ GpuPooledBatch batch, int64_t dim, int group) {
  __shared__ GpuPooledLookup shared[kPooledBatch];
  const GpuPooledLookup* lookups = StageLookups(batch, shared);
  const int32_t num_lookups = batch.count;
  const int64_t samples = batch.total;
  using V = typename Vec<kVec>::type;
  const int lane = threadIdx.x % group;
  const int64_t span = int64_t{group} * kVec * kChunks;
  for (int64_t g = GlobalThread() / group; g < samples; g += GridThreads() / group) {
    const PooledSample sample = LocateSample(lookups, num_lookups, g);
    const GpuPooledLookup& lookup = lookups[sample.l];
    const float* grad = lookup.output_grad + sample.s * Stride(lookup, dim);
    for (int64_t first = 0; first < dim; first += span) {
      V chunk[kChunks];
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int64_t d = first + (int64_t{c} * group + lane) * kVec;
        chunk[c] = d < dim ? __ldg(reinterpret_cast<const V*>(grad + d)) : Vec<kVec>::Zero();
      }
      for (int64_t i = sample.begin; i < sample.end; ++i) {
        const float scale = IdScale(lookup, i, sample.denominator);
        float* out = lookup.id_grads + i * dim;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          const int64_t d = first + (int64_t{c} * group + lane) * kVec;
          if (d < dim) *reinterpret_cast<V*>(out + d) = Vec<kVec>::Scale(scale, chunk[c]);
        }
      }
    }
  }
}

// One thread a sample: its ids' gradient rows and scales.
__global__ void PooledGradSharesKernel(const __grid_constant__ GpuPooledBatch batch) {
  for (int64_t g = GlobalThread(); g < batch.total; g += GridThreads()) {
    const PooledSample sample = LocateSample(batch.items, batch.count, g);
    const GpuPooledLookup& lookup = batch.items[sample.l];
    const int64_t row = lookup.share_row_first + sample.s * lookup.share_row_step;
    for (int64_t i = sample.begin; i < sample.end; ++i) {
      lookup.use_rows[i] = row;
      lookup.use_scales[i] = IdScale(lookup, i, sample.denominator);
    }
  }
}

__device__ __forceinline__ void AtomicAddVec(float* to, float x) { atomicAdd(to, x); }
__device__ __forceinline__ void AtomicAddVec(float* to, float4 x) {
  AtomicAddFloat4(reinterpret_cast<float4*>(to), x);
}

// Each use's share of the backward: the output-gradient row of its sample and its scale
// (weight / denominator; 0 where the denominator is 0: the forward pooled such a sample to 0).
__global__ void UseSharesKernel(const GpuPooledLookup* lookups, int32_t num_lookups,
                                int64_t samples, const int64_t* use_first, int64_t dim,
                                const float** use_row, float* use_scale, int32_t* order,
                                int64_t positions, const LookupCheck* check) {
  for (int64_t k = GlobalThread(); k < positions; k += GridThreads()) {
    order[k] = static_cast<int32_t>(k);
  }
  if (CheckFailed(check)) return;
  for (int64_t g = GlobalThread(); g < samples; g += GridThreads()) {
    const int32_t l = FindSampleLookup(lookups, num_lookups, g);
    const GpuPooledLookup& lookup = lookups[l];
    const int64_t s = g - lookup.first_sample;
    const int64_t begin = lookup.row_splits[s], end = lookup.row_splits[s + 1];
    const float denominator = Denominator(lookup, begin, end);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t use = use_first[l] + i;
      use_row[use] = lookup.output_grad + s * Stride(lookup, dim);
      use_scale[use] = IdScale(lookup, i, denominator);
    }
  }
}

// Sorted uses are summed in chunks of kUsesPerChunk by groups of lanes across the row. A row's
// sum is stored where all its uses lie in the chunk, else added atomically (rows_grad starts
// at zero).
constexpr int kUsesPerChunk = 32;
constexpr int kGroupsPerBlock = 64;  // 64 x 32 staged uses x 12 bytes: 24 KiB

template <int kVec>
__global__ void SumSortedUsesKernel(const uint32_t* sorted_position, const int32_t* order,
                                    const float* const* use_row, const float* use_scale,
                                    int64_t positions, int64_t num_rows, int64_t dim,
                                    float* rows_grad, int group, LookupCheck* check) {
  if (CheckFailed(check)) return;
  using V = typename Vec<kVec>::type;
  extern __shared__ char staged_bytes[];  // per group: the chunk's rows and scales
  const int lane = threadIdx.x % group;
  const int slot = threadIdx.x / group;
  const float** rows = reinterpret_cast<const float**>(staged_bytes) + slot * kUsesPerChunk;
  float* scales = reinterpret_cast<float*>(
                      reinterpret_cast<const float**>(staged_bytes) +
                      (blockDim.x / group) * kUsesPerChunk) +
                  slot * kUsesPerChunk;
  const int64_t chunks = (positions + kUsesPerChunk - 1) / kUsesPerChunk;
  // Every group of a block runs the same number of iterations (the __syncwarp below).
  const int64_t groups = GridThreads() / group;
  for (int64_t c0 = blockIdx.x * int64_t{blockDim.x / group}; c0 < chunks; c0 += groups) {
    const int64_t c = c0 + slot;
    const int64_t first = c * kUsesPerChunk;
    const int64_t last = c < chunks ? min(positions, first + kUsesPerChunk) : first;
    for (int64_t k = first + lane; k < last; k += group) {
      const int32_t use = order[k];
      rows[k - first] = use_row[use];
      scales[k - first] = use_scale[use];
    }
    __syncwarp();
    for (int64_t d = lane * kVec; d < dim && first < last; d += group * kVec) {
      V acc = Vec<kVec>::Zero();
      bool began_here = first == 0 || sorted_position[first - 1] != sorted_position[first];
      for (int64_t k = first; k < last; ++k) {
        Vec<kVec>::Fma(acc, scales[k - first],
                       __ldg(reinterpret_cast<const V*>(rows[k - first] + d)));
        const uint32_t p = sorted_position[k];
        const bool ends_here = k + 1 == positions || sorted_position[k + 1] != p;
        if (k + 1 < last && !ends_here) continue;
        if (p >= num_rows) {
          if (d == lane * kVec) RecordBad(check, EncodeBad(0, BadKind::kBadPosition, order[k]));
        } else if (began_here && ends_here) {
          *reinterpret_cast<V*>(rows_grad + int64_t{p} * dim + d) = acc;
        } else {
          AtomicAddVec(rows_grad + int64_t{p} * dim + d, acc);
        }
        acc = Vec<kVec>::Zero();
        began_here = true;
      }
    }
    __syncwarp();
  }
}

__global__ void DescribePooledErrorKernel(const GpuPooledLookup* lookups, const int64_t* use_first,
                                          const int32_t* position, int64_t positions,
                                          GpuRowSource source, LookupCheck* check) {
  const unsigned long long code = check->first_bad;
  if (code == kNoError) return;
  const int64_t l = static_cast<int64_t>(code >> 44);
  const int64_t item = static_cast<int64_t>(code & ((1ull << 40) - 1));
  switch (static_cast<BadKind>((code >> 40) & 15)) {
    case BadKind::kPositionsLeft:
      if (lookups == nullptr) break;
      check->value_a = use_first[l];  // for the total mismatch (l = num_lookups)
      check->value_b = positions;
      break;
    case BadKind::kRowSplitsEnds:
      check->value_a = lookups[l].row_splits[0];
      check->value_b = lookups[l].row_splits[lookups[l].batch];
      break;
    case BadKind::kWeightsCount:
      check->value_a = lookups[l].row_splits[lookups[l].batch];
      break;
    case BadKind::kBadPosition:
      check->value_a = position[use_first[l] + item];
      break;
    case BadKind::kBadKey:
      check->value_a = source.keys ? source.keys[item] : 0;
      break;
    default:
      break;
  }
}

// The per-lookup figures the positions-left message needs: nnz and positions left.
__global__ void DescribePositionsLeft(const GpuPooledLookup* lookups, int32_t num_lookups,
                                      const int64_t* use_first, int64_t positions,
                                      LookupCheck* check) {
  const unsigned long long code = check->first_bad;
  if (code == kNoError || static_cast<BadKind>((code >> 40) & 15) != BadKind::kPositionsLeft) {
    return;
  }
  const int64_t l = static_cast<int64_t>(code >> 44);
  if (l >= num_lookups) return;  // the total mismatch, described above
  check->value_a = lookups[l].row_splits[lookups[l].batch];
  check->value_b = positions - use_first[l];
}

// Kernel-side resets, so no host buffer has to outlive the call.
__global__ void ResetCheckKernel(LookupCheck* check, int32_t* flag) {
  if (check) *check = LookupCheck{kNoError, 0, 0};
  if (flag) *flag = 1;
}

template <typename Launch>
cudaError_t LaunchByVector(int64_t dim, Launch launch) {
  if (dim % 4 == 0) {
    launch(std::integral_constant<int, 4>());
  } else {
    launch(std::integral_constant<int, 1>());
  }
  return cudaGetLastError();
}

int GridFor(int64_t items, int group) {
  return GridBlocks(items * group, kThreads);
}

// Runs launch(vector, grid, group): `items` rows of dim floats, a group of threads a row (as
// group_of sizes it for the widest vector dim allows); nothing for no items.
template <typename GroupOf, typename Launch>
cudaError_t LaunchRowGroups(int64_t items, int64_t dim, GroupOf group_of, Launch launch) {
  if (items == 0) return cudaSuccess;
  return LaunchByVector(dim, [&](auto vec) {
    const int group = group_of(dim, vec.value);
    launch(vec, GridFor(items, group), group);
  });
}

}  // namespace

cudaError_t ResetLookupCheck(LookupCheck* check, cudaStream_t stream) {
  ResetCheckKernel<<<1, 1, 0, stream>>>(check, nullptr);
  return cudaGetLastError();
}

cudaError_t BuildPartitionSortKeys(const GpuPartitionLookup* lookups_device, int32_t num_lookups,
                                   bool ids64, int64_t total, int32_t num_workers,
                                   int table_bits, int row_bits, uint64_t* sort_keys,
                                   int32_t* order, LookupCheck* check, cudaStream_t stream) {
  if (total == 0) return cudaSuccess;
  PartitionSortKeysKernel<<<GridBlocks(total, kThreads), kThreads, 0, stream>>>(
      lookups_device, num_lookups, ids64, total, num_workers, table_bits, row_bits, sort_keys,
      order, check);
  return cudaGetLastError();
}

cudaError_t MarkUniqueKeys(const uint64_t* sorted, int64_t total, bool dedup, int row_bits,
                           int table_bits, int32_t num_workers, int32_t num_tables,
                           int32_t* head, int64_t* worker_counts, int64_t* table_counts,
                           cudaStream_t stream) {
  if (table_counts == nullptr || num_workers != 1) num_tables = 0;
  cudaError_t status = cudaMemsetAsync(worker_counts, 0, num_workers * sizeof(int64_t), stream);
  if (status == cudaSuccess && num_tables > 0) {
    status = cudaMemsetAsync(table_counts, 0, num_tables * sizeof(int64_t), stream);
  }
  if (status != cudaSuccess || total == 0) return status;
  MarkUniqueKernel<<<GridBlocks(total, kThreads), kThreads,
                     (num_workers + num_tables) * sizeof(unsigned long long), stream>>>(
      sorted, total, dedup, row_bits, row_bits + table_bits, num_workers, num_tables, head,
      worker_counts, table_counts);
  return cudaGetLastError();
}

cudaError_t ScatterPartition(const uint64_t* sorted, const int32_t* order, const int32_t* slot,
                             int64_t total, int row_bits, int table_bits, int64_t* send_keys,
                             int32_t* position, cudaStream_t stream) {
  if (total == 0) return cudaSuccess;
  ScatterPartitionKernel<<<GridBlocks(total, kThreads), kThreads, 0, stream>>>(
      sorted, order, slot, total, row_bits, table_bits, send_keys, position);
  return cudaGetLastError();
}

cudaError_t GatherShardRowsGpu(const GpuShard* shards_device, int32_t num_tables, int64_t dim,
                               const int64_t* keys, int64_t n, float* out, LookupCheck* check,
                               cudaStream_t stream) {
  return LaunchRowGroups(n, dim, RowGroup, [&](auto vec, int grid, int group) {
    GatherShardRowsKernel<vec.value><<<grid, kThreads, 0, stream>>>(
        shards_device, num_tables, dim, keys, n, out, group, check);
  });
}

cudaError_t GatherShardRows16Gpu(const GpuShard* shards_device, int32_t num_tables, int64_t dim,
                                 const int64_t* keys, int64_t n, uint16_t* out,
                                 LookupCheck* check, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (dim % 2 == 0) {  // GpuShard::data + row * (dim / 2) floats is the 16-bit row's address
    return GatherShardRowsGpu(shards_device, num_tables, dim / 2, keys, n,
                              reinterpret_cast<float*>(out), check, stream);
  }
  GatherShardRows16Kernel<<<GridBlocks(n * dim, kThreads), kThreads, 0, stream>>>(
      shards_device, num_tables, dim, keys, n, out, check);
  return cudaGetLastError();
}

cudaError_t GatherSingleIdsGpu(const GpuSingleIdBatch& batch, bool ids64, int64_t dim,
                               LookupCheck* check, cudaStream_t stream) {
  return LaunchRowGroups(batch.total, dim, RowGroup, [&](auto vec, int grid, int group) {
    GatherSingleIdsKernel<vec.value><<<grid, kThreads, 0, stream>>>(
        batch, ids64, dim, group, check);
  });
}

cudaError_t DescribeBadSingleId(const GpuSingleIdBatch& batch, bool ids64, LookupCheck* check,
                                cudaStream_t stream) {
  DescribeBadSingleIdKernel<<<1, 1, 0, stream>>>(batch, ids64, check);
  return cudaGetLastError();
}

cudaError_t GuardSingleIds(const GpuBatch<GpuIdCopy>& batch, const LookupCheck* check,
                           cudaStream_t stream) {
  if (batch.total == 0) return cudaSuccess;
  GuardSingleIdsKernel<<<GridBlocks(batch.total, kThreads), kThreads, 0, stream>>>(batch, check);
  return cudaGetLastError();
}

cudaError_t SparseRowSplitsGpu(const GpuBatch<GpuRowSplits>& batch, cudaStream_t stream) {
  if (batch.total == 0) return cudaSuccess;
  SparseRowSplitsKernel<<<GridBlocks(batch.total, kThreads), kThreads, 0, stream>>>(batch);
  return cudaGetLastError();
}

cudaError_t DescribeBadId(const GpuPartitionLookup* partition_lookups, bool ids64,
                          LookupCheck* check, cudaStream_t stream) {
  DescribeBadIdKernel<<<1, 1, 0, stream>>>(partition_lookups, ids64, check);
  return cudaGetLastError();
}

cudaError_t SortPartitionKeys(const GpuPartitionLookup* lookups_device, int32_t num_lookups,
                              bool ids64, int64_t total, int32_t num_workers, int table_bits,
                              int row_bits, int key_bits, bool dedup, int32_t num_tables,
                              const DeviceAllocate& allocate, LookupCheck* check,
                              SortedPartitionKeys* out, cudaStream_t stream) {
  auto get = [&](auto** array, int64_t count) {
    *array = static_cast<std::remove_reference_t<decltype(**array)>*>(
        allocate(std::max<size_t>(count * sizeof(**array), 1)));
    return *array != nullptr;
  };
  uint64_t* keys = nullptr;
  int32_t *order = nullptr, *head = nullptr;
  if (!(get(&keys, total) && get(&out->sorted, total) && get(&order, total) &&
        get(&out->order, total) && get(&head, total) && get(&out->slot, total) &&
        get(&out->worker_counts, num_workers + num_tables))) {
    return cudaErrorMemoryAllocation;
  }
  out->table_counts = num_tables > 0 ? out->worker_counts + num_workers : nullptr;
  key_bits = std::max(key_bits, 1);
  cudaError_t status = BuildPartitionSortKeys(lookups_device, num_lookups, ids64, total,
                                              num_workers, table_bits, row_bits, keys, order,
                                              check, stream);
  if (status != cudaSuccess) return status;
  const int items = static_cast<int>(total);
  if (total > 0) {
    size_t sort_bytes = 0, scan_bytes = 0;
    cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys, out->sorted, order, out->order,
                                    items, 0, key_bits, stream);
    cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, head, out->slot, items, stream);
    char* temp = nullptr;
    if (!get(&temp, static_cast<int64_t>(std::max(sort_bytes, scan_bytes)))) {
      return cudaErrorMemoryAllocation;
    }
    cub::DeviceRadixSort::SortPairs(temp, sort_bytes, keys, out->sorted, order, out->order,
                                    items, 0, key_bits, stream);
    status = MarkUniqueKeys(out->sorted, total, dedup, row_bits, table_bits, num_workers,
                            num_tables, head, out->worker_counts, out->table_counts, stream);
    if (status != cudaSuccess) return status;
    cub::DeviceScan::InclusiveSum(temp, scan_bytes, head, out->slot, items, stream);
  } else {
    status = MarkUniqueKeys(out->sorted, total, dedup, row_bits, table_bits, num_workers,
                            num_tables, head, out->worker_counts, out->table_counts, stream);
    if (status != cudaSuccess) return status;
  }
  return DescribeBadId(lookups_device, ids64, check, stream);
}

cudaError_t CountKeysPerTableGpu(const int64_t* keys, int64_t n, int32_t num_tables,
                                 int64_t* counts, int32_t* grouped, LookupCheck* check,
                                 cudaStream_t stream) {
  cudaError_t status = cudaMemsetAsync(counts, 0, num_tables * sizeof(int64_t), stream);
  if (status != cudaSuccess) return status;
  ResetCheckKernel<<<1, 1, 0, stream>>>(nullptr, grouped);
  if (n == 0) return cudaGetLastError();
  CountKeysKernel<<<GridBlocks(n, kThreads), kThreads, num_tables * sizeof(unsigned long long),
                    stream>>>(keys, n, num_tables, counts, grouped, check);
  return cudaGetLastError();
}

cudaError_t TableSortKeys(const int64_t* keys, int64_t n, int32_t* table_of, int32_t* order,
                          cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  TableSortKeysKernel<<<GridBlocks(n, kThreads), kThreads, 0, stream>>>(keys, n, table_of, order);
  return cudaGetLastError();
}

cudaError_t GatherGradientRows(const int64_t* keys, const int32_t* order, int64_t n, int64_t dim,
                               const float* grad, int64_t* indices, float* values,
                               cudaStream_t stream) {
  return LaunchRowGroups(n, dim, RowGroup, [&](auto vec, int grid, int group) {
    GatherGradientRowsKernel<vec.value><<<grid, kThreads, 0, stream>>>(
        keys, order, n, dim, grad, indices, values, group);
  });
}

cudaError_t CheckPooledLookups(const GpuPooledLookup* lookups_device, int32_t num_lookups,
                               int64_t samples, const int32_t* position, int64_t positions,
                               int64_t num_rows, const GpuRowSource& source, int64_t* use_first,
                               LookupCheck* check, cudaStream_t stream) {
  CheckLookupHeaders<<<1, 1, 0, stream>>>(lookups_device, num_lookups, positions, use_first,
                                          check);
  if (samples > 0) {
    CheckRowSplitsKernel<<<GridBlocks(samples, kThreads), kThreads, 0, stream>>>(
        lookups_device, num_lookups, samples, check);
  }
  return cudaGetLastError();
}

cudaError_t CombineForwardGpu(const GpuPooledLookup* lookups_device, int32_t num_lookups,
                              int64_t samples, const int64_t* use_first, const int32_t* position,
                              const GpuRowSource& source, int64_t num_rows, int64_t dim,
                              LookupCheck* check, cudaStream_t stream) {
  return LaunchRowGroups(samples, dim, RowGroup, [&](auto vec, int grid, int group) {
    PoolKernel<vec.value><<<grid, kThreads, 0, stream>>>(
        lookups_device, num_lookups, samples, use_first, position, source, num_rows, dim, group,
        check);
  });
}

namespace {

// The lookups kPooledBatch a batch, each one's first sample counted from its batch's.
std::vector<GpuPooledBatch> PooledBatches(const std::vector<GpuPooledLookup>& lookups) {
  std::vector<GpuPooledBatch> batches((lookups.size() + kPooledBatch - 1) / kPooledBatch);
  for (size_t l = 0; l < lookups.size(); ++l) {
    GpuPooledBatch& batch = batches[l / kPooledBatch];
    batch.first_group = static_cast<int32_t>(l - l % kPooledBatch);
    GpuPooledLookup& item = batch.items[batch.count++];
    item = lookups[l];
    item.first_sample = batch.total;
    batch.total += item.batch;
  }
  return batches;
}

}  // namespace

cudaError_t PoolFromTablesGpu(const std::vector<GpuPooledLookup>& lookups, int64_t dim,
                              LookupCheck* check, cudaStream_t stream) {
  const std::vector<GpuPooledBatch> batches = PooledBatches(lookups);
  if (check != nullptr) {
    ResetCheckKernel<<<1, 1, 0, stream>>>(check, nullptr);
    for (const GpuPooledBatch& batch : batches) {
      const int64_t threads = std::max<int64_t>(batch.total, batch.count);
      CheckPooledBatchKernel<<<GridBlocks(threads, kThreads), kThreads, 0, stream>>>(batch,
                                                                                      check);
    }
  }
  for (const GpuPooledBatch& batch : batches) {
    const cudaError_t status =
        LaunchRowGroups(batch.total, dim, TableRowGroup, [&](auto vec, int grid, int group) {
          PoolFromTablesKernel<vec.value><<<grid, kThreads, 0, stream>>>(batch, dim, group,
                                                                          check);
        });
    if (status != cudaSuccess) return status;
  }
  if (check != nullptr) {
    for (const GpuPooledBatch& batch : batches) {
      DescribeTableLookupError<<<1, 1, 0, stream>>>(batch, check);
    }
  }
  return cudaGetLastError();
}

cudaError_t SpreadPooledGradGpu(const std::vector<GpuPooledLookup>& lookups, int64_t dim,
                                cudaStream_t stream) {
  for (const GpuPooledBatch& batch : PooledBatches(lookups)) {
    const cudaError_t status =
        LaunchRowGroups(batch.total, dim, TableRowGroup, [&](auto vec, int grid, int group) {
          SpreadPooledGradKernel<vec.value><<<grid, kThreads, 0, stream>>>(batch, dim, group);
        });
    if (status != cudaSuccess) return status;
  }
  return cudaSuccess;
}

cudaError_t PooledGradSharesGpu(const std::vector<GpuPooledLookup>& lookups,
                                cudaStream_t stream) {
  for (const GpuPooledBatch& batch : PooledBatches(lookups)) {
    if (batch.total == 0) continue;
    PooledGradSharesKernel<<<GridBlocks(batch.total, kThreads), kThreads, 0, stream>>>(batch);
  }
  return cudaGetLastError();
}

cudaError_t CombineBackwardGpu(const GpuPooledLookup* lookups_device, int32_t num_lookups,
                               int64_t samples, const int64_t* use_first, const int32_t* position,
                               int64_t positions, int64_t num_rows, int64_t dim,
                               const DeviceAllocate& allocate, float* rows_grad,
                               LookupCheck* check, cudaStream_t stream) {
  cudaError_t status = cudaMemsetAsync(rows_grad, 0, num_rows * dim * sizeof(float), stream);
  if (status != cudaSuccess || samples == 0 || positions == 0) return status;
  auto get = [&](auto** out, int64_t count) {
    *out = static_cast<std::remove_reference_t<decltype(**out)>*>(
        allocate(std::max<size_t>(count * sizeof(**out), 1)));
    return *out != nullptr;
  };
  const float** use_row = nullptr;
  float* use_scale = nullptr;
  int32_t *order = nullptr, *sorted_order = nullptr;
  uint32_t* sorted_position = nullptr;
  if (!(get(&use_row, positions) && get(&use_scale, positions) && get(&order, positions) &&
        get(&sorted_order, positions) && get(&sorted_position, positions))) {
    return cudaErrorMemoryAllocation;
  }
  UseSharesKernel<<<GridBlocks(std::max(samples, positions), kThreads), kThreads, 0, stream>>>(
      lookups_device, num_lookups, samples, use_first, dim, use_row, use_scale, order, positions,
      check);
  int end_bit = 1;
  while (end_bit < 32 && (int64_t{1} << end_bit) < num_rows) ++end_bit;
  const uint32_t* keys = reinterpret_cast<const uint32_t*>(position);
  size_t sort_bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys, sorted_position, order,
                                  sorted_order, static_cast<int>(positions), 0, end_bit, stream);
  char* temp = nullptr;
  if (!get(&temp, static_cast<int64_t>(sort_bytes))) return cudaErrorMemoryAllocation;
  status = cub::DeviceRadixSort::SortPairs(temp, sort_bytes, keys, sorted_position, order,
                                           sorted_order, static_cast<int>(positions), 0, end_bit,
                                           stream);
  if (status != cudaSuccess) return status;
  return LaunchByVector(dim, [&](auto vec) {
    const int group = RowGroup(dim, vec.value);
    const int64_t chunks = (positions + kUsesPerChunk - 1) / kUsesPerChunk;
    // At most kGroupsPerBlock groups a block, so the staging fits the default shared memory.
    const int threads = std::min(kThreads, group * kGroupsPerBlock);
    const size_t shared = (threads / group) * kUsesPerChunk * (sizeof(float*) + sizeof(float));
    SumSortedUsesKernel<vec.value><<<GridBlocks(chunks * group, threads), threads, shared,
                                     stream>>>(
        sorted_position, sorted_order, use_row, use_scale, positions, num_rows, dim, rows_grad,
        group, check);
  });
}

cudaError_t DescribePooledError(const GpuPooledLookup* lookups_device, int32_t num_lookups,
                                const int64_t* use_first, const int32_t* position,
                                int64_t positions, const GpuRowSource& source,
                                LookupCheck* check, cudaStream_t stream) {
  DescribePooledErrorKernel<<<1, 1, 0, stream>>>(lookups_device, use_first, position, positions,
                                                  source, check);
  DescribePositionsLeft<<<1, 1, 0, stream>>>(lookups_device, num_lookups, use_first, positions,
                                             check);
  return cudaGetLastError();
}

}  // namespace sok
