// One op's GPU work as the core's orchestration sees it: the stream to enqueue on, and device
// scratch and pinned host memory that live until the stream has passed the op's work (the
// owner, TensorFlow's op in the plugin, keeps them until then). Lets the core run a step's
// device work, its single synchronisation included, without knowing who allocates.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kit_src/core/status.h"

namespace sok {

// Device scratch of `bytes` bytes for one call, or null when out of memory.
using DeviceAllocate = std::function<void*(size_t bytes)>;

inline Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return Status::Ok();
  return Status::Internal(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(error));
}

class GpuCall {
 public:
  virtual ~GpuCall() = default;
  virtual cudaStream_t stream() = 0;
  // The owner's allocator error (its own message) when memory runs out.
  virtual Status AllocateDevice(size_t bytes, void** out) = 0;
  virtual Status AllocatePinned(size_t bytes, void** out) = 0;

  template <typename T>
  Status Device(int64_t count, T** out) {
    return AllocateDevice(count * sizeof(T), reinterpret_cast<void**>(out));
  }
  template <typename T>
  Status Pinned(int64_t count, T** out) {
    return AllocatePinned(count * sizeof(T), reinterpret_cast<void**>(out));
  }
  // A device copy of a host array, staged through pinned memory (asynchronous).
  template <typename T>
  Status Upload(const std::vector<T>& host, T** device) {
    T* staged = nullptr;
    SOK_RETURN_IF_ERROR(Pinned(static_cast<int64_t>(host.size()), &staged));
    SOK_RETURN_IF_ERROR(Device(static_cast<int64_t>(host.size()), device));
    if (host.empty()) return Status::Ok();
    std::memcpy(staged, host.data(), host.size() * sizeof(T));
    return CudaStatus(cudaMemcpyAsync(*device, staged, host.size() * sizeof(T),
                                      cudaMemcpyHostToDevice, stream()),
                      "upload");
  }
  // Scratch for the core's CUDA functions that take a DeviceAllocate: null when memory runs
  // out, the allocator's error then kept in scratch_error().
  DeviceAllocate Scratch() {
    return [this](size_t bytes) -> void* {
      void* p = nullptr;
      const Status status = AllocateDevice(bytes, &p);
      if (status.ok()) return p;
      if (scratch_error_.ok()) scratch_error_ = status;
      return nullptr;
    };
  }
  const Status& scratch_error() const { return scratch_error_; }

 private:
  Status scratch_error_;
};

}  // namespace sok
