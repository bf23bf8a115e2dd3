// The CPU's log and cos for Box-Muller's normal initial rows (table_math.h's InitialValue):
// libm's took most of a new key's insert. Only for the arguments Box-Muller gives them (log:
// a double in (0, 1); cos: a double in [0, 2 pi]): table-driven, inline, four columns at
// once with AVX2, worked in double to within an ulp or two of the exact value (checked against
// libm at all 2^24 radii and angles), so a row rounded to float equals libm's and the GPU's
// but where the exact value lies within a few double ulps of a float rounding boundary (none
// in 16M values checked; tests/dynamic/test_dynamic.py compares 320,000).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace sok {

class FastBoxMuller {
 public:
  static const FastBoxMuller& Get() {
    static const FastBoxMuller tables;
    return tables;
  }

  // sqrt(-2 log u1) * cos(kTwoPi * u2), as InitialValue computes it.
  double Normal(double u1, double u2, double two_pi) const {
    return std::sqrt(-2.0 * Log(u1)) * Cos(two_pi * u2);
  }

#ifdef __AVX2__
  // Normal() of four (u1, u2) pairs at once: the same steps.
  __m256d Normal4(__m256d u1, __m256d u2, double two_pi) const {
    return _mm256_mul_pd(_mm256_sqrt_pd(_mm256_mul_pd(_mm256_set1_pd(-2.0), Log4(u1))),
                         Cos4(_mm256_mul_pd(_mm256_set1_pd(two_pi), u2)));
  }

  // table[k] of four indices: scalar loads (AMD's gathers are slower than four loads).
  static __m256d Lookup4(const double* table, __m128i k) {
    alignas(16) int32_t index[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(index), k);
    return _mm256_set_pd(table[index[3]], table[index[2]], table[index[1]], table[index[0]]);
  }

  __m256d Log4(__m256d u) const {
    const __m256i bits = _mm256_castpd_si256(u);
    const __m256i mantissa = _mm256_and_si256(bits, _mm256_set1_epi64x((int64_t{1} << 52) - 1));
    const __m256i upper = _mm256_cmpgt_epi64(mantissa, _mm256_set1_epi64x(kSqrt2Mantissa));
    const __m256i exponent = _mm256_sub_epi64(_mm256_set1_epi64x(int64_t{1023} << 52),
                                              _mm256_and_si256(upper, _mm256_set1_epi64x(int64_t{1} << 52)));
    const __m256d f = _mm256_castsi256_pd(_mm256_or_si256(mantissa, exponent));
    // e + 1024 (upper is -1 where set) as a double, by the 2^52 trick (0 <= e + 1024 < 2^52).
    const __m256i biased = _mm256_sub_epi64(_mm256_add_epi64(_mm256_srli_epi64(bits, 52),
                                                             _mm256_set1_epi64x(1)), upper);
    const __m256d two52 = _mm256_set1_pd(4503599627370496.0);
    const __m256d e = _mm256_sub_pd(
        _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(biased, _mm256_castpd_si256(two52))),
                      two52),
        _mm256_set1_pd(1024.0));
    const __m128i k = _mm256_cvttpd_epi32(
        _mm256_add_pd(_mm256_mul_pd(f, _mm256_set1_pd(kLogSteps)), _mm256_set1_pd(0.5)));
    const __m256d c = _mm256_mul_pd(_mm256_cvtepi32_pd(k), _mm256_set1_pd(1.0 / kLogSteps));
    const __m256d r = _mm256_mul_pd(_mm256_sub_pd(f, c), Lookup4(inverse_c_, k));
    __m256d series = _mm256_set1_pd(1.0 / 7);
    for (const double coefficient : {1.0 / 6, 1.0 / 5, 1.0 / 4, 1.0 / 3, 1.0 / 2}) {
      series = _mm256_sub_pd(_mm256_set1_pd(coefficient), _mm256_mul_pd(r, series));
    }
    series = _mm256_sub_pd(r, _mm256_mul_pd(_mm256_mul_pd(r, r), series));
    const __m256d low = _mm256_add_pd(_mm256_mul_pd(e, _mm256_set1_pd(kLn2Low)), series);
    return _mm256_add_pd(_mm256_mul_pd(e, _mm256_set1_pd(kLn2High)),
                         _mm256_add_pd(Lookup4(log_c_, k), low));
  }

  __m256d Cos4(__m256d x) const {
    const __m128i k = _mm256_cvttpd_epi32(_mm256_add_pd(
        _mm256_mul_pd(x, _mm256_set1_pd(inverse_step_)), _mm256_set1_pd(0.5)));
    const __m256d kd = _mm256_cvtepi32_pd(k);
    const __m256d t = _mm256_sub_pd(_mm256_sub_pd(x, _mm256_mul_pd(kd, _mm256_set1_pd(step_high_))),
                                    _mm256_mul_pd(kd, _mm256_set1_pd(step_low_)));
    const __m256d t2 = _mm256_mul_pd(t, t);
    __m256d cos_t = _mm256_set1_pd(1.0 / 40320), sin_t = _mm256_set1_pd(1.0 / 362880);
    for (const double coefficient : {-1.0 / 720, 1.0 / 24, -1.0 / 2, 1.0}) {
      cos_t = _mm256_add_pd(_mm256_set1_pd(coefficient), _mm256_mul_pd(t2, cos_t));
    }
    for (const double coefficient : {-1.0 / 5040, 1.0 / 120, -1.0 / 6, 1.0}) {
      sin_t = _mm256_add_pd(_mm256_set1_pd(coefficient), _mm256_mul_pd(t2, sin_t));
    }
    sin_t = _mm256_mul_pd(t, sin_t);
    return _mm256_sub_pd(_mm256_mul_pd(Lookup4(cos_step_, k), cos_t),
                         _mm256_mul_pd(Lookup4(sin_step_, k), sin_t));
  }
