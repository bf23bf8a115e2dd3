// Sok>UnpackFeatures: a feature-major packed batch (one ragged tensor of F features) as one
// ragged tensor a feature. Values are handed out as slices of the input where aligned (no copy).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kit_src/core/embedding/combine.h"
#include "kit_src/core/embedding/keyed_features.h"
#include "kit_src/tf/kernels/core_bridge.h"
#include "kit_src/tf/kernels/keyed_features_functor.h"
#include "kit_src/tf/kernels/register_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace sok {
namespace tf = ::tensorflow;

namespace functor {

template <>
tf::Status KeyedFeatures<CpuDevice>::Bounds(tf::OpKernelContext*, const tf::Tensor& row_splits,
                                            int64_t batch, int64_t num_features,
                                            std::vector<int64_t>* bounds) {
  bounds->resize(num_features + 1);
  WithRowSplits(row_splits, [&](const auto* splits) {
    FeatureBounds(splits, batch, num_features, bounds->data());
  });
  return tf::Status();
}

template <>
tf::Status KeyedFeatures<CpuDevice>::Rebase(tf::OpKernelContext*, const tf::Tensor& row_splits,
                                            int64_t batch,
                                            const std::vector<tf::Tensor*>& outputs) {
  for (size_t f = 0; f < outputs.size(); ++f) {
    WithRowSplits(row_splits, [&](const auto* splits) {
      RebaseFeatureRowSplits(splits, batch, f, outputs[f]->flat<int64_t>().data());
    });
  }
  return tf::Status();
}

template <>
tf::Status KeyedFeatures<CpuDevice>::Copy(tf::OpKernelContext*, void* dst, const void* src,
                                          int64_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return tf::Status();
}

CompactGroup PlanCompactGroupOnHost(tf::OpKernelContext* ctx, const tf::Tensor& packed_values,
                                    const tf::Tensor& row_splits,
                                    const std::vector<int64_t>& bounds, int64_t batch,
                                    int64_t first, int64_t end, bool id_ranges) {
  const char* source = static_cast<const char*>(packed_values.data());
  const int64_t element = tf::DataTypeSize(packed_values.dtype());
  const bool narrowable = packed_values.dtype() == tf::DT_INT64;
  return WithRowSplits(row_splits, [&](const auto* splits) {
    return PlanCompactGroup(source, element, narrowable, splits, bounds, batch, first, end,
                            id_ranges, CpuParallelFor(ctx));
  });
}

void StageCompactGroupOnHost(tf::OpKernelContext* ctx, const tf::Tensor& packed_values,
                             const tf::Tensor& row_splits, const std::vector<int64_t>& bounds,
                             int64_t batch, const CompactGroup& group, char* staged) {
  const char* source = static_cast<const char*>(packed_values.data());
  const int64_t element = tf::DataTypeSize(packed_values.dtype());
  WithRowSplits(row_splits, [&](const auto* splits) {
    StageCompactGroup(source, element, splits, bounds, batch, group, staged,
                      CpuParallelFor(ctx));
  });
}

// Every feature of a staged group widened in host memory into the outputs (`layout`).
static tf::Status ExpandGroupOnHost(const char* staged, const CompactGroup& group,
                                    const std::vector<int64_t>& bounds, int64_t batch,
                                    int64_t element, const FeatureLayout& layout, bool check,
                                    tf::Tensor* values, tf::Tensor* splits) {
  return ToTfStatus(ExpandCompactGroup(staged, group, bounds, batch, element, layout, check,
                                       static_cast<char*>(values->data()),
                                       splits->flat<int64_t>().data()));
}

// Features [0, F) of the packed batch staged into a new buffer (`attr`: pinned for
// Sok>StageFeatures), in one read of the batch where every feature takes its most compact
// codings, else planned and staged in two.
static tf::Status StageWholeBatch(tf::OpKernelContext* ctx, const tf::Tensor& packed_values,
                                  const tf::Tensor& row_splits,
                                  const std::vector<int64_t>& bounds, int64_t batch,
                                  tf::AllocatorAttributes attr, CompactGroup* group,
                                  tf::Tensor* staged) {
  const int64_t features = static_cast<int64_t>(bounds.size()) - 1;
  const int64_t element = tf::DataTypeSize(packed_values.dtype());
  const bool narrowable = packed_values.dtype() == tf::DT_INT64;
  const char* source = static_cast<const char*>(packed_values.data());
  const auto allocate = [&]() {
    return ctx->allocate_temp(tf::DT_INT8, tf::TensorShape({group->bytes}), staged, attr);
  };
  *group = CompactestGroup(bounds, batch, element, narrowable, 0, features);
  TF_RETURN_IF_ERROR(allocate());
  char* bytes = reinterpret_cast<char*>(staged->flat<int8_t>().data());
  const bool staged_once = WithRowSplits(row_splits, [&](const auto* splits) {
    return StageIfCompactest(source, element, narrowable, splits, bounds, batch, group, bytes,
                             CpuParallelFor(ctx));
  });
  if (staged_once) return tf::Status();
  *group = PlanCompactGroupOnHost(ctx, packed_values, row_splits, bounds, batch, 0, features,
                                  /*id_ranges=*/true);
  TF_RETURN_IF_ERROR(allocate());
  StageCompactGroupOnHost(ctx, packed_values, row_splits, bounds, batch, *group,
                          reinterpret_cast<char*>(staged->flat<int8_t>().data()));
  return tf::Status();
}

// The CPU stages and widens back in host memory: the GPU's coding, checked on every machine.
template <>
tf::Status StageFeaturesFromHost<CpuDevice>::operator()(
    tf::OpKernelContext* ctx, const tf::Tensor& packed_values, const tf::Tensor& row_splits,
    const std::vector<int64_t>& bounds, int64_t batch, const FeatureLayout& layout,
    tf::Tensor* values, tf::Tensor* splits) {
  CompactGroup group;
  tf::Tensor staged;
  TF_RETURN_IF_ERROR(StageWholeBatch(ctx, packed_values, row_splits, bounds, batch,
                                     tf::AllocatorAttributes(), &group, &staged));
  const char* staged_bytes = reinterpret_cast<const char*>(staged.flat<int8_t>().data());
  return ExpandGroupOnHost(staged_bytes, group, bounds, batch,
                           tf::DataTypeSize(packed_values.dtype()), layout, /*check=*/false,
                           values, splits);
}

// A staged batch may come from anywhere, so its row splits are checked as they widen.
template <>
tf::Status ExpandStagedFeatures<CpuDevice>::operator()(
    tf::OpKernelContext*, const tf::Tensor& staged, const CompactGroup& group,
    const std::vector<int64_t>& bounds, int64_t batch, int64_t element_bytes,
    const FeatureLayout& layout, tf::Tensor* values, tf::Tensor* splits) {
  return ExpandGroupOnHost(static_cast<const char*>(staged.data()), group, bounds, batch,
                           element_bytes, layout, /*check=*/true, values, splits);
}

}  // namespace functor

