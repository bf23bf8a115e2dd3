// CPU kernels of the fused lookup chain: validate, allocate, call kit_src/core/embedding.
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "kit_src/core/embedding/combine.h"
#include "kit_src/core/embedding/key_partition.h"
#include "kit_src/core/embedding/packed_key.h"
#include "kit_src/core/embedding/shard_rows.h"
#include "kit_src/tf/kernels/core_bridge.h"
#include "kit_src/tf/kernels/embedding_validation.h"
#include "kit_src/tf/kernels/gathered_ids_check.h"
#include "kit_src/tf/kernels/pooled_output.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"

namespace sok {

namespace tf = ::tensorflow;

template <typename Tindex>
class PartitionKeysOp : public tf::OpKernel {
 public:
  explicit PartitionKeysOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadPartitionAttrs(ctx, &attrs_));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    std::vector<LookupIds<Tindex>> lookups(ctx->num_inputs());
    for (int l = 0; l < ctx->num_inputs(); ++l) {
      const tf::Tensor& ids = ctx->input(l);
      OP_REQUIRES(ctx, tf::TensorShapeUtils::IsVector(ids.shape()),
                  tf::errors::InvalidArgument("ids of lookup ", l, " must be a vector, got shape ",
                                              ids.shape().DebugString()));
      lookups[l] = LookupIds<Tindex>{ids.flat<Tindex>().data(), ids.NumElements(),
                                     static_cast<int32_t>(attrs_.lookup_table[l])};
    }
    PartitionResult result;
    SOK_OP_REQUIRES_OK(ctx, PartitionKeys(lookups, attrs_.tables, attrs_.options,
                                          CpuParallelFor(ctx), &result));
    if (attrs_.options.pair_keys) {
      tf::Tensor* keys = nullptr;
      const int64_t k = static_cast<int64_t>(result.send_keys.size()) / 2;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({k, 2}), &keys));
      if (k > 0) std::memcpy(keys->flat<int64_t>().data(), result.send_keys.data(), 2 * k * sizeof(int64_t));
    } else {
      CopyToOutput(ctx, 0, result.send_keys);
    }
    std::vector<int32_t> splits(result.splits.begin(), result.splits.end());
    CopyToOutput(ctx, 1, splits);
    CopyToOutput(ctx, 3, TableCounts(result.send_keys));
    tf::Tensor* position = nullptr;  // uint32 (see the op), the same bits as the core's int32
    const int64_t p = static_cast<int64_t>(result.position.size());
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, tf::TensorShape({p}), &position));
    if (p > 0) std::memcpy(position->data(), result.position.data(), p * sizeof(int32_t));
  }

 private:
  // One worker's packed keys: how many name each table (they come grouped by table); for
  // several workers or pair keys, none.
  template <typename Keys>
  std::vector<int32_t> TableCounts(const Keys& send_keys) const {
    if (attrs_.options.num_workers != 1 || attrs_.options.pair_keys) return {};
    std::vector<int32_t> counts(attrs_.tables.size(), 0);
    for (int64_t key : send_keys) ++counts[PackedTable(key)];
    return counts;
  }

  template <typename Vector>
  static void CopyToOutput(tf::OpKernelContext* ctx, int index, const Vector& values) {
    using T = typename Vector::value_type;
    tf::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            index, tf::TensorShape({static_cast<int64_t>(values.size())}), &out));
    if (!values.empty()) std::memcpy(out->flat<T>().data(), values.data(), values.size() * sizeof(T));
  }

  PartitionAttrs attrs_;
};

#define REGISTER_PARTITION(Tindex)                                                   \
  REGISTER_KERNEL_BUILDER(                                                           \
      Name("Sok>PartitionKeys").Device(tf::DEVICE_CPU).TypeConstraint<Tindex>("Tindex"), \
      PartitionKeysOp<Tindex>)
REGISTER_PARTITION(int32_t);
REGISTER_PARTITION(int64_t);
#undef REGISTER_PARTITION

