// The GPU table's lookups (gpu_hash_table.cuh): the probe that finds or claims each key's
// slot and row, the fresh rows' initial values, and the warp-wide copy of rows out.
#include "kit_src/core/hash_table/gpu_table_internal.cuh"

namespace sok {
namespace {

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

}  // namespace

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
    // Admitting nothing (as the tiered table's use of its hot keys), it needs no room.
    if (status.ok() && admit > 0.0f) status = Reserve(keys, admit, clock, stream, evicted);
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

}  // namespace sok
