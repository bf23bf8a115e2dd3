// A sparse optimizer rule chosen at run time: the op's rule name and its `hyper` vector
// (laid out as kRuleTable says, rule_table.h) become the rule's hyper-parameter struct, which
// the CPU apply kernels and the GPU sparse apply hand to ApplyRule.
#pragma once

#include <cstdint>
#include <string>
#include <tuple>

#include "kit_src/core/optimizers/rule_table.h"
#include "kit_src/core/optimizers/update_rules.h"
#include "kit_src/core/status.h"

namespace sok {

// Hyper-parameters each rule takes (its row of kRuleTable), or -1 for an unknown rule.
int64_t RuleHyperCount(const std::string& rule);

// kRuleTable as JSON ({rule: {"hyper": [...], "slots": [...], "last_slot_if": name or
// null}}), for Python to pack `hyper` and name the slots by (Sok>OptimizerRules).
std::string RuleTableJson();

// The rule's hyper-parameter struct from its floats h[0 .. RuleHyperCount), read by name
// through kRuleTable, on either side: the CPU kernels build it from host memory, the GPU
// kernels from device memory.
template <typename H>
SOK_HOST_DEVICE H MakeHyper(const float* h, bool nesterov);
template <>
SOK_HOST_DEVICE inline SgdHyper MakeHyper<SgdHyper>(const float* h, bool nesterov) {
  return SgdHyper{SOK_HYPER(h, "sgd", "lr"), SOK_HYPER(h, "sgd", "momentum"), nesterov};
}
template <>
SOK_HOST_DEVICE inline AdagradHyper MakeHyper<AdagradHyper>(const float* h, bool) {
  return AdagradHyper{SOK_HYPER(h, "adagrad", "lr"), SOK_HYPER(h, "adagrad", "epsilon"),
                      SOK_HYPER(h, "adagrad", "epsilon_inside_sqrt") != 0.0f};
}
template <>
SOK_HOST_DEVICE inline AdamHyper MakeHyper<AdamHyper>(const float* h, bool) {
  return AdamHyper{SOK_HYPER(h, "adam", "lr"), SOK_HYPER(h, "adam", "beta1"),
                   SOK_HYPER(h, "adam", "beta2"), SOK_HYPER(h, "adam", "epsilon")};
}
template <>
SOK_HOST_DEVICE inline AdamaxHyper MakeHyper<AdamaxHyper>(const float* h, bool) {
  return AdamaxHyper{SOK_HYPER(h, "adamax", "lr"), SOK_HYPER(h, "adamax", "beta1"),
                     SOK_HYPER(h, "adamax", "beta2"), SOK_HYPER(h, "adamax", "epsilon")};
}
template <>
SOK_HOST_DEVICE inline AdadeltaHyper MakeHyper<AdadeltaHyper>(const float* h, bool) {
  return AdadeltaHyper{SOK_HYPER(h, "adadelta", "lr"), SOK_HYPER(h, "adadelta", "rho"),
                       SOK_HYPER(h, "adadelta", "epsilon")};
}
template <>
SOK_HOST_DEVICE inline NadamHyper MakeHyper<NadamHyper>(const float* h, bool) {
  return NadamHyper{SOK_HYPER(h, "nadam", "lr"), SOK_HYPER(h, "nadam", "beta1"),
                    SOK_HYPER(h, "nadam", "beta2"), SOK_HYPER(h, "nadam", "epsilon"),
                    SOK_HYPER(h, "nadam", "momentum_now"), SOK_HYPER(h, "nadam", "momentum_next"),
                    SOK_HYPER(h, "nadam", "one_minus_schedule"),
                    SOK_HYPER(h, "nadam", "one_minus_schedule_next"),
                    SOK_HYPER(h, "nadam", "one_minus_beta2_power")};
}
template <>
SOK_HOST_DEVICE inline FtrlHyper MakeHyper<FtrlHyper>(const float* h, bool) {
  return FtrlHyper{SOK_HYPER(h, "ftrl", "lr"), SOK_HYPER(h, "ftrl", "lr_power"),
                   SOK_HYPER(h, "ftrl", "l1"), SOK_HYPER(h, "ftrl", "l2"),
                   SOK_HYPER(h, "ftrl", "l2_shrinkage")};
}
template <>
SOK_HOST_DEVICE inline RmspropHyper MakeHyper<RmspropHyper>(const float* h, bool) {
  return RmspropHyper{SOK_HYPER(h, "rmsprop", "lr"), SOK_HYPER(h, "rmsprop", "rho"),
                      SOK_HYPER(h, "rmsprop", "momentum"), SOK_HYPER(h, "rmsprop", "epsilon"),
                      SOK_HYPER(h, "rmsprop", "centered") != 0.0f,
                      SOK_HYPER(h, "rmsprop", "epsilon_inside_sqrt") != 0.0f};
}

// Every rule's hyper-parameter struct.
using RuleTypes = std::tuple<SgdHyper, AdagradHyper, AdamHyper, AdamaxHyper, AdadeltaHyper,
                             RmspropHyper, NadamHyper, FtrlHyper>;
static_assert(std::tuple_size<RuleTypes>::value == kNumRules,
              "every rule of kRuleTable needs its hyper-parameter struct in RuleTypes");

// Calls visit(H{}) for the H of Hs named `rule`; false when none is.
template <typename Visit, typename... Hs>
bool VisitNamed(const std::string& rule, Visit& visit, std::tuple<Hs...>*) {
  return ((rule == Hs::kRule ? (visit(Hs{}), true) : false) || ...);
}

// Calls visit(H{}) with a default-built struct of the rule's type: for code that picks the
// rule's kernels by type without reading its values (they may live in device memory).
template <typename Visit>
Status VisitRuleType(const std::string& rule, int64_t hyper_count, Visit&& visit) {
  const int64_t needed = RuleHyperCount(rule);
  if (needed < 0) return Status::InvalidArgument("unknown optimizer rule '" + rule + "'");
  if (hyper_count != needed) {
    return Status::InvalidArgument(rule + " takes " + std::to_string(needed) +
                                   " hyper-parameters, got " + std::to_string(hyper_count));
  }
  if (!VisitNamed(rule, visit, static_cast<RuleTypes*>(nullptr))) {
    return Status::Internal("optimizer rule '" + rule + "' has no hyper-parameter struct");
  }
  return Status::Ok();
}

// Calls visit(hyper) with the rule's hyper-parameter struct (SgdHyper, AdamHyper, ...) built
// from host floats h[0 .. hyper_count). Fails with InvalidArgument on an unknown rule or a
// hyper vector of the wrong length.
template <typename Visit>
Status VisitRule(const std::string& rule, const float* h, int64_t hyper_count, bool nesterov,
                 Visit&& visit) {
  return VisitRuleType(rule, hyper_count, [&](auto type) {
    visit(MakeHyper<decltype(type)>(h, nesterov));
  });
}

}  // namespace sok
