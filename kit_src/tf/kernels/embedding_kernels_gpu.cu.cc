// GPU kernels of the fused lookup chain (the CPU ones are in embedding_kernels.cc): the same
// inputs, outputs and error messages, the work in kit_src/core/embedding/lookup_gpu.cu on
// TensorFlow's stream. Bad input is found by the device kernels; the ops are asynchronous and
// report it once the stream has passed (no host thread waits), except the two whose output
// sizes depend on the data, Sok>PartitionKeys and Sok>SplitGradientByTable, which synchronise
// once (documented at each).
#if GOOGLE_CUDA
#define EIGEN_USE_GPU  // before any Eigen header: the GPU device
#include <cub/cub.cuh>

#include <memory>
#include <string>
#include <vector>

#include "kit_src/core/embedding/combine.h"
#include "kit_src/core/embedding/key_partition.h"
#include "kit_src/core/embedding/packed_key.h"
#include "kit_src/core/embedding/pair_keys_gpu.cuh"
#include "kit_src/core/embedding/row_owner.h"
#include "kit_src/tf/kernels/core_bridge.h"
#include "kit_src/tf/kernels/embedding_validation.h"
#include "kit_src/tf/kernels/gathered_ids_check.h"
#include "kit_src/tf/kernels/gpu_op_util.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"

namespace sok {

namespace tf = ::tensorflow;

namespace {

// Sok>PartitionKeys counts each table's keys (one worker) in shared memory up to this many
// tables; above, its table_counts output is empty.
constexpr size_t kMaxCountedTables = 4096;

int BitsFor(uint64_t values) {  // bits to hold 0 .. values - 1
  int bits = 0;
  while (bits < 64 && (uint64_t{1} << bits) < values) ++bits;
  return bits;
}

// Variables read by a GPU op, locked shared while its work is enqueued (as TF's own GPU ops
// hold them), each looked up once even when several inputs share it.
class GpuTables {
 public:
  // dtype: the tables' type. 16-bit tables' GpuShard::data points at their 16-bit rows (only
  // Sok>GatherShardRows takes them, and copies their bits).
  tf::Status Lock(tf::OpKernelContext* ctx, int first_input, int count, int64_t dim,
                  const std::vector<std::string>* names, tf::DataType dtype = tf::DT_FLOAT) {
    vars_.resize(count);
    for (int t = 0; t < count; ++t) {
      TF_RETURN_IF_ERROR(tf::LookupResource(ctx, tf::HandleFromInput(ctx, first_input + t),
                                            &vars_[t]));
      bool seen = false;
      for (int k = 0; k < t; ++k) seen = seen || vars_[k].get() == vars_[t].get();
      if (!seen) locks_.push_back(std::make_unique<tf::tf_shared_lock>(*vars_[t]->mu()));
      const tf::Tensor& table = *vars_[t]->tensor();
      if (table.dtype() != dtype || table.dims() != 2 || table.dim_size(1) != dim) {
        const std::string name = names ? "'" + (*names)[t] + "'" : std::to_string(t);
        return tf::errors::InvalidArgument("table ", name, " must be ", tf::DataTypeString(dtype),
                                           " [rows, ", dim, "], got ",
                                           tf::DataTypeString(table.dtype()), " ",
                                           table.shape().DebugString());
      }
      shards_.push_back(GpuShard{reinterpret_cast<const float*>(table.tensor_data().data()),
                                 table.dim_size(0)});
    }
    return tf::Status();
  }
  const std::vector<GpuShard>& shards() const { return shards_; }

 private:
  std::vector<tf::core::RefCountPtr<tf::Var>> vars_;
  std::vector<std::unique_ptr<tf::tf_shared_lock>> locks_;
  std::vector<GpuShard> shards_;
};

// The combiners as the device kernels take them (Combiner's values).
tf::Status ReadCombinerCodes(tf::OpKernelConstruction* ctx, std::vector<int32_t>* codes) {
  std::vector<Combiner> combiners;
  TF_RETURN_IF_ERROR(ReadCombiners(ctx, &combiners));
  for (Combiner combiner : combiners) codes->push_back(static_cast<int32_t>(combiner));
  return tf::Status();
}

// The pooled lookups of a combine op, described on the host from the input shapes (device
// pointers; the values are checked on the device).
tf::Status DescribePooled(tf::OpKernelContext* ctx, int first_splits,
                          const std::vector<int32_t>& combiners,
                          std::vector<GpuPooledLookup>* lookups, int64_t* samples) {
  const int n = static_cast<int>(combiners.size());
  *samples = 0;
  for (int l = 0; l < n; ++l) {
    const tf::Tensor& splits = ctx->input(first_splits + l);
    const tf::Tensor& weights = ctx->input(first_splits + n + l);
    if (!tf::TensorShapeUtils::IsVector(splits.shape()) || splits.NumElements() < 1) {
      return tf::errors::InvalidArgument("row_splits of lookup ", l,
                                         " must be a non-empty vector, got shape ",
                                         splits.shape().DebugString());
    }
    GpuPooledLookup lookup;
    lookup.row_splits = splits.flat<int64_t>().data();
    lookup.batch = splits.NumElements() - 1;
    lookup.first_sample = *samples;
    lookup.weights = weights.NumElements() > 0 ? weights.flat<float>().data() : nullptr;
    lookup.weights_count = weights.NumElements();
    lookup.combiner = combiners[l];
    lookups->push_back(lookup);
    *samples += lookup.batch;
  }
  return tf::Status();
}

// The CPU kernels' message for what the combine checks recorded.
tf::Status PooledError(const LookupCheck& check, int64_t num_rows, int32_t num_tables) {
  if (check.first_bad == kNoError) return tf::Status();
  const int64_t l = BadGroup(check.first_bad), item = BadItem(check.first_bad);
  const std::string what = "lookup " + std::to_string(l);
  switch (BadKindOf(check.first_bad)) {
    case BadKind::kPositionsLeft:
      return tf::errors::InvalidArgument(
          "lookup ", l, " has ", check.value_a, " ids but only ", check.value_b,
          " positions are left");
    case BadKind::kRowSplitsEnds:
      return ToTfStatus(Status::InvalidArgument(
          what + ": row_splits must start at 0 and end at the " + std::to_string(check.value_b) +
          " ids, got [" + std::to_string(check.value_a) + ", ..., " +
          std::to_string(check.value_b) + "]"));
    case BadKind::kRowSplitsDecrease:
      return tf::errors::InvalidArgument(what, ": row_splits decrease at sample ", item);
    case BadKind::kWeightsCount:
      break;
    case BadKind::kBadPosition:
      return tf::errors::InvalidArgument("row position ", check.value_a, " is out of range [0, ",
                                         num_rows, ")");
    case BadKind::kBadKey:
      return tf::errors::InvalidArgument(
          "key ", check.value_a, " (table ", PackedTable(check.value_a), ", local row ",
          PackedRow(check.value_a), ") names no row of the ", num_tables, " local shards");
    default:
      break;
  }
  return tf::errors::InvalidArgument("bad input (", what, ", item ", item, ")");
}

// Pools (forward) or scatters (backward) after the device checks, then reports.
class CombineGpuBase : public tf::AsyncOpKernel {
 public:
  explicit CombineGpuBase(tf::OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadCombinerCodes(ctx, &combiners_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("validate", &validate_));
  }

