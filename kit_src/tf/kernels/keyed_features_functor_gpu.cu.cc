// GPU functor of Sok>UnpackFeatures (keyed_features_functor.h): kit_src/core/embedding/
// keyed_features_gpu.cu on TensorFlow's stream. The F + 1 feature offsets size the outputs,
// so Bounds waits for them (one small copy to pinned memory).
#if GOOGLE_CUDA
#define EIGEN_USE_GPU  // before any Eigen header: the GPU device
#include <algorithm>
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

// Each group of features is planned and staged compactly in pinned memory by the CPU threads
// and copied while the next group is staged; once all have crossed, two launches widen every
// feature into `values` and `splits`.
template <>
tf::Status StageFeaturesFromHost<GpuDevice>::operator()(
    tf::OpKernelContext* ctx, const tf::Tensor& packed_values, const tf::Tensor& row_splits,
    const std::vector<int64_t>& bounds, int64_t batch, const FeatureLayout& layout,
    tf::Tensor* values, tf::Tensor* splits) {
  auto memory = std::make_shared<GpuCallMemory>();
  const cudaStream_t stream = GpuStream(ctx);
  const int64_t element = tf::DataTypeSize(packed_values.dtype());
  const std::vector<int64_t> groups = FeatureGroups(layout, element, kStagedGroupBytes);
  std::vector<CompactFeatureTarget> targets;
  for (size_t g = 0; g + 1 < groups.size(); ++g) {
    const CompactGroup group = PlanCompactGroupOnHost(ctx, packed_values, row_splits, bounds,
                                                      batch, groups[g], groups[g + 1]);
    char* staged = nullptr;
    char* device = nullptr;
    TF_RETURN_IF_ERROR(memory->Pinned(ctx, group.bytes, &staged));
    TF_RETURN_IF_ERROR(memory->Device(ctx, group.bytes, &device));
    StageCompactGroupOnHost(ctx, packed_values, row_splits, bounds, batch, group, staged);
    if (group.bytes > 0) {
      TF_RETURN_IF_ERROR(CudaToTf(
          cudaMemcpyAsync(device, staged, group.bytes, cudaMemcpyHostToDevice, stream),
          "packed batch upload"));
    }
    for (size_t i = 0; i < group.features.size(); ++i) {
      const int64_t f = group.first + static_cast<int64_t>(i);
      const CompactFeature& feature = group.features[i];
      CompactFeatureTarget target;
      target.staged_values = device + feature.values_at;
      target.staged_splits = device + feature.splits_at;
      target.values = static_cast<char*>(values->data()) + layout.value_start[f] * element;
      target.splits = splits->flat<int64_t>().data() + layout.split_start[f];
      target.count = bounds[f + 1] - bounds[f];
      target.value_coding = static_cast<int32_t>(feature.values);
      target.split_coding = static_cast<int32_t>(feature.splits);
      targets.push_back(target);
    }
  }
  for (size_t first = 0; first < targets.size(); first += kFeaturesPerLaunch) {
    CompactFeatureTargets launch;
    launch.count = static_cast<int>(std::min<size_t>(kFeaturesPerLaunch, targets.size() - first));
    std::copy(targets.begin() + first, targets.begin() + first + launch.count, launch.feature);
    TF_RETURN_IF_ERROR(
        CudaToTf(ExpandCompactFeaturesGpu(launch, batch, element, stream), "packed batch widen"));
  }
  return ReleaseAfterStream(ctx, std::move(memory));  // the staged buffers outlive their use
}

}  // namespace functor
}  // namespace sok
#endif  // GOOGLE_CUDA
