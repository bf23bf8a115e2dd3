// The GPU table's removals (gpu_hash_table.cuh): erase by key, and eviction of the
// lowest-scored rows when a find-or-insert needs room.
#include "kit_src/core/hash_table/gpu_table_internal.cuh"

namespace sok {
namespace {

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
// With `newest_first`, rows of equal score order by write stamp, the newest first.
__global__ void ScoreRows(const uint64_t* row_meta, int64_t n, bool newest_first,
                          uint64_t* scores, int64_t* rows) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < n;
       r += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t meta = row_meta[r];
    const uint64_t score = (meta & kScoreBits) >> kScoreShift;
    const uint64_t order = newest_first ? (score << 32) | (~meta & kStampBits) : score;
    scores[r] = (meta & kRowLive) ? order : ~0ull;
    rows[r] = r;
  }
}
// The rows of `keep`'s selected keys score above every live row: an eviction of no more
// than the rows outside `keep` takes none of them.
__global__ void ProtectRows(TableKeys keep, const Slot* slots, int64_t mask, uint64_t* scores) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < keep.n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t key;
    if (!KeyAt(keep, i, &key)) continue;
    const int64_t row = FindRow(slots, mask, key);
    if (row >= 0) scores[row] = ~0ull - 1;
  }
}
// Radix selection of the lowest scores: a digit of kDigitBits bits at a time from the top.
constexpr int kDigitBits = 12;
constexpr int kDigits = 1 << kDigitBits;
// Candidate sets up to this size are sorted whole (a sort of them costs about a pass).
constexpr int64_t kSmallSelection = int64_t{1} << 20;
// counts[d]: scores whose bits from `high` up equal `prefix` and whose digit below is d.
__global__ void CountDigits(const uint64_t* scores, int64_t n, int high, int width,
                            uint64_t prefix, unsigned int* counts) {
  __shared__ unsigned int block_counts[kDigits];
  for (int d = threadIdx.x; d < kDigits; d += blockDim.x) block_counts[d] = 0;
  __syncthreads();
  const uint64_t digit_mask = (uint64_t{1} << width) - 1;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t score = scores[i];
    if (high < 64 && (score >> high) != prefix) continue;
    atomicAdd(&block_counts[(score >> (high - width)) & digit_mask], 1u);
  }
  __syncthreads();
  for (int d = threadIdx.x; d < kDigits; d += blockDim.x) {
    if (block_counts[d] > 0) atomicAdd(&counts[d], block_counts[d]);
  }
}
// Rows whose score, from bit `shift` up, is at most `limit`.
struct ScoreAtMost {
  const uint64_t* scores;
  int shift;
  uint64_t limit;
  __device__ bool operator()(int64_t row) const {
    return shift >= 64 || (scores[row] >> shift) <= limit;
  }
};
__global__ void GatherScores(const uint64_t* scores, const int64_t* rows, int64_t n,
                             uint64_t* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = scores[rows[i]];
  }
}
// Halves the use count of every live row (LFU scores).
__global__ void HalveScores(uint64_t* row_meta, int64_t n) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < n;
       r += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t meta = row_meta[r];
    if (!(meta & kRowLive)) continue;
    const uint64_t halved = ((meta & kScoreBits) >> (kScoreShift + 1)) << kScoreShift;
    row_meta[r] = (meta & ~kScoreBits) | halved;
  }
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
__global__ void CopyEvictedState(const int64_t* rows, int64_t count, const float* state,
                                 int64_t state_dim, float* state_out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < count * state_dim; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = i / state_dim;
    state_out[i] = state[rows[j] * state_dim + i - j * state_dim];
  }
}
// absent[i] = 1 when selected key i is not held (rows from a find).
__global__ void MarkAbsent(TableKeys keys, const int64_t* rows, int64_t missing_row,
                           uint8_t* absent) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < keys.n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t key;
    absent[i] = KeyAt(keys, i, &key) && rows[i] == missing_row;
  }
}

// Take's copy out: key i's value (widened) and state, zeros and found 0 when missing.
template <typename V>
__global__ void CopyTakenRows(const int64_t* rows, int64_t n, int64_t missing_row,
                              const V* values, const float* state, int64_t dim,
                              int64_t state_dim, float* values_out, float* state_out,
                              uint8_t* found) {
  const int64_t width = dim + (state_out != nullptr ? state_dim : 0);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n * width;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = i / width, d = i - j * width, row = rows[j];
    const bool present = row != missing_row;
    if (d == 0) found[j] = present;
    if (d < dim) {
      values_out[j * dim + d] = present ? Widen(values[row * dim + d]) : 0.0f;
    } else {
      state_out[j * state_dim + d - dim] = present ? state[row * state_dim + d - dim] : 0.0f;
    }
  }
}

}  // namespace

