// CPU kernels of the dynamic table ops: validate, allocate, call kit_src/core/hash_table.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "kit_src/core/optimizers/sum_duplicates.h"
#include "kit_src/core/optimizers/rule_by_name.h"
#include "kit_src/tf/kernels/core_bridge.h"
#include "kit_src/tf/kernels/pooled_output.h"
#include "kit_src/tf/kernels/dynamic_table_resource.h"
#include "kit_src/tf/kernels/dynamic_table_validation.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_op_kernel.h"

namespace sok {

namespace tf = ::tensorflow;

REGISTER_KERNEL_BUILDER(Name("Sok>DynamicTableHandle").Device(tf::DEVICE_CPU),
                        tf::ResourceHandleOp<DynamicTableResource>);

namespace {

// Allocates output `index` with `shape` and copies `data` (row-major, shape's elements) in.
template <typename T>
tf::Status CopyToOutput(tf::OpKernelContext* ctx, int index, const tf::TensorShape& shape,
                        const std::vector<T>& data) {
  tf::Tensor* out = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(index, shape, &out));
  if (!data.empty()) std::memcpy(out->flat<T>().data(), data.data(), data.size() * sizeof(T));
  return tf::Status();
}

}  // namespace

class DynamicTableCreateOp : public tf::OpKernel {
 public:
  explicit DynamicTableCreateOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadTableAttrs(ctx, &options_, &initializer_));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    auto* resource = new DynamicTableResource(options_, initializer_);
    OP_REQUIRES_OK(ctx, tf::CreateResource(ctx, tf::HandleFromInput(ctx, 0), resource));
  }

 private:
  HashTableOptions options_;
  RowInitializer initializer_;
};
REGISTER_KERNEL_BUILDER(Name("Sok>DynamicTableCreate").Device(tf::DEVICE_CPU), DynamicTableCreateOp);

class DynamicTableSizeOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<DynamicTableResource> table;
    OP_REQUIRES_OK(ctx, GetTable(ctx, 0, false, &table));
    tf::Tensor* size = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({}), &size));
    size->scalar<int64_t>()() = table->table().size();
  }
};
REGISTER_KERNEL_BUILDER(Name("Sok>DynamicTableSize").Device(tf::DEVICE_CPU), DynamicTableSizeOp);

// Sok>DynamicTableLookup and Sok>DynamicTableLookupEvict (always inserts, and also outputs
// the keys the insertion evicted with their rows).
class DynamicTableLookupOp : public tf::OpKernel {
 public:
  explicit DynamicTableLookupOp(tf::OpKernelConstruction* ctx)
      : OpKernel(ctx), reports_evictions_(ctx->def().op() == "Sok>DynamicTableLookupEvict") {
    if (!reports_evictions_) OP_REQUIRES_OK(ctx, ctx->GetAttr("insert", &insert_));
  }
  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<DynamicTableResource> table;
    OP_REQUIRES_OK(ctx, GetTable(ctx, 0, false, &table));
    const tf::Tensor& keys = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckKeys(keys));
    const int64_t dim = table->table().dim();
    tf::Tensor* values = nullptr;
    OP_REQUIRES_OK(ctx, AllocatePooledOutput(ctx, 0, tf::TensorShape({keys.NumElements(), dim}),
                                             &values));
    CpuHashTable::EvictedRows evicted;
    SOK_OP_REQUIRES_OK(ctx, table->table().Lookup(keys.flat<int64_t>().data(), keys.NumElements(),
                                                  insert_, values->flat<float>().data(),
                                                  CpuParallelFor(ctx), 1.0f,
                                                  reports_evictions_ ? &evicted : nullptr));
    if (!reports_evictions_) return;
    const int64_t count = static_cast<int64_t>(evicted.keys.size());
    tf::Tensor *evicted_keys = nullptr, *evicted_values = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, tf::TensorShape({count}), &evicted_keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, tf::TensorShape({count, dim}), &evicted_values));
    std::copy(evicted.keys.begin(), evicted.keys.end(), evicted_keys->flat<int64_t>().data());
    std::copy(evicted.values.begin(), evicted.values.end(), evicted_values->flat<float>().data());
  }

 private:
  const bool reports_evictions_;
  bool insert_ = true;
};
REGISTER_KERNEL_BUILDER(Name("Sok>DynamicTableLookup").Device(tf::DEVICE_CPU), DynamicTableLookupOp);
REGISTER_KERNEL_BUILDER(Name("Sok>DynamicTableLookupEvict").Device(tf::DEVICE_CPU),
                        DynamicTableLookupOp);

class DynamicTableAssignOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<DynamicTableResource> table;
    OP_REQUIRES_OK(ctx, GetTable(ctx, 0, false, &table));
    const tf::Tensor& keys = ctx->input(1);
    const tf::Tensor& values = ctx->input(2);
    const tf::Tensor& state = ctx->input(3);
    OP_REQUIRES_OK(ctx, CheckKeys(keys));
    const int64_t n = keys.NumElements(), dim = table->table().dim();
    OP_REQUIRES_OK(ctx, CheckMatrix(values, n, dim, "values"));
    const bool with_state = state.NumElements() > 0;
    if (with_state) {
      OP_REQUIRES_OK(ctx, CheckMatrix(state, n, table->table().state_dim(), "state"));
    }
    SOK_OP_REQUIRES_OK(ctx, table->table().Assign(keys.flat<int64_t>().data(), n,
                                                  values.flat<float>().data(),
                                                  with_state ? state.flat<float>().data() : nullptr));
  }
};
REGISTER_KERNEL_BUILDER(Name("Sok>DynamicTableAssign").Device(tf::DEVICE_CPU), DynamicTableAssignOp);

class DynamicTableImportOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<DynamicTableResource> table;
    OP_REQUIRES_OK(ctx, GetTable(ctx, 0, false, &table));
    const tf::Tensor& keys = ctx->input(1);
    const tf::Tensor& values = ctx->input(2);
    const tf::Tensor& state = ctx->input(3);
    OP_REQUIRES_OK(ctx, CheckKeys(keys));
    const int64_t n = keys.NumElements(), dim = table->table().dim();
    OP_REQUIRES_OK(ctx, CheckMatrix(values, n, dim, "restored values"));
    OP_REQUIRES_OK(ctx, CheckRestoredState(state, n));
    const int64_t state_dim = state.dim_size(1);
    SOK_OP_REQUIRES_OK(ctx, table->table().Replace(
                                keys.flat<int64_t>().data(), n, values.flat<float>().data(),
                                state_dim > 0 ? state.flat<float>().data() : nullptr, state_dim));
  }
};
REGISTER_KERNEL_BUILDER(Name("Sok>DynamicTableImport").Device(tf::DEVICE_CPU), DynamicTableImportOp);

class DynamicTableEraseOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<DynamicTableResource> table;
    OP_REQUIRES_OK(ctx, GetTable(ctx, 0, false, &table));
    const tf::Tensor& keys = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckKeys(keys));
    tf::Tensor* erased = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({}), &erased));
    erased->scalar<int64_t>()() = table->table().Erase(keys.flat<int64_t>().data(), keys.NumElements());
  }
};
REGISTER_KERNEL_BUILDER(Name("Sok>DynamicTableErase").Device(tf::DEVICE_CPU), DynamicTableEraseOp);

class DynamicTableExportOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<DynamicTableResource> table;
    OP_REQUIRES_OK(ctx, GetTable(ctx, 0, false, &table));
    std::vector<int64_t> keys;
    std::vector<float> values, state;
    table->table().Export(&keys, &values, &state);
    const int64_t n = static_cast<int64_t>(keys.size());
    const int64_t dim = table->table().dim(), state_dim = table->table().state_dim();
    OP_REQUIRES_OK(ctx, CopyToOutput(ctx, 0, tf::TensorShape({n}), keys));
    OP_REQUIRES_OK(ctx, CopyToOutput(ctx, 1, tf::TensorShape({n, dim}), values));
    OP_REQUIRES_OK(ctx, CopyToOutput(ctx, 2, tf::TensorShape({n, state_dim}), state));
  }
};
REGISTER_KERNEL_BUILDER(Name("Sok>DynamicTableExport").Device(tf::DEVICE_CPU), DynamicTableExportOp);

class DynamicTableExportWrittenOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<DynamicTableResource> table;
    OP_REQUIRES_OK(ctx, GetTable(ctx, 0, false, &table));
    const tf::Tensor& since = ctx->input(1);
    OP_REQUIRES(ctx, tf::TensorShapeUtils::IsScalar(since.shape()),
                tf::errors::InvalidArgument("written_after_us must be a scalar, got shape ",
                                            since.shape().DebugString()));
    std::vector<int64_t> keys;
    std::vector<float> values;
    table->table().Export(&keys, &values, nullptr, since.scalar<int64_t>()());
    const int64_t n = static_cast<int64_t>(keys.size()), dim = table->table().dim();
    OP_REQUIRES_OK(ctx, CopyToOutput(ctx, 0, tf::TensorShape({n}), keys));
    OP_REQUIRES_OK(ctx, CopyToOutput(ctx, 1, tf::TensorShape({n, dim}), values));
  }
};
REGISTER_KERNEL_BUILDER(Name("Sok>DynamicTableExportWritten").Device(tf::DEVICE_CPU),
                        DynamicTableExportWrittenOp);

// keys: [R, 2] (table index, key) pairs naming tables [0, num_tables).
tf::Status CheckKeyPairs(const tf::Tensor& keys, int64_t num_tables) {
  TF_RETURN_IF_ERROR(CheckKeyPairsShape(keys));
  const auto pairs = keys.matrix<int64_t>();
  for (int64_t i = 0; i < keys.dim_size(0); ++i) {
    if (pairs(i, 0) < 0 || pairs(i, 0) >= num_tables) {
      return PairNamesNoTable(i, pairs(i, 0), num_tables);
    }
  }
  return tf::Status();
}

// Rows of each table's keys, grouped: per table the positions (in `keys`) of its pairs.
std::vector<std::vector<int64_t>> PositionsByTable(const tf::Tensor& keys, int64_t num_tables) {
  std::vector<std::vector<int64_t>> positions(num_tables);
  const auto pairs = keys.matrix<int64_t>();
  for (int64_t i = 0; i < keys.dim_size(0); ++i) positions[pairs(i, 0)].push_back(i);
  return positions;
}

class DynamicGatherRowsOp : public tf::OpKernel {
 public:
  explicit DynamicGatherRowsOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("insert", &insert_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("admit_probability", &admit_probability_));
  }
  void Compute(tf::OpKernelContext* ctx) override {
    const int num_tables = ctx->num_inputs() - 1;
    OP_REQUIRES_OK(ctx, CheckAdmitProbability(admit_probability_, num_tables));
    const tf::Tensor& keys = ctx->input(num_tables);
    OP_REQUIRES_OK(ctx, CheckKeyPairs(keys, num_tables));
    const int64_t n = keys.dim_size(0);
    tf::Tensor* rows = nullptr;
    OP_REQUIRES_OK(ctx, AllocatePooledOutput(ctx, 0, tf::TensorShape({n, dim_}), &rows));
    const auto pairs = keys.matrix<int64_t>();
    const std::vector<std::vector<int64_t>> positions = PositionsByTable(keys, num_tables);
    for (int t = 0; t < num_tables; ++t) {
      if (positions[t].empty()) continue;
      tf::core::RefCountPtr<DynamicTableResource> table;
      OP_REQUIRES_OK(ctx, GetTable(ctx, t, false, &table));
      OP_REQUIRES(ctx, table->table().dim() == dim_,
                  tf::errors::InvalidArgument("dynamic table ", t, " has dim ",
                                              table->table().dim(), ", expected ", dim_));
      const int64_t count = static_cast<int64_t>(positions[t].size());
      std::vector<int64_t> table_keys(count);
      for (int64_t j = 0; j < count; ++j) table_keys[j] = pairs(positions[t][j], 1);
      std::vector<float> values(count * dim_);
      const float admit = admit_probability_.empty() ? 1.0f : admit_probability_[t];
      SOK_OP_REQUIRES_OK(ctx, table->table().Lookup(table_keys.data(), count, insert_,
                                                    values.data(), CpuParallelFor(ctx), admit));
      float* out = rows->flat<float>().data();
      for (int64_t j = 0; j < count; ++j) {
        std::memcpy(out + positions[t][j] * dim_, values.data() + j * dim_, dim_ * sizeof(float));
      }
    }
  }

 private:
  int64_t dim_ = 0;
  bool insert_ = true;
  std::vector<float> admit_probability_;
};
REGISTER_KERNEL_BUILDER(Name("Sok>DynamicGatherRows").Device(tf::DEVICE_CPU), DynamicGatherRowsOp);