// Holds shared locks on the variables of the first `num_tables` inputs for its lifetime, so
// an update cannot tear a row while a kernel reads it.
template <typename T>
class LockedShards {
 public:
  tf::Status Lock(tf::OpKernelContext* ctx, int num_tables, int64_t dim) {
    vars_.resize(num_tables);
    for (int t = 0; t < num_tables; ++t) {
      TF_RETURN_IF_ERROR(tf::LookupResource(ctx, tf::HandleFromInput(ctx, t), &vars_[t]));
      locks_.push_back(std::make_unique<tf::tf_shared_lock>(*vars_[t]->mu()));
      const tf::Tensor& shard = *vars_[t]->tensor();
      if (shard.dtype() != tf::DataTypeToEnum<T>::value) {
        return tf::errors::InvalidArgument("table ", t, " holds ", tf::DataTypeString(shard.dtype()),
                                           ", expected ",
                                           tf::DataTypeString(tf::DataTypeToEnum<T>::value));
      }
      if (shard.dims() != 2 || shard.dim_size(1) != dim) {
        return tf::errors::InvalidArgument("table ", t, " must have shape [rows, ", dim, "], got ",
                                           shard.shape().DebugString());
      }
      views_.push_back(ShardView<T>{shard.flat<T>().data(), shard.dim_size(0)});
      // Rows are only read through this pointer; the core's row accessors are non-const.
      bases_.push_back(const_cast<T*>(shard.flat<T>().data()));
    }
    return tf::Status();
  }
  const std::vector<ShardView<T>>& views() const { return views_; }
  const std::vector<T*>& bases() const { return bases_; }

 private:
  std::vector<tf::core::RefCountPtr<tf::Var>> vars_;
  std::vector<std::unique_ptr<tf::tf_shared_lock>> locks_;
  std::vector<ShardView<T>> views_;
  std::vector<T*> bases_;
};

template <typename T>
class GatherShardRowsOp : public tf::OpKernel {
 public:
  explicit GatherShardRowsOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    const int num_tables = ctx->num_inputs() - 1;
    const tf::Tensor& keys = ctx->input(num_tables);
    OP_REQUIRES(ctx, tf::TensorShapeUtils::IsVector(keys.shape()),
                tf::errors::InvalidArgument("keys must be a vector, got shape ",
                                            keys.shape().DebugString()));
    LockedShards<T> shards;
    OP_REQUIRES_OK(ctx, shards.Lock(ctx, num_tables, dim_));
    tf::Tensor* rows = nullptr;
    OP_REQUIRES_OK(ctx, AllocatePooledOutput(ctx, 0, tf::TensorShape({keys.NumElements(), dim_}),
                                             &rows));
    // The gather copies rows bit for bit: 16-bit tables reach the core as uint16_t words.
    using Word = typename std::conditional<sizeof(T) == 2, uint16_t, T>::type;
    std::vector<ShardView<Word>> words;
    for (const ShardView<T>& shard : shards.views()) {
      words.push_back(ShardView<Word>{reinterpret_cast<const Word*>(shard.data), shard.rows});
    }
    SOK_OP_REQUIRES_OK(ctx, GatherShardRows(words, dim_, keys.flat<int64_t>().data(),
                                            keys.NumElements(),
                                            reinterpret_cast<Word*>(rows->flat<T>().data()),
                                            CpuParallelFor(ctx)));
  }

 private:
  int64_t dim_ = 0;
};

#define REGISTER_GATHER(T)                                                                 \
  REGISTER_KERNEL_BUILDER(                                                                 \
      Name("Sok>GatherShardRows").Device(tf::DEVICE_CPU).TypeConstraint<T>("dtype"),      \
      GatherShardRowsOp<T>)
REGISTER_GATHER(float);
REGISTER_GATHER(Eigen::half);
REGISTER_GATHER(tf::bfloat16);
#undef REGISTER_GATHER

