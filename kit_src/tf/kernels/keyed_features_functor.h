// The device work of Sok>UnpackFeatures, Sok>UnpackFeaturesFromHost and
// Sok>UnpackStagedFeatures: the OpKernels in keyed_features_kernels.cc check the packed batch
// and size the outputs once for both devices; a functor per device reads the feature offsets,
// rebases each feature's row splits, copies the values that cannot be aliased, or widens a
// compactly staged batch.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "kit_src/core/embedding/keyed_features.h"
#include "kit_src/tf/kernels/device_tags.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace sok {

class UploadRing;  // kit_src/core/embedding/upload_ring.cuh, in GPU builds

// use(splits) with a packed batch's row splits as the int32 or int64 pointer they hold.
template <typename Use>
auto WithRowSplits(const ::tensorflow::Tensor& row_splits, Use use) {
  return row_splits.dtype() == ::tensorflow::DT_INT32 ? use(row_splits.flat<int32_t>().data())
                                                      : use(row_splits.flat<int64_t>().data());
}

namespace functor {

template <typename Device>
struct KeyedFeatures {
  // bounds[f] = row_splits[f * batch], f in [0, num_features], in host memory (the GPU waits
  // for these F + 1 values: they size the outputs).
  ::tensorflow::Status Bounds(::tensorflow::OpKernelContext* ctx,
                              const ::tensorflow::Tensor& row_splits, int64_t batch,
                              int64_t num_features, std::vector<int64_t>* bounds);
  // outputs[f] (int64 [batch + 1]) = feature f's row splits counted from its first value.
  ::tensorflow::Status Rebase(::tensorflow::OpKernelContext* ctx,
                              const ::tensorflow::Tensor& row_splits, int64_t batch,
                              const std::vector<::tensorflow::Tensor*>& outputs);
  ::tensorflow::Status Copy(::tensorflow::OpKernelContext* ctx, void* dst, const void* src,
                            int64_t bytes);
};

// Sok>UnpackFeaturesFromHost's device work: the packed batch (host memory) into `layout` in
// the device's memory (`values` and `splits`), staged compactly (keyed_features.h) and
// widened back; through pinned memory on a GPU.
template <typename Device>
struct StageFeaturesFromHost {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* ctx,
                                  const ::tensorflow::Tensor& packed_values,
                                  const ::tensorflow::Tensor& row_splits,
                                  const std::vector<int64_t>& bounds, int64_t batch,
                                  const FeatureLayout& layout, ::tensorflow::Tensor* values,
                                  ::tensorflow::Tensor* splits);
};

// Sok>UnpackStagedFeatures' device work: a batch staged by Sok>StageFeatures (`staged`, host
// memory, pinned where a GPU is present; `group` its decoded plan, `bounds` its features' value
// offsets) widened into `layout` in the device's memory. On a GPU the staged bytes cross in one
// copy on a stream of their own (`uploads`, made at the first call), so the copy overlaps the
// work queued before the op; one functor lives as long as its OpKernel.
template <typename Device>
struct ExpandStagedFeatures {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* ctx,
                                  const ::tensorflow::Tensor& staged, const CompactGroup& group,
                                  const std::vector<int64_t>& bounds, int64_t batch,
                                  int64_t element_bytes, const FeatureLayout& layout,
                                  ::tensorflow::Tensor* values, ::tensorflow::Tensor* splits);
  std::once_flag made;
  std::shared_ptr<UploadRing> uploads;
};

// PlanCompactGroup / StageCompactGroup (keyed_features.h) of features [first, end) over either
// row-splits type, in the op's CPU thread pool (`id_ranges`: for a staged batch's plan).
CompactGroup PlanCompactGroupOnHost(::tensorflow::OpKernelContext* ctx,
                                    const ::tensorflow::Tensor& packed_values,
                                    const ::tensorflow::Tensor& row_splits,
                                    const std::vector<int64_t>& bounds, int64_t batch,
                                    int64_t first, int64_t end, bool id_ranges);
void StageCompactGroupOnHost(::tensorflow::OpKernelContext* ctx,
                             const ::tensorflow::Tensor& packed_values,
                             const ::tensorflow::Tensor& row_splits,
                             const std::vector<int64_t>& bounds, int64_t batch,
                             const CompactGroup& group, char* staged);

}  // namespace functor
}  // namespace sok
