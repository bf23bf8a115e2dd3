// What the files of the GPU table (gpu_hash_table.cuh) share: the device-side counters,
// the slot layout and its probes, the row arrays and the warp-wide row copies, and the host
// helpers of its calls. Included by the gpu_table_*.cu files and gpu_hash_table.cu only.
#pragma once

#include <cub/cub.cuh>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <type_traits>

#include "kit_src/core/cuda_scratch.cuh"
#include "kit_src/core/hash_table/gpu_hash_table.cuh"
#include "kit_src/core/optimizers/rule_by_name.h"
#include "kit_src/core/optimizers/sorted_tile_sgd.cuh"
#include "kit_src/core/value_storage.cuh"

namespace sok {

struct GpuHashTable::Counters {
  unsigned long long size;        // live keys
  unsigned long long used;        // slots live or erased
  unsigned long long next_row;    // rows of the pool handed out at least once
  unsigned long long free_count;  // rows on the free list
  unsigned long long taken;       // rows the running insert took (folded in after it)
  unsigned long long inserted;    // keys the running insert stored
  unsigned long long scratch;     // a count for the host (new keys, selected rows)
};

namespace {

using Counters = GpuHashTable::Counters;
constexpr int kThreads = 256;
inline int Blocks(int64_t n) { return GridBlocks(n, kThreads); }
// A slot: the key, and the row holding it or the slot's state.
struct alignas(16) Slot {
  long long key;
  unsigned long long row;
};
constexpr unsigned long long kEmptyRow = ~0ull;         // never used: probes stop here
constexpr unsigned long long kErasedRow = ~0ull - 1;    // was used: probes pass it
constexpr unsigned long long kClaimedRow = ~0ull - 2;   // an insert is writing the key
inline int64_t MaxUsed(int64_t slots) { return static_cast<int64_t>(static_cast<double>(slots) * kMaxSlotLoad); }
__device__ __forceinline__ unsigned long long LoadRowAcquire(const Slot* slot) {
  unsigned long long row;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(row) : "l"(&slot->row) : "memory");
  return row;
}
__device__ __forceinline__ long long LoadKey(const Slot* slot) {
  return *reinterpret_cast<const volatile long long*>(&slot->key);
}
// The slot holding `key`, or -1. Stops at an empty slot (the load limit keeps some) or after
// visiting every slot. Plain loads, the key and row of a slot in one: for kernels where no
// thread claims slots.
__device__ inline int64_t FindSlot(const Slot* slots, int64_t mask, int64_t key, Slot* found = nullptr) {
  int64_t p = static_cast<int64_t>(HashKey(key) & static_cast<uint64_t>(mask));
  for (int64_t step = 0; step <= mask; ++step, p = (p + 1) & mask) {
    const Slot slot = slots[p];
    if (slot.row == kEmptyRow) return -1;
    if (slot.row < kClaimedRow && slot.key == key) {
      if (found) *found = slot;
      return p;
    }
  }
  return -1;
}
// The row holding `key`, or -1.
__device__ inline int64_t FindRow(const Slot* slots, int64_t mask, int64_t key) {
  Slot slot;
  return FindSlot(slots, mask, key, &slot) >= 0 ? static_cast<int64_t>(slot.row) : -1;
}
struct RowArrays {
  int64_t* row_keys;
  uint64_t* row_meta;
  void* values;
  float* state;
  int64_t dim;
  int64_t state_dim;
};
// Calls work(src) once for each lane `src` of the warp whose `selected` is set, one after
// another, on every lane (so that the warp's lanes can split src's row between them).
template <typename Work>
__device__ __forceinline__ void ForEachSelectedLane(bool selected, const Work& work) {
  for (unsigned pending = __ballot_sync(0xffffffffu, selected); pending != 0;
       pending &= pending - 1) {
    work(__ffs(pending) - 1);
  }
}
__device__ __forceinline__ void Touch(uint64_t* meta, EvictStrategy evict, uint64_t clock) {
  if (evict == EvictStrategy::kLfu) {
    if (((*meta >> kScoreShift) & kMaxScore) < kMaxScore) {
      atomicAdd(reinterpret_cast<unsigned long long*>(meta), 1ull << kScoreShift);
    }
  } else if (evict == EvictStrategy::kLru) {
    const uint64_t seen = *meta;
    const uint64_t touched =
        (seen & ~kScoreBits) | ((clock < kMaxScore ? clock : kMaxScore) << kScoreShift);
    // All uses of a key in one call write the same value: only a use that sees another
    // value writes (a power-law key's thousands of writes to one word serialise).
    if (touched != seen) *meta = touched;
  }
}
// Whether WriteRows copies float4s: float rows, and every width a multiple of 4.
inline bool WriteVector(ValueType type, int64_t dim, int64_t state_cols, int64_t state_dim) {
  return type == ValueType::kFloat32 && dim % 4 == 0 &&
         (state_cols == 0 || (state_cols % 4 == 0 && state_dim % 4 == 0));
}
// WriteRows' lanes per key: one element (a float4 when vector) a lane of the wider part.
inline int WriteLanes(bool vector, int64_t dim, int64_t state_cols) {
  const int64_t width = std::max(dim, state_cols);
  return RowLanes(vector ? width / 4 : width);
}
// Rows a lane group copies at once: every load is issued before the first store, so a warp
// keeps several rows in flight (a row at a time, the copy waited on each row's latency).
// -DSOK_ROWS_IN_FLIGHT=N builds another count for measuring: 8 was no faster than 4 (G4).
#ifndef SOK_ROWS_IN_FLIGHT
#define SOK_ROWS_IN_FLIGHT 4
#endif
constexpr int kRowsInFlight = SOK_ROWS_IN_FLIGHT;
constexpr int64_t kNoKey = -1;  // a lane past the keys, or a key of another table
// The rows a lane group copies next: row[u] and at[u] of the warp's keys
// first + u * groups + group, u < kRowsInFlight (kNoKey past the warp's 32).
struct RowBatch {
  int64_t row[kRowsInFlight];
  int64_t at[kRowsInFlight];
};
// A warp's lanes in groups of `lanes` (dividing 32), and the warps of the grid: the row
// kernels take 32 keys a warp and copy their rows a group of lanes per row.
struct WarpLanes {
  int warp_lane, lane, group, groups;
  int64_t warp, warps;
};
__device__ __forceinline__ WarpLanes SplitWarps(int lanes) {
  const int warp_lane = threadIdx.x % 32;
  return {warp_lane, warp_lane % lanes, warp_lane / lanes, 32 / lanes,
          (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32,
          int64_t{gridDim.x} * blockDim.x / 32};
}
// A write of the row at `now` (its write stamp).
__device__ __forceinline__ void StampRow(uint64_t* meta, uint32_t now) {
  const uint64_t seen = *meta;
  const uint64_t stamped = (seen & ~kStampBits) | now;
  if (stamped != seen) *meta = stamped;  // as Touch: a hot row's uses write it once
}
// Hands each lane group its next rows from the lanes that resolved them.
__device__ __forceinline__ RowBatch ShareRows(int64_t own_row, int64_t base, int first,
                                              int groups, int group) {
  RowBatch batch;
#pragma unroll
  for (int u = 0; u < kRowsInFlight; ++u) {
    const int src = first + u * groups + group;
    batch.row[u] = __shfl_sync(0xffffffffu, own_row, src & 31);
    if (first + u * groups >= 32) batch.row[u] = kNoKey;  // the same on every lane
    batch.at[u] = base + src;
  }
  return batch;
}
// The optimizer step without sorting: the rows' own index dedups the gradient. Each use of a
// row counts itself in the row's claim; the use that counts first becomes the row's head.
// For a row used more than once the head's row of `summed` accumulates every use's gradient
// (atomics), then one lane group per head (or only use) applies the rule to the row (from
// its own gradient when it is the only use) and frees the claim. A claim's two words share
// one 8-byte cell: one memory sector per row for the count, the head and the release.
struct alignas(8) RowClaim {
  int32_t head;  // the use that counted first (set by it)
  int32_t uses;  // 0 between updates
};
inline Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return Status::Ok();
  return Status::Internal(std::string("CUDA error in the dynamic table's ") + what + ": " +
                          cudaGetErrorString(error));
}
inline cudaStream_t StreamOf(const TableContext& context) {
  return static_cast<cudaStream_t>(context.stream);
}
// Allocates `count` T through memory, or fails naming what.
template <typename T>
inline Status AllocateArray(GpuMemory* memory, int64_t count, T** out, const char* what) {
  void* p = memory->Allocate(std::max<size_t>(static_cast<size_t>(count) * sizeof(T), 1));
  if (p == nullptr) {
    return Status::ResourceExhausted("out of GPU memory for the dynamic table's " +
                                     std::string(what) + " (" +
                                     std::to_string(count * sizeof(T)) + " bytes)");
  }
  *out = static_cast<T*>(p);
  return Status::Ok();
}

}  // namespace

// Scratch of one call, freed (stream-ordered) by FreeScratch at its end.
template <typename T>
Status GpuHashTable::Scratch(int64_t count, T** out) {
  void* p = memory_->Allocate(std::max<size_t>(static_cast<size_t>(count) * sizeof(T), 1));
  if (p == nullptr) {
    return Status::ResourceExhausted("out of GPU memory for " + std::to_string(count * sizeof(T)) +
                                     " bytes of dynamic-table scratch");
  }
  scratch_.push_back(p);
  *out = static_cast<T*>(p);
  return Status::Ok();
}

}  // namespace sok