// One worker, one id per sample: rows straight from the tables (see Sok>GatherSingleIds).
template <typename Tindex>
class GatherSingleIdsOp : public tf::OpKernel {
 public:
  explicit GatherSingleIdsOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_names", &table_names_));
    OP_REQUIRES(ctx, static_cast<int>(table_names_.size()) * 3 == ctx->num_inputs(),
                tf::errors::InvalidArgument("table_names needs one entry per lookup"));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    const int n = ctx->num_inputs() / 3;
    // Lookups may share a table: lock each variable once.
    std::vector<tf::core::RefCountPtr<tf::Var>> vars(n);
    std::vector<std::unique_ptr<tf::tf_shared_lock>> locks;
    std::vector<ShardView<float>> views(n);
    for (int l = 0; l < n; ++l) {
      OP_REQUIRES_OK(ctx, tf::LookupResource(ctx, tf::HandleFromInput(ctx, l), &vars[l]));
      bool seen = false;
      for (int k = 0; k < l; ++k) seen = seen || vars[k].get() == vars[l].get();
      if (!seen) locks.push_back(std::make_unique<tf::tf_shared_lock>(*vars[l]->mu()));
      const tf::Tensor& table = *vars[l]->tensor();
      OP_REQUIRES(ctx, table.dtype() == tf::DT_FLOAT && table.dims() == 2 &&
                           table.dim_size(1) == dim_,
                  tf::errors::InvalidArgument("table '", table_names_[l], "' must be float32 [rows, ",
                                              dim_, "], got ", tf::DataTypeString(table.dtype()),
                                              " ", table.shape().DebugString()));
      views[l] = ShardView<float>{table.flat<float>().data(), table.dim_size(0)};
    }
    std::vector<SingleIdLookup<float, Tindex>> lookups(n);
    for (int l = 0; l < n; ++l) {
      const tf::Tensor& ids = ctx->input(n + l);
      const tf::Tensor& splits = ctx->input(2 * n + l);
      OP_REQUIRES_OK(ctx, CheckSingleIdLookup(l, ids, splits));
      tf::Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, AllocatePooledOutput(ctx, l, tf::TensorShape({ids.NumElements(), dim_}),
                                               &out));
      lookups[l] = SingleIdLookup<float, Tindex>{ids.flat<Tindex>().data(), ids.NumElements(),
                                                 &views[l], &table_names_[l],
                                                 out->flat<float>().data()};
    }
    SOK_OP_REQUIRES_OK(ctx, GatherSingleIds(lookups, dim_, CpuParallelFor(ctx)));
    tf::Tensor* check = nullptr;  // the CPU kernel fails at once: a clean record
    OP_REQUIRES_OK(ctx, ctx->allocate_output(n, tf::TensorShape({3}), &check));
    const LookupCheck clean = CleanCheck();
    std::memcpy(check->data(), &clean, sizeof(clean));
  }

 private:
  int64_t dim_ = 0;
  std::vector<std::string> table_names_;
};

// Sok>EverySampleHoldsOneId: one scalar from all the lookups' row splits.
class EverySampleHoldsOneIdOp : public tf::OpKernel {
 public:
  explicit EverySampleHoldsOneIdOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {}
  void Compute(tf::OpKernelContext* ctx) override {
    bool one_id = true;
    for (int l = 0; l < ctx->num_inputs(); ++l) {
      const tf::Tensor& splits = ctx->input(l);
      OP_REQUIRES(ctx, tf::TensorShapeUtils::IsVector(splits.shape()) && splits.NumElements() >= 1,
                  tf::errors::InvalidArgument("row_splits ", l, " must be a non-empty vector, got ",
                                              splits.shape().DebugString()));
      one_id = one_id && EverySampleHoldsOneId(splits.flat<int64_t>().data(),
                                               splits.NumElements() - 1);
    }
    tf::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({}), &out));
    out->scalar<bool>()() = one_id;
  }
};

REGISTER_KERNEL_BUILDER(Name("Sok>EverySampleHoldsOneId").Device(tf::DEVICE_CPU),
                        EverySampleHoldsOneIdOp);

