// How the core asks for parallelism without knowing the framework: the caller passes a
// ParallelFor that splits [0, total) into shards and runs `work(begin, end)` on each,
// possibly concurrently. TensorFlow kernels pass one backed by the op's CPU thread pool.
#pragma once

#include <cstdint>
#include <functional>

namespace sok {

using ShardWork = std::function<void(int64_t begin, int64_t end)>;
// cost_per_unit: rough cycles one unit of work takes, so small jobs stay on one thread.
using ParallelFor =
    std::function<void(int64_t total, int64_t cost_per_unit, const ShardWork& work)>;

// Runs everything on the calling thread; for tests and tiny inputs.
inline void SerialFor(int64_t total, int64_t /*cost_per_unit*/, const ShardWork& work) {
  if (total > 0) work(0, total);
}

}  // namespace sok
