// Sok>PoolFromTables and Sok>SpreadPooledGrad: pooled lookups straight from the tables on one
// worker (no dedup, no exchange), one OpKernel each for both devices over
// pool_from_tables_functor.h.
#include <cstring>
#include <string>
#include <vector>

#include "kit_src/core/embedding/lookup_check.h"
#include "kit_src/tf/kernels/core_bridge.h"
#include "kit_src/tf/kernels/embedding_validation.h"
#include "kit_src/tf/kernels/locked_tables.h"
#include "kit_src/tf/kernels/pool_from_tables_functor.h"
#include "kit_src/tf/kernels/pooled_output.h"
#include "kit_src/tf/kernels/register_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace sok {
namespace tf = ::tensorflow;

namespace functor {

template <>
tf::Status PoolFromTables<CpuDevice>::operator()(tf::OpKernelContext* ctx,
                                                 const std::vector<LookupTable<float>>& tables,
                                                 const std::vector<PooledLookup<float>>& lookups,
                                                 int64_t dim, LookupCheck* check) {
  if (check != nullptr) *check = CleanCheck();
  std::vector<std::vector<int64_t>> one_id_splits;
  return ToTfStatus(sok::PoolFromTables(tables, dim, WithOneIdRowSplits(lookups, &one_id_splits),
                                        CpuParallelFor(ctx)));
}

template <>
tf::Status SpreadPooledGrad<CpuDevice>::operator()(tf::OpKernelContext* ctx,
                                                   const std::vector<PooledLookup<float>>& lookups,
                                                   const std::vector<int64_t>& id_counts,
                                                   const std::vector<float*>& id_grads,
                                                   int64_t dim) {
  return ToTfStatus(sok::SpreadPooledGrad(dim, lookups, id_counts, id_grads, CpuParallelFor(ctx)));
}

template <>
tf::Status PooledGradShares<CpuDevice>::operator()(
    tf::OpKernelContext* ctx, const std::vector<PooledLookup<float>>& lookups,
    const std::vector<int64_t>& id_counts, const std::vector<int64_t>& row_first,
    const std::vector<int64_t>& row_step, const std::vector<int64_t*>& use_rows,
    const std::vector<float*>& use_scales) {
  return ToTfStatus(sok::PooledGradShares(lookups, id_counts, row_first, row_step, use_rows,
                                          use_scales, CpuParallelFor(ctx)));
}

}  // namespace functor

namespace {

// The attrs both ops share: N lookups, their combiners, dim, and the output layout.
struct PooledLayout {
  int64_t n = 0, num_outputs = 0, dim = 0;
  bool stacked = false;
  std::vector<Combiner> combiners;

  tf::Status Read(tf::OpKernelConstruction* ctx) {
    TF_RETURN_IF_ERROR(ctx->GetAttr("N", &n));
    TF_RETURN_IF_ERROR(ctx->GetAttr("num_outputs", &num_outputs));
    TF_RETURN_IF_ERROR(ctx->GetAttr("stacked", &stacked));
    TF_RETURN_IF_ERROR(ctx->GetAttr("dim", &dim));
    TF_RETURN_IF_ERROR(ReadCombiners(ctx, &combiners));
    if (num_outputs != (stacked ? 1 : n)) {
      return tf::errors::InvalidArgument("num_outputs must be ", stacked ? 1 : n, " with stacked=",
                                         stacked, ", got ", num_outputs);
    }
    return tf::Status();
  }