 protected:
  // Uploads the lookups, runs the checks; `run` launches the pooling or scatter.
  void Run(tf::OpKernelContext* ctx, DoneCallback done, std::vector<GpuPooledLookup> lookups,
           int64_t samples, const tf::Tensor& position, int64_t num_rows,
           GpuRowSource source, const std::vector<GpuShard>& shards,
           const std::function<cudaError_t(const GpuPooledLookup*, const int64_t*,
                                           const GpuRowSource&, LookupCheck*,
                                           GpuCallMemory*)>& run) {
    auto memory = std::make_shared<GpuCallMemory>();
    const cudaStream_t stream = GpuStream(ctx);
    const int32_t n = static_cast<int32_t>(lookups.size());
    // A weights count of another length than the ids' is known on the host only after the
    // check; the CPU message names it, so keep each lookup's count.
    std::vector<int64_t> weight_counts;
    for (const GpuPooledLookup& lookup : lookups) weight_counts.push_back(lookup.weights_count);
    GpuPooledLookup* lookups_device = nullptr;
    GpuShard* shards_device = nullptr;
    int64_t* use_first = nullptr;
    GpuCheck check;
    OP_REQUIRES_OK_ASYNC(ctx, memory->Upload(ctx, lookups, &lookups_device), done);
    if (!shards.empty()) {
      OP_REQUIRES_OK_ASYNC(ctx, memory->Upload(ctx, shards, &shards_device), done);
      source.shards = shards_device;
    }
    OP_REQUIRES_OK_ASYNC(ctx, memory->Device(ctx, n + 1, &use_first), done);
    OP_REQUIRES_OK_ASYNC(ctx, check.Init(ctx, memory.get()), done);
    const int32_t* positions = Positions(position);
    const int64_t num_positions = position.NumElements();
    OP_REQUIRES_OK_ASYNC(ctx, CudaToTf(CheckPooledLookups(lookups_device, n, samples, positions,
                                                          num_positions, num_rows, source,
                                                          use_first, check.device, stream),
                                       "combine check"),
                         done);
    OP_REQUIRES_OK_ASYNC(ctx, CudaToTf(run(lookups_device, use_first, source, check.device,
                                           memory.get()),
                                       "combine"),
                         done);
    if (!validate_) {  // inputs built by lookup_sparse: the kernels stay in bounds, no verdict
      OP_REQUIRES_OK_ASYNC(ctx, ReleaseAfterStream(ctx, memory), done);
      done();
      return;
    }
    OP_REQUIRES_OK_ASYNC(ctx, CudaToTf(DescribePooledError(lookups_device, n, use_first,
                                                           positions, num_positions, source,
                                                           check.device, stream),
                                       "describe"),
                         done);
    OP_REQUIRES_OK_ASYNC(ctx, check.CopyToHost(ctx), done);
    const LookupCheck* host = check.host;
    const int32_t num_tables = static_cast<int32_t>(shards.size());
    FinishAfterStream(ctx, done, memory, [host, num_rows, num_tables, weight_counts]() {
      if (host->first_bad != kNoError && BadKindOf(host->first_bad) == BadKind::kWeightsCount) {
        const int64_t l = BadGroup(host->first_bad);
        return tf::errors::InvalidArgument("weights of lookup ", l, " have ", weight_counts[l],
                                           " values but its ids have ", host->value_a,
                                           "; weights must match the ids one to one");
      }
      if (host->first_bad != kNoError && BadKindOf(host->first_bad) == BadKind::kPositionsLeft &&
          BadGroup(host->first_bad) == static_cast<int64_t>(weight_counts.size())) {
        return tf::errors::InvalidArgument("the lookups have ", host->value_a,
                                           " ids but position has ", host->value_b);
      }
      return PooledError(*host, num_rows, num_tables);
    });
  }

  // The forward of CombineForward and CombineFromShards: allocates each lookup's [batch, dim]
  // output, then pools into it from `source`.
  void Pool(tf::OpKernelContext* ctx, DoneCallback done, std::vector<GpuPooledLookup> lookups,
            int64_t samples, const tf::Tensor& position, int64_t num_rows, int64_t dim,
            const GpuRowSource& source, const std::vector<GpuShard>& shards) {
    for (size_t l = 0; l < lookups.size(); ++l) {
      tf::Tensor* out = nullptr;
      OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(static_cast<int>(l),
                                                     tf::TensorShape({lookups[l].batch, dim}),
                                                     &out),
                           done);
      lookups[l].output = out->flat<float>().data();
    }
    const int32_t n = static_cast<int32_t>(lookups.size());
    const int32_t* positions = Positions(position);
    const cudaStream_t stream = GpuStream(ctx);
    Run(ctx, done, lookups, samples, position, num_rows, source, shards,
        [&](const GpuPooledLookup* device, const int64_t* use_first, const GpuRowSource& src,
            LookupCheck* check, GpuCallMemory*) {
          return CombineForwardGpu(device, n, samples, use_first, positions, src, num_rows, dim,
                                   check, stream);
        });
  }

