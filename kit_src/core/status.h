// The error boundary of the core: functions return a Status instead of throwing, and the
// TensorFlow kernels turn it into a tensorflow::Status (see kit_src/tf/kernels/core_bridge.h).
#pragma once

#include <string>
#include <utility>

namespace sok {

enum class ErrorCode { kOk = 0, kInvalidArgument, kResourceExhausted, kInternal };

class Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string message) {
    return Status(ErrorCode::kInvalidArgument, std::move(message));
  }
  static Status ResourceExhausted(std::string message) {
    return Status(ErrorCode::kResourceExhausted, std::move(message));
  }
  static Status Internal(std::string message) {
    return Status(ErrorCode::kInternal, std::move(message));
  }

  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

}  // namespace sok

// Returns the status of `expr` from the calling function unless it is ok.
#define SOK_RETURN_IF_ERROR(expr)              \
  do {                                         \
    const ::sok::Status sok_status_ = (expr);  \
    if (!sok_status_.ok()) return sok_status_; \
  } while (0)
