// The record of the first bad input a GPU kernel of the lookup chain found (device memory,
// read by the host once the stream has passed it), how it is encoded, and the CPU kernels'
// error message each record names. CUDA-free, so the CPU kernels that pass records along
// (Sok>GatherSingleIds' check output) share it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kit_src/core/status.h"

#if defined(__CUDACC__)
#define SOK_CHECK_HOST_DEVICE __host__ __device__
#else
#define SOK_CHECK_HOST_DEVICE
#endif

namespace sok {

// What went wrong first, as the kernels found it. Device memory; `first_bad` starts at
// kNoError and takes the smallest encoded item (EncodeBad) any check found bad.
struct LookupCheck {
  unsigned long long first_bad;
  int64_t value_a;  // described after the checks: the bad id, position or row_splits entry
  int64_t value_b;  // and a second value where the message needs one
};
constexpr unsigned long long kNoError = ~0ull;

// What a check found, in the order the CPU kernels check it.
enum class BadKind : int {
  kPositionsLeft = 0,   // more ids than positions left: value_a = nnz, value_b = positions left
                        // (group = num_lookups: the ids' total, value_a, is not the positions')
  kRowSplitsEnds,       // row_splits[0] != 0: value_a = row_splits[0], value_b = row_splits[batch]
  kRowSplitsDecrease,   // row_splits[s + 1] < row_splits[s]: item = s
  kWeightsCount,        // weights of another length than the ids: value_a = nnz
  kBadPosition,         // a position outside [0, num_rows): item = use, value_a = position
  kBadKey,              // a packed key naming no row: item = key index, value_a = key
  kBadId,               // an id outside its table: item = id index, value_a = id
};
// (group, kind, item) in one comparable word: the group (a lookup or table) first.
SOK_CHECK_HOST_DEVICE inline unsigned long long EncodeBad(int64_t group, BadKind kind, int64_t item) {
  return (static_cast<unsigned long long>(group) << 44) |
         (static_cast<unsigned long long>(kind) << 40) | static_cast<unsigned long long>(item);
}
SOK_CHECK_HOST_DEVICE inline int64_t BadGroup(unsigned long long code) { return static_cast<int64_t>(code >> 44); }
SOK_CHECK_HOST_DEVICE inline BadKind BadKindOf(unsigned long long code) { return static_cast<BadKind>((code >> 40) & 15); }
SOK_CHECK_HOST_DEVICE inline int64_t BadItem(unsigned long long code) {
  return static_cast<int64_t>(code & ((1ull << 40) - 1));
}

static_assert(sizeof(LookupCheck) == 3 * sizeof(int64_t), "a check travels as int64[3]");

inline LookupCheck CleanCheck() { return LookupCheck{kNoError, 0, 0}; }

// The error a gather's record names (Sok>GatherSingleIds, Sok>PoolFromTables): for lookup
// BadGroup, an id value_a outside the value_b rows of its table (named by table_names where
// it has the lookup), or row splits [value_a, ..., value_b] that do not start at 0 and end at
// its ids' count, or that decrease at sample BadItem.
Status GatheredIdsStatus(const LookupCheck& check, const std::vector<std::string>& table_names);

// The error a combine's or a shard-row gather's record names: positions into num_rows rows, or
// packed keys into num_tables local shards.
Status PooledCheckStatus(const LookupCheck& check, int64_t num_rows, int32_t num_tables);

// PooledCheckStatus of a combine op whose lookups have weight_counts weights each: a weights
// count that does not match its ids, or a total of ids other than the positions', named too.
Status CombineCheckStatus(const LookupCheck& check, int64_t num_rows, int32_t num_tables,
                          const std::vector<int64_t>& weight_counts);

// The first error a deferred check found on the GPU, waiting for the next deferred check to
// raise it (later ones are dropped until then). One per process, as the ids' steps are.
class DeferredIdError {
 public:
  static void Record(const Status& status);
  static bool Pending();
  static Status Take();  // the pending error, cleared; OK when there is none
};

}  // namespace sok