// Sok>SparseRowSplits: each SparseTensor's row splits, checked, in one op.
class SparseRowSplitsOp : public tf::OpKernel {
 public:
  explicit SparseRowSplitsOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadSparseNames(ctx, &names_));
  }
  void Compute(tf::OpKernelContext* ctx) override {
    const int n = static_cast<int>(names_.size());
    for (int l = 0; l < n; ++l) {
      int64_t rows = 0;
      tf::Tensor* row_splits = nullptr;
      OP_REQUIRES_OK(ctx, PrepareRowSplits(ctx, l, n, names_[l], &rows, &row_splits));
      const tf::Tensor& indices = ctx->input(l);
      SOK_OP_REQUIRES_OK(ctx, RowSplitsOfSortedRows(indices.flat<int64_t>().data(), 2,
                                                    indices.dim_size(0), rows,
                                                    row_splits->flat<int64_t>().data(),
                                                    names_[l]));
    }
  }

 private:
  std::vector<std::string> names_;
};

REGISTER_KERNEL_BUILDER(Name("Sok>SparseRowSplits").Device(tf::DEVICE_CPU), SparseRowSplitsOp);

class CheckGatheredIdsOp : public tf::OpKernel {
 public:
  // `deferred` only matters on the GPU: the CPU gather fails at once, leaving a clean record.
  explicit CheckGatheredIdsOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_names", &table_names_));
  }
  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& check = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckRecordShape(check));
    LookupCheck record;
    std::memcpy(&record, check.data(), sizeof(record));
    OP_REQUIRES_OK(ctx, GatheredIdsStatus(record, table_names_));
  }

 private:
  std::vector<std::string> table_names_;
};

REGISTER_KERNEL_BUILDER(Name("Sok>CheckGatheredIds").Device(tf::DEVICE_CPU), CheckGatheredIdsOp);
class CheckIdsOnHostOp : public tf::OpKernel {
 public:
  explicit CheckIdsOnHostOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rows", &rows_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_names", &table_names_));
    OP_REQUIRES(ctx, rows_.size() == table_names_.size() &&
                         static_cast<int>(rows_.size()) == ctx->num_inputs(),
                tf::errors::InvalidArgument("rows and table_names need one entry an input, got ",
                                            rows_.size(), " and ", table_names_.size(), " for ",
                                            ctx->num_inputs()));
  }
  void Compute(tf::OpKernelContext* ctx) override {
    for (int l = 0; l < ctx->num_inputs(); ++l) {
      const tf::Tensor& ids = ctx->input(l);
      const Status status =
          ids.dtype() == tf::DT_INT32
              ? CheckIdsInRange(ids.flat<int32_t>().data(), ids.NumElements(), rows_[l],
                                table_names_[l], CpuParallelFor(ctx))
              : CheckIdsInRange(ids.flat<int64_t>().data(), ids.NumElements(), rows_[l],
                                table_names_[l], CpuParallelFor(ctx));
      SOK_OP_REQUIRES_OK(ctx, status);
      ctx->set_output(l, ids);
    }
  }

 private:
  std::vector<int64_t> rows_;
  std::vector<std::string> table_names_;
};

REGISTER_KERNEL_BUILDER(Name("Sok>CheckIdsOnHost").Device(tf::DEVICE_CPU), CheckIdsOnHostOp);

class GuardIdsOp : public tf::OpKernel {
 public:
  explicit GuardIdsOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {}
  void Compute(tf::OpKernelContext* ctx) override {
    const int n = ctx->num_inputs() - 1;
    const tf::Tensor& check = ctx->input(n);
    OP_REQUIRES_OK(ctx, CheckRecordShape(check));
    LookupCheck record;
    std::memcpy(&record, check.data(), sizeof(record));
    for (int l = 0; l < n; ++l) {
      if (record.first_bad == kNoError) {
        ctx->set_output(l, ctx->input(l));  // the ids themselves
        continue;
      }
      tf::Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(l, ctx->input(l).shape(), &out));
      out->flat<int64_t>().setConstant(-1);
    }
  }
};

