// Sok>StaticApply: lazy optimizer updates of a static table (a resource variable) and its
// optimizer slot variables, on the touched rows only.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kit_src/core/embedding/key_partition.h"
#include "kit_src/core/optimizers/rule_by_name.h"
#include "kit_src/core/optimizers/sum_duplicates.h"
#include "kit_src/tf/kernels/core_bridge.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"

namespace sok {
namespace tf = ::tensorflow;

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
  tf::Status Writable(tf::OpKernelContext* ctx, int i, tf::Tensor** tensor) {
    tf::Tensor* current = vars_[i]->tensor();
    if (!current->RefCountIsOne()) {
      tf::Tensor copy;
      TF_RETURN_IF_ERROR(ctx->allocate_temp(current->dtype(), current->shape(), &copy));
      std::memcpy(copy.data(), current->data(), current->TotalBytes());
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

class StaticApplyOp : public tf::OpKernel {
 public:
  explicit StaticApplyOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &num_slots_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rule", &rule_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("nesterov", &nesterov_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_name", &table_name_));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& indices = ctx->input(num_slots_ + 1);
    const tf::Tensor& grads = ctx->input(num_slots_ + 2);
    const tf::Tensor& hyper = ctx->input(num_slots_ + 3);
    OP_REQUIRES(ctx, RuleHyperCount(rule_) == hyper.NumElements(),
                tf::errors::InvalidArgument(rule_, " takes ", RuleHyperCount(rule_),
                                            " hyper-parameters, got ", hyper.NumElements()));
    LockedVariables locked;
    OP_REQUIRES_OK(ctx, locked.Lock(ctx, num_slots_ + 1));
    std::vector<tf::Tensor*> tensors(num_slots_ + 1);  // the table, then its slots
    for (int i = 0; i <= num_slots_; ++i) OP_REQUIRES_OK(ctx, locked.Writable(ctx, i, &tensors[i]));
    const tf::Tensor& table = *tensors[0];
    OP_REQUIRES(ctx, table.dtype() == tf::DT_FLOAT && table.dims() == 2,
                tf::errors::InvalidArgument("table ", table_name_, " must be a float32 matrix, got ",
                                            tf::DataTypeString(table.dtype()), " ",
                                            table.shape().DebugString()));
    for (int i = 1; i <= num_slots_; ++i) {
      OP_REQUIRES(ctx, tensors[i]->dtype() == tf::DT_FLOAT && tensors[i]->shape() == table.shape(),
                  tf::errors::InvalidArgument("optimizer slot ", i - 1, " of table ", table_name_,
                                              " must be float32 ", table.shape().DebugString(),
                                              ", got ", tensors[i]->shape().DebugString()));
    }
    const int64_t rows = table.dim_size(0), dim = table.dim_size(1), n = indices.NumElements();
    OP_REQUIRES(ctx, indices.dims() == 1 && grads.dims() == 2 && grads.dim_size(0) == n &&
                         grads.dim_size(1) == dim,
                tf::errors::InvalidArgument("gradient of table ", table_name_, ": indices [n] and "
                                            "values [n, ", dim, "] expected, got ",
                                            indices.shape().DebugString(), " and ",
                                            grads.shape().DebugString()));
    // The rule must find its state in the slots given (it would read past them otherwise).
    bool fits = true;
    SOK_OP_REQUIRES_OK(ctx, VisitRule(rule_, hyper.flat<float>().data(), hyper.NumElements(),
                                      nesterov_, [&](const auto& rule) {
      fits = RuleStateFloats(rule, dim) <= num_slots_ * dim;
    }));
    OP_REQUIRES(ctx, fits, tf::errors::InvalidArgument(rule_, " of table ", table_name_,
                                                       " needs more optimizer state than its ",
                                                       num_slots_, " slots hold"));
    const int64_t* index = indices.flat<int64_t>().data();
    for (int64_t i = 0; i < n; ++i) {  // before anything is written
      if (index[i] < 0 || index[i] >= rows) {
        SOK_OP_REQUIRES_OK(ctx, IdOutOfRange(table_name_, index[i], rows));
      }
    }
    std::vector<int64_t> unique_rows;
    std::vector<float> summed;
    SumDuplicates(index, grads.flat<float>().data(), n, dim, &unique_rows, &summed);
    float* weights = tensors[0]->flat<float>().data();
    std::vector<float*> slots;
    for (int i = 1; i <= num_slots_; ++i) slots.push_back(tensors[i]->flat<float>().data());
    SOK_OP_REQUIRES_OK(ctx, VisitRule(rule_, hyper.flat<float>().data(), hyper.NumElements(),
                                      nesterov_, [&](const auto& rule) {
      CpuParallelFor(ctx)(unique_rows.size(), dim * 16, [&](int64_t begin, int64_t end) {
        // The rule reads a row's state packed slot after slot: gathered here, written back.
        std::vector<float> state(num_slots_ * dim);
        for (int64_t i = begin; i < end; ++i) {
          const int64_t row = unique_rows[i];
          for (int s = 0; s < num_slots_; ++s) {
            std::memcpy(state.data() + s * dim, slots[s] + row * dim, dim * sizeof(float));
          }
          ApplyRule(weights + row * dim, state.data(), summed.data() + i * dim, dim, rule);
          for (int s = 0; s < num_slots_; ++s) {
            std::memcpy(slots[s] + row * dim, state.data() + s * dim, dim * sizeof(float));
          }
        }
      });
    }));
  }

 private:
  int num_slots_ = 0;
  std::string rule_;
  bool nesterov_ = false;
  std::string table_name_;
};

REGISTER_KERNEL_BUILDER(Name("Sok>StaticApply").Device(tf::DEVICE_CPU), StaticApplyOp);

}  // namespace sok
