// C ABI over the CUDA core, for the GPU tests and benchmarks (raw device pointers, a stream).
// Every function returns a cudaError_t value: 0 on success.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kit_src/core/embedding/lookup_gpu.cuh"
#include "kit_src/core/embedding/pooled_lookup.cuh"
#include "kit_src/core/embedding/row_owner.h"
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

// The input distribution of static tables (the plugin's Sok>PartitionKeys on a GPU):
// num_lookups lookups of int64 ids laid end to end in `ids` (device), lookup l holding
// counts[l] ids of table tables[l] (rows[t] rows, owner owners[t]: -1 distributed, else
// localized on that worker; host arrays). Fills send_keys ([unique], PackKey(table, local row)
// grouped by worker, then table, then row; room for every id), position ([total]: each id's
// key) and splits ([num_workers] keys a worker, host), *unique, and *bad_lookup / *bad_id
// (-1 / 0 when every id is in range). Synchronises the stream.
int sok_partition_keys(const int64_t* ids, const int64_t* counts, const int32_t* tables,
                       int32_t num_lookups, const int64_t* rows, const int32_t* owners,
                       int32_t num_tables, int32_t num_workers, int dedup, int64_t* send_keys,
                       int32_t* position, int64_t* splits, int64_t* unique, int64_t* bad_lookup,
                       int64_t* bad_id, void* stream_handle) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  const auto bits_for = [](uint64_t values) {  // bits to hold 0 .. values - 1
    int bits = 0;
    while (bits < 64 && (uint64_t{1} << bits) < values) ++bits;
    return bits;
  };
  std::vector<sok::GpuPartitionLookup> lookups(num_lookups);
  int64_t total = 0;
  uint64_t most_rows = 1;
  for (int32_t t = 0; t < num_tables; ++t) {
    most_rows = std::max<uint64_t>(most_rows, sok::MostLocalRows(rows[t], owners[t], num_workers));
  }
  for (int32_t l = 0; l < num_lookups; ++l) {
    lookups[l] = sok::GpuPartitionLookup{ids + total, counts[l], total, tables[l],
                                         owners[tables[l]], rows[tables[l]]};
    total += counts[l];
  }
  std::vector<void*> held;
  const sok::DeviceAllocate allocate = [&held](size_t bytes) -> void* {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) return nullptr;
    held.push_back(p);
    return p;
  };
  const auto release = [&held](cudaError_t status) {
    for (void* p : held) cudaFree(p);
    return static_cast<int>(status);
  };
  auto* lookups_device = static_cast<sok::GpuPartitionLookup*>(
      allocate(std::max<size_t>(lookups.size(), 1) * sizeof(sok::GpuPartitionLookup)));
  auto* check = static_cast<sok::LookupCheck*>(allocate(sizeof(sok::LookupCheck)));
  if (lookups_device == nullptr || check == nullptr) return release(cudaErrorMemoryAllocation);
  cudaMemcpyAsync(lookups_device, lookups.data(), lookups.size() * sizeof(lookups[0]),
                  cudaMemcpyHostToDevice, stream);
  cudaError_t status = sok::ResetLookupCheck(check, stream);
  const int row_bits = bits_for(most_rows), table_bits = bits_for(num_tables);
  sok::SortedPartitionKeys sorted;
  if (status == cudaSuccess) {
    status = sok::SortPartitionKeys(lookups_device, num_lookups, true, total, num_workers,
                                    table_bits, row_bits, row_bits + table_bits +
                                    bits_for(num_workers), dedup != 0, 0, allocate, check,
                                    &sorted, stream);
  }
  int32_t unique32 = 0;
  sok::LookupCheck found{};
  if (status == cudaSuccess && total > 0) {
    cudaMemcpyAsync(&unique32, sorted.slot + total - 1, sizeof(int32_t), cudaMemcpyDeviceToHost,
                    stream);
  }
  if (status == cudaSuccess) {
    cudaMemcpyAsync(&found, check, sizeof(found), cudaMemcpyDeviceToHost, stream);
    cudaMemcpyAsync(splits, sorted.worker_counts, num_workers * sizeof(int64_t),
                    cudaMemcpyDeviceToHost, stream);
    status = cudaStreamSynchronize(stream);
  }
  *unique = unique32;
  *bad_lookup = found.first_bad == sok::kNoError ? -1 : sok::BadGroup(found.first_bad);
  *bad_id = found.first_bad == sok::kNoError ? 0 : found.value_a;
  if (status == cudaSuccess && found.first_bad == sok::kNoError) {
    status = sok::ScatterPartition(sorted.sorted, sorted.order, sorted.slot, total, row_bits,
                                   table_bits, send_keys, position, stream);
    if (status == cudaSuccess) status = cudaStreamSynchronize(stream);
  }
  return release(status);
}

}  // extern "C"
