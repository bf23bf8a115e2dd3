// Sok>StaticApply: lazy optimizer updates of a static table (a resource variable) and its
// optimizer slot variables, on the touched rows only. One OpKernel for both devices; the CPU
// functor is here, the GPU one in static_apply_kernels_gpu.cu.cc.
#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "kit_src/core/embedding/key_partition.h"
#include "kit_src/core/optimizers/rule_by_name.h"
#include "kit_src/core/optimizers/sum_duplicates.h"
#include "kit_src/tf/kernels/core_bridge.h"
#include "kit_src/tf/kernels/static_apply_functor.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"

namespace sok {
namespace tf = ::tensorflow;

namespace functor {

template <>
void StaticApply<CpuDevice>::operator()(tf::OpKernelContext* ctx, const StaticApplyArgs& args,
                                        std::function<void(tf::Status)> finish) {
  for (int64_t i = 0; i < args.n; ++i) {  // before anything is written
    if (args.indices[i] < 0 || args.indices[i] >= args.rows) {
      finish(ToTfStatus(IdOutOfRange(args.table_name, args.indices[i], args.rows)));
      return;
    }
  }
  const int64_t dim = args.dim;
  const int num_slots = static_cast<int>(args.slots.size());
  for (int64_t i = 0; args.grad_rows && i < args.n; ++i) {
    if (args.grad_rows[i] < 0 || args.grad_rows[i] >= args.grad_source_rows) {
      finish(tf::errors::InvalidArgument("gradient of table ", args.table_name, ": grad_rows[",
                                         i, "] = ", args.grad_rows[i], " is outside the ",
                                         args.grad_source_rows, " rows of grads"));
      return;
    }
  }
  std::vector<int64_t> unique_rows;
  std::vector<float> summed;
  SumDuplicates(args.indices, GradientUses{args.grads, args.grad_rows, args.grad_scales},
                args.n, dim, &unique_rows, &summed);
  finish(ToTfStatus(VisitRule(args.rule, args.hyper, args.hyper_count, args.nesterov,
                              [&](const auto& rule) {
    CpuParallelFor(ctx)(unique_rows.size(), dim * 16, [&](int64_t begin, int64_t end) {
      // The rule reads a row's state packed slot after slot: gathered here, written back.
      std::vector<float> state(num_slots * dim);
      for (int64_t i = begin; i < end; ++i) {
        const int64_t row = unique_rows[i];
        for (int s = 0; s < num_slots; ++s) {
          std::memcpy(state.data() + s * dim, args.slots[s] + row * dim, dim * sizeof(float));
        }
        ApplyRule(args.table + row * dim, state.data(), summed.data() + i * dim, dim, rule);
        for (int s = 0; s < num_slots; ++s) {
          std::memcpy(args.slots[s] + row * dim, state.data() + s * dim, dim * sizeof(float));
        }
      }
    });
  })));
}

template <>
tf::Status StaticApply<CpuDevice>::Copy(tf::OpKernelContext*, void* dst, const void* src,
                                        int64_t bytes) {
  std::memcpy(dst, src, bytes);
  return tf::Status();
}

}  // namespace functor

namespace {

// The variables an update writes, locked exclusively in address order (as TF's training ops
// lock theirs, so two updates of the same variables cannot deadlock).
class LockedVariables {
 public:
  tf::Status Lock(tf::OpKernelContext* ctx, int count) {
    vars_.resize(count);
    for (int i = 0; i < count; ++i) {
      TF_RETURN_IF_ERROR(tf::LookupResource(ctx, tf::HandleFromInput(ctx, i), &vars_[i]));
    }
    std::vector<tf::mutex*> order;
    for (const auto& var : vars_) order.push_back(var->mu());
    std::sort(order.begin(), order.end());
    order.erase(std::unique(order.begin(), order.end()), order.end());
    for (tf::mutex* mu : order) locks_.push_back(std::make_unique<tf::mutex_lock>(*mu));
    return tf::Status();
  }

  // The variable's tensor, copied first if a reader still holds its buffer (copy on write:
  // the reader keeps the value it read).
  template <typename Device>
  tf::Status Writable(tf::OpKernelContext* ctx, int i, tf::Tensor** tensor) {
    tf::Tensor* current = vars_[i]->tensor();
    if (!current->RefCountIsOne()) {
      tf::Tensor copy;
      TF_RETURN_IF_ERROR(ctx->allocate_temp(current->dtype(), current->shape(), &copy));
      TF_RETURN_IF_ERROR(functor::StaticApply<Device>().Copy(ctx, copy.data(), current->data(),
                                                             current->TotalBytes()));
      *current = copy;
    }
    *tensor = current;
    return tf::Status();
  }

