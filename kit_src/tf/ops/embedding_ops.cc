// Registration and shape functions of the fused lookup's op chain:
//   Sok>PartitionKeys -> (all-to-all) -> Sok>GatherShardRows -> (all-to-all) -> Sok>CombineForward
// and the backward ops Sok>CombineBackward and Sok>SplitGradientByTable.
// The ops that lead into an all-to-all (forward or backward) are stateful: with a zero-size
// local batch Grappler would otherwise fold them away on that worker only, and the others
// would wait forever in the all-to-all. CombineForward ends the forward chain, so it is an
// ordinary op: like TensorFlow's own lookups, it is pruned when nothing uses its outputs.
#include "kit_src/core/embedding/keyed_features.h"
#include "kit_src/tf/ops/op_defs.h"

namespace sok {
namespace op_defs {

// position is uint32, not int32: TensorFlow keeps int32 tensors of GPU kernels in host memory.
REGISTER_OP("Sok>PartitionKeys")
    .SetIsStateful()  // part of a collective chain: never pruned or folded
    .Input("ids: N * Tindex")
    .Output("send_keys: int64")
    .Output("splits: int32")
    .Output("position: uint32")
    .Output("table_counts: int32")
    .Attr("N: int >= 1")
    .Attr("Tindex: {int32, int64}")
    .Attr("lookup_table: list(int)")
    .Attr("table_rows: list(int)")
    .Attr("table_owner: list(int)")
    .Attr("table_names: list(string)")
    .Attr("num_workers: int >= 1")
    .Attr("dedup: bool = true")
    .Attr("table_dynamic: list(bool) = []")
    .Attr("pair_keys: bool = false")
    .SetShapeFn([](InferenceContext* c) -> Status {
      int64_t num_workers = 0;
      bool pair_keys = false;
      TF_RETURN_IF_ERROR(c->GetAttr("num_workers", &num_workers));
      TF_RETURN_IF_ERROR(c->GetAttr("pair_keys", &pair_keys));
      DimensionHandle total = c->MakeDim(0);
      for (int i = 0; i < c->num_inputs(); ++i) {
        ShapeHandle ids;
        TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &ids));
        TF_RETURN_IF_ERROR(c->Add(total, c->Dim(ids, 0), &total));
      }
      c->set_output(0, pair_keys ? c->Matrix(c->UnknownDim(), 2) : c->Vector(c->UnknownDim()));
      c->set_output(1, c->Vector(num_workers));
      c->set_output(2, c->Vector(total));
      c->set_output(3, c->Vector(c->UnknownDim()));
      return Status();
    })
    .Doc(R"doc(
Deduplicates the ids of each table, maps them to their owner worker and local row, and lays
them out grouped by worker for an all-to-all. send_keys packs (table, local row); splits counts
the keys for each worker; position gives, for every input id, its key's index in send_keys.
table_counts: with one worker and packed keys, the keys of each table (send_keys come grouped
by table), for Sok>SplitGradientByTable; otherwise empty (also above 4096 tables on a GPU).
)doc");

REGISTER_OP("Sok>GatherShardRows")
    .SetIsStateful()  // part of a collective chain: never pruned or folded
    .Input("shards: num_tables * resource")
    .Input("keys: int64")
    .Output("rows: dtype")
    .Attr("num_tables: int >= 1")
    .Attr("dtype: {float, half, bfloat16}")  // the shards' type; rows are copied bit for bit
    .Attr("dim: int >= 1")
    .SetShapeFn([](InferenceContext* c) -> Status {
      int64_t dim = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      ShapeHandle keys;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(c->num_inputs() - 1), 1, &keys));
      c->set_output(0, c->Matrix(c->Dim(keys, 0), dim));
      return Status();
    })
    .Doc("Reads the rows named by packed keys from the local shards of the group's tables.");

