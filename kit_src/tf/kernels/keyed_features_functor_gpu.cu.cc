// GPU functors of the packed-batch ops (keyed_features_functor.h): kit_src/core/embedding/
// keyed_features_gpu.cu on TensorFlow's stream. For Sok>UnpackFeatures the F + 1 feature
// offsets size the outputs, so Bounds waits for them (one small copy to pinned memory).
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kit_src/core/embedding/combine.h"
#include "kit_src/core/embedding/keyed_features_gpu.cuh"
#include "kit_src/core/embedding/upload_ring.cuh"
#include "kit_src/tf/kernels/core_bridge.h"
#include "kit_src/tf/kernels/gpu_op_util.h"
#include "kit_src/tf/kernels/keyed_features_functor.h"

namespace sok::functor {
// Bytes of a packed batch staged in pinned memory before their copy to the GPU starts.
constexpr int64_t kStagedGroupBytes = int64_t{4} << 20;

template <>
tf::Status KeyedFeatures<GpuDevice>::Bounds(tf::OpKernelContext* ctx,
                                            const tf::Tensor& row_splits, int64_t batch,
                                            int64_t num_features, std::vector<int64_t>* bounds) {
  GpuCallMemory memory(ctx);
  int64_t* device = nullptr;
  int64_t* host = nullptr;
  TF_RETURN_IF_ERROR(ToTfStatus(memory.Device(num_features + 1, &device)));
  TF_RETURN_IF_ERROR(ToTfStatus(memory.Pinned(num_features + 1, &host)));
  const cudaStream_t stream = GpuStream(ctx);
  TF_RETURN_IF_ERROR(CudaToTf(WithRowSplits(row_splits, [&](const auto* splits) {
                                return FeatureBoundsGpu(splits, batch, num_features, device,
                                                        stream);
                              }),
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
    TF_RETURN_IF_ERROR(CudaToTf(WithRowSplits(row_splits, [&](const auto* splits) {
                                  return RebaseFeatureRowSplitsGpu(splits, batch, targets,
                                                                   GpuStream(ctx));
                                }),
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

// Where each feature of a group, its staged bytes at `device`, widens to in `layout`.
static std::vector<CompactFeatureTarget> GroupTargets(const char* device,
                                                      const CompactGroup& group,
                                                      const std::vector<int64_t>& bounds,
                                                      int64_t element, const FeatureLayout& layout,
                                                      tf::Tensor* values, tf::Tensor* splits) {
  std::vector<CompactFeatureTarget> targets;
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
  return targets;
}

// Copies a group staged in pinned memory (`staged`) to the device on TensorFlow's stream and
// adds its features' widening into `layout` to `targets`.
static tf::Status UploadCompactGroup(tf::OpKernelContext* ctx, GpuCallMemory* memory,
                                     const char* staged, const CompactGroup& group,
                                     const std::vector<int64_t>& bounds, int64_t element,
                                     const FeatureLayout& layout, tf::Tensor* values,
                                     tf::Tensor* splits,
                                     std::vector<CompactFeatureTarget>* targets) {
  char* device = nullptr;
  TF_RETURN_IF_ERROR(ToTfStatus(memory->Device(group.bytes, &device)));
  if (group.bytes > 0) {
    TF_RETURN_IF_ERROR(CudaToTf(cudaMemcpyAsync(device, staged, group.bytes,
                                                cudaMemcpyHostToDevice, GpuStream(ctx)),
                                "packed batch upload"));
  }
  const std::vector<CompactFeatureTarget> added =
      GroupTargets(device, group, bounds, element, layout, values, splits);
  targets->insert(targets->end(), added.begin(), added.end());
  return tf::Status();
}

static tf::Status ExpandTargets(tf::OpKernelContext* ctx,
                                const std::vector<CompactFeatureTarget>& targets, int64_t batch,
                                int64_t element) {
  tf::Tensor scratch;
  TF_RETURN_IF_ERROR(ctx->allocate_temp(
      tf::DT_INT64, tf::TensorShape({ExpandCompactScratch(batch)}), &scratch));
  for (size_t first = 0; first < targets.size(); first += kFeaturesPerLaunch) {
    CompactFeatureTargets launch;
    launch.count = static_cast<int>(std::min<size_t>(kFeaturesPerLaunch, targets.size() - first));
    std::copy(targets.begin() + first, targets.begin() + first + launch.count, launch.feature);
    TF_RETURN_IF_ERROR(CudaToTf(ExpandCompactFeaturesGpu(launch, batch, element,
                                                         scratch.flat<int64_t>().data(),
                                                         GpuStream(ctx)),
                                "packed batch widen"));
  }
  return tf::Status();
}

// Each group of features is planned and staged compactly in pinned memory by the CPU threads
// and copied while the next group is staged; once all have crossed, two launches widen every
// feature into `values` and `splits`.
template <>
tf::Status StageFeaturesFromHost<GpuDevice>::operator()(
    tf::OpKernelContext* ctx, const tf::Tensor& packed_values, const tf::Tensor& row_splits,
    const std::vector<int64_t>& bounds, int64_t batch, const FeatureLayout& layout,
    tf::Tensor* values, tf::Tensor* splits) {
  auto memory = std::make_shared<GpuCallMemory>(ctx);
  const int64_t element = tf::DataTypeSize(packed_values.dtype());
  const std::vector<int64_t> groups = FeatureGroups(layout, element, kStagedGroupBytes);
  std::vector<CompactFeatureTarget> targets;
  for (size_t g = 0; g + 1 < groups.size(); ++g) {
    const CompactGroup group = PlanCompactGroupOnHost(ctx, packed_values, row_splits, bounds,
                                                      batch, groups[g], groups[g + 1],
                                                      /*id_ranges=*/false);
    char* staged = nullptr;
    TF_RETURN_IF_ERROR(ToTfStatus(memory->Pinned(group.bytes, &staged)));
    StageCompactGroupOnHost(ctx, packed_values, row_splits, bounds, batch, group, staged);
    TF_RETURN_IF_ERROR(UploadCompactGroup(ctx, memory.get(), staged, group, bounds, element,
                                          layout, values, splits, &targets));
  }
  TF_RETURN_IF_ERROR(ExpandTargets(ctx, targets, batch, element));
  return ReleaseAfterStream(ctx, std::move(memory));  // the staged buffers outlive their use
}

static bool InPinnedMemory(const void* host) {
  cudaPointerAttributes attributes;
  if (cudaPointerGetAttributes(&attributes, host) != cudaSuccess) {
    cudaGetLastError();  // pageable memory on older drivers: not an error to keep
    return false;
  }
  return attributes.type == cudaMemoryTypeHost;
}

// The staged bytes cross as they are where the input pipeline left them in pinned memory
// (Sok>StageFeatures asks for it), else through a pinned copy; the input is held until the
// stream has read it. The copy runs on the upload ring's stream: TensorFlow's stream waits for
// it only where the widening starts.
template <>
tf::Status ExpandStagedFeatures<GpuDevice>::operator()(
    tf::OpKernelContext* ctx, const tf::Tensor& staged, const CompactGroup& group,
    const std::vector<int64_t>& bounds, int64_t batch, int64_t element_bytes,
    const FeatureLayout& layout, tf::Tensor* values, tf::Tensor* splits) {
  std::call_once(made, [this, ctx]() {
    uploads = std::make_shared<UploadRing>(
        std::make_unique<TfGpuMemory>(ctx->device()->GetAllocator({})));
  });
  auto memory = std::make_shared<GpuCallMemory>(ctx);
  const char* host = static_cast<const char*>(staged.data());
  if (group.bytes > 0 && !InPinnedMemory(host)) {
    char* pinned = nullptr;
    TF_RETURN_IF_ERROR(ToTfStatus(memory->Pinned(group.bytes, &pinned)));
    std::memcpy(pinned, host, group.bytes);
    host = pinned;
  }
  for (size_t f = 0; f < group.features.size(); ++f) {  // lengths are kept in range on the GPU
    if (group.features[f].splits != SplitCoding::kRebased) continue;
    TF_RETURN_IF_ERROR(ToTfStatus(ValidateRowSplits(
        reinterpret_cast<const int64_t*>(host + group.features[f].splits_at), batch,
        bounds[f + 1] - bounds[f], "feature " + std::to_string(f) + " of the staged batch")));
  }
  const tf::Status uploaded = ToTfStatus(uploads->Upload(
      host, group.bytes, GpuStream(ctx), [&](const char* device) {
        const std::vector<CompactFeatureTarget> targets =
            GroupTargets(device, group, bounds, element_bytes, layout, values, splits);
        return ToCoreStatus(ExpandTargets(ctx, targets, batch, element_bytes));
      }));
  const tf::Tensor held = staged;
  AfterStream(ctx, std::move(memory), [held]() {});  // even when the widening failed part way
  TF_RETURN_IF_ERROR(uploaded);
  return CudaToTf(cudaGetLastError(), ctx->op_kernel().name().c_str());
}

}  // namespace sok::functor
