#include "kit_src/core/optimizers/sparse_apply.cuh"

#include <cub/cub.cuh>

#include <algorithm>

#include "kit_src/core/cuda_scratch.cuh"
#include "kit_src/core/optimizers/rule_by_name.h"
#include "kit_src/core/optimizers/update_rules.h"

namespace sok {
namespace {

constexpr int kMaxSections = 3;  // state floats per element: RMSprop centered keeps three

__global__ void CheckIds(const int64_t* ids, int64_t n, int64_t rows, int* bad) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    if (ids[i] < 0 || ids[i] >= rows) *bad = 1;
  }
}

__global__ void Iota(int32_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = static_cast<int32_t>(i);
  }
}

// run_of[k]: the run (distinct id, in sorted order) sorted use k belongs to, from head flags.
__global__ void HeadFlags(const int64_t* sorted_ids, int64_t n, int32_t* head) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n;
       k += int64_t{gridDim.x} * blockDim.x) {
    head[k] = k > 0 && sorted_ids[k] != sorted_ids[k - 1];
  }
}

__global__ void ZeroRuns(float* summed, const int32_t* num_runs, int64_t dim) {
  const int64_t total = *num_runs * dim;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    summed[i] = 0.0f;
  }
}

// Sums the gradients of equal ids: a block takes kUsesPerChunk consecutive sorted uses, one
// thread per element, and adds each run's partial sum once (an atomic only where a run
// crosses a chunk: a hot id's thousands of uses are summed by many blocks in parallel).
constexpr int64_t kUsesPerChunk = 32;

__global__ void SumRuns(const int32_t* order, const int32_t* run_of, const float* grads,
                        int64_t n, int64_t dim, float* summed) {
  const int64_t chunks = (n + kUsesPerChunk - 1) / kUsesPerChunk;
  for (int64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    const int64_t first = chunk * kUsesPerChunk;
    const int64_t last = min(n, first + kUsesPerChunk);
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
      float total = 0.0f;
      for (int64_t k = first; k < last; ++k) {
        total += grads[order[k] * dim + d];
        if (k + 1 == last || run_of[k + 1] != run_of[k]) {
          atomicAdd(&summed[run_of[k] * dim + d], total);
          total = 0.0f;
        }
      }
    }
  }
}

// One step of the rule per element of every touched row (elementwise rules: dim 1, state
// sections of length 1).
template <typename Hyper>
__global__ void ApplyRuns(const int64_t* run_id, const int32_t* num_runs, const float* summed,
                          SparseApplyTable table, int sections, Hyper hyper) {
  const int64_t dim = table.dim, total = *num_runs * dim;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t run = i / dim, d = i - run * dim, row = run_id[run];
    float g = summed[i];
    float w = table.values[row * dim + d];
    float state[kMaxSections];
    float* state_row = table.state + row * table.state_dim + d;
    for (int s = 0; s < sections; ++s) state[s] = state_row[s * dim];
    ApplyRule(&w, state, &g, 1, hyper);
    table.values[row * dim + d] = w;
    for (int s = 0; s < sections; ++s) state_row[s * dim] = state[s];
  }
}

}  // namespace

cudaError_t SparseApplyGpu(const std::string& rule, const float* hyper, int64_t hyper_count,
                           bool nesterov, const SparseApplyTable& table,
                           const SparseGradient& gradient, cudaStream_t stream) {
  if (RuleHyperCount(rule) != hyper_count || table.dim <= 0 ||
      table.state_dim % table.dim != 0 || table.state_dim / table.dim > kMaxSections ||
      (table.state_dim > 0 && table.state == nullptr) || gradient.n >= (int64_t{1} << 31)) {
    return cudaErrorInvalidValue;
  }
  const int64_t n = gradient.n;
  if (n == 0) return cudaSuccess;
  StreamScratch scratch(stream);
  int* bad = nullptr;
  cudaError_t status = scratch.Get(1, &bad);
  if (status != cudaSuccess) return status;
  cudaMemsetAsync(bad, 0, sizeof(int), stream);
  CheckIds<<<GridBlocks(n, 256), 256, 0, stream>>>(gradient.ids, n, table.rows, bad);
  int host_bad = 0;
  cudaMemcpyAsync(&host_bad, bad, sizeof(int), cudaMemcpyDeviceToHost, stream);
  status = cudaStreamSynchronize(stream);
  if (status != cudaSuccess) return status;
  if (host_bad) return cudaErrorInvalidValue;

  int64_t *sorted_ids = nullptr, *run_id = nullptr;
  int32_t *positions = nullptr, *order = nullptr, *run_length = nullptr, *run_of = nullptr,
          *num_runs = nullptr;
  float* summed = nullptr;
  for (cudaError_t s : {scratch.Get(n, &sorted_ids), scratch.Get(n, &run_id),
                        scratch.Get(n, &positions), scratch.Get(n, &order),
                        scratch.Get(n, &run_length), scratch.Get(n, &run_of),
                        scratch.Get(1, &num_runs), scratch.Get(n * table.dim, &summed)}) {
    if (s != cudaSuccess) return s;
  }
  Iota<<<GridBlocks(n, 256), 256, 0, stream>>>(positions, n);
  int end_bit = 1;
  while (end_bit < 63 && (int64_t{1} << end_bit) < table.rows) ++end_bit;
  const int items = static_cast<int>(n);
  size_t sort_bytes = 0, encode_bytes = 0, scan_bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, gradient.ids, sorted_ids, positions, order,
                                  items, 0, end_bit, stream);
  cub::DeviceRunLengthEncode::Encode(nullptr, encode_bytes, sorted_ids, run_id, run_length,
                                     num_runs, items, stream);
  cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, positions, run_of, items, stream);
  char* temp = nullptr;
  status = scratch.Get(std::max({sort_bytes, encode_bytes, scan_bytes}), &temp);
  if (status != cudaSuccess) return status;
  cub::DeviceRadixSort::SortPairs(temp, sort_bytes, gradient.ids, sorted_ids, positions, order,
                                  items, 0, end_bit, stream);
  cub::DeviceRunLengthEncode::Encode(temp, encode_bytes, sorted_ids, run_id, run_length, num_runs,
                                     items, stream);
  HeadFlags<<<GridBlocks(n, 256), 256, 0, stream>>>(sorted_ids, n, positions);  // reused
  cub::DeviceScan::InclusiveSum(temp, scan_bytes, positions, run_of, items, stream);
  ZeroRuns<<<GridBlocks(n * table.dim, 256), 256, 0, stream>>>(summed, num_runs, table.dim);
  const int threads = static_cast<int>(std::min<int64_t>(256, (table.dim + 31) / 32 * 32));
  const int64_t chunks = (n + kUsesPerChunk - 1) / kUsesPerChunk;
  SumRuns<<<GridBlocks(chunks, 1), threads, 0, stream>>>(
      order, run_of, gradient.values, n, table.dim, summed);
  const int sections = static_cast<int>(table.state_dim / table.dim);
  VisitRule(rule, hyper, hyper_count, nesterov, [&](const auto& h) {
    ApplyRuns<<<GridBlocks(n * table.dim, 256), 256, 0, stream>>>(run_id, num_runs, summed, table,
                                                             sections, h);
  });
  return cudaGetLastError();
}

}  // namespace sok
