// The fused lookup chain's ops, one OpKernel each for both devices: check the shapes, lock the
// tables, allocate the outputs, then call the device's work in embedding_functor.h (CPU) or
// embedding_functor_gpu.cu.cc (GPU). The ops whose GPU work reports bad values once the stream
// has passed are asynchronous on both devices (the CPU's finish before returning).
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kit_src/core/embedding/combine.h"
#include "kit_src/core/embedding/lookup_check.h"
#include "kit_src/tf/kernels/core_bridge.h"
#include "kit_src/tf/kernels/embedding_functor.h"
#include "kit_src/tf/kernels/embedding_validation.h"
#include "kit_src/tf/kernels/pooled_output.h"
#include "kit_src/tf/kernels/register_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace sok {

namespace tf = ::tensorflow;

namespace {

tf::Status CheckVector(const tf::Tensor& tensor, const std::string& what) {
  if (tf::TensorShapeUtils::IsVector(tensor.shape())) return tf::Status();
  return tf::errors::InvalidArgument(what, " must be a vector, got shape ",
                                     tensor.shape().DebugString());
}

// A combine op's lookups from their row_splits and weights inputs (from `first_splits`: N
// row_splits, then N weights): shapes checked here, values by the device work.
tf::Status ReadPooledArgs(tf::OpKernelContext* ctx, int first_splits,
                          const std::vector<Combiner>& combiners,
                          std::vector<PooledArgs>* lookups) {
  const int n = static_cast<int>(combiners.size());
  for (int l = 0; l < n; ++l) {
    const tf::Tensor& splits = ctx->input(first_splits + l);
    const tf::Tensor& weights = ctx->input(first_splits + n + l);
    TF_RETURN_IF_ERROR(CheckRowSplitsShape(l, splits));
    PooledArgs lookup;
    lookup.row_splits = splits.flat<int64_t>().data();
    lookup.batch = splits.NumElements() - 1;
    lookup.weights = weights.NumElements() > 0 ? weights.flat<float>().data() : nullptr;
    lookup.weights_count = weights.NumElements();
    lookup.combiner = combiners[l];
    lookups->push_back(lookup);
  }
  return tf::Status();
}

// Each lookup's [batch, dim] output, from output 0.
template <typename Device>
tf::Status AllocatePooledOutputs(tf::OpKernelContext* ctx, int64_t dim,
                                 std::vector<PooledArgs>* lookups) {
  for (size_t l = 0; l < lookups->size(); ++l) {
    tf::Tensor* out = nullptr;
    TF_RETURN_IF_ERROR(AllocateRowsOutput<Device>(
        ctx, static_cast<int>(l), tf::TensorShape({(*lookups)[l].batch, dim}), &out));
    (*lookups)[l].output = out->flat<float>().data();
  }
  return tf::Status();
}

// Runs an async op's body `run(ctx, done)` that locks tables. On a GPU the body finishes
// through `done` once the stream has passed, its locks released when it returns (they cover
// enqueueing the work); on the CPU the work is over when the body returns, and `done` runs
// only then, after its locks are released, so no op that the executor starts from `done` on
// this thread waits for them.
template <typename Device, typename Run>
void RunLockingAsync(tf::OpKernelContext* ctx, tf::AsyncOpKernel::DoneCallback done, Run run) {
  if (kOnGpu<Device>) {
    run(ctx, std::move(done));
    return;
  }
  run(ctx, [] {});
  done();
}

}  // namespace

// ------------------------------------------------------------------ Sok>PartitionKeys

