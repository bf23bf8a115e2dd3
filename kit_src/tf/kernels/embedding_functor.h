// The device work of the fused lookup chain's ops (TensorFlow's gather_functor.h pattern): the
// OpKernels in embedding_kernels.cc check shapes, lock the tables and allocate the outputs once
// for both devices; what differs by device is here. The CPU specialisations (inline below) call
// kit_src/core/embedding on the host and fail before writing on a bad value; the GPU ones
// (embedding_functor_gpu.cu.cc) call lookup_gpu.cuh on TensorFlow's stream, where bad values
// are recorded on the device and reported once the stream has passed (no host thread waits),
// except where an output's size depends on the data (documented at each).
#pragma once

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "kit_src/core/embedding/combine.h"
#include "kit_src/core/embedding/key_partition.h"
#include "kit_src/core/embedding/lookup_check.h"
#include "kit_src/core/embedding/packed_key.h"
#include "kit_src/core/embedding/shard_rows.h"
#include "kit_src/tf/kernels/core_bridge.h"
#include "kit_src/tf/kernels/device_tags.h"
#include "kit_src/tf/kernels/embedding_validation.h"
#include "kit_src/tf/kernels/locked_tables.h"
#include "kit_src/tf/kernels/pooled_output.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace sok {

using DoneCallback = ::tensorflow::AsyncOpKernel::DoneCallback;

template <typename T>
std::vector<ShardView<T>> HostShards(const std::vector<TableRows>& tables) {
  std::vector<ShardView<T>> shards;
  for (const TableRows& table : tables) {
    shards.push_back(ShardView<T>{static_cast<const T*>(table.data), table.rows});
  }
  return shards;
}

// ---- Sok>SplitGradientByTable

// Sok>SplitGradientByTable's outputs: table t's row indices (output t) and gradient rows
// (output num_tables + t).
template <typename Device>
class GradientSplitOutputs : public TableGradientOutputs {
 public:
  GradientSplitOutputs(::tensorflow::OpKernelContext* ctx, const ::tensorflow::Tensor& grad,
                       int64_t num_tables)
      : ctx_(ctx), grad_(grad), num_tables_(num_tables) {}

  Status Block(int64_t t, int64_t first, int64_t count, int64_t** indices,
               float** values) override {
    SOK_RETURN_IF_ERROR(Indices(t, count, indices));
    ::tensorflow::Tensor block = grad_.Slice(first, first + count);
    *values = nullptr;
    if (block.IsAligned()) {
      ctx_->set_output(num_tables_ + t, block);
      return Status::Ok();
    }
    return Values(t, count, values);
  }

  Status Table(int64_t t, int64_t count, int64_t** indices, float** values) override {
    SOK_RETURN_IF_ERROR(Indices(t, count, indices));
    return Values(t, count, values);
  }

 private:
  Status Indices(int64_t t, int64_t count, int64_t** indices) {
    ::tensorflow::Tensor* out = nullptr;
    SOK_RETURN_IF_ERROR(ToCoreStatus(ctx_->allocate_output(
        static_cast<int>(t), ::tensorflow::TensorShape({count}), &out)));
    *indices = out->flat<int64_t>().data();
    return Status::Ok();
  }
  Status Values(int64_t t, int64_t count, float** values) {
    ::tensorflow::Tensor* out = nullptr;
    SOK_RETURN_IF_ERROR(ToCoreStatus(AllocateRowsOutput<Device>(
        ctx_, static_cast<int>(num_tables_ + t),
        ::tensorflow::TensorShape({count, grad_.dim_size(1)}), &out)));
    *values = out->flat<float>().data();
    return Status::Ok();
  }

  ::tensorflow::OpKernelContext* ctx_;
  const ::tensorflow::Tensor& grad_;
  int64_t num_tables_;
};

// ---- The combine ops

// One pooled lookup of a combine op as the op reads it from its inputs' shapes; the values
// (row splits, weights, positions) are checked by the device work.
struct PooledArgs {
  const int64_t* row_splits = nullptr;  // [batch + 1]
  int64_t batch = 0;
  const float* weights = nullptr;       // [weights_count], or null: all ones
  int64_t weights_count = 0;
  Combiner combiner = Combiner::kMean;
  float* output = nullptr;              // forward: [batch, dim]
  const float* output_grad = nullptr;   // backward: [batch, dim]
};

