// Sok>StaticApply's update of a group of static tables (dense [rows, dim] arrays and their
// optimizer slots) at the touched rows only: the layout both devices share, and the host's
// update (duplicates summed first, sum_duplicates.h; the rule by name, rule_by_name.h). The
// GPU twin is SparseApplyGroupGpuAsync (sparse_apply.cuh).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kit_src/core/parallel.h"
#include "kit_src/core/status.h"

namespace sok {

// One table of an update and its gradient: its slots fit the rule and the shapes agree (the
// caller checks); the ids are checked before anything is written.
struct StaticApplyTable {
  std::string name;              // for the out-of-range error
  float* table = nullptr;        // [rows, dim], the device's memory
  std::vector<float*> slots;     // each [rows, dim]: the rule's state, section after section
  int64_t rows = 0;
  const int64_t* indices = nullptr;  // [n]
  const float* grads = nullptr;      // [n, dim], or [grad_source_rows, dim] with grad_rows
  int64_t n = 0;
  // Optional: index i's gradient is grad_scales[i] * grads row grad_rows[i] (a pooled
  // lookup's output gradient read in place).
  const int64_t* grad_rows = nullptr;  // [n]
  const float* grad_scales = nullptr;  // [n]
  int64_t grad_source_rows = 0;
};

// One update of a group of tables of one width, by one rule.
struct StaticApplyGroup {
  std::string rule;
  const float* hyper = nullptr;  // the device's memory (the GPU kernels read it there)
  int64_t hyper_count = 0;
  bool nesterov = false;
  int64_t dim = 0;
  std::vector<StaticApplyTable> tables;
  bool validate = true;  // false: the GPU skips the check (and its wait for the stream)
};

// The first index outside its table, or gradient row outside its gradient, of any table.
Status CheckStaticApply(const StaticApplyGroup& group);

// Fails, naming the group's first table, when the rule needs more state than num_slots slots
// of group.dim floats hold (it would read past them). With hyper_on_host the rule's values
// decide (a momentum of 0 needs no slot); otherwise (they stay in device memory) its type.
Status CheckRuleFitsSlots(const StaticApplyGroup& group, int num_slots, bool hyper_on_host);

// The update on the host: checked first (nothing is written on bad input), each table's
// duplicate ids summed (the tables in parallel), then the rule on each unique row.
Status StaticApplyOnHost(const StaticApplyGroup& group, const ParallelFor& parallel_for);

}  // namespace sok
