#include "kit_src/core/hash_table/row_initializer.h"

#include <cmath>

namespace sok {
namespace {

// SplitMix64: a well-mixed 64-bit hash, so consecutive keys give independent streams.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in (0, 1): 24 random bits, never exactly 0 (log is taken of it).
float Unit(uint64_t bits) { return (static_cast<float>(bits >> 40) + 0.5f) / 16777216.0f; }

}  // namespace

void RowInitializer::Fill(int64_t key, float* row, int64_t dim) const {
  if (kind == Kind::kConstant) {
    for (int64_t d = 0; d < dim; ++d) row[d] = a;
    return;
  }
  const uint64_t stream = Mix(seed ^ Mix(static_cast<uint64_t>(key)));
  for (int64_t d = 0; d < dim; ++d) {
    const uint64_t bits = Mix(stream + static_cast<uint64_t>(d) * 0x632be59bd9b4e019ULL);
    if (kind == Kind::kUniform) {
      row[d] = a + (b - a) * Unit(bits);
    } else {  // Box-Muller on two halves of fresh bits
      const float u1 = Unit(bits), u2 = Unit(Mix(bits));
      row[d] = a + b * std::sqrt(-2.0f * std::log(u1)) * std::cos(6.28318530718f * u2);
    }
  }
}

}  // namespace sok
