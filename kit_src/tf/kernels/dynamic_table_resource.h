// The TensorFlow resource that owns a dynamic table (kit_src/core/hash_table).
#pragma once

#include <memory>
#include <string>

#include "kit_src/core/hash_table/cpu_hash_table.h"
#include "tensorflow/core/framework/resource_base.h"

namespace sok {

class DynamicTableResource : public ::tensorflow::ResourceBase {
 public:
  DynamicTableResource(const HashTableOptions& options, const RowInitializer& initializer)
      : table_(options, initializer) {}
  CpuHashTable& table() { return table_; }
  std::string DebugString() const override {
    return "sok dynamic table of dim " + std::to_string(table_.dim());
  }

 private:
  CpuHashTable table_;
};

}  // namespace sok