REGISTER_OP("Sok>SplitGradientByTable")
    .SetIsStateful()  // part of a collective chain: never pruned or folded
    .Input("keys: int64")
    .Input("grad: dtype")
    .Input("table_counts: int32")
    .Output("indices: num_tables * int64")
    .Output("values: num_tables * dtype")
    .Attr("num_tables: int >= 1")
    .Attr("dtype: {float}")
    .SetShapeFn([](InferenceContext* c) -> Status {
      int64_t num_tables = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("num_tables", &num_tables));
      ShapeHandle keys, grad;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &keys));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &grad));
      for (int64_t t = 0; t < num_tables; ++t) {
        c->set_output(t, c->Vector(c->UnknownDim()));
        c->set_output(num_tables + t, c->Matrix(c->UnknownDim(), c->Dim(grad, 1)));
      }
      return Status();
    })
    .Doc(R"doc(
Gradient of GatherShardRows: the rows' gradients grouped by the table they belong to.
table_counts: empty, or Sok>PartitionKeys' table_counts for these keys (its send_keys of one
worker): then the GPU kernel neither counts nor waits for the device (it trusts them; the CPU
kernel checks that they describe the keys).
)doc");

REGISTER_OP("Sok>EverySampleHoldsOneId")
    .Input("row_splits: N * int64")
    .Output("one_id: bool")
    .Attr("N: int >= 1")
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Whether every sample of every lookup holds exactly one id (each row_splits is 0, 1, ...,
batch): the run-time choice between Sok>GatherSingleIds and the fused chain, in one op.
)doc");

// Every output a vector whose length only the run knows.
static Status VectorsOfUnknownLength(InferenceContext* c) {
  for (int l = 0; l < c->num_outputs(); ++l) c->set_output(l, c->Vector(c->UnknownDim()));
  return Status();
}

REGISTER_OP("Sok>SparseRowSplits")
    .Input("indices: N * int64")
    .Input("dense_shape: N * int64")
    .Output("row_splits: N * int64")
    .Attr("N: int >= 1")
    .Attr("names: list(string)")
    .SetShapeFn(VectorsOfUnknownLength)
    .Doc(R"doc(
The row splits of 2-D SparseTensors (indices [nnz, 2], dense_shape [2]) from the first column
of their indices, which must be in order and inside dense_shape[0]; columns are not read (as
tf.nn.safe_embedding_lookup_sparse). One pass a tensor, for all the lookups of a call.
)doc");

// Outputs of a feature-major packed batch: values of unknown length, row splits [B + 1].
// The packed-batch ops' two vector inputs (values and row splits, or staged bytes and plan) and
// their num_features.
static Status PackedBatchInputs(InferenceContext* c, int64_t* features, ShapeHandle* second) {
  TF_RETURN_IF_ERROR(c->GetAttr("num_features", features));
  ShapeHandle first;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &first));
  return c->WithRank(c->input(1), 1, second);
}

static Status UnpackFeaturesShape(InferenceContext* c) {
  int64_t features = 0;
  ShapeHandle row_splits;
  TF_RETURN_IF_ERROR(PackedBatchInputs(c, &features, &row_splits));
  DimensionHandle splits = c->UnknownDim();
  const int64_t total = c->Value(c->Dim(row_splits, 0));
  if (c->ValueKnown(c->Dim(row_splits, 0)) && total >= 1 && (total - 1) % features == 0) {
    splits = c->MakeDim((total - 1) / features + 1);
  }
  for (int64_t f = 0; f < features; ++f) {
    c->set_output(f, c->Vector(c->UnknownDim()));
    c->set_output(features + f, c->Vector(splits));
  }
  return Status();
}

// The ops that split a packed batch into one ragged tensor a feature.
#define SOK_UNPACK_FEATURES_OP(name)                                \
  REGISTER_OP(name)                                                 \
      .Input("values: T")                                           \
      .Input("row_splits: Tsplits")                                 \
      .Output("feature_values: num_features * T")                   \
      .Output("feature_row_splits: num_features * int64")           \
      .Attr("num_features: int >= 1")                               \
      .Attr("T: {int32, int64, float, half, bfloat16, double}")     \
      .Attr("Tsplits: {int32, int64}")                              \
      .SetShapeFn(UnpackFeaturesShape)

SOK_UNPACK_FEATURES_OP("Sok>UnpackFeatures")
    .Doc(R"doc(
A batch of num_features features in one ragged tensor, feature-major (feature 0's B samples,
then feature 1's: rows F * B), as one ragged tensor a feature: its values (a slice of the input
where aligned) and its row splits counted from its first value.
)doc");

