#include "kit_src/core/optimizers/static_apply.h"

#include <algorithm>
#include <cstring>

#include "kit_src/core/embedding/key_partition.h"
#include "kit_src/core/optimizers/rule_by_name.h"
#include "kit_src/core/optimizers/sum_duplicates.h"

namespace sok {

Status CheckStaticApply(const StaticApplyGroup& group) {
  for (const StaticApplyTable& table : group.tables) {
    for (int64_t i = 0; i < table.n; ++i) {
      if (table.indices[i] < 0 || table.indices[i] >= table.rows) {
        return IdOutOfRange(table.name, table.indices[i], table.rows);
      }
    }
  }
  for (const StaticApplyTable& table : group.tables) {
    for (int64_t i = 0; table.grad_rows && i < table.n; ++i) {
      if (table.grad_rows[i] < 0 || table.grad_rows[i] >= table.grad_source_rows) {
        return Status::InvalidArgument(
            "gradient of table " + table.name + ": grad_rows[" + std::to_string(i) + "] = " +
            std::to_string(table.grad_rows[i]) + " is outside the " +
            std::to_string(table.grad_source_rows) + " rows of grads");
      }
    }
  }
  return Status::Ok();
}

Status CheckRuleFitsSlots(const StaticApplyGroup& group, int num_slots, bool hyper_on_host) {
  bool fits = true;
  const auto fit = [&](const auto& rule) {
    fits = RuleStateFloats(rule, group.dim) <= num_slots * group.dim;
  };
  SOK_RETURN_IF_ERROR(hyper_on_host ? VisitRule(group.rule, group.hyper, group.hyper_count,
                                                group.nesterov, fit)
                                    : VisitRuleType(group.rule, group.hyper_count, fit));
  if (fits) return Status::Ok();
  const std::string name = group.tables.empty() ? std::string() : group.tables[0].name;
  return Status::InvalidArgument(group.rule + " of table " + name +
                                 " needs more optimizer state than its " +
                                 std::to_string(num_slots) + " slots hold");
}

namespace {

// The rule on each unique row of one table: its state gathered slot after slot (the rule
// reads a row's state packed), updated, written back.
template <typename Rule>
void ApplyToRows(const StaticApplyTable& table, const std::vector<int64_t>& unique_rows,
                 const std::vector<float>& summed, int64_t dim, const Rule& rule,
                 const ParallelFor& parallel_for) {
  const int num_slots = static_cast<int>(table.slots.size());
  parallel_for(unique_rows.size(), dim * 16, [&](int64_t begin, int64_t end) {
    std::vector<float> state(num_slots * dim);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t row = unique_rows[i];
      for (int s = 0; s < num_slots; ++s) {
        std::memcpy(state.data() + s * dim, table.slots[s] + row * dim, dim * sizeof(float));
      }
      ApplyRule(table.table + row * dim, state.data(), summed.data() + i * dim, dim, rule);
      for (int s = 0; s < num_slots; ++s) {
        std::memcpy(table.slots[s] + row * dim, state.data() + s * dim, dim * sizeof(float));
      }
    }
  });
}

}  // namespace

Status StaticApplyOnHost(const StaticApplyGroup& group, const ParallelFor& parallel_for) {
  SOK_RETURN_IF_ERROR(CheckStaticApply(group));
  const int64_t dim = group.dim;
  return VisitRule(group.rule, group.hyper, group.hyper_count, group.nesterov,
                   [&](const auto& rule) {
    // Each table's duplicate ids summed, the tables in parallel (as separate ops would run).
    const int64_t count = static_cast<int64_t>(group.tables.size());
    std::vector<std::vector<int64_t>> unique_rows_of(count);
    std::vector<std::vector<float>> summed_of(count);
    int64_t uses = 0;
    for (const StaticApplyTable& table : group.tables) uses += table.n;
    parallel_for(count, std::max<int64_t>(1, uses / std::max<int64_t>(count, 1)) * dim,
                 [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const StaticApplyTable& table = group.tables[t];
        SumDuplicates(table.indices,
                      GradientUses{table.grads, table.grad_rows, table.grad_scales}, table.n,
                      dim, &unique_rows_of[t], &summed_of[t]);
      }
    });
    for (int64_t t = 0; t < count; ++t) {
      ApplyToRows(group.tables[t], unique_rows_of[t], summed_of[t], dim, rule, parallel_for);
    }
  });
}

}  // namespace sok