  // uint32 positions (see the op) as the core's int32.
  static const int32_t* Positions(const tf::Tensor& position) {
    return reinterpret_cast<const int32_t*>(position.flat<uint32_t>().data());
  }

  std::vector<int32_t> combiners_;
  bool validate_ = true;
};

}  // namespace

// ------------------------------------------------------------------ Sok>GatherSingleIds

// Enqueues the gather and finishes: the first out-of-range id is recorded in the check output,
// which Sok>CheckGatheredIds reports (so TensorFlow keeps queueing work meanwhile).
class GatherSingleIdsGpuOp : public tf::OpKernel {
 public:
  explicit GatherSingleIdsGpuOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_names", &table_names_));
    OP_REQUIRES(ctx, static_cast<int>(table_names_.size()) * 3 == ctx->num_inputs(),
                tf::errors::InvalidArgument("table_names needs one entry per lookup"));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    const int n = ctx->num_inputs() / 3;
    GpuTables tables;
    OP_REQUIRES_OK(ctx, tables.Lock(ctx, 0, n, dim_, &table_names_));
    // The lookups travel by value in the kernels' parameters, kSingleIdBatch a launch.
    std::vector<GpuSingleIdBatch> batches((n + kSingleIdBatch - 1) / kSingleIdBatch);
    for (int l = 0; l < n; ++l) {
      const tf::Tensor& ids = ctx->input(n + l);
      const tf::Tensor& splits = ctx->input(2 * n + l);
      OP_REQUIRES_OK(ctx, CheckSingleIdLookup(l, ids, splits));
      tf::Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(l, tf::TensorShape({ids.NumElements(), dim_}), &out));
      GpuSingleIdBatch& batch = batches[l / kSingleIdBatch];
      batch.first_group = l - l % kSingleIdBatch;
      batch.items[batch.count++] = GpuSingleIdLookup{ids.data(), ids.NumElements(), batch.total,
                                                      tables.shards()[l],
                                                      out->flat<float>().data()};
      batch.total += ids.NumElements();
    }
    tf::Tensor* check_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(n, tf::TensorShape({3}), &check_out));
    auto* check = reinterpret_cast<LookupCheck*>(check_out->flat<int64_t>().data());
    const cudaStream_t stream = GpuStream(ctx);
    OP_REQUIRES_OK(ctx, CudaToTf(ResetLookupCheck(check, stream), "reset check"));
    for (const GpuSingleIdBatch& batch : batches) {
      OP_REQUIRES_OK(ctx, CudaToTf(GatherSingleIdsGpu(batch, /*ids64=*/true, dim_, check, stream),
                                   "gather single ids"));
    }
    for (const GpuSingleIdBatch& batch : batches) {
      OP_REQUIRES_OK(ctx, CudaToTf(DescribeBadSingleId(batch, true, check, stream), "describe"));
    }
  }

 private:
  int64_t dim_ = 0;
  std::vector<std::string> table_names_;
};

// Sok>GuardIds: one launch a kSingleIdBatch of lookups, nothing waits for the check.
class GuardIdsGpuOp : public tf::OpKernel {
 public:
  explicit GuardIdsGpuOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {}
  void Compute(tf::OpKernelContext* ctx) override {
    const int n = ctx->num_inputs() - 1;
    const tf::Tensor& check = ctx->input(n);
    OP_REQUIRES_OK(ctx, CheckRecordShape(check));
    std::vector<GpuBatch<GpuIdCopy>> batches((n + kSingleIdBatch - 1) / kSingleIdBatch);
    for (int l = 0; l < n; ++l) {
      const tf::Tensor& ids = ctx->input(l);
      tf::Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(l, ids.shape(), &out));
      GpuBatch<GpuIdCopy>& batch = batches[l / kSingleIdBatch];
      batch.items[batch.count++] = GpuIdCopy{ids.flat<int64_t>().data(), ids.NumElements(),
                                             batch.total, out->flat<int64_t>().data()};
      batch.total += ids.NumElements();
    }
    // A deferred check's error not raised yet: no step updates anything until it is (-1 is
    // int64's all-ones bit pattern).
    if (DeferredIdError::Pending()) {
      for (int l = 0; l < n; ++l) {
        tf::Tensor* out = ctx->mutable_output(l);
        OP_REQUIRES_OK(ctx, CudaToTf(cudaMemsetAsync(out->data(), 0xff, out->TotalBytes(),
                                                     GpuStream(ctx)), "guard ids"));
      }
      return;
    }
    const auto* record = reinterpret_cast<const LookupCheck*>(check.flat<int64_t>().data());
    for (const GpuBatch<GpuIdCopy>& batch : batches) {
      OP_REQUIRES_OK(ctx, CudaToTf(GuardSingleIds(batch, record, GpuStream(ctx)), "guard ids"));
    }
  }
};

REGISTER_KERNEL_BUILDER(Name("Sok>GuardIds").Device(tf::DEVICE_GPU), GuardIdsGpuOp);

