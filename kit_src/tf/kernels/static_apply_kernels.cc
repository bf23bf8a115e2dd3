// Sok>StaticApply: lazy optimizer updates of a static table (a resource variable) and its
// optimizer slot variables, on the touched rows only. One OpKernel for both devices; the CPU
// functor is here, the GPU one in static_apply_kernels_gpu.cu.cc.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "kit_src/core/optimizers/rule_by_name.h"
#include "kit_src/tf/kernels/register_kernels.h"
#include "kit_src/tf/kernels/core_bridge.h"
#include "kit_src/tf/kernels/static_apply_functor.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"

namespace sok {
namespace tf = ::tensorflow;

namespace functor {

template <>
void StaticApply<CpuDevice>::operator()(tf::OpKernelContext* ctx, const StaticApplyGroup& args,
                                        std::function<void(tf::Status)> finish) {
  finish(ToTfStatus(StaticApplyOnHost(args, CpuParallelFor(ctx))));
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

  // The first variable that is also an earlier input, or -1: an update writes each once.
  int FirstRepeated() const {
    for (size_t i = 1; i < vars_.size(); ++i) {
      for (size_t j = 0; j < i; ++j) {
        if (vars_[i].get() == vars_[j].get()) return static_cast<int>(i);
      }
    }
    return -1;
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
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_tables", &num_tables_));
    int slot_inputs = 0;
    OP_REQUIRES_OK(ctx, ReadAttrs(ctx, "N", &slot_inputs, "rule", &rule_, "nesterov", &nesterov_,
                                  "table_names", &table_names_, "validate", &validate_,
                                  "M", &gathered_));
    OP_REQUIRES(ctx, gathered_ == 0 || gathered_ == num_tables_,
                tf::errors::InvalidArgument("grad_rows: none or one a table (", num_tables_,
                                            "), got ", gathered_));
    OP_REQUIRES(ctx, slot_inputs % num_tables_ == 0,
                tf::errors::InvalidArgument(slot_inputs, " slot variables for ", num_tables_,
                                            " tables: the same number a table expected"));
    num_slots_ = slot_inputs / num_tables_;
    OP_REQUIRES(ctx, num_slots_ <= 3,
                tf::errors::InvalidArgument("at most 3 optimizer slots, got ", num_slots_));
    OP_REQUIRES(ctx, table_names_.empty() ||
                         static_cast<int>(table_names_.size()) == num_tables_,
                tf::errors::InvalidArgument(table_names_.size(), " table names for ",
                                            num_tables_, " tables"));
    table_names_.resize(num_tables_);
  }

  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    const int resources = num_tables_ * (1 + num_slots_);
    const tf::Tensor& hyper = ctx->input(resources + 2 * num_tables_ + 2 * gathered_);
    OP_REQUIRES_ASYNC(ctx, RuleHyperCount(rule_) == hyper.NumElements(),
                      tf::errors::InvalidArgument(rule_, " takes ", RuleHyperCount(rule_),
                                                  " hyper-parameters, got ", hyper.NumElements()),
                      done);
    LockedVariables locked;
    OP_REQUIRES_OK_ASYNC(ctx, locked.Lock(ctx, resources), done);
    const int repeated = locked.FirstRepeated();
    OP_REQUIRES_ASYNC(ctx, repeated < 0, RepeatedVariable(repeated), done);
    StaticApplyGroup args;
    args.rule = rule_;
    args.hyper = hyper.flat<float>().data();
    args.hyper_count = hyper.NumElements();
    args.nesterov = nesterov_;
    args.validate = validate_;
    args.tables.resize(num_tables_);
    for (int t = 0; t < num_tables_; ++t) {
      OP_REQUIRES_OK_ASYNC(ctx, TableArgs(ctx, &locked, t, &args), done);
    }
    // The rule must find its state in the slots given (it would read past them otherwise).
    // The CPU reads the values; on the GPU they stay in device memory (no step waits for
    // them): the state the rule's type needs with any values is checked here, and the
    // kernels write nothing for values that need more (a momentum without its slot).
    OP_REQUIRES_OK_ASYNC(ctx, ToTfStatus(CheckRuleFitsSlots(
                                  args, num_slots_, std::is_same<Device, CpuDevice>::value)),
                         done);
    functor::StaticApply<Device>()(ctx, args, [ctx, done](tf::Status status) {
      ctx->SetStatus(status);
      done();
    });
  }

