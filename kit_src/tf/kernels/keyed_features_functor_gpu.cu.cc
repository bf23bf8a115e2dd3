// GPU functor of Sok>UnpackFeatures (keyed_features_functor.h): kit_src/core/embedding/
// keyed_features_gpu.cu on TensorFlow's stream. The F + 1 feature offsets size the outputs,
// so Bounds waits for them (one small copy to pinned memory).
#if GOOGLE_CUDA
#define EIGEN_USE_GPU  // before any Eigen header: the GPU device
#include <memory>

#include "kit_src/core/embedding/keyed_features_gpu.cuh"
#include "kit_src/tf/kernels/gpu_op_util.h"
#include "kit_src/tf/kernels/keyed_features_functor.h"

namespace sok {
namespace functor {
namespace tf = ::tensorflow;

// Bytes of a packed batch staged in pinned memory before their copy to the GPU starts.
constexpr int64_t kStagedGroupBytes = int64_t{4} << 20;

template <>
tf::Status KeyedFeatures<GpuDevice>::Bounds(tf::OpKernelContext* ctx,
                                            const tf::Tensor& row_splits, int64_t batch,
                                            int64_t num_features, std::vector<int64_t>* bounds) {
  GpuCallMemory memory;
  int64_t* device = nullptr;
  int64_t* host = nullptr;
  TF_RETURN_IF_ERROR(memory.Device(ctx, num_features + 1, &device));
  TF_RETURN_IF_ERROR(memory.Pinned(ctx, num_features + 1, &host));
  const cudaStream_t stream = GpuStream(ctx);
  TF_RETURN_IF_ERROR(CudaToTf(
      row_splits.dtype() == tf::DT_INT32
          ? FeatureBoundsGpu(row_splits.flat<int32_t>().data(), batch, num_features, device,
                             stream)
          : FeatureBoundsGpu(row_splits.flat<int64_t>().data(), batch, num_features, device,
                             stream),
      "feature bounds"));
  TF_RETURN_IF_ERROR(CudaToTf(cudaMemcpyAsync(host, device, (num_features + 1) * sizeof(int64_t),
                                              cudaMemcpyDeviceToHost, stream),
                              "feature bounds copy"));
  TF_RETURN_IF_ERROR(CudaToTf(cudaStreamSynchronize(stream), "feature bounds wait"));
  bounds->assign(host, host + num_features + 1);
  return tf::Status();
}

template <>
tf::Status KeyedFeatures<GpuDevice>::Rebase(tf::OpKernelContext* ctx,
                                            const tf::Tensor& row_splits, int64_t batch,
                                            const std::vector<tf::Tensor*>& outputs) {
  const int64_t features = static_cast<int64_t>(outputs.size());
  for (int64_t first = 0; first < features; first += kFeaturesPerLaunch) {
    FeatureRowSplitsTargets targets;
    targets.first_feature = first;
    targets.count = static_cast<int>(std::min<int64_t>(kFeaturesPerLaunch, features - first));
    for (int i = 0; i < targets.count; ++i) {
      targets.out[i] = outputs[first + i]->flat<int64_t>().data();
    }
    TF_RETURN_IF_ERROR(CudaToTf(
        row_splits.dtype() == tf::DT_INT32
            ? RebaseFeatureRowSplitsGpu(row_splits.flat<int32_t>().data(), batch, targets,
                                        GpuStream(ctx))
            : RebaseFeatureRowSplitsGpu(row_splits.flat<int64_t>().data(), batch, targets,
                                        GpuStream(ctx)),
        "feature row splits"));
  }
  return tf::Status();
}

template <>
tf::Status KeyedFeatures<GpuDevice>::Copy(tf::OpKernelContext* ctx, void* dst, const void* src,
                                          int64_t bytes) {
  if (bytes == 0) return tf::Status();
  return CudaToTf(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, GpuStream(ctx)),
                  "feature values copy");
}

template <>
tf::Status StageFeaturesFromHost<GpuDevice>::operator()(
    tf::OpKernelContext* ctx, const tf::Tensor& packed_values, const tf::Tensor& row_splits,
    const std::vector<int64_t>& bounds, int64_t batch, const FeatureLayout& layout,
    tf::Tensor* values, tf::Tensor* splits) {
  auto memory = std::make_shared<GpuCallMemory>();
  const int64_t value_bytes = values->TotalBytes(), split_bytes = splits->TotalBytes();
  char* staged_values = nullptr;
  int64_t* staged_splits = nullptr;
  TF_RETURN_IF_ERROR(memory->Pinned(ctx, value_bytes, &staged_values));
  TF_RETURN_IF_ERROR(memory->Pinned(ctx, layout.split_total, &staged_splits));
  // Staged and copied a group of features at a time: each group's copy runs while the CPU
  // threads stage the next.
  const cudaStream_t stream = GpuStream(ctx);
  const int64_t element = tf::DataTypeSize(packed_values.dtype());
  const std::vector<int64_t> groups = FeatureGroups(layout, element, kStagedGroupBytes);
  const int64_t features = static_cast<int64_t>(layout.value_start.size());
  const auto value_at = [&](int64_t f) {
    return f < features ? layout.value_start[f] : layout.value_total;
  };
  const auto split_at = [&](int64_t f) {
    return f < features ? layout.split_start[f] : layout.split_total;
  };
  for (size_t g = 0; g + 1 < groups.size(); ++g) {
    const int64_t first = groups[g], end = groups[g + 1];
    TF_RETURN_IF_ERROR(StageFeaturesOnHost(ctx, packed_values, row_splits, bounds, batch, layout,
                                           staged_values, staged_splits, first, end));
    const int64_t value_offset = value_at(first) * element;
    const int64_t value_bytes_group =
        std::min(value_at(end) * element, value_bytes) - value_offset;
    if (value_bytes_group > 0) {
      TF_RETURN_IF_ERROR(CudaToTf(
          cudaMemcpyAsync(static_cast<char*>(values->data()) + value_offset,
                          staged_values + value_offset, value_bytes_group,
                          cudaMemcpyHostToDevice, stream),
          "feature values upload"));
    }
    const int64_t split_offset = split_at(first) * 8;
    TF_RETURN_IF_ERROR(CudaToTf(
        cudaMemcpyAsync(static_cast<char*>(splits->data()) + split_offset,
                        reinterpret_cast<char*>(staged_splits) + split_offset,
                        std::min(split_at(end) * 8, split_bytes) - split_offset,
                        cudaMemcpyHostToDevice, stream),
        "feature row splits upload"));
  }
  return ReleaseAfterStream(ctx, std::move(memory));  // the pinned buffers outlive the copies
}

}  // namespace functor
}  // namespace sok
#endif  // GOOGLE_CUDA
