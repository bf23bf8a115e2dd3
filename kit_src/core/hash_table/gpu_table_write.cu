// The GPU table's writes of whole rows (gpu_hash_table.cuh): insert-or-assign, replace (a
// restore) and export, the warp-wide row copies in and out.
#include "kit_src/core/hash_table/gpu_table_internal.cuh"

namespace sok {
namespace {

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

}  // namespace

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
Status GpuHashTable::Export(int64_t written_after_us, bool with_state, const ExportOutputs& outputs,
                            const TableContext& context) {
  const bool all = written_after_us == kExportAll || written_after_us < created_us_;
  const uint32_t since = all ? 0 : StampAt(written_after_us);  // the creation time never changes
  const cudaStream_t stream = StreamOf(context);
  std::lock_guard<std::mutex> lock(mutex_);
  SOK_RETURN_IF_ERROR(init_status_);
  Exact e;
  SOK_RETURN_IF_ERROR(ReadCounters(&e, stream));
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

}  // namespace sok
