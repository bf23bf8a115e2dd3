// CUDA twin of dot_interaction.h: the same layout and results, on device pointers and a stream.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kit_src/core/interaction/dot_interaction.h"

namespace sok {

// T is float or __half (summed in float, rounded once).
// features: [batch, F, D], output: [batch, D + F(F-1)/2]; device memory.
template <typename T>
cudaError_t DotInteractionForwardGpu(const InteractionShape& shape, const T* features, T* output,
                                     cudaStream_t stream);

// output_grad: [batch, D + F(F-1)/2]; features_grad: [batch, F, D] (overwritten); device memory.
template <typename T>
cudaError_t DotInteractionBackwardGpu(const InteractionShape& shape, const T* features,
                                      const T* output_grad, T* features_grad,
                                      cudaStream_t stream);

}  // namespace sok
