// DLRM's dot interaction, fused: for each sample of features x ([num_features, dim], row 0 the
// bottom MLP's output) the output is x[0] followed by the dot products x[i] . x[j] for every
// pair i > j, in row-major order of the lower triangle: (1,0), (2,0), (2,1), (3,0), ...
// Output width: dim + num_features * (num_features - 1) / 2.
#pragma once

#include <cstdint>

#include "kit_src/core/parallel.h"

namespace sok {

struct InteractionShape {
  int64_t batch = 0;
  int64_t num_features = 0;  // F, the bottom MLP output included
  int64_t dim = 0;           // D
  int64_t pairs() const { return num_features * (num_features - 1) / 2; }
  int64_t output_width() const { return dim + pairs(); }
};

// T is float or Eigen::half; half inputs are widened per sample and every dot product is
// accumulated in float, then rounded once.

// features: [batch, F, D]; output: [batch, D + F(F-1)/2]. Host memory.
template <typename T>
void DotInteractionForward(const InteractionShape& shape, const T* features, T* output,
                           const ParallelFor& parallel_for);

// output_grad: [batch, D + F(F-1)/2]; features_grad: [batch, F, D] (overwritten).
template <typename T>
void DotInteractionBackward(const InteractionShape& shape, const T* features,
                            const T* output_grad, T* features_grad,
                            const ParallelFor& parallel_for);

}  // namespace sok