template <typename Device>
class PartitionKeysOp : public tf::OpKernel {
 public:
  explicit PartitionKeysOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadPartitionAttrs(ctx, &attrs_));
    for (int64_t table : attrs_.lookup_table) {
      OP_REQUIRES(ctx, table >= 0 && table < static_cast<int64_t>(attrs_.tables.size()),
                  tf::errors::InvalidArgument("lookup_table names table ", table, " of ",
                                              attrs_.tables.size()));
    }
    SOK_OP_REQUIRES_OK(ctx, PartitionKeyWidths(attrs_.tables, attrs_.options, kOnGpu<Device>,
                                                &bits_));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    std::vector<PartitionInput> inputs(ctx->num_inputs());
    int64_t total = 0;
    for (int l = 0; l < ctx->num_inputs(); ++l) {
      const tf::Tensor& ids = ctx->input(l);
      OP_REQUIRES_OK(ctx, CheckVector(ids, "ids of lookup " + std::to_string(l)));
      inputs[l] = PartitionInput{ids.data(), ids.NumElements(), total,
                                 static_cast<int32_t>(attrs_.lookup_table[l])};
      total += ids.NumElements();
    }
    OP_REQUIRES(ctx, total <= INT32_MAX,
                tf::errors::InvalidArgument("more than 2^31 ids in one lookup call"));
    const bool ids64 = ctx->num_inputs() == 0 || ctx->input(0).dtype() == tf::DT_INT64;
    const bool pairs = attrs_.options.pair_keys;
    AllocatePartition allocate = [ctx, total, pairs](
                                     int64_t unique, const std::vector<int32_t>& splits,
                                     const std::vector<int32_t>& table_counts,
                                     int64_t** send_keys, int32_t** position) {
      return ToCoreStatus(AllocateOutputs(ctx, total, pairs, unique, splits, table_counts,
                                          send_keys, position));
    };
    OP_REQUIRES_OK(ctx, functor::PartitionKeys<Device>()(ctx, attrs_, bits_, inputs, ids64,
                                                         total, allocate));
  }

 private:
  // Sok>PartitionKeys' outputs once their sizes are known (AllocatePartition).
  static tf::Status AllocateOutputs(tf::OpKernelContext* ctx, int64_t total, bool pairs,
                                    int64_t unique, const std::vector<int32_t>& splits,
                                    const std::vector<int32_t>& table_counts,
                                    int64_t** send_keys, int32_t** position) {
    tf::Tensor *keys_out = nullptr, *splits_out = nullptr, *position_out = nullptr,
             *counts_out = nullptr;
    const tf::TensorShape key_shape = pairs ? tf::TensorShape({unique, 2})
                                          : tf::TensorShape({unique});
    TF_RETURN_IF_ERROR(ctx->allocate_output(0, key_shape, &keys_out));
    TF_RETURN_IF_ERROR(ctx->allocate_output(
        1, tf::TensorShape({static_cast<int64_t>(splits.size())}), &splits_out));
    TF_RETURN_IF_ERROR(ctx->allocate_output(2, tf::TensorShape({total}), &position_out));
    TF_RETURN_IF_ERROR(ctx->allocate_output(
        3, tf::TensorShape({static_cast<int64_t>(table_counts.size())}), &counts_out));
    // splits and table_counts live in host memory on both devices.
    if (!splits.empty()) {
      std::memcpy(splits_out->data(), splits.data(), splits.size() * sizeof(int32_t));
    }
    if (!table_counts.empty()) {
      std::memcpy(counts_out->data(), table_counts.data(),
                  table_counts.size() * sizeof(int32_t));
    }
    *send_keys = keys_out->flat<int64_t>().data();
    // uint32 (see the op), the same bits as the core's int32
    *position = reinterpret_cast<int32_t*>(position_out->flat<uint32_t>().data());
    return tf::Status();
  }

  PartitionAttrs attrs_;
  PartitionKeyBits bits_;
};

// ------------------------------------------------------------------ Sok>GatherShardRows

