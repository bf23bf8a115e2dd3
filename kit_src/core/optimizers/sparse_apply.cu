#include "kit_src/core/optimizers/sparse_apply.cuh"

#include <cub/cub.cuh>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "kit_src/core/cuda_scratch.cuh"
#include "kit_src/core/embedding/lookup_gpu.cuh"
#include "kit_src/core/optimizers/sorted_tile_sgd.cuh"
#include "kit_src/core/optimizers/rule_by_name.h"
#include "kit_src/core/optimizers/update_rules.h"

namespace sok {
namespace {

constexpr int kMaxSections = 3;  // state floats per element: RMSprop centered keeps three
constexpr int64_t kApplyBlocks = 2048;  // ApplyRuns' grid: 16 blocks on each of 128 SMs

// A null check: the caller checked the ids; the writers still skip a row outside the table.
__device__ __forceinline__ bool Failed(const LookupCheck* check) {
  return check != nullptr && *static_cast<const volatile unsigned long long*>(&check->first_bad) != kNoError;
}

// The member use g belongs to.
__device__ __forceinline__ int MemberOf(const SparseApplyMember* members, int count, int64_t g) {
  return FindByStart(members, count, g,
                     [](const SparseApplyMember& member) { return member.first_use; });
}

// Each use's sort key, (member << row_bits) | row, and its position (null keys: the check
// only). An id outside its table is recorded in `check` and keyed past the last member (it
// sorts last; nothing applies it).
__global__ void GroupKeys(const SparseApplyMember* members, int count, int64_t total,
                          int row_bits, int64_t* keys, int32_t* positions, LookupCheck* check) {
  for (int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; g < total;
       g += int64_t{gridDim.x} * blockDim.x) {
    const int m = MemberOf(members, count, g);
    const int64_t i = g - members[m].first_use, id = members[m].gradient.ids[i];
    const bool inside = id >= 0 && id < members[m].table.rows;
    if (!inside && check != nullptr) atomicMin(&check->first_bad, EncodeBad(m, BadKind::kBadId, i));
    if (keys == nullptr) continue;
    keys[g] = inside ? (int64_t{m} << row_bits) | id : int64_t{count} << row_bits;
    positions[g] = static_cast<int32_t>(g);
  }
}

__global__ void DescribeBadId(const SparseApplyMember* members, LookupCheck* check) {
  if (check->first_bad != kNoError) {
    check->value_a = members[BadGroup(check->first_bad)].gradient.ids[BadItem(check->first_bad)];
  }
}

// run_of[k]: the run (distinct id, in sorted order) sorted use k belongs to, from head flags.
__global__ void HeadFlags(const int64_t* sorted_ids, int64_t n, int32_t* head) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n;
       k += int64_t{gridDim.x} * blockDim.x) {
    head[k] = k > 0 && sorted_ids[k] != sorted_ids[k - 1];
  }
}

// Each run's id and first use, the end of the last run, and the number of runs, from the
// scanned head flags.
__global__ void RunIds(const int64_t* sorted_ids, const int32_t* run_of, int64_t n,
                       int64_t* run_id, int32_t* run_start, int32_t* num_runs) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n;
       k += int64_t{gridDim.x} * blockDim.x) {
    if (k == 0 || run_of[k] != run_of[k - 1]) {
      run_id[run_of[k]] = sorted_ids[k];
      run_start[run_of[k]] = static_cast<int32_t>(k);
    }
    if (k == n - 1) {
      *num_runs = run_of[k] + 1;
      run_start[run_of[k] + 1] = static_cast<int32_t>(n);
    }
  }
}

// Float4 rows: runs of at most kShortRunUses uses (most of them where ids do not repeat much)
// are summed by one warp each in registers (SumApplyRuns); longer runs (a hot id's thousands
// of uses) are summed by many blocks first (SumRuns), their sums read by the same warp
// kernel. Other rows: every run summed by SumRuns, then applied by ApplyRuns.
constexpr int kShortRunUses = 64;
constexpr int kFloat4sPerLane = 4;  // a warp holds rows of up to 512 floats as float4s

// Whether run `run` goes the short way (short_limit 0: no run does).
__device__ __forceinline__ bool ShortRun(const int32_t* run_start, int64_t run, int short_limit) {
  return run_start[run + 1] - run_start[run] <= short_limit;
}

