// The dynamic table ops, one OpKernel each for both devices: validate, allocate, call the
// table through the core's interface (kit_src/core/hash_table/dynamic_table.h) on the op's
// device; what differs by device is in dynamic_table_functor.h. A GPU table's calls are
// enqueued on TensorFlow's stream and do not wait for it while the table has room; the ops
// whose output sizes depend on the data wait once, documented at each.
#include <string>
#include <vector>

#include "kit_src/tf/kernels/core_bridge.h"
#include "kit_src/tf/kernels/dynamic_table_functor.h"
#include "kit_src/tf/kernels/dynamic_table_resource.h"
#include "kit_src/tf/kernels/dynamic_table_validation.h"
#include "kit_src/tf/kernels/register_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_op_kernel.h"

namespace sok {

namespace tf = ::tensorflow;

namespace {

using TableRef = tf::core::RefCountPtr<DynamicTableResource>;

template <typename Device>
tf::Status GetDeviceTable(tf::OpKernelContext* ctx, int input, TableRef* table) {
  return GetTable(ctx, input, kOnGpu<Device>, table);
}

// Hands a table's data-sized outputs (evicted or exported rows) out of the op's outputs,
// starting at output `first`.
Status AllocateOutputs(tf::OpKernelContext* ctx, int first,
                       const std::vector<tf::TensorShape>& shapes,
                       const std::vector<void**>& data) {
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (data[i] == nullptr) continue;
    tf::Tensor* out = nullptr;
    SOK_RETURN_IF_ERROR(ToCoreStatus(ctx->allocate_output(first + static_cast<int>(i), shapes[i], &out)));
    *data[i] = out->data();
  }
  return Status::Ok();
}

}  // namespace

// An op on a table: the table (input 0), on the op's device, handed to ComputeOnTable.
template <typename Device>
class TableOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) final {
    TableRef resource;
    OP_REQUIRES_OK(ctx, GetDeviceTable<Device>(ctx, 0, &resource));
    ComputeOnTable(ctx, resource->table());
  }

 protected:
  virtual void ComputeOnTable(tf::OpKernelContext* ctx, DynamicTable& table) = 0;
};

// An op on a table's keys: the table (input 0) and its keys (input 1), checked, handed to
// ComputeOnKeys with the table's execution context on the op's device.
template <typename Device>
class KeyedTableOp : public TableOp<Device> {
 public:
  using TableOp<Device>::TableOp;

 protected:
  void ComputeOnTable(tf::OpKernelContext* ctx, DynamicTable& table) final {
    const tf::Tensor& keys = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckKeys(keys));
    ComputeOnKeys(ctx, table, keys, functor::TableContextOf<Device>()(ctx));
  }
  virtual void ComputeOnKeys(tf::OpKernelContext* ctx, DynamicTable& table,
                             const tf::Tensor& keys, const TableContext& context) = 0;
};

template <typename Device>
class DynamicTableCreateOp : public tf::OpKernel {
 public:
  explicit DynamicTableCreateOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadTableAttrs(ctx, &options_, &initializer_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("hbm_budget_bytes", &hbm_budget_bytes_));
    if (hbm_budget_bytes_ > 0) OP_REQUIRES_OK(ctx, ToTfStatus(CheckHotBudget(options_, hbm_budget_bytes_)));
  }
  void Compute(tf::OpKernelContext* ctx) override {
    std::shared_ptr<DynamicTable> table;
    if (hbm_budget_bytes_ > 0 && !BudgetHoldsTable(options_, hbm_budget_bytes_)) {
      OP_REQUIRES_OK(ctx, NewTieredTable(ctx, &table));
    } else {
      OP_REQUIRES_OK(ctx, functor::NewDynamicTable<Device>()(ctx, options_, initializer_, &table));
    }
    auto* resource = new DynamicTableResource(std::move(table));
    OP_REQUIRES_OK(ctx, tf::CreateResource(ctx, tf::HandleFromInput(ctx, 0), resource));
  }

 private:
  // The device's table as the hot tier over a host table.
  tf::Status NewTieredTable(tf::OpKernelContext* ctx, std::shared_ptr<DynamicTable>* table) {
    std::shared_ptr<DynamicTable> hot;
    TF_RETURN_IF_ERROR(functor::NewDynamicTable<Device>()(
        ctx, HotTierOptions(options_, hbm_budget_bytes_), initializer_, &hot));
    *table = std::make_shared<TieredTable>(options_, hbm_budget_bytes_, std::move(hot),
                                           std::make_unique<CpuHashTable>(
                                               ColdTierOptions(options_), initializer_),
                                           functor::NewTierMemory<Device>()(ctx));
    return tf::Status();
  }

  HashTableOptions options_;
  RowInitializer initializer_;
  int64_t hbm_budget_bytes_ = 0;
};