// Sok>SparseRowSplits: a launch a kSingleIdBatch of SparseTensors; dense_shape in host memory
// sizes the outputs.
class SparseRowSplitsGpuOp : public tf::OpKernel {
 public:
  explicit SparseRowSplitsGpuOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadSparseNames(ctx, &names_));
  }
  void Compute(tf::OpKernelContext* ctx) override {
    const int n = static_cast<int>(names_.size());
    std::vector<GpuBatch<GpuRowSplits>> batches((n + kSingleIdBatch - 1) / kSingleIdBatch);
    for (int l = 0; l < n; ++l) {
      int64_t rows = 0;
      tf::Tensor* row_splits = nullptr;
      OP_REQUIRES_OK(ctx, PrepareRowSplits(ctx, l, n, names_[l], &rows, &row_splits));
      const tf::Tensor& indices = ctx->input(l);
      GpuBatch<GpuRowSplits>& batch = batches[l / kSingleIdBatch];
      batch.items[batch.count++] = GpuRowSplits{indices.flat<int64_t>().data(),
                                                indices.dim_size(0), rows, batch.total,
                                                row_splits->flat<int64_t>().data()};
      batch.total += rows + 1;
    }
    for (const GpuBatch<GpuRowSplits>& batch : batches) {
      OP_REQUIRES_OK(ctx, CudaToTf(SparseRowSplitsGpu(batch, GpuStream(ctx)), "row splits"));
    }
  }

 private:
  std::vector<std::string> names_;
};

REGISTER_KERNEL_BUILDER(Name("Sok>SparseRowSplits").Device(tf::DEVICE_GPU).HostMemory("dense_shape"),
                        SparseRowSplitsGpuOp);

class CheckGatheredIdsGpuOp : public tf::AsyncOpKernel {
 public:
  explicit CheckGatheredIdsGpuOp(tf::OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_names", &table_names_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("deferred", &deferred_));
  }
  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    const tf::Tensor& check = ctx->input(0);
    OP_REQUIRES_OK_ASYNC(ctx, CheckRecordShape(check), done);
    if (deferred_) {  // an earlier step's error, found since; nothing waits for this one's
      OP_REQUIRES_OK_ASYNC(ctx, DeferredIdError::Take(), done);
    }
    auto memory = std::make_shared<GpuCallMemory>();
    LookupCheck* host = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, memory->Pinned(ctx, 1, &host), done);
    OP_REQUIRES_OK_ASYNC(ctx, CudaToTf(cudaMemcpyAsync(host, check.data(), sizeof(LookupCheck),
                                                       cudaMemcpyDeviceToHost, GpuStream(ctx)),
                                       "check copy"),
                         done);
    const std::vector<std::string> names = table_names_;
    if (deferred_) {
      OP_REQUIRES_OK_ASYNC(ctx, CudaToTf(cudaGetLastError(), "check copy"), done);
      AfterStream(ctx, memory, [host, names]() {
        const tf::Status status = GatheredIdsStatus(*host, names);
        if (!status.ok()) DeferredIdError::Record(status);
      });
      done();
      return;
    }
    FinishAfterStream(ctx, done, memory, [host, names]() { return GatheredIdsStatus(*host, names); });
  }

 private:
  std::vector<std::string> table_names_;
  bool deferred_ = false;
};

REGISTER_KERNEL_BUILDER(Name("Sok>CheckGatheredIds").Device(tf::DEVICE_GPU),
                        CheckGatheredIdsGpuOp);

#define REGISTER_SINGLE_IDS_GPU(Tindex)                                                      \
  REGISTER_KERNEL_BUILDER(Name("Sok>GatherSingleIds")                                       \
                              .Device(tf::DEVICE_GPU)                                       \
                              .TypeConstraint<Tindex>("Tindex")                             \
                              .TypeConstraint<float>("dtype"),                              \
                          GatherSingleIdsGpuOp)
// int64 ids only: TensorFlow keeps int32 tensors of GPU kernels in host memory (lookup_sparse
// passes int64 ids).
REGISTER_SINGLE_IDS_GPU(int64_t);
#undef REGISTER_SINGLE_IDS_GPU

// ------------------------------------------------------------------ Sok>PartitionKeys

