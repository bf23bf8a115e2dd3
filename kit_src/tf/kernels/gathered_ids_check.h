// Sok>GatherSingleIds' check output ([code, id, rows], a LookupCheck) and the error it names:
// shared by the CPU and GPU kernels of Sok>GatherSingleIds and Sok>CheckGatheredIds.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "kit_src/core/embedding/key_partition.h"
#include "kit_src/core/embedding/lookup_check.h"
#include "kit_src/tf/kernels/core_bridge.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace sok {

// The error a check record names: table of lookup BadGroup, id value_a, rows value_b.
inline ::tensorflow::Status GatheredIdsStatus(const LookupCheck& check,
                                              const std::vector<std::string>& table_names) {
  if (check.first_bad == kNoError) return ::tensorflow::Status();
  const int64_t l = BadGroup(check.first_bad);
  const std::string name = l < static_cast<int64_t>(table_names.size())
                               ? table_names[l] : "lookup " + std::to_string(l);
  return ToTfStatus(IdOutOfRange(name, check.value_a, check.value_b));
}

inline LookupCheck CleanCheck() { return LookupCheck{kNoError, 0, 0}; }

}  // namespace sok
