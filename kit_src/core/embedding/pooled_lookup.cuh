// CUDA pooled lookup straight from a table (one worker's rows, device memory) and its fused
// SGD backward: the rows each bag used move by -lr * (the bag's gradient share), applied with
// atomics (exact for SGD: the update is linear); equal ids are summed per block first.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace sok {

struct PooledBatch {
  const int64_t* ids = nullptr;      // [nnz] rows of the table, each in [0, rows)
  const int64_t* offsets = nullptr;  // [bags + 1] bag b uses ids[offsets[b], offsets[b + 1])
  const float* weights = nullptr;    // [nnz] or nullptr for all ones
  int64_t bags = 0;
  int64_t nnz = 0;                   // ids in the batch (offsets[bags]), known on the host
  bool mean = false;                 // mean instead of sum (weights summed per bag)
};

// output[b] ([bags, dim]) = combine of the bag's weighted rows; an empty bag gives zeros.
cudaError_t PooledLookupForwardGpu(const float* table, int64_t dim, const PooledBatch& batch,
                                   float* output, cudaStream_t stream);

// table[id] -= lr * weight * output_grad[b] / denominator, for every use of every id.
cudaError_t PooledSgdBackwardGpu(float* table, int64_t dim, const PooledBatch& batch,
                                 const float* output_grad, float lr, cudaStream_t stream);

}  // namespace sok