// The core's SortPartitionKeys (lookup_gpu.cuh) sorts every id by (owner worker, table, local
// row), marks the first of each run of equal keys (every key without dedup) and scans the
// marks into each id's position; ScatterPartition lays out the keys. Synchronises once: the number of unique keys sizes send_keys. splits is an output
// in host memory (Horovod's all-to-all reads it there).
class PartitionKeysGpuOp : public tf::OpKernel {
 public:
  explicit PartitionKeysGpuOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadPartitionAttrs(ctx, &attrs_));
    const int64_t num_workers = attrs_.options.num_workers;
    uint64_t max_local_rows = 1;
    for (const TablePlacement& table : attrs_.tables) {
      max_local_rows = std::max<uint64_t>(
          max_local_rows, MostLocalRows(table.rows, table.owner, static_cast<int32_t>(num_workers)));
    }
    for (int64_t table : attrs_.lookup_table) {
      OP_REQUIRES(ctx, table >= 0 && table < static_cast<int64_t>(attrs_.tables.size()),
                  tf::errors::InvalidArgument("lookup_table names table ", table, " of ",
                                              attrs_.tables.size()));
    }
    row_bits_ = BitsFor(max_local_rows);
    table_bits_ = BitsFor(attrs_.tables.size());
    if (attrs_.options.pair_keys) {  // (worker, table) sort in 32 bits, ids in another 64
      OP_REQUIRES(ctx, table_bits_ + BitsFor(num_workers) <= 32,
                  tf::errors::InvalidArgument(attrs_.tables.size(), " tables and ", num_workers,
                                              " workers do not fit a 32-bit sort key"));
      return;
    }
    OP_REQUIRES(ctx, row_bits_ <= kPackedRowBits &&
                         row_bits_ + table_bits_ + BitsFor(num_workers) <= 64,
                tf::errors::InvalidArgument("tables of ", max_local_rows, " local rows, ",
                                            attrs_.tables.size(), " tables and ", num_workers,
                                            " workers do not fit a 64-bit sort key"));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    const int n = ctx->num_inputs();
    std::vector<GpuPartitionLookup> lookups(n);
    int64_t total = 0;
    for (int l = 0; l < n; ++l) {
      const tf::Tensor& ids = ctx->input(l);
      OP_REQUIRES(ctx, tf::TensorShapeUtils::IsVector(ids.shape()),
                  tf::errors::InvalidArgument("ids of lookup ", l, " must be a vector, got shape ",
                                              ids.shape().DebugString()));
      const int32_t t = static_cast<int32_t>(attrs_.lookup_table[l]);
      lookups[l] = GpuPartitionLookup{ids.data(), ids.NumElements(), total, t,
                                      attrs_.tables[t].owner, attrs_.tables[t].rows};
      total += ids.NumElements();
    }
    OP_REQUIRES(ctx, total <= INT32_MAX,
                tf::errors::InvalidArgument("more than 2^31 ids in one lookup call"));
    const bool ids64 = n > 0 && ctx->input(0).dtype() == tf::DT_INT64;
    if (attrs_.options.pair_keys) {
      ComputePairs(ctx, lookups, total, ids64);
      return;
    }
    const cudaStream_t stream = GpuStream(ctx);
    GpuCallMemory memory;
    GpuPartitionLookup* lookups_device = nullptr;
    // One worker: each table's key count too, for Sok>SplitGradientByTable (no count, no
    // synchronisation there).
    const int64_t num_workers = attrs_.options.num_workers;
    const int64_t num_tables = num_workers == 1 && attrs_.tables.size() <= kMaxCountedTables
                                   ? static_cast<int64_t>(attrs_.tables.size())
                                   : 0;
    struct HostView {
      LookupCheck check;
      int32_t unique;
      int32_t pad;
      int64_t counts[1];  // [num_workers], then [num_tables]
    };
    HostView* host = nullptr;
    GpuCheck check;
    OP_REQUIRES_OK(ctx, memory.Upload(ctx, lookups, &lookups_device));
    OP_REQUIRES_OK(ctx, memory.Pinned(ctx, sizeof(HostView) + 8 * (num_workers + num_tables),
                                      reinterpret_cast<char**>(&host)));
    OP_REQUIRES_OK(ctx, check.Init(ctx, &memory));
    SortedPartitionKeys sorted;
    const int key_bits = row_bits_ + table_bits_ + BitsFor(num_workers);
    OP_REQUIRES_OK(ctx, CudaToTf(SortPartitionKeys(lookups_device, n, ids64, total,
                                                   static_cast<int32_t>(num_workers), table_bits_,
                                                   row_bits_, key_bits, attrs_.options.dedup,
                                                   static_cast<int32_t>(num_tables),
                                                   ScratchFrom(ctx, &memory), check.device,
                                                   &sorted, stream),
                                 "partition keys"));
    host->unique = 0;
    if (total > 0) {
      cudaMemcpyAsync(&host->unique, sorted.slot + total - 1, sizeof(int32_t),
                      cudaMemcpyDeviceToHost, stream);
    }
    cudaMemcpyAsync(&host->check, check.device, sizeof(LookupCheck), cudaMemcpyDeviceToHost,
                    stream);
    cudaMemcpyAsync(host->counts, sorted.worker_counts,
                    (num_workers + num_tables) * sizeof(int64_t), cudaMemcpyDeviceToHost, stream);
    // The one synchronisation: the unique count sizes send_keys.
    OP_REQUIRES_OK(ctx, CudaToTf(cudaStreamSynchronize(stream), "partition keys"));
    if (host->check.first_bad != kNoError) {
      const int64_t l = BadGroup(host->check.first_bad);
      const TablePlacement& table = attrs_.tables[attrs_.lookup_table[l]];
      SOK_OP_REQUIRES_OK(ctx, IdOutOfRange(table.name, host->check.value_a, table.rows));
    }
    tf::Tensor *send_keys = nullptr, *splits = nullptr, *position = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({host->unique}), &send_keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, tf::TensorShape({attrs_.options.num_workers}), &splits));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, tf::TensorShape({total}), &position));
    for (int64_t w = 0; w < attrs_.options.num_workers; ++w) {
      splits->flat<int32_t>()(w) = static_cast<int32_t>(host->counts[w]);
    }
    tf::Tensor* counts_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, tf::TensorShape({num_tables}), &counts_out));
    for (int64_t t = 0; t < num_tables; ++t) {
      counts_out->flat<int32_t>()(t) = static_cast<int32_t>(host->counts[num_workers + t]);
    }
    int32_t* positions = reinterpret_cast<int32_t*>(position->flat<uint32_t>().data());
    OP_REQUIRES_OK(ctx, CudaToTf(ScatterPartition(sorted.sorted, sorted.order, sorted.slot, total,
                                                  row_bits_, table_bits_,
                                                  send_keys->flat<int64_t>().data(), positions,
                                                  stream),
                                 "scatter partition"));
  }

 private:
  // Dynamic tables: (table, id) pairs (pair_keys_gpu.cuh); ids need no range check.
  void ComputePairs(tf::OpKernelContext* ctx, const std::vector<GpuPartitionLookup>& lookups,
                    int64_t total, bool ids64) {
    const int32_t num_workers = static_cast<int32_t>(attrs_.options.num_workers);
    const cudaStream_t stream = GpuStream(ctx);
    GpuCallMemory memory;
    GpuPartitionLookup* lookups_device = nullptr;
    int64_t* host = nullptr;  // [0] unique count, [1 ..] per-worker counts
    OP_REQUIRES_OK(ctx, memory.Upload(ctx, lookups, &lookups_device));
    OP_REQUIRES_OK(ctx, memory.Pinned(ctx, 1 + num_workers, &host));
    SortedPairKeys sorted;
    OP_REQUIRES_OK(ctx, CudaToTf(SortPairKeys(lookups_device, static_cast<int32_t>(lookups.size()),
                                              ids64, total, num_workers, table_bits_,
                                              attrs_.options.dedup, ScratchFrom(ctx, &memory),
                                              &sorted, stream),
                                 "partition pairs"));
    host[0] = 0;
    if (total > 0) {
      int32_t* unique = reinterpret_cast<int32_t*>(host);
      cudaMemcpyAsync(unique, sorted.slot + total - 1, sizeof(int32_t), cudaMemcpyDeviceToHost,
                      stream);
    }
    cudaMemcpyAsync(host + 1, sorted.worker_counts, num_workers * sizeof(int64_t),
                    cudaMemcpyDeviceToHost, stream);
    // The one synchronisation: the unique count sizes send_keys.
    OP_REQUIRES_OK(ctx, CudaToTf(cudaStreamSynchronize(stream), "partition pairs"));
    const int64_t unique = *reinterpret_cast<int32_t*>(host);
    tf::Tensor *send_keys = nullptr, *splits = nullptr, *position = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({unique, 2}), &send_keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, tf::TensorShape({num_workers}), &splits));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, tf::TensorShape({total}), &position));
    for (int32_t w = 0; w < num_workers; ++w) {
      splits->flat<int32_t>()(w) = static_cast<int32_t>(host[1 + w]);
    }
    tf::Tensor* no_counts = nullptr;  // pair keys: no table counts
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, tf::TensorShape({0}), &no_counts));
    OP_REQUIRES_OK(ctx, CudaToTf(ScatterPairKeys(sorted, total, table_bits_,
                                                 send_keys->flat<int64_t>().data(),
                                                 reinterpret_cast<int32_t*>(
                                                     position->flat<uint32_t>().data()),
                                                 stream),
                                 "scatter pairs"));
  }

  PartitionAttrs attrs_;
  int row_bits_ = 0, table_bits_ = 0;
};

