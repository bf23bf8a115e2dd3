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
  return ToTfStatus(WithRowSplits(row_splits, [&](const auto* splits) {
    return FeatureBoundsToHost(&memory, splits, batch, num_features, bounds);
  }));
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

// The outputs' bytes as CompactGroupTargets takes them.
static char* ValuesOf(tf::Tensor* values) { return static_cast<char*>(values->data()); }
static int64_t* SplitsOf(tf::Tensor* splits) { return splits->flat<int64_t>().data(); }

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
    TF_RETURN_IF_ERROR(ToTfStatus(UploadCompactGroup(memory.get(), staged, group, bounds,
                                                     element, layout, ValuesOf(values),
                                                     SplitsOf(splits), &targets)));
  }
  TF_RETURN_IF_ERROR(ToTfStatus(ExpandCompactTargetsGpu(memory.get(), targets, batch, element)));
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
        const std::vector<CompactFeatureTarget> targets = CompactGroupTargets(
            device, group, bounds, element_bytes, layout, ValuesOf(values), SplitsOf(splits));
        return ExpandCompactTargetsGpu(memory.get(), targets, batch, element_bytes);
      }));
  const tf::Tensor held = staged;
  AfterStream(ctx, std::move(memory), [held]() {});  // even when the widening failed part way
  TF_RETURN_IF_ERROR(uploaded);
  return CudaToTf(cudaGetLastError(), ctx->op_kernel().name().c_str());
}

}  // namespace sok::functor
