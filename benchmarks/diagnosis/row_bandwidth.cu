// How fast can any kernel move G1b's bytes? G1b (docs/benchmarks.md): a table of 8Mi rows of 128
// floats (4 GiB), 1Mi ids a batch drawn uniformly, SGD. Its floors divide the bytes by the
// sequential device-to-device copy rate; the rows are scattered 512-byte reads and
// read-modify-writes instead. This measures, with no hashing and indices given, the best rate
// plain kernels reach on those access patterns, so the floor can be stated at the rate the
// hardware gives for them:
//   copy      cudaMemcpyAsync of 1 GiB (bytes read + written)
//   gather    out[i] = table[idx[i]], 1Mi ids uniform in [0, 8Mi) (G1b's forward / eval rows)
//   update    table[u[i]] -= lr * grad[i], 1Mi distinct rows (the SGD update's rows, no atomics)
//   atomic    the same with float4 atomicAdd (sm_90)
//   gather of power-law ids (G1a / G1b's keys), hot rows first and permuted, also with
//   evict-first output stores
// each with 1..16 rows in flight a warp (a warp moves one 512-byte row per float4 access),
// idx in random and in sorted order. CUDA events, median of `reps` after `warmup`.
//
// Build (from the repository root): nvcc -std=c++17 -O3 -arch=sm_90 -I.
//   benchmarks/gpu/row_bandwidth.cu -o row_bandwidth
// Run:   ./row_bandwidth > row_bandwidth.json
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "benchmarks/gpu/cuda_check.h"
#include "kit_src/core/cuda_atomic.cuh"

namespace {

constexpr int64_t kRows = int64_t{8} << 20;
constexpr int64_t kBatch = int64_t{1} << 20;
constexpr int kDim = 128;
constexpr int kWidth = kDim / 4;  // float4 a lane: one warp covers a row
static_assert(kWidth == 32, "one float4 per lane of a warp");
constexpr int kThreads = 256;

// Each warp takes `InFlight` rows at a time: all loads issued before the first store.
// Streaming: the output written with evict-first stores (st.global.cs), so it does not push
// the hot rows out of L2.
template <int InFlight, bool Streaming = false>
__global__ void GatherRows(const float4* table, const int64_t* idx, int64_t n, float4* out) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5;
  const int64_t warps = (int64_t{gridDim.x} * blockDim.x) >> 5;
  for (int64_t base = warp * InFlight; base < n; base += warps * InFlight) {
    float4 v[InFlight];
#pragma unroll
    for (int u = 0; u < InFlight; ++u) {
      if (base + u < n) v[u] = table[idx[base + u] * kWidth + lane];
    }
#pragma unroll
    for (int u = 0; u < InFlight; ++u) {
      if (base + u >= n) continue;
      if (Streaming) {
        __stcs(out + (base + u) * kWidth + lane, v[u]);
      } else {
        out[(base + u) * kWidth + lane] = v[u];
      }
    }
  }
}

template <int InFlight, bool Atomic>
__global__ void UpdateRows(float4* table, const int64_t* idx, int64_t n, const float4* grad,
                           float lr) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5;
  const int64_t warps = (int64_t{gridDim.x} * blockDim.x) >> 5;
  for (int64_t base = warp * InFlight; base < n; base += warps * InFlight) {
    float4 g[InFlight];
    float4 w[InFlight];
#pragma unroll
    for (int u = 0; u < InFlight; ++u) {
      if (base + u >= n) continue;
      g[u] = grad[(base + u) * kWidth + lane];
      if (!Atomic) w[u] = table[idx[base + u] * kWidth + lane];
    }
#pragma unroll
    for (int u = 0; u < InFlight; ++u) {
      if (base + u >= n) continue;
      float4* row = table + idx[base + u] * kWidth + lane;
      const float4 step = make_float4(-lr * g[u].x, -lr * g[u].y, -lr * g[u].z, -lr * g[u].w);
      if (Atomic) {
        sok::AtomicAddFloat4(row, step);
      } else {
        *row = make_float4(w[u].x + step.x, w[u].y + step.y, w[u].z + step.z, w[u].w + step.w);
      }
    }
  }
}

