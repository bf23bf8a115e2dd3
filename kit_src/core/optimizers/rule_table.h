// The sparse optimizer rules by name, as the apply ops take them (Sok>DynamicApply,
// Sok>StaticApply): each rule's hyper-parameters in the order of the ops' `hyper` vector, and
// its optimizer state, one section of dim floats per Keras slot, stored after the row in this
// order. One table for both sides: MakeHyper (rule_by_name.h) reads `hyper` through it, and
// Python packs `hyper` and names the slots through it (Sok>OptimizerRules hands it over).
#pragma once

#include <cstdint>

namespace sok {

constexpr int kMaxRuleHypers = 9;
constexpr int kMaxRuleSlots = 3;

struct RuleSpec {
  const char* name;
  const char* hypers[kMaxRuleHypers];  // the fields of the rule's hyper struct
  const char* slots[kMaxRuleSlots];
  // The hyper-parameter whose value decides whether the last slot is kept (SGD keeps a
  // velocity only with momentum, RMSprop a mean gradient only when centered), or null.
  const char* last_slot_if;
};

constexpr RuleSpec kRuleTable[] = {
    {"sgd", {"lr", "momentum"}, {"momentum"}, "momentum"},
    {"adagrad", {"lr", "epsilon", "epsilon_inside_sqrt"}, {"accumulator"}, nullptr},
    {"adam", {"lr", "beta1", "beta2", "epsilon"}, {"m", "v"}, nullptr},
    {"adamax", {"lr", "beta1", "beta2", "epsilon"}, {"m", "v"}, nullptr},
    {"adadelta", {"lr", "rho", "epsilon"}, {"accum_grad", "accum_var"}, nullptr},
    {"rmsprop",
     {"lr", "rho", "momentum", "epsilon", "centered", "epsilon_inside_sqrt"},
     {"rms", "momentum", "mg"},
     "centered"},
    {"nadam",
     {"lr", "beta1", "beta2", "epsilon", "momentum_now", "momentum_next", "one_minus_schedule",
      "one_minus_schedule_next", "one_minus_beta2_power"},
     {"m", "v"},
     nullptr},
    {"ftrl", {"lr", "lr_power", "l1", "l2", "l2_shrinkage"}, {"accumulator", "linear"}, nullptr},
};

constexpr int kNumRules = sizeof(kRuleTable) / sizeof(kRuleTable[0]);

constexpr bool SameName(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) {
    ++a;
    ++b;
  }
  return *a == *b;
}

// The rule's row of kRuleTable, or -1.
constexpr int RuleIndex(const char* rule) {
  for (int r = 0; r < kNumRules; ++r) {
    if (SameName(kRuleTable[r].name, rule)) return r;
  }
  return -1;
}

// Where a rule's hyper-parameter sits in `hyper`, or -1.
constexpr int HyperIndex(const char* rule, const char* hyper) {
  const int r = RuleIndex(rule);
  if (r < 0) return -1;
  for (int i = 0; i < kMaxRuleHypers && kRuleTable[r].hypers[i] != nullptr; ++i) {
    if (SameName(kRuleTable[r].hypers[i], hyper)) return i;
  }
  return -1;
}

template <int kIndex>
struct HyperSlot {
  static_assert(kIndex >= 0, "no such rule or hyper-parameter in kRuleTable");
  static constexpr int value = kIndex;
};

}  // namespace sok

// h[the index of `hyper` among `rule`'s], resolved at compile time.
#define SOK_HYPER(h, rule, hyper) ((h)[::sok::HyperSlot<::sok::HyperIndex(rule, hyper)>::value])
