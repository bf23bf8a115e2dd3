// A key sent to an owner: which table of the group (high 15 bits) and the row inside the
// owner's local shard (low 48 bits). One int64 per key keeps the all-to-all to one tensor.
#pragma once

#include <cstdint>

namespace sok {

constexpr int kPackedRowBits = 48;
constexpr int64_t kPackedRowMask = (int64_t{1} << kPackedRowBits) - 1;
constexpr int32_t kMaxTablesPerGroup = 1 << 15;
constexpr int64_t kMaxRowsPerShard = int64_t{1} << kPackedRowBits;

inline int64_t PackKey(int32_t table, int64_t local_row) {
  return (static_cast<int64_t>(table) << kPackedRowBits) | local_row;
}
inline int32_t PackedTable(int64_t key) { return static_cast<int32_t>(key >> kPackedRowBits); }
inline int64_t PackedRow(int64_t key) { return key & kPackedRowMask; }

}  // namespace sok
