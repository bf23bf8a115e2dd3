#include "kit_src/core/interaction/dot_interaction.h"

#include <algorithm>
#include <cstring>

namespace sok {
namespace {

float Dot(const float* a, const float* b, int64_t dim) {
  float total = 0.0f;
  for (int64_t d = 0; d < dim; ++d) total += a[d] * b[d];
  return total;
}

}  // namespace

void DotInteractionForward(const InteractionShape& shape, const float* features, float* output,
                           const ParallelFor& parallel_for) {
  const int64_t f = shape.num_features, dim = shape.dim, width = shape.output_width();
  parallel_for(shape.batch, shape.pairs() * dim * 2 + dim, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const float* x = features + b * f * dim;
      float* out = output + b * width;
      std::memcpy(out, x, dim * sizeof(float));
      float* pair = out + dim;
      for (int64_t i = 1; i < f; ++i) {
        for (int64_t j = 0; j < i; ++j) *pair++ = Dot(x + i * dim, x + j * dim, dim);
      }
    }
  });
}

void DotInteractionBackward(const InteractionShape& shape, const float* features,
                            const float* output_grad, float* features_grad,
                            const ParallelFor& parallel_for) {
  const int64_t f = shape.num_features, dim = shape.dim, width = shape.output_width();
  parallel_for(shape.batch, shape.pairs() * dim * 4 + dim, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const float* x = features + b * f * dim;
      const float* grad = output_grad + b * width;
      float* dx = features_grad + b * f * dim;
      std::memcpy(dx, grad, dim * sizeof(float));  // x[0] is copied to the output
      std::fill(dx + dim, dx + f * dim, 0.0f);
      const float* pair = grad + dim;
      for (int64_t i = 1; i < f; ++i) {
        for (int64_t j = 0; j < i; ++j) {
          const float g = *pair++;
          const float* xi = x + i * dim;
          const float* xj = x + j * dim;
          float* dxi = dx + i * dim;
          float* dxj = dx + j * dim;
          for (int64_t d = 0; d < dim; ++d) {
            dxi[d] += g * xj[d];
            dxj[d] += g * xi[d];
          }
        }
      }
    }
  });
}

}  // namespace sok