template <typename Device>
class DynamicTableTierCountsOp : public TableOp<Device> {
 public:
  using TableOp<Device>::TableOp;

 private:
  void ComputeOnTable(tf::OpKernelContext* ctx, DynamicTable& table) override {
    TierCounts counts;
    const bool tiered = table.Tiers(&counts, functor::TableContextOf<Device>()(ctx));
    tf::Tensor* out = nullptr;
    const int64_t all[] = {tiered, counts.hot_keys, counts.host_keys, counts.ids_looked_up,
                           counts.hot_hits, counts.moved_up, counts.moved_down,
                           counts.lookup_ns, counts.take_up_ns, counts.move_down_ns,
                           counts.move_up_ns, counts.write_back_ns,
                           counts.write_back_wait_ns};
    constexpr int64_t kCounts = sizeof(all) / sizeof(all[0]);
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({kCounts}), &out));
    auto values = out->flat<int64_t>();
    for (int64_t i = 0; i < kCounts; ++i) values(i) = all[i];
  }
};

template <typename Device>
class DynamicTableSizeOp : public TableOp<Device> {
 public:
  using TableOp<Device>::TableOp;

 private:
  void ComputeOnTable(tf::OpKernelContext* ctx, DynamicTable& table) override {
    tf::Tensor* size = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({}), &size));
    SOK_OP_REQUIRES_OK(ctx, table.Size(size->flat<int64_t>().data(),
                                       functor::TableContextOf<Device>()(ctx)));
  }
};

// Sok>DynamicTableLookup and Sok>DynamicTableLookupEvict (always inserts, and also outputs
// the keys the insertion evicted with their rows). The evicted count is known on the host
// only when the lookup evicts, which on the GPU already waits for the stream (the table's
// exact path); otherwise nothing waits.
template <typename Device>
class DynamicTableLookupOp : public KeyedTableOp<Device> {
 public:
  explicit DynamicTableLookupOp(tf::OpKernelConstruction* ctx)
      : KeyedTableOp<Device>(ctx),
        reports_evictions_(ctx->def().op() == "Sok>DynamicTableLookupEvict") {
    if (!reports_evictions_) OP_REQUIRES_OK(ctx, ctx->GetAttr("insert", &insert_));
  }

 private:
  void ComputeOnKeys(tf::OpKernelContext* ctx, DynamicTable& table, const tf::Tensor& keys,
                     const TableContext& context) override {
    const int64_t n = keys.NumElements(), dim = table.dim();
    tf::Tensor* values = nullptr;
    OP_REQUIRES_OK(ctx, AllocateRowsOutput<Device>(ctx, 0, tf::TensorShape({n, dim}), &values));
    const TableKeys view{keys.flat<int64_t>().data(), n, 1, 0};
    float* rows = values->flat<float>().data();
    if (!insert_) {
      SOK_OP_REQUIRES_OK(ctx, table.Find(view, rows, context));
      return;
    }
    EvictedRows evicted;
    evicted.allocate = [ctx, dim](int64_t count, int64_t** keys_out, float** values_out) {
      return AllocateOutputs(ctx, 1, {tf::TensorShape({count}), tf::TensorShape({count, dim})},
                             {reinterpret_cast<void**>(keys_out),
                              reinterpret_cast<void**>(values_out)});
    };
    SOK_OP_REQUIRES_OK(ctx, table.FindOrInsert(view, rows, 1.0f,
                                               reports_evictions_ ? &evicted : nullptr, context));
    if (reports_evictions_ && evicted.count == 0) {  // nothing evicted: empty outputs
      tf::Tensor* unused = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(1, tf::TensorShape({0}), &unused));
      OP_REQUIRES_OK(ctx, ctx->allocate_output(2, tf::TensorShape({0, dim}), &unused));
    }
  }

  const bool reports_evictions_;
  bool insert_ = true;
};

