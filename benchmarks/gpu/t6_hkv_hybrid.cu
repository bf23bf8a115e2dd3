// T6 against HierarchicalKV in hybrid mode (SOK 2.1's default dynamic backend, `var_type=
// "hybrid"`): its vectors beyond `max_hbm_for_vectors` live in pinned host memory and its
// kernels read and write them there, in place. Same GPU and job as benchmarks/gpu/tf_tiered.py,
// on the same keys: that script writes each variant's batches (--keys-dir) and this program
// reads them, prefills the same keys, then times per step over the batches cycled:
//   eval   find of the batch's keys (rows copied out);
//   train  an SGD or Adam step of a sum loss, as a user of HierarchicalKV writes it: the
//          batch's keys made distinct, find_or_insert of those (row addresses), each id's row
//          gathered, each distinct row updated once by its gradient (the key's count),
//          through the addresses. With Adam, a key's two moments follow its row in its value
//          (dim 3 x 128), as SOK keeps an optimizer's state in HierarchicalKV.
// HierarchicalKV is built from its source (github.com/NVIDIA-Merlin/HierarchicalKV; its
// include folder is HKV_INCLUDE). Build and run: benchmarks/gpu/t6_hkv_on_device.sh.
//
// Usage: t6_hkv_hybrid KEYS_FILE KEYS BATCH HBM_BYTES ROUNDS [sgd|adam]  (one JSON object)
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cub/cub.cuh>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/gpu/cuda_check.h"
#include "merlin_hashtable.cuh"

namespace {

constexpr int64_t kDim = 128;
// tf_tiered.py's optimizers: legacy Keras SGD(0.01) and Adam(0.001).
constexpr float kSgdRate = 0.01f, kAdamRate = 0.001f, kBeta1 = 0.9f, kBeta2 = 0.999f,
                kEpsilon = 1e-7f;
using Hkv = nv::merlin::HashTable<uint64_t, float, uint64_t, nv::merlin::EvictStrategy::kLru>;

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Keys as tf_tiered.py's key_of makes them (index times an odd constant, spread over the
// int64 range), rows uniform in [-0.05, 0.05], state (the floats past kDim of a `width`) 0.
__global__ void PrefillKeys(uint64_t* keys, float* values, int64_t n, int64_t first,
                            int64_t width) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n * width;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / width, column = i % width;
    if (column == 0) keys[row] = static_cast<uint64_t>(first + row) * 0x9E3779B97F4A7C15ull;
    values[i] = column < kDim
                    ? 0.05f * static_cast<float>((i * 2654435761ull) % 2001) / 1000.0f - 0.05f
                    : 0.0f;
  }
}

// out[position[j]] = the row of sorted id j, whose distinct key is run[j] (inclusive count
// of run heads, so one more than its index).
__global__ void GatherRows(float* const* rows, const int* run, const int* position, int64_t n,
                           float* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n * kDim;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float* row = rows[run[i / kDim] - 1];
    out[position[i / kDim] * kDim + i % kDim] = row ? row[i % kDim] : 0.0f;
  }
}

__global__ void RunHeads(const uint64_t* sorted, int64_t n, int* head) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    head[i] = i == 0 || sorted[i] != sorted[i - 1];
  }
}

// The step of a sum loss on each distinct row, its gradient the key's uses: SGD (adam_rate
// 0), or Adam with the moments after the row and the bias-corrected rate `adam_rate`.
__global__ void UpdateRows(float* const* rows, const int* uses, int64_t n, float adam_rate) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n * kDim;
       i += int64_t{gridDim.x} * blockDim.x) {
    float* row = rows[i / kDim];
    if (row == nullptr) continue;
    const int64_t column = i % kDim;
    const float gradient = static_cast<float>(uses[i / kDim]);
    if (adam_rate == 0.0f) {
      row[column] -= kSgdRate * gradient;
      continue;
    }
    float& m = row[kDim + column];
    float& v = row[2 * kDim + column];
    m = kBeta1 * m + (1.0f - kBeta1) * gradient;
    v = kBeta2 * v + (1.0f - kBeta2) * gradient * gradient;
    row[column] -= adam_rate * m / (sqrtf(v) + kEpsilon);
  }
}

__global__ void Iota(int* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = static_cast<int>(i);
  }
}

int Blocks(int64_t elements) {
  return static_cast<int>(std::min<int64_t>((elements + 255) / 256, 8192));
}

// Device buffers of one train step, sized for `batch` keys.
struct TrainScratch {
  uint64_t* sorted = nullptr;     // the batch's keys, sorted
  int* iota = nullptr;
  int* position = nullptr;        // their places in the batch
  uint64_t* distinct = nullptr;   // the distinct keys
  int* uses = nullptr;            // each one's count
  int* distinct_count = nullptr;
  int* run = nullptr;             // sorted id j's distinct key, counted from 1
  float** rows = nullptr;         // each distinct key's row
  bool* found = nullptr;
  float* out = nullptr;
  int* pinned_count = nullptr;
  void* temp = nullptr;
  size_t temp_bytes = 0;

