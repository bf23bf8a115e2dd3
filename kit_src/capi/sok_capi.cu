// C ABI over the CUDA core, for the GPU tests and benchmarks (raw device pointers, a stream).
// Every function returns a cudaError_t value: 0 on success.
#include <cuda_runtime.h>

#include <cstdint>

#include "kit_src/core/interaction/dot_interaction.cuh"

extern "C" {

int sok_dot_interaction_forward(const float* features, float* output, int64_t batch,
                                int64_t num_features, int64_t dim, void* stream) {
  const sok::InteractionShape shape{batch, num_features, dim};
  return static_cast<int>(sok::DotInteractionForwardGpu(shape, features, output,
                                                        static_cast<cudaStream_t>(stream)));
}

int sok_dot_interaction_backward(const float* features, const float* output_grad,
                                 float* features_grad, int64_t batch, int64_t num_features,
                                 int64_t dim, void* stream) {
  const sok::InteractionShape shape{batch, num_features, dim};
  return static_cast<int>(sok::DotInteractionBackwardGpu(
      shape, features, output_grad, features_grad, static_cast<cudaStream_t>(stream)));
}

}  // extern "C"
