// One definition of each sparse optimizer's row update, shared by every table kind and device.
// Each rule updates one row in place: `w` the value, `state` the optimizer state stored after
// it, `g` the row's gradient (duplicates already summed), `dim` floats each. The formulas are
// those of the Keras optimizers (tf.keras.optimizers.legacy and the new ones), applied to the
// touched rows only. Every rule is an ApplyRule overload on its hyper-parameter struct, so
// code holding only the struct (the kernels, templated on it) picks the rule by type; kRule
// names the rule as the ops and kRuleTable (rule_table.h) do.
#pragma once

#include <cmath>
#include <cstdint>

namespace sok {

struct SgdHyper {
  static constexpr const char* kRule = "sgd";  // its name in kRuleTable
  float lr = 0.01f;
  float momentum = 0.0f;  // state: dim floats of velocity when > 0
  bool nesterov = false;
};

struct AdagradHyper {
  static constexpr const char* kRule = "adagrad";
  float lr = 0.001f;
  float epsilon = 1e-7f;  // state: dim floats of accumulator, starting at initial_accumulator
  bool epsilon_inside_sqrt = false;  // Keras 3-style: g / sqrt(acc + eps); legacy: sqrt(acc) + eps
};

struct AdamHyper {
  static constexpr const char* kRule = "adam";
  float lr = 0.001f;       // already bias-corrected: lr * sqrt(1 - beta2^t) / (1 - beta1^t)
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-7f;   // state: m (dim floats) then v (dim floats)
};

struct AdamaxHyper {
  static constexpr const char* kRule = "adamax";
  float lr = 0.001f;       // already bias-corrected: lr / (1 - beta1^t)
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-7f;   // state: m (dim floats) then u, the weighted infinity norm
};

struct AdadeltaHyper {
  static constexpr const char* kRule = "adadelta";
  float lr = 0.001f;
  float rho = 0.95f;
  float epsilon = 1e-7f;   // state: accumulated squared gradients, then squared updates
};

struct RmspropHyper {
  static constexpr const char* kRule = "rmsprop";
  float lr = 0.001f;
  float rho = 0.9f;
  float momentum = 0.0f;   // state: mean square, momentum, then (centered) mean gradient
  float epsilon = 1e-7f;
  bool centered = false;   // normalise by the variance estimate ms - mg^2 instead of ms
  bool epsilon_inside_sqrt = false;  // without momentum: new Keras sqrt(ms + eps); legacy
                                     // sqrt(ms) + eps (with momentum both take it inside)
};

struct NadamHyper {
  static constexpr const char* kRule = "nadam";
  float lr = 0.001f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-7f;
  float momentum_now = 0.0f;      // m_t of Keras' momentum schedule for this step
  float momentum_next = 0.0f;     // m_{t+1}
  float one_minus_schedule = 1.0f;       // 1 - prod of m_1..m_t
  float one_minus_schedule_next = 1.0f;  // 1 - prod of m_1..m_{t+1}
  float one_minus_beta2_power = 1.0f;    // 1 - beta2^t; state: m, then v
};

struct FtrlHyper {
  static constexpr const char* kRule = "ftrl";
  float lr = 0.001f;
  float lr_power = -0.5f;
  float l1 = 0.0f;
  float l2 = 0.0f;            // already includes beta / (2 lr)
  float l2_shrinkage = 0.0f;  // state: accumulator (starts at initial_accumulator), then linear
};

#if defined(__CUDACC__)
#define SOK_HOST_DEVICE __host__ __device__
#else
#define SOK_HOST_DEVICE
#endif

SOK_HOST_DEVICE inline void ApplyRule(float* w, float* state, const float* g, int64_t dim,
                                      const SgdHyper& h) {
  if (h.momentum == 0.0f) {
    for (int64_t d = 0; d < dim; ++d) w[d] -= h.lr * g[d];
    return;
  }
  for (int64_t d = 0; d < dim; ++d) {
    const float velocity = h.momentum * state[d] - h.lr * g[d];
    state[d] = velocity;
    w[d] += h.nesterov ? h.momentum * velocity - h.lr * g[d] : velocity;
  }
}

SOK_HOST_DEVICE inline void ApplyRule(float* w, float* state, const float* g, int64_t dim,
                                      const AdagradHyper& h) {
  for (int64_t d = 0; d < dim; ++d) {
    state[d] += g[d] * g[d];
    const float denominator = h.epsilon_inside_sqrt ? std::sqrt(state[d] + h.epsilon)
                                                    : std::sqrt(state[d]) + h.epsilon;
    w[d] -= h.lr * g[d] / denominator;
  }
}

// Adam's moving averages of the gradient (m, stored at state[d]) and of its square (v, at
// state[dim + d]), updated with g and returned.
struct Moments {
  float m, v;
};
SOK_HOST_DEVICE inline Moments UpdateMoments(float beta1, float beta2, float g, float* state,
                                             int64_t dim, int64_t d) {
  float& m = state[d];
  float& v = state[dim + d];
  m = beta1 * m + (1.0f - beta1) * g;
  v = beta2 * v + (1.0f - beta2) * g * g;
  return Moments{m, v};
}

SOK_HOST_DEVICE inline void ApplyRule(float* w, float* state, const float* g, int64_t dim,
                                      const AdamHyper& h) {
  for (int64_t d = 0; d < dim; ++d) {
    const Moments moments = UpdateMoments(h.beta1, h.beta2, g[d], state, dim, d);
    w[d] -= h.lr * moments.m / (std::sqrt(moments.v) + h.epsilon);
  }
}

SOK_HOST_DEVICE inline void ApplyRule(float* w, float* state, const float* g, int64_t dim,
                                      const AdamaxHyper& h) {
  float* m = state;
  float* u = state + dim;
  for (int64_t d = 0; d < dim; ++d) {
    m[d] = h.beta1 * m[d] + (1.0f - h.beta1) * g[d];
    u[d] = std::fmax(h.beta2 * u[d], std::fabs(g[d]));
    w[d] -= h.lr * m[d] / (u[d] + h.epsilon);
  }
}

SOK_HOST_DEVICE inline void ApplyRule(float* w, float* state, const float* g, int64_t dim,
                                      const AdadeltaHyper& h) {
  float* accum = state;
  float* accum_update = state + dim;
  for (int64_t d = 0; d < dim; ++d) {
    accum[d] = h.rho * accum[d] + (1.0f - h.rho) * g[d] * g[d];
    const float update =
        std::sqrt(accum_update[d] + h.epsilon) / std::sqrt(accum[d] + h.epsilon) * g[d];
    accum_update[d] = h.rho * accum_update[d] + (1.0f - h.rho) * update * update;
    w[d] -= h.lr * update;
  }
}

// Keras' RMSprop forms, with s = ms (or ms - mg^2 when centered): without momentum
// w -= lr g / (sqrt(s) + eps) (legacy) or lr g / sqrt(s + eps) (new Keras); with momentum
// mom = momentum mom + lr g / sqrt(s + eps), w -= mom.
SOK_HOST_DEVICE inline void ApplyRule(float* w, float* state, const float* g, int64_t dim,
                                      const RmspropHyper& h) {
  float* ms = state;
  float* mom = state + dim;
  float* mg = state + 2 * dim;
  for (int64_t d = 0; d < dim; ++d) {
    ms[d] = h.rho * ms[d] + (1.0f - h.rho) * g[d] * g[d];
    float s = ms[d];
    if (h.centered) {
      mg[d] = h.rho * mg[d] + (1.0f - h.rho) * g[d];
      s -= mg[d] * mg[d];
    }
    if (h.momentum == 0.0f) {
      const float denominator =
          h.epsilon_inside_sqrt ? std::sqrt(s + h.epsilon) : std::sqrt(s) + h.epsilon;
      w[d] -= h.lr * g[d] / denominator;
    } else {
      mom[d] = h.momentum * mom[d] + h.lr * g[d] / std::sqrt(s + h.epsilon);
      w[d] -= mom[d];
    }
  }
}

SOK_HOST_DEVICE inline void ApplyRule(float* w, float* state, const float* g, int64_t dim,
                                      const NadamHyper& h) {
  for (int64_t d = 0; d < dim; ++d) {
    const Moments moments = UpdateMoments(h.beta1, h.beta2, g[d], state, dim, d);
    const float m_bar = (1.0f - h.momentum_now) * g[d] / h.one_minus_schedule +
                        h.momentum_next * moments.m / h.one_minus_schedule_next;
    w[d] -= h.lr * m_bar / (std::sqrt(moments.v / h.one_minus_beta2_power) + h.epsilon);
  }
}

// TensorFlow's (sparse) FTRL-proximal, V2 when l2_shrinkage > 0.
SOK_HOST_DEVICE inline void ApplyRule(float* w, float* state, const float* g, int64_t dim,
                                      const FtrlHyper& h) {
  float* accum = state;
  float* linear = state + dim;
  for (int64_t d = 0; d < dim; ++d) {
    const float shrunk = g[d] + 2.0f * h.l2_shrinkage * w[d];
    const float new_accum = accum[d] + g[d] * g[d];
    const float power_new = h.lr_power == -0.5f ? std::sqrt(new_accum)
                                                : std::pow(new_accum, -h.lr_power);
    const float power_old = h.lr_power == -0.5f ? std::sqrt(accum[d])
                                                : std::pow(accum[d], -h.lr_power);
    linear[d] += shrunk - (power_new - power_old) / h.lr * w[d];
    const float quadratic = power_new / h.lr + 2.0f * h.l2;
    const float l1_sign = linear[d] > 0.0f ? h.l1 : -h.l1;
    w[d] = std::fabs(linear[d]) > h.l1 ? (l1_sign - linear[d]) / quadratic : 0.0f;
    accum[d] = new_accum;
  }
}

// Floats of state per row each rule reads and writes: a table's state_dim must hold at least
// this many, or the rule would read state that is not there.
SOK_HOST_DEVICE inline int64_t RuleStateFloats(const SgdHyper& h, int64_t dim) {
  return h.momentum != 0.0f ? dim : 0;
}
SOK_HOST_DEVICE inline int64_t RuleStateFloats(const AdagradHyper&, int64_t dim) { return dim; }
SOK_HOST_DEVICE inline int64_t RuleStateFloats(const AdamHyper&, int64_t dim) { return 2 * dim; }
SOK_HOST_DEVICE inline int64_t RuleStateFloats(const AdamaxHyper&, int64_t dim) { return 2 * dim; }
SOK_HOST_DEVICE inline int64_t RuleStateFloats(const AdadeltaHyper&, int64_t dim) { return 2 * dim; }
SOK_HOST_DEVICE inline int64_t RuleStateFloats(const RmspropHyper& h, int64_t dim) {
  return (h.centered ? 3 : h.momentum != 0.0f ? 2 : 1) * dim;
}
SOK_HOST_DEVICE inline int64_t RuleStateFloats(const NadamHyper&, int64_t dim) { return 2 * dim; }
SOK_HOST_DEVICE inline int64_t RuleStateFloats(const FtrlHyper&, int64_t dim) { return 2 * dim; }

}  // namespace sok
