// Kernels of the GPU exchange (ops in collective_ops.cc) over kit_src/core/comm: the
// all-to-all of a lookup's keys and rows between workers' GPUs through NCCL, on TensorFlow's
// stream. Sok>AllToAll never synchronises; Sok>AllToAllCounts, whose output the peers decide,
// is an AsyncOpKernel that finishes once the stream has passed the exchange.
#include <memory>
#include <string>
#include <vector>

#include "kit_src/core/comm/nccl_exchange.h"
#include "kit_src/tf/kernels/core_bridge.h"
#include "kit_src/tf/kernels/gpu_op_util.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace sok {

namespace {

tf::Status RequireExchange(comm::NcclExchange** exchange) {
  *exchange = comm::NcclExchange::Get();
  if (*exchange == nullptr) {
    return tf::errors::FailedPrecondition(
        "no GPU exchange in this process: sok.init() makes it when Horovod runs several "
        "workers with GPUs");
  }
  return tf::Status();
}

// A splits input: one non-negative count per worker.
tf::Status ReadSplits(const tf::Tensor& splits, const char* name, int num_workers,
                      std::vector<int64_t>* counts) {
  if (splits.dims() != 1 || splits.NumElements() != num_workers) {
    return tf::errors::InvalidArgument(name, " must hold one count per worker (", num_workers,
                                       "), got shape ", splits.shape().DebugString());
  }
  const auto values = splits.flat<int32_t>();
  counts->resize(num_workers);
  for (int w = 0; w < num_workers; ++w) {
    if (values(w) < 0) {
      return tf::errors::InvalidArgument(name, "[", w, "] is ", values(w),
                                         "; counts must be >= 0");
    }
    (*counts)[w] = values(w);
  }
  return tf::Status();
}

// The CUDA device holding `pointer` (TensorFlow's GPU ids need not be CUDA's).
tf::Status DeviceOf(const void* pointer, int* device) {
  cudaPointerAttributes attributes;
  TF_RETURN_IF_ERROR(CudaToTf(cudaPointerGetAttributes(&attributes, pointer), "device query"));
  *device = attributes.device;
  return tf::Status();
}

}  // namespace

class NcclUniqueIdOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    tf::Tensor* id = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({comm::kNcclUniqueIdBytes}),
                                             &id));
    SOK_OP_REQUIRES_OK(ctx, comm::NcclCreateUniqueId(id->flat<uint8_t>().data()));
  }
};
REGISTER_KERNEL_BUILDER(Name("Sok>NcclUniqueId").Device(tf::DEVICE_CPU), NcclUniqueIdOp);

class NcclInitOp : public tf::OpKernel {
 public:
  explicit NcclInitOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadAttrs(ctx, "rank", &rank_, "num_workers", &num_workers_));
  }
  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& id = ctx->input(0);
    OP_REQUIRES(ctx, id.NumElements() == comm::kNcclUniqueIdBytes,
                tf::errors::InvalidArgument("unique_id must hold ", comm::kNcclUniqueIdBytes,
                                            " bytes, got ", id.NumElements()));
    tf::Tensor probe;  // a byte of this op's GPU tells which CUDA device that is
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(tf::DT_INT8, tf::TensorShape({1}), &probe));
    int device = 0;
    OP_REQUIRES_OK(ctx, DeviceOf(probe.flat<int8_t>().data(), &device));
    // Work queued by earlier ops must not overlap NCCL's set-up on the same device.
    OP_REQUIRES_OK(ctx, CudaToTf(cudaStreamSynchronize(GpuStream(ctx)), "NCCL init"));
    SOK_OP_REQUIRES_OK(ctx, comm::NcclExchange::Init(id.flat<uint8_t>().data(), rank_,
                                                    num_workers_, device));
  }

 private:
  int rank_ = 0, num_workers_ = 1;
};
REGISTER_KERNEL_BUILDER(Name("Sok>NcclInit").Device(tf::DEVICE_GPU).HostMemory("unique_id"),
                        NcclInitOp);

