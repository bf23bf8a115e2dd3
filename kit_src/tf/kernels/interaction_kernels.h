// Validation shared by the CPU and GPU kernels of the dot interaction.
#pragma once

#include "kit_src/core/interaction/dot_interaction.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace sok {

// features must be [batch, F, D].
inline ::tensorflow::Status ReadInteractionShape(const ::tensorflow::Tensor& features,
                                                 InteractionShape* shape) {
  if (features.dims() != 3) {
    return ::tensorflow::errors::InvalidArgument("features must be [batch, features, dim], got ",
                                                 features.shape().DebugString());
  }
  if (features.dim_size(1) < 1) {
    return ::tensorflow::errors::InvalidArgument(
        "features must hold at least one vector per sample (the bottom MLP's output), got ",
        features.shape().DebugString());
  }
  *shape = InteractionShape{features.dim_size(0), features.dim_size(1), features.dim_size(2)};
  return ::tensorflow::Status();
}

// output_grad must be [batch, D + F(F-1)/2].
inline ::tensorflow::Status CheckInteractionGrad(const ::tensorflow::Tensor& grad,
                                                 const InteractionShape& shape) {
  if (grad.dims() != 2 || grad.dim_size(0) != shape.batch ||
      grad.dim_size(1) != shape.output_width()) {
    return ::tensorflow::errors::InvalidArgument("output_grad must be [", shape.batch, ", ",
                                                 shape.output_width(), "], got ",
                                                 grad.shape().DebugString());
  }
  return ::tensorflow::Status();
}

}  // namespace sok
