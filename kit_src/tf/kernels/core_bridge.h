// What every kernel needs to call the core: the thread pool as a sok::ParallelFor, the
// conversion of sok::Status into tensorflow::Status, and its attrs read in one call.
#pragma once

#include <string>

#include "kit_src/core/parallel.h"
#include "kit_src/core/status.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/lib/core/threadpool.h"

namespace sok {

inline ::tensorflow::Status ToTfStatus(const Status& status) {
  switch (status.code()) {
    case ErrorCode::kOk:
      return ::tensorflow::Status();
    case ErrorCode::kInvalidArgument:
      return ::tensorflow::errors::InvalidArgument(status.message());
    case ErrorCode::kResourceExhausted:
      return ::tensorflow::errors::ResourceExhausted(status.message());
    default:
      return ::tensorflow::errors::Internal(status.message());
  }
}

// The other way, for a kernel's work passed into the core as a callback.
inline Status ToCoreStatus(const ::tensorflow::Status& status) {
  if (status.ok()) return Status::Ok();
  const std::string message(status.message());
  if (::tensorflow::errors::IsInvalidArgument(status)) return Status::InvalidArgument(message);
  if (::tensorflow::errors::IsResourceExhausted(status)) {
    return Status::ResourceExhausted(message);
  }
  return Status::Internal(message);
}

inline ParallelFor CpuParallelFor(::tensorflow::OpKernelContext* ctx) {
  auto* pool = ctx->device()->tensorflow_cpu_worker_threads()->workers;
  return [pool](int64_t total, int64_t cost_per_unit, const ShardWork& work) {
    if (total <= 0) return;
    pool->ParallelFor(total, cost_per_unit, [&work](int64_t begin, int64_t end) {
      work(begin, end);
    });
  };
}

// Reads each named attr into its destination, in order:
//   OP_REQUIRES_OK(ctx, ReadAttrs(ctx, "dim", &dim_, "validate", &validate_));
inline ::tensorflow::Status ReadAttrs(::tensorflow::OpKernelConstruction*) {
  return ::tensorflow::Status();
}
template <typename T, typename... More>
::tensorflow::Status ReadAttrs(::tensorflow::OpKernelConstruction* ctx, const char* name,
                               T* value, More... more) {
  TF_RETURN_IF_ERROR(ctx->GetAttr(name, value));
  return ReadAttrs(ctx, more...);
}

}  // namespace sok

#define SOK_OP_REQUIRES_OK(ctx, expr)                         \
  do {                                                        \
    const ::sok::Status sok_status_ = (expr);                 \
    OP_REQUIRES_OK(ctx, ::sok::ToTfStatus(sok_status_));      \
  } while (0)