// What the positions of a combine op name: rows of a dense [num_rows, dim] matrix, or (keys
// non-null) the rows of the local shards that packed keys[p] names.
struct PooledSource {
  const float* rows = nullptr;
  const int64_t* keys = nullptr;
  std::vector<TableRows> tables;
  int64_t num_rows = 0;
  int64_t dim = 0;
};

// The positions input (uint32, see the ops) as the core's int32.
inline const int32_t* PositionsOf(const ::tensorflow::Tensor& position) {
  return reinterpret_cast<const int32_t*>(position.flat<uint32_t>().data());
}

namespace functor {

// Fills the partition's outputs, allocated through `allocate` once their sizes are known. The
// GPU sorts on the device and waits for the stream once: the unique keys size send_keys.
template <typename Device>
struct PartitionKeys {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* ctx, const PartitionAttrs& attrs,
                                  const PartitionKeyBits& bits,
                                  const std::vector<PartitionInput>& inputs, bool ids64,
                                  int64_t total, const AllocatePartition& allocate);
};

// rows[i] = the row of the local shards that packed keys[i] names (a 16-bit table's rows copied
// bit for bit); finishes the op through `done`.
template <typename Device, typename T>
struct GatherShardRows {
  void operator()(::tensorflow::OpKernelContext* ctx, DoneCallback done,
                  const std::vector<TableRows>& tables, int64_t dim, const int64_t* keys,
                  int64_t n, T* rows);
};

// One lookup of Sok>GatherSingleIds: output row i = row ids[i] of its table.
struct SingleIdArgs {
  const void* ids = nullptr;  // [count], int64 (or int32 on the CPU)
  int64_t count = 0;
  TableRows table;
  const std::string* table_name = nullptr;
  float* output = nullptr;    // [count, dim]
};

// Fills every output; an id outside its table goes to `check` (3 int64: a LookupCheck) on the
// GPU, which Sok>CheckGatheredIds reports, while the CPU fails at once and leaves it clean.
// check null: the ids were checked on the host, the GPU checks nothing.
template <typename Device, typename Tindex>
struct GatherSingleIds {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* ctx,
                                  const std::vector<SingleIdArgs>& lookups, int64_t dim,
                                  int64_t* check);
};

// Sok>GuardIds: output l = input l's ids, or all -1 when `check` (or, on the GPU, a deferred
// check) holds an error; the outputs are the functor's to make.
template <typename Device>
struct GuardIds {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* ctx, int n,
                                  const ::tensorflow::Tensor& check);
};

// One SparseTensor of Sok>SparseRowSplits.
struct RowSplitsArgs {
  const int64_t* indices = nullptr;  // [nnz, 2]
  int64_t nnz = 0;
  int64_t rows = 0;
  int64_t* row_splits = nullptr;     // [rows + 1]
  const std::string* name = nullptr;
};

// The row splits of each SparseTensor; the CPU checks the rows are in order, the GPU does not
// (it would make the step wait), as TensorFlow's own GPU lookups.
template <typename Device>
struct SparseRowSplits {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* ctx,
                                  const std::vector<RowSplitsArgs>& tensors);
};

// Fails the op when `check` names a bad id; on the GPU a deferred check raises an earlier
// step's error instead and nothing waits for this one's. Finishes through `done`.
template <typename Device>
struct CheckGatheredIds {
  void operator()(::tensorflow::OpKernelContext* ctx, DoneCallback done,
                  const ::tensorflow::Tensor& check, const std::vector<std::string>& table_names,
                  bool deferred);
};

// Splits keys ([n] packed keys) and grad ([n, dim]) by the table each key names. given_first
// (from table_counts, or empty) says where each table's block starts when the caller knows
// the keys come grouped by table (the CPU checks it; the GPU trusts it). Without it the GPU
// counts on the device and waits for the stream once: the counts size the outputs.
template <typename Device>
struct SplitGradientByTable {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* ctx,
                                  const ::tensorflow::Tensor& keys,
                                  const ::tensorflow::Tensor& grad, int64_t num_tables,
                                  const std::vector<int64_t>& given_first,
                                  GradientSplitOutputs<Device>* outputs);
};

