// GPU twin of interaction_kernels.cc: the same validation, the CUDA core on TF's stream.
#if GOOGLE_CUDA
#define EIGEN_USE_GPU
#include "kit_src/core/interaction/dot_interaction.cuh"
#include "kit_src/tf/kernels/interaction_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/util/gpu_kernel_helper.h"

namespace sok {

namespace tf = ::tensorflow;

namespace {

tf::Status FromCuda(cudaError_t error) {
  return error == cudaSuccess ? tf::Status()
                              : tf::errors::Internal("CUDA error: ", cudaGetErrorString(error));
}

}  // namespace

class DotInteractionGpuOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& features = ctx->input(0);
    InteractionShape shape;
    OP_REQUIRES_OK(ctx, ReadInteractionShape(features, &shape));
    tf::Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, tf::TensorShape({shape.batch, shape.output_width()}), &output));
    const cudaStream_t stream = ctx->eigen_gpu_device().stream();
    OP_REQUIRES_OK(ctx, FromCuda(DotInteractionForwardGpu(shape, features.flat<float>().data(),
                                                          output->flat<float>().data(), stream)));
  }
};
REGISTER_KERNEL_BUILDER(Name("Sok>DotInteraction").Device(tf::DEVICE_GPU), DotInteractionGpuOp);

class DotInteractionGradGpuOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& features = ctx->input(0);
    const tf::Tensor& grad = ctx->input(1);
    InteractionShape shape;
    OP_REQUIRES_OK(ctx, ReadInteractionShape(features, &shape));
    OP_REQUIRES_OK(ctx, CheckInteractionGrad(grad, shape));
    tf::Tensor* features_grad = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, features.shape(), &features_grad));
    const cudaStream_t stream = ctx->eigen_gpu_device().stream();
    OP_REQUIRES_OK(ctx, FromCuda(DotInteractionBackwardGpu(
                            shape, features.flat<float>().data(), grad.flat<float>().data(),
                            features_grad->flat<float>().data(), stream)));
  }
};
REGISTER_KERNEL_BUILDER(Name("Sok>DotInteractionGrad").Device(tf::DEVICE_GPU),
                        DotInteractionGradGpuOp);

}  // namespace sok
#endif  // GOOGLE_CUDA
