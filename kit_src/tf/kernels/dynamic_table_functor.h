// The device work of the dynamic table ops (TensorFlow's gather_functor.h pattern): the
// OpKernels in dynamic_table_kernels.cc validate and allocate once for both devices and call
// the table through its interface; what differs by device is here, the CPU specialisations
// inline below, the GPU ones in dynamic_table_functor_gpu.cu.cc.
#pragma once

#include <algorithm>
#include <memory>
#include <type_traits>
#include <vector>

#include "kit_src/core/embedding/key_partition.h"
#include "kit_src/core/hash_table/cpu_hash_table.h"
#include "kit_src/core/hash_table/dynamic_table.h"
#include "kit_src/core/hash_table/tiered_table.h"
#include "kit_src/tf/kernels/core_bridge.h"
#include "kit_src/tf/kernels/device_tags.h"
#include "kit_src/tf/kernels/dynamic_table_validation.h"
#include "kit_src/tf/kernels/pooled_output.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace sok {

// The pairs ([n, 2] (table, key)) of a call grouped by table, in the device's memory.
struct PairGroups {
  std::vector<int64_t> counts;  // host: pairs naming each table
  int32_t* order = nullptr;     // [n] the pairs table by table, stably
};

namespace functor {

// Makes the device's table.
template <typename Device>
struct NewDynamicTable {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* ctx,
                                  const HashTableOptions& options,
                                  const RowInitializer& initializer,
                                  std::shared_ptr<DynamicTable>* table);
};

// The memory of a tiered table's hot tier on the device (host memory on the CPU).
template <typename Device>
struct NewTierMemory {
  std::unique_ptr<TierMemory> operator()(::tensorflow::OpKernelContext* ctx);
};

// The context a table call runs in: TensorFlow's stream, or its CPU thread pool.
template <typename Device>
struct TableContextOf {
  TableContext operator()(::tensorflow::OpKernelContext* ctx);
};

// Groups `pairs` ([n, 2]) by table into `groups` (order from `order_memory`, an int32 [n]
// tensor the op allocated); fails naming the first pair that names no table. The GPU waits
// for the stream once: the counts size the caller's outputs.
template <typename Device>
struct GroupPairs {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* ctx, const int64_t* pairs,
                                  int64_t n, int32_t num_tables, ::tensorflow::Tensor* order_memory,
                                  PairGroups* groups);
};

// indices[k] = key of pair order[k], values row k = grad row order[k] ([n, dim]).
template <typename Device>
struct GatherPairRows {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* ctx, const int64_t* pairs,
                                  const int32_t* order, int64_t n, int64_t dim,
                                  const float* grad, int64_t* indices, float* values);
};

// Sok>DynamicGatherRows' reads: rows ([n, dim]) row i receives the row of pair i from the
// table it names (find-or-insert with `insert`, admitted with admit[t]); zeros for a pair
// naming no table.
template <typename Device>
struct ReadPairRows {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* ctx,
                                  const std::vector<DynamicTable*>& tables,
                                  const int64_t* pairs, int64_t n, int64_t dim, bool insert,
                                  const std::vector<float>& admit, float* rows);
};

// CPU: the calling thread and TensorFlow's thread pool.

template <>
struct NewDynamicTable<CpuDevice> {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext*, const HashTableOptions& options,
                                  const RowInitializer& initializer,
                                  std::shared_ptr<DynamicTable>* table) {
    *table = std::make_shared<CpuHashTable>(options, initializer);
    return ::tensorflow::Status();
  }
};

template <>
struct NewTierMemory<CpuDevice> {
  std::unique_ptr<TierMemory> operator()(::tensorflow::OpKernelContext*) {
    return NewHostTierMemory();
  }
};

template <>
struct TableContextOf<CpuDevice> {
  TableContext operator()(::tensorflow::OpKernelContext* ctx) {
    TableContext context;
    context.parallel_for = CpuParallelFor(ctx);
    return context;
  }
};

template <>
struct GroupPairs<CpuDevice> {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext*, const int64_t* pairs,
                                  int64_t n, int32_t num_tables, ::tensorflow::Tensor* order_memory,
                                  PairGroups* groups) {
    groups->counts.assign(num_tables, 0);
    groups->order = order_memory->flat<int32_t>().data();
    const int64_t bad = GroupPairsByTable(pairs, n, num_tables, groups->counts.data(),
                                          groups->order);
    if (bad < 0) return ::tensorflow::Status();
    return PairNamesNoTable(bad, pairs[2 * bad], num_tables);
  }
};

template <>
struct GatherPairRows<CpuDevice> {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext*, const int64_t* pairs,
                                  const int32_t* order, int64_t n, int64_t dim,
                                  const float* grad, int64_t* indices, float* values) {
    ::sok::GatherPairRows(pairs, order, n, dim, grad, indices, values);
    return ::tensorflow::Status();
  }
};

template <>
struct ReadPairRows<CpuDevice> {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* ctx,
                                  const std::vector<DynamicTable*>& tables,
                                  const int64_t* pairs, int64_t n, int64_t dim, bool insert,
                                  const std::vector<float>& admit, float* rows) {
    return ToTfStatus(ReadPairRowsOnHost(tables, pairs, n, dim, insert, admit,
                                         TableContextOf<CpuDevice>()(ctx), rows));
  }
};

}  // namespace functor
}  // namespace sok
