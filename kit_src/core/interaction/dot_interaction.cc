#include "kit_src/core/interaction/dot_interaction.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "Eigen/Core"

namespace sok {
namespace {

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// One sample, in float: x [F, D] -> out [D + F(F-1)/2]. The Gram matrix x x^T is one small
// matrix product (Eigen's vectorised kernel); a plain dot-product loop cannot vectorise its
// sum without reordering it.
void ForwardSample(const float* x, int64_t f, int64_t dim, RowMajor* gram, float* out) {
  const Eigen::Map<const RowMajor> features(x, f, dim);
  gram->noalias() = features * features.transpose();
  std::memcpy(out, x, dim * sizeof(float));
  float* pair = out + dim;
  for (int64_t i = 1; i < f; ++i) {
    for (int64_t j = 0; j < i; ++j) *pair++ = (*gram)(i, j);
  }
}

// One sample, in float: x [F, D], grad [D + F(F-1)/2] -> dx [F, D] = S x with S the symmetric
// matrix of the pairs' gradients (zero diagonal), plus grad's first D values on row 0.
void BackwardSample(const float* x, const float* grad, int64_t f, int64_t dim, RowMajor* pairs,
                    float* dx) {
  pairs->setZero();
  const float* pair = grad + dim;
  for (int64_t i = 1; i < f; ++i) {
    for (int64_t j = 0; j < i; ++j) (*pairs)(i, j) = (*pairs)(j, i) = *pair++;
  }
  const Eigen::Map<const RowMajor> features(x, f, dim);
  Eigen::Map<RowMajor> out(dx, f, dim);
  out.noalias() = *pairs * features;
  for (int64_t d = 0; d < dim; ++d) dx[d] += grad[d];  // x[0] is copied to the output
}

// A sample's values as float: the input itself for float, else widened into `scratch`.
template <typename T>
const float* AsFloat(const T* values, int64_t n, std::vector<float>* scratch) {
  if constexpr (std::is_same_v<T, float>) {
    return values;
  } else {
    scratch->resize(n);
    for (int64_t k = 0; k < n; ++k) (*scratch)[k] = static_cast<float>(values[k]);
    return scratch->data();
  }
}

// Where a sample's float result goes: the output itself for float, else `scratch`, rounded
// into the output by Store.
template <typename T>
float* FloatOutput(T* output, int64_t n, std::vector<float>* scratch) {
  if constexpr (std::is_same_v<T, float>) {
    return output;
  } else {
    scratch->resize(n);
    return scratch->data();
  }
}

template <typename T>
void Store(const float* result, int64_t n, T* output) {
  if constexpr (!std::is_same_v<T, float>) {
    for (int64_t k = 0; k < n; ++k) output[k] = static_cast<T>(result[k]);
  }
}

}  // namespace

template <typename T>
void DotInteractionForward(const InteractionShape& shape, const T* features, T* output,
                           const ParallelFor& parallel_for) {
  const int64_t f = shape.num_features, dim = shape.dim, width = shape.output_width();
  parallel_for(shape.batch, shape.pairs() * dim * 2 + dim, [&](int64_t begin, int64_t end) {
    std::vector<float> x_scratch, out_scratch;
    RowMajor gram(f, f);
    for (int64_t b = begin; b < end; ++b) {
      const float* x = AsFloat(features + b * f * dim, f * dim, &x_scratch);
      float* out = FloatOutput(output + b * width, width, &out_scratch);
      ForwardSample(x, f, dim, &gram, out);
      Store(out, width, output + b * width);
    }
  });
}

template <typename T>
void DotInteractionBackward(const InteractionShape& shape, const T* features,
                            const T* output_grad, T* features_grad,
                            const ParallelFor& parallel_for) {
  const int64_t f = shape.num_features, dim = shape.dim, width = shape.output_width();
  parallel_for(shape.batch, shape.pairs() * dim * 4 + dim, [&](int64_t begin, int64_t end) {
    std::vector<float> x_scratch, grad_scratch, dx_scratch;
    RowMajor pairs(f, f);
    for (int64_t b = begin; b < end; ++b) {
      const float* x = AsFloat(features + b * f * dim, f * dim, &x_scratch);
      const float* grad = AsFloat(output_grad + b * width, width, &grad_scratch);
      float* dx = FloatOutput(features_grad + b * f * dim, f * dim, &dx_scratch);
      BackwardSample(x, grad, f, dim, &pairs, dx);
      Store(dx, f * dim, features_grad + b * f * dim);
    }
  });
}

template void DotInteractionForward<float>(const InteractionShape&, const float*, float*,
                                           const ParallelFor&);
template void DotInteractionForward<Eigen::half>(const InteractionShape&, const Eigen::half*,
                                                 Eigen::half*, const ParallelFor&);
template void DotInteractionBackward<float>(const InteractionShape&, const float*, const float*,
                                            float*, const ParallelFor&);
template void DotInteractionBackward<Eigen::half>(const InteractionShape&, const Eigen::half*,
                                                  const Eigen::half*, Eigen::half*,
                                                  const ParallelFor&);

}  // namespace sok
