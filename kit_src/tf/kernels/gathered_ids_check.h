// Sok>GatherSingleIds' check output ([code, id, rows], a LookupCheck) and the error it names:
// shared by both devices' work of Sok>GatherSingleIds and Sok>CheckGatheredIds.
#pragma once

#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "kit_src/core/embedding/key_partition.h"
#include "kit_src/core/embedding/lookup_check.h"
#include "kit_src/tf/kernels/core_bridge.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace sok {

// The error a check record names: for lookup BadGroup, an id value_a outside the value_b rows
// of its table, or (Sok>PoolFromTables) row splits [value_a, ..., value_b] that do not start at
// 0 and end at its ids' count, or that decrease at sample BadItem.
inline ::tensorflow::Status GatheredIdsStatus(const LookupCheck& check,
                                              const std::vector<std::string>& table_names) {
  if (check.first_bad == kNoError) return ::tensorflow::Status();
  const int64_t l = BadGroup(check.first_bad);
  const std::string name = l < static_cast<int64_t>(table_names.size())
                               ? table_names[l] : "lookup " + std::to_string(l);
  switch (BadKindOf(check.first_bad)) {
    case BadKind::kRowSplitsEnds:
      return ::tensorflow::errors::InvalidArgument(
          "lookup ", l, ": row_splits must start at 0 and end at its number of ids, got [",
          check.value_a, ", ..., ", check.value_b, "]");
    case BadKind::kRowSplitsDecrease:
      return ::tensorflow::errors::InvalidArgument("lookup ", l, ": row_splits decrease at sample ",
                                                   BadItem(check.first_bad));
    default:
      return ToTfStatus(IdOutOfRange(name, check.value_a, check.value_b));
  }
}

inline LookupCheck CleanCheck() { return LookupCheck{kNoError, 0, 0}; }

// The out-of-range error a deferred Sok>CheckGatheredIds found on the GPU, waiting for the
// next deferred check to raise it (the first one found; later ones are dropped until then).
class DeferredIdError {
 public:
  static void Record(const ::tensorflow::Status& status) {
    std::lock_guard<std::mutex> lock(mutex());
    if (pending().ok()) pending() = status;
  }
  static bool Pending() {
    std::lock_guard<std::mutex> lock(mutex());
    return !pending().ok();
  }
  // The pending error, cleared; OK when there is none.
  static ::tensorflow::Status Take() {
    std::lock_guard<std::mutex> lock(mutex());
    ::tensorflow::Status status = pending();
    pending() = ::tensorflow::Status();
    return status;
  }

 private:
  static std::mutex& mutex() {
    static std::mutex* m = new std::mutex();
    return *m;
  }
  static ::tensorflow::Status& pending() {
    static ::tensorflow::Status* status = new ::tensorflow::Status();
    return *status;
  }
};

}  // namespace sok
