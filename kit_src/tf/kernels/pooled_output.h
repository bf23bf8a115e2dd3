// Large kernel outputs from sok::BlockPool instead of TensorFlow's CPU allocator.
//
// TensorFlow's CPU allocator hands large buffers back to the system when they are freed, so
// every step faults in and zeroes the pages of its pooled vectors, gathered rows and their
// gradients again. Outputs allocated here come from blocks the previous step used, already
// mapped. Small outputs still go through the context.
#pragma once

#include "kit_src/core/block_pool.h"
#include "kit_src/tf/kernels/device_tags.h"
#include "tensorflow/core/framework/allocator.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace sok {

class PooledAllocator : public ::tensorflow::Allocator {
 public:
  std::string Name() override { return "sok_pooled"; }
  void* AllocateRaw(size_t /*alignment: blocks are page aligned*/, size_t num_bytes) override {
    return SharedBlockPool().Take(num_bytes);
  }
  void DeallocateRaw(void* ptr) override { SharedBlockPool().Give(ptr); }

  static PooledAllocator* Get() {
    static PooledAllocator* allocator = new PooledAllocator();  // lives as long as the process
    return allocator;
  }
};

// Below this size the context's allocator is as fast: its small blocks stay mapped.
constexpr int64_t kMinPooledOutputBytes = int64_t{256} << 10;

// Like ctx->allocate_output, with large outputs from PooledAllocator. Contents are
// unspecified: the kernel must write every element.
inline ::tensorflow::Status AllocatePooledOutput(::tensorflow::OpKernelContext* ctx, int index,
                                                 const ::tensorflow::TensorShape& shape,
                                                 ::tensorflow::Tensor** output) {
  const ::tensorflow::DataType dtype = ctx->expected_output_dtype(index);
  const int64_t bytes = shape.num_elements() * ::tensorflow::DataTypeSize(dtype);
  if (bytes < kMinPooledOutputBytes) return ctx->allocate_output(index, shape, output);
  ::tensorflow::Tensor tensor(PooledAllocator::Get(), dtype, shape);
  if (!tensor.IsInitialized()) {
    return ::tensorflow::errors::ResourceExhausted("out of memory allocating ", bytes,
                                                   " bytes for output ", index, " of ",
                                                   ctx->op_kernel().name());
  }
  ctx->set_output(index, tensor);
  *output = ctx->mutable_output(index);
  return ::tensorflow::Status();
}

// An output of rows on the op's device: pooled blocks on the CPU (above), TensorFlow's GPU
// allocator on a GPU.
template <typename Device>
::tensorflow::Status AllocateRowsOutput(::tensorflow::OpKernelContext* ctx, int index,
                                        const ::tensorflow::TensorShape& shape,
                                        ::tensorflow::Tensor** output) {
  if (kOnGpu<Device>) return ctx->allocate_output(index, shape, output);
  return AllocatePooledOutput(ctx, index, shape, output);
}

}  // namespace sok
