// CPU kernels of the fused dot interaction: validate, allocate, call the core.
#include "kit_src/core/interaction/dot_interaction.h"
#include "kit_src/tf/kernels/core_bridge.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace sok {

namespace tf = ::tensorflow;

namespace {

tf::Status ReadShape(const tf::Tensor& features, InteractionShape* shape) {
  if (features.dims() != 3) {
    return tf::errors::InvalidArgument("features must be [batch, features, dim], got ",
                                       features.shape().DebugString());
  }
  shape->batch = features.dim_size(0);
  shape->num_features = features.dim_size(1);
  shape->dim = features.dim_size(2);
  return tf::Status();
}

}  // namespace

class DotInteractionOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& features = ctx->input(0);
    InteractionShape shape;
    OP_REQUIRES_OK(ctx, ReadShape(features, &shape));
    tf::Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, tf::TensorShape({shape.batch, shape.output_width()}), &output));
    DotInteractionForward(shape, features.flat<float>().data(), output->flat<float>().data(),
                          CpuParallelFor(ctx));
  }
};
REGISTER_KERNEL_BUILDER(Name("Sok>DotInteraction").Device(tf::DEVICE_CPU), DotInteractionOp);

class DotInteractionGradOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& features = ctx->input(0);
    const tf::Tensor& grad = ctx->input(1);
    InteractionShape shape;
    OP_REQUIRES_OK(ctx, ReadShape(features, &shape));
    OP_REQUIRES(ctx, grad.dims() == 2 && grad.dim_size(0) == shape.batch &&
                         grad.dim_size(1) == shape.output_width(),
                tf::errors::InvalidArgument("output_grad must be [", shape.batch, ", ",
                                            shape.output_width(), "], got ",
                                            grad.shape().DebugString()));
    tf::Tensor* features_grad = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, features.shape(), &features_grad));
    DotInteractionBackward(shape, features.flat<float>().data(), grad.flat<float>().data(),
                           features_grad->flat<float>().data(), CpuParallelFor(ctx));
  }
};
REGISTER_KERNEL_BUILDER(Name("Sok>DotInteractionGrad").Device(tf::DEVICE_CPU), DotInteractionGradOp);

}  // namespace sok