REGISTER_KERNEL_BUILDER(Name("Sok>GuardIds").Device(tf::DEVICE_CPU), GuardIdsOp);

#define REGISTER_SINGLE_IDS(Tindex)                                                         \
  REGISTER_KERNEL_BUILDER(Name("Sok>GatherSingleIds")                                      \
                              .Device(tf::DEVICE_CPU)                                      \
                              .TypeConstraint<Tindex>("Tindex")                            \
                              .TypeConstraint<float>("dtype"),                             \
                          GatherSingleIdsOp<Tindex>)
REGISTER_SINGLE_IDS(int32_t);
REGISTER_SINGLE_IDS(int64_t);
#undef REGISTER_SINGLE_IDS


template <typename T>
class SplitGradientByTableOp : public tf::OpKernel {
 public:
  explicit SplitGradientByTableOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_tables", &num_tables_));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& keys = ctx->input(0);
    const tf::Tensor& grad = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckKeysAndGrad(keys, grad));
    const int64_t n = keys.NumElements(), dim = grad.dim_size(1);
    const int64_t* key_data = keys.flat<int64_t>().data();
    std::vector<int64_t> first, counts, given_first;
    OP_REQUIRES_OK(ctx, ReadTableCounts(ctx->input(2), num_tables_, n, &given_first));
    const bool grouped =
        TableBlocks(key_data, n, static_cast<int32_t>(num_tables_), &first, &counts).ok();
    // Given counts (Sok>PartitionKeys' own) must describe the keys: the GPU trusts them.
    OP_REQUIRES(ctx, given_first.empty() || (grouped && given_first == first),
                tf::errors::InvalidArgument("table_counts do not describe the keys: they must "
                                            "come grouped by table, with these counts"));
    if (grouped) {
      SliceGroupedGradient(ctx, key_data, grad, first, counts);
      return;
    }
    SOK_OP_REQUIRES_OK(ctx, CountKeysPerTable(key_data, n, static_cast<int32_t>(num_tables_),
                                              &counts));
    std::vector<int64_t*> indices(num_tables_);
    std::vector<T*> values(num_tables_);
    for (int64_t t = 0; t < num_tables_; ++t) {
      tf::Tensor* index_out = nullptr;
      tf::Tensor* value_out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(t, tf::TensorShape({counts[t]}), &index_out));
      OP_REQUIRES_OK(ctx, AllocatePooledOutput(ctx, num_tables_ + t,
                                               tf::TensorShape({counts[t], dim}), &value_out));
      indices[t] = index_out->flat<int64_t>().data();
      values[t] = value_out->flat<T>().data();
    }
    SplitGradientByTable(keys.flat<int64_t>().data(), n, dim, grad.flat<T>().data(), indices,
                         values, CpuParallelFor(ctx));
  }

 private:
  // Keys grouped by table (one worker's own keys): each table's gradient is a block of rows
  // of `grad`, handed out without a copy where the block is aligned.
  void SliceGroupedGradient(tf::OpKernelContext* ctx, const int64_t* keys, const tf::Tensor& grad,
                            const std::vector<int64_t>& first, const std::vector<int64_t>& counts) {
    for (int64_t t = 0; t < num_tables_; ++t) {
      tf::Tensor* index_out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(t, tf::TensorShape({counts[t]}), &index_out));
      int64_t* indices = index_out->flat<int64_t>().data();
      for (int64_t j = 0; j < counts[t]; ++j) indices[j] = PackedRow(keys[first[t] + j]);
      tf::Tensor block = grad.Slice(first[t], first[t] + counts[t]);
      if (block.IsAligned()) {
        ctx->set_output(num_tables_ + t, block);
      } else {
        tf::Tensor* value_out = nullptr;
        OP_REQUIRES_OK(ctx, AllocatePooledOutput(ctx, num_tables_ + t, block.shape(), &value_out));
        if (block.NumElements() > 0) {
          std::memcpy(value_out->flat<T>().data(), block.unaligned_flat<T>().data(),
                      block.NumElements() * sizeof(T));
        }
      }
    }
  }

  int64_t num_tables_ = 0;
};