template <typename Device, typename T>
class GatherShardRowsOp : public tf::AsyncOpKernel {
 public:
  explicit GatherShardRowsOp(tf::OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
  }

  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    RunLockingAsync<Device>(ctx, std::move(done),
                            [this](tf::OpKernelContext* c, DoneCallback d) { Gather(c, d); });
  }

 private:
  void Gather(tf::OpKernelContext* ctx, DoneCallback done) {
    const int num_tables = ctx->num_inputs() - 1;
    const tf::Tensor& keys = ctx->input(num_tables);
    OP_REQUIRES_OK_ASYNC(ctx, CheckVector(keys, "keys"), done);
    LockedTables tables;
    OP_REQUIRES_OK_ASYNC(ctx, tables.Lock(ctx, 0, num_tables, dim_, tf::DataTypeToEnum<T>::value,
                                          nullptr),
                         done);
    tf::Tensor* rows = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, AllocateRowsOutput<Device>(
                                  ctx, 0, tf::TensorShape({keys.NumElements(), dim_}), &rows),
                         done);
    functor::GatherShardRows<Device, T>()(ctx, done, tables.tables(), dim_,
                                          keys.flat<int64_t>().data(), keys.NumElements(),
                                          rows->flat<T>().data());
  }

  int64_t dim_ = 0;
};

// ------------------------------------------------------------------ Sok>GatherSingleIds

// One worker, one id per sample: rows straight from the tables. On the GPU the first
// out-of-range id is recorded in the check output, which Sok>CheckGatheredIds reports (so
// TensorFlow keeps queueing work meanwhile).
template <typename Device, typename Tindex>
class GatherSingleIdsOp : public tf::OpKernel {
 public:
  explicit GatherSingleIdsOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadAttrs(ctx, "dim", &dim_, "table_names", &table_names_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("host_checked", &host_checked_));
    OP_REQUIRES(ctx, static_cast<int>(table_names_.size()) * 2 == ctx->num_inputs(),
                tf::errors::InvalidArgument("table_names needs one entry per lookup"));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    const int n = ctx->num_inputs() / 2;
    LockedTables tables;  // lookups may share a table
    OP_REQUIRES_OK(ctx, tables.Lock(ctx, 0, n, dim_, tf::DT_FLOAT, &table_names_));
    std::vector<functor::SingleIdArgs> lookups(n);
    for (int l = 0; l < n; ++l) {
      const tf::Tensor& ids = ctx->input(n + l);
      OP_REQUIRES_OK(ctx, CheckSingleIdLookup(l, ids));
      tf::Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, AllocateRowsOutput<Device>(
                              ctx, l, tf::TensorShape({ids.NumElements(), dim_}), &out));
      lookups[l] = functor::SingleIdArgs{ids.data(), ids.NumElements(), tables.tables()[l],
                                         &table_names_[l], out->flat<float>().data()};
    }
    // Checked on the host, nothing reads the record: it stays empty.
    tf::Tensor* check = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(n, tf::TensorShape({host_checked_ ? 0 : 3}),
                                             &check));
    OP_REQUIRES_OK(ctx, functor::GatherSingleIds<Device, Tindex>()(
                            ctx, lookups, dim_,
                            host_checked_ ? nullptr : check->flat<int64_t>().data()));
  }

 private:
  int64_t dim_ = 0;
  std::vector<std::string> table_names_;
  bool host_checked_ = false;
};

// ------------------------------------------------------------------ Sok>GuardIds

template <typename Device>
class GuardIdsOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    const int n = ctx->num_inputs() - 1;
    const tf::Tensor& check = ctx->input(n);
    OP_REQUIRES_OK(ctx, CheckRecordShape(check));
    OP_REQUIRES_OK(ctx, functor::GuardIds<Device>()(ctx, n, check));
  }
};

// ------------------------------------------------------------------ Sok>SparseRowSplits

// Each SparseTensor's row splits, checked, in one op.
template <typename Device>
class SparseRowSplitsOp : public tf::OpKernel {
 public:
  explicit SparseRowSplitsOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadSparseNames(ctx, &names_));
  }
  void Compute(tf::OpKernelContext* ctx) override {
    const int n = static_cast<int>(names_.size());
    std::vector<functor::RowSplitsArgs> tensors(n);
    for (int l = 0; l < n; ++l) {
      int64_t rows = 0;
      tf::Tensor* row_splits = nullptr;
      OP_REQUIRES_OK(ctx, PrepareRowSplits(ctx, l, n, names_[l], &rows, &row_splits));
      const tf::Tensor& indices = ctx->input(l);
      tensors[l] = functor::RowSplitsArgs{indices.flat<int64_t>().data(), indices.dim_size(0),
                                          rows, row_splits->flat<int64_t>().data(), &names_[l]};
    }
    OP_REQUIRES_OK(ctx, functor::SparseRowSplits<Device>()(ctx, tensors));
  }

 private:
  std::vector<std::string> names_;
};