// CUB's temporary storage for the sort and the scan of n uses, asked of CUB once for each
// power of two of n (it grows with n; asking costs host time on every call otherwise).
size_t SortAndScanTempBytes(int64_t n, int end_bit, cudaStream_t stream) {
  int bucket = 0;
  while ((int64_t{1} << bucket) < n) ++bucket;
  int device = 0;
  cudaGetDevice(&device);
  const uint64_t key = (uint64_t(device) << 16) | (uint64_t(end_bit) << 8) | uint64_t(bucket);
  static std::mutex mu;
  static std::unordered_map<uint64_t, size_t> known;
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto found = known.find(key);
    if (found != known.end()) return found->second;
  }
  const int items = static_cast<int>(std::min<int64_t>(int64_t{1} << bucket, INT32_MAX));
  size_t sort_bytes = 0, scan_bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const int64_t*>(nullptr),
                                  static_cast<int64_t*>(nullptr),
                                  static_cast<const int32_t*>(nullptr),
                                  static_cast<int32_t*>(nullptr), items, 0, end_bit, stream);
  cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, static_cast<const int32_t*>(nullptr),
                                static_cast<int32_t*>(nullptr), items, stream);
  const size_t bytes = std::max(sort_bytes, scan_bytes);
  std::lock_guard<std::mutex> lock(mu);
  known[key] = bytes;
  return bytes;
}

// Sums the gradients of equal ids: a block takes kUsesPerChunk consecutive sorted uses, one
// thread per element, and adds each run's partial sum once (an atomic only where a run
// crosses a chunk: a hot id's thousands of uses are summed by many blocks in parallel).
constexpr int64_t kUsesPerChunk = 32;
constexpr int kUsesInFlight = 8;  // gradient loads a thread issues before it sums them


// Zeroes the summed rows of the long runs the device counted (SumRuns adds into them): a warp
// a run, short runs skipped at the cost of reading their bounds.
__global__ void ZeroRuns(const int32_t* num_runs, const int32_t* run_start, int short_limit,
                         int64_t dim, float* summed) {
  const int64_t runs = *num_runs, warps = int64_t{gridDim.x} * (blockDim.x / 32);
  for (int64_t run = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32; run < runs;
       run += warps) {
    if (ShortRun(run_start, run, short_limit)) continue;
    for (int64_t d = threadIdx.x % 32; d < dim; d += 32) summed[run * dim + d] = 0.0f;
  }
}

// Use k's gradient as a row and its scale: its own row, or values row rows[k] times scales[k]
// (nullptr, read as zeros, outside [0, source_rows)).
__device__ __forceinline__ const float* GradientRow(const SparseGradient& g, int64_t k,
                                                    int64_t dim, float* scale) {
  *scale = 1.0f;
  if (g.rows == nullptr) return g.values + k * dim;
  const int64_t row = g.rows[k];
  if (row < 0 || row >= g.source_rows) return nullptr;
  *scale = g.scales[k];
  return g.values + row * dim;
}

// Use k's gradient element d (zeros where its row is outside the source).
__device__ __forceinline__ float GradientAt(const SparseGradient& g, int64_t k, int64_t dim,
                                           int64_t d) {
  float scale = 1.0f;
  const float* row = GradientRow(g, k, dim, &scale);
  return row == nullptr ? 0.0f : scale * row[d];
}

