#include "kit_src/core/hash_table/gpu_hash_table.cuh"

#include <cub/cub.cuh>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <chrono>
#include <type_traits>

#include "kit_src/core/cuda_scratch.cuh"
#include "kit_src/core/optimizers/sorted_tile_sgd.cuh"
#include "kit_src/core/optimizers/rule_by_name.h"
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

int Blocks(int64_t n) { return GridBlocks(n, kThreads); }

// A slot: the key, and the row holding it or the slot's state.
struct alignas(16) Slot {
  long long key;
  unsigned long long row;
};
constexpr unsigned long long kEmptyRow = ~0ull;         // never used: probes stop here
constexpr unsigned long long kErasedRow = ~0ull - 1;    // was used: probes pass it
constexpr unsigned long long kClaimedRow = ~0ull - 2;   // an insert is writing the key

int64_t MaxUsed(int64_t slots) { return static_cast<int64_t>(static_cast<double>(slots) * kMaxSlotLoad); }

__device__ __forceinline__ unsigned long long LoadRowAcquire(const Slot* slot) {
  unsigned long long row;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(row) : "l"(&slot->row) : "memory");
  return row;
}
__device__ __forceinline__ long long LoadKey(const Slot* slot) {
  return *reinterpret_cast<const volatile long long*>(&slot->key);
}

__device__ __forceinline__ bool KeyAt(const TableKeys& keys, int64_t i, int64_t* key) {
  if (keys.stride == 1) {
    *key = keys.data[i];
    return true;
  }
  if (keys.data[2 * i] != keys.table) return false;
  *key = keys.data[2 * i + 1];
  return true;
}

// The slot holding `key`, or -1. Stops at an empty slot (the load limit keeps some) or after
// visiting every slot. Plain loads, the key and row of a slot in one: for kernels where no
// thread claims slots.
__device__ int64_t FindSlot(const Slot* slots, int64_t mask, int64_t key, Slot* found = nullptr) {
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
__device__ int64_t FindRow(const Slot* slots, int64_t mask, int64_t key) {
  Slot slot;
  return FindSlot(slots, mask, key, &slot) >= 0 ? static_cast<int64_t>(slot.row) : -1;
}

// What an insert kernel needs of the pool: rows come from the free list first, then fresh
// ones; a row past the pool (only if a reservation was wrong) is refused, never written.
struct RowSource {
  const int64_t* free_rows;
  int64_t free_count;   // at the kernel's start: inserts take, nothing returns rows meanwhile
  int64_t next_row;
  int64_t capacity;
};

// Find-or-insert of one key: its row, or -1 when missing and not admitted (or refused).
// Keys of one call may repeat: a slot being claimed is waited for (its claimer publishes
// it right after writing the key), so a key is stored once.
__device__ int64_t FindOrClaim(Slot* slots, int64_t mask, int64_t key, bool admit,
                               Counters* counters, const RowSource& source, int64_t* row_keys,
                               uint64_t* row_meta, uint32_t now, bool* inserted) {
  int64_t p = static_cast<int64_t>(HashKey(key) & static_cast<uint64_t>(mask));
  for (int64_t step = 0; step <= mask;) {
    unsigned long long row = LoadRowAcquire(slots + p);
    while (row == kClaimedRow) row = LoadRowAcquire(slots + p);
    if (row == kEmptyRow) {
      if (!admit) return -1;
      if (atomicCAS(&slots[p].row, kEmptyRow, kClaimedRow) != kEmptyRow) continue;  // look again
      *reinterpret_cast<volatile long long*>(&slots[p].key) = key;
      const int64_t i = static_cast<int64_t>(atomicAdd(&counters->taken, 1ull));
      const int64_t r = i < source.free_count ? source.free_rows[source.free_count - 1 - i]
                                              : source.next_row + (i - source.free_count);
      if (r >= source.capacity) {
        __threadfence();
        atomicExch(&slots[p].row, kErasedRow);
        return -1;
      }
      row_keys[r] = key;
      row_meta[r] = kRowLive | now;
      atomicAdd(&counters->inserted, 1ull);
      __threadfence();  // the key before the row that publishes it
      atomicExch(&slots[p].row, static_cast<unsigned long long>(r));
      *inserted = true;
      return r;
    }
    if (row != kErasedRow && LoadKey(slots + p) == key) return static_cast<int64_t>(row);
    p = (p + 1) & mask;
    ++step;
  }
  return -1;
}

struct ProbeArgs {
  Slot* slots;
  int64_t mask;
  Counters* counters;
  const int64_t* free_rows;
  int64_t capacity;
  int64_t* row_keys;
  uint64_t* row_meta;
  float admit_probability;
  uint64_t clock;
  uint32_t now;
  int64_t missing_row;  // the row a missing key reads
};

// rows[i] = key i's row (missing_row when missing), fresh[i] = 1 when this call stored it.
__global__ void ProbeKernel(TableKeys keys, bool insert, ProbeArgs a, int64_t* rows,
                            uint8_t* fresh) {
  RowSource source{a.free_rows, 0, 0, a.capacity};
  if (insert) {
    source.free_count = static_cast<int64_t>(a.counters->free_count);
    source.next_row = static_cast<int64_t>(a.counters->next_row);
  }
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < keys.n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t key;
    if (!KeyAt(keys, i, &key)) continue;
    bool inserted = false;
    int64_t row = -1;
    if (insert) {
      row = FindOrClaim(a.slots, a.mask, key, AdmitKey(key, a.clock, a.admit_probability),
                        a.counters, source, a.row_keys, a.row_meta, a.now, &inserted);
    } else {
      row = FindRow(a.slots, a.mask, key);
    }
    rows[i] = row < 0 ? a.missing_row : row;
    if (fresh) fresh[i] = inserted;
  }
}

