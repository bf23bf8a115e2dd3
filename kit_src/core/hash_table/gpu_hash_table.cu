// The GPU table's bookkeeping (gpu_hash_table.cuh): allocation, the counters and their
// snapshots, room for new keys (growth of the slot array and the row pool, counting a call's
// new keys), size. Lookups, writes, the optimizer step and removals are in gpu_table_*.cu.
#include "kit_src/core/hash_table/gpu_table_internal.cuh"

namespace sok {
namespace {

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
__global__ void CopySize(const Counters* c, int64_t* out) {
  *out = static_cast<int64_t>(c->size);
}

}  // namespace

GpuHashTable::GpuHashTable(const HashTableOptions& options, const RowInitializer& initializer,
                           GpuMemory* memory)
    : DynamicTable(options), initializer_(initializer), memory_(memory), created_us_(NowMicros()) {}
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
void GpuHashTable::FreeScratch() {
  for (void* p : scratch_) memory_->Free(p);
  scratch_.clear();
}
uint32_t GpuHashTable::StampAt(int64_t time_us) const { return WriteStampAt(created_us_, time_us); }
uint32_t GpuHashTable::StampNow() const { return StampAt(NowMicros()); }
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
Status GpuHashTable::Size(int64_t* size_device, const TableContext& context) {
  const cudaStream_t stream = StreamOf(context);
  std::lock_guard<std::mutex> lock(mutex_);
  SOK_RETURN_IF_ERROR(init_status_);
  CopySize<<<1, 1, 0, stream>>>(counters_, size_device);
  return CudaStatus(cudaGetLastError(), "size");
}

}  // namespace sok
