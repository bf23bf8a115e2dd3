// The attrs and the shape checks of the lookup chain's ops (embedding_kernels.cc, one OpKernel
// each for both devices); the checks of the values (ids, positions, row_splits) are each
// device's own (embedding_functor.h, embedding_functor_gpu.cu.cc).
#pragma once

#include <string>
#include <vector>

#include "kit_src/core/embedding/combine.h"
#include "kit_src/core/embedding/key_partition.h"
#include "kit_src/core/embedding/shard_rows.h"
#include "kit_src/tf/kernels/core_bridge.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace sok {

// Sok>PartitionKeys' attrs: which table each ids input reads, where the tables live.
struct PartitionAttrs {
  std::vector<int64_t> lookup_table;
  std::vector<TablePlacement> tables;
  PartitionOptions options;
};

inline ::tensorflow::Status ReadPartitionAttrs(::tensorflow::OpKernelConstruction* ctx,
                                               PartitionAttrs* attrs) {
  namespace tf = ::tensorflow;
  std::vector<int64_t> rows, owners;
  std::vector<std::string> names;
  std::vector<bool> dynamic;
  int64_t num_workers = 1;
  TF_RETURN_IF_ERROR(ctx->GetAttr("lookup_table", &attrs->lookup_table));
  TF_RETURN_IF_ERROR(ctx->GetAttr("table_rows", &rows));
  TF_RETURN_IF_ERROR(ctx->GetAttr("table_owner", &owners));
  TF_RETURN_IF_ERROR(ctx->GetAttr("table_names", &names));
  TF_RETURN_IF_ERROR(ctx->GetAttr("num_workers", &num_workers));
  TF_RETURN_IF_ERROR(ctx->GetAttr("dedup", &attrs->options.dedup));
  TF_RETURN_IF_ERROR(ctx->GetAttr("pair_keys", &attrs->options.pair_keys));
  TF_RETURN_IF_ERROR(ctx->GetAttr("table_dynamic", &dynamic));
  attrs->options.num_workers = static_cast<int32_t>(num_workers);
  TF_RETURN_IF_ERROR(
      ToTfStatus(PlaceTables(rows, owners, names, dynamic, num_workers, &attrs->tables)));
  if (static_cast<int>(attrs->lookup_table.size()) != ctx->num_inputs()) {
    return tf::errors::InvalidArgument("lookup_table needs one entry per ids input, got ",
                                       attrs->lookup_table.size(), " for ", ctx->num_inputs());
  }
  return tf::Status();
}

inline ::tensorflow::Status ReadCombiners(::tensorflow::OpKernelConstruction* ctx,
                                          std::vector<Combiner>* combiners) {
  std::vector<std::string> names;
  int64_t n = 0;
  TF_RETURN_IF_ERROR(ctx->GetAttr("combiners", &names));
  TF_RETURN_IF_ERROR(ctx->GetAttr("N", &n));
  if (static_cast<int64_t>(names.size()) != n) {
    return ::tensorflow::errors::InvalidArgument("combiners has ", names.size(), " entries for ",
                                                 n, " lookups");
  }
  combiners->resize(n);
  for (int64_t l = 0; l < n; ++l) {
    TF_RETURN_IF_ERROR(ToTfStatus(ParseCombiner(names[l], &(*combiners)[l])));
  }
  return ::tensorflow::Status();
}

// A pooled lookup's row_splits input: a vector of batch + 1 entries.
inline ::tensorflow::Status CheckRowSplitsShape(int64_t l, const ::tensorflow::Tensor& splits) {
  if (::tensorflow::TensorShapeUtils::IsVector(splits.shape()) && splits.NumElements() >= 1) {
    return ::tensorflow::Status();
  }
  return ::tensorflow::errors::InvalidArgument("row_splits of lookup ", l,
                                               " must be a non-empty vector, got shape ",
                                               splits.shape().DebugString());
}

// The host ops' row_splits input l (Sok>CheckIdsOnHost, Sok>EverySampleHoldsOneId,
// Sok>ElideOneIdRowSplits): a vector of batch + 1 entries.
inline ::tensorflow::Status CheckHostRowSplitsShape(int l, const ::tensorflow::Tensor& splits) {
  if (::tensorflow::TensorShapeUtils::IsVector(splits.shape()) && splits.NumElements() >= 1) {
    return ::tensorflow::Status();
  }
  return ::tensorflow::errors::InvalidArgument(
      "row_splits ", l, " must be a non-empty vector, got ", splits.shape().DebugString());
}

// Sok>GatherSingleIds, Sok>PoolFromTables: lookup l's ids are a vector.
inline ::tensorflow::Status CheckSingleIdLookup(int l, const ::tensorflow::Tensor& ids) {
  if (::tensorflow::TensorShapeUtils::IsVector(ids.shape())) return ::tensorflow::Status();
  return ::tensorflow::errors::InvalidArgument("ids of lookup ", l, " must be a vector, got shape ",
                                               ids.shape().DebugString());
}