// A chunk's uses are first resolved in parallel (member, gradient row, scale, run) into shared
// memory, so each element's loop over them issues independent loads instead of a chain of
// dependent ones a use.
__global__ void SumRuns(const int32_t* order, const int64_t* sorted_keys, const int32_t* run_of,
                        const int32_t* run_start, int short_limit,
                        const SparseApplyMember* members, int count, int row_bits, int64_t n,
                        int64_t dim, float* summed, const LookupCheck* check) {
  if (Failed(check)) return;
  __shared__ const float* use_row[kUsesPerChunk];
  __shared__ float use_scale[kUsesPerChunk];
  __shared__ int32_t use_run[kUsesPerChunk];
  const int64_t chunks = (n + kUsesPerChunk - 1) / kUsesPerChunk;
  for (int64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    const int64_t first = chunk * kUsesPerChunk;
    const int uses = static_cast<int>(min(n - first, kUsesPerChunk));
    if (threadIdx.x < uses) {  // a short run's uses read nothing and add nowhere (run -1)
      const int64_t k = first + threadIdx.x;
      const int64_t m = sorted_keys[k] >> row_bits;
      const bool long_run = !ShortRun(run_start, run_of[k], short_limit);
      float scale = 0.0f;
      use_row[threadIdx.x] =
          m < count && long_run
              ? GradientRow(members[m].gradient, order[k] - members[m].first_use, dim, &scale)
              : nullptr;
      use_scale[threadIdx.x] = scale;
      use_run[threadIdx.x] = long_run ? run_of[k] : -1;
    }
    __syncthreads();
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
      float total = 0.0f;
      for (int j0 = 0; j0 < uses; j0 += kUsesInFlight) {
        float value[kUsesInFlight];  // loaded together, before any atomic of the group
#pragma unroll
        for (int i = 0; i < kUsesInFlight; ++i) {
          const float* row = j0 + i < uses ? use_row[j0 + i] : nullptr;
          value[i] = row != nullptr ? use_scale[j0 + i] * __ldg(row + d) : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < kUsesInFlight; ++i) {
          const int j = j0 + i;
          if (j >= uses) break;
          total += value[i];
          if (j + 1 == uses || use_run[j + 1] != use_run[j]) {
            if (use_run[j] >= 0) atomicAdd(&summed[use_run[j] * dim + d], total);
            total = 0.0f;
          }
        }
      }
    }
    __syncthreads();
  }
}

// Plain SGD (no momentum) is linear in the gradient: each use subtracts its own share by an
// atomic add, with no sort and no summing of duplicate ids first (as TF's scatter_add); for
// rows SortedTileSgd cannot take (not float4, or not 16-byte aligned).
// hyper: [lr, momentum] in device memory; a momentum would need state: nothing is written.
__global__ void ScatterSgd(const int64_t* ids, SparseGradient grads, int64_t n, int64_t dim,
                           int64_t rows, const float* hyper, float* values,
                           const LookupCheck* check) {
  if (Failed(check) || hyper[1] != 0.0f) return;
  const float lr = hyper[0];
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n * dim;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t k = e / dim, row = ids[k];
    if (row < 0 || row >= rows) continue;
    atomicAdd(&values[row * dim + (e - k * dim)], -lr * GradientAt(grads, k, dim, e - k * dim));
  }
}

// Plain SGD on float4 rows, duplicates summed a sorted tile at a time (sorted_tile_sgd.cuh).
__global__ void __launch_bounds__(kSgdTileUses)
    SortedTileSgd(const int64_t* __restrict__ ids, const float4* __restrict__ grads, int64_t n,
                  int64_t width, int64_t rows, int end_bit, const float* hyper, float4* values,
                  int lanes, GradRows grad_rows, const LookupCheck* check) {
  __shared__ SgdTileStorage tile;
  if (Failed(check) || hyper[1] != 0.0f) return;
  for (int64_t first = blockIdx.x * int64_t{kSgdTileUses}; first < n;
       first += int64_t{gridDim.x} * kSgdTileUses) {
    const int64_t k = first + threadIdx.x;
    const int64_t id = k < n ? ids[k] : -1;
    ApplySgdTile(tile, id < rows ? id : -1, first, grads, width, hyper[0], values, end_bit,
                 lanes, grad_rows);
  }
}

// Row `row`'s state section s (a slot variable's row, or a part of the table's state row).
__device__ __forceinline__ float* StateSection(const SparseApplyTable& table, int64_t row, int s) {
  return table.num_slots > 0 ? table.slots[s] + row * table.dim
                             : table.state + row * table.state_dim + s * table.dim;
}

