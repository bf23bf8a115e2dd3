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
  Status ScatterRows(float* out, const std::vector<int64_t>& positions,
                     const std::vector<float>& rows, int64_t dim,
                     const TableContext& context) override {
    const int64_t count = static_cast<int64_t>(positions.size());
    if (count == 0) return Status::Ok();
    void *at = nullptr, *from = nullptr;
    Status status = Allocate(count * sizeof(int64_t), &at);
    if (status.ok()) status = Allocate(rows.size() * sizeof(float), &from);
    if (status.ok()) status = FromHost(at, positions.data(), count * sizeof(int64_t), context);
    if (status.ok()) status = FromHost(from, rows.data(), rows.size() * sizeof(float), context);
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
    constexpr size_t kBytes = 2 * sizeof(unsigned long long);
    if (tally_ == nullptr) {  // kept: a device pair and its pinned host copy
      void *device = nullptr, *host = nullptr;
      SOK_RETURN_IF_ERROR(Allocate(kBytes, &device));
      if (cudaMallocHost(&host, kBytes) != cudaSuccess) {
        Free(device);
        return Status::ResourceExhausted("tiered table: no pinned host memory for a count");
      }
      tally_ = static_cast<unsigned long long*>(device);
      tally_host_ = static_cast<unsigned long long*>(host);
    }
    cudaMemsetAsync(tally_, 0, kBytes, stream);
    TallyFlags<<<std::min(GridBlocks(keys.n, kTallyThreads), 1024), kTallyThreads, 0, stream>>>(
        keys, flags, tally_);
    cudaMemcpyAsync(tally_host_, tally_, kBytes, cudaMemcpyDeviceToHost, stream);
    SOK_RETURN_IF_ERROR(Synchronize(context));
    *selected = static_cast<int64_t>(tally_host_[0]);
    *flagged = static_cast<int64_t>(tally_host_[1]);
    return Status::Ok();
  }

 private:
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