#define REGISTER_PARTITION_GPU(Tindex)                                                        \
  REGISTER_KERNEL_BUILDER(Name("Sok>PartitionKeys")                                          \
                              .Device(tf::DEVICE_GPU)                                        \
                              .TypeConstraint<Tindex>("Tindex")                              \
                              .HostMemory("splits")                                          \
                              .HostMemory("table_counts"),                                   \
                          PartitionKeysGpuOp)
REGISTER_PARTITION_GPU(int64_t);  // int64 ids only, as Sok>GatherSingleIds
#undef REGISTER_PARTITION_GPU

// ------------------------------------------------------------------ Sok>GatherShardRows

template <typename T>
class GatherShardRowsGpuOp : public tf::AsyncOpKernel {
 public:
  explicit GatherShardRowsGpuOp(tf::OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
  }

  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    const int num_tables = ctx->num_inputs() - 1;
    const tf::Tensor& keys = ctx->input(num_tables);
    OP_REQUIRES_ASYNC(ctx, tf::TensorShapeUtils::IsVector(keys.shape()),
                      tf::errors::InvalidArgument("keys must be a vector, got shape ",
                                                  keys.shape().DebugString()),
                      done);
    GpuTables tables;
    OP_REQUIRES_OK_ASYNC(ctx, tables.Lock(ctx, 0, num_tables, dim_, nullptr,
                                          tf::DataTypeToEnum<T>::value),
                         done);
    tf::Tensor* rows = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, tf::TensorShape({keys.NumElements(), dim_}),
                                                   &rows),
                         done);
    auto memory = std::make_shared<GpuCallMemory>();
    GpuShard* shards = nullptr;
    GpuCheck check;
    OP_REQUIRES_OK_ASYNC(ctx, memory->Upload(ctx, tables.shards(), &shards), done);
    OP_REQUIRES_OK_ASYNC(ctx, check.Init(ctx, memory.get()), done);
    const cudaStream_t stream = GpuStream(ctx);
    void* out = const_cast<char*>(rows->tensor_data().data());
    const int64_t* key_data = keys.flat<int64_t>().data();
    const cudaError_t gathered =
        sizeof(T) == 2
            ? GatherShardRows16Gpu(shards, num_tables, dim_, key_data, keys.NumElements(),
                                   static_cast<uint16_t*>(out), check.device, stream)
            : GatherShardRowsGpu(shards, num_tables, dim_, key_data, keys.NumElements(),
                                 static_cast<float*>(out), check.device, stream);
    OP_REQUIRES_OK_ASYNC(ctx, CudaToTf(gathered, "gather shard rows"), done);
    GpuRowSource source;
    source.keys = keys.flat<int64_t>().data();
    OP_REQUIRES_OK_ASYNC(ctx, CudaToTf(DescribePooledError(nullptr, 0, nullptr, nullptr, 0,
                                                           source, check.device, stream),
                                       "describe"),
                         done);
    OP_REQUIRES_OK_ASYNC(ctx, check.CopyToHost(ctx), done);
    const LookupCheck* host = check.host;
    FinishAfterStream(ctx, done, memory, [host, num_tables]() {
      return PooledError(*host, 0, num_tables);
    });
  }

 private:
  int64_t dim_ = 0;
};

#define REGISTER_GATHER_GPU(T)                                                             \
  REGISTER_KERNEL_BUILDER(                                                                 \
      Name("Sok>GatherShardRows").Device(tf::DEVICE_GPU).TypeConstraint<T>("dtype"),      \
      GatherShardRowsGpuOp<T>)
REGISTER_GATHER_GPU(float);
REGISTER_GATHER_GPU(Eigen::half);
REGISTER_GATHER_GPU(tf::bfloat16);
#undef REGISTER_GATHER_GPU

// ------------------------------------------------------------------ Sok>SplitGradientByTable

