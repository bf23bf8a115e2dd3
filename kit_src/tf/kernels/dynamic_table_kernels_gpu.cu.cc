// GPU kernels of the dynamic table ops (the CPU ones are in dynamic_table_kernels.cc): the
// table is a resource created on the GPU (kit_src/core/hash_table/gpu_hash_table.cuh) whose
// arrays come from TensorFlow's GPU allocator, and every op enqueues its work on TensorFlow's
// stream. Lookups and updates do not synchronise while the table has room (the table's
// contract); the ops whose output sizes depend on the data synchronise once, documented at
// each: Sok>DynamicTableExport(Written) and Sok>SplitDynamicGradient.
#if GOOGLE_CUDA
#define EIGEN_USE_GPU  // before any Eigen header: the GPU device
#include <memory>
#include <string>
#include <vector>

#include "kit_src/core/embedding/pair_keys_gpu.cuh"
#include "kit_src/core/hash_table/gpu_hash_table.cuh"
#include "kit_src/tf/kernels/core_bridge.h"
#include "kit_src/tf/kernels/dynamic_table_resource.h"
#include "kit_src/tf/kernels/dynamic_table_validation.h"
#include "kit_src/tf/kernels/gpu_op_util.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_op_kernel.h"

namespace sok {

namespace tf = ::tensorflow;

namespace {

// The table and the allocator it draws from, freed together (table first).
struct GpuTableHolder {
  std::unique_ptr<TfGpuMemory> memory;
  std::unique_ptr<GpuHashTable> table;
  ~GpuTableHolder() { table.reset(); }
};

tf::Status GetGpuTable(tf::OpKernelContext* ctx, int input,
                       tf::core::RefCountPtr<DynamicTableResource>* table) {
  return GetTable(ctx, input, /*on_gpu=*/true, table);
}

}  // namespace

REGISTER_KERNEL_BUILDER(Name("Sok>DynamicTableHandle").Device(tf::DEVICE_GPU).HostMemory("handle"),
                        tf::ResourceHandleOp<DynamicTableResource>);

class DynamicTableCreateGpuOp : public tf::OpKernel {
 public:
  explicit DynamicTableCreateGpuOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadTableAttrs(ctx, &options_, &initializer_));
  }
  void Compute(tf::OpKernelContext* ctx) override {
    auto holder = std::make_shared<GpuTableHolder>();
    holder->memory = std::make_unique<TfGpuMemory>(ctx->device()->GetAllocator({}));
    holder->table = std::make_unique<GpuHashTable>(options_, initializer_, holder->memory.get());
    SOK_OP_REQUIRES_OK(ctx, holder->table->Init(GpuStream(ctx)));
    // The resource shares the holder's ownership but sees the table only.
    std::shared_ptr<GpuHashTable> table(holder, holder->table.get());
    auto* resource = new DynamicTableResource(std::move(table), options_.dim);
    OP_REQUIRES_OK(ctx, tf::CreateResource(ctx, tf::HandleFromInput(ctx, 0), resource));
  }

 private:
  HashTableOptions options_;
  RowInitializer initializer_;
};
REGISTER_KERNEL_BUILDER(Name("Sok>DynamicTableCreate").Device(tf::DEVICE_GPU).HostMemory("handle"),
                        DynamicTableCreateGpuOp);

class DynamicTableSizeGpuOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<DynamicTableResource> table;
    OP_REQUIRES_OK(ctx, GetGpuTable(ctx, 0, &table));
    tf::Tensor* size = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({}), &size));
    SOK_OP_REQUIRES_OK(ctx, table->gpu_table().Size(size->flat<int64_t>().data(), GpuStream(ctx)));
  }
};
REGISTER_KERNEL_BUILDER(Name("Sok>DynamicTableSize").Device(tf::DEVICE_GPU).HostMemory("handle"),
                        DynamicTableSizeGpuOp);