// ------------------------------------------------------------------ Sok>CheckGatheredIds

template <typename Device>
class CheckGatheredIdsOp : public tf::AsyncOpKernel {
 public:
  explicit CheckGatheredIdsOp(tf::OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadAttrs(ctx, "table_names", &table_names_, "deferred", &deferred_));
  }
  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    const tf::Tensor& check = ctx->input(0);
    OP_REQUIRES_OK_ASYNC(ctx, CheckRecordShape(check), done);
    functor::CheckGatheredIds<Device>()(ctx, done, check, table_names_, deferred_);
  }

 private:
  std::vector<std::string> table_names_;
  bool deferred_ = false;
};

// ------------------------------------------------------------------ Sok>SplitGradientByTable

template <typename Device>
class SplitGradientByTableOp : public tf::OpKernel {
 public:
  explicit SplitGradientByTableOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_tables", &num_tables_));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& keys = ctx->input(0);
    const tf::Tensor& grad = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckKeysAndGrad(keys, grad));
    std::vector<int64_t> given_first;
    OP_REQUIRES_OK(ctx, ReadTableCounts(ctx->input(2), num_tables_, keys.NumElements(),
                                        &given_first));
    GradientSplitOutputs<Device> outputs(ctx, grad, num_tables_);
    OP_REQUIRES_OK(ctx, functor::SplitGradientByTable<Device>()(ctx, keys, grad, num_tables_,
                                                                given_first, &outputs));
  }

 private:
  int64_t num_tables_ = 0;
};

// ------------------------------------------------------------------ combine ops

// Sok>CombineForward: pools rows of a dense [num_rows, dim] matrix.
template <typename Device>
class CombineForwardOp : public tf::AsyncOpKernel {
 public:
  explicit CombineForwardOp(tf::OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadCombiners(ctx, &combiners_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("validate", &validate_));
  }

  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    const tf::Tensor& rows = ctx->input(0);
    OP_REQUIRES_ASYNC(ctx, rows.dims() == 2,
                      tf::errors::InvalidArgument("rows must be a matrix, got ",
                                                  rows.shape().DebugString()),
                      done);
    const tf::Tensor& position = ctx->input(1);
    OP_REQUIRES_OK_ASYNC(ctx, CheckVector(position, "position"), done);
    std::vector<PooledArgs> lookups;
    OP_REQUIRES_OK_ASYNC(ctx, ReadPooledArgs(ctx, 2, combiners_, &lookups), done);
    PooledSource source;
    source.rows = rows.flat<float>().data();
    source.num_rows = rows.dim_size(0);
    source.dim = rows.dim_size(1);
    OP_REQUIRES_OK_ASYNC(ctx, AllocatePooledOutputs<Device>(ctx, source.dim, &lookups), done);
    functor::CombineForward<Device>()(ctx, done, lookups, position, source, validate_);
  }

 private:
  std::vector<Combiner> combiners_;
  bool validate_ = true;
};

