// The TensorFlow resource that owns a dynamic table (kit_src/core/hash_table): in host memory
// when created on the CPU, in GPU memory when created on a GPU (the GPU kernels make it; the
// table's type stays out of code nvcc does not compile).
#pragma once

#include <memory>
#include <string>

#include "kit_src/core/hash_table/cpu_hash_table.h"
#include "tensorflow/core/framework/resource_base.h"

namespace sok {

class GpuHashTable;  // kit_src/core/hash_table/gpu_hash_table.cuh

class DynamicTableResource : public ::tensorflow::ResourceBase {
 public:
  DynamicTableResource(const HashTableOptions& options, const RowInitializer& initializer)
      : cpu_(std::make_unique<CpuHashTable>(options, initializer)), dim_(options.dim) {}
  DynamicTableResource(std::shared_ptr<GpuHashTable> gpu, int64_t dim)
      : gpu_(std::move(gpu)), dim_(dim) {}

  bool on_gpu() const { return gpu_ != nullptr; }
  CpuHashTable& table() { return *cpu_; }
  GpuHashTable& gpu_table() { return *gpu_; }
  int64_t dim() const { return dim_; }
  std::string DebugString() const override {
    return std::string("sok dynamic table in ") + (on_gpu() ? "GPU" : "host") +
           " memory, dim " + std::to_string(dim_);
  }

 private:
  std::unique_ptr<CpuHashTable> cpu_;
  std::shared_ptr<GpuHashTable> gpu_;
  int64_t dim_ = 0;
};

}  // namespace sok
