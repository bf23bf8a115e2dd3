// Sok>StaticApply's device work (TensorFlow's gather_functor.h pattern): the OpKernel in
// static_apply_kernels.cc checks the inputs, locks the variables and makes them writable once
// for both devices; a functor per device updates the touched rows.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "kit_src/tf/kernels/device_tags.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace sok {

// One table of an update and its gradient, checked: its slots fit the rule and the shapes
// agree; the ids are checked by the functor (before anything is written).
struct StaticApplyTableArgs {
  std::string name;              // for the out-of-range error
  float* table = nullptr;        // [rows, dim], the device's memory
  std::vector<float*> slots;     // each [rows, dim]: the rule's state, section after section
  int64_t rows = 0;
  const int64_t* indices = nullptr;  // [n]
  const float* grads = nullptr;      // [n, dim], or [grad_source_rows, dim] with grad_rows
  int64_t n = 0;
  // Optional: index i's gradient is grad_scales[i] * grads row grad_rows[i] (a pooled
  // lookup's output gradient read in place).
  const int64_t* grad_rows = nullptr;  // [n]
  const float* grad_scales = nullptr;  // [n]
  int64_t grad_source_rows = 0;
};

// One update of a group of tables of one width, by one rule.
struct StaticApplyArgs {
  std::string rule;
  const float* hyper = nullptr;  // the device's memory (the GPU kernels read it there)
  int64_t hyper_count = 0;
  bool nesterov = false;
  int64_t dim = 0;
  std::vector<StaticApplyTableArgs> tables;
  bool validate = true;  // false: the GPU skips the check (and its wait for the stream)
};

namespace functor {

template <typename Device>
struct StaticApply {
  // Calls finish with the verdict (an out-of-range id in any table: nothing written), now on
  // the CPU, once the stream has passed the check on the GPU.
  void operator()(::tensorflow::OpKernelContext* ctx, const StaticApplyArgs& args,
                  std::function<void(::tensorflow::Status)> finish);
  // dst = src, `bytes` of the device's memory (copy on write of a variable a reader holds).
  ::tensorflow::Status Copy(::tensorflow::OpKernelContext* ctx, void* dst, const void* src,
                            int64_t bytes);
};

}  // namespace functor
}  // namespace sok
