// Small helpers over the CUDA runtime shared by the core's GPU code.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "kit_src/core/status.h"

namespace sok {

// A CUDA runtime result as the core's Status.
inline Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return Status::Ok();
  return Status::Internal(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(error));
}

// Makes `device` current for a scope (streams, events and NCCL calls act on the current device).
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    cudaGetDevice(&previous_);
    if (previous_ != device) cudaSetDevice(device);
  }
  ~ScopedDevice() { cudaSetDevice(previous_); }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace sok