 private:
  std::vector<tf::core::RefCountPtr<tf::Var>> vars_;
  std::vector<std::unique_ptr<tf::mutex_lock>> locks_;
};

}  // namespace

// Asynchronous so that the GPU functor can report an out-of-range id once its stream has
// passed the check; the CPU functor finishes inline.
template <typename Device>
class StaticApplyOp : public tf::AsyncOpKernel {
 public:
  explicit StaticApplyOp(tf::OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &num_slots_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rule", &rule_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("nesterov", &nesterov_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_name", &table_name_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("validate", &validate_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("M", &gathered_));
    OP_REQUIRES(ctx, gathered_ <= 1,
                tf::errors::InvalidArgument("grad_rows: at most one list, got ", gathered_));
    OP_REQUIRES(ctx, num_slots_ <= 3,
                tf::errors::InvalidArgument("at most 3 optimizer slots, got ", num_slots_));
  }

  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    const tf::Tensor& indices = ctx->input(num_slots_ + 1);
    const tf::Tensor& grads = ctx->input(num_slots_ + 2);
    const tf::Tensor& hyper = ctx->input(num_slots_ + 3 + 2 * gathered_);
    OP_REQUIRES_ASYNC(ctx, RuleHyperCount(rule_) == hyper.NumElements(),
                      tf::errors::InvalidArgument(rule_, " takes ", RuleHyperCount(rule_),
                                                  " hyper-parameters, got ", hyper.NumElements()),
                      done);
    LockedVariables locked;
    OP_REQUIRES_OK_ASYNC(ctx, locked.Lock(ctx, num_slots_ + 1), done);
    std::vector<tf::Tensor*> tensors(num_slots_ + 1);  // the table, then its slots
    for (int i = 0; i <= num_slots_; ++i) {
      OP_REQUIRES_OK_ASYNC(ctx, locked.Writable<Device>(ctx, i, &tensors[i]), done);
    }
    const tf::Tensor& table = *tensors[0];
    OP_REQUIRES_ASYNC(ctx, table.dtype() == tf::DT_FLOAT && table.dims() == 2,
                      tf::errors::InvalidArgument("table ", table_name_,
                                                  " must be a float32 matrix, got ",
                                                  tf::DataTypeString(table.dtype()), " ",
                                                  table.shape().DebugString()),
                      done);
    for (int i = 1; i <= num_slots_; ++i) {
      OP_REQUIRES_ASYNC(ctx, tensors[i]->dtype() == tf::DT_FLOAT &&
                                 tensors[i]->shape() == table.shape(),
                        tf::errors::InvalidArgument("optimizer slot ", i - 1, " of table ",
                                                    table_name_, " must be float32 ",
                                                    table.shape().DebugString(), ", got ",
                                                    tensors[i]->shape().DebugString()),
                        done);
    }
    StaticApplyArgs args;
    args.rule = rule_;
    args.hyper = hyper.flat<float>().data();
    args.hyper_count = hyper.NumElements();
    args.nesterov = nesterov_;
    args.table_name = table_name_;
    args.table = tensors[0]->flat<float>().data();
    for (int i = 1; i <= num_slots_; ++i) args.slots.push_back(tensors[i]->flat<float>().data());
    args.rows = table.dim_size(0);
    args.dim = table.dim_size(1);
    args.n = indices.NumElements();
    OP_REQUIRES_ASYNC(ctx, indices.dims() == 1 && grads.dims() == 2 &&
                               (gathered_ || grads.dim_size(0) == args.n) &&
                               grads.dim_size(1) == args.dim,
                      tf::errors::InvalidArgument("gradient of table ", table_name_,
                                                  ": indices [n] and values [",
                                                  gathered_ ? "rows" : "n", ", ", args.dim,
                                                  "] expected, got ", indices.shape().DebugString(),
                                                  " and ", grads.shape().DebugString()),
                      done);
    args.indices = indices.flat<int64_t>().data();
    args.grads = grads.flat<float>().data();
    if (gathered_) {
      const tf::Tensor& rows = ctx->input(num_slots_ + 3);
      const tf::Tensor& scales = ctx->input(num_slots_ + 4);
      OP_REQUIRES_ASYNC(ctx, rows.NumElements() == args.n && scales.NumElements() == args.n,
                        tf::errors::InvalidArgument(
                            "gradient of table ", table_name_, ": grad_rows and grad_scales need ",
                            args.n, " values (one an index), got ", rows.NumElements(), " and ",
                            scales.NumElements()),
                        done);
      args.grad_rows = rows.flat<int64_t>().data();
      args.grad_scales = scales.flat<float>().data();
      args.grad_source_rows = grads.dim_size(0);
    }
    args.validate = validate_;
    // The rule must find its state in the slots given (it would read past them otherwise).
    // The CPU reads the values; on the GPU they stay in device memory (no step waits for
    // them): the state the rule's type needs with any values is checked here, and the
    // kernels write nothing for values that need more (a momentum without its slot).
    bool fits = true;
    const auto fit = [&](const auto& rule) {
      fits = RuleStateFloats(rule, args.dim) <= num_slots_ * args.dim;
    };
    OP_REQUIRES_OK_ASYNC(ctx, ToTfStatus(std::is_same<Device, CpuDevice>::value
                                             ? VisitRule(rule_, args.hyper, args.hyper_count,
                                                         nesterov_, fit)
                                             : VisitRuleType(rule_, args.hyper_count, fit)),
                         done);
    OP_REQUIRES_ASYNC(ctx, fits,
                      tf::errors::InvalidArgument(rule_, " of table ", table_name_,
                                                  " needs more optimizer state than its ",
                                                  num_slots_, " slots hold"),
                      done);
    functor::StaticApply<Device>()(ctx, args, [ctx, done](tf::Status status) {
      ctx->SetStatus(status);
      done();
    });
  }

 private:
  int num_slots_ = 0;
  std::string rule_;
  bool nesterov_ = false;
  std::string table_name_;
  bool validate_ = true;
  int gathered_ = 0;  // M: grads read through grad_rows / grad_scales
};

REGISTER_KERNEL_BUILDER(Name("Sok>StaticApply").Device(tf::DEVICE_CPU),
                        StaticApplyOp<CpuDevice>);
#if GOOGLE_CUDA
REGISTER_KERNEL_BUILDER(Name("Sok>StaticApply").Device(tf::DEVICE_GPU),
                        StaticApplyOp<GpuDevice>);
#endif

}  // namespace sok
