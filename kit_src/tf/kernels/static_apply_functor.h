// Sok>StaticApply's device work (TensorFlow's gather_functor.h pattern): the OpKernel in
// static_apply_kernels.cc checks the inputs, locks the variables and makes them writable once
// for both devices; a functor per device updates the touched rows (the group's layout:
// kit_src/core/optimizers/static_apply.h).
#pragma once

#include <functional>
#include "kit_src/core/optimizers/static_apply.h"
#include "kit_src/tf/kernels/device_tags.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace sok {

namespace functor {

template <typename Device>
struct StaticApply {
  // Calls finish with the verdict (an out-of-range id in any table: nothing written), now on
  // the CPU, once the stream has passed the check on the GPU.
  void operator()(::tensorflow::OpKernelContext* ctx, const StaticApplyGroup& args,
                  std::function<void(::tensorflow::Status)> finish);
  // dst = src, `bytes` of the device's memory (copy on write of a variable a reader holds).
  ::tensorflow::Status Copy(::tensorflow::OpKernelContext* ctx, void* dst, const void* src,
                            int64_t bytes);
};

}  // namespace functor
}  // namespace sok