// Sok>DynamicTableAssign (inserts or overwrites the keys' rows, and their state unless `state`
// is empty) and Sok>DynamicTableImport (replaces the whole content; state may have 0 columns).
template <typename Device>
class DynamicTableWriteOp : public KeyedTableOp<Device> {
 public:
  explicit DynamicTableWriteOp(tf::OpKernelConstruction* ctx)
      : KeyedTableOp<Device>(ctx), replaces_(ctx->def().op() == "Sok>DynamicTableImport") {}

 private:
  void ComputeOnKeys(tf::OpKernelContext* ctx, DynamicTable& table, const tf::Tensor& keys,
                     const TableContext& context) override {
    const tf::Tensor& values = ctx->input(2);
    const tf::Tensor& state = ctx->input(3);
    const int64_t n = keys.NumElements();
    const int64_t* key_data = keys.flat<int64_t>().data();
    if (replaces_) {
      OP_REQUIRES_OK(ctx, CheckMatrix(values, n, table.dim(), "restored values"));
      OP_REQUIRES_OK(ctx, CheckRestoredState(state, n));
      const int64_t state_dim = state.dim_size(1);
      SOK_OP_REQUIRES_OK(ctx, table.Replace(key_data, n, values.flat<float>().data(),
                                            state_dim > 0 ? state.flat<float>().data() : nullptr,
                                            state_dim, context));
      return;
    }
    OP_REQUIRES_OK(ctx, CheckMatrix(values, n, table.dim(), "values"));
    const bool with_state = state.NumElements() > 0;
    if (with_state) OP_REQUIRES_OK(ctx, CheckMatrix(state, n, table.state_dim(), "state"));
    SOK_OP_REQUIRES_OK(ctx, table.InsertOrAssign(key_data, n, values.flat<float>().data(),
                                                 with_state ? state.flat<float>().data() : nullptr,
                                                 context));
  }

  const bool replaces_;
};

template <typename Device>
class DynamicTableEraseOp : public KeyedTableOp<Device> {
 public:
  using KeyedTableOp<Device>::KeyedTableOp;

 private:
  void ComputeOnKeys(tf::OpKernelContext* ctx, DynamicTable& table, const tf::Tensor& keys,
                     const TableContext& context) override {
    tf::Tensor* erased = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({}), &erased));
    SOK_OP_REQUIRES_OK(ctx, table.Erase(keys.flat<int64_t>().data(), keys.NumElements(),
                                        erased->flat<int64_t>().data(), context));
  }
};

// Sok>DynamicTableExport (every row with its state) and Sok>DynamicTableExportWritten (the
// rows written after a time, without state). The GPU waits for the stream: the number of
// rows sizes the outputs.
template <typename Device>
class DynamicTableExportOp : public TableOp<Device> {
 public:
  explicit DynamicTableExportOp(tf::OpKernelConstruction* ctx)
      : TableOp<Device>(ctx), written_only_(ctx->def().op() == "Sok>DynamicTableExportWritten") {}

 private:
  void ComputeOnTable(tf::OpKernelContext* ctx, DynamicTable& table) override {
    int64_t written_after_us = kExportAll;
    if (written_only_) {
      const tf::Tensor& since = ctx->input(1);
      OP_REQUIRES(ctx, tf::TensorShapeUtils::IsScalar(since.shape()),
                  tf::errors::InvalidArgument("written_after_us must be a scalar, got shape ",
                                              since.shape().DebugString()));
      written_after_us = since.scalar<int64_t>()();
    }
    const int64_t dim = table.dim(), state_dim = table.state_dim();
    const ExportOutputs outputs = [&](int64_t n, int64_t** keys, float** values,
                                      float** state) {
      return AllocateOutputs(
          ctx, 0,
          {tf::TensorShape({n}), tf::TensorShape({n, dim}), tf::TensorShape({n, state_dim})},
          {reinterpret_cast<void**>(keys), reinterpret_cast<void**>(values),
           reinterpret_cast<void**>(state)});
    };
    SOK_OP_REQUIRES_OK(ctx, table.Export(written_after_us, !written_only_, outputs,
                                         functor::TableContextOf<Device>()(ctx)));
  }

