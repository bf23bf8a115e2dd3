// Initial value of a dynamic table's row: a pure function of (seed, key, column), so every
// worker count and every run gives a key the same initial row.
#pragma once

#include <cstdint>
#include <string>

#include "kit_src/core/status.h"

namespace sok {

struct RowInitializer {
  enum class Kind { kNormal, kUniform, kConstant };
  Kind kind = Kind::kNormal;
  float a = 0.0f;     // normal: mean; uniform: lower bound; constant: the value
  float b = 0.05f;    // normal: standard deviation; uniform: upper bound
  uint64_t seed = 0;

  // Writes the initial row of `key` ([dim] floats).
  void Fill(int64_t key, float* row, int64_t dim) const;
};

}  // namespace sok
