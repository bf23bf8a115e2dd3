#include "kit_src/core/embedding/upload_ring.cuh"

#include <algorithm>
#include <string>

#include "kit_src/core/cuda_util.h"

namespace sok {

UploadRing::UploadRing(std::unique_ptr<GpuMemory> memory) : memory_(std::move(memory)) {}

UploadRing::~UploadRing() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);  // no copy still writes a buffer
  for (Buffer& buffer : buffers_) {
    if (buffer.data != nullptr) memory_->Free(buffer.data);
    if (buffer.copied != nullptr) cudaEventDestroy(buffer.copied);
    if (buffer.consumed != nullptr) cudaEventDestroy(buffer.consumed);
  }
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

// The stream and events are made on the device the buffer's memory is on, at the first upload.
Status UploadRing::Start(const Buffer& buffer) {
  if (stream_ != nullptr) return Status::Ok();
  cudaPointerAttributes attributes;
  Status status = CudaStatus(cudaPointerGetAttributes(&attributes, buffer.data), "upload device");
  if (!status.ok()) return status;
  ScopedDevice scoped(attributes.device);
  for (Buffer& each : buffers_) {
    if (status.ok()) {
      status = CudaStatus(cudaEventCreateWithFlags(&each.copied, cudaEventDisableTiming),
                          "upload event");
    }
    if (status.ok()) {
      status = CudaStatus(cudaEventCreateWithFlags(&each.consumed, cudaEventDisableTiming),
                          "upload event");
    }
  }
  if (status.ok()) {
    status = CudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                        "upload stream");
  }
  return status;
}

// Grows `buffer` to hold `bytes`. New memory may be in use by work queued on the consumer
// (the allocator hands out what that stream freed), so its first copy waits for the consumer.
Status UploadRing::Reserve(Buffer* buffer, int64_t bytes, cudaStream_t consumer) {
  if (bytes <= buffer->capacity) return Status::Ok();
  const int64_t capacity = std::max<int64_t>(bytes, buffer->capacity + buffer->capacity / 4);
  void* data = memory_->Allocate(static_cast<size_t>(capacity));
  if (data == nullptr) {
    return Status::ResourceExhausted("out of GPU memory for a batch's upload buffer (" +
                                     std::to_string(capacity) + " bytes)");
  }
  if (buffer->data != nullptr) memory_->Free(buffer->data);  // reads of it are on `consumer`
  buffer->data = static_cast<char*>(data);
  buffer->capacity = capacity;
  Status status = Start(*buffer);
  if (!status.ok()) return status;
  return CudaStatus(cudaEventRecord(buffer->consumed, consumer), "upload order");
}

Status UploadRing::Upload(const void* host, int64_t bytes, cudaStream_t consumer,
                          const Reader& read) {
  std::lock_guard<std::mutex> lock(mutex_);
  Buffer& buffer = buffers_[next_];
  next_ = 1 - next_;
  Status status = Reserve(&buffer, std::max<int64_t>(bytes, 1), consumer);
  if (status.ok()) {  // the consumer's reads of the buffer's previous batch come first
    status = CudaStatus(cudaStreamWaitEvent(stream_, buffer.consumed, 0), "upload order");
  }
  if (status.ok() && bytes > 0) {
    status = CudaStatus(cudaMemcpyAsync(buffer.data, host, static_cast<size_t>(bytes),
                                        cudaMemcpyHostToDevice, stream_),
                        "batch upload");
  }
  if (status.ok()) status = CudaStatus(cudaEventRecord(buffer.copied, stream_), "upload order");
  if (status.ok()) {
    status = CudaStatus(cudaStreamWaitEvent(consumer, buffer.copied, 0), "upload order");
  }
  if (!status.ok()) return status;
  status = read(buffer.data);
  // Recorded even when `read` failed part way: what it enqueued still reads the buffer.
  const Status ordered =
      CudaStatus(cudaEventRecord(buffer.consumed, consumer), "upload order");
  return status.ok() ? ordered : status;
}

}  // namespace sok