// The packed batch's shape and feature offsets, checked; Device says where row_splits lives.
template <typename Device>
static tf::Status PackedFeatureBounds(tf::OpKernelContext* ctx, const tf::Tensor& values,
                                      const tf::Tensor& row_splits, int64_t num_features,
                                      int64_t* batch, std::vector<int64_t>* bounds) {
  if (values.dims() != 1 || row_splits.dims() != 1) {
    return tf::errors::InvalidArgument("the packed batch's values and row_splits must be "
                                       "vectors, got shapes ", values.shape().DebugString(),
                                       " and ", row_splits.shape().DebugString());
  }
  TF_RETURN_IF_ERROR(ToTfStatus(FeatureBatch(row_splits.NumElements() - 1, num_features, batch)));
  TF_RETURN_IF_ERROR(functor::KeyedFeatures<Device>().Bounds(ctx, row_splits, *batch,
                                                             num_features, bounds));
  return ToTfStatus(CheckFeatureBounds(*bounds, values.NumElements()));
}

// What the ops taking a packed batch (inputs values, row_splits) share: num_features, and the
// batch's checked shape and feature offsets (row_splits read where `Device` says).
class PackedBatchOp : public tf::OpKernel {
 protected:
  explicit PackedBatchOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_features", &num_features_));
  }
  template <typename Device>
  tf::Status ReadBatch(tf::OpKernelContext* ctx, int64_t* batch,
                       std::vector<int64_t>* bounds) const {
    return PackedFeatureBounds<Device>(ctx, ctx->input(0), ctx->input(1), num_features_, batch,
                                       bounds);
  }
  int64_t num_features_ = 1;
};

