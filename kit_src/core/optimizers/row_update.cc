#include "kit_src/core/optimizers/row_update.h"

#include "kit_src/core/optimizers/update_rules.h"

namespace sok {
namespace {

int64_t HyperCount(const std::string& rule) {
  if (rule == "sgd") return 2;
  if (rule == "adagrad" || rule == "adadelta") return 3;
  if (rule == "adam" || rule == "adamax") return 4;
  if (rule == "ftrl") return 5;
  if (rule == "rmsprop") return 6;
  if (rule == "nadam") return 9;
  return -1;
}

template <typename Hyper, typename Rule>
RowUpdate Bind(Rule rule, Hyper hyper) {
  return [rule, hyper](float* w, float* state, const float* g, int64_t dim) {
    rule(w, state, g, dim, hyper);
  };
}

}  // namespace

Status MakeRowUpdate(const std::string& rule, const float* h, int64_t hyper_count,
                     bool nesterov, RowUpdate* update) {
  const int64_t needed = HyperCount(rule);
  if (needed < 0) return Status::InvalidArgument("unknown optimizer rule '" + rule + "'");
  if (hyper_count != needed) {
    return Status::InvalidArgument(rule + " takes " + std::to_string(needed) +
                                   " hyper-parameters, got " + std::to_string(hyper_count));
  }
  if (rule == "sgd") {
    *update = Bind(ApplySgd, SgdHyper{h[0], h[1], nesterov});
  } else if (rule == "adagrad") {
    *update = Bind(ApplyAdagrad, AdagradHyper{h[0], h[1], h[2] != 0.0f});
  } else if (rule == "adam") {
    *update = Bind(ApplyAdam, AdamHyper{h[0], h[1], h[2], h[3]});
  } else if (rule == "adamax") {
    *update = Bind(ApplyAdamax, AdamaxHyper{h[0], h[1], h[2], h[3]});
  } else if (rule == "adadelta") {
    *update = Bind(ApplyAdadelta, AdadeltaHyper{h[0], h[1], h[2]});
  } else if (rule == "nadam") {
    *update = Bind(ApplyNadam, NadamHyper{h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8]});
  } else if (rule == "ftrl") {
    *update = Bind(ApplyFtrl, FtrlHyper{h[0], h[1], h[2], h[3], h[4]});
  } else {
    *update = Bind(ApplyRmsprop, RmspropHyper{h[0], h[1], h[2], h[3], h[4] != 0.0f, h[5] != 0.0f});
  }
  return Status::Ok();
}

}  // namespace sok
