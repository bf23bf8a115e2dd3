// CUDA twin of dot_interaction.h: the same layout and results, on device pointers and a stream.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kit_src/core/interaction/dot_interaction.h"

namespace sok {

// features: [batch, F, D], output: [batch, D + F(F-1)/2]; device memory.
cudaError_t DotInteractionForwardGpu(const InteractionShape& shape, const float* features,
                                     float* output, cudaStream_t stream);

// output_grad: [batch, D + F(F-1)/2]; features_grad: [batch, F, D] (overwritten); device memory.
cudaError_t DotInteractionBackwardGpu(const InteractionShape& shape, const float* features,
                                      const float* output_grad, float* features_grad,
                                      cudaStream_t stream);

}  // namespace sok
