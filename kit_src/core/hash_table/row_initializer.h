// Initial value of a dynamic table's row: a pure function of (seed, key, column), so every
// worker count, every run and both devices give a key the same initial row
// (table_math.h's InitialValue).
#pragma once

#include <cmath>
#include <cstdint>

#include "kit_src/core/hash_table/fast_box_muller.h"
#include "kit_src/core/hash_table/table_math.h"

namespace sok {

struct RowInitializer {
  enum class Kind { kNormal, kUniform, kConstant };
  Kind kind = Kind::kNormal;
  float a = 0.0f;     // normal: mean; uniform: lower bound; constant: the value
  float b = 0.05f;    // normal: standard deviation; uniform: upper bound
  uint64_t seed = 0;

  float Scale(double normal) const {
    return static_cast<float>(std::fma(static_cast<double>(b), normal, static_cast<double>(a)));
  }

  // Writes the initial row of `key` ([dim] floats).
  // Normal rows take FastBoxMuller's log and cos (libm's cost most of a new key's insert).
  void Fill(int64_t key, float* row, int64_t dim) const {
    if (kind != Kind::kNormal) {
      for (int64_t d = 0; d < dim; ++d) {
        row[d] = InitialValue(static_cast<InitKind>(kind), a, b, seed, key, d);
      }
      return;
    }
    const FastBoxMuller& box_muller = FastBoxMuller::Get();
    const uint64_t stream = InitialStream(seed, key);
    int64_t d = 0;
#ifdef __AVX2__
    for (; d + 4 <= dim; d += 4) {  // four columns at once
      alignas(32) double u1[4], u2[4], normal[4];
      for (int j = 0; j < 4; ++j) {
        const uint64_t bits = ColumnBits(stream, d + j);
        u1[j] = UnitInterval(bits);
        u2[j] = UnitInterval(MixBits(bits));
      }
      _mm256_store_pd(normal, box_muller.Normal4(_mm256_load_pd(u1), _mm256_load_pd(u2), kTwoPi));
      for (int j = 0; j < 4; ++j) row[d + j] = Scale(normal[j]);
    }
#endif
    for (; d < dim; ++d) {
      const uint64_t bits = ColumnBits(stream, d);
      row[d] = Scale(box_muller.Normal(UnitInterval(bits), UnitInterval(MixBits(bits)), kTwoPi));
    }
  }
};

}  // namespace sok