// After an insert: the rows it took leave the free list first, then the fresh end.
__global__ void FoldTaken(Counters* c, int64_t capacity) {
  const unsigned long long taken = c->taken;
  const unsigned long long from_free = min(taken, c->free_count);
  c->free_count -= from_free;
  c->next_row = min(c->next_row + (taken - from_free), static_cast<unsigned long long>(capacity));
  c->size += c->inserted;
  c->used += taken;
  c->taken = 0;
  c->inserted = 0;
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

// The fresh rows' initial values and state (the first dim floats of state `initial`, the
// rest zero). A warp takes 32 keys, ballots the fresh ones and writes their rows one after
// another across its lanes: a lookup that inserts nothing reads one byte a key.
template <typename T>
__global__ void InitFreshRows(TableKeys keys, const int64_t* rows, const uint8_t* fresh,
                              RowArrays t, InitKind kind, float init_a, float init_b,
                              uint64_t seed, float initial, bool initial_values) {
  const int64_t width = max(initial_values ? t.dim : 0, t.state_dim);
  T* values = static_cast<T*>(t.values);
  const int lane = threadIdx.x % 32;
  const int64_t warp = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int64_t warps = int64_t{gridDim.x} * blockDim.x / 32;
  // The loop's bound depends on the warp only: every lane reaches the ballot and shuffles.
  for (int64_t base = warp * 32; base < keys.n; base += warps * 32) {
    const int64_t i = base + lane;
    int64_t key = 0;
    const bool mine = i < keys.n && fresh[i] && KeyAt(keys, i, &key);
    const int64_t own_row = mine ? rows[i] : 0;
    ForEachSelectedLane(mine, [&](int src) {
      const int64_t k = __shfl_sync(0xffffffffu, key, src);
      const int64_t r = __shfl_sync(0xffffffffu, own_row, src);
      for (int64_t d = lane; d < width; d += 32) {
        if (initial_values && d < t.dim) {
          values[r * t.dim + d] = Narrow<T>(InitialValue(kind, init_a, init_b, seed, k, d));
        }
        if (d < t.state_dim) t.state[r * t.state_dim + d] = d < t.dim ? initial : 0.0f;
      }
    });
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
bool WriteVector(ValueType type, int64_t dim, int64_t state_cols, int64_t state_dim) {
  return type == ValueType::kFloat32 && dim % 4 == 0 &&
         (state_cols == 0 || (state_cols % 4 == 0 && state_dim % 4 == 0));
}

// WriteRows' lanes per key: one element (a float4 when vector) a lane of the wider part.
int WriteLanes(bool vector, int64_t dim, int64_t state_cols) {
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

// out row i = key i's row widened (zeros when missing). Each lane first resolves one key's
// row (with `find` it probes for it, else rows[i] holds it; 32 probes in flight a warp),
// then groups of `lanes` lanes (dividing 32) copy the warp's rows, kRowsInFlight rows a
// group at once. A use for eviction when `touch`.
template <typename T>
__global__ void ReadRows(TableKeys keys, const int64_t* rows, bool find, const Slot* slots,
                         int64_t mask, int64_t missing_row, RowArrays t, float* out, int lanes,
                         bool touch, EvictStrategy evict, uint64_t clock) {
  const T* values = static_cast<const T*>(t.values);
  const auto [warp_lane, lane, group, groups, warp, warps] = SplitWarps(lanes);
  const bool vector = std::is_same<T, float>::value && t.dim % 4 == 0;  // float4 copies
  const int64_t width = vector ? t.dim / 4 : t.dim;
  // The loop's bound depends on the warp only: every lane reaches the shuffles.
  for (int64_t base = warp * 32; base < keys.n; base += warps * 32) {
    const int64_t i = base + warp_lane;
    int64_t key = 0, r = kNoKey;
    if (i < keys.n && KeyAt(keys, i, &key)) {
      r = find ? FindRow(slots, mask, key) : rows[i];
      if (r < 0) r = missing_row;
      if (touch && r != missing_row) Touch(t.row_meta + r, evict, clock);
    }
    for (int first = 0; first < 32; first += groups * kRowsInFlight) {
      const RowBatch batch = ShareRows(r, base, first, groups, group);
      for (int64_t d = lane; d < width; d += lanes) {
        if (vector) {
          const float4* from = reinterpret_cast<const float4*>(values);
          float4 v[kRowsInFlight];
#pragma unroll
          for (int u = 0; u < kRowsInFlight; ++u) {
            const int64_t row = batch.row[u];
            v[u] = row >= 0 && row != missing_row ? from[row * width + d]
                                                  : make_float4(0.f, 0.f, 0.f, 0.f);
          }
#pragma unroll
          for (int u = 0; u < kRowsInFlight; ++u) {
            if (batch.row[u] != kNoKey) reinterpret_cast<float4*>(out)[batch.at[u] * width + d] = v[u];
          }
        } else {
          float v[kRowsInFlight];
#pragma unroll
          for (int u = 0; u < kRowsInFlight; ++u) {
            const int64_t row = batch.row[u];
            v[u] = row >= 0 && row != missing_row ? Widen(values[row * width + d]) : 0.0f;
          }
#pragma unroll
          for (int u = 0; u < kRowsInFlight; ++u) {
            if (batch.row[u] != kNoKey) out[batch.at[u] * width + d] = v[u];
          }
        }
      }
    }
  }
}

// Copies `width` elements of kRowsInFlight rows (from[at[u] * from_stride + d] to
// to[row[u] * to_stride + d]) with a group's lanes, every load before the first store;
// missing and absent rows are skipped.
template <typename From, typename To>
__device__ __forceinline__ void ScatterRows(const RowBatch& batch, int64_t missing_row,
                                            const From* from, int64_t from_stride, To* to,
                                            int64_t to_stride, int64_t width, int lane,
                                            int lanes) {
  for (int64_t d = lane; d < width; d += lanes) {
    From v[kRowsInFlight];
#pragma unroll
    for (int u = 0; u < kRowsInFlight; ++u) {
      if (batch.row[u] >= 0 && batch.row[u] != missing_row) v[u] = from[batch.at[u] * from_stride + d];
    }
#pragma unroll
    for (int u = 0; u < kRowsInFlight; ++u) {
      if (batch.row[u] >= 0 && batch.row[u] != missing_row) {
        if constexpr (std::is_same<From, To>::value) {
          to[batch.row[u] * to_stride + d] = v[u];
        } else {
          to[batch.row[u] * to_stride + d] = Narrow<To>(v[u]);
        }
      }
    }
  }
}

// Writes values ([n, dim], rounded) and state ([n, state_cols], when given) to the rows:
// each lane stamps one key's row (`now`, a use at `clock` when `touch`), then groups of
// `lanes` lanes copy the warp's rows, kRowsInFlight at once (float4 with `vector`:
// WriteVector says when).
template <typename T>
__global__ void WriteRows(const int64_t* rows, int64_t n, int64_t missing_row, RowArrays t,
                          const float* values_in, const float* state_in, int64_t state_cols,
                          uint32_t now, bool touch, EvictStrategy evict, uint64_t clock,
                          bool vector, int lanes) {
  const auto [warp_lane, lane, group, groups, warp, warps] = SplitWarps(lanes);
  for (int64_t base = warp * 32; base < n; base += warps * 32) {
    const int64_t i = base + warp_lane;
    const int64_t r = i < n ? rows[i] : kNoKey;
    if (r >= 0 && r != missing_row) {
      StampRow(t.row_meta + r, now);
      if (touch) Touch(t.row_meta + r, evict, clock);
    }
    for (int first = 0; first < 32; first += groups * kRowsInFlight) {
      const RowBatch batch = ShareRows(r, base, first, groups, group);
      if (vector) {
        ScatterRows(batch, missing_row, reinterpret_cast<const float4*>(values_in), t.dim / 4,
                    static_cast<float4*>(t.values), t.dim / 4, t.dim / 4, lane, lanes);
        if (state_in) {
          ScatterRows(batch, missing_row, reinterpret_cast<const float4*>(state_in),
                      state_cols / 4, reinterpret_cast<float4*>(t.state), t.state_dim / 4,
                      state_cols / 4, lane, lanes);
        }
      } else {
        ScatterRows(batch, missing_row, values_in, t.dim, static_cast<T*>(t.values), t.dim,
                    t.dim, lane, lanes);
        if (state_in) {
          ScatterRows(batch, missing_row, state_in, state_cols, t.state, t.state_dim,
                      state_cols, lane, lanes);
        }
      }
    }
  }
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

__global__ void ClaimRows(const int64_t* keys, int64_t n, const Slot* slots, int64_t mask,
                          int64_t* rows, RowClaim* claims) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = FindRow(slots, mask, keys[i]);
    rows[i] = r;
    if (r >= 0 && atomicAdd(&claims[r].uses, 1) == 0) claims[r].head = static_cast<int32_t>(i);
  }
}

// ClaimRows a tile of uses at a time, sorted by row in shared memory: one count a row a tile
// (a power-law key's uses, one count each, queued on its counter: 0.28 ms of G1c's step).
// Sort keys are row + 1 (0: no row), below 2^end_bit; a row's first use in the tile claims.
__global__ void __launch_bounds__(kSgdTileUses)
    ClaimRowsTiled(const int64_t* keys, int64_t n, const Slot* slots, int64_t mask,
                   int64_t* rows, RowClaim* claims, int end_bit) {
  __shared__ SgdTileStorage tile;
  for (int64_t first = blockIdx.x * int64_t{kSgdTileUses}; first < n;
       first += int64_t{gridDim.x} * kSgdTileUses) {
    const int64_t i = first + threadIdx.x;
    const int64_t r = i < n ? FindRow(slots, mask, keys[i]) : kNoKey;
    if (i < n) rows[i] = r;
    SortTile(tile, r >= 0 ? static_cast<uint32_t>(r + 1) : 0u, threadIdx.x, end_bit);
    const int t = threadIdx.x;
    const uint32_t key = tile.sorted.row[t];
    if (key == 0 || (t > 0 && tile.sorted.row[t - 1] == key)) continue;
    int count = 1;
    while (t + count < kSgdTileUses && tile.sorted.row[t + count] == key) ++count;
    if (atomicAdd(&claims[key - 1].uses, count) == 0) {
      claims[key - 1].head = static_cast<int32_t>(first + tile.sorted.use[t]);
    }
  }
}

// Each use's role, read once from the claims (coalesced by the kernels after): kNoRow (the
// key is absent), kOnlyUse (the row's one use: applied from its own gradient), or the index
// of the row's head (which applies the summed gradient).
constexpr int32_t kNoRow = -2, kOnlyUse = -1;

__global__ void ResolveUses(const int64_t* rows, const RowClaim* claims, int64_t n,
                            int32_t* head) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = rows[i];
    if (r < 0) {
      head[i] = kNoRow;
      continue;
    }
    const RowClaim claim = claims[r];
    head[i] = claim.uses == 1 ? kOnlyUse : claim.head;
  }
}

// Gradients of rows used more than once. head_pass: each head copies its gradient to
// summed; else every other use adds its gradient to its head's (atomics). A warp takes 32
// uses, ballots those with work and copies their rows one after another across its lanes.
__global__ void GatherGradients(const int32_t* head, int64_t n, int64_t dim, const float* grads,
                                float* summed, bool head_pass) {
  const int lane = threadIdx.x % 32;
  const int64_t warp = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int64_t warps = int64_t{gridDim.x} * blockDim.x / 32;
  for (int64_t base = warp * 32; base < n; base += warps * 32) {
    const int64_t i = base + lane;
    const int32_t h = i < n ? head[i] : kNoRow;
    const bool work = h >= 0 && (h == i) == head_pass;
    ForEachSelectedLane(work, [&](int src) {
      const int64_t use = base + src;
      const int64_t to = __shfl_sync(0xffffffffu, h, src);
      for (int64_t d = lane; d < dim; d += 32) {
        if (head_pass) {
          summed[use * dim + d] = grads[use * dim + d];
        } else {
          atomicAdd(summed + to * dim + d, grads[use * dim + d]);
        }
      }
    });
  }
}

// GatherGradients' second pass a tile of uses at a time, sorted by head in shared memory:
// one float4 atomic add a head a tile instead of one a use. Heads below 2^end_bit.
__global__ void __launch_bounds__(kSgdTileUses)
    AddToHeadsTiled(const int32_t* head, int64_t n, const float4* __restrict__ grads,
                    float4* summed, int64_t width, int end_bit, int lanes) {
  __shared__ SgdTileStorage tile;
  for (int64_t first = blockIdx.x * int64_t{kSgdTileUses}; first < n;
       first += int64_t{gridDim.x} * kSgdTileUses) {
    const int64_t i = first + threadIdx.x;
    const int32_t h = i < n ? head[i] : kNoRow;
    ApplySgdTile(tile, h >= 0 && h != i ? h : -1, first, grads, width, -1.0f, summed,
                 end_bit, lanes);
  }
}

// kWidth consecutive elements widened to float (4: one float4 load of float elements), and
// back.
template <int kWidth, typename Value>
__device__ __forceinline__ void LoadSlice(const Value* from, float* to) {
  if constexpr (kWidth == 4) {
    const float4 v = *reinterpret_cast<const float4*>(from);
    to[0] = v.x; to[1] = v.y; to[2] = v.z; to[3] = v.w;
  } else {
    for (int k = 0; k < kWidth; ++k) to[k] = Widen(from[k]);
  }
}
template <int kWidth, typename Value>
__device__ __forceinline__ void StoreSlice(const float* from, Value* to) {
  if constexpr (kWidth == 4) {
    *reinterpret_cast<float4*>(to) = make_float4(from[0], from[1], from[2], from[3]);
  } else {
    for (int k = 0; k < kWidth; ++k) to[k] = Narrow<Value>(from[k]);
  }
}

// One step of the rule on each claimed row (the only use or the head). Each lane takes one
// use of the warp's 32: a claiming use frees its claim and stamps its row; then groups of
// `lanes` lanes (dividing 32) update the warp's claimed rows, kRowsInFlight a group at once
// (every load before the first update), `kWidth` consecutive elements a lane (4: float4
// loads of float rows and gradients). kSections >= 0 is the table's state sections known at
// compile time (its arrays then live in registers; -1: `sections`, read at run time). The
// rule's values come from device memory; values needing more state than the rows keep (a
// momentum without its section) update nothing, the claims are freed all the same.
template <typename Value, int kWidth, typename Hyper, int kSections>
__global__ void ApplyClaimed(const int64_t* rows, const int32_t* head, RowClaim* claims,
                             int64_t n, const float* grads, const float* summed, RowArrays t,
                             int sections, const float* hyper_values, bool nesterov,
                             uint32_t now, int lanes) {
  const int num_sections = kSections >= 0 ? kSections : sections;
  const Hyper hyper = MakeHyper<Hyper>(hyper_values, nesterov);
  const bool fits = RuleStateFloats(hyper, t.dim) <= num_sections * t.dim;
  const auto [warp_lane, lane, group, groups, warp, warps] = SplitWarps(lanes);
  for (int64_t base = warp * 32; base < n; base += warps * 32) {
    const int64_t i = base + warp_lane;
    int64_t r = kNoKey;
    bool from_summed = false;  // a head: the uses' summed gradient, else its own
    if (i < n) {
      const int32_t h = head[i];
      if (h == kOnlyUse || h == i) {
        r = rows[i];
        from_summed = h != kOnlyUse;
        claims[r] = RowClaim{0, 0};
        StampRow(t.row_meta + r, now);
      }
    }
    if (!fits) continue;  // the same on every lane
    for (int first = 0; first < 32; first += groups * kRowsInFlight) {
      const RowBatch batch = ShareRows(r, base, first, groups, group);
      const float* gradient[kRowsInFlight];
#pragma unroll
      for (int u = 0; u < kRowsInFlight; ++u) {
        const bool use_summed = __shfl_sync(0xffffffffu, from_summed, (first + u * groups + group) & 31);
        gradient[u] = (use_summed ? summed : grads) + batch.at[u] * t.dim;
      }
      for (int64_t d0 = lane * kWidth; d0 < t.dim; d0 += lanes * kWidth) {
        float grad[kRowsInFlight][kWidth], w[kRowsInFlight][kWidth];
        float state[kRowsInFlight][3][kWidth];
#pragma unroll
        for (int u = 0; u < kRowsInFlight; ++u) {
          const int64_t row = batch.row[u];
          if (row < 0) continue;
          LoadSlice<kWidth>(gradient[u] + d0, grad[u]);
          LoadSlice<kWidth>(static_cast<const Value*>(t.values) + row * t.dim + d0, w[u]);
#pragma unroll
          for (int s = 0; s < num_sections; ++s) {
            LoadSlice<kWidth>(t.state + row * t.state_dim + s * t.dim + d0, state[u][s]);
          }
        }
#pragma unroll
        for (int u = 0; u < kRowsInFlight; ++u) {
          const int64_t row = batch.row[u];
          if (row < 0) continue;
#pragma unroll
          for (int k = 0; k < kWidth; ++k) {
            float element_state[3];
#pragma unroll
            for (int s = 0; s < num_sections; ++s) {
              element_state[s] = state[u][s][k];
            }
            ApplyRule(&w[u][k], element_state, &grad[u][k], 1, hyper);
#pragma unroll
            for (int s = 0; s < num_sections; ++s) {
              state[u][s][k] = element_state[s];
            }
          }
          StoreSlice<kWidth>(w[u], static_cast<Value*>(t.values) + row * t.dim + d0);
#pragma unroll
          for (int s = 0; s < num_sections; ++s) {
            StoreSlice<kWidth>(state[u][s], t.state + row * t.state_dim + s * t.dim + d0);
          }
        }
      }
    }
  }
}

// Plain SGD on a table without optimizer state is linear in the gradient: each thread of a
// block resolves one use's row and stamps it, then the block sums the tile's uses of each row
// (sorted in shared memory) and adds each sum by float4 atomics (sorted_tile_sgd.cuh), with no
// claims: Zipf-hot keys take a few adds a tile instead of one a use. hyper: [lr, momentum] in
// device memory; a momentum needs state the table does not keep, so nothing is written (as
// the claimed update, which finds no room for it).
__global__ void __launch_bounds__(kSgdTileUses)
    SortedTileSgdRows(const int64_t* keys, int64_t n, const Slot* slots, int64_t mask,
                      const float4* __restrict__ grads, RowArrays t, const float* hyper,
                      uint32_t now, int end_bit, int lanes) {
  __shared__ SgdTileStorage tile;
  if (hyper[1] != 0.0f) return;
  for (int64_t first = blockIdx.x * int64_t{kSgdTileUses}; first < n;
       first += int64_t{gridDim.x} * kSgdTileUses) {
    const int64_t i = first + threadIdx.x;
    const int64_t r = i < n ? FindRow(slots, mask, keys[i]) : kNoKey;
    if (r >= 0) StampRow(t.row_meta + r, now);
    ApplySgdTile(tile, r, first, grads, t.dim / 4, hyper[0], static_cast<float4*>(t.values),
                 end_bit, lanes);
  }
}

// Calls visit(std::integral_constant<int, sections>) for 0 <= sections <= 3.
template <typename Visit>
void VisitSections(int sections, Visit&& visit) {
  switch (sections) {
    case 0: visit(std::integral_constant<int, 0>{}); break;
    case 1: visit(std::integral_constant<int, 1>{}); break;
    case 2: visit(std::integral_constant<int, 2>{}); break;
    default: visit(std::integral_constant<int, 3>{}); break;
  }
}

// Removes the key of slot p if its row is still `row` (one of several erasers wins).
__device__ bool EraseAt(Slot* slots, int64_t p, unsigned long long row, Counters* c,
                        int64_t* free_rows, uint64_t* row_meta) {
  if (atomicCAS(&slots[p].row, row, kErasedRow) != row) return false;
  row_meta[row] = 0;
  free_rows[atomicAdd(&c->free_count, 1ull)] = static_cast<int64_t>(row);
  atomicAdd(&c->size, ~0ull);  // -1
  return true;
}

__global__ void EraseKeys(const int64_t* keys, int64_t n, Slot* slots, int64_t mask, Counters* c,
                          int64_t* free_rows, uint64_t* row_meta, unsigned long long* erased) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t p = FindSlot(slots, mask, keys[i]);
    if (p < 0) continue;
    const unsigned long long row = slots[p].row;
    if (row < kClaimedRow && EraseAt(slots, p, row, c, free_rows, row_meta)) atomicAdd(erased, 1ull);
  }
}