// One step of the rule per element of every touched row (elementwise rules: dim 1, state
// sections of length 1): a block per row, its threads across the row's elements.
// The rule's values come from device memory; values that need more state than the table
// holds (a momentum without its slot) write nothing.
template <typename Hyper>
__global__ void ApplyRuns(const int64_t* run_key, const int32_t* num_runs, const float* summed,
                          const SparseApplyMember* members, int count, int row_bits,
                          int sections, const float* hyper_values, bool nesterov,
                          const LookupCheck* check) {
  const Hyper hyper = MakeHyper<Hyper>(hyper_values, nesterov);
  if (Failed(check) || RuleStateFloats(hyper, members[0].table.dim) > members[0].table.state_dim) {
    return;
  }
  const int64_t runs = *num_runs, row_mask = (int64_t{1} << row_bits) - 1;
  for (int64_t run = blockIdx.x; run < runs; run += gridDim.x) {
    const int64_t m = run_key[run] >> row_bits, row = run_key[run] & row_mask;
    if (m >= count) continue;  // ids outside their tables
    const SparseApplyTable& table = members[m].table;
    const int64_t dim = table.dim;
    float* values = table.values + row * dim;
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
      float g = summed[run * dim + d];
      float w = values[d];
      float state[kMaxSections];
      float* section[kMaxSections];
      for (int s = 0; s < sections; ++s) {
        section[s] = StateSection(table, row, s) + d;
        state[s] = *section[s];
      }
      ApplyRule(&w, state, &g, 1, hyper);
      values[d] = w;
      for (int s = 0; s < sections; ++s) *section[s] = state[s];
    }
  }
}

// Rows of float4s (dim a multiple of 4, every row and state array 16-byte aligned): a warp a
// run. A short run's gradients are summed in registers, a float4 a lane up to
// kFloat4sPerLane, four uses' rows loaded before they are added; a long run's sum is SumRuns'
// row of `summed`. Then the rule steps the row and its state.
template <typename Hyper>
__global__ void SumApplyRuns(const int32_t* order, const int64_t* run_key,
                             const int32_t* run_start, const int32_t* num_runs,
                             const float* summed, const SparseApplyMember* members, int count,
                             int row_bits, int sections, const float* hyper_values,
                             bool nesterov, const LookupCheck* check) {
  const Hyper hyper = MakeHyper<Hyper>(hyper_values, nesterov);
  if (Failed(check) || RuleStateFloats(hyper, members[0].table.dim) > members[0].table.state_dim) {
    return;
  }
  constexpr int kUsesAtOnce = 4;
  const int lane = threadIdx.x % 32;
  const int64_t runs = *num_runs, row_mask = (int64_t{1} << row_bits) - 1;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  for (int64_t run = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32; run < runs;
       run += warps) {
    const int32_t first = run_start[run], end = run_start[run + 1];
    const int64_t m = run_key[run] >> row_bits, row = run_key[run] & row_mask;
    if (m >= count) continue;  // ids outside their tables
    const SparseApplyTable& table = members[m].table;
    const SparseGradient& gradient = members[m].gradient;
    const int64_t dim = table.dim, width = dim / 4, first_use = members[m].first_use;
    float4 sum[kFloat4sPerLane];
    const bool long_run = end - first > kShortRunUses;
#pragma unroll
    for (int j = 0; j < kFloat4sPerLane; ++j) {
      const int64_t d4 = lane + 32 * j;
      sum[j] = long_run && d4 < width ? reinterpret_cast<const float4*>(summed + run * dim)[d4]
                                      : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    for (int32_t k0 = first; k0 < end && !long_run; k0 += kUsesAtOnce) {
      const float4* rows[kUsesAtOnce];
      float scales[kUsesAtOnce];
#pragma unroll
      for (int i = 0; i < kUsesAtOnce; ++i) {
        scales[i] = 0.0f;
        rows[i] = k0 + i < end ? reinterpret_cast<const float4*>(GradientRow(
                                     gradient, order[k0 + i] - first_use, dim, &scales[i]))
                               : nullptr;
      }
#pragma unroll
      for (int j = 0; j < kFloat4sPerLane; ++j) {
        const int64_t d4 = lane + 32 * j;
        if (d4 >= width) break;
        float4 g[kUsesAtOnce];
#pragma unroll
        for (int i = 0; i < kUsesAtOnce; ++i) {
          g[i] = rows[i] != nullptr ? __ldg(rows[i] + d4) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int i = 0; i < kUsesAtOnce; ++i) {
          sum[j].x += scales[i] * g[i].x;
          sum[j].y += scales[i] * g[i].y;
          sum[j].z += scales[i] * g[i].z;
          sum[j].w += scales[i] * g[i].w;
        }
      }
    }
    float4* values = reinterpret_cast<float4*>(table.values + row * dim);
    float4* section[kMaxSections];
#pragma unroll
    for (int s = 0; s < kMaxSections; ++s) {
      section[s] = s < sections ? reinterpret_cast<float4*>(StateSection(table, row, s)) : nullptr;
    }
#pragma unroll
    for (int j = 0; j < kFloat4sPerLane; ++j) {
      const int64_t d4 = lane + 32 * j;
      if (d4 >= width) break;
      const float4 w4 = values[d4];
      float w[4] = {w4.x, w4.y, w4.z, w4.w};
      const float g[4] = {sum[j].x, sum[j].y, sum[j].z, sum[j].w};
      float state[kMaxSections][4];
#pragma unroll
      for (int s = 0; s < kMaxSections; ++s) {
        const float4 v = s < sections ? section[s][d4] : make_float4(0.f, 0.f, 0.f, 0.f);
        state[s][0] = v.x, state[s][1] = v.y, state[s][2] = v.z, state[s][3] = v.w;
      }
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        float element[kMaxSections];
#pragma unroll
        for (int s = 0; s < kMaxSections; ++s) element[s] = state[s][c];
        ApplyRule(&w[c], element, &g[c], 1, hyper);
#pragma unroll
        for (int s = 0; s < kMaxSections; ++s) state[s][c] = element[s];
      }
      values[d4] = make_float4(w[0], w[1], w[2], w[3]);
#pragma unroll
      for (int s = 0; s < kMaxSections; ++s) {
        if (s < sections) {
          section[s][d4] = make_float4(state[s][0], state[s][1], state[s][2], state[s][3]);
        }
      }
    }
  }
}