REGISTER_KERNEL_BUILDER(
    Name("Sok>SplitGradientByTable").Device(tf::DEVICE_CPU).TypeConstraint<float>("dtype"),
    SplitGradientByTableOp<float>);

// Shared by CombineForward and CombineBackward: reads position / row_splits / weights inputs
// starting at `first_input` and checks that they agree.
template <typename T>
tf::Status ReadPooledLookups(tf::OpKernelContext* ctx, int position_input,
                             int first_splits_input, const std::vector<Combiner>& combiners,
                             std::vector<PooledLookup<T>>* lookups) {
  const int n = static_cast<int>(combiners.size());
  const tf::Tensor& position = ctx->input(position_input);
  if (!tf::TensorShapeUtils::IsVector(position.shape())) {
    return tf::errors::InvalidArgument("position must be a vector, got ",
                                       position.shape().DebugString());
  }
  int64_t offset = 0;
  lookups->resize(n);
  for (int l = 0; l < n; ++l) {
    const tf::Tensor& splits = ctx->input(first_splits_input + l);
    const tf::Tensor& weights = ctx->input(first_splits_input + n + l);
    if (!tf::TensorShapeUtils::IsVector(splits.shape()) || splits.NumElements() < 1) {
      return tf::errors::InvalidArgument("row_splits of lookup ", l,
                                         " must be a non-empty vector, got shape ",
                                         splits.shape().DebugString());
    }
    const int64_t batch = splits.NumElements() - 1;
    const int64_t* row_splits = splits.flat<int64_t>().data();
    const int64_t nnz = row_splits[batch];
    if (nnz < 0 || offset + nnz > position.NumElements()) {
      return tf::errors::InvalidArgument("lookup ", l, " has ", nnz, " ids but only ",
                                         position.NumElements() - offset,
                                         " positions are left");
    }
    TF_RETURN_IF_ERROR(ToTfStatus(
        ValidateRowSplits(row_splits, batch, nnz, "lookup " + std::to_string(l))));
    const bool weighted = weights.NumElements() > 0;
    if (weighted && weights.NumElements() != nnz) {
      return tf::errors::InvalidArgument("weights of lookup ", l, " have ", weights.NumElements(),
                                         " values but its ids have ", nnz,
                                         "; weights must match the ids one to one");
    }
    PooledLookup<T>& lookup = (*lookups)[l];
    lookup.row_splits = row_splits;
    lookup.batch = batch;
    lookup.position = reinterpret_cast<const int32_t*>(position.flat<uint32_t>().data()) + offset;
    lookup.weights = weighted ? weights.flat<float>().data() : nullptr;
    lookup.combiner = combiners[l];
    offset += nnz;
  }
  if (offset != position.NumElements()) {
    return tf::errors::InvalidArgument("the lookups have ", offset, " ids but position has ",
                                       position.NumElements());
  }
  return tf::Status();
}


template <typename T>
class CombineForwardOp : public tf::OpKernel {
 public:
  explicit CombineForwardOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadCombiners(ctx, &combiners_));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& rows = ctx->input(0);
    OP_REQUIRES(ctx, rows.dims() == 2,
                tf::errors::InvalidArgument("rows must be a matrix, got ", rows.shape().DebugString()));
    std::vector<PooledLookup<T>> lookups;
    OP_REQUIRES_OK(ctx, ReadPooledLookups<T>(ctx, 1, 2, combiners_, &lookups));
    const int64_t dim = rows.dim_size(1);
    for (size_t l = 0; l < lookups.size(); ++l) {
      tf::Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, AllocatePooledOutput(ctx, static_cast<int>(l),
                                               tf::TensorShape({lookups[l].batch, dim}), &out));
      lookups[l].output = out->flat<T>().data();
    }
    const DenseRows<const T> source{rows.flat<T>().data(), dim};
    SOK_OP_REQUIRES_OK(ctx, CombineForward(source, rows.dim_size(0), dim, lookups,
                                           CpuParallelFor(ctx)));
  }

 private:
  std::vector<Combiner> combiners_;
};

