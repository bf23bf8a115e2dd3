// What the GPU OpKernels share: TF's stream, device scratch and small host arrays uploaded
// through pinned memory (both from TensorFlow's allocators), and finishing an op once the
// stream has passed its checks (EventMgr: no host thread waits on the GPU). Compiled by nvcc.
#pragma once
#if GOOGLE_CUDA
#ifndef EIGEN_USE_GPU
#error "compile GPU OpKernels with EIGEN_USE_GPU defined (CMakeLists.txt does for CUDA sources)"
#endif

#include <cuda_runtime.h>

#include <cstring>
#include <functional>
#include <vector>

#include "kit_src/core/embedding/lookup_gpu.cuh"
#include "kit_src/core/gpu_memory.h"
#include "kit_src/core/optimizers/sparse_apply.cuh"
#include "tensorflow/core/common_runtime/device/device_event_mgr.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace sok {

namespace tf = ::tensorflow;  // for every GPU OpKernel source

inline cudaStream_t GpuStream(::tensorflow::OpKernelContext* ctx) {
  return ctx->eigen_gpu_device().stream();
}

inline ::tensorflow::Status CudaToTf(cudaError_t error, const char* what) {
  return error == cudaSuccess ? ::tensorflow::Status()
                              : ::tensorflow::errors::Internal("CUDA error in ", what, ": ",
                                                               cudaGetErrorString(error));
}

// Per-call memory of one GPU op: device scratch and pinned host buffers, held (and so kept
// from reuse) until the op finishes, after the stream has passed the work that uses them.
class GpuCallMemory {
 public:
  template <typename T>
  ::tensorflow::Status Device(::tensorflow::OpKernelContext* ctx, int64_t count, T** out) {
    return Allocate(ctx, count * sizeof(T), ::tensorflow::AllocatorAttributes(),
                    reinterpret_cast<void**>(out));
  }
  template <typename T>
  ::tensorflow::Status Pinned(::tensorflow::OpKernelContext* ctx, int64_t count, T** out) {
    ::tensorflow::AllocatorAttributes attr;
    attr.set_on_host(true);
    attr.set_gpu_compatible(true);
    return Allocate(ctx, count * sizeof(T), attr, reinterpret_cast<void**>(out));
  }
  // A device copy of a host array, staged through pinned memory (asynchronous).
  template <typename T>
  ::tensorflow::Status Upload(::tensorflow::OpKernelContext* ctx, const std::vector<T>& host,
                              T** device) {
    T* staged = nullptr;
    TF_RETURN_IF_ERROR(Pinned(ctx, host.size(), &staged));
    TF_RETURN_IF_ERROR(Device(ctx, host.size(), device));
    if (host.empty()) return ::tensorflow::Status();
    std::memcpy(staged, host.data(), host.size() * sizeof(T));
    return CudaToTf(cudaMemcpyAsync(*device, staged, host.size() * sizeof(T),
                                    cudaMemcpyHostToDevice, GpuStream(ctx)),
                    "upload");
  }

 private:
  ::tensorflow::Status Allocate(::tensorflow::OpKernelContext* ctx, int64_t bytes,
                                ::tensorflow::AllocatorAttributes attr, void** out) {
    buffers_.emplace_back();
    TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT8,
                                          ::tensorflow::TensorShape({std::max<int64_t>(bytes, 1)}),
                                          &buffers_.back(), attr));
    *out = buffers_.back().flat<int8_t>().data();
    return ::tensorflow::Status();
  }
  std::vector<::tensorflow::Tensor> buffers_;
};

// Memory for the core's GPU structures from the GPU device's TensorFlow allocator.
// TensorFlow's GPU kernels run on one compute stream, so memory freed while work on it is
// queued is safe to hand out again to later work (TensorFlow relies on the same for every
// tensor).
class TfGpuMemory : public GpuMemory {
 public:
  explicit TfGpuMemory(::tensorflow::Allocator* allocator) : allocator_(allocator) {}
  void* Allocate(size_t bytes) override {
    return allocator_->AllocateRaw(::tensorflow::Allocator::kAllocatorAlignment, bytes);
  }
  void Free(void* pointer) override { allocator_->DeallocateRaw(pointer); }

 private:
  ::tensorflow::Allocator* allocator_;
};

// Scratch of one GPU op as the DeviceAllocate the core's CUDA functions take.
inline DeviceAllocate ScratchFrom(::tensorflow::OpKernelContext* ctx, GpuCallMemory* memory) {
  return [ctx, memory](size_t bytes) -> void* {
    char* p = nullptr;
    return memory->Device(ctx, static_cast<int64_t>(bytes), &p).ok() ? p : nullptr;
  };
}

// A LookupCheck on the device and its pinned host copy.
struct GpuCheck {
  LookupCheck* device = nullptr;
  LookupCheck* host = nullptr;
  ::tensorflow::Status Init(::tensorflow::OpKernelContext* ctx, GpuCallMemory* memory) {
    TF_RETURN_IF_ERROR(memory->Device(ctx, 1, &device));
    TF_RETURN_IF_ERROR(memory->Pinned(ctx, 1, &host));
    return CudaToTf(ResetLookupCheck(device, GpuStream(ctx)), "reset check");
  }
  ::tensorflow::Status CopyToHost(::tensorflow::OpKernelContext* ctx) {
    return CudaToTf(cudaMemcpyAsync(host, device, sizeof(LookupCheck), cudaMemcpyDeviceToHost,
                                    GpuStream(ctx)),
                    "check copy");
  }
};

// Runs `then` on a TensorFlow thread once the op's stream has passed what was enqueued so
// far (EventMgr: no host thread waits on the GPU); `memory` lives until then.
inline void AfterStream(::tensorflow::OpKernelContext* ctx, std::shared_ptr<GpuCallMemory> memory,
                        std::function<void()> then) {
  auto* info = ctx->device()->tensorflow_accelerator_device_info();
  info->event_mgr->ThenExecute(ctx->op_device_context()->stream(),
                               [memory, then]() { then(); });
}

// Finishes an async GPU op once the stream has passed what was enqueued: `verdict` (reading
// pinned host copies) says whether the op failed.
inline void FinishAfterStream(::tensorflow::OpKernelContext* ctx,
                              ::tensorflow::AsyncOpKernel::DoneCallback done,
                              std::shared_ptr<GpuCallMemory> memory,
                              std::function<::tensorflow::Status()> verdict) {
  const cudaError_t launched = cudaGetLastError();
  if (launched != cudaSuccess) {
    ctx->SetStatus(CudaToTf(launched, ctx->op_kernel().name().c_str()));
    done();
    return;
  }
  AfterStream(ctx, std::move(memory), [ctx, done, verdict]() {
    ctx->SetStatus(verdict());
    done();
  });
}

// For an op that does not wait for its GPU work: keeps `memory` (its pinned staging buffers
// above all, which the host allocator would otherwise hand out again before the copies from
// them ran) until the stream has passed what was enqueued, without holding the op back.
inline ::tensorflow::Status ReleaseAfterStream(::tensorflow::OpKernelContext* ctx,
                                               std::shared_ptr<GpuCallMemory> memory) {
  TF_RETURN_IF_ERROR(CudaToTf(cudaGetLastError(), ctx->op_kernel().name().c_str()));
  AfterStream(ctx, std::move(memory), []() {});
  return ::tensorflow::Status();
}

}  // namespace sok

#endif  // GOOGLE_CUDA
