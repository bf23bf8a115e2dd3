// What the GPU OpKernels share: TF's stream, the core's call context over TensorFlow's
// allocators, and finishing an op once the stream has passed its checks (EventMgr: no host
// thread waits on the GPU). Compiled by nvcc.
#pragma once
#if GOOGLE_CUDA
#ifndef EIGEN_USE_GPU
#error "compile GPU OpKernels with EIGEN_USE_GPU defined (CMakeLists.txt does for CUDA sources)"
#endif

#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <vector>

#include "kit_src/core/embedding/lookup_gpu.cuh"
#include "kit_src/core/gpu_call.h"
#include "kit_src/core/gpu_memory.h"
#include "kit_src/core/optimizers/sparse_apply.cuh"
#include "kit_src/tf/kernels/core_bridge.h"
#include "tensorflow/core/common_runtime/device/device_event_mgr.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace sok {

namespace tf = ::tensorflow;  // for every GPU OpKernel source

inline cudaStream_t GpuStream(::tensorflow::OpKernelContext* ctx) {
  return ctx->eigen_gpu_device().stream();
}

inline ::tensorflow::Status CudaToTf(cudaError_t error, const char* what) {
  return ToTfStatus(CudaStatus(error, what));
}

// One GPU op's call context for the core (gpu_call.h): TF's stream, device scratch and pinned
// host buffers from TensorFlow's allocators, held (and so kept from reuse) until the op
// finishes, after the stream has passed the work that uses them.
class GpuCallMemory : public GpuCall {
 public:
  explicit GpuCallMemory(::tensorflow::OpKernelContext* ctx) : ctx_(ctx) {}
  cudaStream_t stream() override { return GpuStream(ctx_); }
  Status AllocateDevice(size_t bytes, void** out) override {
    return Allocate(bytes, ::tensorflow::AllocatorAttributes(), out);
  }
  Status AllocatePinned(size_t bytes, void** out) override {
    ::tensorflow::AllocatorAttributes attr;
    attr.set_on_host(true);
    attr.set_gpu_compatible(true);
    return Allocate(bytes, attr, out);
  }

 private:
  Status Allocate(size_t bytes, ::tensorflow::AllocatorAttributes attr, void** out) {
    buffers_.emplace_back();
    const int64_t size = std::max<int64_t>(static_cast<int64_t>(bytes), 1);
    SOK_RETURN_IF_ERROR(ToCoreStatus(ctx_->allocate_temp(
        ::tensorflow::DT_INT8, ::tensorflow::TensorShape({size}), &buffers_.back(), attr)));
    *out = buffers_.back().flat<int8_t>().data();
    return Status::Ok();
  }
  ::tensorflow::OpKernelContext* ctx_;
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