// The first `count` rows of `sorted_rows` (lowest scores first) are evicted.
__global__ void EvictRows(const int64_t* sorted_rows, int64_t count, const int64_t* row_keys,
                          Slot* slots, int64_t mask, Counters* c, int64_t* free_rows,
                          uint64_t* row_meta) {
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < count;
       j += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = sorted_rows[j];
    const int64_t p = FindSlot(slots, mask, row_keys[row]);
    if (p >= 0) EraseAt(slots, p, static_cast<unsigned long long>(row), c, free_rows, row_meta);
  }
}

// Eviction order: live rows by score, then free rows last.
__global__ void ScoreRows(const uint64_t* row_meta, int64_t n, uint64_t* scores, int64_t* rows) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < n;
       r += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t meta = row_meta[r];
    scores[r] = (meta & kRowLive) ? (meta & kScoreBits) >> kScoreShift : ~0ull;
    rows[r] = r;
  }
}

// Re-inserts every live row's key into an empty slot array.
__global__ void Reinsert(const int64_t* row_keys, const uint64_t* row_meta, int64_t n,
                         Slot* slots, int64_t mask) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < n;
       r += int64_t{gridDim.x} * blockDim.x) {
    if (!(row_meta[r] & kRowLive)) continue;
    int64_t p = static_cast<int64_t>(HashKey(row_keys[r]) & static_cast<uint64_t>(mask));
    while (atomicCAS(&slots[p].row, kEmptyRow, kClaimedRow) != kEmptyRow) p = (p + 1) & mask;
    slots[p].key = row_keys[r];
    slots[p].row = static_cast<unsigned long long>(r);
  }
}

