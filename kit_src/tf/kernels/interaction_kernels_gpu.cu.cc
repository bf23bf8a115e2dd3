// GPU functors of the dot interaction (interaction_functor.h): the CUDA core on TF's stream.
#include "kit_src/core/interaction/dot_interaction.cuh"
#include "kit_src/tf/kernels/gpu_op_util.h"
#include "kit_src/tf/kernels/interaction_functor.h"

namespace sok::functor {

namespace {

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
auto Cuda(T* p) {
  using C = typename CudaType<std::remove_const_t<T>>::type;
  return reinterpret_cast<std::conditional_t<std::is_const<T>::value, const C*, C*>>(p);
}

tf::Status InteractionStatus(cudaError_t error, const InteractionShape& shape) {
  if (error == cudaErrorInvalidValue) {
    return tf::errors::InvalidArgument(
        "dot interaction of ", shape.num_features, " features of dim ", shape.dim,
        " needs more shared memory per block than this GPU has");
  }
  return CudaToTf(error, "dot interaction");
}

}  // namespace

template <typename T>
tf::Status DotInteractionFwd<GpuDevice, T>::operator()(tf::OpKernelContext* ctx,
                                                       const InteractionShape& shape,
                                                       const T* features, T* output) {
  return InteractionStatus(
      DotInteractionForwardGpu(shape, Cuda(features), Cuda(output), GpuStream(ctx)), shape);
}

template <typename T>
tf::Status DotInteractionBwd<GpuDevice, T>::operator()(tf::OpKernelContext* ctx,
                                                       const InteractionShape& shape,
                                                       const T* features, const T* output_grad,
                                                       T* features_grad) {
  return InteractionStatus(DotInteractionBackwardGpu(shape, Cuda(features), Cuda(output_grad),
                                                     Cuda(features_grad), GpuStream(ctx)),
                           shape);
}

template struct DotInteractionFwd<GpuDevice, float>;
template struct DotInteractionFwd<GpuDevice, Eigen::half>;
template struct DotInteractionBwd<GpuDevice, float>;
template struct DotInteractionBwd<GpuDevice, Eigen::half>;

}  // namespace sok::functor