class SplitDynamicGradientOp : public tf::OpKernel {
 public:
  explicit SplitDynamicGradientOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_tables", &num_tables_));
  }
  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& keys = ctx->input(0);
    const tf::Tensor& grad = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckKeyPairs(keys, num_tables_));
    OP_REQUIRES(ctx, grad.dims() == 2 && grad.dim_size(0) == keys.dim_size(0),
                tf::errors::InvalidArgument("grad must be [keys, dim], got ",
                                            grad.shape().DebugString()));
    const int64_t dim = grad.dim_size(1);
    const auto pairs = keys.matrix<int64_t>();
    const std::vector<std::vector<int64_t>> positions = PositionsByTable(keys, num_tables_);
    for (int64_t t = 0; t < num_tables_; ++t) {
      const int64_t count = static_cast<int64_t>(positions[t].size());
      tf::Tensor *indices = nullptr, *values = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(t, tf::TensorShape({count}), &indices));
      OP_REQUIRES_OK(ctx, AllocatePooledOutput(ctx, num_tables_ + t,
                                               tf::TensorShape({count, dim}), &values));
      for (int64_t j = 0; j < count; ++j) {
        indices->flat<int64_t>()(j) = pairs(positions[t][j], 1);
        std::memcpy(values->flat<float>().data() + j * dim,
                    grad.flat<float>().data() + positions[t][j] * dim, dim * sizeof(float));
      }
    }
  }

 private:
  int64_t num_tables_ = 0;
};
REGISTER_KERNEL_BUILDER(Name("Sok>SplitDynamicGradient").Device(tf::DEVICE_CPU), SplitDynamicGradientOp);

class DynamicApplyOp : public tf::OpKernel {
 public:
  explicit DynamicApplyOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<DynamicTableResource> resource;
    OP_REQUIRES_OK(ctx, GetTable(ctx, 0, false, &resource));
    CpuHashTable& table = resource->table();
    const tf::Tensor& keys = ctx->input(1);
    const tf::Tensor& grads = ctx->input(2);
    const tf::Tensor& hyper = ctx->input(3);
    OP_REQUIRES_OK(ctx, CheckKeys(keys));
    const int64_t n = keys.NumElements(), dim = table.dim();
    OP_REQUIRES_OK(ctx, CheckMatrix(grads, n, dim, "grads"));
    OP_REQUIRES_OK(ctx, attrs_.CheckHyper(hyper));
    // The rule must find the state it reads and writes (past it lies the next row).
    bool fits = true;
    SOK_OP_REQUIRES_OK(ctx, VisitRule(attrs_.rule, hyper.flat<float>().data(),
                                      hyper.NumElements(), attrs_.nesterov,
                                      [&](const auto& rule) {
      fits = RuleStateFloats(rule, dim) <= std::max(attrs_.state_dim, table.state_dim());
    }));
    OP_REQUIRES(ctx, fits && attrs_.state_dim % dim == 0 && attrs_.state_dim <= 3 * dim,
                tf::errors::InvalidArgument("rule ", attrs_.rule, " does not fit a state of ",
                                            attrs_.state_dim, " floats per key"));
    // Sum the gradients of duplicate keys so each row is updated once.
    std::vector<int64_t> unique_keys;
    std::vector<float> summed;
    SumDuplicates(keys.flat<int64_t>().data(), GradientUses{grads.flat<float>().data()}, n, dim,
                  &unique_keys, &summed);
    table.EnsureState(attrs_.state_dim, attrs_.state_initial_value);
    const float* g = summed.data();
    SOK_OP_REQUIRES_OK(ctx, VisitRule(attrs_.rule, hyper.flat<float>().data(), hyper.NumElements(),
                                      attrs_.nesterov, [&](const auto& rule) {
      table.UpdateRows(
          unique_keys.data(), unique_keys.size(),
          [&](int64_t i, float* w, float* state) { ApplyRule(w, state, g + i * dim, dim, rule); },
          CpuParallelFor(ctx));
    }));
  }

 private:
  DynamicApplyAttrs attrs_;
};
REGISTER_KERNEL_BUILDER(Name("Sok>DynamicApply").Device(tf::DEVICE_CPU), DynamicApplyOp);

}  // namespace sok
