// C ABI over the CUDA core, for the GPU tests and benchmarks (raw device pointers, a stream).
// Every function returns a cudaError_t value: 0 on success.
#include <cuda_runtime.h>

#include <cstdint>

#include "kit_src/core/embedding/pooled_lookup.cuh"
#include "kit_src/core/interaction/dot_interaction.cuh"
#include "kit_src/core/optimizers/sparse_apply.cuh"

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

// float16 twins: features / output / gradients hold IEEE half values (torch.float16).
int sok_dot_interaction_forward_f16(const void* features, void* output, int64_t batch,
                                    int64_t num_features, int64_t dim, void* stream) {
  const sok::InteractionShape shape{batch, num_features, dim};
  return static_cast<int>(sok::DotInteractionForwardGpu(
      shape, static_cast<const __half*>(features), static_cast<__half*>(output),
      static_cast<cudaStream_t>(stream)));
}

int sok_dot_interaction_backward_f16(const void* features, const void* output_grad,
                                     void* features_grad, int64_t batch, int64_t num_features,
                                     int64_t dim, void* stream) {
  const sok::InteractionShape shape{batch, num_features, dim};
  return static_cast<int>(sok::DotInteractionBackwardGpu(
      shape, static_cast<const __half*>(features), static_cast<const __half*>(output_grad),
      static_cast<__half*>(features_grad), static_cast<cudaStream_t>(stream)));
}

// Pooled lookup of `bags` bags (nnz ids in all) from table [rows, dim]; weights may be null;
// mean != 0 for mean.
int sok_pooled_lookup_forward(const float* table, int64_t dim, const int64_t* ids,
                              const int64_t* offsets, const float* weights, int64_t bags,
                              int64_t nnz, int mean, float* output, void* stream) {
  const sok::PooledBatch batch{ids, offsets, weights, bags, nnz, mean != 0};
  return static_cast<int>(sok::PooledLookupForwardGpu(table, dim, batch, output,
                                                      static_cast<cudaStream_t>(stream)));
}

// Fused backward + SGD update of the rows the bags used.
int sok_pooled_sgd_backward(float* table, int64_t dim, const int64_t* ids, const int64_t* offsets,
                            const float* weights, int64_t bags, int64_t nnz, int mean,
                            const float* output_grad, float lr, void* stream) {
  const sok::PooledBatch batch{ids, offsets, weights, bags, nnz, mean != 0};
  return static_cast<int>(sok::PooledSgdBackwardGpu(table, dim, batch, output_grad, lr,
                                                    static_cast<cudaStream_t>(stream)));
}

// Lazy optimizer step of the rows `ids` name in table [rows, dim] and its state
// [rows, state_dim] (null when the rule keeps none), gradients [n, dim] with duplicate ids
// summed first. rule and hyper as Sok>DynamicApply takes them.
int sok_sparse_apply(const char* rule, const float* hyper, int64_t hyper_count, int nesterov,
                     float* values, float* state, int64_t rows, int64_t dim, int64_t state_dim,
                     const int64_t* ids, const float* grads, int64_t n, void* stream) {
  const sok::SparseApplyTable table{values, state, rows, dim, state_dim};
  const sok::SparseGradient gradient{ids, grads, n};
  return static_cast<int>(sok::SparseApplyGpu(rule, hyper, hyper_count, nesterov != 0, table,
                                              gradient, static_cast<cudaStream_t>(stream)));
}

}  // extern "C"