  // The lookups' row splits, weights and combiners from inputs first_splits.. (N row splits,
  // then N weights); id_counts[l] is lookup l's number of ids. Empty row splits: one id a
  // sample (row_splits null).
  tf::Status Describe(tf::OpKernelContext* ctx, int first_splits,
                      const std::vector<int64_t>& id_counts,
                      std::vector<PooledLookup<float>>* lookups) const {
    lookups->resize(n);
    for (int64_t l = 0; l < n; ++l) {
      const tf::Tensor& splits = ctx->input(first_splits + l);
      const tf::Tensor& weights = ctx->input(first_splits + n + l);
      const bool one_id = splits.dims() == 1 && splits.NumElements() == 0;
      if (!one_id) TF_RETURN_IF_ERROR(CheckRowSplitsShape(l, splits));
      if (weights.NumElements() > 0 && weights.NumElements() != id_counts[l]) {
        return tf::errors::InvalidArgument("weights of lookup ", l, " have ",
                                           weights.NumElements(), " values but its ids have ",
                                           id_counts[l], "; weights must match the ids one to one");
      }
      PooledLookup<float>& lookup = (*lookups)[l];
      lookup.row_splits = one_id ? nullptr : splits.flat<int64_t>().data();
      lookup.batch = one_id ? id_counts[l] : splits.NumElements() - 1;
      lookup.weights = weights.NumElements() > 0 ? weights.flat<float>().data() : nullptr;
      lookup.combiner = combiners[l];
      if (stacked) {
        if (lookup.batch != (*lookups)[0].batch) {
          return tf::errors::InvalidArgument("a stacked output needs one batch size; lookup ", l,
                                             " has ", lookup.batch, " samples, lookup 0 has ",
                                             (*lookups)[0].batch);
        }
        lookup.stride = n * dim;
      }
    }
    return tf::Status();
  }

  // As Describe, the id counts read from the N ids at inputs first_ids.. (row splits and
  // weights follow them).
  tf::Status DescribeIds(tf::OpKernelContext* ctx, int first_ids, std::vector<int64_t>* id_counts,
                         std::vector<PooledLookup<float>>* lookups) const {
    id_counts->resize(n);
    for (int64_t l = 0; l < n; ++l) (*id_counts)[l] = ctx->input(first_ids + l).NumElements();
    return Describe(ctx, first_ids + static_cast<int>(n), *id_counts, lookups);
  }

  // Output (gradient) o's shape: [batch, dim] a lookup, or [batch, N, dim] stacked.
  tf::TensorShape OutputShape(const std::vector<PooledLookup<float>>& lookups, int o) const {
    return stacked ? tf::TensorShape({lookups[0].batch, n, dim})
                   : tf::TensorShape({lookups[o].batch, dim});
  }
  // Where lookup l's rows of output (gradient) `index` start: its own tensor, or its column
  // of the stacked one.
  int OutputIndex(int64_t l) const { return stacked ? 0 : static_cast<int>(l); }
  int64_t OutputOffset(int64_t l) const { return stacked ? l * dim : 0; }
};

// An op over the lookups PooledLayout describes, its attrs read once.
class PooledLayoutOp : public tf::OpKernel {
 public:
  explicit PooledLayoutOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, layout_.Read(ctx));
  }

 protected:
  PooledLayout layout_;
};

}  // namespace

template <typename Device>
class PoolFromTablesOp : public PooledLayoutOp {
 public:
  explicit PoolFromTablesOp(tf::OpKernelConstruction* ctx) : PooledLayoutOp(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_names", &table_names_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("host_checked", &host_checked_));
    OP_REQUIRES(ctx, static_cast<int64_t>(table_names_.size()) == layout_.n,
                tf::errors::InvalidArgument("table_names needs one entry per lookup"));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    const int64_t n = layout_.n, dim = layout_.dim;
    LockedTables locked;  // lookups may share a table
    OP_REQUIRES_OK(ctx, locked.Lock(ctx, 0, static_cast<int>(n), dim, tf::DT_FLOAT, &table_names_));
    std::vector<LookupTable<float>> tables(n);
    std::vector<int64_t> id_counts(n);
    for (int64_t l = 0; l < n; ++l) {
      const tf::Tensor& ids = ctx->input(n + l);
      OP_REQUIRES_OK(ctx, CheckSingleIdLookup(static_cast<int>(l), ids));  // a vector
      id_counts[l] = ids.NumElements();
      const TableRows& table = locked.tables()[l];
      tables[l] = LookupTable<float>{static_cast<const float*>(table.data), table.rows,
                                     ids.flat<int64_t>().data(), ids.NumElements(),
                                     &table_names_[l]};
    }
    std::vector<PooledLookup<float>> lookups;
    OP_REQUIRES_OK(ctx, layout_.Describe(ctx, 2 * n, id_counts, &lookups));
    std::vector<tf::Tensor*> outputs(layout_.num_outputs);
    for (int o = 0; o < layout_.num_outputs; ++o) {
      const tf::TensorShape shape = layout_.OutputShape(lookups, o);
      OP_REQUIRES_OK(ctx, AllocateRowsOutput<Device>(ctx, o, shape, &outputs[o]));
    }
    for (int64_t l = 0; l < n; ++l) {
      lookups[l].output = outputs[layout_.OutputIndex(l)]->flat<float>().data() +
                          layout_.OutputOffset(l);
    }
    // Checked on the host, nothing reads the record: it stays empty.
    tf::Tensor* check = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(layout_.num_outputs,
                                             tf::TensorShape({host_checked_ ? 0 : 3}), &check));
    OP_REQUIRES_OK(ctx, functor::PoolFromTables<Device>()(
                            ctx, tables, lookups, dim,
                            host_checked_ ? nullptr
                                          : reinterpret_cast<LookupCheck*>(
                                                check->flat<int64_t>().data())));
  }

 private:
  std::vector<std::string> table_names_;
  bool host_checked_ = false;
};

