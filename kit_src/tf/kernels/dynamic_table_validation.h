// What the CPU and GPU kernels of the dynamic table ops share: the table lookup, the attrs of
// Sok>DynamicTableCreate and the shape checks, so both devices refuse the same inputs with the
// same messages.
#pragma once

#include <string>
#include <vector>

#include "kit_src/core/hash_table/dynamic_table.h"
#include "kit_src/core/hash_table/row_initializer.h"
#include "kit_src/core/optimizers/rule_by_name.h"
#include "kit_src/tf/kernels/dynamic_table_resource.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"

namespace sok {

// The table behind input `input`, which must live on the op's device (on_gpu).
inline ::tensorflow::Status GetTable(::tensorflow::OpKernelContext* ctx, int input, bool on_gpu,
                                     ::tensorflow::core::RefCountPtr<DynamicTableResource>* table) {
  namespace tf = ::tensorflow;
  tf::Status status = tf::LookupResource(ctx, tf::HandleFromInput(ctx, input), table);
  if (!status.ok()) {
    return tf::errors::FailedPrecondition("dynamic table of input ", input,
                                          " is not created or was destroyed: ", status.message());
  }
  if ((*table)->on_gpu() != on_gpu) {
    return tf::errors::FailedPrecondition((*table)->DebugString(), " cannot be used by an op on ",
                                          on_gpu ? "a GPU" : "the CPU");
  }
  return tf::Status();
}

// Fails unless `tensor` is [rows, cols]; `what` names it in the error.
inline ::tensorflow::Status CheckMatrix(const ::tensorflow::Tensor& tensor, int64_t rows,
                                        int64_t cols, const char* what) {
  if (tensor.dims() == 2 && tensor.dim_size(0) == rows && tensor.dim_size(1) == cols) {
    return ::tensorflow::Status();
  }
  return ::tensorflow::errors::InvalidArgument(what, " must be [", rows, ", ", cols, "], got ",
                                               tensor.shape().DebugString());
}

inline ::tensorflow::Status CheckKeys(const ::tensorflow::Tensor& keys) {
  if (!::tensorflow::TensorShapeUtils::IsVector(keys.shape())) {
    return ::tensorflow::errors::InvalidArgument("keys must be a vector, got shape ",
                                                 keys.shape().DebugString());
  }
  return ::tensorflow::Status();
}

// keys: [R, 2] (table index, key) pairs, as PartitionKeys(pair_keys) lays them out.
inline ::tensorflow::Status CheckKeyPairsShape(const ::tensorflow::Tensor& keys) {
  if (keys.dims() != 2 || keys.dim_size(1) != 2) {
    return ::tensorflow::errors::InvalidArgument("keys must be [n, 2] (table, key) pairs, got ",
                                                 keys.shape().DebugString());
  }
  return ::tensorflow::Status();
}

// Sok>DynamicTableImport's state: [n, state_dim], or [any, 0] for none.
inline ::tensorflow::Status CheckRestoredState(const ::tensorflow::Tensor& state, int64_t n) {
  if (state.dims() == 2 && (state.dim_size(0) == n || state.dim_size(1) == 0)) {
    return ::tensorflow::Status();
  }
  return ::tensorflow::errors::InvalidArgument("restored state must be [", n,
                                               ", state_dim], got ", state.shape().DebugString());
}

// Sok>DynamicGatherRows' admit_probability: empty, or one entry per table.
inline ::tensorflow::Status CheckAdmitProbability(const std::vector<float>& admit_probability,
                                                  int num_tables) {
  if (admit_probability.empty() || static_cast<int>(admit_probability.size()) == num_tables) {
    return ::tensorflow::Status();
  }
  return ::tensorflow::errors::InvalidArgument("admit_probability needs one entry per table");
}

inline ::tensorflow::Status PairNamesNoTable(int64_t pair, int64_t table, int64_t num_tables) {
  return ::tensorflow::errors::InvalidArgument("key pair ", pair, " names table ", table, " of ",
                                               num_tables);
}

// Sok>DynamicTableCreate's attrs.
inline ::tensorflow::Status ReadTableAttrs(::tensorflow::OpKernelConstruction* ctx,
                                           HashTableOptions* options,
                                           RowInitializer* initializer) {
  std::string evict, kind, value_dtype;
  int64_t seed = 0;
  TF_RETURN_IF_ERROR(ctx->GetAttr("dim", &options->dim));
  TF_RETURN_IF_ERROR(ctx->GetAttr("init_capacity", &options->init_capacity));
  TF_RETURN_IF_ERROR(ctx->GetAttr("max_capacity", &options->max_capacity));
  TF_RETURN_IF_ERROR(ctx->GetAttr("evict_strategy", &evict));
  TF_RETURN_IF_ERROR(ctx->GetAttr("initializer", &kind));
  TF_RETURN_IF_ERROR(ctx->GetAttr("init_a", &initializer->a));
  TF_RETURN_IF_ERROR(ctx->GetAttr("init_b", &initializer->b));
  TF_RETURN_IF_ERROR(ctx->GetAttr("seed", &seed));
  TF_RETURN_IF_ERROR(ctx->GetAttr("value_dtype", &value_dtype));
  initializer->seed = static_cast<uint64_t>(seed);
  options->value_type = value_dtype == "float16"    ? ValueType::kFloat16
                        : value_dtype == "bfloat16" ? ValueType::kBfloat16
                                                    : ValueType::kFloat32;
  options->evict = evict == "lru"   ? EvictStrategy::kLru
                   : evict == "lfu" ? EvictStrategy::kLfu
                                    : EvictStrategy::kNone;
  initializer->kind = kind == "uniform"    ? RowInitializer::Kind::kUniform
                      : kind == "constant" ? RowInitializer::Kind::kConstant
                                           : RowInitializer::Kind::kNormal;
  return ::tensorflow::Status();
}

// Sok>DynamicApply's attrs and its hyper-parameter count check.
struct DynamicApplyAttrs {
  std::string rule;
  int64_t state_dim = 0;
  float state_initial_value = 0.0f;
  bool nesterov = false;
  ::tensorflow::Status Read(::tensorflow::OpKernelConstruction* ctx) {
    TF_RETURN_IF_ERROR(ctx->GetAttr("rule", &rule));
    TF_RETURN_IF_ERROR(ctx->GetAttr("state_dim", &state_dim));
    TF_RETURN_IF_ERROR(ctx->GetAttr("state_initial_value", &state_initial_value));
    return ctx->GetAttr("nesterov", &nesterov);
  }
  ::tensorflow::Status CheckHyper(const ::tensorflow::Tensor& hyper) const {
    if (RuleHyperCount(rule) == hyper.NumElements()) return ::tensorflow::Status();
    return ::tensorflow::errors::InvalidArgument(rule, " takes ", RuleHyperCount(rule),
                                                 " hyper-parameters, got ", hyper.NumElements());
  }
};

}  // namespace sok