SOK_UNPACK_FEATURES_OP("Sok>UnpackFeaturesFromHost")
    .Doc(R"doc(
Sok>UnpackFeatures of a packed batch in host memory (as tf.data hands it over): its feature
offsets are read there and the features cross to the device through pinned memory, staged
compactly (int64 ids that fit as int32, row lengths under 256 as one byte) and widened there.
)doc");

static Status StageFeaturesShape(InferenceContext* c) {
  int64_t features = 0;
  ShapeHandle unused;
  TF_RETURN_IF_ERROR(PackedBatchInputs(c, &features, &unused));
  c->set_output(0, c->Vector(c->UnknownDim()));
  c->set_output(1, c->Vector(kStagedPlanHeader + kStagedPlanPerFeature * features));
  return Status();
}

REGISTER_OP("Sok>StageFeatures")
    .Input("values: T")
    .Input("row_splits: Tsplits")
    .Output("staged: int8")
    .Output("plan: int64")
    .Attr("num_features: int >= 1")
    .Attr("T: {int32, int64}")
    .Attr("Tsplits: {int32, int64}")
    .SetShapeFn(StageFeaturesShape)
    .Doc(R"doc(
A feature-major packed batch of ids staged for its crossing to a GPU, on the CPU (in the input
pipeline, ahead of its step): its features' ids and row splits compactly coded (int64 ids that
fit as int32, row lengths under 256 as one byte) in one buffer of pinned host memory where a
GPU is present, and the plan that Sok>UnpackStagedFeatures reads them back by.
)doc");

static Status UnpackStagedFeaturesShape(InferenceContext* c) {
  int64_t features = 0;
  ShapeHandle unused;
  TF_RETURN_IF_ERROR(PackedBatchInputs(c, &features, &unused));
  for (int64_t f = 0; f < 2 * features; ++f) c->set_output(f, c->Vector(c->UnknownDim()));
  return Status();
}

REGISTER_OP("Sok>UnpackStagedFeatures")
    .Input("staged: int8")
    .Input("plan: int64")
    .Output("feature_values: num_features * T")
    .Output("feature_row_splits: num_features * int64")
    .Attr("num_features: int >= 1")
    .Attr("T: {int32, int64}")
    .Attr("id_limits: list(int) = []")
    .Attr("table_names: list(string) = []")
    .SetShapeFn(UnpackStagedFeaturesShape)
    .Doc(R"doc(
Sok>UnpackFeatures of a batch staged by Sok>StageFeatures: on a GPU, one copy of its staged
bytes (no host work beyond reading the plan) widened there into one ragged tensor a feature.
id_limits: empty, or per feature the rows of its table (-1: any id): each feature's id range,
  which the plan carries, is checked on the host against [0, rows) and an id outside fails
  the op naming table_names[f], so a GPU lookup of the ids need not wait to check them.
)doc");

// A lookup's check record: [code, id, rows], or empty with host_checked (the ids, and row
// splits where there are any, were checked on the host: the GPU checks and records nothing).
static Status SetCheckShape(InferenceContext* c, int output) {
  bool host_checked = false;
  TF_RETURN_IF_ERROR(c->GetAttr("host_checked", &host_checked));
  c->set_output(output, c->Vector(host_checked ? 0 : 3));
  return Status();
}

REGISTER_OP("Sok>GatherSingleIds")
    .Input("tables: N * resource")
    .Input("ids: N * Tindex")
    .Output("outputs: N * dtype")
    .Output("check: int64")
    .Attr("N: int >= 1")
    .Attr("Tindex: {int32, int64}")
    .Attr("dtype: {float}")
    .Attr("dim: int >= 1")
    .Attr("table_names: list(string)")
    .Attr("host_checked: bool = false")
    .SetShapeFn([](InferenceContext* c) -> Status {
      int64_t n = 0, dim = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      for (int64_t l = 0; l < n; ++l) {
        ShapeHandle ids;
        TF_RETURN_IF_ERROR(c->WithRank(c->input(n + l), 1, &ids));
        c->set_output(l, c->Matrix(c->Dim(ids, 0), dim));
      }
      return SetCheckShape(c, n);
    })
    .Doc(R"doc(
One worker, every sample holding exactly one id (the caller knows it: a sequence lookup, a
RaggedTensor of uniform row length 1, or a run-time check of the row splits), so sample i of
lookup l is ids[l][i]: output l is rows ids[l] of table l (any combiner pools one row to
itself). No dedup and no exchange; the tables' gradients are the
outputs' gradients as IndexedSlices over the ids.
check is the GPU kernel's record of the first out-of-range id ([code, id, rows]; the CPU kernel
fails at once and leaves it clean): Sok>CheckGatheredIds reports it, so the op itself finishes
without waiting for the GPU to pass its check. host_checked: the ids were checked on the host
(Sok>CheckIdsOnHost, sok.stage_features); nothing is checked here and check is empty.
)doc");

