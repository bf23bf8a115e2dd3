// Registration of the dynamic (hash) table ops: lifetime, reads and writes, the lookup-chain
// ops for dynamic tables, and the fused sparse optimizer update.
#include "kit_src/tf/ops/op_defs.h"

namespace sok {
namespace op_defs {

REGISTER_OP("Sok>DynamicTableHandle")
    .Output("handle: resource")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc("A handle to a dynamic table in the resource manager.");

REGISTER_OP("Sok>DynamicTableCreate")
    .Input("handle: resource")
    .Attr("dim: int >= 1")
    .Attr("init_capacity: int >= 1")
    .Attr("max_capacity: int >= 1")
    .Attr("evict_strategy: {'none', 'lru', 'lfu'}")
    .Attr("initializer: {'normal', 'uniform', 'constant'}")
    .Attr("init_a: float")
    .Attr("init_b: float")
    .Attr("seed: int")
    .Attr("value_dtype: {'float32', 'float16', 'bfloat16'} = 'float32'")
    .Attr("hbm_budget_bytes: int >= 0 = 0")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc("Creates the table behind `handle`; the initial row of a key depends on (seed, key). "
         "value_dtype is how rows are stored; every read and write is float32. A positive "
         "hbm_budget_bytes smaller than the table makes a tiered table: the rows in use (with "
         "their optimizer state) within that many bytes of the device's memory, the rest in "
         "host memory.");

REGISTER_OP("Sok>DynamicTableTierCounts")
    .Input("handle: resource")
    .Output("counts: int64")
    .SetIsStateful()
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->Vector(11));
      return ::tensorflow::Status();
    })
    .Doc("[tiered, hot keys, host keys, ids looked up, hot hits, rows moved up, rows moved "
         "down, then nanoseconds in training lookups, taking misses up, moving rows down, "
         "moving rows up]: a tiered table's counts since its creation (tiered 1), zeros for "
         "another.");

REGISTER_OP("Sok>DynamicTableSize")
    .Input("handle: resource")
    .Output("size: int64")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape);

// Output 0 of a lookup: [keys (input 1), dim] rows.
static Status RowsOfKeys(InferenceContext* c) {
  ShapeHandle keys;
  int64_t dim = 0;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &keys));
  TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
  c->set_output(0, c->Matrix(c->Dim(keys, 0), dim));
  return Status();
}

REGISTER_OP("Sok>DynamicTableLookup")
    .Input("handle: resource")
    .Input("keys: int64")
    .Output("values: float")
    .Attr("dim: int >= 1")
    .Attr("insert: bool = true")
    .SetIsStateful()
    .SetShapeFn(RowsOfKeys)
    .Doc("Rows of the keys; missing keys are inserted (insert) or read as zeros.");

REGISTER_OP("Sok>DynamicTableLookupEvict")
    .Input("handle: resource")
    .Input("keys: int64")
    .Output("values: float")
    .Output("evicted_keys: int64")
    .Output("evicted_values: float")
    .Attr("dim: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      TF_RETURN_IF_ERROR(RowsOfKeys(c));
      int64_t dim = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      c->set_output(1, c->Vector(c->UnknownDim()));
      c->set_output(2, c->Matrix(c->UnknownDim(), dim));
      return Status();
    })
    .Doc("Find-or-insert rows of the keys (SOK's sparse_read_and_evict): also the keys the "
         "insertion evicted to make room, with their rows. Output size depends on the data.");

// The ops that write rows with their optimizer state ([n, state_dim], or empty) into a table.
#define SOK_TABLE_WRITE_OP(name)                                    \
  REGISTER_OP(name)                                                 \
      .Input("handle: resource")                                    \
      .Input("keys: int64")                                         \
      .Input("values: float")                                       \
      .Input("state: float")                                        \
      .SetIsStateful()                                              \
      .SetShapeFn(::tensorflow::shape_inference::NoOutputs)