template <typename Device>
class SpreadPooledGradOp : public PooledLayoutOp {
 public:
  using PooledLayoutOp::PooledLayoutOp;

  void Compute(tf::OpKernelContext* ctx) override {
    std::vector<int64_t> id_counts;  // the output gradients come first, then the ids
    std::vector<PooledLookup<float>> lookups;
    OP_REQUIRES_OK(ctx, layout_.DescribeIds(ctx, static_cast<int>(layout_.num_outputs), &id_counts,
                                            &lookups));
    const int64_t n = layout_.n, dim = layout_.dim;
    for (int o = 0; o < layout_.num_outputs; ++o) {
      const tf::Tensor& grad = ctx->input(o);
      const tf::TensorShape expected = layout_.OutputShape(lookups, o);
      OP_REQUIRES(ctx, grad.shape() == expected,
                  tf::errors::InvalidArgument("output gradient ", o, " must have shape ",
                                              expected.DebugString(), ", got ",
                                              grad.shape().DebugString()));
    }
    std::vector<float*> id_grads(n);
    for (int64_t l = 0; l < n; ++l) {
      lookups[l].output_grad = ctx->input(layout_.OutputIndex(l)).flat<float>().data() +
                               layout_.OutputOffset(l);
      tf::Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, AllocateRowsOutput<Device>(ctx, static_cast<int>(l),
                                                     tf::TensorShape({id_counts[l], dim}), &out));
      id_grads[l] = out->flat<float>().data();
    }
    OP_REQUIRES_OK(ctx, functor::SpreadPooledGrad<Device>()(ctx, lookups, id_counts, id_grads,
                                                            dim));
  }
};

// Sok>PooledGradShares: each id's output-gradient row and scale, for Sok>StaticApply to read
// the pooled gradient itself.
template <typename Device>
class PooledGradSharesOp : public PooledLayoutOp {
 public:
  using PooledLayoutOp::PooledLayoutOp;

  void Compute(tf::OpKernelContext* ctx) override {
    const int64_t n = layout_.n;
    std::vector<int64_t> id_counts, row_first(n), row_step(n);
    std::vector<PooledLookup<float>> lookups;
    OP_REQUIRES_OK(ctx, layout_.DescribeIds(ctx, 0, &id_counts, &lookups));
    std::vector<int64_t*> use_rows(n);
    std::vector<float*> use_scales(n);
    for (int64_t l = 0; l < n; ++l) {
      row_first[l] = layout_.stacked ? l : 0;
      row_step[l] = layout_.stacked ? n : 1;
      tf::Tensor* rows = nullptr;
      tf::Tensor* scales = nullptr;
      const tf::TensorShape shape({id_counts[l]});
      OP_REQUIRES_OK(ctx, ctx->allocate_output(static_cast<int>(l), shape, &rows));
      OP_REQUIRES_OK(ctx, ctx->allocate_output(static_cast<int>(n + l), shape, &scales));
      use_rows[l] = rows->flat<int64_t>().data();
      use_scales[l] = scales->flat<float>().data();
    }
    OP_REQUIRES_OK(ctx, functor::PooledGradShares<Device>()(ctx, lookups, id_counts, row_first,
                                                            row_step, use_rows, use_scales));
  }
};

SOK_REGISTER_KERNELS("Sok>PooledGradShares", PooledGradSharesOp);
SOK_REGISTER_KERNELS("Sok>PoolFromTables", PoolFromTablesOp);
SOK_REGISTER_KERNELS("Sok>SpreadPooledGrad", SpreadPooledGradOp);

}  // namespace sok
