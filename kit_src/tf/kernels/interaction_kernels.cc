// The fused dot interaction's OpKernels, one per op for both devices: validate and allocate
// here, the device work in interaction_functor.h (CPU) / interaction_kernels_gpu.cu.cc (GPU).
#include "kit_src/tf/kernels/interaction_functor.h"
#include "kit_src/tf/kernels/interaction_kernels.h"
#include "kit_src/tf/kernels/pooled_output.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace sok {

namespace tf = ::tensorflow;

template <typename Device, typename T>
class DotInteractionOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& features = ctx->input(0);
    InteractionShape shape;
    OP_REQUIRES_OK(ctx, ReadInteractionShape(features, &shape));
    tf::Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, AllocateRowsOutput<Device>(
                            ctx, 0, tf::TensorShape({shape.batch, shape.output_width()}), &output));
    OP_REQUIRES_OK(ctx, (functor::DotInteractionFwd<Device, T>()(
                            ctx, shape, features.flat<T>().data(), output->flat<T>().data())));
  }
};

template <typename Device, typename T>
class DotInteractionGradOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& features = ctx->input(0);
    const tf::Tensor& grad = ctx->input(1);
    InteractionShape shape;
    OP_REQUIRES_OK(ctx, ReadInteractionShape(features, &shape));
    OP_REQUIRES_OK(ctx, CheckInteractionGrad(grad, shape));
    tf::Tensor* features_grad = nullptr;
    OP_REQUIRES_OK(ctx, AllocateRowsOutput<Device>(ctx, 0, features.shape(), &features_grad));
    OP_REQUIRES_OK(ctx, (functor::DotInteractionBwd<Device, T>()(
                            ctx, shape, features.flat<T>().data(), grad.flat<T>().data(),
                            features_grad->flat<T>().data())));
  }
};

#define REGISTER_INTERACTION(DEVICE_NAME, Tag, T)                                            \
  REGISTER_KERNEL_BUILDER(                                                                  \
      Name("Sok>DotInteraction").Device(tf::DEVICE_NAME).TypeConstraint<T>("T"),            \
      DotInteractionOp<Tag, T>);                                                            \
  REGISTER_KERNEL_BUILDER(                                                                  \
      Name("Sok>DotInteractionGrad").Device(tf::DEVICE_NAME).TypeConstraint<T>("T"),        \
      DotInteractionGradOp<Tag, T>)
REGISTER_INTERACTION(DEVICE_CPU, CpuDevice, float);
REGISTER_INTERACTION(DEVICE_CPU, CpuDevice, Eigen::half);
#if GOOGLE_CUDA
REGISTER_INTERACTION(DEVICE_GPU, GpuDevice, float);
REGISTER_INTERACTION(DEVICE_GPU, GpuDevice, Eigen::half);
#endif
#undef REGISTER_INTERACTION

}  // namespace sok