SOK_TABLE_WRITE_OP("Sok>DynamicTableAssign")
    .Doc("Inserts or overwrites rows (and optimizer state unless `state` is empty).");

SOK_TABLE_WRITE_OP("Sok>DynamicTableImport")
    .Doc("Replaces the table's content (a checkpoint restore); state may have 0 columns.");

REGISTER_OP("Sok>DynamicTableErase")
    .Input("handle: resource")
    .Input("keys: int64")
    .Output("erased: int64")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape);

REGISTER_OP("Sok>DynamicTableExportWritten")
    .Input("handle: resource")
    .Input("written_after_us: int64")
    .Output("keys: int64")
    .Output("values: float")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle scalar;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &scalar));
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Matrix(c->UnknownDim(), c->UnknownDim()));
      return Status();
    })
    .Doc("Keys whose rows were written (inserted, assigned, updated) after written_after_us "
         "microseconds since the Unix epoch, with their rows: an incremental dump.");

REGISTER_OP("Sok>DynamicTableExport")
    .Input("handle: resource")
    .Output("keys: int64")
    .Output("values: float")
    .Output("state: float")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Matrix(c->UnknownDim(), c->UnknownDim()));
      c->set_output(2, c->Matrix(c->UnknownDim(), c->UnknownDim()));
      return Status();
    });

REGISTER_OP("Sok>DynamicGatherRows")
    .Input("tables: num_tables * resource")
    .Input("keys: int64")
    .Output("rows: float")
    .Attr("num_tables: int >= 1")
    .Attr("dim: int >= 1")
    .Attr("insert: bool = true")
    .Attr("admit_probability: list(float) = []")
    .Attr("validate: bool = true")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle keys;
      int64_t dim = 0;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(c->num_inputs() - 1), 2, &keys));
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      c->set_output(0, c->Matrix(c->Dim(keys, 0), dim));
      return Status();
    })
    .Doc("The owner's read for dynamic tables: rows of (table, key) pairs, find-or-insert; "
         "admit_probability (one per table, empty for 1) is the low-frequency filter. The GPU "
         "kernel waits for its check of the pairs' tables only with validate (pairs "
         "Sok>PartitionKeys built need none).");

REGISTER_OP("Sok>SplitDynamicGradient")
    .Input("keys: int64")
    .Input("grad: float")
    .Output("indices: num_tables * int64")
    .Output("values: num_tables * float")
    .Attr("num_tables: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      int64_t num_tables = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("num_tables", &num_tables));
      ShapeHandle grad;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &grad));
      for (int64_t t = 0; t < num_tables; ++t) {
        c->set_output(t, c->Vector(c->UnknownDim()));
        c->set_output(num_tables + t, c->Matrix(c->UnknownDim(), c->Dim(grad, 1)));
      }
      return Status();
    })
    .Doc("Gradient of DynamicGatherRows: (keys, row gradients) per table.");

REGISTER_OP("Sok>DynamicApply")
    .Input("handle: resource")
    .Input("keys: int64")
    .Input("grads: float")
    .Input("hyper: float")
    .Attr("rule: {'sgd', 'adagrad', 'adam', 'adamax', 'adadelta', 'rmsprop', 'ftrl', 'nadam'}")
    .Attr("state_dim: int >= 0")
    .Attr("state_initial_value: float = 0.0")
    .Attr("nesterov: bool = false")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Fused lazy optimizer update of a dynamic table: duplicate keys' gradients are summed, then each
touched row and its state are updated in place by kit_src/core/optimizers/update_rules.h.
hyper: the rule's hyper-parameters in the order Sok>OptimizerRules names them (the fields of
its struct in update_rules.h: adam's lr already bias-corrected, ftrl's l2 including
beta / (2 lr), flags as 0/1), in the device's memory (a GPU kernel reads it there): values needing more state than state_dim (a momentum without its state) write nothing
on the GPU, while the CPU reports them.
)doc");

}  // namespace op_defs
}  // namespace sok
