// G4: this project's GPU hash table (kit_src/core/hash_table/gpu_hash_table.cuh) against
// HierarchicalKV in one process, on the same GPU and the same key arrays, in HierarchicalKV's
// unit (keys / s / 2^30). HierarchicalKV's benchmark method: a table of `capacity` keys filled
// to each load factor (0.5, 0.75, 1.0), then per op one array of 1Mi keys of which 60% are
// present, the op run `reps` times on it, each timed with CUDA events, the median reported.
// Both tables keep LRU scores; at load 1.0 both evict. HierarchicalKV is built from its source
// (github.com/NVIDIA-Merlin/HierarchicalKV; its include folder is HKV_INCLUDE).
//
// Build and run: benchmarks/gpu/g4_on_device.sh (writes g4_vs_hkv.json).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "benchmarks/gpu/cuda_check.h"
#include "kit_src/core/hash_table/gpu_hash_table.cuh"
#include "merlin_hashtable.cuh"

namespace {

// Stream-ordered device memory (the table frees scratch right after enqueuing its work).
class StreamMemory : public sok::GpuMemory {
 public:
  explicit StreamMemory(cudaStream_t stream) : stream_(stream) {}
  void* Allocate(size_t bytes) override {
    void* p = nullptr;
    return cudaMallocAsync(&p, bytes, stream_) == cudaSuccess ? p : nullptr;
  }
  void Free(void* p) override { cudaFreeAsync(p, stream_); }

 private:
  cudaStream_t stream_;
};

using Hkv = nv::merlin::HashTable<uint64_t, float, uint64_t, nv::merlin::EvictStrategy::kLru>;

// keys[i] for i < hits: present keys (drawn from [1, present]), the rest new (after `fresh`).
__global__ void MakeKeys(uint64_t* keys, int64_t n, int64_t hits, uint64_t present,
                         uint64_t fresh, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    keys[i] = i < hits ? 1 + sok::MixBits(seed ^ sok::MixBits(i)) % present : fresh + i;
  }
}

__global__ void Sequence(uint64_t* keys, int64_t n, uint64_t first) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    keys[i] = first + i;
  }
}

template <typename Op>
double MedianKeysPerSecond(Op op, int64_t n, int reps, cudaStream_t stream) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  op();  // warm-up
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) {
    CHECK_CUDA(cudaEventRecord(start, stream));
    op();
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    rates.push_back(n / (ms / 1e3) / 1073741824.0);
  }
  std::sort(rates.begin(), rates.end());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return rates[rates.size() / 2];
}

void Check(const sok::Status& status) {
  if (!status.ok()) {
    std::fprintf(stderr, "sok table: %s\n", status.message().c_str());
    std::exit(1);
  }
}

}  // namespace

int main() {
  const int64_t batch = 1 << 20;
  const int reps = 50;
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  cudaMemPool_t pool;
  CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, 0));
  uint64_t keep = UINT64_MAX;
  CHECK_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  StreamMemory memory(stream);
  uint64_t *keys = nullptr, *fill = nullptr;
  float *values = nullptr, *out = nullptr;
  bool* found = nullptr;
  CHECK_CUDA(cudaMalloc(&keys, batch * sizeof(uint64_t)));
  CHECK_CUDA(cudaMalloc(&fill, batch * sizeof(uint64_t)));
  CHECK_CUDA(cudaMalloc(&values, batch * 64 * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&out, batch * 64 * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&found, batch));
  CHECK_CUDA(cudaMemset(values, 0, batch * 64 * sizeof(float)));
  std::printf("{\n");
  const int dims[] = {8, 32, 64};
  for (int di = 0; di < 3; ++di) {
    const int64_t dim = dims[di];
    const int64_t capacity = dim == 64 ? (int64_t{64} << 20) : (int64_t{128} << 20);
    auto hkv = std::make_unique<Hkv>();
    nv::merlin::HashTableOptions options;
    options.init_capacity = capacity;
    options.max_capacity = capacity;
    options.dim = dim;
    options.max_hbm_for_vectors = nv::merlin::GB(capacity * dim * 4 / (1 << 30) + 1);
    hkv->init(options);
    sok::HashTableOptions sok_options;
    sok_options.dim = dim;
    sok_options.init_capacity = capacity;
    sok_options.max_capacity = capacity;
    sok_options.evict = sok::EvictStrategy::kLru;
    sok::GpuHashTable table(sok_options, sok::RowInitializer{}, &memory);
    Check(table.Init(stream));
    sok::TableContext context;
    context.stream = stream;
    std::printf("%s \"dim%ld\": {\n", di ? "," : "", static_cast<long>(dim));
    int64_t filled = 0;
    const float loads[] = {0.5f, 0.75f, 1.0f};
    for (int li = 0; li < 3; ++li) {
      // Fill both tables to the load with the same consecutive keys.
      const int64_t target = static_cast<int64_t>(capacity * loads[li]);
      while (filled < target) {
        const int64_t n = std::min(batch, target - filled);
        Sequence<<<1024, 256, 0, stream>>>(fill, n, 1 + filled);
        hkv->insert_or_assign(n, fill, values, nullptr, stream);
        Check(table.InsertOrAssign(reinterpret_cast<int64_t*>(fill), n, values, nullptr,
                                   context));
        filled += n;
      }
      CHECK_CUDA(cudaStreamSynchronize(stream));
      MakeKeys<<<1024, 256, 0, stream>>>(keys, batch, batch * 6 / 10, filled,
                                         uint64_t{1} << 50, 7 + li);
      const sok::TableKeys view{reinterpret_cast<int64_t*>(keys), batch, 1, 0};
      const double find_hkv = MedianKeysPerSecond(
          [&] { hkv->find(batch, keys, out, found, nullptr, stream); }, batch, reps, stream);
      const double find_sok = MedianKeysPerSecond(
          [&] { Check(table.Find(view, out, context)); }, batch, reps, stream);
      const double foi_hkv = MedianKeysPerSecond(
          [&] { hkv->find_or_insert(batch, keys, out, nullptr, stream); }, batch, reps, stream);
      const double foi_sok = MedianKeysPerSecond(
          [&] { Check(table.FindOrInsert(view, out, 1.0f, nullptr, context)); }, batch, reps,
          stream);
      MakeKeys<<<1024, 256, 0, stream>>>(keys, batch, batch * 6 / 10, filled,
                                         uint64_t{1} << 51, 17 + li);
      const double ioa_hkv = MedianKeysPerSecond(
          [&] { hkv->insert_or_assign(batch, keys, values, nullptr, stream); }, batch, reps,
          stream);
      const double ioa_sok = MedianKeysPerSecond(
          [&] {
            Check(table.InsertOrAssign(reinterpret_cast<int64_t*>(keys), batch, values, nullptr,
                                       context));
          },
          batch, reps, stream);
      std::printf("%s  \"load%g\": {\"find\": {\"sok\": %.3f, \"hkv\": %.3f}, "
                  "\"find_or_insert\": {\"sok\": %.3f, \"hkv\": %.3f}, "
                  "\"insert_or_assign\": {\"sok\": %.3f, \"hkv\": %.3f}, "
                  "\"hkv_load_factor\": %.3f}\n",
                  li ? "," : "", loads[li], find_sok, find_hkv, foi_sok, foi_hkv, ioa_sok,
                  ioa_hkv, hkv->load_factor(stream));
      std::fflush(stdout);
    }
    std::printf(" }\n");
  }
  std::printf("}\n");
  return 0;
}