#endif

  // log u for a normal double u in (0, 1): u = 2^e f with f in [sqrt(1/2), sqrt(2)), f = c
  // (1 + r) with c = k / 128 the nearest table point (f - c is exact), log u = e ln 2 + log c
  // + log1p(r), |r| < 2^-7.5, log1p by its series to r^7. Near u = 1, e = 0 and c = 1: no
  // cancellation.
  double Log(double u) const {
    uint64_t bits;
    std::memcpy(&bits, &u, sizeof(bits));
    const uint64_t mantissa = bits & ((uint64_t{1} << 52) - 1);
    const bool upper = mantissa > kSqrt2Mantissa;  // f >= sqrt(2): halve it
    const uint64_t f_bits = mantissa | (upper ? uint64_t{1022} << 52 : uint64_t{1023} << 52);
    double f;
    std::memcpy(&f, &f_bits, sizeof(f));
    const double e = static_cast<double>(static_cast<int64_t>(bits >> 52) - 1023 + upper);
    const int k = static_cast<int>(f * kLogSteps + 0.5);
    const double r = (f - k * (1.0 / kLogSteps)) * inverse_c_[k];
    const double series =
        r - r * r * (1.0 / 2 - r * (1.0 / 3 - r * (1.0 / 4 - r * (1.0 / 5 -
                                                   r * (1.0 / 6 - r * (1.0 / 7))))));
    return e * kLn2High + (log_c_[k] + (e * kLn2Low + series));
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
  static constexpr int kLogSteps = 128;
  // The mantissa bits of sqrt(2) and ln 2 split so that e * kLn2High is exact (|e| < 2^11).
  static constexpr uint64_t kSqrt2Mantissa = 0x6a09e667f3bcdull;
  static constexpr double kLn2High = 0.693145751953125;  // 22 bits
  static constexpr double kLn2Low = 1.4286068203094173e-06;

  FastBoxMuller() {
    for (int k = kLogSteps / 2; k <= 2 * kLogSteps; ++k) {
      const long double c = static_cast<long double>(k) / kLogSteps;
      log_c_[k] = static_cast<double>(logl(c));
      inverse_c_[k] = static_cast<double>(1.0L / c);
    }
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

  double log_c_[2 * kLogSteps + 1] = {};
  double inverse_c_[2 * kLogSteps + 1] = {};
  double cos_step_[kCosSteps + 1];
  double sin_step_[kCosSteps + 1];
  double step_high_, step_low_, inverse_step_;
};

}  // namespace sok