 private:
  // The error for resource input `input` repeating an earlier one.
  tf::Status RepeatedVariable(int input) const {
    const bool is_table = input < num_tables_;
    const int table = is_table ? input : (input - num_tables_) / num_slots_;
    const std::string name =
        table_names_[table].empty() ? std::to_string(table) : table_names_[table];
    return tf::errors::InvalidArgument(
        is_table ? "" : "optimizer slot " + std::to_string((input - num_tables_) % num_slots_) +
                            " of ",
        "table ", name, " is given twice in one update (each table and slot must appear once)");
  }

  // Table t's variables made writable and its inputs checked into args.tables[t]; every
  // table has the first one's width.
  tf::Status TableArgs(tf::OpKernelContext* ctx, LockedVariables* locked, int t,
                       StaticApplyGroup* args) {
    const std::string& name = table_names_[t];
    tf::Tensor* table = nullptr;
    TF_RETURN_IF_ERROR(locked->Writable<Device>(ctx, t, &table));
    if (table->dtype() != tf::DT_FLOAT || table->dims() != 2) {
      return tf::errors::InvalidArgument("table ", name, " must be a float32 matrix, got ",
                                         tf::DataTypeString(table->dtype()), " ",
                                         table->shape().DebugString());
    }
    if (t == 0) args->dim = table->dim_size(1);
    if (table->dim_size(1) != args->dim) {
      return tf::errors::InvalidArgument("table ", name, " is ", table->dim_size(1),
                                         " wide, the update's first table ", args->dim);
    }
    StaticApplyTable& out = args->tables[t];
    out.name = name;
    out.table = table->flat<float>().data();
    out.rows = table->dim_size(0);
    for (int s = 0; s < num_slots_; ++s) {
      tf::Tensor* slot = nullptr;
      TF_RETURN_IF_ERROR(locked->Writable<Device>(ctx, num_tables_ + t * num_slots_ + s, &slot));
      if (slot->dtype() != tf::DT_FLOAT || slot->shape() != table->shape()) {
        return tf::errors::InvalidArgument("optimizer slot ", s, " of table ", name,
                                           " must be float32 ", table->shape().DebugString(),
                                           ", got ", slot->shape().DebugString());
      }
      out.slots.push_back(slot->flat<float>().data());
    }
    const int first_input = num_tables_ * (1 + num_slots_);
    const tf::Tensor& indices = ctx->input(first_input + t);
    const tf::Tensor& grads = ctx->input(first_input + num_tables_ + t);
    out.n = indices.NumElements();
    if (indices.dims() != 1 || grads.dims() != 2 ||
        (!gathered_ && grads.dim_size(0) != out.n) || grads.dim_size(1) != args->dim) {
      return tf::errors::InvalidArgument("gradient of table ", name,
                                         ": indices [n] and values [", gathered_ ? "rows" : "n",
                                         ", ", args->dim, "] expected, got ",
                                         indices.shape().DebugString(), " and ",
                                         grads.shape().DebugString());
    }
    out.indices = indices.flat<int64_t>().data();
    out.grads = grads.flat<float>().data();
    if (gathered_) {
      const tf::Tensor& rows = ctx->input(first_input + 2 * num_tables_ + t);
      const tf::Tensor& scales = ctx->input(first_input + 3 * num_tables_ + t);
      if (rows.NumElements() != out.n || scales.NumElements() != out.n) {
        return tf::errors::InvalidArgument(
            "gradient of table ", name, ": grad_rows and grad_scales need ", out.n,
            " values (one an index), got ", rows.NumElements(), " and ", scales.NumElements());
      }
      out.grad_rows = rows.flat<int64_t>().data();
      out.grad_scales = scales.flat<float>().data();
      out.grad_source_rows = grads.dim_size(0);
    }
    return tf::Status();
  }

  int num_tables_ = 1;
  int num_slots_ = 0;  // a table
  std::string rule_;
  bool nesterov_ = false;
  std::vector<std::string> table_names_;
  bool validate_ = true;
  int gathered_ = 0;  // M: grads read through grad_rows / grad_scales (one a table)
};

SOK_REGISTER_KERNELS("Sok>StaticApply", StaticApplyOp);

// Sok>OptimizerRules: kRuleTable as JSON, for Python to pack `hyper` and name the slots by.
class OptimizerRulesOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    tf::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({}), &out));
    out->scalar<tf::tstring>()() = RuleTableJson();
  }

};

REGISTER_KERNEL_BUILDER(Name("Sok>OptimizerRules").Device(tf::DEVICE_CPU), OptimizerRulesOp);

}  // namespace sok