// Outputs of a pooled lookup straight from the tables: one [batch, dim] a lookup, or (stacked)
// one [batch, N, dim] for all of them. A lookup's batch is its row splits' length less one,
// or its ids' count where the row splits are empty (one id a sample).
static Status PooledOutputsShape(InferenceContext* c, int first_ids) {
  int64_t n = 0, dim = 0;
  bool stacked = false;
  TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
  TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
  TF_RETURN_IF_ERROR(c->GetAttr("stacked", &stacked));
  DimensionHandle stacked_batch = c->UnknownDim();
  for (int64_t l = 0; l < n; ++l) {
    ShapeHandle ids, splits;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(first_ids + l), 1, &ids));
    TF_RETURN_IF_ERROR(c->WithRank(c->input(first_ids + n + l), 1, &splits));
    const DimensionHandle length = c->Dim(splits, 0);
    DimensionHandle batch = c->Dim(ids, 0);
    if (!c->ValueKnown(length) || c->Value(length) != 0) {
      TF_RETURN_IF_ERROR(c->Subtract(length, 1, &batch));
    }
    if (stacked) {
      TF_RETURN_IF_ERROR(c->Merge(stacked_batch, batch, &stacked_batch));
    } else {
      c->set_output(l, c->Matrix(batch, dim));
    }
  }
  if (stacked) c->set_output(0, c->MakeShape({stacked_batch, c->MakeDim(n), c->MakeDim(dim)}));
  return Status();
}

REGISTER_OP("Sok>PoolFromTables")
    .Input("tables: N * resource")
    .Input("ids: N * int64")
    .Input("row_splits: N * int64")
    .Input("weights: N * float")
    .Output("outputs: num_outputs * float")
    .Output("check: int64")
    .Attr("N: int >= 1")
    .Attr("num_outputs: int >= 1")
    .Attr("stacked: bool = false")
    .Attr("combiners: list(string)")
    .Attr("dim: int >= 1")
    .Attr("table_names: list(string)")
    .Attr("host_checked: bool = false")
    .SetShapeFn([](InferenceContext* c) -> Status {
      int64_t n = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      TF_RETURN_IF_ERROR(PooledOutputsShape(c, n));
      return SetCheckShape(c, c->num_outputs() - 1);
    })
    .Doc(R"doc(
One worker, static float32 tables: output l pools, for each sample of lookup l, the weighted
rows of table l at its ids (row_splits l, or an empty vector for one id a sample as
Sok>ElideOneIdRowSplits gives; weights l or an empty tensor for all ones; combiners l), with
no dedup, no sort and no exchange, so nothing waits for the device. With
stacked (num_outputs 1), one [batch, N, dim] output holds every lookup (all of one batch size),
else num_outputs is N. The tables' gradients are IndexedSlices over the ids (Sok>SpreadPooledGrad).
check is the GPU kernels' record of the first bad input (an id outside its table, row_splits
that do not start at 0, end at the ids' count or that decrease), which Sok>CheckGatheredIds
reports; the CPU kernel fails at once and leaves it clean. host_checked: the ids and row
splits were checked on the host (Sok>CheckIdsOnHost, sok.stage_features); the GPU checks
nothing (row splits are clamped to the ids) and check is empty.
)doc");

