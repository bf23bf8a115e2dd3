#include "kit_src/core/hash_table/gpu_hash_table.cuh"

#include "kit_src/core/cuda_scratch.cuh"

#include <algorithm>

namespace sok {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n) { return GridBlocks(n, kThreads); }

__device__ __forceinline__ uint64_t Mix(uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__device__ __forceinline__ int64_t LoadKey(const int64_t* slot) {
  return *reinterpret_cast<const volatile int64_t*>(slot);
}

// The slot holding key, or -1 (every probe ends at an empty slot: the load is bounded).
__device__ int64_t FindSlot(const GpuHashTable& t, int64_t key) {
  const int64_t mask = t.capacity - 1;
  int64_t p = static_cast<int64_t>(Mix(static_cast<uint64_t>(key)) & mask);
  for (int64_t step = 0; step < t.capacity; ++step, p = (p + 1) & mask) {
    const int64_t k = LoadKey(t.keys + p);
    if (k == key) return p;
    if (k == kEmptyKey) return -1;
  }
  return -1;
}

// Find, fused: each warp takes 32 keys, every lane probes for one, then the warp copies the
// 32 rows together (coalesced), the slots handed round by shuffles instead of through memory.
template <typename V>
__global__ void FindRows(GpuHashTable t, const int64_t* keys, int64_t n, int64_t width, V* out,
                         uint8_t* found) {
  const V* values = reinterpret_cast<const V*>(t.values);
  const int lane = threadIdx.x & 31;
  const int64_t warp = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5;
  const int64_t warps = (int64_t{gridDim.x} * blockDim.x) >> 5;
  for (int64_t base = warp * 32; base < n; base += warps * 32) {
    const int64_t i = base + lane;
    int64_t slot = -1;
    if (i < n) {
      const int64_t key = keys[i];
      if (key != kEmptyKey && key != kErasedKey) slot = FindSlot(t, key);
      if (found) found[i] = slot >= 0;
    }
    const int64_t total = min(int64_t{32}, n - base) * width;
    for (int64_t e0 = 0; e0 < total; e0 += 32) {
      const int64_t e = e0 + lane;
      const int r = static_cast<int>(min(e, total - 1) / width);
      const int64_t row_slot = __shfl_sync(0xffffffffu, slot, r);
      if (e < total) {
        const int64_t column = e - r * width;
        out[(base + r) * width + column] = row_slot < 0 ? V{} : values[row_slot * width + column];
      }
    }
  }
}

// Claims a slot for every key (present: its slot; absent: the first empty slot of its probe
// sequence, taken with atomicCAS). inserted[i] = 1 where this call created the key.
__global__ void ClaimSlots(GpuHashTable t, const int64_t* keys, int64_t n, int64_t* slots,
                          uint8_t* inserted) {
  const int64_t mask = t.capacity - 1;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t key = keys[i];
    int64_t p = static_cast<int64_t>(Mix(static_cast<uint64_t>(key)) & mask), slot = -1;
    uint8_t created = 0;
    for (int64_t step = 0; step < t.capacity && slot < 0; ++step, p = (p + 1) & mask) {
      int64_t k = LoadKey(t.keys + p);
      if (k == kEmptyKey) {
        k = static_cast<int64_t>(atomicCAS(reinterpret_cast<unsigned long long*>(t.keys + p),
                                           static_cast<unsigned long long>(kEmptyKey),
                                           static_cast<unsigned long long>(key)));
        if (k == kEmptyKey) {
          slot = p;
          created = 1;
          break;
        }
      }
      if (k == key) slot = p;
    }
    slots[i] = slot;
    inserted[i] = created;
    // One atomic per warp, not per new key: the two counters are single addresses that a
    // million inserts would otherwise queue on.
    const unsigned active = __activemask();
    const unsigned creators = __ballot_sync(active, created);
    if (creators != 0 && (threadIdx.x & 31) == __ffs(active) - 1) {
      atomicAdd(reinterpret_cast<unsigned long long*>(t.counters), __popc(creators));
      atomicAdd(reinterpret_cast<unsigned long long*>(t.counters + 1), __popc(creators));
    }
  }
}

// Row copies, one thread per element (a float4 of 4 when rows allow): rows of `slots`
// (negative: zeros) into out.
template <typename V>
__global__ void GatherRows(const V* values, int64_t width, const int64_t* slots, int64_t n,
                           V* out) {
  const int64_t total = n * width;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e / width, slot = slots[i];
    out[e] = slot < 0 ? V{} : values[slot * width + (e - i * width)];
  }
}

