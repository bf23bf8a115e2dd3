// C ABI over the CUDA core, for the GPU tests and benchmarks (raw device pointers, a stream).
// Every function returns a cudaError_t value: 0 on success.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kit_src/core/cuda_scratch.cuh"
#include "kit_src/core/embedding/lookup_gpu.cuh"
#include "kit_src/core/embedding/row_owner.h"
#include "kit_src/core/interaction/dot_interaction.cuh"
#include "kit_src/core/optimizers/sparse_apply.cuh"

namespace {

template <typename T>
int InteractionForward(const void* features, void* output, int64_t batch, int64_t num_features,
                       int64_t dim, void* stream) {
  return static_cast<int>(sok::DotInteractionForwardGpu(
      sok::InteractionShape{batch, num_features, dim}, static_cast<const T*>(features),
      static_cast<T*>(output), static_cast<cudaStream_t>(stream)));
}

template <typename T>
int InteractionBackward(const void* features, const void* output_grad, void* features_grad,
                        int64_t batch, int64_t num_features, int64_t dim, void* stream) {
  return static_cast<int>(sok::DotInteractionBackwardGpu(
      sok::InteractionShape{batch, num_features, dim}, static_cast<const T*>(features),
      static_cast<const T*>(output_grad), static_cast<T*>(features_grad),
      static_cast<cudaStream_t>(stream)));
}

}  // namespace

extern "C" {

// The float16 twins hold IEEE half values (torch.float16) in features, outputs and gradients.
int sok_dot_interaction_forward(const float* features, float* output, int64_t batch,
                                int64_t num_features, int64_t dim, void* stream) {
  return InteractionForward<float>(features, output, batch, num_features, dim, stream);
}
int sok_dot_interaction_forward_f16(const void* features, void* output, int64_t batch,
                                    int64_t num_features, int64_t dim, void* stream) {
  return InteractionForward<__half>(features, output, batch, num_features, dim, stream);
}

int sok_dot_interaction_backward(const float* features, const float* output_grad,
                                 float* features_grad, int64_t batch, int64_t num_features,
                                 int64_t dim, void* stream) {
  return InteractionBackward<float>(features, output_grad, features_grad, batch, num_features,
                                    dim, stream);
}
int sok_dot_interaction_backward_f16(const void* features, const void* output_grad,
                                     void* features_grad, int64_t batch, int64_t num_features,
                                     int64_t dim, void* stream) {
  return InteractionBackward<__half>(features, output_grad, features_grad, batch, num_features,
                                     dim, stream);
}

}  // extern "C"

namespace {

template <typename T>
__global__ void StoreValue(T* device, T value) {
  *device = value;
}

struct SgdHyperValues {  // sgd's hyper vector, as kRuleTable lays it out
  float lr;
  float momentum;
};

// A device copy of `value` from the call's scratch, written by a kernel that takes it as its
// parameter: in stream order, with no wait (a copy from pageable memory would wait for the
// stream first, which the plugin's pinned staging never does). Null when out of memory.
template <typename T>
T* Upload(sok::StreamScratch* scratch, const T& value, cudaStream_t stream) {
  T* device = nullptr;
  if (scratch->Get(1, &device) != cudaSuccess) return nullptr;
  StoreValue<<<1, 1, 0, stream>>>(device, value);
  return device;
}

// One pooled lookup of `bags` bags (offsets [bags + 1], nnz ids) from its own table, as the
// plugin's one-worker path (Sok>PoolFromTables) describes it.
sok::GpuPooledLookup PooledFromTable(const float* table, int64_t rows, const int64_t* ids,
                                     const int64_t* offsets, const float* weights, int64_t bags,
                                     int64_t nnz, int mean) {
  sok::GpuPooledLookup lookup;
  lookup.row_splits = offsets;
  lookup.batch = bags;
  lookup.weights = weights;
  lookup.weights_count = weights != nullptr ? nnz : 0;
  lookup.combiner = mean != 0 ? 1 : 0;
  lookup.ids = ids;
  lookup.ids_count = nnz;
  lookup.table = sok::GpuShard{table, rows};
  return lookup;
}

}  // namespace