class AllToAllCountsOp : public tf::AsyncOpKernel {
 public:
  using AsyncOpKernel::AsyncOpKernel;
  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    comm::NcclExchange* exchange = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, RequireExchange(&exchange), done);
    const int workers = exchange->num_workers();
    std::vector<int64_t> send;
    OP_REQUIRES_OK_ASYNC(ctx, ReadSplits(ctx->input(0), "send_splits", workers, &send), done);
    tf::Tensor* recv = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, tf::TensorShape({workers}), &recv), done);
    auto memory = std::make_shared<GpuCallMemory>(ctx);
    int64_t *send_device = nullptr, *recv_device = nullptr, *recv_host = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ToTfStatus(memory->Upload(send, &send_device)), done);
    OP_REQUIRES_OK_ASYNC(ctx, ToTfStatus(memory->Device(workers, &recv_device)), done);
    OP_REQUIRES_OK_ASYNC(ctx, ToTfStatus(memory->Pinned(workers, &recv_host)), done);
    const std::vector<int64_t> count_bytes(workers, sizeof(int64_t));
    OP_REQUIRES_OK_ASYNC(ctx, ToTfStatus(exchange->AllToAll(send_device, count_bytes.data(),
                                                            recv_device, count_bytes.data(),
                                                            GpuStream(ctx))),
                         done);
    OP_REQUIRES_OK_ASYNC(ctx, CudaToTf(cudaMemcpyAsync(recv_host, recv_device,
                                                       workers * sizeof(int64_t),
                                                       cudaMemcpyDeviceToHost, GpuStream(ctx)),
                                       "counts copy"),
                         done);
    FinishAfterStream(ctx, done, memory, [recv, recv_host, workers]() {
      auto out = recv->flat<int32_t>();
      for (int w = 0; w < workers; ++w) out(w) = static_cast<int32_t>(recv_host[w]);
      return tf::Status();
    });
  }
};
REGISTER_KERNEL_BUILDER(Name("Sok>AllToAllCounts")
                            .Device(tf::DEVICE_GPU)
                            .HostMemory("send_splits")
                            .HostMemory("recv_splits"),
                        AllToAllCountsOp);

class AllToAllOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    comm::NcclExchange* exchange = nullptr;
    OP_REQUIRES_OK(ctx, RequireExchange(&exchange));
    const int workers = exchange->num_workers();
    const tf::Tensor& input = ctx->input(0);
    OP_REQUIRES(ctx, input.dims() >= 1,
                tf::errors::InvalidArgument("input must have rank >= 1, got a scalar"));
    std::vector<int64_t> send, recv;
    OP_REQUIRES_OK(ctx, ReadSplits(ctx->input(1), "send_splits", workers, &send));
    OP_REQUIRES_OK(ctx, ReadSplits(ctx->input(2), "recv_splits", workers, &recv));
    int64_t send_rows = 0, recv_rows = 0;
    for (int w = 0; w < workers; ++w) send_rows += send[w], recv_rows += recv[w];
    OP_REQUIRES(ctx, send_rows == input.dim_size(0),
                tf::errors::InvalidArgument("send_splits sum to ", send_rows, " rows but input has ",
                                            input.dim_size(0)));
    tf::TensorShape shape = input.shape();
    shape.set_dim(0, recv_rows);
    tf::Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &output));
    int64_t row_bytes = tf::DataTypeSize(input.dtype());
    for (int d = 1; d < input.dims(); ++d) row_bytes *= input.dim_size(d);
    for (int w = 0; w < workers; ++w) send[w] *= row_bytes, recv[w] *= row_bytes;
    SOK_OP_REQUIRES_OK(ctx, exchange->AllToAll(input.tensor_data().data(), send.data(),
                                               const_cast<char*>(output->tensor_data().data()),
                                               recv.data(), GpuStream(ctx)));
  }
};
REGISTER_KERNEL_BUILDER(Name("Sok>AllToAll")
                            .Device(tf::DEVICE_GPU)
                            .HostMemory("send_splits")
                            .HostMemory("recv_splits")
                            .TypeConstraint("T", {tf::DT_FLOAT, tf::DT_HALF, tf::DT_BFLOAT16,
                                                  tf::DT_DOUBLE, tf::DT_INT64}),
                        AllToAllOp);

}  // namespace sok