// Sok>CombineFromShards: pools the rows that packed keys name, read in place from the local
// shards (one worker: no gather, no exchange).
template <typename Device>
class CombineFromShardsOp : public tf::AsyncOpKernel {
 public:
  explicit CombineFromShardsOp(tf::OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadCombiners(ctx, &combiners_));
    OP_REQUIRES_OK(ctx, ReadAttrs(ctx, "validate", &validate_, "num_tables", &num_tables_,
                                  "dim", &dim_));
  }

  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    RunLockingAsync<Device>(ctx, std::move(done),
                            [this](tf::OpKernelContext* c, DoneCallback d) { Pool(c, d); });
  }

 private:
  void Pool(tf::OpKernelContext* ctx, DoneCallback done) {
    const int num_tables = static_cast<int>(num_tables_);
    const tf::Tensor& keys = ctx->input(num_tables);
    const tf::Tensor& position = ctx->input(num_tables + 1);
    OP_REQUIRES_OK_ASYNC(ctx, CheckVector(keys, "keys"), done);
    OP_REQUIRES_OK_ASYNC(ctx, CheckVector(position, "position"), done);
    LockedTables tables;
    OP_REQUIRES_OK_ASYNC(ctx, tables.Lock(ctx, 0, num_tables, dim_, tf::DT_FLOAT, nullptr), done);
    std::vector<PooledArgs> lookups;
    OP_REQUIRES_OK_ASYNC(ctx, ReadPooledArgs(ctx, num_tables + 2, combiners_, &lookups), done);
    OP_REQUIRES_OK_ASYNC(ctx, AllocatePooledOutputs<Device>(ctx, dim_, &lookups), done);
    PooledSource source;
    source.keys = keys.flat<int64_t>().data();
    source.tables = tables.tables();
    source.num_rows = keys.NumElements();
    source.dim = dim_;
    functor::CombineForward<Device>()(ctx, done, lookups, position, source, validate_);
  }

  std::vector<Combiner> combiners_;
  bool validate_ = true;
  int64_t num_tables_ = 0;
  int64_t dim_ = 0;
};

template <typename Device>
class CombineBackwardOp : public tf::AsyncOpKernel {
 public:
  explicit CombineBackwardOp(tf::OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadCombiners(ctx, &combiners_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("validate", &validate_));
  }

  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    const int n = static_cast<int>(combiners_.size());
    const tf::Tensor& position = ctx->input(n);
    OP_REQUIRES_OK_ASYNC(ctx, CheckVector(position, "position"), done);
    std::vector<PooledArgs> lookups;
    OP_REQUIRES_OK_ASYNC(ctx, ReadPooledArgs(ctx, n + 1, combiners_, &lookups), done);
    int64_t num_rows = 0;
    OP_REQUIRES_OK_ASYNC(ctx, ReadNumRows(ctx->input(3 * n + 1), &num_rows), done);
    const int64_t dim = n > 0 && ctx->input(0).dims() == 2 ? ctx->input(0).dim_size(1) : 0;
    for (int l = 0; l < n; ++l) {
      const tf::Tensor& grad = ctx->input(l);
      OP_REQUIRES_OK_ASYNC(ctx, CheckOutputGrad(l, grad, lookups[l].batch, dim), done);
      lookups[l].output_grad = grad.flat<float>().data();
    }
    tf::Tensor* rows_grad = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, AllocateRowsOutput<Device>(ctx, 0, tf::TensorShape({num_rows, dim}),
                                                         &rows_grad),
                         done);
    functor::CombineBackward<Device>()(ctx, done, lookups, position, num_rows, dim,
                                       rows_grad->flat<float>().data(), validate_);
  }

 private:
  std::vector<Combiner> combiners_;
  bool validate_ = true;
};

// ------------------------------------------------------------------ CPU-only ops

// Sok>EverySampleHoldsOneId: one scalar from all the lookups' row splits (host values).
class EverySampleHoldsOneIdOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    bool one_id = true;
    for (int l = 0; l < ctx->num_inputs(); ++l) {
      const tf::Tensor& splits = ctx->input(l);
      OP_REQUIRES_OK(ctx, CheckHostRowSplitsShape(l, splits));
      one_id = one_id && EverySampleHoldsOneId(splits.flat<int64_t>().data(),
                                               splits.NumElements() - 1);
    }
    tf::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({}), &out));
    out->scalar<bool>()() = one_id;
  }
};