  explicit TrainScratch(int64_t batch) {
    CHECK_CUDA(cudaMalloc(&sorted, batch * sizeof(uint64_t)));
    CHECK_CUDA(cudaMalloc(&iota, batch * sizeof(int)));
    CHECK_CUDA(cudaMalloc(&position, batch * sizeof(int)));
    CHECK_CUDA(cudaMalloc(&distinct, batch * sizeof(uint64_t)));
    CHECK_CUDA(cudaMalloc(&uses, batch * sizeof(int)));
    CHECK_CUDA(cudaMalloc(&distinct_count, sizeof(int)));
    CHECK_CUDA(cudaMalloc(&run, batch * sizeof(int)));
    CHECK_CUDA(cudaMalloc(&rows, batch * sizeof(float*)));
    CHECK_CUDA(cudaMalloc(&found, batch));
    CHECK_CUDA(cudaMalloc(&out, batch * kDim * sizeof(float)));
    CHECK_CUDA(cudaMallocHost(&pinned_count, sizeof(int)));
    Iota<<<Blocks(batch), 256>>>(iota, batch);
    const int n = static_cast<int>(batch);
    size_t sort_bytes = 0, encode_bytes = 0, scan_bytes = 0;
    cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, sorted, sorted, iota, position, n);
    cub::DeviceRunLengthEncode::Encode(nullptr, encode_bytes, sorted, distinct, uses,
                                       distinct_count, n);
    cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, run, run, n);
    temp_bytes = std::max({sort_bytes, encode_bytes, scan_bytes});
    CHECK_CUDA(cudaMalloc(&temp, temp_bytes));
    CHECK_CUDA(cudaDeviceSynchronize());
  }
};

// An SGD step of a sum loss as HierarchicalKV's users write it (SOK, dynamicemb): the batch's
// keys made distinct (sorted, run-length encoded; the count read back, as the table's API
// takes it from the host), find_or_insert of the distinct keys (row addresses), each id's
// row gathered, each distinct row updated once through its address.
void TrainStep(Hkv& table, const uint64_t* keys, int64_t n, float adam_rate, TrainScratch& s,
               cudaStream_t stream) {
  const int count = static_cast<int>(n);
  size_t bytes = s.temp_bytes;
  cub::DeviceRadixSort::SortPairs(s.temp, bytes, keys, s.sorted, s.iota, s.position, count, 0,
                                  64, stream);
  bytes = s.temp_bytes;
  cub::DeviceRunLengthEncode::Encode(s.temp, bytes, s.sorted, s.distinct, s.uses,
                                     s.distinct_count, count, stream);
  CHECK_CUDA(cudaMemcpyAsync(s.pinned_count, s.distinct_count, sizeof(int),
                             cudaMemcpyDeviceToHost, stream));
  RunHeads<<<Blocks(n), 256, 0, stream>>>(s.sorted, n, s.run);
  bytes = s.temp_bytes;
  cub::DeviceScan::InclusiveSum(s.temp, bytes, s.run, s.run, count, stream);
  CHECK_CUDA(cudaStreamSynchronize(stream));
  const int64_t distinct = *s.pinned_count;
  table.find_or_insert(distinct, s.distinct, s.rows, s.found, nullptr, stream,
                       /*unique_key=*/true);
  GatherRows<<<Blocks(n * kDim), 256, 0, stream>>>(s.rows, s.run, s.position, n, s.out);
  UpdateRows<<<Blocks(distinct * kDim), 256, 0, stream>>>(s.rows, s.uses, distinct,
                                                          adam_rate);
}