// Sok>SplitGradientByTable: grad is [keys, dim].
inline ::tensorflow::Status CheckKeysAndGrad(const ::tensorflow::Tensor& keys,
                                             const ::tensorflow::Tensor& grad) {
  if (::tensorflow::TensorShapeUtils::IsVector(keys.shape()) && grad.dims() == 2 &&
      grad.dim_size(0) == keys.NumElements()) {
    return ::tensorflow::Status();
  }
  return ::tensorflow::errors::InvalidArgument("grad must be [keys, dim], got keys ",
                                               keys.shape().DebugString(), " and grad ",
                                               grad.shape().DebugString());
}

// Sok>SparseRowSplits' names attr: one name a SparseTensor, for its errors.
inline ::tensorflow::Status ReadSparseNames(::tensorflow::OpKernelConstruction* ctx,
                                            std::vector<std::string>* names) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("names", names));
  int n = 0;
  TF_RETURN_IF_ERROR(ctx->GetAttr("N", &n));
  if (static_cast<int>(names->size()) == n) return ::tensorflow::Status();
  return ::tensorflow::errors::InvalidArgument("names has ", names->size(), " entries for ", n,
                                               " SparseTensors");
}

// Sok>SparseRowSplits' SparseTensor l of n (indices [nnz, 2], dense_shape [2] in host memory,
// dense_shape[0] >= 0): its row count and its row_splits output ([rows + 1]), allocated.
inline ::tensorflow::Status PrepareRowSplits(::tensorflow::OpKernelContext* ctx, int l, int n,
                                             const std::string& name, int64_t* rows,
                                             ::tensorflow::Tensor** row_splits) {
  const ::tensorflow::Tensor& indices = ctx->input(l);
  const ::tensorflow::Tensor& dense_shape = ctx->input(n + l);
  if (!::tensorflow::TensorShapeUtils::IsVector(dense_shape.shape()) ||
      dense_shape.NumElements() != 2) {
    return ::tensorflow::errors::InvalidArgument(name, " must be a 2-D SparseTensor; its "
                                                 "dense_shape has shape ",
                                                 dense_shape.shape().DebugString());
  }
  if (!::tensorflow::TensorShapeUtils::IsMatrix(indices.shape()) || indices.dim_size(1) != 2) {
    return ::tensorflow::errors::InvalidArgument(name, ": indices must be [nnz, 2], got ",
                                                 indices.shape().DebugString());
  }
  *rows = dense_shape.flat<int64_t>()(0);
  if (*rows < 0) {
    return ::tensorflow::errors::InvalidArgument(name, ": dense_shape[0] is ", *rows);
  }
  return ctx->allocate_output(l, ::tensorflow::TensorShape({*rows + 1}), row_splits);
}

// Sok>GatherSingleIds' check output (a LookupCheck record), as Sok>CheckGatheredIds and
// Sok>GuardIds take it: 3 int64 values.
inline ::tensorflow::Status CheckRecordShape(const ::tensorflow::Tensor& check) {
  if (check.NumElements() == 3) return ::tensorflow::Status();
  return ::tensorflow::errors::InvalidArgument("check must hold 3 values, got ",
                                               check.shape().DebugString());
}

// Sok>SplitGradientByTable's table_counts: empty (unknown), or one count >= 0 a table adding
// up to the keys; first[t] receives where table t's keys start.
inline ::tensorflow::Status ReadTableCounts(const ::tensorflow::Tensor& counts, int64_t num_tables,
                                            int64_t num_keys, std::vector<int64_t>* first) {
  first->clear();
  if (counts.NumElements() == 0) return ::tensorflow::Status();
  if (!::tensorflow::TensorShapeUtils::IsVector(counts.shape()) ||
      counts.NumElements() != num_tables) {
    return ::tensorflow::errors::InvalidArgument("table_counts must be empty or hold ", num_tables,
                                                 " counts, got shape ",
                                                 counts.shape().DebugString());
  }
  return ToTfStatus(TableFirstsOfCounts(counts.flat<int32_t>().data(),
                                        static_cast<int32_t>(num_tables), num_keys, first));
}

// Sok>CombineBackward: num_rows is a scalar >= 0, each output gradient [batch, dim].
inline ::tensorflow::Status ReadNumRows(const ::tensorflow::Tensor& tensor, int64_t* num_rows) {
  if (!::tensorflow::TensorShapeUtils::IsScalar(tensor.shape())) {
    return ::tensorflow::errors::InvalidArgument("num_rows must be a scalar");
  }
  *num_rows = tensor.scalar<int64_t>()();
  if (*num_rows < 0) return ::tensorflow::errors::InvalidArgument("num_rows is negative: ", *num_rows);
  return ::tensorflow::Status();
}

inline ::tensorflow::Status CheckOutputGrad(int l, const ::tensorflow::Tensor& grad,
                                            int64_t batch, int64_t dim) {
  if (grad.dims() == 2 && grad.dim_size(0) == batch && grad.dim_size(1) == dim) {
    return ::tensorflow::Status();
  }
  return ::tensorflow::errors::InvalidArgument("gradient of lookup ", l, " must be [", batch, ", ",
                                               dim, "], got ", grad.shape().DebugString());
}

}  // namespace sok