__global__ void SetUsedToSize(Counters* c) { c->used = c->size; }

// scratch = how many of the selected keys are missing and admitted, counting each once:
// candidates gathered first, then (after sorting) the heads of their runs.
__global__ void MissingCandidates(TableKeys keys, const Slot* slots, int64_t mask, float admit,
                                  uint64_t clock, int64_t* out, Counters* c) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < keys.n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t key;
    if (!KeyAt(keys, i, &key)) continue;
    if (FindSlot(slots, mask, key) < 0 && AdmitKey(key, clock, admit)) {
      out[atomicAdd(&c->scratch, 1ull)] = key;
    }
  }
}
__global__ void CountRunHeads(const int64_t* sorted, int64_t n, Counters* c) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    if (i == 0 || sorted[i] != sorted[i - 1]) atomicAdd(&c->scratch, 1ull);
  }
}

__global__ void ExportFlags(const uint64_t* row_meta, int64_t n, bool all, uint32_t since,
                            uint8_t* flags) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < n;
       r += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t meta = row_meta[r];
    flags[r] = (meta & kRowLive) && (all || static_cast<uint32_t>(meta & kStampBits) >= since);
  }
}

template <typename T>
__global__ void ExportRows(const int64_t* selected, int64_t n, RowArrays t, int64_t* keys,
                           float* values, float* state) {
  const int64_t width = max(t.dim, state ? t.state_dim : 0);
  const T* stored = static_cast<const T*>(t.values);
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n * width;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = e / width, d = e - j * width, r = selected[j];
    if (d == 0) keys[j] = t.row_keys[r];
    if (d < t.dim) values[j * t.dim + d] = Widen(stored[r * t.dim + d]);
    if (state && d < t.state_dim) state[j * t.state_dim + d] = t.state[r * t.state_dim + d];
  }
}

__global__ void FillState(float* state, int64_t rows, int64_t dim, int64_t state_dim,
                          float initial) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < rows * state_dim;
       e += int64_t{gridDim.x} * blockDim.x) {
    state[e] = e % state_dim < dim ? initial : 0.0f;
  }
}

__global__ void CopySize(const Counters* c, int64_t* out) {
  *out = static_cast<int64_t>(c->size);
}

Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return Status::Ok();
  return Status::Internal(std::string("CUDA error in the dynamic table's ") + what + ": " +
                          cudaGetErrorString(error));
}

cudaStream_t StreamOf(const TableContext& context) {
  return static_cast<cudaStream_t>(context.stream);
}

}  // namespace

GpuHashTable::GpuHashTable(const HashTableOptions& options, const RowInitializer& initializer,
                           GpuMemory* memory)
    : options_(options), initializer_(initializer), memory_(memory), created_us_(NowMicros()) {}

GpuHashTable::~GpuHashTable() {
  for (Snapshot& snapshot : snapshots_) {
    if (snapshot.taken) cudaEventDestroy(snapshot.taken);
    if (snapshot.host) cudaFreeHost(snapshot.host);
  }
  for (void* p : {static_cast<void*>(counters_), slots_, static_cast<void*>(row_keys_),
                  static_cast<void*>(row_meta_), values_, static_cast<void*>(state_),
                  static_cast<void*>(free_rows_), static_cast<void*>(row_claims_)}) {
    if (p) memory_->Free(p);
  }
}

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

void GpuHashTable::FreeScratch() {
  for (void* p : scratch_) memory_->Free(p);
  scratch_.clear();
}

uint32_t GpuHashTable::StampAt(int64_t time_us) const { return WriteStampAt(created_us_, time_us); }
uint32_t GpuHashTable::StampNow() const { return StampAt(NowMicros()); }

