// GPU functor of Sok>StaticApply (static_apply_functor.h): kit_src/core/optimizers/
// sparse_apply.cu on TensorFlow's stream, the Keras slot variables as the rule's state
// sections. An id outside the table is found on the device, nothing is written, and the op
// fails once the stream has passed the check (no host thread waits); with validate=false
// (ids lookup_sparse checked) the op neither checks nor waits.
#if GOOGLE_CUDA
#define EIGEN_USE_GPU  // before any Eigen header: the GPU device
#include <memory>

#include "kit_src/core/embedding/key_partition.h"
#include "kit_src/core/optimizers/sparse_apply.cuh"
#include "kit_src/tf/kernels/core_bridge.h"
#include "kit_src/tf/kernels/gpu_op_util.h"
#include "kit_src/tf/kernels/static_apply_functor.h"

namespace sok {
namespace functor {
namespace tf = ::tensorflow;

template <>
void StaticApply<GpuDevice>::operator()(tf::OpKernelContext* ctx, const StaticApplyArgs& args,
                                        std::function<void(tf::Status)> finish) {
  SparseApplyTable target;
  target.values = args.table;
  target.rows = args.rows;
  target.dim = args.dim;
  target.num_slots = static_cast<int>(args.slots.size());
  target.state_dim = target.num_slots * args.dim;
  for (int s = 0; s < target.num_slots; ++s) target.slots[s] = args.slots[s];
  auto memory = std::make_shared<GpuCallMemory>();
  GpuCheck check;
  tf::Status status = args.validate ? check.Init(ctx, memory.get()) : tf::Status();
  if (!status.ok()) return finish(status);
  tf::Status allocation;
  const DeviceAllocate allocate = [&](size_t bytes) -> void* {
    char* p = nullptr;
    tf::Status s = memory->Device(ctx, bytes, &p);
    if (!s.ok()) allocation = s;
    return s.ok() ? p : nullptr;
  };
  const cudaError_t launched = SparseApplyGpuAsync(
      args.rule, args.hyper, args.hyper_count, args.nesterov, target,
      SparseGradient{args.indices, args.grads, args.n, args.grad_rows, args.grad_scales,
                     args.grad_source_rows},
      allocate, check.device, GpuStream(ctx));
  if (!allocation.ok()) return finish(allocation);
  status = CudaToTf(launched, "sparse apply");
  // Ids checked by the caller: done once enqueued, nothing waits for the stream.
  if (!args.validate) return finish(status.ok() ? ReleaseAfterStream(ctx, memory) : status);
  if (status.ok()) status = check.CopyToHost(ctx);
  if (!status.ok()) return finish(status);
  const LookupCheck* host = check.host;
  const std::string name = args.table_name;
  const int64_t rows = args.rows;
  AfterStream(ctx, memory, [host, name, rows, finish]() {
    finish(host->first_bad == kNoError ? tf::Status()
                                       : ToTfStatus(IdOutOfRange(name, host->value_a, rows)));
  });
}

template <>
tf::Status StaticApply<GpuDevice>::Copy(tf::OpKernelContext* ctx, void* dst, const void* src,
                                        int64_t bytes) {
  return CudaToTf(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, GpuStream(ctx)),
                  "copy on write");
}

}  // namespace functor
}  // namespace sok
#endif  // GOOGLE_CUDA