REGISTER_OP("Sok>ElideOneIdRowSplits")
    .Input("row_splits: N * int64")
    .Input("ids: Tids")
    .Output("elided: N * int64")
    .Attr("N: int >= 1")
    .Attr("Tids: list({int32, int64})")
    .SetShapeFn(VectorsOfUnknownLength)
    .Doc(R"doc(
Row splits in host memory on their way to a GPU's pooled ops (Sok>PoolFromTables and its
gradients), which read an empty row_splits as one id a sample: elided l is an empty vector
where row_splits l is 0, 1, ..., batch and lookup l has batch ids (ids l, read for their count
only), else row_splits l itself (not copied). Such row splits then never cross to the GPU, and
the GPU pools each sample's one row. CPU only; nothing is checked here (Sok>CheckIdsOnHost
checks the row splits beside the lookup).
)doc");

REGISTER_OP("Sok>SpreadPooledGrad")
    .Input("output_grads: num_outputs * float")
    .Input("ids: N * int64")
    .Input("row_splits: N * int64")
    .Input("weights: N * float")
    .Output("id_grads: N * float")
    .Attr("N: int >= 1")
    .Attr("num_outputs: int >= 1")
    .Attr("stacked: bool = false")
    .Attr("combiners: list(string)")
    .Attr("dim: int >= 1")
    .SetShapeFn([](InferenceContext* c) -> Status {
      int64_t n = 0, dim = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      const int first_ids = c->num_inputs() - 3 * static_cast<int>(n);
      for (int64_t l = 0; l < n; ++l) {
        ShapeHandle ids;
        TF_RETURN_IF_ERROR(c->WithRank(c->input(first_ids + l), 1, &ids));
        c->set_output(l, c->Matrix(c->Dim(ids, 0), dim));
      }
      return Status();
    })
    .Doc(R"doc(
The gradient of Sok>PoolFromTables for each id's row: id_grads l row i is the output gradient
of the sample holding id i, times its weight over the sample's denominator (zeros where the
forward pooled to zeros). The ids are read for their count only.
)doc");

REGISTER_OP("Sok>PooledGradShares")
    .Input("ids: N * int64")
    .Input("row_splits: N * int64")
    .Input("weights: N * float")
    .Output("use_rows: N * int64")
    .Output("use_scales: N * float")
    .Attr("N: int >= 1")
    .Attr("num_outputs: int >= 1")
    .Attr("stacked: bool = false")
    .Attr("combiners: list(string)")
    .Attr("dim: int >= 1")
    .SetShapeFn([](InferenceContext* c) -> Status {
      int64_t n = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      for (int64_t l = 0; l < n; ++l) {
        ShapeHandle ids;
        TF_RETURN_IF_ERROR(c->WithRank(c->input(l), 1, &ids));
        c->set_output(l, ids);
        c->set_output(n + l, ids);
      }
      return Status();
    })
    .Doc(R"doc(
Sok>SpreadPooledGrad as shares, for an update that reads the output gradient itself
(Sok>StaticApply with grad_rows): id i of lookup l takes use_scales[l][i] times row
use_rows[l][i] of its output gradient viewed as a [rows, dim] matrix (its own [batch, dim]
output's row s, or row s * N + l of the stacked [batch, N, dim] one, for its sample s).
)doc");

REGISTER_OP("Sok>CheckGatheredIds")
    .SetIsStateful()  // runs even though nothing reads it
    .Input("check: int64")
    .Attr("table_names: list(string)")
    .Attr("deferred: bool = false")
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Fails with the out-of-range error Sok>GatherSingleIds recorded in check (naming the table, the
id and the valid range); on the GPU it finishes once the stream has passed that record.
deferred (GPU only; sok.set_id_check("deferred")): finishes at once instead. The record is
read once the stream passes it, and an error found is raised by the next deferred check in the
process (normally the next step); until then Sok>GuardIds on the GPU turns every gradient id
into -1, so no update lands. The CPU kernels fail at once either way.
)doc");

// Output i has input i's shape.
static Status OutputsShapedAsInputs(InferenceContext* c) {
  for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->input(i));
  return Status();
}

