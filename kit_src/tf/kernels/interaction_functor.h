// The dot interaction's device work, one functor per device (TensorFlow's gather_functor.h
// pattern): the OpKernel in interaction_kernels.cc validates and allocates once for both.
#pragma once

#include "kit_src/core/interaction/dot_interaction.h"
#include "kit_src/tf/kernels/core_bridge.h"
#include "kit_src/tf/kernels/device_tags.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace sok {
namespace functor {

// features: [batch, F, D]; output: [batch, D + F(F-1)/2] (allocated, written here).
template <typename Device, typename T>
struct DotInteractionFwd {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* ctx,
                                  const InteractionShape& shape, const T* features, T* output);
};

// features_grad ([batch, F, D]) from the output gradient.
template <typename Device, typename T>
struct DotInteractionBwd {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* ctx,
                                  const InteractionShape& shape, const T* features,
                                  const T* output_grad, T* features_grad);
};

template <typename T>
struct DotInteractionFwd<CpuDevice, T> {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* ctx,
                                  const InteractionShape& shape, const T* features, T* output) {
    DotInteractionForward(shape, features, output, CpuParallelFor(ctx));
    return ::tensorflow::Status();
  }
};

template <typename T>
struct DotInteractionBwd<CpuDevice, T> {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* ctx,
                                  const InteractionShape& shape, const T* features,
                                  const T* output_grad, T* features_grad) {
    DotInteractionBackward(shape, features, output_grad, features_grad, CpuParallelFor(ctx));
    return ::tensorflow::Status();
  }
};

#if GOOGLE_CUDA
// Defined in interaction_kernels_gpu.cu.cc, for float and Eigen::half.
template <typename T>
struct DotInteractionFwd<GpuDevice, T> {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* ctx,
                                  const InteractionShape& shape, const T* features, T* output);
};
template <typename T>
struct DotInteractionBwd<GpuDevice, T> {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* ctx,
                                  const InteractionShape& shape, const T* features,
                                  const T* output_grad, T* features_grad);
};
#endif

}  // namespace functor
}  // namespace sok