// Whether the group's rows can go the short-run way: float4 rows of at most 32 *
// kFloat4sPerLane of them, every array the kernel reads as float4 16-byte aligned.
bool Float4Rows(const std::vector<SparseApplyMember>& members) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  for (const SparseApplyMember& member : members) {
    const SparseApplyTable& table = member.table;
    if (table.dim % 4 != 0 || table.dim > 4 * 32 * kFloat4sPerLane ||
        !aligned(table.values) || !aligned(table.state) || !aligned(member.gradient.values)) {
      return false;
    }
    for (int s = 0; s < table.num_slots; ++s) {
      if (!aligned(table.slots[s])) return false;
    }
  }
  return true;
}

// The group's shape, checked on the host: one width and one state layout the rule fits, ids
// counted in int32 positions, keys within 63 bits.
bool GroupFits(const std::string& rule, int64_t hyper_count,
               const std::vector<SparseApplyMember>& members) {
  if (members.empty()) return false;
  const SparseApplyTable& first = members[0].table;
  int64_t uses = 0;
  for (const SparseApplyMember& member : members) {
    const SparseApplyTable& table = member.table;
    if (table.dim != first.dim || table.state_dim != first.state_dim ||
        table.num_slots != first.num_slots || member.first_use != uses || table.rows < 0 ||
        member.gradient.n < 0 ||
        (table.state_dim > 0 && table.state == nullptr && table.num_slots == 0)) {
      return false;
    }
    uses += member.gradient.n;
  }
  if (first.dim <= 0 || first.state_dim % first.dim != 0 ||
      first.state_dim / first.dim > kMaxSections || first.num_slots > kMaxSections ||
      (first.num_slots > 0 && first.num_slots * first.dim != first.state_dim) ||
      uses >= (int64_t{1} << 31)) {
    return false;
  }
  // The rule must find the state it expects: a state_dim below what its type needs with any
  // values is refused before anything runs; the kernels refuse values that need more.
  bool fits = true;
  const Status known = VisitRuleType(rule, hyper_count, [&](auto type) {
    fits = RuleStateFloats(type, first.dim) <= first.state_dim;
  });
  return known.ok() && fits;
}

bool IsPlainSgd(const std::string& rule, const SparseApplyTable& shape) {
  return rule == "sgd" && shape.state_dim == 0;
}