namespace {

// Allocates `count` T through memory, or fails naming what.
template <typename T>
Status AllocateArray(GpuMemory* memory, int64_t count, T** out, const char* what) {
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

Status GpuHashTable::Init(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t rows = std::max<int64_t>(1, std::min(options_.init_capacity, options_.max_capacity));
  init_status_ = AllocateArray(memory_, 1, &counters_, "counters");
  if (init_status_.ok()) {
    init_status_ = CudaStatus(cudaMemsetAsync(counters_, 0, sizeof(Counters), stream), "init");
  }
  if (init_status_.ok()) init_status_ = Rebuild(SlotsForKeys(rows), 0, stream);
  if (init_status_.ok()) init_status_ = GrowRows(rows, 0, stream);
  if (init_status_.ok()) SetBounds(Exact{});
  for (Snapshot& snapshot : snapshots_) {
    if (!init_status_.ok()) break;
    void* host = nullptr;
    init_status_ = CudaStatus(cudaMallocHost(&host, sizeof(Counters)), "init");
    snapshot.host = static_cast<Counters*>(host);
    if (init_status_.ok()) {
      init_status_ = CudaStatus(cudaEventCreateWithFlags(&snapshot.taken, cudaEventDisableTiming),
                                "init");
    }
  }
  return init_status_;
}

void GpuHashTable::TakeSnapshot(int64_t reserved, cudaStream_t stream) {
  for (Snapshot& snapshot : snapshots_) {
    if (snapshot.pending) snapshot.reserved_after += reserved;
  }
  Snapshot& next = snapshots_[next_snapshot_];
  if (next.pending && cudaEventQuery(next.taken) != cudaSuccess) return;  // the stream lags
  if (cudaMemcpyAsync(next.host, counters_, sizeof(Counters), cudaMemcpyDeviceToHost, stream) !=
          cudaSuccess ||
      cudaEventRecord(next.taken, stream) != cudaSuccess) {
    next.pending = false;
    return;
  }
  next.pending = true;
  next.reserved_after = reserved;  // this call's inserts are enqueued after the copy
  next_snapshot_ = (next_snapshot_ + 1) % kSnapshots;
}

bool GpuHashTable::RefreshFromSnapshot() {
  Snapshot* newest = nullptr;
  for (Snapshot& snapshot : snapshots_) {
    if (!snapshot.pending || cudaEventQuery(snapshot.taken) != cudaSuccess) continue;
    if (newest == nullptr || snapshot.reserved_after < newest->reserved_after) newest = &snapshot;
  }
  if (newest == nullptr) return false;
  const Counters& c = *newest->host;
  SetBounds(Exact{static_cast<int64_t>(c.size), static_cast<int64_t>(c.used),
                  static_cast<int64_t>(c.next_row), static_cast<int64_t>(c.free_count)});
  spare_keys_ -= newest->reserved_after;
  spare_slots_ -= newest->reserved_after;
  spare_rows_ -= newest->reserved_after;
  for (Snapshot& snapshot : snapshots_) {  // older ones, and this one, are spent
    if (snapshot.pending && snapshot.reserved_after >= newest->reserved_after) {
      snapshot.pending = false;
    }
  }
  return true;
}

void GpuHashTable::DropSnapshots() {
  for (Snapshot& snapshot : snapshots_) snapshot.pending = false;
}

void GpuHashTable::SetBounds(const Exact& e) {
  spare_keys_ = options_.max_capacity - e.size;
  spare_slots_ = MaxUsed(num_slots_) - e.used;
  spare_rows_ = row_capacity_ - e.next_row + e.free_count;
}

Status GpuHashTable::ReadCounters(Exact* exact, cudaStream_t stream) {
  Counters host;
  SOK_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(&host, counters_, sizeof(host), cudaMemcpyDeviceToHost, stream), "read"));
  SOK_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "read"));
  exact->size = static_cast<int64_t>(host.size);
  exact->used = static_cast<int64_t>(host.used);
  exact->next_row = static_cast<int64_t>(host.next_row);
  exact->free_count = static_cast<int64_t>(host.free_count);
  return Status::Ok();
}

// Rebuilds the slot array at `slots` slots from the live rows (erased slots vanish).
Status GpuHashTable::Rebuild(int64_t slots, int64_t next_row, cudaStream_t stream) {
  Slot* fresh = nullptr;
  SOK_RETURN_IF_ERROR(AllocateArray(memory_, slots, &fresh, "slots"));
  cudaMemsetAsync(fresh, 0xff, slots * sizeof(Slot), stream);  // every slot empty
  if (next_row > 0) {
    Reinsert<<<Blocks(next_row), kThreads, 0, stream>>>(row_keys_, row_meta_, next_row, fresh,
                                                        slots - 1);
  }
  SetUsedToSize<<<1, 1, 0, stream>>>(counters_);
  if (slots_) memory_->Free(slots_);
  slots_ = fresh;
  num_slots_ = slots;
  return CudaStatus(cudaGetLastError(), "rebuild");
}

// Moves the pool to `rows` rows (never fewer than it holds).
Status GpuHashTable::GrowRows(int64_t rows, int64_t next_row, cudaStream_t stream) {
  const size_t value_bytes = ValueBytes(options_.value_type) * options_.dim;
  int64_t *keys = nullptr, *free_rows = nullptr;
  uint64_t* meta = nullptr;
  char* values = nullptr;
  float* state = nullptr;
  SOK_RETURN_IF_ERROR(AllocateArray(memory_, rows + 1, &keys, "keys"));
  Status status = AllocateArray(memory_, rows + 1, &meta, "row metadata");
  if (status.ok()) status = AllocateArray(memory_, (rows + 1) * value_bytes, &values, "values");
  if (status.ok()) status = AllocateArray(memory_, (rows + 1) * options_.state_dim, &state, "optimizer state");
  if (status.ok()) status = AllocateArray(memory_, rows, &free_rows, "free list");
  RowClaim* claims = nullptr;
  if (status.ok()) status = AllocateArray(memory_, rows + 1, &claims, "update claims");
  if (!status.ok()) {
    for (void* p : {static_cast<void*>(keys), static_cast<void*>(meta), static_cast<void*>(values),
                    static_cast<void*>(state), static_cast<void*>(free_rows),
                    static_cast<void*>(claims)}) {
      if (p) memory_->Free(p);
    }
    return status;
  }
  cudaMemsetAsync(meta, 0, (rows + 1) * sizeof(uint64_t), stream);
  cudaMemsetAsync(claims, 0, (rows + 1) * sizeof(RowClaim), stream);  // unclaimed
  if (row_capacity_ > 0) {
    const int64_t kept = std::min(next_row, row_capacity_);
    cudaMemcpyAsync(keys, row_keys_, kept * sizeof(int64_t), cudaMemcpyDeviceToDevice, stream);
    cudaMemcpyAsync(meta, row_meta_, kept * sizeof(uint64_t), cudaMemcpyDeviceToDevice, stream);
    cudaMemcpyAsync(values, values_, kept * value_bytes, cudaMemcpyDeviceToDevice, stream);
    cudaMemcpyAsync(state, state_, kept * options_.state_dim * sizeof(float),
                    cudaMemcpyDeviceToDevice, stream);
    cudaMemcpyAsync(free_rows, free_rows_, row_capacity_ * sizeof(int64_t),
                    cudaMemcpyDeviceToDevice, stream);
    for (void* p : {static_cast<void*>(row_keys_), static_cast<void*>(row_meta_), values_,
                    static_cast<void*>(state_), static_cast<void*>(free_rows_), row_claims_}) {
      memory_->Free(p);
    }
  }
  row_claims_ = claims;
  row_keys_ = keys;
  row_meta_ = meta;
  values_ = values;
  state_ = state;
  free_rows_ = free_rows;
  row_capacity_ = rows;
  return CudaStatus(cudaGetLastError(), "grow");
}

