// T6 against HierarchicalKV in hybrid mode (SOK 2.1's default dynamic backend, `var_type=
// "hybrid"`): its vectors beyond `max_hbm_for_vectors` live in pinned host memory and its
// kernels read and write them there, in place. Same GPU and job as benchmarks/gpu/tf_tiered.py,
// on the same keys: that script writes each variant's batches (--keys-dir) and this program
// reads them, prefills the same keys, then times per step over the batches cycled:
//   eval   find of the batch's keys (rows copied out);
//   train  an SGD step of a sum loss, as a user of HierarchicalKV writes it: find_or_insert
//          (row addresses), the rows gathered, each distinct row updated once by its
//          gradient (lr x the key's count), through the addresses.
// HierarchicalKV is built from its source (github.com/NVIDIA-Merlin/HierarchicalKV; its
// include folder is HKV_INCLUDE). Build and run: benchmarks/gpu/t6_hkv_on_device.sh.
//
// Usage: t6_hkv_hybrid KEYS_FILE KEYS BATCH HBM_BYTES ROUNDS  (prints one JSON object)
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cub/cub.cuh>
#include <memory>
#include <vector>

#include "benchmarks/gpu/cuda_check.h"
#include "merlin_hashtable.cuh"

namespace {

constexpr int64_t kDim = 128;
constexpr float kLearningRate = 0.01f;
using Hkv = nv::merlin::HashTable<uint64_t, float, uint64_t, nv::merlin::EvictStrategy::kLru>;

// tf_tiered.py's key_of: index times an odd constant, spread over the int64 range.
double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

__global__ void PrefillKeys(uint64_t* keys, float* values, int64_t n, int64_t first) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n * kDim;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / kDim;
    if (i % kDim == 0) {
      keys[row] = static_cast<uint64_t>(first + row) * 0x9E3779B97F4A7C15ull;
    }
    values[i] = 0.05f * static_cast<float>((i * 2654435761ull) % 2001) / 1000.0f - 0.05f;
  }
}

__global__ void GatherRows(float* const* rows, int64_t n, float* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n * kDim;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float* row = rows[i / kDim];
    out[i] = row ? row[i % kDim] : 0.0f;
  }
}

// Each distinct row (address) moves by lr x its uses: the SGD step of a sum loss.
__global__ void UpdateRows(float* const* rows, const int* uses, const int* distinct, float lr) {
  const int64_t n = *distinct;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n * kDim;
       i += int64_t{gridDim.x} * blockDim.x) {
    float* row = rows[i / kDim];
    if (row) row[i % kDim] -= lr * static_cast<float>(uses[i / kDim]);
  }
}

// Device buffers of one train step, sized for `batch` keys.
struct TrainScratch {
  float** rows = nullptr;
  float** sorted_rows = nullptr;
  float** distinct_rows = nullptr;
  int* uses = nullptr;
  int* distinct = nullptr;
  bool* found = nullptr;
  float* out = nullptr;
  void* temp = nullptr;
  size_t temp_bytes = 0;

  explicit TrainScratch(int64_t batch) {
    CHECK_CUDA(cudaMalloc(&rows, batch * sizeof(float*)));
    CHECK_CUDA(cudaMalloc(&sorted_rows, batch * sizeof(float*)));
    CHECK_CUDA(cudaMalloc(&distinct_rows, batch * sizeof(float*)));
    CHECK_CUDA(cudaMalloc(&uses, batch * sizeof(int)));
    CHECK_CUDA(cudaMalloc(&distinct, sizeof(int)));
    CHECK_CUDA(cudaMalloc(&found, batch));
    CHECK_CUDA(cudaMalloc(&out, batch * kDim * sizeof(float)));
    const auto* addresses = reinterpret_cast<const uint64_t*>(rows);
    size_t sort_bytes = 0, encode_bytes = 0;
    cub::DeviceRadixSort::SortKeys(nullptr, sort_bytes, addresses,
                                   reinterpret_cast<uint64_t*>(sorted_rows),
                                   static_cast<int>(batch));
    cub::DeviceRunLengthEncode::Encode(nullptr, encode_bytes,
                                       reinterpret_cast<uint64_t*>(sorted_rows),
                                       reinterpret_cast<uint64_t*>(distinct_rows), uses,
                                       distinct, static_cast<int>(batch));
    temp_bytes = std::max(sort_bytes, encode_bytes);
    CHECK_CUDA(cudaMalloc(&temp, temp_bytes));
  }
};