template <typename Device>
class UnpackFeaturesOp : public PackedBatchOp {
 public:
  explicit UnpackFeaturesOp(tf::OpKernelConstruction* ctx) : PackedBatchOp(ctx) {}

  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& values = ctx->input(0);
    const tf::Tensor& row_splits = ctx->input(1);
    int64_t batch = 0;
    std::vector<int64_t> bounds;
    OP_REQUIRES_OK(ctx, ReadBatch<Device>(ctx, &batch, &bounds));
    functor::KeyedFeatures<Device> device;
    const int64_t element = tf::DataTypeSize(values.dtype());
    for (int64_t f = 0; f < num_features_; ++f) {
      const int64_t count = bounds[f + 1] - bounds[f];
      const auto address = reinterpret_cast<uintptr_t>(values.data()) + bounds[f] * element;
      if (address % tf::Allocator::kAllocatorAlignment == 0) {
        ctx->set_output(f, values.Slice(bounds[f], bounds[f + 1]));  // shares the buffer
        continue;
      }
      tf::Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(f, tf::TensorShape({count}), &out));
      OP_REQUIRES_OK(ctx, device.Copy(ctx, out->data(),
                                      static_cast<const char*>(values.data()) + bounds[f] * element,
                                      count * element));
    }
    std::vector<tf::Tensor*> splits(num_features_);
    for (int64_t f = 0; f < num_features_; ++f) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(num_features_ + f, tf::TensorShape({batch + 1}),
                                               &splits[f]));
    }
    OP_REQUIRES_OK(ctx, device.Rebase(ctx, row_splits, batch, splits));
  }
};

// The unpacked features, each a slice of the two buffers `layout` places them in.
static void SetFeatureOutputs(tf::OpKernelContext* ctx, const tf::Tensor& values,
                              const tf::Tensor& splits, const FeatureLayout& layout,
                              const std::vector<int64_t>& bounds, int64_t batch) {
  const int64_t features = static_cast<int64_t>(layout.value_start.size());
  for (int64_t f = 0; f < features; ++f) {
    const int64_t start = layout.value_start[f];
    ctx->set_output(f, values.Slice(start, start + bounds[f + 1] - bounds[f]));
    const int64_t split = layout.split_start[f];
    ctx->set_output(features + f, splits.Slice(split, split + batch + 1));
  }
}

// The two buffers of `layout` (values of `dtype`, int64 row splits) on the op's device.
static tf::Status AllocateFeatureBuffers(tf::OpKernelContext* ctx, tf::DataType dtype,
                                         const FeatureLayout& layout, tf::Tensor* values,
                                         tf::Tensor* splits) {
  TF_RETURN_IF_ERROR(ctx->allocate_temp(
      dtype, tf::TensorShape({std::max<int64_t>(layout.value_total, 1)}), values));
  return ctx->allocate_temp(tf::DT_INT64, tf::TensorShape({layout.split_total}), splits);
}

// Sok>UnpackFeaturesFromHost: the same from a packed batch in host memory (as tf.data hands
// it over): the feature offsets are read there (no wait for a GPU), the values and rebased
// row splits cross to the device compactly staged (StageFeaturesFromHost) and are widened
// into two buffers, each feature aligned in them and handed out as a slice.
template <typename Device>
class UnpackFeaturesFromHostOp : public PackedBatchOp {
 public:
  explicit UnpackFeaturesFromHostOp(tf::OpKernelConstruction* ctx) : PackedBatchOp(ctx) {}

  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& packed = ctx->input(0);
    const tf::Tensor& row_splits = ctx->input(1);
    int64_t batch = 0;
    std::vector<int64_t> bounds;
    OP_REQUIRES_OK(ctx, ReadBatch<CpuDevice>(ctx, &batch, &bounds));  // host memory
    const FeatureLayout layout =
        AlignedFeatureLayout(bounds, batch, tf::DataTypeSize(packed.dtype()),
                             tf::Allocator::kAllocatorAlignment);
    tf::Tensor values, splits;
    OP_REQUIRES_OK(ctx, AllocateFeatureBuffers(ctx, packed.dtype(), layout, &values, &splits));
    OP_REQUIRES_OK(ctx, functor::StageFeaturesFromHost<Device>()(ctx, packed, row_splits, bounds,
                                                                 batch, layout, &values, &splits));
    SetFeatureOutputs(ctx, values, splits, layout, bounds, batch);
  }
};