Status GpuHashTable::Take(const int64_t* keys, int64_t n, float* values, float* state,
                          uint8_t* found, const TableContext& context) {
  const cudaStream_t stream = StreamOf(context);
  std::lock_guard<std::mutex> lock(mutex_);
  SOK_RETURN_IF_ERROR(init_status_);
  if (n == 0) return Status::Ok();
  int64_t* rows = nullptr;
  unsigned long long* erased = nullptr;
  Status status = Scratch(n, &rows);
  if (status.ok()) status = Scratch(1, &erased);
  if (status.ok()) status = FindRows(TableKeys{keys, n, 1, 0}, false, 1.0f, 0, 0, rows, stream);
  if (status.ok()) {
    if (options_.state_dim == 0) state = nullptr;
    VisitValueType(options_.value_type, [&](auto value) {
      using V = decltype(value);
      const int64_t width = options_.dim + (state != nullptr ? options_.state_dim : 0);
      CopyTakenRows<V><<<Blocks(n * width), kThreads, 0, stream>>>(
          rows, n, row_capacity_, static_cast<const V*>(values_), state_, options_.dim,
          options_.state_dim, values, state, found);
    });
    EraseKeys<<<Blocks(n), kThreads, 0, stream>>>(keys, n, static_cast<Slot*>(slots_),
                                                  num_slots_ - 1, counters_, free_rows_,
                                                  row_meta_, erased);
    status = CudaStatus(cudaGetLastError(), "take");
  }
  FreeScratch();
  return status;
}

Status GpuHashTable::Absent(const TableKeys& keys, uint8_t* absent, const TableContext& context) {
  const cudaStream_t stream = StreamOf(context);
  std::lock_guard<std::mutex> lock(mutex_);
  SOK_RETURN_IF_ERROR(init_status_);
  if (keys.n == 0) return Status::Ok();
  int64_t* rows = nullptr;
  Status status = Scratch(keys.n, &rows);
  if (status.ok()) status = FindRows(keys, false, 1.0f, 0, 0, rows, stream);
  if (status.ok()) {
    MarkAbsent<<<Blocks(keys.n), kThreads, 0, stream>>>(keys, rows, row_capacity_, absent);
    status = CudaStatus(cudaGetLastError(), "absent");
  }
  FreeScratch();
  return status;
}

Status GpuHashTable::EvictLowest(int64_t count, const TableKeys& keep,
                                 const ExportOutputs& outputs, const TableContext& context) {
  const cudaStream_t stream = StreamOf(context);
  std::lock_guard<std::mutex> lock(mutex_);
  SOK_RETURN_IF_ERROR(init_status_);
  Exact e;
  SOK_RETURN_IF_ERROR(ReadCounters(&e, stream));
  DropSnapshots();
  count = std::max<int64_t>(0, std::min(count, e.size));
  float* state_out = nullptr;
  if (count == 0) {
    int64_t* keys = nullptr;
    float* values = nullptr;
    return outputs(0, &keys, &values, &state_out);
  }
  EvictedRows sink;
  sink.allocate = [&](int64_t n, int64_t** keys, float** values) {
    return outputs(n, keys, values, &state_out);
  };
  sink.allocate_state = [&](int64_t, float** state) {
    *state = state_out;
    return Status::Ok();
  };
  Status status = Evict(count, e.next_row, stream, &sink, &keep);
  if (status.ok()) {
    e.size -= count;
    e.free_count += count;
    SetBounds(e);
  }
  FreeScratch();
  return status;
}