// Median over `rounds` passes of the wall time a step of `step(batch index)` over every batch.
template <typename Step>
double MedianStepMs(Step step, int64_t batches, int rounds, cudaStream_t stream) {
  const auto warm_start = std::chrono::steady_clock::now();
  for (int64_t b = 0; b < batches; ++b) step(b);  // warm-up pass
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::fprintf(stderr, "warm-up pass of %ld steps in %.2f s\n", static_cast<long>(batches),
               SecondsSince(warm_start));
  std::vector<double> ms;
  for (int r = 0; r < rounds; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t b = 0; b < batches; ++b) step(b);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    const std::chrono::duration<double, std::milli> took =
        std::chrono::steady_clock::now() - start;
    ms.push_back(took.count() / batches);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const bool adam = argc == 7 && std::string(argv[6]) == "adam";
  if ((argc != 6 && argc != 7) || (argc == 7 && !adam && std::string(argv[6]) != "sgd")) {
    std::fprintf(stderr, "usage: %s KEYS_FILE KEYS BATCH HBM_BYTES ROUNDS [sgd|adam]\n",
                 argv[0]);
    return 2;
  }
  const int64_t width = adam ? 3 * kDim : kDim;  // a value's floats: the row, then Adam's state
  const int64_t keys = std::atoll(argv[2]), batch = std::atoll(argv[3]);
  const size_t hbm_bytes = std::strtoull(argv[4], nullptr, 10);
  const int rounds = std::atoi(argv[5]);
  std::vector<uint64_t> host_keys;
  {
    FILE* file = std::fopen(argv[1], "rb");
    if (file == nullptr) {
      std::fprintf(stderr, "cannot open %s\n", argv[1]);
      return 1;
    }
    std::fseek(file, 0, SEEK_END);
    host_keys.resize(std::ftell(file) / sizeof(uint64_t));
    std::fseek(file, 0, SEEK_SET);
    if (std::fread(host_keys.data(), sizeof(uint64_t), host_keys.size(), file) !=
        host_keys.size()) {
      std::fprintf(stderr, "short read of %s\n", argv[1]);
      return 1;
    }
    std::fclose(file);
  }
  const int64_t batches = static_cast<int64_t>(host_keys.size()) / batch;
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  uint64_t* device_keys = nullptr;
  CHECK_CUDA(cudaMalloc(&device_keys, host_keys.size() * sizeof(uint64_t)));
  CHECK_CUDA(cudaMemcpy(device_keys, host_keys.data(), host_keys.size() * sizeof(uint64_t),
                        cudaMemcpyHostToDevice));

  nv::merlin::HashTableOptions options;
  options.init_capacity = keys;
  options.max_capacity = keys;
  options.dim = width;
  options.max_hbm_for_vectors = hbm_bytes;
  std::fprintf(stderr, "initialising a table of %ld keys, %zu bytes of HBM for vectors\n",
               static_cast<long>(keys), hbm_bytes);
  const auto init_start = std::chrono::steady_clock::now();
  Hkv table;
  table.init(options);
  std::fprintf(stderr, "table initialised in %.1f s\n", SecondsSince(init_start));
  const int64_t chunk = 1 << 20;
  uint64_t* fill_keys = nullptr;
  float* fill_values = nullptr;
  CHECK_CUDA(cudaMalloc(&fill_keys, chunk * sizeof(uint64_t)));
  CHECK_CUDA(cudaMalloc(&fill_values, chunk * width * sizeof(float)));
  const auto prefill_start = std::chrono::steady_clock::now();
  for (int64_t first = 0; first < keys; first += chunk) {
    const int64_t n = std::min(chunk, keys - first);
    PrefillKeys<<<8192, 256, 0, stream>>>(fill_keys, fill_values, n, first, width);
    table.insert_or_assign(n, fill_keys, fill_values, nullptr, stream);
    if ((first / chunk) % 8 == 7 || first + n == keys) {  // progress: the prefill is long
      CHECK_CUDA(cudaStreamSynchronize(stream));
      std::fprintf(stderr, "prefilled %ld of %ld keys in %.1f s\n",
                   static_cast<long>(first + n), static_cast<long>(keys),
                   SecondsSince(prefill_start));
    }
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  const std::chrono::duration<double> prefill_s =
      std::chrono::steady_clock::now() - prefill_start;
  const int64_t size_after_prefill = static_cast<int64_t>(table.size(stream));
  std::fprintf(stderr, "%ld keys held after the prefill\n", static_cast<long>(size_after_prefill));

  TrainScratch scratch(batch);
  float* eval_out = nullptr;
  CHECK_CUDA(cudaMalloc(&eval_out, batch * width * sizeof(float)));
  const double eval_ms = MedianStepMs(
      [&](int64_t b) {
        table.find(batch, device_keys + b * batch, eval_out, scratch.found, nullptr, stream);
      },
      batches, rounds, stream);
  std::fprintf(stderr, "eval: %.4f ms a step\n", eval_ms);
  int64_t step = 0;
  const double train_ms = MedianStepMs(
      [&](int64_t b) {
        ++step;  // Keras' bias-corrected rate: lr sqrt(1 - beta2^t) / (1 - beta1^t)
        const float rate = adam ? kAdamRate * std::sqrt(1.0 - std::pow(kBeta2, step)) /
                                      (1.0 - std::pow(kBeta1, step))
                                : 0.0f;
        TrainStep(table, device_keys + b * batch, batch, rate, scratch, stream);
      },
      batches, rounds, stream);
  CHECK_CUDA(cudaGetLastError());
  std::printf("{\"optimizer\": \"%s\", \"keys\": %ld, \"batch\": %ld, "
              "\"hbm_for_vectors_bytes\": %zu, \"batches_cycled\": %ld, \"prefill_s\": %.2f, "
              "\"size_after_prefill\": %ld, \"size_after\": %ld, \"load_factor\": %.3f, "
              "\"eval_ms\": %.4f, \"train_ms\": %.4f}\n",
              adam ? "adam" : "sgd", static_cast<long>(keys), static_cast<long>(batch),
              hbm_bytes, static_cast<long>(batches), prefill_s.count(),
              static_cast<long>(size_after_prefill), static_cast<long>(table.size(stream)),
              table.load_factor(stream), eval_ms, train_ms);
  return 0;
}
