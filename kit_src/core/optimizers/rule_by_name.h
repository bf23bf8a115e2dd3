// A sparse optimizer rule chosen at run time: the op's rule name and its `hyper` vector
// (layouts in the Sok>DynamicApply / Sok>StaticApply docs) become the rule's hyper-parameter
// struct, which the CPU apply kernels and the GPU sparse apply hand to ApplyRule.
#pragma once

#include <cstdint>
#include <string>

#include "kit_src/core/optimizers/update_rules.h"
#include "kit_src/core/status.h"

namespace sok {

// Hyper-parameters each rule takes, or -1 for an unknown rule.
int64_t RuleHyperCount(const std::string& rule);

// Calls visit(hyper) with the rule's hyper-parameter struct (SgdHyper, AdamHyper, ...) built
// from h[0 .. hyper_count). Fails with InvalidArgument on an unknown rule or a hyper vector of
// the wrong length.
template <typename Visit>
Status VisitRule(const std::string& rule, const float* h, int64_t hyper_count, bool nesterov,
                 Visit&& visit) {
  const int64_t needed = RuleHyperCount(rule);
  if (needed < 0) return Status::InvalidArgument("unknown optimizer rule '" + rule + "'");
  if (hyper_count != needed) {
    return Status::InvalidArgument(rule + " takes " + std::to_string(needed) +
                                   " hyper-parameters, got " + std::to_string(hyper_count));
  }
  if (rule == "sgd") {
    visit(SgdHyper{h[0], h[1], nesterov});
  } else if (rule == "adagrad") {
    visit(AdagradHyper{h[0], h[1], h[2] != 0.0f});
  } else if (rule == "adam") {
    visit(AdamHyper{h[0], h[1], h[2], h[3]});
  } else if (rule == "adamax") {
    visit(AdamaxHyper{h[0], h[1], h[2], h[3]});
  } else if (rule == "adadelta") {
    visit(AdadeltaHyper{h[0], h[1], h[2]});
  } else if (rule == "nadam") {
    visit(NadamHyper{h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8]});
  } else if (rule == "ftrl") {
    visit(FtrlHyper{h[0], h[1], h[2], h[3], h[4]});
  } else {
    visit(RmspropHyper{h[0], h[1], h[2], h[3], h[4] != 0.0f, h[5] != 0.0f});
  }
  return Status::Ok();
}

}  // namespace sok