 private:
  const bool written_only_;
};

// The owner's read of a distributed lookup: rows of (table, key) pairs. With validate a
// pair naming no table fails the op before any table is read (the GPU waits for the stream
// once for that check); without, its row is zeros (pairs Sok>PartitionKeys built need none).
template <typename Device>
class DynamicGatherRowsOp : public tf::OpKernel {
 public:
  explicit DynamicGatherRowsOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadAttrs(ctx, "dim", &dim_, "insert", &insert_,
                                  "admit_probability", &admit_probability_,
                                  "validate", &validate_));
  }
  void Compute(tf::OpKernelContext* ctx) override {
    const int num_tables = ctx->num_inputs() - 1;
    OP_REQUIRES_OK(ctx, CheckAdmitProbability(admit_probability_, num_tables));
    const tf::Tensor& keys = ctx->input(num_tables);
    OP_REQUIRES_OK(ctx, CheckKeyPairsShape(keys));
    const int64_t n = keys.dim_size(0);
    const int64_t* pairs = keys.flat<int64_t>().data();
    if (validate_) {
      tf::Tensor order;
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(tf::DT_INT32, tf::TensorShape({n}), &order));
      PairGroups groups;
      OP_REQUIRES_OK(ctx, functor::GroupPairs<Device>()(ctx, pairs, n, num_tables, &order,
                                                        &groups));
    }
    std::vector<TableRef> held(num_tables);
    std::vector<DynamicTable*> tables(num_tables);
    for (int t = 0; t < num_tables; ++t) {
      OP_REQUIRES_OK(ctx, GetDeviceTable<Device>(ctx, t, &held[t]));
      OP_REQUIRES(ctx, held[t]->dim() == dim_,
                  tf::errors::InvalidArgument("dynamic table ", t, " has dim ", held[t]->dim(),
                                              ", expected ", dim_));
      tables[t] = &held[t]->table();
    }
    std::vector<float> admit = admit_probability_;
    if (admit.empty()) admit.assign(num_tables, 1.0f);
    tf::Tensor* rows = nullptr;
    OP_REQUIRES_OK(ctx, AllocateRowsOutput<Device>(ctx, 0, tf::TensorShape({n, dim_}), &rows));
    OP_REQUIRES_OK(ctx, functor::ReadPairRows<Device>()(ctx, tables, pairs, n, dim_, insert_,
                                                        admit, rows->flat<float>().data()));
  }

 private:
  int64_t dim_ = 0;
  bool insert_ = true;
  bool validate_ = true;
  std::vector<float> admit_probability_;
};

// The gradient of Sok>DynamicGatherRows split into (keys, rows) per table. The GPU waits for
// the stream once: the per-table counts size the outputs.
template <typename Device>
class SplitDynamicGradientOp : public tf::OpKernel {
 public:
  explicit SplitDynamicGradientOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_tables", &num_tables_));
  }
  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& keys = ctx->input(0);
    const tf::Tensor& grad = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckKeyPairsShape(keys));
    OP_REQUIRES(ctx, grad.dims() == 2 && grad.dim_size(0) == keys.dim_size(0),
                tf::errors::InvalidArgument("grad must be [keys, dim], got ",
                                            grad.shape().DebugString()));
    const int64_t n = keys.dim_size(0), dim = grad.dim_size(1);
    const int64_t* pairs = keys.flat<int64_t>().data();
    tf::Tensor order;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(tf::DT_INT32, tf::TensorShape({n}), &order));
    PairGroups groups;
    OP_REQUIRES_OK(ctx, functor::GroupPairs<Device>()(ctx, pairs, n,
                                                      static_cast<int32_t>(num_tables_), &order,
                                                      &groups));
    int64_t start = 0;
    for (int64_t t = 0; t < num_tables_; ++t) {
      const int64_t count = groups.counts[t];
      tf::Tensor *indices = nullptr, *values = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(t, tf::TensorShape({count}), &indices));
      OP_REQUIRES_OK(ctx, AllocateRowsOutput<Device>(ctx, num_tables_ + t,
                                                     tf::TensorShape({count, dim}), &values));
      OP_REQUIRES_OK(ctx, functor::GatherPairRows<Device>()(
                              ctx, pairs, groups.order + start, count, dim,
                              grad.flat<float>().data(), indices->flat<int64_t>().data(),
                              values->flat<float>().data()));
      start += count;
    }
  }

 private:
  int64_t num_tables_ = 0;
};