// Sok>ElideOneIdRowSplits: each lookup's row splits, or an empty vector where every sample
// holds one id (the pooled ops' one id a sample, which needs no row splits on the GPU).
class ElideOneIdRowSplitsOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    const int n = ctx->num_outputs();
    for (int l = 0; l < n; ++l) {
      const tf::Tensor& splits = ctx->input(l);
      OP_REQUIRES_OK(ctx, CheckHostRowSplitsShape(l, splits));
      const int64_t batch = splits.NumElements() - 1;
      if (batch == ctx->input(n + l).NumElements() &&
          EverySampleHoldsOneId(splits.flat<int64_t>().data(), batch)) {
        tf::Tensor* elided = nullptr;
        OP_REQUIRES_OK(ctx, ctx->allocate_output(l, tf::TensorShape({0}), &elided));
      } else {
        ctx->set_output(l, splits);
      }
    }
  }
};

// Sok>CheckIdsOnHost: pipeline ids (and row splits) checked on the host before they reach a
// device, copied in the same pass into pinned memory, from which their crossing is one DMA.
class CheckIdsOnHostOp : public tf::OpKernel {
 public:
  explicit CheckIdsOnHostOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    int num_splits = 0;
    OP_REQUIRES_OK(ctx, ReadAttrs(ctx, "rows", &rows_, "table_names", &table_names_, "N",
                                  &num_lookups_, "M", &num_splits, "copy", &copy_));
    OP_REQUIRES(ctx, static_cast<int>(rows_.size()) == num_lookups_ &&
                         static_cast<int>(table_names_.size()) == num_lookups_,
                tf::errors::InvalidArgument("rows and table_names need one entry a lookup, got ",
                                            rows_.size(), " and ", table_names_.size(), " for ",
                                            num_lookups_));
    OP_REQUIRES(ctx, num_splits == 0 || num_splits == num_lookups_,
                tf::errors::InvalidArgument("row_splits must be given for none or all of the ",
                                            num_lookups_, " lookups, got ", num_splits));
    with_splits_ = num_splits > 0;
  }

  void Compute(tf::OpKernelContext* ctx) override {
    tf::AllocatorAttributes host;
    host.set_on_host(true);
    host.set_gpu_compatible(true);  // pinned where a GPU is present
    for (int l = 0; l < num_lookups_; ++l) {
      const tf::Tensor& ids = ctx->input(l);
      tf::Tensor* checked = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(l, CopyShape(ids), &checked, host));
      const Status status = ids.dtype() == tf::DT_INT32
                                ? CheckIdsInRange(ids.flat<int32_t>().data(), ids.NumElements(),
                                                  rows_[l], table_names_[l], CpuParallelFor(ctx),
                                                  CopyTo<int32_t>(checked))
                                : CheckIdsInRange(ids.flat<int64_t>().data(), ids.NumElements(),
                                                  rows_[l], table_names_[l], CpuParallelFor(ctx),
                                                  CopyTo<int64_t>(checked));
      SOK_OP_REQUIRES_OK(ctx, status);
      if (with_splits_) CheckSplits(ctx, l, ids.NumElements(), host);
      if (!ctx->status().ok()) return;
    }
  }

 private:
  // The copy's output: the input's shape, or empty (copy false: the check alone).
  tf::TensorShape CopyShape(const tf::Tensor& input) const {
    return copy_ ? input.shape() : tf::TensorShape({0});
  }
  template <typename T>
  T* CopyTo(tf::Tensor* output) const {
    return copy_ ? output->flat<T>().data() : nullptr;
  }

  void CheckSplits(tf::OpKernelContext* ctx, int l, int64_t num_ids, tf::AllocatorAttributes host) {
    const tf::Tensor& splits = ctx->input(num_lookups_ + l);
    OP_REQUIRES_OK(ctx, CheckHostRowSplitsShape(l, splits));
    SOK_OP_REQUIRES_OK(ctx, ValidateRowSplits(splits.flat<int64_t>().data(),
                                              splits.NumElements() - 1, num_ids,
                                              "lookup " + std::to_string(l)));
    tf::Tensor* checked = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(num_lookups_ + l, CopyShape(splits), &checked,
                                             host));
    if (copy_) {
      std::memcpy(checked->flat<int64_t>().data(), splits.flat<int64_t>().data(),
                  splits.NumElements() * sizeof(int64_t));
    }
  }

  std::vector<int64_t> rows_;
  std::vector<std::string> table_names_;
  int num_lookups_ = 0;
  bool with_splits_ = false;
  bool copy_ = true;
};

