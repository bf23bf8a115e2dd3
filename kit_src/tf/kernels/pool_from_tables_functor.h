// Sok>PoolFromTables', Sok>SpreadPooledGrad's and Sok>PooledGradShares' device work: the OpKernels in
// pool_from_tables_kernels.cc check the inputs, lock the tables and allocate the outputs once
// for both devices; a functor per device pools (kit_src/core/embedding/combine.h on the CPU,
// lookup_gpu.cuh on the GPU).
#pragma once

#include <vector>

#include "kit_src/core/embedding/combine.h"
#include "kit_src/core/embedding/lookup_check.h"
#include "kit_src/tf/kernels/device_tags.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace sok {
namespace functor {

template <typename Device>
struct PoolFromTables {
  // Pools lookups[l] from tables[l] into its output. The CPU fails at once on bad input and
  // writes a clean record to `check`; the GPU records it there (device memory) for
  // Sok>CheckGatheredIds, without waiting, or (check null: the ids and row splits were
  // checked on the host) checks nothing.
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* ctx,
                                  const std::vector<LookupTable<float>>& tables,
                                  const std::vector<PooledLookup<float>>& lookups, int64_t dim,
                                  LookupCheck* check);
};

template <typename Device>
struct SpreadPooledGrad {
  // id_grads[l] ([ids of lookup l, dim]) from lookups[l].output_grad.
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* ctx,
                                  const std::vector<PooledLookup<float>>& lookups,
                                  const std::vector<int64_t>& id_counts,
                                  const std::vector<float*>& id_grads, int64_t dim);
};

template <typename Device>
struct PooledGradShares {
  // use_rows[l] / use_scales[l] ([ids of lookup l]) as combine.h's PooledGradShares; each
  // lookup's share_row_first / share_row_step in row_first / row_step.
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* ctx,
                                  const std::vector<PooledLookup<float>>& lookups,
                                  const std::vector<int64_t>& id_counts,
                                  const std::vector<int64_t>& row_first,
                                  const std::vector<int64_t>& row_step,
                                  const std::vector<int64_t*>& use_rows,
                                  const std::vector<float*>& use_scales);
};

}  // namespace functor
}  // namespace sok
