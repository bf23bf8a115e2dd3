// The collective ops of the plugin.
//
// Sok>Unfoldable: an identity that Grappler never folds. Horovod's collectives are not
// stateful, so when a worker's input to one is statically known (a dense gradient of a
// zero-size local batch is a constant zero), constant folding runs the collective while
// optimising the graph, on that worker only, and every worker hangs. Passing the input
// through this op keeps the collective in the running graph.
#include "kit_src/tf/ops/op_defs.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace sok {
namespace op_defs {

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

// The GPU exchange over NCCL (kernels in exchange_kernels_gpu.cu.cc, CUDA builds only).
// Every op is stateful: a collective is never folded, merged or pruned, and each worker must
// run the same sequence of them (communication.py chains them).

// A new NCCL unique id (128 bytes) on rank 0, which the launcher broadcasts.
REGISTER_OP("Sok>NcclUniqueId")
    .SetIsStateful()
    .Output("unique_id: uint8")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(128));
      return ::tensorflow::Status();
    });

// Makes this process's communicator on the GPU the op is placed on (collective).
REGISTER_OP("Sok>NcclInit")
    .SetIsStateful()
    .Input("unique_id: uint8")
    .Attr("rank: int >= 0")
    .Attr("num_workers: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle id;
      return c->WithRank(c->input(0), 1, &id);
    });

// How many rows each worker sends to this one, given how many this one sends to each
// (send_splits[w] rows to worker w). Output size depends on peers: the op waits for the
// exchange once (asynchronously, no host thread blocks).
REGISTER_OP("Sok>AllToAllCounts")
    .SetIsStateful()
    .Input("send_splits: int32")
    .Output("recv_splits: int32")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle splits;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &splits));
      c->set_output(0, splits);
      return ::tensorflow::Status();
    });

// Rows send_splits[w] of `input` (in order) go to worker w; rows recv_splits[w] of the output
// come from worker w. Both counts are known on both sides, so nothing synchronises.
REGISTER_OP("Sok>AllToAll")
    .SetIsStateful()
    .Input("input: T")
    .Input("send_splits: int32")
    .Input("recv_splits: int32")
    .Output("output: T")
    .Attr("T: {float, half, bfloat16, double, int64}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle input, splits, output;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &input));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &splits));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &splits));
      TF_RETURN_IF_ERROR(c->ReplaceDim(input, 0, c->UnknownDim(), &output));
      c->set_output(0, output);
      return ::tensorflow::Status();
    });

}  // namespace op_defs
}  // namespace sok