Status GpuHashTable::Evict(int64_t count, int64_t next_row, cudaStream_t stream,
                           EvictedRows* evicted, const TableKeys* keep) {
  uint64_t* scores = nullptr;
  int64_t *rows = nullptr, *sorted_rows = nullptr;
  SOK_RETURN_IF_ERROR(Scratch(next_row, &scores));
  SOK_RETURN_IF_ERROR(Scratch(next_row, &rows));
  ScoreRows<<<Blocks(next_row), kThreads, 0, stream>>>(
      row_meta_, next_row, options_.evict_newest_of_equals, scores, rows);
  if (keep != nullptr && keep->n > 0) {
    ProtectRows<<<Blocks(keep->n), kThreads, 0, stream>>>(*keep, static_cast<const Slot*>(slots_),
                                                           num_slots_ - 1, scores);
  }
  SOK_RETURN_IF_ERROR(LowestRows(scores, rows, next_row, count, stream, &sorted_rows));
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
    if (evicted->allocate_state && options_.state_dim > 0) {
      float* state_out = nullptr;
      SOK_RETURN_IF_ERROR(evicted->allocate_state(count, &state_out));
      CopyEvictedState<<<Blocks(count * options_.state_dim), kThreads, 0, stream>>>(
          sorted_rows, count, state_, options_.state_dim, state_out);
    }
  }
  EvictRows<<<Blocks(count), kThreads, 0, stream>>>(sorted_rows, count, row_keys_,
                                                    static_cast<Slot*>(slots_), num_slots_ - 1,
                                                    counters_, free_rows_, row_meta_);
  return CudaStatus(cudaGetLastError(), "evict");
}
Status GpuHashTable::LowestRows(const uint64_t* scores, const int64_t* rows, int64_t n,
                               int64_t count, cudaStream_t stream, int64_t** lowest) {
  // Narrow the candidates a digit at a time to those at or below the count-th lowest score's
  // leading bits, then sort only them: the same rows, in the same (stable) order, as a sort of
  // all n, at a few passes over the scores instead of eight.
  unsigned int* counts = nullptr;
  SOK_RETURN_IF_ERROR(Scratch(kDigits, &counts));
  std::vector<unsigned int> host(kDigits);
  uint64_t prefix = 0;  // the count-th lowest score's bits from `high` up
  int64_t below = 0;    // scores below that prefix
  int64_t candidates = n;
  int high = 64;
  while (high > 0 && candidates > std::max<int64_t>(2 * count, kSmallSelection)) {
    const int width = std::min(kDigitBits, high);
    cudaMemsetAsync(counts, 0, kDigits * sizeof(unsigned int), stream);
    CountDigits<<<Blocks(n), kThreads, 0, stream>>>(scores, n, high, width, prefix, counts);
    cudaMemcpyAsync(host.data(), counts, kDigits * sizeof(unsigned int), cudaMemcpyDeviceToHost,
                    stream);
    SOK_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "evict: count digits"));
    int digit = 0;
    while (digit + 1 < (1 << width) && below + host[digit] < count) below += host[digit++];
    candidates = below + host[digit];
    prefix = (prefix << width) | static_cast<uint64_t>(digit);
    high -= width;
  }
  int64_t *picked = nullptr, *picked_count = nullptr, *sorted_rows = nullptr;
  uint64_t *picked_scores = nullptr, *sorted_scores = nullptr;
  SOK_RETURN_IF_ERROR(Scratch(candidates, &picked));
  SOK_RETURN_IF_ERROR(Scratch(1, &picked_count));
  SOK_RETURN_IF_ERROR(Scratch(candidates, &picked_scores));
  SOK_RETURN_IF_ERROR(Scratch(candidates, &sorted_scores));
  SOK_RETURN_IF_ERROR(Scratch(candidates, &sorted_rows));
  const int items = static_cast<int>(n), picks = static_cast<int>(candidates);
  const ScoreAtMost at_most{scores, high, prefix};
  size_t select_bytes = 0, sort_bytes = 0;
  cub::DeviceSelect::If(nullptr, select_bytes, rows, picked, picked_count, items, at_most, stream);
  cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, picked_scores, sorted_scores, picked,
                                  sorted_rows, picks, 0, 64, stream);
  char* temp = nullptr;
  SOK_RETURN_IF_ERROR(Scratch(std::max(select_bytes, sort_bytes), &temp));
  cub::DeviceSelect::If(temp, select_bytes, rows, picked, picked_count, items, at_most, stream);
  GatherScores<<<Blocks(candidates), kThreads, 0, stream>>>(scores, picked, candidates,
                                                            picked_scores);
  cub::DeviceRadixSort::SortPairs(temp, sort_bytes, picked_scores, sorted_scores, picked,
                                  sorted_rows, picks, 0, 64, stream);
  *lowest = sorted_rows;
  return CudaStatus(cudaGetLastError(), "evict: lowest scores");
}
Status GpuHashTable::AgeScores(const TableContext& context) {
  if (options_.evict != EvictStrategy::kLfu) return Status::Ok();
  const cudaStream_t stream = StreamOf(context);
  std::lock_guard<std::mutex> lock(mutex_);
  SOK_RETURN_IF_ERROR(init_status_);
  HalveScores<<<Blocks(row_capacity_ + 1), kThreads, 0, stream>>>(row_meta_, row_capacity_ + 1);
  return CudaStatus(cudaGetLastError(), "age scores");
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

}  // namespace sok
