// A GPU hash table of int64 keys and float rows in device memory: open addressing with
// linear probing over a power-of-two slot array, one thread probing per key (a slot's key is
// claimed with one atomicCAS), rows copied by a separate kernel so the copies are coalesced.
// Two key values are reserved for slot states and refused as keys: kEmptyKey and kErasedKey.
// Erased slots stay tombstones (probing passes them, inserts do not reuse them) until the
// table is rebuilt by its owner; `used` counts live and erased slots.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace sok {

constexpr int64_t kEmptyKey = INT64_MIN;
constexpr int64_t kErasedKey = INT64_MIN + 1;

struct GpuHashTable {
  int64_t* keys = nullptr;       // [capacity], every slot kEmptyKey when new
  float* values = nullptr;       // [capacity, dim]
  int64_t* counters = nullptr;   // [2] device: live keys, used slots (live + erased)
  int64_t capacity = 0;          // a power of two
  int64_t dim = 0;
  float max_load = 0.75f;        // inserts that could push used slots past this are refused
};

// out[i] = row of keys[i], zeros when absent; found[i] (if not null) = 1 when present.
cudaError_t GpuTableFind(const GpuHashTable& table, const int64_t* keys, int64_t n, float* out,
                         uint8_t* found, cudaStream_t stream);

// out[i] = row of keys[i]; absent keys are inserted with zero rows first (find-or-insert).
// values_in (if not null) [n, dim] is written to every key's row instead (insert-or-assign;
// its keys must be distinct, as HierarchicalKV asks too); out may be null.
// Refuses with cudaErrorInvalidValue, before any write, a reserved key or a call whose keys,
// were all new, would push the used slots past max_load * capacity (one synchronisation of
// `stream` reads the counters).
cudaError_t GpuTableUpsert(const GpuHashTable& table, const int64_t* keys, int64_t n,
                           const float* values_in, float* out, cudaStream_t stream);

// Removes the present keys among keys[0, n).
cudaError_t GpuTableErase(const GpuHashTable& table, const int64_t* keys, int64_t n,
                          cudaStream_t stream);

}  // namespace sok