REGISTER_KERNEL_BUILDER(Name("Sok>EverySampleHoldsOneId").Device(tf::DEVICE_CPU),
                        EverySampleHoldsOneIdOp);
REGISTER_KERNEL_BUILDER(Name("Sok>ElideOneIdRowSplits").Device(tf::DEVICE_CPU),
                        ElideOneIdRowSplitsOp);
REGISTER_KERNEL_BUILDER(Name("Sok>CheckIdsOnHost").Device(tf::DEVICE_CPU), CheckIdsOnHostOp);

// ------------------------------------------------------------------ registration

// The GPU's int64 ids only (TensorFlow keeps int32 tensors of GPU kernels in host memory;
// lookup_sparse passes int64 ids); what the host reads (sizes, counts) stays in host memory.
#define SOK_REGISTER_TYPED(name, Op, Tag, attr, T)                                     \
  REGISTER_KERNEL_BUILDER(Name(name)                                                     \
                              .Device(kOnGpu<Tag> ? tf::DEVICE_GPU : tf::DEVICE_CPU)    \
                              .TypeConstraint<T>(attr),                                  \
                          Op<Tag, T>)
SOK_REGISTER_TYPED("Sok>GatherShardRows", GatherShardRowsOp, CpuDevice, "dtype", float);
SOK_REGISTER_TYPED("Sok>GatherShardRows", GatherShardRowsOp, CpuDevice, "dtype", Eigen::half);
SOK_REGISTER_TYPED("Sok>GatherShardRows", GatherShardRowsOp, CpuDevice, "dtype", tf::bfloat16);
SOK_REGISTER_TYPED("Sok>GatherSingleIds", GatherSingleIdsOp, CpuDevice, "Tindex", int32_t);
SOK_REGISTER_TYPED("Sok>GatherSingleIds", GatherSingleIdsOp, CpuDevice, "Tindex", int64_t);
#if GOOGLE_CUDA
SOK_REGISTER_TYPED("Sok>GatherShardRows", GatherShardRowsOp, GpuDevice, "dtype", float);
SOK_REGISTER_TYPED("Sok>GatherShardRows", GatherShardRowsOp, GpuDevice, "dtype", Eigen::half);
SOK_REGISTER_TYPED("Sok>GatherShardRows", GatherShardRowsOp, GpuDevice, "dtype", tf::bfloat16);
SOK_REGISTER_TYPED("Sok>GatherSingleIds", GatherSingleIdsOp, GpuDevice, "Tindex", int64_t);
#endif
#undef SOK_REGISTER_TYPED
SOK_REGISTER_KERNELS("Sok>GuardIds", GuardIdsOp);
SOK_REGISTER_KERNELS("Sok>CheckGatheredIds", CheckGatheredIdsOp);
SOK_REGISTER_KERNELS("Sok>CombineForward", CombineForwardOp);
SOK_REGISTER_KERNELS("Sok>CombineFromShards", CombineFromShardsOp);
SOK_REGISTER_KERNELS("Sok>PartitionKeys", PartitionKeysOp,
                     .TypeConstraint<int64_t>("Tindex").HostMemory("splits")
                     .HostMemory("table_counts"));
SOK_REGISTER_KERNELS("Sok>SparseRowSplits", SparseRowSplitsOp, .HostMemory("dense_shape"));
SOK_REGISTER_KERNELS("Sok>SplitGradientByTable", SplitGradientByTableOp,
                     .HostMemory("table_counts"));
SOK_REGISTER_KERNELS("Sok>CombineBackward", CombineBackwardOp, .HostMemory("num_rows"));

}  // namespace sok
