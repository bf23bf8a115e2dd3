// GPU kernel of Sok>StaticApply (the CPU one is in static_apply_kernels.cc): the same checks
// and messages; the update is kit_src/core/optimizers/sparse_apply.cu on TensorFlow's stream,
// with the Keras slot variables as the rule's state sections. Asynchronous: an id outside the
// table is found on the device, nothing is written, and the op fails once the stream has
// passed (no host thread waits).
#if GOOGLE_CUDA
#define EIGEN_USE_GPU  // before any Eigen header: the GPU device
#include <algorithm>
#include <memory>
#include <vector>

#include "kit_src/core/embedding/key_partition.h"
#include "kit_src/core/optimizers/rule_by_name.h"
#include "kit_src/core/optimizers/sparse_apply.cuh"
#include "kit_src/tf/kernels/core_bridge.h"
#include "kit_src/tf/kernels/gpu_op_util.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"

namespace sok {
namespace tf = ::tensorflow;

class StaticApplyGpuOp : public tf::AsyncOpKernel {
 public:
  explicit StaticApplyGpuOp(tf::OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &num_slots_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rule", &rule_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("nesterov", &nesterov_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_name", &table_name_));
    OP_REQUIRES(ctx, num_slots_ <= 3,
                tf::errors::InvalidArgument("at most 3 optimizer slots, got ", num_slots_));
  }

  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    const tf::Tensor& indices = ctx->input(num_slots_ + 1);
    const tf::Tensor& grads = ctx->input(num_slots_ + 2);
    const tf::Tensor& hyper = ctx->input(num_slots_ + 3);
    OP_REQUIRES_ASYNC(ctx, RuleHyperCount(rule_) == hyper.NumElements(),
                      tf::errors::InvalidArgument(rule_, " takes ", RuleHyperCount(rule_),
                                                  " hyper-parameters, got ", hyper.NumElements()),
                      done);
    // The table and its slots, locked exclusively in address order (as TF's training ops).
    std::vector<tf::core::RefCountPtr<tf::Var>> vars(num_slots_ + 1);
    for (int i = 0; i <= num_slots_; ++i) {
      OP_REQUIRES_OK_ASYNC(ctx, tf::LookupResource(ctx, tf::HandleFromInput(ctx, i), &vars[i]),
                           done);
    }
    std::vector<tf::mutex*> order;
    for (const auto& var : vars) order.push_back(var->mu());
    std::sort(order.begin(), order.end());
    order.erase(std::unique(order.begin(), order.end()), order.end());
    std::vector<std::unique_ptr<tf::mutex_lock>> locks;
    for (tf::mutex* mu : order) locks.push_back(std::make_unique<tf::mutex_lock>(*mu));
    const cudaStream_t stream = GpuStream(ctx);
    std::vector<tf::Tensor*> tensors(num_slots_ + 1);
    for (int i = 0; i <= num_slots_; ++i) {
      tf::Tensor* current = vars[i]->tensor();
      if (!current->RefCountIsOne()) {  // copy on write: a reader keeps the value it read
        tf::Tensor copy;
        OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_temp(current->dtype(), current->shape(), &copy),
                             done);
        OP_REQUIRES_OK_ASYNC(ctx, CudaToTf(cudaMemcpyAsync(copy.data(), current->data(),
                                                           current->TotalBytes(),
                                                           cudaMemcpyDeviceToDevice, stream),
                                           "copy on write"),
                             done);
        *current = copy;
      }
      tensors[i] = current;
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
    const int64_t rows = table.dim_size(0), dim = table.dim_size(1), n = indices.NumElements();
    OP_REQUIRES_ASYNC(ctx, indices.dims() == 1 && grads.dims() == 2 && grads.dim_size(0) == n &&
                               grads.dim_size(1) == dim,
                      tf::errors::InvalidArgument("gradient of table ", table_name_,
                                                  ": indices [n] and values [n, ", dim,
                                                  "] expected, got ", indices.shape().DebugString(),
                                                  " and ", grads.shape().DebugString()),
                      done);
    SparseApplyTable target;
    target.values = tensors[0]->flat<float>().data();
    target.rows = rows;
    target.dim = dim;
    target.state_dim = num_slots_ * dim;
    target.num_slots = num_slots_;
    for (int s = 0; s < num_slots_; ++s) target.slots[s] = tensors[s + 1]->flat<float>().data();
    // The rule must find its state in the slots given.
    bool fits = true;
    const Status visited = VisitRule(rule_, hyper.flat<float>().data(), hyper.NumElements(),
                                     nesterov_, [&](const auto& h) {
                                       fits = RuleStateFloats(h, dim) <= target.state_dim;
                                     });
    OP_REQUIRES_OK_ASYNC(ctx, ToTfStatus(visited), done);
    OP_REQUIRES_ASYNC(ctx, fits,
                      tf::errors::InvalidArgument(rule_, " of table ", table_name_, " needs more "
                                                  "optimizer state than its ", num_slots_,
                                                  " slots hold"),
                      done);
    auto memory = std::make_shared<GpuCallMemory>();
    GpuCheck check;
    OP_REQUIRES_OK_ASYNC(ctx, check.Init(ctx, memory.get()), done);
    tf::Status allocation;
    const DeviceAllocate allocate = [&](size_t bytes) -> void* {
      char* p = nullptr;
      tf::Status s = memory->Device(ctx, bytes, &p);
      if (!s.ok()) allocation = s;
      return s.ok() ? p : nullptr;
    };
    const cudaError_t status = SparseApplyGpuAsync(
        rule_, hyper.flat<float>().data(), hyper.NumElements(), nesterov_, target,
        SparseGradient{indices.flat<int64_t>().data(), grads.flat<float>().data(), n}, allocate,
        check.device, stream);
    OP_REQUIRES_OK_ASYNC(ctx, allocation, done);
    OP_REQUIRES_OK_ASYNC(ctx, CudaToTf(status, "sparse apply"), done);
    OP_REQUIRES_OK_ASYNC(ctx, check.CopyToHost(ctx), done);
    const LookupCheck* host = check.host;
    const std::string name = table_name_;
    FinishAfterStream(ctx, done, memory, [host, name, rows]() {
      if (host->first_bad == kNoError) return tf::Status();
      return ToTfStatus(IdOutOfRange(name, host->value_a, rows));
    });
  }

 private:
  int num_slots_ = 0;
  std::string rule_;
  bool nesterov_ = false;
  std::string table_name_;
};

REGISTER_KERNEL_BUILDER(Name("Sok>StaticApply").Device(tf::DEVICE_GPU).HostMemory("hyper"),
                        StaticApplyGpuOp);

}  // namespace sok
#endif  // GOOGLE_CUDA
