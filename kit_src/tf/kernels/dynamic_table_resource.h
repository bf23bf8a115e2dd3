// The TensorFlow resource that owns a dynamic table: any implementation of the core's table
// interface (kit_src/core/hash_table/dynamic_table.h), made by Sok>DynamicTableCreate on the
// op's device.
#pragma once

#include <memory>
#include <string>

#include "kit_src/core/hash_table/dynamic_table.h"
#include "tensorflow/core/framework/resource_base.h"

namespace sok {

class DynamicTableResource : public ::tensorflow::ResourceBase {
 public:
  explicit DynamicTableResource(std::shared_ptr<DynamicTable> table) : table_(std::move(table)) {}

  DynamicTable& table() { return *table_; }
  bool on_gpu() const { return table_->in_device_memory(); }
  int64_t dim() const { return table_->dim(); }
  std::string DebugString() const override {
    return std::string("sok dynamic table in ") + (on_gpu() ? "GPU" : "host") +
           " memory, dim " + std::to_string(dim());
  }

 private:
  std::shared_ptr<DynamicTable> table_;
};

}  // namespace sok