// Plain SGD without state: per table, no sort (each use's step is linear in its gradient).
cudaError_t PlainSgd(const SparseApplyMember& member, const float* hyper_device,
                     LookupCheck* check, cudaStream_t stream) {
  const SparseApplyTable& table = member.table;
  const SparseGradient& gradient = member.gradient;
  const int64_t n = gradient.n;
  if (n == 0) return cudaSuccess;
  const int end_bit = SgdTileEndBit(table.rows);
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (table.dim % 4 == 0 && end_bit <= 32 && aligned(gradient.values) && aligned(table.values)) {
    const int64_t width = table.dim / 4;
    SortedTileSgd<<<GridBlocks(n, kSgdTileUses), kSgdTileUses, 0, stream>>>(
        gradient.ids, reinterpret_cast<const float4*>(gradient.values), n, width, table.rows,
        end_bit, hyper_device, reinterpret_cast<float4*>(table.values), RowLanes(width),
        GradRows{gradient.rows, gradient.scales, gradient.source_rows}, check);
  } else {
    ScatterSgd<<<GridBlocks(n * table.dim, 256), 256, 0, stream>>>(
        gradient.ids, gradient, n, table.dim, table.rows, hyper_device, table.values, check);
  }
  return cudaGetLastError();
}

}  // namespace

bool SparseApplyGroupReadsDeviceMembers(const std::string& rule, const SparseApplyTable& shape,
                                        bool checked) {
  return checked || !IsPlainSgd(rule, shape);
}

cudaError_t SparseApplyGroupGpuAsync(const std::string& rule, const float* hyper_device,
                                     int64_t hyper_count, bool nesterov,
                                     const std::vector<SparseApplyMember>& members,
                                     const SparseApplyMember* members_device,
                                     const DeviceAllocate& allocate, LookupCheck* check,
                                     cudaStream_t stream) {
  if (!GroupFits(rule, hyper_count, members)) return cudaErrorInvalidValue;
  const int count = static_cast<int>(members.size());
  const SparseApplyTable& shape = members[0].table;
  const int64_t n = members.back().first_use + members.back().gradient.n;
  if (n == 0) return cudaSuccess;
  int64_t max_rows = 1, run_bound = 1;  // one run more: the ids outside their tables
  for (const SparseApplyMember& member : members) {
    max_rows = std::max(max_rows, member.table.rows);
    run_bound += std::min(member.gradient.n, member.table.rows);
  }
  const int row_bits = SgdTileEndBit(max_rows);
  const int end_bit = row_bits + SgdTileEndBit(int64_t{count} + 1);
  if (end_bit > 63) return cudaErrorInvalidValue;
  if (IsPlainSgd(rule, shape)) {
    if (check != nullptr) {
      GroupKeys<<<GridBlocks(n, 256), 256, 0, stream>>>(members_device, count, n, row_bits,
                                                          nullptr, nullptr, check);
      DescribeBadId<<<1, 1, 0, stream>>>(members_device, check);
    }
    for (const SparseApplyMember& member : members) {
      const cudaError_t status = PlainSgd(member, hyper_device, check, stream);
      if (status != cudaSuccess) return status;
    }
    return cudaSuccess;
  }

  int64_t *keys = nullptr, *sorted_keys = nullptr, *run_key = nullptr;
  int32_t *positions = nullptr, *order = nullptr, *run_of = nullptr, *num_runs = nullptr,
          *run_start = nullptr;
  float* summed = nullptr;
  char* temp = nullptr;
  auto get = [&](auto** out, size_t items) {
    *out = static_cast<std::remove_reference_t<decltype(**out)>*>(
        allocate(std::max<size_t>(items * sizeof(**out), 1)));
    return *out != nullptr;
  };
  size_t temp_bytes = SortAndScanTempBytes(n, end_bit, stream);
  if (!(get(&keys, n) && get(&sorted_keys, n) && get(&run_key, run_bound) &&
        get(&positions, n) && get(&order, n) && get(&run_of, n) && get(&num_runs, 1) &&
        get(&run_start, run_bound + 1) &&
        get(&summed, run_bound * shape.dim) && get(&temp, temp_bytes))) {
    return cudaErrorMemoryAllocation;
  }
  GroupKeys<<<GridBlocks(n, 256), 256, 0, stream>>>(members_device, count, n, row_bits, keys,
                                                      positions, check);
  if (check != nullptr) DescribeBadId<<<1, 1, 0, stream>>>(members_device, check);
  const int items = static_cast<int>(n);
  cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, sorted_keys, positions, order, items,
                                  0, end_bit, stream);
  HeadFlags<<<GridBlocks(n, 256), 256, 0, stream>>>(sorted_keys, n, positions);  // reused
  cub::DeviceScan::InclusiveSum(temp, temp_bytes, positions, run_of, items, stream);
  RunIds<<<GridBlocks(n, 256), 256, 0, stream>>>(sorted_keys, run_of, n, run_key, run_start,
                                                   num_runs);
  const int short_limit = Float4Rows(members) ? kShortRunUses : 0;
  constexpr int kWarpsPerBlock = 8;  // the warp-a-run kernels' blocks
  const int warp_blocks = static_cast<int>(
      std::min<int64_t>((run_bound + kWarpsPerBlock - 1) / kWarpsPerBlock, 4 * kApplyBlocks));
  ZeroRuns<<<warp_blocks, 32 * kWarpsPerBlock, 0, stream>>>(num_runs, run_start, short_limit,
                                                            shape.dim, summed);
  const int threads = static_cast<int>(std::min<int64_t>(256, (shape.dim + 31) / 32 * 32));
  const int64_t chunks = (n + kUsesPerChunk - 1) / kUsesPerChunk;
  SumRuns<<<GridBlocks(chunks, 1), threads, 0, stream>>>(order, sorted_keys, run_of, run_start,
                                                         short_limit, members_device, count,
                                                         row_bits, n, shape.dim, summed, check);
  // The runs (distinct rows) are counted on the device: blocks (warps) stride over them. A
  // block per use instead would launch mostly empty blocks where ids repeat, at a cost that
  // showed.
  const int sections = shape.num_slots > 0 ? shape.num_slots
                                           : static_cast<int>(shape.state_dim / shape.dim);
  const int apply_blocks = static_cast<int>(std::min<int64_t>(run_bound, kApplyBlocks));
  VisitRuleType(rule, hyper_count, [&](auto type) {
    if (short_limit > 0) {
      SumApplyRuns<decltype(type)><<<warp_blocks, 32 * kWarpsPerBlock, 0, stream>>>(
          order, run_key, run_start, num_runs, summed, members_device, count, row_bits,
          sections, hyper_device, nesterov, check);
    } else {
      ApplyRuns<decltype(type)><<<apply_blocks, threads, 0, stream>>>(
          run_key, num_runs, summed, members_device, count, row_bits, sections, hyper_device,
          nesterov, check);
    }
  });
  return cudaGetLastError();
}

