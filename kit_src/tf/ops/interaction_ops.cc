// Registration of the fused DLRM dot interaction (kit_src/core/interaction).
#include "kit_src/tf/ops/op_defs.h"

namespace sok {
namespace op_defs {

REGISTER_OP("Sok>DotInteraction")
    .Input("features: T")
    .Output("output: T")
    .Attr("T: {float, half} = DT_FLOAT")
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle features;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 3, &features));
      DimensionHandle f = c->Dim(features, 1), d = c->Dim(features, 2);
      if (!c->ValueKnown(f) || !c->ValueKnown(d)) {
        c->set_output(0, c->Matrix(c->Dim(features, 0), c->UnknownDim()));
        return Status();
      }
      const int64_t n = c->Value(f);
      c->set_output(0, c->Matrix(c->Dim(features, 0), c->Value(d) + n * (n - 1) / 2));
      return Status();
    })
    .Doc(R"doc(
DLRM dot interaction of features [B, F, D] (row 0 the bottom MLP output): [B, D + F(F-1)/2],
x[0] then x[i].x[j] for i > j in row-major lower-triangle order. float16 inputs are
accumulated in float32 and rounded once.
)doc");

REGISTER_OP("Sok>DotInteractionGrad")
    .Input("features: T")
    .Input("output_grad: T")
    .Output("features_grad: T")
    .Attr("T: {float, half} = DT_FLOAT")
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle features, grad;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 3, &features));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &grad));
      c->set_output(0, features);
      return Status();
    });

}  // namespace op_defs
}  // namespace sok
