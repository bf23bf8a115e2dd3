// The tiered table's view of GPU memory (tiered_table.h): allocations from the table's
// allocator, copies ordered on the call's stream and finished before returning.
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kit_src/core/gpu_memory.h"
#include "kit_src/core/hash_table/gpu_table_internal.cuh"
#include "kit_src/core/hash_table/tiered_table.h"

namespace sok {
namespace {

// out row positions[j] = rows row j ([count, dim]).
__global__ void PutRows(const int64_t* positions, const float* rows, int64_t count, int64_t dim,
                        float* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count * dim;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = i / dim;
    out[positions[j] * dim + i - j * dim] = rows[i];
  }
}

// Appends each selected, flagged key (and its index in the call) at a place an atomic claims.
__global__ void CompactFlagged(TableKeys keys, const uint8_t* flags, int64_t* out,
                               int64_t* positions, unsigned long long* count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < keys.n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t key;
    if (!KeyAt(keys, i, &key) || !flags[i]) continue;
    const unsigned long long at = atomicAdd(count, 1ull);
    out[at] = key;
    if (positions != nullptr) positions[at] = i;
  }
}

constexpr int kTallyThreads = 256;

// counts[0] += the selected keys, counts[1] += those flagged.
__global__ void TallyFlags(TableKeys keys, const uint8_t* flags, unsigned long long* counts) {
  unsigned long long selected = 0, flagged = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < keys.n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t key;
    if (!KeyAt(keys, i, &key)) continue;
    ++selected;
    flagged += flags[i] != 0;
  }
  using Reduce = cub::BlockReduce<unsigned long long, kTallyThreads>;
  __shared__ typename Reduce::TempStorage temp;
  selected = Reduce(temp).Sum(selected);
  __syncthreads();
  flagged = Reduce(temp).Sum(flagged);
  if (threadIdx.x == 0) {
    atomicAdd(&counts[0], selected);
    atomicAdd(&counts[1], flagged);
  }
}

class GpuTierMemory final : public TierMemory {
 public:
  explicit GpuTierMemory(std::shared_ptr<GpuMemory> memory) : memory_(std::move(memory)) {}
  ~GpuTierMemory() override {
    if (tally_ != nullptr) memory_->Free(tally_);
    if (tally_host_ != nullptr) cudaFreeHost(tally_host_);
  }
  Status Allocate(int64_t bytes, void** out) override {
    *out = memory_->Allocate(static_cast<size_t>(bytes));
    if (*out != nullptr) return Status::Ok();
    return Status::ResourceExhausted("tiered table: out of GPU memory allocating " +
                                     std::to_string(bytes) + " bytes");
  }
  void Free(void* pointer) override { memory_->Free(pointer); }
  Status ToHost(void* host, const void* hot, int64_t bytes, const TableContext& context) override {
    return CopyAndWait(host, hot, bytes, cudaMemcpyDeviceToHost, context);
  }
  Status FromHost(void* hot, const void* host, int64_t bytes, const TableContext& context) override {
    return CopyAndWait(hot, host, bytes, cudaMemcpyHostToDevice, context);
  }
  Status Copy(void* to, const void* from, int64_t bytes, const TableContext& context) override {
    return CopyAndWait(to, from, bytes, cudaMemcpyDeviceToDevice, context);
  }
  Status AllocateHost(int64_t bytes, void** out) override {
    if (cudaMallocHost(out, static_cast<size_t>(std::max<int64_t>(bytes, 1))) == cudaSuccess) {
      return Status::Ok();
    }
    *out = nullptr;
    return Status::ResourceExhausted("tiered table: out of pinned host memory allocating " +
                                     std::to_string(bytes) + " bytes");
  }
  void FreeHost(void* pointer) override { cudaFreeHost(pointer); }
  Status ScatterRows(float* out, const int64_t* positions, const float* rows, int64_t count,
                     int64_t dim, const TableContext& context) override {
    if (count == 0) return Status::Ok();
    void *at = nullptr, *from = nullptr;
    Status status = Allocate(count * sizeof(int64_t), &at);
    if (status.ok()) status = Allocate(count * dim * sizeof(float), &from);
    if (status.ok()) status = FromHost(at, positions, count * sizeof(int64_t), context);
    if (status.ok()) status = FromHost(from, rows, count * dim * sizeof(float), context);
    if (status.ok()) {
      const int64_t total = count * dim;
      const int blocks = static_cast<int>(std::min<int64_t>((total + 255) / 256, 4096));
      PutRows<<<blocks, 256, 0, static_cast<cudaStream_t>(context.stream)>>>(
          static_cast<const int64_t*>(at), static_cast<const float*>(from), count, dim, out);
      if (status.ok()) status = Synchronize(context);
    }
    if (from != nullptr) Free(from);
    if (at != nullptr) Free(at);
    return status;
  }
  Status Tally(const TableKeys& keys, const uint8_t* flags, int64_t* selected, int64_t* flagged,
               const TableContext& context) override {
    *selected = *flagged = 0;
    if (keys.n == 0) return Status::Ok();
    const cudaStream_t stream = static_cast<cudaStream_t>(context.stream);
    SOK_RETURN_IF_ERROR(EnsureCounts());
    cudaMemsetAsync(tally_, 0, kCountBytes, stream);
    TallyFlags<<<std::min(GridBlocks(keys.n, kTallyThreads), 1024), kTallyThreads, 0, stream>>>(
        keys, flags, tally_);
    cudaMemcpyAsync(tally_host_, tally_, kCountBytes, cudaMemcpyDeviceToHost, stream);
    SOK_RETURN_IF_ERROR(Synchronize(context));
    *selected = static_cast<int64_t>(tally_host_[0]);
    *flagged = static_cast<int64_t>(tally_host_[1]);
    return Status::Ok();
  }
  Status Flagged(const TableKeys& keys, const uint8_t* flags, bool distinct,
                 std::vector<int64_t>* out, std::vector<int64_t>* positions,
                 const TableContext& context) override {
    out->clear();
    if (positions != nullptr) positions->clear();
    if (keys.n == 0) return Status::Ok();
    const cudaStream_t stream = static_cast<cudaStream_t>(context.stream);
    SOK_RETURN_IF_ERROR(EnsureCounts());
    TierScratch scratch(this);  // freed after the call's last wait
    int64_t *found = nullptr, *at = nullptr;
    SOK_RETURN_IF_ERROR(scratch.Get(keys.n, &found));
    if (positions != nullptr) SOK_RETURN_IF_ERROR(scratch.Get(keys.n, &at));
    cudaMemsetAsync(tally_, 0, kCountBytes, stream);
    CompactFlagged<<<std::min(GridBlocks(keys.n, 256), 4096), 256, 0, stream>>>(keys, flags, found,
                                                                                at, tally_);
    int64_t count = 0;
    SOK_RETURN_IF_ERROR(ReadCount(&count, context));
    if (distinct && count > 1) {  // sorted, then each key once
      int64_t *sorted = nullptr, *unique = nullptr;
      char* temp = nullptr;
      size_t sort_bytes = 0, unique_bytes = 0;
      const int items = static_cast<int>(count);
      cub::DeviceRadixSort::SortKeys(nullptr, sort_bytes, found, sorted, items, 0, 64, stream);
      cub::DeviceSelect::Unique(nullptr, unique_bytes, sorted, unique, tally_, items, stream);
      SOK_RETURN_IF_ERROR(scratch.Get(count, &sorted));
      SOK_RETURN_IF_ERROR(scratch.Get(count, &unique));
      SOK_RETURN_IF_ERROR(scratch.Get(std::max(sort_bytes, unique_bytes), &temp));
      cub::DeviceRadixSort::SortKeys(temp, sort_bytes, found, sorted, items, 0, 64, stream);
      cub::DeviceSelect::Unique(temp, unique_bytes, sorted, unique, tally_, items, stream);
      SOK_RETURN_IF_ERROR(ReadCount(&count, context));
      found = unique;
    }
    out->resize(count);
    SOK_RETURN_IF_ERROR(ToHost(out->data(), found, count * sizeof(int64_t), context));
    if (positions == nullptr) return Status::Ok();
    positions->resize(count);
    return ToHost(positions->data(), at, count * sizeof(int64_t), context);
  }