Status GpuHashTable::CountNewKeys(const TableKeys& keys, float admit, uint64_t clock,
                                  int64_t* count, cudaStream_t stream) {
  int64_t *candidates = nullptr, *sorted = nullptr;
  SOK_RETURN_IF_ERROR(Scratch(keys.n, &candidates));
  SOK_RETURN_IF_ERROR(Scratch(keys.n, &sorted));
  unsigned long long host = 0;
  cudaMemsetAsync(&counters_->scratch, 0, sizeof(unsigned long long), stream);
  MissingCandidates<<<Blocks(keys.n), kThreads, 0, stream>>>(
      keys, static_cast<Slot*>(slots_), num_slots_ - 1, admit, clock, candidates, counters_);
  cudaMemcpyAsync(&host, &counters_->scratch, sizeof(host), cudaMemcpyDeviceToHost, stream);
  SOK_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "count new keys"));
  const int items = static_cast<int>(host);
  if (items > 0) {
    size_t bytes = 0;
    cub::DeviceRadixSort::SortKeys(nullptr, bytes, candidates, sorted, items, 0, 64, stream);
    char* temp = nullptr;
    SOK_RETURN_IF_ERROR(Scratch(bytes, &temp));
    cub::DeviceRadixSort::SortKeys(temp, bytes, candidates, sorted, items, 0, 64, stream);
    cudaMemsetAsync(&counters_->scratch, 0, sizeof(unsigned long long), stream);
    CountRunHeads<<<Blocks(items), kThreads, 0, stream>>>(sorted, items, counters_);
    cudaMemcpyAsync(&host, &counters_->scratch, sizeof(host), cudaMemcpyDeviceToHost, stream);
    SOK_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "count new keys"));
  }
  *count = static_cast<int64_t>(host);
  return Status::Ok();
}

// Evicts the `count` lowest-scored keys (ties: lower rows first).
// The keys and widened rows of the rows about to be evicted, before EvictRows frees them.
template <typename V>
__global__ void CopyEvictedRows(const int64_t* rows, int64_t count, const int64_t* row_keys,
                                const V* values, int64_t dim, int64_t* keys_out,
                                float* values_out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count * dim;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = i / dim, d = i - j * dim, row = rows[j];
    if (d == 0) keys_out[j] = row_keys[row];
    values_out[i] = Widen(values[row * dim + d]);
  }
}

Status GpuHashTable::Evict(int64_t count, int64_t next_row, cudaStream_t stream,
                           EvictedRows* evicted) {
  uint64_t *scores = nullptr, *sorted_scores = nullptr;
  int64_t *rows = nullptr, *sorted_rows = nullptr;
  SOK_RETURN_IF_ERROR(Scratch(next_row, &scores));
  SOK_RETURN_IF_ERROR(Scratch(next_row, &sorted_scores));
  SOK_RETURN_IF_ERROR(Scratch(next_row, &rows));
  SOK_RETURN_IF_ERROR(Scratch(next_row, &sorted_rows));
  ScoreRows<<<Blocks(next_row), kThreads, 0, stream>>>(row_meta_, next_row, scores, rows);
  size_t bytes = 0;
  const int items = static_cast<int>(next_row);
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, scores, sorted_scores, rows, sorted_rows, items,
                                  0, 64, stream);
  char* temp = nullptr;
  SOK_RETURN_IF_ERROR(Scratch(bytes, &temp));
  cub::DeviceRadixSort::SortPairs(temp, bytes, scores, sorted_scores, rows, sorted_rows, items, 0,
                                  64, stream);
  if (evicted != nullptr) {
    int64_t* keys_out = nullptr;
    float* values_out = nullptr;
    SOK_RETURN_IF_ERROR(evicted->allocate(count, &keys_out, &values_out));
    evicted->count = count;
    VisitValueType(options_.value_type, [&](auto value) {
      using V = decltype(value);
      CopyEvictedRows<V><<<Blocks(count * options_.dim), kThreads, 0, stream>>>(
          sorted_rows, count, row_keys_, static_cast<const V*>(values_), options_.dim, keys_out,
          values_out);
    });
  }
  EvictRows<<<Blocks(count), kThreads, 0, stream>>>(sorted_rows, count, row_keys_,
                                                    static_cast<Slot*>(slots_), num_slots_ - 1,
                                                    counters_, free_rows_, row_meta_);
  return CudaStatus(cudaGetLastError(), "evict");
}

Status GpuHashTable::Reserve(const TableKeys& keys, float admit, uint64_t clock,
                             cudaStream_t stream, EvictedRows* evicted_sink) {
  const int64_t n = keys.n;
  const auto fits = [&] { return n <= spare_keys_ && n <= spare_slots_ && n <= spare_rows_; };
  if (fits() || (RefreshFromSnapshot() && fits())) {
    spare_keys_ -= n;
    spare_slots_ -= n;
    spare_rows_ -= n;
    TakeSnapshot(n, stream);
    return Status::Ok();
  }
  Exact e;
  SOK_RETURN_IF_ERROR(ReadCounters(&e, stream));
  DropSnapshots();  // all older than this exact read
  // Short of room for n new keys somewhere: count the call's new keys exactly, so growth and
  // eviction see the true number (as the CPU table does).
  int64_t incoming = n;
  const int64_t room = options_.max_capacity - e.size;
  if (n > room || e.used + n > MaxUsed(num_slots_) ||
      n > row_capacity_ - e.next_row + e.free_count) {
    SOK_RETURN_IF_ERROR(CountNewKeys(keys, admit, clock, &incoming, stream));
  }
  int64_t evicted = 0;
  if (incoming > room) {
    if (options_.evict == EvictStrategy::kNone || incoming > options_.max_capacity) {
      return Status::ResourceExhausted(
          "dynamic table is full: it holds " + std::to_string(e.size) + " keys, " +
          std::to_string(incoming) + " new keys arrived and max_capacity is " +
          std::to_string(options_.max_capacity) +
          "; raise max_capacity or set evict_strategy ('lru' or 'lfu')");
    }
    evicted = incoming - room;
    SOK_RETURN_IF_ERROR(Evict(evicted, e.next_row, stream, evicted_sink));
    e.size -= evicted;
    e.free_count += evicted;
  }
  // An evicted key this call uses again comes back as new: room for those too.
  const int64_t needed = incoming + evicted;
  if (e.used + needed > MaxUsed(num_slots_)) {
    SOK_RETURN_IF_ERROR(Rebuild(SlotsForKeys(e.size + needed), e.next_row, stream));
    e.used = e.size;
  }
  if (needed > row_capacity_ - e.next_row + e.free_count) {
    const int64_t rows = e.next_row - e.free_count + needed;
    SOK_RETURN_IF_ERROR(GrowRows(std::max(rows, std::min(2 * row_capacity_,
                                                         std::max(rows, options_.max_capacity))),
                                 e.next_row, stream));
  }
  SetBounds(e);
  spare_keys_ -= needed;
  spare_slots_ -= needed;
  spare_rows_ -= needed;
  TakeSnapshot(needed, stream);
  return Status::Ok();
}

Status GpuHashTable::FindRows(const TableKeys& keys, bool insert, float admit, uint64_t clock,
                              uint32_t now, int64_t* rows, cudaStream_t stream,
                              bool initial_values) {
  uint8_t* fresh = nullptr;
  if (insert) SOK_RETURN_IF_ERROR(Scratch(keys.n, &fresh));
  const ProbeArgs args{static_cast<Slot*>(slots_), num_slots_ - 1, counters_, free_rows_,
                       row_capacity_, row_keys_, row_meta_, admit, clock, now, row_capacity_};
  ProbeKernel<<<Blocks(keys.n), kThreads, 0, stream>>>(keys, insert, args, rows, fresh);
  if (!insert) return CudaStatus(cudaGetLastError(), "find");
  FoldTaken<<<1, 1, 0, stream>>>(counters_, row_capacity_);
  const RowArrays arrays{row_keys_, row_meta_, values_, state_, options_.dim, options_.state_dim};
  const int64_t width = std::max(initial_values ? options_.dim : 0, options_.state_dim);
  if (width == 0) return CudaStatus(cudaGetLastError(), "insert");
  VisitValueType(options_.value_type, [&](auto value) {
    InitFreshRows<decltype(value)><<<Blocks(keys.n), kThreads, 0, stream>>>(
        keys, rows, fresh, arrays, static_cast<InitKind>(initializer_.kind), initializer_.a,
        initializer_.b, initializer_.seed, options_.state_initial_value, initial_values);
  });
  return CudaStatus(cudaGetLastError(), "insert");
}

