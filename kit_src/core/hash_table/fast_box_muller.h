// The CPU's cos for Box-Muller's normal initial rows (table_math.h's InitialValue): libm's
// cos took three quarters of a new key's insert. Only for the angles Box-Muller gives it
// (a double in [0, 2 pi]): table-driven, worked in double to within an ulp of the exact value
// (checked against libm at all 2^24 angles), so a row rounded to float equals libm's and the
// GPU's but where the exact value lies within an ulp of a float rounding boundary (none in
// 16M values checked; tests/test_dynamic.py compares 320,000).
#pragma once

#include <cmath>
#include <cstdint>

namespace sok {

class FastBoxMuller {
 public:
  static const FastBoxMuller& Get() {
    static const FastBoxMuller tables;
    return tables;
  }

  // sqrt(-2 log u1) * cos(kTwoPi * u2), as InitialValue computes it.
  double Normal(double u1, double u2, double two_pi) const {
    return std::sqrt(-2.0 * std::log(u1)) * Cos(two_pi * u2);
  }

  // cos of x in [0, 2 pi]: x = k * step + t, |t| <= step / 2, step = 2 pi / kCosSteps, with
  // step split in two so that t is exact; cos x = cos(k step) cos t - sin(k step) sin t.
  double Cos(double x) const {
    const int k = static_cast<int>(x * inverse_step_ + 0.5);
    const double t = (x - k * step_high_) - k * step_low_;
    const double t2 = t * t;
    const double cos_t = 1.0 + t2 * (-1.0 / 2 + t2 * (1.0 / 24 + t2 * (-1.0 / 720 +
                                                                         t2 * (1.0 / 40320))));
    const double sin_t = t * (1.0 + t2 * (-1.0 / 6 + t2 * (1.0 / 120 + t2 * (-1.0 / 5040 +
                                                                            t2 * (1.0 / 362880)))));
    return cos_step_[k] * cos_t - sin_step_[k] * sin_t;
  }

 private:
  static constexpr int kCosSteps = 256;

  FastBoxMuller() {
    const long double two_pi = 2.0L * acosl(-1.0L);
    const long double step = two_pi / kCosSteps;
    step_high_ = static_cast<double>(static_cast<float>(step));  // k * step_high_ is exact
    step_low_ = static_cast<double>(step - step_high_);
    inverse_step_ = static_cast<double>(1.0L / step);
    for (int k = 0; k <= kCosSteps; ++k) {
      cos_step_[k] = static_cast<double>(cosl(k * step));
      sin_step_[k] = static_cast<double>(sinl(k * step));
      if (k % (kCosSteps / 4) == 0) {  // the axes exactly, so cos x near its zeros is -/+ sin t
        const int quadrant = k / (kCosSteps / 4);
        cos_step_[k] = quadrant % 2 ? 0.0 : (quadrant == 2 ? -1.0 : 1.0);
        sin_step_[k] = quadrant % 2 ? (quadrant == 1 ? 1.0 : -1.0) : 0.0;
      }
    }
  }

  double cos_step_[kCosSteps + 1];
  double sin_step_[kCosSteps + 1];
  double step_high_, step_low_, inverse_step_;
};

}  // namespace sok