// With table_counts (Sok>PartitionKeys' own, keys grouped by table), hands out blocks of the
// gradient without counting or waiting. Otherwise counts the keys of each table on the device
// and synchronises once (the counts size the outputs); keys grouped by table (one worker's
// own) hand out blocks of the gradient without a copy where aligned, others are ordered by a
// stable radix sort by table.
class SplitGradientByTableGpuOp : public tf::OpKernel {
 public:
  explicit SplitGradientByTableGpuOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_tables", &num_tables_));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& keys = ctx->input(0);
    const tf::Tensor& grad = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckKeysAndGrad(keys, grad));
    const int64_t n = keys.NumElements(), dim = grad.dim_size(1);
    const int64_t* key_data = keys.flat<int64_t>().data();
    const cudaStream_t stream = GpuStream(ctx);
    std::vector<int64_t> first;
    OP_REQUIRES_OK(ctx, ReadTableCounts(ctx->input(2), num_tables_, n, &first));
    if (!first.empty()) {
      const auto& counts = ctx->input(2).flat<int32_t>();
      for (int64_t t = 0; t < num_tables_ && ctx->status().ok(); ++t) {
        HandOutBlock(ctx, keys, grad, t, first[t], counts(t));
      }
      return;
    }
    GpuCallMemory memory;
    int64_t* counts = nullptr;
    int32_t* grouped = nullptr;
    struct HostView {
      LookupCheck check;
      int32_t grouped;
      int32_t pad;
      int64_t counts[1];
    };
    HostView* host = nullptr;
    GpuCheck check;
    OP_REQUIRES_OK(ctx, memory.Device(ctx, num_tables_, &counts));
    OP_REQUIRES_OK(ctx, memory.Device(ctx, 1, &grouped));
    OP_REQUIRES_OK(ctx, memory.Pinned(ctx, sizeof(HostView) + 8 * num_tables_,
                                      reinterpret_cast<char**>(&host)));
    OP_REQUIRES_OK(ctx, check.Init(ctx, &memory));
    OP_REQUIRES_OK(ctx, CudaToTf(CountKeysPerTableGpu(key_data, n,
                                                      static_cast<int32_t>(num_tables_), counts,
                                                      grouped, check.device, stream),
                                 "count keys"));
    GpuRowSource source;
    source.keys = key_data;
    OP_REQUIRES_OK(ctx, CudaToTf(DescribePooledError(nullptr, 0, nullptr, nullptr, 0, source,
                                                     check.device, stream),
                                 "describe"));
    cudaMemcpyAsync(&host->check, check.device, sizeof(LookupCheck), cudaMemcpyDeviceToHost,
                    stream);
    cudaMemcpyAsync(&host->grouped, grouped, sizeof(int32_t), cudaMemcpyDeviceToHost, stream);
    cudaMemcpyAsync(host->counts, counts, num_tables_ * sizeof(int64_t), cudaMemcpyDeviceToHost,
                    stream);
    // The one synchronisation: the counts size the outputs.
    OP_REQUIRES_OK(ctx, CudaToTf(cudaStreamSynchronize(stream), "split gradient"));
    if (host->check.first_bad != kNoError) {
      const int64_t key = host->check.value_a;
      OP_REQUIRES(ctx, false, tf::errors::InvalidArgument("key ", key, " names table ",
                                                          PackedTable(key), " of ", num_tables_));
    }
    int32_t* order = nullptr;
    if (!host->grouped) {
      int32_t *table_of = nullptr, *sorted_tables = nullptr, *iota = nullptr;
      OP_REQUIRES_OK(ctx, memory.Device(ctx, n, &table_of));
      OP_REQUIRES_OK(ctx, memory.Device(ctx, n, &sorted_tables));
      OP_REQUIRES_OK(ctx, memory.Device(ctx, n, &iota));
      OP_REQUIRES_OK(ctx, memory.Device(ctx, n, &order));
      OP_REQUIRES_OK(ctx, CudaToTf(TableSortKeys(key_data, n, table_of, iota, stream), "sort"));
      size_t sort_bytes = 0;
      const int bits = std::max(BitsFor(num_tables_), 1);
      cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, table_of, sorted_tables, iota, order,
                                      static_cast<int>(n), 0, bits, stream);
      char* temp = nullptr;
      OP_REQUIRES_OK(ctx, memory.Device(ctx, sort_bytes, &temp));
      cub::DeviceRadixSort::SortPairs(temp, sort_bytes, table_of, sorted_tables, iota, order,
                                      static_cast<int>(n), 0, bits, stream);
    }
    int64_t start = 0;
    for (int64_t t = 0; t < num_tables_ && ctx->status().ok(); ++t) {
      const int64_t count = host->counts[t];
      if (order == nullptr) {
        HandOutBlock(ctx, keys, grad, t, start, count);
      } else {
        tf::Tensor *index_out = nullptr, *value_out = nullptr;
        OP_REQUIRES_OK(ctx, ctx->allocate_output(t, tf::TensorShape({count}), &index_out));
        OP_REQUIRES_OK(ctx, ctx->allocate_output(num_tables_ + t, tf::TensorShape({count, dim}),
                                                 &value_out));
        OP_REQUIRES_OK(ctx, CudaToTf(GatherGradientRows(key_data, order + start, count, dim,
                                                        grad.flat<float>().data(),
                                                        index_out->flat<int64_t>().data(),
                                                        value_out->flat<float>().data(), stream),
                                     "split gradient"));
      }
      start += count;
    }
  }

 private:
  // Table t's keys are rows [first, first + count) of keys and grad: its indices unpacked
  // from the keys, its values that block of grad (a copy only where it is not aligned).
  void HandOutBlock(tf::OpKernelContext* ctx, const tf::Tensor& keys, const tf::Tensor& grad,
                    int64_t t, int64_t first, int64_t count) {
    const int64_t dim = grad.dim_size(1);
    tf::Tensor* index_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(t, tf::TensorShape({count}), &index_out));
    float* values = nullptr;
    tf::Tensor block = grad.Slice(first, first + count);
    if (block.IsAligned()) {
      ctx->set_output(num_tables_ + t, block);
    } else {
      tf::Tensor* value_out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(num_tables_ + t, block.shape(), &value_out));
      values = value_out->flat<float>().data();
    }
    OP_REQUIRES_OK(ctx, CudaToTf(GatherGradientRows(keys.flat<int64_t>().data() + first, nullptr,
                                                    count, dim,
                                                    grad.flat<float>().data() + first * dim,
                                                    index_out->flat<int64_t>().data(), values,
                                                    GpuStream(ctx)),
                                 "split gradient"));
  }

  int64_t num_tables_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("Sok>SplitGradientByTable")
                            .Device(tf::DEVICE_GPU)
                            .TypeConstraint<float>("dtype")
                            .HostMemory("table_counts"),
                        SplitGradientByTableGpuOp);