Status GpuHashTable::Size(int64_t* size_device, const TableContext& context) {
  const cudaStream_t stream = StreamOf(context);
  std::lock_guard<std::mutex> lock(mutex_);
  SOK_RETURN_IF_ERROR(init_status_);
  CopySize<<<1, 1, 0, stream>>>(counters_, size_device);
  return CudaStatus(cudaGetLastError(), "size");
}

Status GpuHashTable::Find(const TableKeys& keys, float* values, const TableContext& context) {
  return Lookup(keys, false, values, 1.0f, StreamOf(context), nullptr);
}

Status GpuHashTable::FindOrInsert(const TableKeys& keys, float* values, float admit_probability,
                                  EvictedRows* evicted, const TableContext& context) {
  return Lookup(keys, true, values, admit_probability, StreamOf(context), evicted);
}

Status GpuHashTable::Lookup(const TableKeys& keys, bool insert, float* values, float admit,
                            cudaStream_t stream, EvictedRows* evicted) {
  std::lock_guard<std::mutex> lock(mutex_);
  SOK_RETURN_IF_ERROR(init_status_);
  const uint64_t clock = ++clock_;
  if (keys.n == 0) return Status::Ok();
  // Reads only: one kernel probes and copies. Find-or-insert: the probe (and claims), then
  // the fresh rows' initial values, then the copy.
  int64_t* rows = nullptr;
  Status status;
  if (insert) {
    status = Scratch(keys.n, &rows);
    if (status.ok()) status = Reserve(keys, admit, clock, stream, evicted);
    if (status.ok()) status = FindRows(keys, true, admit, clock, StampNow(), rows, stream);
  }
  if (status.ok()) {
    const RowArrays arrays{row_keys_, row_meta_, values_, state_, options_.dim, options_.state_dim};
    const bool touch = insert && options_.evict != EvictStrategy::kNone;
    const int lanes = RowLanes(options_.value_type == ValueType::kFloat32 && options_.dim % 4 == 0
                                   ? options_.dim / 4
                                   : options_.dim);
    VisitValueType(options_.value_type, [&](auto value) {
      ReadRows<decltype(value)><<<Blocks(keys.n), kThreads, 0, stream>>>(
          keys, rows, !insert, static_cast<const Slot*>(slots_), num_slots_ - 1, row_capacity_,
          arrays, values, lanes, touch, options_.evict, clock);
    });
    status = CudaStatus(cudaGetLastError(), "lookup");
  }
  FreeScratch();
  return status;
}

Status GpuHashTable::InsertOrAssign(const int64_t* keys, int64_t n, const float* values,
                                    const float* state, const TableContext& context) {
  const cudaStream_t stream = StreamOf(context);
  std::lock_guard<std::mutex> lock(mutex_);
  SOK_RETURN_IF_ERROR(init_status_);
  if (n == 0) return Status::Ok();
  const TableKeys all{keys, n, 1, 0};
  int64_t* rows = nullptr;
  Status status = Scratch(n, &rows);
  if (status.ok()) status = Reserve(all, 1.0f, clock_ + 1, stream);
  const uint64_t clock = ++clock_;
  const uint32_t now = StampNow();
  if (status.ok()) status = FindRows(all, true, 1.0f, clock, now, rows, stream, false);
  if (status.ok()) {
    const RowArrays arrays{row_keys_, row_meta_, values_, state_, options_.dim, options_.state_dim};
    const int64_t cols = state ? options_.state_dim : 0;
    const bool vector = WriteVector(options_.value_type, options_.dim, cols, options_.state_dim);
    VisitValueType(options_.value_type, [&](auto value) {
      WriteRows<decltype(value)><<<Blocks(n), kThreads, 0, stream>>>(
          rows, n, row_capacity_, arrays, values, state, cols, now, true, options_.evict, clock,
          vector, WriteLanes(vector, options_.dim, cols));
    });
    status = CudaStatus(cudaGetLastError(), "assign");
  }
  FreeScratch();
  return status;
}

Status GpuHashTable::EnsureState(int64_t state_dim, float initial_value, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  SOK_RETURN_IF_ERROR(init_status_);
  if (options_.state_dim >= state_dim) return Status::Ok();
  float* state = nullptr;
  SOK_RETURN_IF_ERROR(AllocateArray(memory_, (row_capacity_ + 1) * state_dim, &state,
                                    "optimizer state"));
  FillState<<<Blocks((row_capacity_ + 1) * state_dim), kThreads, 0, stream>>>(
      state, row_capacity_ + 1, options_.dim, state_dim, initial_value);
  if (state_) memory_->Free(state_);
  state_ = state;
  options_.state_dim = state_dim;
  options_.state_initial_value = initial_value;
  return CudaStatus(cudaGetLastError(), "widen state");
}

Status GpuHashTable::Replace(const int64_t* keys, int64_t n, const float* values,
                             const float* state, int64_t state_dim, const TableContext& context) {
  const cudaStream_t stream = StreamOf(context);
  if (n > options_.max_capacity) {
    return Status::ResourceExhausted("restoring " + std::to_string(n) +
                                     " keys into a table whose max_capacity is " +
                                     std::to_string(options_.max_capacity));
  }
  SOK_RETURN_IF_ERROR(EnsureState(state_dim, options_.state_initial_value, stream));
  std::lock_guard<std::mutex> lock(mutex_);
  // Empty the table, then make room for n keys: a fresh slot array, a pool of >= n rows.
  SOK_RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(counters_, 0, sizeof(Counters), stream), "clear"));
  SOK_RETURN_IF_ERROR(CudaStatus(
      cudaMemsetAsync(row_meta_, 0, (row_capacity_ + 1) * sizeof(uint64_t), stream), "clear"));
  if (n > row_capacity_) SOK_RETURN_IF_ERROR(GrowRows(n, 0, stream));
  SOK_RETURN_IF_ERROR(Rebuild(SlotsForKeys(std::max<int64_t>(n, 1)), 0, stream));
  SetBounds(Exact{});
  DropSnapshots();
  if (n == 0) return Status::Ok();
  spare_keys_ -= n;
  spare_slots_ -= n;
  spare_rows_ -= n;
  const TableKeys all{keys, n, 1, 0};
  int64_t* rows = nullptr;
  const uint32_t now = StampNow();
  Status status = Scratch(n, &rows);
  if (status.ok()) status = FindRows(all, true, 1.0f, clock_, now, rows, stream, false);
  if (status.ok()) {
    const RowArrays arrays{row_keys_, row_meta_, values_, state_, options_.dim, options_.state_dim};
    const int64_t cols = state ? std::min(state_dim, options_.state_dim) : 0;
    // The restored state is [n, state_dim]: WriteRows reads it with that stride.
    const bool vector = WriteVector(options_.value_type, options_.dim, cols, options_.state_dim);
    VisitValueType(options_.value_type, [&](auto value) {
      WriteRows<decltype(value)><<<Blocks(n), kThreads, 0, stream>>>(
          rows, n, row_capacity_, arrays, values, state, cols, now, false, options_.evict, 0,
          vector, WriteLanes(vector, options_.dim, cols));
    });
    status = CudaStatus(cudaGetLastError(), "restore");
  }
  FreeScratch();
  return status;
}

Status GpuHashTable::Erase(const int64_t* keys, int64_t n, int64_t* erased_device,
                           const TableContext& context) {
  const cudaStream_t stream = StreamOf(context);
  std::lock_guard<std::mutex> lock(mutex_);
  SOK_RETURN_IF_ERROR(init_status_);
  cudaMemsetAsync(erased_device, 0, sizeof(int64_t), stream);
  if (n > 0) {
    EraseKeys<<<Blocks(n), kThreads, 0, stream>>>(
        keys, n, static_cast<Slot*>(slots_), num_slots_ - 1, counters_, free_rows_, row_meta_,
        reinterpret_cast<unsigned long long*>(erased_device));
  }
  return CudaStatus(cudaGetLastError(), "erase");
}

