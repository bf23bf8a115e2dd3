// Host-to-device copies on a stream of their own, so that a batch crosses to the GPU while
// the stream that reads it still runs earlier work (the previous training step), rather than
// in line on that stream. Each copy lands in one of two device buffers used in turn; events
// order a buffer's copy before the consumer stream's reads of it, and its next copy after
// them. Buffers come from the owner's GpuMemory: a buffer just allocated may still be in use
// by work queued on the consumer stream, so its first copy waits for that stream.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "kit_src/core/gpu_memory.h"
#include "kit_src/core/status.h"

namespace sok {

class UploadRing {
 public:
  // Enqueues the consumer stream's reads of an uploaded buffer (`device`, `bytes` long).
  using Reader = std::function<Status(const char* device)>;

  explicit UploadRing(std::unique_ptr<GpuMemory> memory);
  ~UploadRing();
  UploadRing(const UploadRing&) = delete;
  UploadRing& operator=(const UploadRing&) = delete;

  // Copies `bytes` from `host` (pinned memory, kept alive by the caller until `consumer` has
  // passed its reads) to the next device buffer on the ring's stream, makes `consumer` wait
  // for the copy, then calls `read`. Calls are serialised.
  Status Upload(const void* host, int64_t bytes, cudaStream_t consumer, const Reader& read);

 private:
  struct Buffer {
    char* data = nullptr;
    int64_t capacity = 0;
    cudaEvent_t copied = nullptr;    // recorded on the ring's stream after a copy into it
    cudaEvent_t consumed = nullptr;  // recorded on the consumer after its reads were enqueued
  };
  Status Reserve(Buffer* buffer, int64_t bytes, cudaStream_t consumer);
  Status Start(const Buffer& buffer);

  std::unique_ptr<GpuMemory> memory_;
  std::mutex mutex_;
  cudaStream_t stream_ = nullptr;
  Buffer buffers_[2];
  int next_ = 0;
};

}  // namespace sok
