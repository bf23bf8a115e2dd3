#include "kit_src/core/optimizers/rule_by_name.h"

namespace sok {

int64_t RuleHyperCount(const std::string& rule) {
  if (rule == "sgd") return 2;
  if (rule == "adagrad" || rule == "adadelta") return 3;
  if (rule == "adam" || rule == "adamax") return 4;
  if (rule == "ftrl") return 5;
  if (rule == "rmsprop") return 6;
  if (rule == "nadam") return 9;
  return -1;
}

}  // namespace sok
