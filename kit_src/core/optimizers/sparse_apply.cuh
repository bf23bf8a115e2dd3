// GPU lazy optimizer update of the touched rows of a group of tables: the gradients of
// duplicate ids are summed (all the group's uses radix-sorted with CUB by (table, row), stably,
// their runs numbered by a scan of head flags), then every touched row and its state take one
// step of the rule (kit_src/core/optimizers/update_rules.h): a warp a row of float4s, the
// row's gradients summed in its registers (a hot row's many uses summed by many blocks
// first), or one thread per element after a separate sum for other widths. Plain
// SGD, linear in the gradient, skips the global sort: each block sorts a tile of a table's
// uses in shared memory and adds each run's summed step atomically (float4 rows), or each use
// is subtracted by an atomic add (other widths). Rows no id names do not change.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kit_src/core/embedding/lookup_gpu.cuh"

namespace sok {

struct SparseApplyTable {
  float* values = nullptr;  // [rows, dim], device memory
  float* state = nullptr;   // [rows, state_dim] laid out as the rule reads it, or null
  int64_t rows = 0;
  int64_t dim = 0;
  int64_t state_dim = 0;    // 0, dim, 2 dim or 3 dim floats per row, as the rule needs
  // Instead of `state`, the state as separate [rows, dim] arrays (a static table's Keras slot
  // variables), section after section as the rule reads them; num_slots * dim = state_dim.
  float* slots[3] = {nullptr, nullptr, nullptr};
  int num_slots = 0;
};

struct SparseGradient {
  const int64_t* ids = nullptr;  // [n] rows, duplicates allowed
  const float* values = nullptr; // [n, dim], or [source_rows, dim] with rows
  int64_t n = 0;
  // Optional: use i's gradient is scales[i] * values row rows[i] (a pooled lookup's output
  // gradient read in place); a row outside [0, source_rows) reads as zeros.
  const int64_t* rows = nullptr;  // [n]
  const float* scales = nullptr;  // [n]
  int64_t source_rows = 0;
};

// hyper: host floats as Sok>DynamicApply takes them for `rule`. Returns cudaErrorInvalidValue,
// before any write, on an unknown rule, a wrong hyper count, a state_dim the rule does not
// fit or an id outside [0, rows); otherwise the CUDA status. Synchronises `stream` once (the
// id check).
cudaError_t SparseApplyGpu(const std::string& rule, const float* hyper, int64_t hyper_count,
                           bool nesterov, const SparseApplyTable& table,
                           const SparseGradient& gradient, cudaStream_t stream);

}  // namespace sok

namespace sok {

// One table of a group updated together: its rows, its gradients, and where its uses start
// among the group's (members laid end to end, in order).
struct SparseApplyMember {
  SparseApplyTable table;
  SparseGradient gradient;
  int64_t first_use = 0;
};

// SparseApplyGpu for a group of tables of one width and one state layout, without
// synchronising, for TensorFlow's kernels: one sort of all the group's uses keyed by (table,
// row), one sum and one apply (a per-table update would pay a dozen launches a table).
// `members` on the host (sizes, launches) and `members_device` (the same, in device memory, for
// the kernels); the hyper-parameters in device memory (the kernels read them: no copy to the
// host, no wait). The ids are checked on the device, the first bad one recorded in `check`
// (kBadId, group = its member, item = its index, value_a = the id) and then nothing is written.
// A null `check`: the caller has checked the ids (rows outside a table are skipped, never
// written). Host-side argument errors (an unknown rule, a wrong hyper count, a state layout
// the rule does not fit, members of different widths or layouts) return
// cudaErrorInvalidValue before anything is enqueued; values needing more state than the
// tables hold (an SGD or RMSprop momentum without its slot) write nothing.
// Whether SparseApplyGroupGpuAsync reads `members_device` (a null pointer does otherwise):
// plain SGD without state updates each table from the host's copy unless ids are checked.
bool SparseApplyGroupReadsDeviceMembers(const std::string& rule, const SparseApplyTable& shape,
                                        bool checked);

cudaError_t SparseApplyGroupGpuAsync(const std::string& rule, const float* hyper_device,
                                     int64_t hyper_count, bool nesterov,
                                     const std::vector<SparseApplyMember>& members,
                                     const SparseApplyMember* members_device,
                                     const DeviceAllocate& allocate, LookupCheck* check,
                                     cudaStream_t stream);

}  // namespace sok
