// Sok>Unfoldable: an identity that Grappler never folds. Horovod's collectives are not
// stateful, so when a worker's input to one is statically known (a dense gradient of a
// zero-size local batch is a constant zero), constant folding runs the collective while
// optimising the graph, on that worker only, and every worker hangs. Passing the input
// through this op keeps the collective in the running graph.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace sok {

REGISTER_OP("Sok>Unfoldable")
    .SetIsStateful()
    .Input("input: T")
    .Output("output: T")
    .Attr("T: type")
    .SetShapeFn(::tensorflow::shape_inference::UnchangedShape);

class UnfoldableOp : public ::tensorflow::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(::tensorflow::OpKernelContext* ctx) override { ctx->set_output(0, ctx->input(0)); }
};

REGISTER_KERNEL_BUILDER(Name("Sok>Unfoldable").Device(::tensorflow::DEVICE_CPU), UnfoldableOp);
#if GOOGLE_CUDA
REGISTER_KERNEL_BUILDER(Name("Sok>Unfoldable").Device(::tensorflow::DEVICE_GPU), UnfoldableOp);
#endif

}  // namespace sok
