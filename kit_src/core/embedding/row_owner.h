// Which worker holds a row of a table, and at which local row: the placement rule every
// lookup, update and checkpoint follows (sparse_operation_kit/placement.py is its Python
// side). A localized table (owner >= 0) lives whole on its owner, rows at their own index.
// A distributed static table puts row r on worker r % N at local row r / N; a distributed
// dynamic table puts key k on worker uint64(k) % N (any int64 is a key).
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define SOK_ROW_OWNER_FN __host__ __device__ __forceinline__
#else
#define SOK_ROW_OWNER_FN inline
#endif

namespace sok {

// row: a valid (non-negative) row of a static table.
SOK_ROW_OWNER_FN int64_t StaticRowOwner(int64_t row, int32_t owner, int32_t num_workers) {
  return owner >= 0 ? owner : row % num_workers;
}

SOK_ROW_OWNER_FN int64_t StaticLocalRow(int64_t row, int32_t owner, int32_t num_workers) {
  return owner >= 0 ? row : row / num_workers;
}

SOK_ROW_OWNER_FN uint32_t DynamicKeyOwner(int64_t key, int32_t owner, int32_t num_workers) {
  return owner >= 0 ? static_cast<uint32_t>(owner)
                    : static_cast<uint32_t>(static_cast<uint64_t>(key) % num_workers);
}

// The most rows of a static table of `rows` any worker holds.
SOK_ROW_OWNER_FN int64_t MostLocalRows(int64_t rows, int32_t owner, int32_t num_workers) {
  return owner >= 0 ? rows : (rows + num_workers - 1) / num_workers;
}

// Bits to hold 0 .. values - 1 (0 for one value): the widths of the GPU's partition sort keys.
SOK_ROW_OWNER_FN int BitsToHold(uint64_t values) {
  int bits = 0;
  while (bits < 64 && (uint64_t{1} << bits) < values) ++bits;
  return bits;
}

}  // namespace sok

#undef SOK_ROW_OWNER_FN