void TrainStep(Hkv& table, const uint64_t* keys, int64_t n, TrainScratch& s,
               cudaStream_t stream) {
  table.find_or_insert(n, keys, s.rows, s.found, nullptr, stream, /*unique_key=*/false);
  const int blocks = static_cast<int>(std::min<int64_t>((n * kDim + 255) / 256, 8192));
  GatherRows<<<blocks, 256, 0, stream>>>(s.rows, n, s.out);
  size_t bytes = s.temp_bytes;
  cub::DeviceRadixSort::SortKeys(s.temp, bytes, reinterpret_cast<const uint64_t*>(s.rows),
                                 reinterpret_cast<uint64_t*>(s.sorted_rows),
                                 static_cast<int>(n), 0, 64, stream);
  bytes = s.temp_bytes;
  cub::DeviceRunLengthEncode::Encode(s.temp, bytes, reinterpret_cast<uint64_t*>(s.sorted_rows),
                                     reinterpret_cast<uint64_t*>(s.distinct_rows), s.uses,
                                     s.distinct, static_cast<int>(n), stream);
  UpdateRows<<<blocks, 256, 0, stream>>>(s.distinct_rows, s.uses, s.distinct, kLearningRate);
}

// Median over `rounds` passes of the wall time a step of `step(batch index)` over every batch.
template <typename Step>
double MedianStepMs(Step step, int64_t batches, int rounds, cudaStream_t stream) {
  for (int64_t b = 0; b < batches; ++b) step(b);  // warm-up pass
  CHECK_CUDA(cudaStreamSynchronize(stream));
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
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s KEYS_FILE KEYS BATCH HBM_BYTES ROUNDS\n", argv[0]);
    return 2;
  }
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
  options.dim = kDim;
  options.max_hbm_for_vectors = hbm_bytes;
  const auto init_start = std::chrono::steady_clock::now();
  Hkv table;
  table.init(options);
  std::fprintf(stderr, "table initialised in %.1f s\n", SecondsSince(init_start));
  const int64_t chunk = 1 << 20;
  uint64_t* fill_keys = nullptr;
  float* fill_values = nullptr;
  CHECK_CUDA(cudaMalloc(&fill_keys, chunk * sizeof(uint64_t)));
  CHECK_CUDA(cudaMalloc(&fill_values, chunk * kDim * sizeof(float)));
  const auto prefill_start = std::chrono::steady_clock::now();
  for (int64_t first = 0; first < keys; first += chunk) {
    const int64_t n = std::min(chunk, keys - first);
    PrefillKeys<<<8192, 256, 0, stream>>>(fill_keys, fill_values, n, first);
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

  TrainScratch scratch(batch);
  float* eval_out = nullptr;
  CHECK_CUDA(cudaMalloc(&eval_out, batch * kDim * sizeof(float)));
  const double eval_ms = MedianStepMs(
      [&](int64_t b) {
        table.find(batch, device_keys + b * batch, eval_out, scratch.found, nullptr, stream);
      },
      batches, rounds, stream);
  const double train_ms = MedianStepMs(
      [&](int64_t b) { TrainStep(table, device_keys + b * batch, batch, scratch, stream); },
      batches, rounds, stream);
  CHECK_CUDA(cudaGetLastError());
  std::printf("{\"keys\": %ld, \"batch\": %ld, \"hbm_for_vectors_bytes\": %zu, "
              "\"batches_cycled\": %ld, \"prefill_s\": %.2f, \"size_after_prefill\": %ld, "
              "\"size_after\": %ld, \"load_factor\": %.3f, \"eval_ms\": %.4f, "
              "\"train_ms\": %.4f}\n",
              static_cast<long>(keys), static_cast<long>(batch), hbm_bytes,
              static_cast<long>(batches), prefill_s.count(),
              static_cast<long>(size_after_prefill), static_cast<long>(table.size(stream)),
              table.load_factor(stream), eval_ms, train_ms);
  return 0;
}