float MedianMs(const std::function<void()>& run, int warmup, int reps) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < warmup; ++i) run();
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; ++i) {
    CHECK_CUDA(cudaEventRecord(start));
    run();
    CHECK_CUDA(cudaEventRecord(stop));
    CHECK_CUDA(cudaEventSynchronize(stop));
    CHECK_CUDA(cudaEventElapsedTime(&ms[i], start, stop));
  }
  CHECK_CUDA(cudaGetLastError());
  std::nth_element(ms.begin(), ms.begin() + reps / 2, ms.end());
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  return ms[reps / 2];
}

int64_t* Upload(const std::vector<int64_t>& host) {
  int64_t* dev = nullptr;
  CHECK_CUDA(cudaMalloc(&dev, host.size() * sizeof(int64_t)));
  CHECK_CUDA(cudaMemcpy(dev, host.data(), host.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
  return dev;
}

struct Result {
  std::string op, order;
  int in_flight;
  double ms, bytes;
};

template <int InFlight>
void MeasureAll(const float4* table_ro, float4* table, float4* out, const float4* grad,
                const int64_t* ids, const int64_t* distinct, const char* order, int blocks,
                std::vector<Result>* results) {
  constexpr int kWarmup = 10, kReps = 50;
  const double row_bytes = kDim * 4.0;
  const double gather_bytes = kBatch * (8.0 + 2 * row_bytes);
  const double update_bytes = kBatch * (8.0 + 3 * row_bytes);
  results->push_back({"gather", order, InFlight,
                      MedianMs([&] { GatherRows<InFlight><<<blocks, kThreads>>>(table_ro, ids, kBatch, out); },
                               kWarmup, kReps),
                      gather_bytes});
  results->push_back({"update", order, InFlight,
                      MedianMs([&] { UpdateRows<InFlight, false><<<blocks, kThreads>>>(table, distinct, kBatch, grad, 1e-6f); },
                               kWarmup, kReps),
                      update_bytes});
  results->push_back({"atomic", order, InFlight,
                      MedianMs([&] { UpdateRows<InFlight, true><<<blocks, kThreads>>>(table, distinct, kBatch, grad, 1e-6f); },
                               kWarmup, kReps),
                      update_bytes});
}

}  // namespace

int main() {
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  int blocks_per_sm = 0;
  CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, GatherRows<8>, kThreads, 0));
  const int blocks = prop.multiProcessorCount * std::max(blocks_per_sm, 1);

  float4 *table, *out, *grad, *copy_from, *copy_to;
  CHECK_CUDA(cudaMalloc(&table, kRows * kDim * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&out, kBatch * kDim * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&grad, kBatch * kDim * sizeof(float)));
  CHECK_CUDA(cudaMemset(table, 0, kRows * kDim * sizeof(float)));
  CHECK_CUDA(cudaMemset(grad, 0, kBatch * kDim * sizeof(float)));
  const size_t copy_bytes = size_t{1} << 30;
  CHECK_CUDA(cudaMalloc(&copy_from, copy_bytes));
  CHECK_CUDA(cudaMalloc(&copy_to, copy_bytes));
  CHECK_CUDA(cudaMemset(copy_from, 1, copy_bytes));

  std::mt19937_64 rng(2026);
  std::vector<int64_t> ids(kBatch);
  std::uniform_int_distribution<int64_t> any_row(0, kRows - 1);
  for (auto& id : ids) id = any_row(rng);
  std::vector<int64_t> all(kRows);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<int64_t> distinct(all.begin(), all.begin() + kBatch);
  std::vector<int64_t> unique_ids = ids;
  std::sort(unique_ids.begin(), unique_ids.end());
  const int64_t unique = std::unique(unique_ids.begin(), unique_ids.end()) - unique_ids.begin();

  std::vector<Result> results;
  results.push_back({"copy", "sequential", 0,
                     MedianMs([&] { CHECK_CUDA(cudaMemcpyAsync(copy_to, copy_from, copy_bytes, cudaMemcpyDeviceToDevice)); },
                              10, 50),
                     2.0 * copy_bytes});
  // G1a / G1b's keys (docs/benchmarks.md: dynamicemb's PowerLaw(1, N, 1.05) sampler), hot rows
  // first and through a fixed permutation: the gather only (duplicates, no plain update).
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<int64_t> power_law(kBatch);
  const double alpha = 1.05, top = std::pow(static_cast<double>(kRows), 1.0 - alpha) - 1.0;
  for (auto& id : power_law) {
    const double y = std::pow(unit(rng) * top + 1.0, 1.0 / (1.0 - alpha));
    id = std::min<int64_t>(static_cast<int64_t>(y), kRows - 1);
  }
  for (const bool permuted : {false, true}) {
    std::vector<int64_t> g = power_law;
    if (permuted) for (auto& id : g) id = all[id];
    int64_t* dev_ids = Upload(g);
    const char* order = permuted ? "power_law_permuted" : "power_law";
    results.push_back({"gather", order, 4,
                       MedianMs([&] { GatherRows<4><<<blocks, kThreads>>>(table, dev_ids, kBatch, out); }, 10, 50),
                       kBatch * (8.0 + 2 * kDim * 4.0)});
    results.push_back({"gather", order, 8,
                       MedianMs([&] { GatherRows<8><<<blocks, kThreads>>>(table, dev_ids, kBatch, out); }, 10, 50),
                       kBatch * (8.0 + 2 * kDim * 4.0)});
    results.push_back({"gather_streaming_stores", order, 4,
                       MedianMs([&] { GatherRows<4, true><<<blocks, kThreads>>>(table, dev_ids, kBatch, out); }, 10, 50),
                       kBatch * (8.0 + 2 * kDim * 4.0)});
    CHECK_CUDA(cudaFree(dev_ids));
  }
  for (const bool sorted : {false, true}) {
    std::vector<int64_t> g = ids, d = distinct;
    if (sorted) {
      std::sort(g.begin(), g.end());
      std::sort(d.begin(), d.end());
    }
    int64_t* dev_ids = Upload(g);
    int64_t* dev_distinct = Upload(d);
    const char* order = sorted ? "sorted" : "random";
    MeasureAll<1>(table, table, out, grad, dev_ids, dev_distinct, order, blocks, &results);
    MeasureAll<2>(table, table, out, grad, dev_ids, dev_distinct, order, blocks, &results);
    MeasureAll<4>(table, table, out, grad, dev_ids, dev_distinct, order, blocks, &results);
    MeasureAll<8>(table, table, out, grad, dev_ids, dev_distinct, order, blocks, &results);
    MeasureAll<16>(table, table, out, grad, dev_ids, dev_distinct, order, blocks, &results);
    CHECK_CUDA(cudaFree(dev_ids));
    CHECK_CUDA(cudaFree(dev_distinct));
  }

  std::printf("{\n  \"device\": \"%s\",\n  \"rows\": %lld, \"dim\": %d, \"batch\": %lld, "
              "\"unique_ids\": %lld, \"blocks\": %d, \"threads\": %d,\n  \"results\": [\n",
              prop.name, static_cast<long long>(kRows), kDim, static_cast<long long>(kBatch),
              static_cast<long long>(unique), blocks, kThreads);
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    std::printf("    {\"op\": \"%s\", \"order\": \"%s\", \"rows_in_flight_a_warp\": %d, "
                "\"ms\": %.4f, \"bytes\": %.0f, \"tb_per_s\": %.3f}%s\n",
                r.op.c_str(), r.order.c_str(), r.in_flight, r.ms, r.bytes,
                r.bytes / (r.ms * 1e-3) / 1e12, i + 1 < results.size() ? "," : "");
  }
  std::printf("  ]\n}\n");
  return 0;
}