cudaError_t SparseApplyGpu(const std::string& rule, const float* hyper, int64_t hyper_count,
                           bool nesterov, const SparseApplyTable& table,
                           const SparseGradient& gradient, cudaStream_t stream) {
  // Host values: the state they need is checked here, then they go to the device.
  bool fits = true;
  const Status known = VisitRule(rule, hyper, hyper_count, nesterov, [&](const auto& h) {
    fits = RuleStateFloats(h, table.dim) <= table.state_dim;
  });
  if (!known.ok() || !fits) return cudaErrorInvalidValue;
  StreamScratch scratch(stream);
  LookupCheck* check = nullptr;
  float* hyper_device = nullptr;
  cudaError_t status = scratch.Get(1, &check);
  if (status == cudaSuccess) status = scratch.Get(hyper_count, &hyper_device);
  if (status == cudaSuccess) {
    status = cudaMemcpyAsync(hyper_device, hyper, hyper_count * sizeof(float),
                             cudaMemcpyHostToDevice, stream);
  }
  if (status != cudaSuccess) return status;
  status = ResetLookupCheck(check, stream);
  if (status != cudaSuccess) return status;
  const std::vector<SparseApplyMember> members = {{table, gradient, 0}};
  SparseApplyMember* members_device = nullptr;
  status = scratch.Get(1, &members_device);
  if (status == cudaSuccess) {  // pageable source: copied out before the call returns
    status = cudaMemcpyAsync(members_device, members.data(), sizeof(SparseApplyMember),
                             cudaMemcpyHostToDevice, stream);
  }
  if (status != cudaSuccess) return status;
  status = SparseApplyGroupGpuAsync(rule, hyper_device, hyper_count, nesterov, members,
                                    members_device,
                                    [&](size_t bytes) -> void* {
                                      char* p = nullptr;
                                      return scratch.Get(bytes, &p) == cudaSuccess ? p : nullptr;
                                    },
                                    check, stream);
  if (status != cudaSuccess) return status;
  LookupCheck host;
  status = cudaMemcpyAsync(&host, check, sizeof(host), cudaMemcpyDeviceToHost, stream);
  if (status == cudaSuccess) status = cudaStreamSynchronize(stream);
  if (status != cudaSuccess) return status;
  return host.first_bad == kNoError ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace sok
