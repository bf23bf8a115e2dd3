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

// The rule's hyper-parameter struct from its floats h[0 .. RuleHyperCount), on either side:
// the CPU kernels build it from host memory, the GPU kernels from device memory.
template <typename H>
SOK_HOST_DEVICE H MakeHyper(const float* h, bool nesterov);
template <>
SOK_HOST_DEVICE inline SgdHyper MakeHyper<SgdHyper>(const float* h, bool nesterov) {
  return SgdHyper{h[0], h[1], nesterov};
}
template <>
SOK_HOST_DEVICE inline AdagradHyper MakeHyper<AdagradHyper>(const float* h, bool) {
  return AdagradHyper{h[0], h[1], h[2] != 0.0f};
}
template <>
SOK_HOST_DEVICE inline AdamHyper MakeHyper<AdamHyper>(const float* h, bool) {
  return AdamHyper{h[0], h[1], h[2], h[3]};
}
template <>
SOK_HOST_DEVICE inline AdamaxHyper MakeHyper<AdamaxHyper>(const float* h, bool) {
  return AdamaxHyper{h[0], h[1], h[2], h[3]};
}
template <>
SOK_HOST_DEVICE inline AdadeltaHyper MakeHyper<AdadeltaHyper>(const float* h, bool) {
  return AdadeltaHyper{h[0], h[1], h[2]};
}
template <>
SOK_HOST_DEVICE inline NadamHyper MakeHyper<NadamHyper>(const float* h, bool) {
  return NadamHyper{h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8]};
}
template <>
SOK_HOST_DEVICE inline FtrlHyper MakeHyper<FtrlHyper>(const float* h, bool) {
  return FtrlHyper{h[0], h[1], h[2], h[3], h[4]};
}
template <>
SOK_HOST_DEVICE inline RmspropHyper MakeHyper<RmspropHyper>(const float* h, bool) {
  return RmspropHyper{h[0], h[1], h[2], h[3], h[4] != 0.0f, h[5] != 0.0f};
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
  if (rule == "sgd") {
    visit(SgdHyper{});
  } else if (rule == "adagrad") {
    visit(AdagradHyper{});
  } else if (rule == "adam") {
    visit(AdamHyper{});
  } else if (rule == "adamax") {
    visit(AdamaxHyper{});
  } else if (rule == "adadelta") {
    visit(AdadeltaHyper{});
  } else if (rule == "nadam") {
    visit(NadamHyper{});
  } else if (rule == "ftrl") {
    visit(FtrlHyper{});
  } else {
    visit(RmspropHyper{});
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
