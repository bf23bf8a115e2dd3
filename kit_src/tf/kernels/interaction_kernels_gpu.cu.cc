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

// The CUDA core's element type for a TF one: Eigen::half and __half share their bits.
template <typename T>
struct CudaType {
  using type = T;
};
template <>
struct CudaType<Eigen::half> {
  using type = __half;
};

template <typename T>
const typename CudaType<T>::type* Device(const tf::Tensor& tensor) {
  return reinterpret_cast<const typename CudaType<T>::type*>(tensor.flat<T>().data());
}

template <typename T>
typename CudaType<T>::type* Device(tf::Tensor* tensor) {
  return reinterpret_cast<typename CudaType<T>::type*>(tensor->flat<T>().data());
}

}  // namespace

template <typename T>
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
    OP_REQUIRES_OK(ctx, FromCuda(DotInteractionForwardGpu(shape, Device<T>(features),
                                                          Device<T>(output), stream)));
  }
};

template <typename T>
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
    OP_REQUIRES_OK(ctx, FromCuda(DotInteractionBackwardGpu(shape, Device<T>(features),
                                                           Device<T>(grad),
                                                           Device<T>(features_grad), stream)));
  }
};

#define REGISTER_INTERACTION_GPU(T)                                                          \
  REGISTER_KERNEL_BUILDER(                                                                  \
      Name("Sok>DotInteraction").Device(tf::DEVICE_GPU).TypeConstraint<T>("T"),             \
      DotInteractionGpuOp<T>);                                                              \
  REGISTER_KERNEL_BUILDER(                                                                  \
      Name("Sok>DotInteractionGrad").Device(tf::DEVICE_GPU).TypeConstraint<T>("T"),         \
      DotInteractionGradGpuOp<T>)
REGISTER_INTERACTION_GPU(float);
REGISTER_INTERACTION_GPU(Eigen::half);
#undef REGISTER_INTERACTION_GPU

}  // namespace sok
#endif  // GOOGLE_CUDA
