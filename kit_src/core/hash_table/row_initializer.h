// Initial value of a dynamic table's row: a pure function of (seed, key, column), so every
// worker count, every run and both devices give a key the same initial row
// (table_math.h's InitialValue).
#pragma once

#include <cstdint>

#include "kit_src/core/hash_table/table_math.h"

namespace sok {

struct RowInitializer {
  enum class Kind { kNormal, kUniform, kConstant };
  Kind kind = Kind::kNormal;
  float a = 0.0f;     // normal: mean; uniform: lower bound; constant: the value
  float b = 0.05f;    // normal: standard deviation; uniform: upper bound
  uint64_t seed = 0;

  // Writes the initial row of `key` ([dim] floats).
  void Fill(int64_t key, float* row, int64_t dim) const {
    for (int64_t d = 0; d < dim; ++d) {
      row[d] = InitialValue(static_cast<InitKind>(kind), a, b, seed, key, d);
    }
  }
};

}  // namespace sok
