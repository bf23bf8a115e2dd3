// Before a sparse optimizer update each touched row must appear once: the gradients of
// duplicate keys are summed, as TF's own sparse optimizers do.
#pragma once

#include <cstdint>
#include <vector>

namespace sok {

// The gradient of use i: values row i, or (rows set) scales[i] * values row rows[i].
struct GradientUses {
  const float* values = nullptr;
  const int64_t* rows = nullptr;
  const float* scales = nullptr;
};

// unique_keys: the distinct keys in first-seen order; summed: [unique, dim] their gradients.
void SumDuplicates(const int64_t* keys, const GradientUses& grads, int64_t n, int64_t dim,
                   std::vector<int64_t>* unique_keys, std::vector<float>* summed);

}  // namespace sok