// Sok>DynamicTableLookup and Sok>DynamicTableLookupEvict. The latter's output sizes depend on
// the data: the evicted count is known on the host only when the lookup evicts, which already
// synchronises (the table's exact path); otherwise no wait.
class DynamicTableLookupGpuOp : public tf::OpKernel {
 public:
  explicit DynamicTableLookupGpuOp(tf::OpKernelConstruction* ctx)
      : OpKernel(ctx), reports_evictions_(ctx->def().op() == "Sok>DynamicTableLookupEvict") {
    if (!reports_evictions_) OP_REQUIRES_OK(ctx, ctx->GetAttr("insert", &insert_));
  }
  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<DynamicTableResource> table;
    OP_REQUIRES_OK(ctx, GetGpuTable(ctx, 0, &table));
    const tf::Tensor& keys = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckKeys(keys));
    const int64_t dim = table->dim();
    tf::Tensor* values = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({keys.NumElements(), dim}),
                                             &values));
    GpuHashTable::Evicted evicted;
    evicted.allocate = [ctx, dim](int64_t count, int64_t** keys_out, float** values_out) {
      tf::Tensor *k = nullptr, *v = nullptr;
      tf::Status s = ctx->allocate_output(1, tf::TensorShape({count}), &k);
      if (s.ok()) s = ctx->allocate_output(2, tf::TensorShape({count, dim}), &v);
      if (!s.ok()) return Status::ResourceExhausted(std::string(s.message()));
      *keys_out = k->flat<int64_t>().data();
      *values_out = v->flat<float>().data();
      return Status::Ok();
    };
    const GpuKeys view{keys.flat<int64_t>().data(), keys.NumElements(), 1, 0};
    SOK_OP_REQUIRES_OK(ctx, table->gpu_table().Lookup(view, insert_, values->flat<float>().data(),
                                                      1.0f, GpuStream(ctx),
                                                      reports_evictions_ ? &evicted : nullptr));
    if (reports_evictions_ && evicted.count == 0) {  // nothing evicted: empty outputs
      tf::Tensor* unused = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(1, tf::TensorShape({0}), &unused));
      OP_REQUIRES_OK(ctx, ctx->allocate_output(2, tf::TensorShape({0, dim}), &unused));
    }
  }

 private:
  const bool reports_evictions_;
  bool insert_ = true;
};
REGISTER_KERNEL_BUILDER(Name("Sok>DynamicTableLookup").Device(tf::DEVICE_GPU).HostMemory("handle"),
                        DynamicTableLookupGpuOp);
REGISTER_KERNEL_BUILDER(Name("Sok>DynamicTableLookupEvict").Device(tf::DEVICE_GPU).HostMemory("handle"),
                        DynamicTableLookupGpuOp);

class DynamicTableAssignGpuOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<DynamicTableResource> table;
    OP_REQUIRES_OK(ctx, GetGpuTable(ctx, 0, &table));
    const tf::Tensor& keys = ctx->input(1);
    const tf::Tensor& values = ctx->input(2);
    const tf::Tensor& state = ctx->input(3);
    OP_REQUIRES_OK(ctx, CheckKeys(keys));
    GpuHashTable& gpu = table->gpu_table();
    const int64_t n = keys.NumElements();
    OP_REQUIRES_OK(ctx, CheckMatrix(values, n, gpu.dim(), "values"));
    const bool with_state = state.NumElements() > 0;
    if (with_state) OP_REQUIRES_OK(ctx, CheckMatrix(state, n, gpu.state_dim(), "state"));
    SOK_OP_REQUIRES_OK(ctx, gpu.Assign(keys.flat<int64_t>().data(), n, values.flat<float>().data(),
                                       with_state ? state.flat<float>().data() : nullptr,
                                       GpuStream(ctx)));
  }
};
REGISTER_KERNEL_BUILDER(Name("Sok>DynamicTableAssign").Device(tf::DEVICE_GPU).HostMemory("handle"),
                        DynamicTableAssignGpuOp);

class DynamicTableImportGpuOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<DynamicTableResource> table;
    OP_REQUIRES_OK(ctx, GetGpuTable(ctx, 0, &table));
    const tf::Tensor& keys = ctx->input(1);
    const tf::Tensor& values = ctx->input(2);
    const tf::Tensor& state = ctx->input(3);
    OP_REQUIRES_OK(ctx, CheckKeys(keys));
    const int64_t n = keys.NumElements();
    OP_REQUIRES_OK(ctx, CheckMatrix(values, n, table->dim(), "restored values"));
    OP_REQUIRES_OK(ctx, CheckRestoredState(state, n));
    const int64_t state_dim = state.dim_size(1);
    SOK_OP_REQUIRES_OK(ctx, table->gpu_table().Replace(
                                keys.flat<int64_t>().data(), n, values.flat<float>().data(),
                                state_dim > 0 ? state.flat<float>().data() : nullptr, state_dim,
                                GpuStream(ctx)));
  }
};
REGISTER_KERNEL_BUILDER(Name("Sok>DynamicTableImport").Device(tf::DEVICE_GPU).HostMemory("handle"),
                        DynamicTableImportGpuOp);

class DynamicTableEraseGpuOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<DynamicTableResource> table;
    OP_REQUIRES_OK(ctx, GetGpuTable(ctx, 0, &table));
    const tf::Tensor& keys = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckKeys(keys));
    tf::Tensor* erased = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({}), &erased));
    SOK_OP_REQUIRES_OK(ctx, table->gpu_table().Erase(keys.flat<int64_t>().data(),
                                                     keys.NumElements(),
                                                     erased->flat<int64_t>().data(),
                                                     GpuStream(ctx)));
  }
};
REGISTER_KERNEL_BUILDER(Name("Sok>DynamicTableErase").Device(tf::DEVICE_GPU).HostMemory("handle"),
                        DynamicTableEraseGpuOp);

namespace {

// Export's outputs, allocated once the table knows how many rows it exports (it synchronises
// for that count).
Status ExportToOutputs(tf::OpKernelContext* ctx, GpuHashTable& table, int64_t written_after_us,
                       bool with_state) {
  const int64_t dim = table.dim(), state_dim = table.state_dim();
  return table.Export(
      written_after_us, with_state,
      [&](int64_t n, int64_t** keys, float** values, float** state) -> Status {
        tf::Tensor *k = nullptr, *v = nullptr, *s = nullptr;
        tf::Status status = ctx->allocate_output(0, tf::TensorShape({n}), &k);
        if (status.ok()) status = ctx->allocate_output(1, tf::TensorShape({n, dim}), &v);
        if (status.ok() && state) {
          status = ctx->allocate_output(2, tf::TensorShape({n, state_dim}), &s);
        }
        if (!status.ok()) return Status::Internal(std::string(status.message()));
        *keys = k->flat<int64_t>().data();
        *values = v->flat<float>().data();
        if (state) *state = s->flat<float>().data();
        return Status::Ok();
      },
      GpuStream(ctx));
}

}  // namespace

// Synchronises once: the number of keys sizes the outputs.
class DynamicTableExportGpuOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<DynamicTableResource> table;
    OP_REQUIRES_OK(ctx, GetGpuTable(ctx, 0, &table));
    SOK_OP_REQUIRES_OK(ctx, ExportToOutputs(ctx, table->gpu_table(), INT64_MIN, true));
  }
};
REGISTER_KERNEL_BUILDER(Name("Sok>DynamicTableExport").Device(tf::DEVICE_GPU).HostMemory("handle"),
                        DynamicTableExportGpuOp);

class DynamicTableExportWrittenGpuOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<DynamicTableResource> table;
    OP_REQUIRES_OK(ctx, GetGpuTable(ctx, 0, &table));
    const tf::Tensor& since = ctx->input(1);
    OP_REQUIRES(ctx, tf::TensorShapeUtils::IsScalar(since.shape()),
                tf::errors::InvalidArgument("written_after_us must be a scalar, got shape ",
                                            since.shape().DebugString()));
    SOK_OP_REQUIRES_OK(ctx, ExportToOutputs(ctx, table->gpu_table(), since.scalar<int64_t>()(),
                                            false));
  }
};
REGISTER_KERNEL_BUILDER(Name("Sok>DynamicTableExportWritten")
                            .Device(tf::DEVICE_GPU)
                            .HostMemory("handle")
                            .HostMemory("written_after_us"),
                        DynamicTableExportWrittenGpuOp);