REGISTER_OP("Sok>CheckIdsOnHost")
    .Input("ids: N * Tindex")
    .Input("row_splits: M * int64")
    .Output("checked: N * Tindex")
    .Output("checked_splits: M * int64")
    .Attr("N: int >= 1")
    .Attr("M: int >= 0")
    .Attr("Tindex: {int32, int64}")
    .Attr("rows: list(int)")
    .Attr("table_names: list(string)")
    .Attr("copy: bool = true")
    // A check: never folded or pruned, though with copy false its outputs are empty (Grappler
    // replaces a stateless op whose outputs are known to be empty by constants).
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      bool copy = true;
      TF_RETURN_IF_ERROR(c->GetAttr("copy", &copy));
      if (copy) return OutputsShapedAsInputs(c);
      for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->Vector(0));
      return Status();
    })
    .Doc(R"doc(
The ids of N lookups (and, M == N, their row splits), in host memory on their way to a GPU,
checked there: fails with the out-of-range error (naming table_names[i], the id and
[0, rows[i])) for the first id outside its table, or with the row splits' error, else gives
the ids (and row splits) on, copied in the same pass into memory the GPU copies from
directly (pinned, where a GPU is present), so their crossing does not stage them through
pageable memory. A lookup whose ids pass it need not wait for the GPU's own check. CPU only.
copy false: the check alone, every output empty; a lookup that reads the ids as they are
runs beside it and its outputs wait for it (the lookup_sparse default).
)doc");

REGISTER_OP("Sok>GuardIds")
    .Input("ids: N * int64")
    .Input("check: int64")
    .Output("guarded: N * int64")
    .Attr("N: int >= 1")
    .SetShapeFn(OutputsShapedAsInputs)
    .Doc(R"doc(
The ids of a one-id lookup's gradient, each guarded: a copy of ids, or -1 everywhere when check
(Sok>GatherSingleIds' record) holds an error, so that no sparse update writes a row for that
step (they skip or refuse -1) while nothing waits for Sok>CheckGatheredIds' verdict.
)doc");

namespace {

Status CombineShapes(InferenceContext* c, int first_splits) {
  int64_t n = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
  for (int64_t l = 0; l < n; ++l) {
    ShapeHandle splits;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(first_splits + l), 1, &splits));
  }
  return Status();
}

}  // namespace

// validate (CombineForward, CombineFromShards, CombineBackward): with true (the default) every
// input is checked and a bad one fails the op with the CPU kernels' message; on the GPU that
// means finishing only once the stream has passed the check. lookup_sparse passes false for
// the inputs it built itself (positions and keys from Sok>PartitionKeys, row_splits of a
// RaggedTensor, no weights): the GPU kernels then still never read or write out of bounds,
// but do not hold TensorFlow back waiting for the verdict. The CPU kernels always check.
REGISTER_OP("Sok>CombineForward")
    .Input("rows: dtype")
    .Input("position: uint32")
    .Input("row_splits: N * int64")
    .Input("weights: N * float")
    .Output("outputs: N * dtype")
    .Attr("N: int >= 1")
    .Attr("dtype: {float}")
    .Attr("combiners: list(string)")
    .Attr("validate: bool = true")  // false: inputs built by lookup_sparse (see above)
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle rows, position;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &rows));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &position));
      TF_RETURN_IF_ERROR(CombineShapes(c, 2));
      int64_t n = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      for (int64_t l = 0; l < n; ++l) {
        DimensionHandle batch;
        TF_RETURN_IF_ERROR(c->Subtract(c->Dim(c->input(2 + l), 0), 1, &batch));
        c->set_output(l, c->Matrix(batch, c->Dim(rows, 1)));
      }
      return Status();
    })
    .Doc("Pools the rows of each sample of each lookup with its combiner and weights.");

REGISTER_OP("Sok>CombineFromShards")
    .Input("shards: num_tables * resource")
    .Input("keys: int64")
    .Input("position: uint32")
    .Input("row_splits: N * int64")
    .Input("weights: N * float")
    .Output("outputs: N * dtype")
    .Attr("num_tables: int >= 1")
    .Attr("N: int >= 1")
    .Attr("dtype: {float}")
    .Attr("dim: int >= 1")
    .Attr("combiners: list(string)")
    .Attr("validate: bool = true")  // false: inputs built by lookup_sparse (see above)
    .SetShapeFn([](InferenceContext* c) -> Status {
      int64_t num_tables = 0, n = 0, dim = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("num_tables", &num_tables));
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      ShapeHandle keys, position;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(num_tables), 1, &keys));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(num_tables + 1), 1, &position));
      TF_RETURN_IF_ERROR(CombineShapes(c, num_tables + 2));
      for (int64_t l = 0; l < n; ++l) {
        DimensionHandle batch;
        TF_RETURN_IF_ERROR(c->Subtract(c->Dim(c->input(num_tables + 2 + l), 0), 1, &batch));
        c->set_output(l, c->Matrix(batch, dim));
      }
      return Status();
    })
    .Doc(R"doc(
One worker: GatherShardRows and CombineForward in one pass, pooling each sample's rows
straight from the shards (no [keys, dim] intermediate). Its gradient is CombineBackward
then SplitGradientByTable, as for the two-op chain.
)doc");