REGISTER_KERNEL_BUILDER(Name("Sok>CombineForward").Device(tf::DEVICE_CPU).TypeConstraint<float>("dtype"),
                        CombineForwardOp<float>);

template <typename T>
class CombineFromShardsOp : public tf::OpKernel {
 public:
  explicit CombineFromShardsOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadCombiners(ctx, &combiners_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_tables", &num_tables_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    const int num_tables = static_cast<int>(num_tables_);
    const tf::Tensor& keys = ctx->input(num_tables);
    OP_REQUIRES(ctx, tf::TensorShapeUtils::IsVector(keys.shape()),
                tf::errors::InvalidArgument("keys must be a vector, got ",
                                            keys.shape().DebugString()));
    LockedShards<T> shards;
    OP_REQUIRES_OK(ctx, shards.Lock(ctx, num_tables, dim_));
    const int64_t* key_data = keys.flat<int64_t>().data();
    SOK_OP_REQUIRES_OK(ctx, ValidatePackedKeys(shards.views(), key_data, keys.NumElements()));
    std::vector<PooledLookup<T>> lookups;
    OP_REQUIRES_OK(ctx, ReadPooledLookups<T>(ctx, num_tables + 1, num_tables + 2, combiners_,
                                             &lookups));
    for (size_t l = 0; l < lookups.size(); ++l) {
      tf::Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, AllocatePooledOutput(ctx, static_cast<int>(l),
                                               tf::TensorShape({lookups[l].batch, dim_}), &out));
      lookups[l].output = out->flat<T>().data();
    }
    std::vector<const T*> bases(shards.bases().begin(), shards.bases().end());
    const PackedKeyRows<T> source{key_data, bases.data(), dim_};
    SOK_OP_REQUIRES_OK(ctx, CombineForward(source, keys.NumElements(), dim_, lookups,
                                           CpuParallelFor(ctx)));
  }

 private:
  std::vector<Combiner> combiners_;
  int64_t num_tables_ = 0;
  int64_t dim_ = 0;
};

REGISTER_KERNEL_BUILDER(
    Name("Sok>CombineFromShards").Device(tf::DEVICE_CPU).TypeConstraint<float>("dtype"),
    CombineFromShardsOp<float>);

template <typename T>
class CombineBackwardOp : public tf::OpKernel {
 public:
  explicit CombineBackwardOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadCombiners(ctx, &combiners_));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    const int n = static_cast<int>(combiners_.size());
    std::vector<PooledLookup<T>> lookups;
    OP_REQUIRES_OK(ctx, ReadPooledLookups<T>(ctx, n, n + 1, combiners_, &lookups));
    int64_t num_rows = 0;
    OP_REQUIRES_OK(ctx, ReadNumRows(ctx->input(3 * n + 1), &num_rows));
    const int64_t dim = ctx->input(0).dim_size(1);
    for (int l = 0; l < n; ++l) {
      const tf::Tensor& grad = ctx->input(l);
      OP_REQUIRES_OK(ctx, CheckOutputGrad(l, grad, lookups[l].batch, dim));
      lookups[l].output_grad = grad.flat<T>().data();
    }
    tf::Tensor* rows_grad = nullptr;
    OP_REQUIRES_OK(ctx, AllocatePooledOutput(ctx, 0, tf::TensorShape({num_rows, dim}), &rows_grad));
    const DenseRows<T> destination{rows_grad->flat<T>().data(), dim};
    SOK_OP_REQUIRES_OK(ctx, CombineBackward(num_rows, dim, lookups, destination,
                                            CpuParallelFor(ctx)));
  }

 private:
  std::vector<Combiner> combiners_;
};

REGISTER_KERNEL_BUILDER(Name("Sok>CombineBackward").Device(tf::DEVICE_CPU).TypeConstraint<float>("dtype"),
                        CombineBackwardOp<float>);

}  // namespace sok