// Each lookup's output = the combine of the rows its samples' positions name in `source`;
// with `validate` off (inputs built by lookup_sparse) the GPU gives no verdict. Finishes
// through `done`.
template <typename Device>
struct CombineForward {
  void operator()(::tensorflow::OpKernelContext* ctx, DoneCallback done,
                  const std::vector<PooledArgs>& lookups, const ::tensorflow::Tensor& position,
                  const PooledSource& source, bool validate);
};

// rows_grad ([num_rows, dim], overwritten) = the sum over each row's uses of their share of
// the lookups' output gradients. Finishes through `done`.
template <typename Device>
struct CombineBackward {
  void operator()(::tensorflow::OpKernelContext* ctx, DoneCallback done,
                  const std::vector<PooledArgs>& lookups, const ::tensorflow::Tensor& position,
                  int64_t num_rows, int64_t dim, float* rows_grad, bool validate);
};

// ------------------------------------------------------------------ CPU

template <>
struct PartitionKeys<CpuDevice> {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* ctx, const PartitionAttrs& attrs,
                                  const PartitionKeyBits&,
                                  const std::vector<PartitionInput>& inputs, bool ids64,
                                  int64_t, const AllocatePartition& allocate) {
    return ToTfStatus(PartitionKeysInto(inputs, ids64, attrs.tables, attrs.options,
                                        CpuParallelFor(ctx), allocate));
  }
};

template <typename T>
struct GatherShardRows<CpuDevice, T> {
  void operator()(::tensorflow::OpKernelContext* ctx, DoneCallback done,
                  const std::vector<TableRows>& tables, int64_t dim, const int64_t* keys,
                  int64_t n, T* rows) {
    // Rows are copied bit for bit: 16-bit tables reach the core as uint16_t words.
    using Word = typename std::conditional<sizeof(T) == 2, uint16_t, T>::type;
    ctx->SetStatus(ToTfStatus(::sok::GatherShardRows(HostShards<Word>(tables), dim, keys, n,
                                                     reinterpret_cast<Word*>(rows),
                                                     CpuParallelFor(ctx))));
    done();
  }
};

template <typename Tindex>
struct GatherSingleIds<CpuDevice, Tindex> {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* ctx,
                                  const std::vector<SingleIdArgs>& lookups, int64_t dim,
                                  int64_t* check) {
    std::vector<ShardView<float>> views;
    for (const SingleIdArgs& lookup : lookups) {
      views.push_back(ShardView<float>{static_cast<const float*>(lookup.table.data),
                                       lookup.table.rows});
    }
    std::vector<SingleIdLookup<float, Tindex>> core(lookups.size());
    for (size_t l = 0; l < lookups.size(); ++l) {
      core[l] = SingleIdLookup<float, Tindex>{static_cast<const Tindex*>(lookups[l].ids),
                                              lookups[l].count, &views[l],
                                              lookups[l].table_name, lookups[l].output};
    }
    TF_RETURN_IF_ERROR(ToTfStatus(::sok::GatherSingleIds(core, dim, CpuParallelFor(ctx))));
    const LookupCheck clean = CleanCheck();
    if (check != nullptr) std::memcpy(check, &clean, sizeof(clean));
    return ::tensorflow::Status();
  }
};

template <>
struct GuardIds<CpuDevice> {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* ctx, int n,
                                  const ::tensorflow::Tensor& check) {
    LookupCheck record;
    std::memcpy(&record, check.data(), sizeof(record));
    for (int l = 0; l < n; ++l) {
      if (record.first_bad == kNoError) {
        ctx->set_output(l, ctx->input(l));  // the ids themselves
        continue;
      }
      ::tensorflow::Tensor* out = nullptr;
      TF_RETURN_IF_ERROR(ctx->allocate_output(l, ctx->input(l).shape(), &out));
      out->flat<int64_t>().setConstant(-1);
    }
    return ::tensorflow::Status();
  }
};

template <>
struct SparseRowSplits<CpuDevice> {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext*,
                                  const std::vector<RowSplitsArgs>& tensors) {
    for (const RowSplitsArgs& sparse : tensors) {
      TF_RETURN_IF_ERROR(ToTfStatus(RowSplitsOfSortedRows(sparse.indices, 2, sparse.nnz,
                                                          sparse.rows, sparse.row_splits,
                                                          *sparse.name)));
    }
    return ::tensorflow::Status();
  }
};