Status GpuHashTable::Export(int64_t written_after_us, bool with_state, const ExportOutputs& outputs,
                            const TableContext& context) {
  const cudaStream_t stream = StreamOf(context);
  std::lock_guard<std::mutex> lock(mutex_);
  SOK_RETURN_IF_ERROR(init_status_);
  Exact e;
  SOK_RETURN_IF_ERROR(ReadCounters(&e, stream));
  const bool all = written_after_us == kExportAll || written_after_us < created_us_;
  const uint32_t since = all ? 0 : StampAt(written_after_us);
  uint8_t* flags = nullptr;
  int64_t* selected = nullptr;
  int* count = nullptr;
  Status status = Scratch(e.next_row, &flags);
  if (status.ok()) status = Scratch(e.next_row, &selected);
  if (status.ok()) status = Scratch(1, &count);
  int host_count = 0;
  if (status.ok() && e.next_row > 0) {
    ExportFlags<<<Blocks(e.next_row), kThreads, 0, stream>>>(row_meta_, e.next_row, all, since,
                                                              flags);
    size_t bytes = 0;
    thrust::counting_iterator<int64_t> row_numbers(0);
    cub::DeviceSelect::Flagged(nullptr, bytes, row_numbers, flags, selected, count,
                               static_cast<int>(e.next_row), stream);
    char* temp = nullptr;
    status = Scratch(bytes, &temp);
    if (status.ok()) {
      cub::DeviceSelect::Flagged(temp, bytes, row_numbers, flags, selected, count,
                                 static_cast<int>(e.next_row), stream);
      cudaMemcpyAsync(&host_count, count, sizeof(int), cudaMemcpyDeviceToHost, stream);
      status = CudaStatus(cudaStreamSynchronize(stream), "export");
    }
  }
  int64_t* keys = nullptr;
  float *values = nullptr, *state = nullptr;
  if (status.ok()) status = outputs(host_count, &keys, &values, with_state ? &state : nullptr);
  if (status.ok() && host_count > 0) {
    const RowArrays arrays{row_keys_, row_meta_, values_, state_, options_.dim, options_.state_dim};
    const int64_t width = std::max(options_.dim, with_state ? options_.state_dim : 0);
    VisitValueType(options_.value_type, [&](auto value) {
      ExportRows<decltype(value)><<<Blocks(host_count * width), kThreads, 0, stream>>>(
          selected, host_count, arrays, keys, values, with_state ? state : nullptr);
    });
    status = CudaStatus(cudaGetLastError(), "export");
  }
  FreeScratch();
  return status;
}

Status GpuHashTable::ApplySparseUpdate(const SparseUpdate& update, const TableContext& context) {
  const cudaStream_t stream = StreamOf(context);
  const std::string& rule = update.rule;
  const float* hyper = update.hyper;
  const int64_t* keys = update.keys;
  const int64_t n = update.n, state_dim = update.state_dim;
  const float* grads = update.grads;
  const bool nesterov = update.nesterov;
  // The rule must find the state it expects: what its type needs with any values is checked
  // before anything runs (the values stay in device memory; the kernel refuses values that
  // need more).
  bool fits = true;
  SOK_RETURN_IF_ERROR(VisitRuleType(rule, update.hyper_count, [&](auto type) {
    fits = RuleStateFloats(type, options_.dim) <= std::max(state_dim, options_.state_dim);
  }));
  if (!fits || state_dim % options_.dim != 0 || state_dim > 3 * options_.dim) {
    return Status::InvalidArgument("rule " + rule + " does not fit a state of " +
                                   std::to_string(state_dim) + " floats per key");
  }
  SOK_RETURN_IF_ERROR(EnsureState(state_dim, update.state_initial_value, stream));
  std::lock_guard<std::mutex> lock(mutex_);
  if (n == 0) return Status::Ok();
  // float4 when float rows of a multiple of 4 elements (the table's rows are 16-byte aligned
  // then, and so are the gradients' when their buffer is).
  const bool vector = options_.value_type == ValueType::kFloat32 && options_.dim % 4 == 0 &&
                      reinterpret_cast<uintptr_t>(grads) % 16 == 0;
  const int end_bit = SgdTileEndBit(row_capacity_ + 1);
  if (rule == "sgd" && vector && options_.state_dim == 0 && end_bit <= 32) {
    const RowArrays arrays{row_keys_, row_meta_, values_, state_, options_.dim, 0};
    SortedTileSgdRows<<<GridBlocks(n, kSgdTileUses), kSgdTileUses, 0, stream>>>(
        keys, n, static_cast<const Slot*>(slots_), num_slots_ - 1,
        reinterpret_cast<const float4*>(grads), arrays, hyper, StampNow(), end_bit,
        RowLanes(options_.dim / 4));
    return CudaStatus(cudaGetLastError(), "apply");
  }
  int64_t* rows = nullptr;
  int32_t* head = nullptr;
  float* summed = nullptr;
  Status status = Scratch(n, &rows);
  if (status.ok()) status = Scratch(n, &head);
  if (status.ok()) status = Scratch(n * options_.dim, &summed);
  if (status.ok()) {
    const int64_t dim = options_.dim;
    RowClaim* claims = static_cast<RowClaim*>(row_claims_);
    const Slot* slots = static_cast<const Slot*>(slots_);
    // Tiles sorted by row, then by head: hot keys' uses would queue on one counter and one
    // gradient row (the tiles need rows and heads of at most 32 bits, float4 gradients).
    const bool tiled = end_bit <= 32;
    if (tiled) {
      ClaimRowsTiled<<<GridBlocks(n, kSgdTileUses), kSgdTileUses, 0, stream>>>(
          keys, n, slots, num_slots_ - 1, rows, claims, end_bit);
    } else {
      ClaimRows<<<Blocks(n), kThreads, 0, stream>>>(keys, n, slots, num_slots_ - 1, rows,
                                                    claims);
    }
    ResolveUses<<<Blocks(n), kThreads, 0, stream>>>(rows, claims, n, head);
    GatherGradients<<<Blocks(n), kThreads, 0, stream>>>(head, n, dim, grads, summed, true);
    if (dim % 4 == 0 && reinterpret_cast<uintptr_t>(grads) % 16 == 0) {
      AddToHeadsTiled<<<GridBlocks(n, kSgdTileUses), kSgdTileUses, 0, stream>>>(
          head, n, reinterpret_cast<const float4*>(grads), reinterpret_cast<float4*>(summed),
          dim / 4, SgdTileEndBit(n), RowLanes(dim / 4));
    } else {
      GatherGradients<<<Blocks(n), kThreads, 0, stream>>>(head, n, dim, grads, summed, false);
    }
    const RowArrays arrays{row_keys_, row_meta_, values_, state_, dim, options_.state_dim};
    const int sections = static_cast<int>(options_.state_dim / dim);
    const uint32_t now = StampNow();
    const int lanes = RowLanes(vector ? dim / 4 : dim);
    const int blocks = Blocks(n);
    VisitRuleType(rule, update.hyper_count, [&](auto type) {
      using Hyper = decltype(type);
      VisitValueType(options_.value_type, [&](auto value) {
        using Value = decltype(value);
        if constexpr (std::is_same<Value, float>::value) {
          if (vector) {  // the common case: state sections known at compile time
            VisitSections(sections, [&](auto known) {
              ApplyClaimed<Value, 4, Hyper, decltype(known)::value>
                  <<<blocks, kThreads, 0, stream>>>(rows, head, claims, n, grads, summed,
                                                    arrays, sections, hyper, nesterov, now,
                                                    lanes);
            });
            return;
          }
        }
        ApplyClaimed<Value, 1, Hyper, -1><<<blocks, kThreads, 0, stream>>>(
            rows, head, claims, n, grads, summed, arrays, sections, hyper, nesterov, now,
            lanes);
      });
    });
    status = CudaStatus(cudaGetLastError(), "apply");
  }
  FreeScratch();
  return status;
}

}  // namespace sok