extern "C" {

// The plugin's one-worker pooled lookup (Sok>PoolFromTables): `bags` bags (nnz ids in all,
// offsets [bags + 1]) from table [rows, dim] into output [bags, dim]; weights may be null;
// mean != 0 for mean. check (device, 3 int64: code, id, rows) receives the first id outside
// the table (whose bag pools it as a zero row), read once the stream has passed.
int sok_pooled_lookup_forward(const float* table, int64_t rows, int64_t dim, const int64_t* ids,
                              const int64_t* offsets, const float* weights, int64_t bags,
                              int64_t nnz, int mean, float* output, int64_t* check,
                              void* stream_handle) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  sok::GpuPooledLookup lookup = PooledFromTable(table, rows, ids, offsets, weights, bags, nnz,
                                                mean);
  lookup.output = output;
  return static_cast<int>(sok::PoolFromTablesGpu(
      {lookup}, dim, reinterpret_cast<sok::LookupCheck*>(check), stream));
}

// The plugin's backward and SGD step of that lookup (Sok>PooledGradShares, then Sok>StaticApply
// reading the output gradient in place): each use of an id takes its share of its bag's
// gradient, duplicates are summed, and each touched row moves by -lr times its sum. Ids
// outside the table are skipped (the forward's check reports them).
int sok_pooled_sgd_backward(float* table, int64_t rows, int64_t dim, const int64_t* ids,
                            const int64_t* offsets, const float* weights, int64_t bags,
                            int64_t nnz, int mean, const float* output_grad, float lr,
                            void* stream_handle) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  sok::StreamScratch scratch(stream);
  sok::GpuPooledLookup lookup = PooledFromTable(table, rows, ids, offsets, weights, bags, nnz,
                                                mean);
  if (scratch.Get(nnz, &lookup.use_rows) != cudaSuccess ||
      scratch.Get(nnz, &lookup.use_scales) != cudaSuccess) {
    return static_cast<int>(cudaErrorMemoryAllocation);
  }
  const float* hyper_device = reinterpret_cast<const float*>(
      Upload(&scratch, SgdHyperValues{lr, 0.0f}, stream));
  if (hyper_device == nullptr) return static_cast<int>(cudaErrorMemoryAllocation);
  cudaError_t status = sok::PooledGradSharesGpu({lookup}, stream);
  if (status != cudaSuccess) return static_cast<int>(status);
  sok::SparseApplyMember member;
  member.table = sok::SparseApplyTable{table, nullptr, rows, dim, 0};
  member.gradient.ids = ids;
  member.gradient.values = output_grad;
  member.gradient.n = nnz;
  member.gradient.rows = lookup.use_rows;
  member.gradient.scales = lookup.use_scales;
  member.gradient.source_rows = bags;
  const std::vector<sok::SparseApplyMember> members{member};
  const sok::SparseApplyMember* members_device = nullptr;
  if (sok::SparseApplyGroupReadsDeviceMembers("sgd", member.table, /*checked=*/false)) {
    members_device = Upload(&scratch, member, stream);
    if (members_device == nullptr) return static_cast<int>(cudaErrorMemoryAllocation);
  }
  const sok::DeviceAllocate allocate = [&scratch](size_t bytes) -> void* {
    char* p = nullptr;
    return scratch.Get(bytes, &p) == cudaSuccess ? p : nullptr;
  };
  return static_cast<int>(sok::SparseApplyGroupGpuAsync("sgd", hyper_device, 2, false, members,
                                                        members_device, allocate, nullptr,
                                                        stream));
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
  const int row_bits = sok::BitsToHold(most_rows), table_bits = sok::BitsToHold(num_tables);
  sok::SortedPartitionKeys sorted;
  if (status == cudaSuccess) {
    status = sok::SortPartitionKeys(lookups_device, num_lookups, true, total, num_workers,
                                    table_bits, row_bits, row_bits + table_bits +
                                    sok::BitsToHold(num_workers), dedup != 0, 0, allocate, check,
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