// ------------------------------------------------------------------ combine ops

class CombineForwardGpuOp : public CombineGpuBase {
 public:
  using CombineGpuBase::CombineGpuBase;
  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    const tf::Tensor& rows = ctx->input(0);
    OP_REQUIRES_ASYNC(ctx, rows.dims() == 2,
                      tf::errors::InvalidArgument("rows must be a matrix, got ",
                                                  rows.shape().DebugString()),
                      done);
    const tf::Tensor& position = ctx->input(1);
    OP_REQUIRES_ASYNC(ctx, tf::TensorShapeUtils::IsVector(position.shape()),
                      tf::errors::InvalidArgument("position must be a vector, got ",
                                                  position.shape().DebugString()),
                      done);
    std::vector<GpuPooledLookup> lookups;
    int64_t samples = 0;
    OP_REQUIRES_OK_ASYNC(ctx, DescribePooled(ctx, 2, combiners_, &lookups, &samples), done);
    GpuRowSource source;
    source.rows = rows.flat<float>().data();
    Pool(ctx, done, std::move(lookups), samples, position, rows.dim_size(0), rows.dim_size(1),
         source, {});
  }
};

REGISTER_KERNEL_BUILDER(
    Name("Sok>CombineForward").Device(tf::DEVICE_GPU).TypeConstraint<float>("dtype"),
    CombineForwardGpuOp);

class CombineFromShardsGpuOp : public CombineGpuBase {
 public:
  explicit CombineFromShardsGpuOp(tf::OpKernelConstruction* ctx) : CombineGpuBase(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_tables", &num_tables_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
  }
  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    const int num_tables = static_cast<int>(num_tables_);
    const tf::Tensor& keys = ctx->input(num_tables);
    const tf::Tensor& position = ctx->input(num_tables + 1);
    OP_REQUIRES_ASYNC(ctx, tf::TensorShapeUtils::IsVector(keys.shape()) &&
                               tf::TensorShapeUtils::IsVector(position.shape()),
                      tf::errors::InvalidArgument("keys and position must be vectors, got ",
                                                  keys.shape().DebugString(), " and ",
                                                  position.shape().DebugString()),
                      done);
    GpuTables tables;
    OP_REQUIRES_OK_ASYNC(ctx, tables.Lock(ctx, 0, num_tables, dim_, nullptr), done);
    std::vector<GpuPooledLookup> lookups;
    int64_t samples = 0;
    OP_REQUIRES_OK_ASYNC(ctx, DescribePooled(ctx, num_tables + 2, combiners_, &lookups, &samples),
                         done);
    GpuRowSource source;
    source.keys = keys.flat<int64_t>().data();
    source.num_tables = num_tables;
    Pool(ctx, done, std::move(lookups), samples, position, keys.NumElements(), dim_, source,
         tables.shards());
  }

 private:
  int64_t num_tables_ = 0;
  int64_t dim_ = 0;
};

REGISTER_KERNEL_BUILDER(
    Name("Sok>CombineFromShards").Device(tf::DEVICE_GPU).TypeConstraint<float>("dtype"),
    CombineFromShardsGpuOp);

class CombineBackwardGpuOp : public CombineGpuBase {
 public:
  using CombineGpuBase::CombineGpuBase;
  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    const int n = static_cast<int>(combiners_.size());
    const tf::Tensor& position = ctx->input(n);
    OP_REQUIRES_ASYNC(ctx, tf::TensorShapeUtils::IsVector(position.shape()),
                      tf::errors::InvalidArgument("position must be a vector, got ",
                                                  position.shape().DebugString()),
                      done);
    std::vector<GpuPooledLookup> lookups;
    int64_t samples = 0;
    OP_REQUIRES_OK_ASYNC(ctx, DescribePooled(ctx, n + 1, combiners_, &lookups, &samples), done);
    int64_t num_rows = 0;
    OP_REQUIRES_OK_ASYNC(ctx, ReadNumRows(ctx->input(3 * n + 1), &num_rows), done);
    const int64_t dim = ctx->input(0).dims() == 2 ? ctx->input(0).dim_size(1) : 0;
    for (int l = 0; l < n; ++l) {
      const tf::Tensor& grad = ctx->input(l);
      OP_REQUIRES_OK_ASYNC(ctx, CheckOutputGrad(l, grad, lookups[l].batch, dim), done);
      lookups[l].output_grad = grad.flat<float>().data();
    }
    tf::Tensor* rows_grad = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, tf::TensorShape({num_rows, dim}), &rows_grad),
                         done);
    float* out = rows_grad->flat<float>().data();
    const cudaStream_t stream = GpuStream(ctx);
    Run(ctx, done, lookups, samples, position, num_rows, GpuRowSource(), {},
        [&](const GpuPooledLookup* device, const int64_t* use_first, const GpuRowSource&,
            LookupCheck* check, GpuCallMemory* memory) {
          return CombineBackwardGpu(device, n, samples, use_first, Positions(position),
                                    position.NumElements(), num_rows, dim,
                                    ScratchFrom(ctx, memory), out, check, stream);
        });
  }
};

REGISTER_KERNEL_BUILDER(Name("Sok>CombineBackward")
                            .Device(tf::DEVICE_GPU)
                            .TypeConstraint<float>("dtype")
                            .HostMemory("num_rows"),
                        CombineBackwardGpuOp);

}  // namespace sok
#endif  // GOOGLE_CUDA
