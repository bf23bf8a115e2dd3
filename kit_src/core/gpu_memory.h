// Device memory handed to the core's GPU structures by their owner (TensorFlow's allocator in
// the plugin). Memory handed to Free may still be read by work already enqueued on the
// owner's stream: the allocator must keep it from other streams until then (TensorFlow's GPU
// allocator does for its compute stream; cudaFreeAsync on the stream does).
#pragma once

#include <cstddef>

namespace sok {

class GpuMemory {
 public:
  virtual ~GpuMemory() = default;
  virtual void* Allocate(size_t bytes) = 0;  // null when out of memory
  virtual void Free(void* pointer) = 0;
};

}  // namespace sok
