#include "kit_src/core/optimizers/rule_by_name.h"

namespace sok {

int64_t RuleHyperCount(const std::string& rule) {
  const int r = RuleIndex(rule.c_str());
  if (r < 0) return -1;
  int64_t count = 0;
  while (count < kMaxRuleHypers && kRuleTable[r].hypers[count] != nullptr) ++count;
  return count;
}

namespace {

template <size_t N>
std::string NameList(const char* const (&names)[N]) {
  std::string list = "[";
  for (size_t i = 0; i < N && names[i] != nullptr; ++i) {
    list += std::string(i > 0 ? ", " : "") + "\"" + names[i] + "\"";
  }
  return list + "]";
}

}  // namespace

std::string RuleTableJson() {
  std::string json = "{";
  for (int r = 0; r < kNumRules; ++r) {
    const RuleSpec& rule = kRuleTable[r];
    const std::string last_slot_if =
        rule.last_slot_if ? "\"" + std::string(rule.last_slot_if) + "\"" : "null";
    json += std::string(r > 0 ? ", " : "") + "\"" + rule.name + "\": {\"hyper\": " +
            NameList(rule.hypers) + ", \"slots\": " + NameList(rule.slots) +
            ", \"last_slot_if\": " + last_slot_if + "}";
  }
  return json + "}";
}

}  // namespace sok
