// CPU kernels of the fused dot interaction: validate, allocate, call the core.
#include "kit_src/tf/kernels/core_bridge.h"
#include "kit_src/tf/kernels/interaction_kernels.h"
#include "kit_src/tf/kernels/pooled_output.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace sok {

namespace tf = ::tensorflow;

template <typename T>
class DotInteractionOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& features = ctx->input(0);
    InteractionShape shape;
    OP_REQUIRES_OK(ctx, ReadInteractionShape(features, &shape));
    tf::Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, AllocatePooledOutput(
                            ctx, 0, tf::TensorShape({shape.batch, shape.output_width()}), &output));
    DotInteractionForward(shape, features.flat<T>().data(), output->flat<T>().data(),
                          CpuParallelFor(ctx));
  }
};

template <typename T>
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
    OP_REQUIRES_OK(ctx, AllocatePooledOutput(ctx, 0, features.shape(), &features_grad));
    DotInteractionBackward(shape, features.flat<T>().data(), grad.flat<T>().data(),
                           features_grad->flat<T>().data(), CpuParallelFor(ctx));
  }
};

#define REGISTER_INTERACTION(T)                                                              \
  REGISTER_KERNEL_BUILDER(                                                                  \
      Name("Sok>DotInteraction").Device(tf::DEVICE_CPU).TypeConstraint<T>("T"),             \
      DotInteractionOp<T>);                                                                 \
  REGISTER_KERNEL_BUILDER(                                                                  \
      Name("Sok>DotInteractionGrad").Device(tf::DEVICE_CPU).TypeConstraint<T>("T"),         \
      DotInteractionGradOp<T>)
REGISTER_INTERACTION(float);
REGISTER_INTERACTION(Eigen::half);
#undef REGISTER_INTERACTION

}  // namespace sok