 private:
  static constexpr size_t kCountBytes = 2 * sizeof(unsigned long long);
  // The kept device counts and their pinned host copy.
  Status EnsureCounts() {
    if (tally_ != nullptr) return Status::Ok();
    void *device = nullptr, *host = nullptr;
    SOK_RETURN_IF_ERROR(Allocate(kCountBytes, &device));
    if (cudaMallocHost(&host, kCountBytes) != cudaSuccess) {
      Free(device);
      return Status::ResourceExhausted("tiered table: no pinned host memory for a count");
    }
    tally_ = static_cast<unsigned long long*>(device);
    tally_host_ = static_cast<unsigned long long*>(host);
    return Status::Ok();
  }
  // The first device count, read back with one wait.
  Status ReadCount(int64_t* count, const TableContext& context) {
    cudaMemcpyAsync(tally_host_, tally_, sizeof(unsigned long long), cudaMemcpyDeviceToHost,
                    static_cast<cudaStream_t>(context.stream));
    SOK_RETURN_IF_ERROR(Synchronize(context));
    *count = static_cast<int64_t>(tally_host_[0]);
    return Status::Ok();
  }
  static Status Synchronize(const TableContext& context) {
    cudaError_t error = cudaGetLastError();
    if (error == cudaSuccess) error = cudaStreamSynchronize(static_cast<cudaStream_t>(context.stream));
    if (error == cudaSuccess) return Status::Ok();
    return Status::Internal(std::string("tiered table: ") + cudaGetErrorString(error));
  }
  static Status CopyAndWait(void* to, const void* from, int64_t bytes, cudaMemcpyKind kind,
                            const TableContext& context) {
    if (bytes <= 0) return Status::Ok();
    const cudaStream_t stream = static_cast<cudaStream_t>(context.stream);
    cudaError_t error = cudaMemcpyAsync(to, from, static_cast<size_t>(bytes), kind, stream);
    if (error == cudaSuccess) error = cudaStreamSynchronize(stream);
    if (error == cudaSuccess) return Status::Ok();
    return Status::Internal(std::string("tiered table copy: ") + cudaGetErrorString(error));
  }
  std::shared_ptr<GpuMemory> memory_;
  unsigned long long* tally_ = nullptr;       // device
  unsigned long long* tally_host_ = nullptr;  // pinned
};

}  // namespace

std::unique_ptr<TierMemory> NewGpuTierMemory(std::shared_ptr<GpuMemory> memory) {
  return std::make_unique<GpuTierMemory>(std::move(memory));
}

}  // namespace sok