// Each table reads the pairs naming it (the others' rows it leaves alone); rows of pairs
// naming no table are zeros, and with validate the op reports the first (waiting for the
// stream once).
class DynamicGatherRowsGpuOp : public tf::OpKernel {
 public:
  explicit DynamicGatherRowsGpuOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("insert", &insert_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("admit_probability", &admit_probability_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("validate", &validate_));
  }
  void Compute(tf::OpKernelContext* ctx) override {
    const int num_tables = ctx->num_inputs() - 1;
    OP_REQUIRES_OK(ctx, CheckAdmitProbability(admit_probability_, num_tables));
    const tf::Tensor& keys = ctx->input(num_tables);
    OP_REQUIRES_OK(ctx, CheckKeyPairsShape(keys));
    const int64_t n = keys.dim_size(0);
    const cudaStream_t stream = GpuStream(ctx);
    tf::Tensor* rows = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({n, dim_}), &rows));
    if (n == 0) return;
    OP_REQUIRES_OK(ctx, CudaToTf(cudaMemsetAsync(rows->flat<float>().data(), 0,
                                                 n * dim_ * sizeof(float), stream),
                                 "gather rows"));
    const int64_t* pairs = keys.flat<int64_t>().data();
    for (int t = 0; t < num_tables; ++t) {
      tf::core::RefCountPtr<DynamicTableResource> table;
      OP_REQUIRES_OK(ctx, GetGpuTable(ctx, t, &table));
      OP_REQUIRES(ctx, table->dim() == dim_,
                  tf::errors::InvalidArgument("dynamic table ", t, " has dim ", table->dim(),
                                              ", expected ", dim_));
      const float admit = admit_probability_.empty() ? 1.0f : admit_probability_[t];
      const GpuKeys view{pairs, n, 2, t};
      SOK_OP_REQUIRES_OK(ctx, table->gpu_table().Lookup(view, insert_, rows->flat<float>().data(),
                                                        admit, stream));
    }
    if (validate_) OP_REQUIRES_OK(ctx, CheckPairTables(ctx, pairs, n, num_tables));
  }

 private:
  // Waits for the stream once to report a pair naming no table.
  tf::Status CheckPairTables(tf::OpKernelContext* ctx, const int64_t* pairs, int64_t n,
                             int num_tables) {
    GpuCallMemory memory;
    GpuCheck check;
    int64_t* counts = nullptr;
    int32_t* order = nullptr;
    TF_RETURN_IF_ERROR(check.Init(ctx, &memory));
    TF_RETURN_IF_ERROR(memory.Device(ctx, num_tables, &counts));
    TF_RETURN_IF_ERROR(memory.Device(ctx, n, &order));
    const cudaStream_t stream = GpuStream(ctx);
    TF_RETURN_IF_ERROR(CudaToTf(GroupPairsByTable(pairs, n, num_tables, ScratchFrom(ctx, &memory),
                                                  counts, order, check.device, stream),
                                "check pairs"));
    TF_RETURN_IF_ERROR(check.CopyToHost(ctx));
    TF_RETURN_IF_ERROR(CudaToTf(cudaStreamSynchronize(stream), "check pairs"));
    if (check.host->first_bad == kNoError) return tf::Status();
    return PairNamesNoTable(BadItem(check.host->first_bad), check.host->value_a, num_tables);
  }

  int64_t dim_ = 0;
  bool insert_ = true;
  bool validate_ = true;
  std::vector<float> admit_probability_;
};
REGISTER_KERNEL_BUILDER(Name("Sok>DynamicGatherRows").Device(tf::DEVICE_GPU).HostMemory("tables"),
                        DynamicGatherRowsGpuOp);