// One optimizer step of a table's rows; the hyper-parameters stay in the device's memory.
template <typename Device>
class DynamicApplyOp : public KeyedTableOp<Device> {
 public:
  explicit DynamicApplyOp(tf::OpKernelConstruction* ctx) : KeyedTableOp<Device>(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx));
  }

 private:
  void ComputeOnKeys(tf::OpKernelContext* ctx, DynamicTable& table, const tf::Tensor& keys,
                     const TableContext& context) override {
    const tf::Tensor& grads = ctx->input(2);
    const tf::Tensor& hyper = ctx->input(3);
    const int64_t n = keys.NumElements();
    OP_REQUIRES_OK(ctx, CheckMatrix(grads, n, table.dim(), "grads"));
    OP_REQUIRES_OK(ctx, attrs_.CheckHyper(hyper));
    SparseUpdate update;
    update.rule = attrs_.rule;
    update.hyper = hyper.flat<float>().data();
    update.hyper_count = hyper.NumElements();
    update.nesterov = attrs_.nesterov;
    update.state_dim = attrs_.state_dim;
    update.state_initial_value = attrs_.state_initial_value;
    update.keys = keys.flat<int64_t>().data();
    update.n = n;
    update.grads = grads.flat<float>().data();
    SOK_OP_REQUIRES_OK(ctx, table.ApplySparseUpdate(update, context));
  }

  DynamicApplyAttrs attrs_;
};

// A GPU kernel takes the table's handle in host memory: the resource lives on the host.
#define SOK_REGISTER_TABLE_OP(name, Op, ...) \
  SOK_REGISTER_KERNELS(name, Op, .HostMemory("handle") __VA_ARGS__)
SOK_REGISTER_TABLE_OP("Sok>DynamicTableCreate", DynamicTableCreateOp);
SOK_REGISTER_TABLE_OP("Sok>DynamicTableSize", DynamicTableSizeOp);
SOK_REGISTER_TABLE_OP("Sok>DynamicTableTierCounts", DynamicTableTierCountsOp, .HostMemory("counts"));
SOK_REGISTER_TABLE_OP("Sok>DynamicTableLookup", DynamicTableLookupOp);
SOK_REGISTER_TABLE_OP("Sok>DynamicTableLookupEvict", DynamicTableLookupOp);
SOK_REGISTER_TABLE_OP("Sok>DynamicTableAssign", DynamicTableWriteOp);
SOK_REGISTER_TABLE_OP("Sok>DynamicTableImport", DynamicTableWriteOp);
SOK_REGISTER_TABLE_OP("Sok>DynamicTableErase", DynamicTableEraseOp);
SOK_REGISTER_TABLE_OP("Sok>DynamicTableExport", DynamicTableExportOp);
SOK_REGISTER_TABLE_OP("Sok>DynamicApply", DynamicApplyOp);
SOK_REGISTER_TABLE_OP("Sok>DynamicTableExportWritten", DynamicTableExportOp,
                      .HostMemory("written_after_us"));
#undef SOK_REGISTER_TABLE_OP
SOK_REGISTER_KERNELS("Sok>DynamicGatherRows", DynamicGatherRowsOp, .HostMemory("tables"));
SOK_REGISTER_KERNELS("Sok>SplitDynamicGradient", SplitDynamicGradientOp);

REGISTER_KERNEL_BUILDER(Name("Sok>DynamicTableHandle").Device(tf::DEVICE_CPU),
                        tf::ResourceHandleOp<DynamicTableResource>);
#if GOOGLE_CUDA
REGISTER_KERNEL_BUILDER(Name("Sok>DynamicTableHandle").Device(tf::DEVICE_GPU).HostMemory("handle"),
                        tf::ResourceHandleOp<DynamicTableResource>);
#endif

}  // namespace sok
