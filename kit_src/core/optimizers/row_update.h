// A sparse optimizer rule chosen at run time: the op's rule name and its `hyper` vector
// (layouts in the Sok>DynamicApply / Sok>StaticApply docs) become one row update, shared by
// the dynamic and the static tables' apply kernels.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "kit_src/core/status.h"

namespace sok {

// update(w, state, g, dim): one row, its optimizer state (packed as update_rules.h lays it
// out) and its summed gradient.
using RowUpdate = std::function<void(float* w, float* state, const float* g, int64_t dim)>;

// Fails with InvalidArgument on an unknown rule or a hyper vector of the wrong length.
Status MakeRowUpdate(const std::string& rule, const float* hyper, int64_t hyper_count,
                     bool nesterov, RowUpdate* update);

}  // namespace sok