// Sok>StageFeatures: the CPU half of a packed batch's crossing, run by the input pipeline ahead
// of its step: planned and staged as Sok>UnpackFeaturesFromHost stages it, into an output the
// GPU can copy from directly (pinned memory where a GPU is present).
class StageFeaturesOp : public PackedBatchOp {
 public:
  explicit StageFeaturesOp(tf::OpKernelConstruction* ctx) : PackedBatchOp(ctx) {}

  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& packed = ctx->input(0);
    const tf::Tensor& row_splits = ctx->input(1);
    int64_t batch = 0;
    std::vector<int64_t> bounds;
    OP_REQUIRES_OK(ctx, ReadBatch<CpuDevice>(ctx, &batch, &bounds));
    tf::AllocatorAttributes pinned;
    pinned.set_on_host(true);
    pinned.set_gpu_compatible(true);
    CompactGroup group;
    tf::Tensor staged;
    OP_REQUIRES_OK(ctx, functor::StageWholeBatch(ctx, packed, row_splits, bounds, batch, pinned,
                                                 &group, &staged));
    ctx->set_output(0, staged);
    const std::vector<int64_t> plan = EncodeStagedPlan(group, bounds, batch);
    tf::Tensor* plan_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            1, tf::TensorShape({static_cast<int64_t>(plan.size())}), &plan_out));
    std::copy(plan.begin(), plan.end(), plan_out->flat<int64_t>().data());
  }
};

// Sok>UnpackStagedFeatures: a staged batch's plan read and checked on the host, its bytes
// widened on the op's device into the buffers Sok>UnpackFeaturesFromHost hands out.
template <typename Device>
class UnpackStagedFeaturesOp : public tf::OpKernel {
 public:
  explicit UnpackStagedFeaturesOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadAttrs(ctx, "num_features", &num_features_, "T", &dtype_,
                                  "id_limits", &id_limits_, "table_names", &table_names_));
    OP_REQUIRES(ctx,
                (id_limits_.empty() ||
                 static_cast<int64_t>(id_limits_.size()) == num_features_) &&
                    table_names_.size() == id_limits_.size(),
                tf::errors::InvalidArgument("id_limits and table_names hold ", id_limits_.size(),
                                            " and ", table_names_.size(), " entries for ",
                                            num_features_, " features"));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    const tf::Tensor& staged = ctx->input(0);
    const tf::Tensor& plan = ctx->input(1);
    OP_REQUIRES(ctx, staged.dims() == 1 && plan.dims() == 1,
                tf::errors::InvalidArgument("a staged batch's bytes and plan must be vectors, got "
                                            "shapes ", staged.shape().DebugString(), " and ",
                                            plan.shape().DebugString()));
    const int64_t element = tf::DataTypeSize(dtype_);
    CompactGroup group;
    std::vector<int64_t> bounds;
    int64_t batch = 0;
    SOK_OP_REQUIRES_OK(ctx, DecodeStagedPlan(plan.flat<int64_t>().data(), plan.NumElements(),
                                             num_features_, element, staged.NumElements(), &group,
                                             &bounds, &batch));
    SOK_OP_REQUIRES_OK(ctx, CheckStagedIdRanges(group, bounds, id_limits_, table_names_));
    const FeatureLayout layout =
        AlignedFeatureLayout(bounds, batch, element, tf::Allocator::kAllocatorAlignment);
    tf::Tensor values, splits;
    OP_REQUIRES_OK(ctx, AllocateFeatureBuffers(ctx, dtype_, layout, &values, &splits));
    OP_REQUIRES_OK(ctx, expand_(ctx, staged, group, bounds, batch, element, layout, &values,
                                &splits));
    SetFeatureOutputs(ctx, values, splits, layout, bounds, batch);
  }

 private:
  int64_t num_features_ = 1;
  tf::DataType dtype_ = tf::DT_INT64;
  std::vector<int64_t> id_limits_;
  std::vector<std::string> table_names_;
  functor::ExpandStagedFeatures<Device> expand_;  // keeps its device buffers between steps
};

REGISTER_KERNEL_BUILDER(Name("Sok>StageFeatures").Device(tf::DEVICE_CPU), StageFeaturesOp);
SOK_REGISTER_KERNELS("Sok>UnpackStagedFeatures", UnpackStagedFeaturesOp,
                     .HostMemory("staged").HostMemory("plan"));
SOK_REGISTER_KERNELS("Sok>UnpackFeaturesFromHost", UnpackFeaturesFromHostOp,
                     .HostMemory("values").HostMemory("row_splits"));
SOK_REGISTER_KERNELS("Sok>UnpackFeatures", UnpackFeaturesOp);

}  // namespace sok
