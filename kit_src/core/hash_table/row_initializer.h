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
    for (int64_t d = 0; d < dim; ++d) {
      const uint64_t bits = ColumnBits(stream, d);
      const double normal =
          box_muller.Normal(UnitInterval(bits), UnitInterval(MixBits(bits)), kTwoPi);
      row[d] = static_cast<float>(std::fma(static_cast<double>(b), normal, static_cast<double>(a)));
    }
  }
};

}  // namespace sok