template <>
struct CheckGatheredIds<CpuDevice> {
  // The CPU gather fails at once, so `deferred` changes nothing here.
  void operator()(::tensorflow::OpKernelContext* ctx, DoneCallback done,
                  const ::tensorflow::Tensor& check, const std::vector<std::string>& table_names,
                  bool) {
    LookupCheck record;
    std::memcpy(&record, check.data(), sizeof(record));
    ctx->SetStatus(ToTfStatus(GatheredIdsStatus(record, table_names)));
    done();
  }
};

template <>
struct SplitGradientByTable<CpuDevice> {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* ctx,
                                  const ::tensorflow::Tensor& keys,
                                  const ::tensorflow::Tensor& grad, int64_t num_tables,
                                  const std::vector<int64_t>& given_first,
                                  GradientSplitOutputs<CpuDevice>* outputs) {
    return ToTfStatus(::sok::SplitGradientByTable(
        keys.flat<int64_t>().data(), keys.NumElements(), grad.dim_size(1),
        grad.flat<float>().data(), static_cast<int32_t>(num_tables), given_first, outputs,
        CpuParallelFor(ctx)));
  }
};

// The pooled lookups the CPU reads, bound to their positions and checked by the core.
inline ::tensorflow::Status HostPooledLookups(const std::vector<PooledArgs>& args,
                                              const ::tensorflow::Tensor& position,
                                              std::vector<PooledLookup<float>>* lookups) {
  std::vector<int64_t> weights_counts;
  for (const PooledArgs& arg : args) {
    PooledLookup<float> lookup;
    lookup.row_splits = arg.row_splits;
    lookup.batch = arg.batch;
    lookup.weights = arg.weights;
    lookup.combiner = arg.combiner;
    lookup.output = arg.output;
    lookup.output_grad = arg.output_grad;
    lookups->push_back(lookup);
    weights_counts.push_back(arg.weights_count);
  }
  return ToTfStatus(BindPooledPositions(PositionsOf(position), position.NumElements(),
                                        weights_counts, lookups));
}

template <>
struct CombineForward<CpuDevice> {
  void operator()(::tensorflow::OpKernelContext* ctx, DoneCallback done,
                  const std::vector<PooledArgs>& args, const ::tensorflow::Tensor& position,
                  const PooledSource& source, bool) {
    ctx->SetStatus(Pool(ctx, args, position, source));
    done();
  }

 private:
  static ::tensorflow::Status Pool(::tensorflow::OpKernelContext* ctx,
                                   const std::vector<PooledArgs>& args,
                                   const ::tensorflow::Tensor& position,
                                   const PooledSource& source) {
    std::vector<PooledLookup<float>> lookups;
    if (source.keys == nullptr) {
      TF_RETURN_IF_ERROR(HostPooledLookups(args, position, &lookups));
      const DenseRows<const float> rows{source.rows, source.dim};
      return ToTfStatus(::sok::CombineForward(rows, source.num_rows, source.dim, lookups,
                                              CpuParallelFor(ctx)));
    }
    const std::vector<ShardView<float>> shards = HostShards<float>(source.tables);
    TF_RETURN_IF_ERROR(ToTfStatus(ValidatePackedKeys(shards, source.keys, source.num_rows)));
    TF_RETURN_IF_ERROR(HostPooledLookups(args, position, &lookups));
    std::vector<const float*> bases;
    for (const ShardView<float>& shard : shards) bases.push_back(shard.data);
    const PackedKeyRows<float> rows{source.keys, bases.data(), source.dim};
    return ToTfStatus(::sok::CombineForward(rows, source.num_rows, source.dim, lookups,
                                            CpuParallelFor(ctx)));
  }
};

template <>
struct CombineBackward<CpuDevice> {
  void operator()(::tensorflow::OpKernelContext* ctx, DoneCallback done,
                  const std::vector<PooledArgs>& args, const ::tensorflow::Tensor& position,
                  int64_t num_rows, int64_t dim, float* rows_grad, bool) {
    std::vector<PooledLookup<float>> lookups;
    ::tensorflow::Status status = HostPooledLookups(args, position, &lookups);
    if (status.ok()) {
      status = ToTfStatus(::sok::CombineBackward(num_rows, dim, lookups,
                                                 DenseRows<float>{rows_grad, dim},
                                                 CpuParallelFor(ctx)));
    }
    ctx->SetStatus(status);
    done();
  }
};

}  // namespace functor
}  // namespace sok
