// What the op registrations share: TensorFlow's op registry and shape inference, with the
// names their shape functions use, in sok::op_defs (kept apart from the core's sok::Status).
#pragma once

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace sok {
namespace op_defs {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

}  // namespace op_defs
}  // namespace sok