// Synchronises once: the per-table counts size the outputs.
class SplitDynamicGradientGpuOp : public tf::OpKernel {
 public:
  explicit SplitDynamicGradientGpuOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
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
    const cudaStream_t stream = GpuStream(ctx);
    GpuCallMemory memory;
    GpuCheck check;
    int64_t *counts = nullptr, *host_counts = nullptr;
    int32_t* order = nullptr;
    OP_REQUIRES_OK(ctx, check.Init(ctx, &memory));
    OP_REQUIRES_OK(ctx, memory.Device(ctx, num_tables_, &counts));
    OP_REQUIRES_OK(ctx, memory.Pinned(ctx, num_tables_, &host_counts));
    OP_REQUIRES_OK(ctx, memory.Device(ctx, n, &order));
    const int64_t* pairs = keys.flat<int64_t>().data();
    OP_REQUIRES_OK(ctx, CudaToTf(GroupPairsByTable(pairs, n, static_cast<int32_t>(num_tables_),
                                                   ScratchFrom(ctx, &memory), counts, order,
                                                   check.device, stream),
                                 "split gradient"));
    OP_REQUIRES_OK(ctx, check.CopyToHost(ctx));
    OP_REQUIRES_OK(ctx, CudaToTf(cudaMemcpyAsync(host_counts, counts, num_tables_ * sizeof(int64_t),
                                                 cudaMemcpyDeviceToHost, stream),
                                 "split gradient"));
    OP_REQUIRES_OK(ctx, CudaToTf(cudaStreamSynchronize(stream), "split gradient"));
    OP_REQUIRES(ctx, check.host->first_bad == kNoError,
                PairNamesNoTable(BadItem(check.host->first_bad), check.host->value_a, num_tables_));
    int64_t start = 0;
    for (int64_t t = 0; t < num_tables_; ++t) {
      const int64_t count = host_counts[t];
      tf::Tensor *indices = nullptr, *values = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(t, tf::TensorShape({count}), &indices));
      OP_REQUIRES_OK(ctx, ctx->allocate_output(num_tables_ + t, tf::TensorShape({count, dim}),
                                               &values));
      OP_REQUIRES_OK(ctx, CudaToTf(GatherPairRows(pairs, order + start, count, dim,
                                                  grad.flat<float>().data(),
                                                  indices->flat<int64_t>().data(),
                                                  values->flat<float>().data(), stream),
                                   "split gradient"));
      start += count;
    }
  }

 private:
  int64_t num_tables_ = 0;
};
REGISTER_KERNEL_BUILDER(Name("Sok>SplitDynamicGradient").Device(tf::DEVICE_GPU),
                        SplitDynamicGradientGpuOp);

class DynamicApplyGpuOp : public tf::OpKernel {
 public:
  explicit DynamicApplyGpuOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx));
  }
  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<DynamicTableResource> table;
    OP_REQUIRES_OK(ctx, GetGpuTable(ctx, 0, &table));
    const tf::Tensor& keys = ctx->input(1);
    const tf::Tensor& grads = ctx->input(2);
    const tf::Tensor& hyper = ctx->input(3);
    OP_REQUIRES_OK(ctx, CheckKeys(keys));
    const int64_t n = keys.NumElements();
    OP_REQUIRES_OK(ctx, CheckMatrix(grads, n, table->dim(), "grads"));
    OP_REQUIRES_OK(ctx, attrs_.CheckHyper(hyper));
    SOK_OP_REQUIRES_OK(ctx, table->gpu_table().Apply(
                                attrs_.rule, hyper.flat<float>().data(), hyper.NumElements(),
                                attrs_.nesterov, attrs_.state_dim, attrs_.state_initial_value,
                                keys.flat<int64_t>().data(), n, grads.flat<float>().data(),
                                GpuStream(ctx)));
  }

 private:
  DynamicApplyAttrs attrs_;
};
REGISTER_KERNEL_BUILDER(Name("Sok>DynamicApply").Device(tf::DEVICE_GPU).HostMemory("handle"),
                        DynamicApplyGpuOp);

}  // namespace sok

#endif  // GOOGLE_CUDA
