// The tiered table's view of GPU memory (tiered_table.h): allocations from the table's
// allocator, copies ordered on the call's stream and finished before returning.
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <utility>

#include "kit_src/core/gpu_memory.h"
#include "kit_src/core/hash_table/tiered_table.h"

namespace sok {
namespace {

class GpuTierMemory final : public TierMemory {
 public:
  explicit GpuTierMemory(std::shared_ptr<GpuMemory> memory) : memory_(std::move(memory)) {}
  bool is_host() const override { return false; }
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

 private:
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
};

}  // namespace

std::unique_ptr<TierMemory> NewGpuTierMemory(std::shared_ptr<GpuMemory> memory) {
  return std::make_unique<GpuTierMemory>(std::move(memory));
}

}  // namespace sok
