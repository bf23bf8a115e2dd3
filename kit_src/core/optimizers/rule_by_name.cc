#include "kit_src/core/optimizers/rule_by_name.h"

namespace sok {

int64_t RuleHyperCount(const std::string& rule) {
  const int r = RuleIndex(rule.c_str());
  if (r < 0) return -1;
  int64_t count = 0;
  while (count < kMaxRuleHypers && kRuleTable[r].hypers[count] != nullptr) ++count;
  return count;
}

}  // namespace sok