REGISTER_OP("Sok>CombineBackward")
    .SetIsStateful()  // part of a collective chain: never pruned or folded
    .Input("output_grads: N * dtype")
    .Input("position: uint32")
    .Input("row_splits: N * int64")
    .Input("weights: N * float")
    .Input("num_rows: int64")
    .Output("rows_grad: dtype")
    .Attr("N: int >= 1")
    .Attr("dtype: {float}")
    .Attr("combiners: list(string)")
    .Attr("validate: bool = true")  // false: inputs built by lookup_sparse (see above)
    .SetShapeFn([](InferenceContext* c) -> Status {
      int64_t n = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      ShapeHandle grad, scalar;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &grad));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3 * n + 1), 0, &scalar));
      TF_RETURN_IF_ERROR(CombineShapes(c, n + 1));
      c->set_output(0, c->Matrix(c->UnknownDim(), c->Dim(grad, 1)));
      return Status();
    })
    .Doc("Gradient of CombineForward with respect to its rows.");

REGISTER_OP("Sok>StaticApply")
    .Input("tables: num_tables * resource")
    .Input("slots: N * resource")
    .Input("indices: num_tables * int64")
    .Input("grads: num_tables * float")
    .Input("grad_rows: M * int64")
    .Input("grad_scales: M * float")
    .Input("hyper: float")
    .Attr("num_tables: int >= 1")
    .Attr("N: int >= 0")
    .Attr("M: int >= 0 = 0")
    .Attr("rule: {'sgd', 'adagrad', 'adam', 'adamax', 'adadelta', 'rmsprop', 'ftrl', 'nadam'}")
    .Attr("nesterov: bool = false")
    .Attr("table_names: list(string) = []")
    .Attr("validate: bool = true")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Lazy optimizer update of static tables' local shards, all of one width, by one rule: the
gradients of duplicate rows are summed, then each touched row and its rows of the table's
optimizer slot variables (N / num_tables a table, table after table, each shaped like its
table; together the state that kit_src/core/optimizers/update_rules.h lays out one after
another) are updated in place. Untouched rows and their slots do not change. On the GPU the
tables of one call are one sort, one sum and one apply. hyper as for Sok>DynamicApply, in the
device's memory: a GPU kernel reads it there (a step need not copy it to the host), so values
needing more state than the slots hold (an SGD momentum without its slot) write nothing on
the GPU, while the CPU reports them. A row index outside its shard fails before anything is
written, in any table. table_names (one a table, or none) name the tables in errors.
validate=false (indices that lookup_sparse's gradient built from ids it had checked): on the
GPU the op does not wait for its stream to check them (the kernels skip a row outside the
shard rather than write it); the CPU always checks.
With M = num_tables, grads[t] is a [rows, dim] matrix table t's gradients are read from: index
i's gradient is grad_scales[t][i] times grads[t] row grad_rows[t][i] (Sok>PooledGradShares),
so a pooled lookup's per-id gradient rows are never written.
)doc");

REGISTER_OP("Sok>OptimizerRules")
    .Output("table: string")
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
The sparse optimizer rules that Sok>DynamicApply and Sok>StaticApply take
(kit_src/core/optimizers/rule_table.h) as a JSON object: for each rule name, "hyper" (the
names of its hyper-parameters in the order of the ops' hyper vector), "slots" (the Keras slot
name of each [dim] section of its state, in storage order) and "last_slot_if" (the
hyper-parameter that keeps the last slot when it is non-zero, or null).
)doc");

}  // namespace op_defs
}  // namespace sok