// New rows start at zero (values_in null) or take values_in (every key's row).
template <typename V>
__global__ void WriteRows(V* values, int64_t width, const int64_t* slots,
                          const uint8_t* inserted, const V* values_in, int64_t n) {
  const int64_t total = n * width;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e / width;
    if (values_in != nullptr) {
      values[slots[i] * width + (e - i * width)] = values_in[e];
    } else if (inserted[i]) {
      values[slots[i] * width + (e - i * width)] = V{};
    }
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Launches kernel<float4> on rows as float4s when dim and every pointer allow, else <float>.
void LaunchGather(const GpuHashTable& t, const int64_t* slots, int64_t n, float* out,
                  cudaStream_t stream) {
  if (t.dim % 4 == 0 && Aligned16(t.values) && Aligned16(out)) {
    const int64_t width = t.dim / 4;
    GatherRows<<<Blocks(n * width), kThreads, 0, stream>>>(
        reinterpret_cast<const float4*>(t.values), width, slots, n, reinterpret_cast<float4*>(out));
  } else {
    GatherRows<<<Blocks(n * t.dim), kThreads, 0, stream>>>(t.values, t.dim, slots, n, out);
  }
}

void LaunchWrite(const GpuHashTable& t, const int64_t* slots, const uint8_t* inserted,
                 const float* values_in, int64_t n, cudaStream_t stream) {
  if (t.dim % 4 == 0 && Aligned16(t.values) && (values_in == nullptr || Aligned16(values_in))) {
    const int64_t width = t.dim / 4;
    WriteRows<<<Blocks(n * width), kThreads, 0, stream>>>(
        reinterpret_cast<float4*>(t.values), width, slots, inserted,
        reinterpret_cast<const float4*>(values_in), n);
  } else {
    WriteRows<<<Blocks(n * t.dim), kThreads, 0, stream>>>(t.values, t.dim, slots, inserted,
                                                          values_in, n);
  }
}

__global__ void HasReservedKey(const int64_t* keys, int64_t n, int* bad) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    if (keys[i] == kEmptyKey || keys[i] == kErasedKey) *bad = 1;
  }
}

__global__ void EraseKeys(GpuHashTable t, const int64_t* keys, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t key = keys[i];
    if (key == kEmptyKey || key == kErasedKey) continue;
    const int64_t slot = FindSlot(t, key);
    if (slot < 0) continue;
    const unsigned long long prev =
        atomicCAS(reinterpret_cast<unsigned long long*>(t.keys + slot),
                  static_cast<unsigned long long>(key), static_cast<unsigned long long>(kErasedKey));
    if (prev == static_cast<unsigned long long>(key)) {
      atomicAdd(reinterpret_cast<unsigned long long*>(t.counters), ~0ull);  // live - 1
    }
  }
}

}  // namespace

cudaError_t GpuTableFind(const GpuHashTable& table, const int64_t* keys, int64_t n, float* out,
                         uint8_t* found, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int blocks = Blocks(n);
  if (table.dim % 4 == 0 && Aligned16(table.values) && Aligned16(out)) {
    FindRows<<<blocks, kThreads, 0, stream>>>(table, keys, n, table.dim / 4,
                                              reinterpret_cast<float4*>(out), found);
  } else {
    FindRows<<<blocks, kThreads, 0, stream>>>(table, keys, n, table.dim, out, found);
  }
  return cudaGetLastError();
}

cudaError_t GpuTableUpsert(const GpuHashTable& table, const int64_t* keys, int64_t n,
                           const float* values_in, float* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  StreamScratch scratch(stream);
  int64_t* slots = nullptr;
  uint8_t* inserted = nullptr;
  int* bad = nullptr;
  cudaError_t status = scratch.Get(n, &slots);
  if (status == cudaSuccess) status = scratch.Get(n, &inserted);
  if (status == cudaSuccess) status = scratch.Get(1, &bad);
  if (status != cudaSuccess) return status;
  cudaMemsetAsync(bad, 0, sizeof(int), stream);
  HasReservedKey<<<Blocks(n), kThreads, 0, stream>>>(keys, n, bad);
  int host_bad = 0;
  int64_t used[2] = {0, 0};
  cudaMemcpyAsync(&host_bad, bad, sizeof(int), cudaMemcpyDeviceToHost, stream);
  cudaMemcpyAsync(used, table.counters, sizeof(used), cudaMemcpyDeviceToHost, stream);
  status = cudaStreamSynchronize(stream);
  const bool refuse = host_bad != 0 ||
      static_cast<double>(used[1] + n) > static_cast<double>(table.max_load) * table.capacity;
  if (status == cudaSuccess && !refuse) {
    ClaimSlots<<<Blocks(n), kThreads, 0, stream>>>(table, keys, n, slots, inserted);
    LaunchWrite(table, slots, inserted, values_in, n, stream);
    if (out != nullptr) LaunchGather(table, slots, n, out, stream);
    status = cudaGetLastError();
  }
  if (status != cudaSuccess) return status;
  return refuse ? cudaErrorInvalidValue : cudaSuccess;
}

cudaError_t GpuTableErase(const GpuHashTable& table, const int64_t* keys, int64_t n,
                          cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  EraseKeys<<<Blocks(n), kThreads, 0, stream>>>(table, keys, n);
  return cudaGetLastError();
}

}  // namespace sok
