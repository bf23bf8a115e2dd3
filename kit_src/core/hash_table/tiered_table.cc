#include "kit_src/core/hash_table/tiered_table.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <future>
#include <string>
#include <system_error>
#include <utility>

namespace sok {
namespace {

// Adds the nanoseconds of its scope to a counter (TierCounts' stage times).
class ScopedNanos {
 public:
  explicit ScopedNanos(int64_t* total) : total_(total), start_(Clock::now()) {}
  ~ScopedNanos() {
    *total_ += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start_)
                   .count();
  }
  ScopedNanos(const ScopedNanos&) = delete;
  ScopedNanos& operator=(const ScopedNanos&) = delete;

 private:
  using Clock = std::chrono::steady_clock;
  int64_t* total_;
  Clock::time_point start_;
};

class HostTierMemory final : public TierMemory {
 public:
  Status Allocate(int64_t bytes, void** out) override {
    *out = ::operator new(static_cast<size_t>(std::max<int64_t>(bytes, 1)));
    return Status::Ok();
  }
  void Free(void* pointer) override { ::operator delete(pointer); }
  Status ToHost(void* host, const void* hot, int64_t bytes, const TableContext&) override {
    if (bytes > 0) std::memcpy(host, hot, bytes);
    return Status::Ok();
  }
  Status FromHost(void* hot, const void* host, int64_t bytes, const TableContext&) override {
    if (bytes > 0) std::memcpy(hot, host, bytes);
    return Status::Ok();
  }
  Status Copy(void* to, const void* from, int64_t bytes, const TableContext&) override {
    if (bytes > 0) std::memcpy(to, from, bytes);
    return Status::Ok();
  }
  Status AllocateHost(int64_t bytes, void** out) override { return Allocate(bytes, out); }
  void FreeHost(void* pointer) override { Free(pointer); }
  Status ScatterRows(float* out, const int64_t* positions, const float* rows, int64_t count,
                     int64_t dim, const TableContext&) override {
    for (int64_t j = 0; j < count; ++j) std::copy_n(rows + j * dim, dim, out + positions[j] * dim);
    return Status::Ok();
  }
  Status Tally(const TableKeys& keys, const uint8_t* flags, int64_t* selected, int64_t* flagged,
               const TableContext&) override {
    *selected = *flagged = 0;
    int64_t key;
    for (int64_t i = 0; i < keys.n; ++i) {
      if (!KeyAt(keys, i, &key)) continue;
      ++*selected;
      *flagged += flags[i] != 0;
    }
    return Status::Ok();
  }
  Status Flagged(const TableKeys& keys, const uint8_t* flags, bool distinct,
                 std::vector<int64_t>* out, std::vector<int64_t>* positions,
                 const TableContext&) override {
    out->clear();
    if (positions != nullptr) positions->clear();
    int64_t key;
    for (int64_t i = 0; i < keys.n; ++i) {
      if (!KeyAt(keys, i, &key) || !flags[i]) continue;
      out->push_back(key);
      if (positions != nullptr) positions->push_back(i);
    }
    if (distinct) {
      std::sort(out->begin(), out->end());
      out->erase(std::unique(out->begin(), out->end()), out->end());
    }
    return Status::Ok();
  }
};

// The host table's calls run on the caller's threads.
TableContext HostContext(const TableContext& context) {
  TableContext host;
  host.parallel_for = context.parallel_for;
  return host;
}

// Rows a host table call hands out (Export, EvictLowest), kept on the host.
struct HostRows {
  std::vector<int64_t> keys;
  std::vector<float> values, state;
  ExportOutputs Receiver(int64_t dim, int64_t state_dim) {
    return [this, dim, state_dim](int64_t n, int64_t** k, float** v, float** s) {
      keys.resize(n);
      values.resize(n * dim);
      state.resize(n * state_dim);
      *k = keys.data();
      *v = values.data();
      if (s != nullptr) *s = state.data();
      return Status::Ok();
    };
  }
};

// Moves the entries j with keep[j] of `count` rows of `width` to the front, in order;
// returns how many there are.
template <typename T>
int64_t KeepRows(T* rows, const uint8_t* keep, int64_t count, int64_t width) {
  int64_t kept = 0;
  for (int64_t j = 0; j < count; ++j) {
    if (!keep[j]) continue;
    if (kept != j) std::copy_n(rows + j * width, width, rows + kept * width);
    ++kept;
  }
  return kept;
}

template <typename T>
std::vector<T> Pick(const std::vector<T>& from, const std::vector<int64_t>& index, int64_t width) {
  std::vector<T> out(index.size() * width);
  for (size_t j = 0; j < index.size(); ++j) {
    std::copy_n(from.begin() + index[j] * width, width, out.begin() + j * width);
  }
  return out;
}

}  // namespace

std::unique_ptr<TierMemory> NewHostTierMemory() { return std::make_unique<HostTierMemory>(); }

HashTableOptions HotTierOptions(const HashTableOptions& options, int64_t hot_bytes) {
  HashTableOptions hot = options;
  hot.max_capacity = hot_bytes / TieredTable::RowBytes(options.dim, options.value_type, 0);
  hot.init_capacity = std::max<int64_t>(1, std::min(options.init_capacity, hot.max_capacity));
  // Scores only (the tiered table keeps it below capacity): use counts, aged as rows turn
  // over, keep the often-used rows hot; of rows used equally often, the newest go first
  // (docs/design.md says why).
  hot.evict = EvictStrategy::kLfu;
  hot.evict_newest_of_equals = true;
  return hot;
}

HashTableOptions ColdTierOptions(const HashTableOptions& options) {
  HashTableOptions cold = options;
  cold.pooled_rows = true;
  return cold;
}

bool BudgetHoldsTable(const HashTableOptions& options, int64_t hot_bytes) {
  const int64_t widest = TieredTable::RowBytes(options.dim, options.value_type, 3 * options.dim);
  return hot_bytes / widest >= options.max_capacity;
}

Status CheckHotBudget(const HashTableOptions& options, int64_t hot_bytes) {
  const int64_t row = TieredTable::RowBytes(options.dim, options.value_type, 0);
  if (hot_bytes >= row) return Status::Ok();
  return Status::InvalidArgument("an HBM budget of " + std::to_string(hot_bytes) +
                                 " bytes holds no row of this table (a row is " +
                                 std::to_string(row) + " bytes)");
}

// Hot-tier memory for one call, with the hot tier's handouts and uploads.
class TieredTable::HotBuffer : public TierScratch {
 public:
  using TierScratch::TierScratch;
  // Rows a hot-table call hands out (Export, EvictLowest), in this buffer.
  struct Rows {
    int64_t n = 0;
    int64_t* keys = nullptr;
    float *values = nullptr, *state = nullptr;
  };
  ExportOutputs Receiver(int64_t dim, int64_t state_dim, Rows* rows) {
    return [this, dim, state_dim, rows](int64_t n, int64_t** k, float** v, float** s) {
      rows->n = n;
      SOK_RETURN_IF_ERROR(Get(n, &rows->keys));
      SOK_RETURN_IF_ERROR(Get(n * dim, &rows->values));
      SOK_RETURN_IF_ERROR(Get(n * state_dim, &rows->state));
      *k = rows->keys;
      *v = rows->values;
      if (s != nullptr) *s = rows->state;
      return Status::Ok();
    };
  }
  // A hot copy of `count` elements of a host array.
  template <typename T>
  Status Upload(const T* host, int64_t count, T** out, const TableContext& context) {
    SOK_RETURN_IF_ERROR(Get(count, out));
    return memory_->FromHost(*out, host, count * sizeof(T), context);
  }
};

TieredTable::TieredTable(const HashTableOptions& options, int64_t hot_bytes,
                         std::shared_ptr<DynamicTable> hot, std::unique_ptr<CpuHashTable> cold,
                         std::unique_ptr<TierMemory> memory)
    : DynamicTable(options),
      hot_bytes_(hot_bytes),
      hot_(std::move(hot)),
      cold_(std::move(cold)),
      memory_(std::move(memory)) {}

TieredTable::~TieredTable() {
  (void)FinishWriteBack();  // the staging arrays it reads are freed below
  for (void* pointer : staging_) {
    if (pointer != nullptr) memory_->FreeHost(pointer);
  }
}

template <typename T>
Status TieredTable::Stage(Staging which, int64_t count, T** out) {
  const int64_t bytes = std::max<int64_t>(count, 1) * static_cast<int64_t>(sizeof(T));
  if (bytes > staging_bytes_[which]) {
    const int64_t grown = std::max(bytes, staging_bytes_[which] + staging_bytes_[which] / 2);
    if (staging_[which] != nullptr) memory_->FreeHost(staging_[which]);
    staging_[which] = nullptr;
    staging_bytes_[which] = 0;
    SOK_RETURN_IF_ERROR(memory_->AllocateHost(grown, &staging_[which]));
    staging_bytes_[which] = grown;
  }
  *out = static_cast<T*>(staging_[which]);
  return Status::Ok();
}

int64_t TieredTable::RowBytes(int64_t dim, ValueType value_type, int64_t state_dim) {
  const int64_t value_bytes = value_type == ValueType::kFloat32 ? 4 : 2;
  return dim * value_bytes + state_dim * static_cast<int64_t>(sizeof(float));
}

int64_t TieredTable::hot_row_budget() const {
  return hot_bytes_ / RowBytes(options_.dim, options_.value_type, hot_->state_dim());
}

Status TieredTable::AllHot(const TableKeys& keys, HotBuffer* buffer, uint8_t** hot_flags,
                           bool* all_hot, int64_t* selected, const TableContext& context,
                           int64_t* absent_ids) {
  int64_t absent = 0;
  SOK_RETURN_IF_ERROR(buffer->Get(keys.n, hot_flags));
  SOK_RETURN_IF_ERROR(hot_->Absent(keys, *hot_flags, context));
  SOK_RETURN_IF_ERROR(memory_->Tally(keys, *hot_flags, selected, &absent, context));
  *all_hot = absent == 0;
  if (absent_ids != nullptr) *absent_ids = absent;
  return Status::Ok();
}

Status TieredTable::DistinctHotKeys(const TableKeys& keys, const uint8_t* hot_flags,
                                    int64_t* count, const TableContext& context) {
  std::vector<int64_t> key, hot_keys;
  std::vector<uint8_t> absent;
  SOK_RETURN_IF_ERROR(Split(keys, hot_flags, &key, &absent, nullptr, context));
  for (size_t j = 0; j < key.size(); ++j) {
    if (!absent[j]) hot_keys.push_back(key[j]);
  }
  std::sort(hot_keys.begin(), hot_keys.end());
  *count = std::unique(hot_keys.begin(), hot_keys.end()) - hot_keys.begin();
  return Status::Ok();
}

Status TieredTable::Split(const TableKeys& keys, const uint8_t* hot_flags,
                          std::vector<int64_t>* key, std::vector<uint8_t>* absent,
                          std::vector<int64_t>* position, const TableContext& context) {
  std::vector<int64_t> raw(keys.n * keys.stride);
  std::vector<uint8_t> flags(keys.n);
  HotBuffer buffer(memory_.get());
  if (hot_flags == nullptr) {
    uint8_t* asked = nullptr;
    SOK_RETURN_IF_ERROR(buffer.Get(keys.n, &asked));
    SOK_RETURN_IF_ERROR(hot_->Absent(keys, asked, context));
    hot_flags = asked;
  }
  SOK_RETURN_IF_ERROR(memory_->ToHost(raw.data(), keys.data, raw.size() * sizeof(int64_t), context));
  SOK_RETURN_IF_ERROR(memory_->ToHost(flags.data(), hot_flags, keys.n, context));
  const TableKeys host_keys{raw.data(), keys.n, keys.stride, keys.table};
  for (int64_t i = 0; i < keys.n; ++i) {
    int64_t selected = 0;
    if (!KeyAt(host_keys, i, &selected)) continue;
    key->push_back(selected);
    absent->push_back(flags[i]);
    if (position != nullptr) position->push_back(i);
  }
  return Status::Ok();
}

int64_t TieredTable::DemoteCount(int64_t incoming, int64_t keep) const {
  const int64_t overflow = hot_size() + incoming - hot_row_budget();
  if (overflow <= 0) return 0;
  return std::min(overflow + hot_row_budget() / 16, hot_size() - keep);
}

Status TieredTable::FinishWriteBack() {
  if (!write_back_.valid()) return Status::Ok();
  Status status;
  {
    ScopedNanos wait(&counts_.write_back_wait_ns);
    status = write_back_.get();
  }
  counts_.write_back_ns += write_back_ns_;  // the future's get() ordered its write
  std::function<Status()> retry = std::move(pending_write_back_);
  pending_write_back_ = nullptr;
  // A failed insertion changed nothing and the rows are still staged: once more, here.
  return status.ok() ? status : retry();
}

Status TieredTable::Demote(int64_t batch, const TableKeys& keep, const TableContext& context) {
  const int64_t dim = options_.dim, state_dim = hot_->state_dim();
  if (batch <= 0) return Status::Ok();
  // Host memory for the rows first (the table's and the copies'): when it runs out, nothing
  // has moved.
  SOK_RETURN_IF_ERROR(cold_->GrowFor(batch));
  int64_t* host_keys = nullptr;
  float *host_values = nullptr, *host_state = nullptr;
  SOK_RETURN_IF_ERROR(Stage(kDownKeys, batch, &host_keys));
  SOK_RETURN_IF_ERROR(Stage(kDownValues, batch * dim, &host_values));
  SOK_RETURN_IF_ERROR(Stage(kDownState, batch * state_dim, &host_state));
  HotBuffer buffer(memory_.get());
  HotBuffer::Rows moved;
  SOK_RETURN_IF_ERROR(
      hot_->EvictLowest(batch, keep, buffer.Receiver(dim, state_dim, &moved), context));
  const int64_t n = moved.n;  // at most batch
  SOK_RETURN_IF_ERROR(memory_->ToHost(host_keys, moved.keys, n * 8, context));
  SOK_RETURN_IF_ERROR(memory_->ToHost(host_values, moved.values, n * dim * 4, context));
  SOK_RETURN_IF_ERROR(memory_->ToHost(host_state, moved.state, n * state_dim * 4, context));
  hot_size_ -= n;
  counts_.moved_down += n;
  LendCapacity();
  // The host inserts them while the GPU goes on (the rest of this lookup, the step's forward
  // and backward); every call that reads the host tier waits for it first. GrowFor made room.
  const float* staged_state = state_dim ? host_state : nullptr;
  const TableContext host = HostContext(context);
  pending_write_back_ = [this, host_keys, n, host_values, staged_state, host]() -> Status {
    write_back_ns_ = 0;
    ScopedNanos insert_time(&write_back_ns_);
    try {
      return cold_->InsertNew(host_keys, n, host_values, staged_state, host);
    } catch (const std::exception& error) {
      return Status::ResourceExhausted(std::string("moving rows to host memory: ") +
                                       error.what());
    }
  };
  try {
    write_back_ = std::async(std::launch::async, pending_write_back_);
  } catch (const std::system_error&) {  // no thread to be had: the first wait runs it
    write_back_ = std::async(std::launch::deferred, pending_write_back_);
  }
  // Once as many rows as the hot tier holds have moved down, use counts halve: rows used
  // often long ago give way to rows in use now.
  moved_since_aging_ += n;
  if (moved_since_aging_ < hot_row_budget()) return Status::Ok();
  moved_since_aging_ = 0;
  return hot_->AgeScores(context);
}

Status TieredTable::TakeUp(const std::vector<int64_t>& keys, float admit_probability,
                           EvictedRows* evicted, RowsUp* up, const TableContext& context) {
  const int64_t n = static_cast<int64_t>(keys.size());
  up->state_dim = cold_->state_dim();
  SOK_RETURN_IF_ERROR(Stage(kUpValues, n * options_.dim, &up->values));
  SOK_RETURN_IF_ERROR(Stage(kUpState, n * up->state_dim, &up->state));
  SOK_RETURN_IF_ERROR(Stage(kUpFound, n, &up->found));
  return cold_->TakeOrAdmit(keys.data(), n, admit_probability, up->values, up->state,
                            up->found, evicted, HostContext(context));
}

Status TieredTable::PutBack(const std::vector<int64_t>& keys, const RowsUp& up,
                            const TableContext& context) {
  std::vector<int64_t> back = keys;
  const int64_t n = static_cast<int64_t>(keys.size());
  const int64_t count = KeepRows(back.data(), up.found, n, 1);
  KeepRows(up.values, up.found, n, options_.dim);
  KeepRows(up.state, up.found, n, up.state_dim);
  return cold_->InsertNew(back.data(), count, up.values, up.state_dim ? up.state : nullptr,
                          HostContext(context));
}

Status TieredTable::MoveUp(const std::vector<int64_t>& keys, const RowsUp& up,
                           const TableContext& context) {
  const int64_t n = static_cast<int64_t>(keys.size());
  // Keys the host table refused (the filter) do not move.
  std::vector<int64_t> moving = keys;
  const int64_t count = KeepRows(moving.data(), up.found, n, 1);
  if (count == 0) return Status::Ok();
  if (count < n) {
    KeepRows(up.values, up.found, n, options_.dim);
    KeepRows(up.state, up.found, n, up.state_dim);
  }
  SOK_RETURN_IF_ERROR(
      AssignHot(moving.data(), up.values, up.state, count, up.state_dim > 0, context));
  hot_size_ += count;
  counts_.moved_up += count;
  return Status::Ok();
}

Status TieredTable::AssignHot(const int64_t* keys, const float* values, const float* state,
                              int64_t count, bool with_state, const TableContext& context) {
  const int64_t dim = options_.dim, state_dim = with_state ? hot_->state_dim() : 0;
  HotBuffer buffer(memory_.get());
  int64_t* hot_keys = nullptr;
  float *hot_values = nullptr, *hot_state = nullptr;
  SOK_RETURN_IF_ERROR(buffer.Upload(keys, count, &hot_keys, context));
  SOK_RETURN_IF_ERROR(buffer.Upload(values, count * dim, &hot_values, context));
  SOK_RETURN_IF_ERROR(buffer.Upload(state, count * state_dim, &hot_state, context));
  return hot_->InsertOrAssign(hot_keys, count, hot_values, with_state ? hot_state : nullptr,
                              context);
}

Status TieredTable::HandOutEvicted(const std::vector<int64_t>& keys,
                                   const std::vector<float>& values, EvictedRows* evicted,
                                   const TableContext& context) {
  const int64_t count = static_cast<int64_t>(keys.size());
  if (evicted == nullptr || count == 0) return Status::Ok();
  int64_t* out_keys = nullptr;
  float* out_values = nullptr;
  SOK_RETURN_IF_ERROR(evicted->allocate(count, &out_keys, &out_values));
  evicted->count = count;
  SOK_RETURN_IF_ERROR(memory_->FromHost(out_keys, keys.data(), count * 8, context));
  return memory_->FromHost(out_values, values.data(), values.size() * 4, context);
}

Status TieredTable::ExactHotSize(const TableContext& context) {
  if (hot_size_exact_) return Status::Ok();
  HotBuffer buffer(memory_.get());
  int64_t* size = nullptr;
  SOK_RETURN_IF_ERROR(buffer.Get(1, &size));
  SOK_RETURN_IF_ERROR(hot_->Size(size, context));
  SOK_RETURN_IF_ERROR(memory_->ToHost(&hot_size_, size, sizeof(int64_t), context));
  hot_size_exact_ = true;
  return Status::Ok();
}

Status TieredTable::HotTierAlone(int64_t incoming, const TableContext& context, bool* alone) {
  const auto fits = [&] {
    return !write_back_.valid() && cold_size() == 0 &&
           hot_size_ + incoming <= hot_row_budget() &&
           hot_size_ + incoming <= options_.max_capacity;
  };
  *alone = fits();
  if (*alone) return Status::Ok();  // by the bound: no wait
  SOK_RETURN_IF_ERROR(ExactHotSize(context));
  *alone = fits();
  return Status::Ok();
}

bool TieredTable::Tiers(TierCounts* counts, const TableContext& context) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!FinishWriteBack().ok() || !ExactHotSize(context).ok()) return false;
  *counts = counts_;
  counts->hot_keys = hot_size();
  counts->host_keys = cold_size();
  return true;
}

Status TieredTable::Size(int64_t* size, const TableContext& context) {
  std::lock_guard<std::mutex> lock(mutex_);
  SOK_RETURN_IF_ERROR(FinishWriteBack());
  SOK_RETURN_IF_ERROR(ExactHotSize(context));
  const int64_t total = hot_size() + cold_size();
  return memory_->FromHost(size, &total, sizeof(total), context);
}

Status TieredTable::Find(const TableKeys& keys, float* values, const TableContext& context) {
  std::lock_guard<std::mutex> lock(mutex_);
  SOK_RETURN_IF_ERROR(FinishWriteBack());
  SOK_RETURN_IF_ERROR(hot_->Find(keys, values, context));
  if (cold_size() == 0 || keys.n == 0) return Status::Ok();
  HotBuffer flags_buffer(memory_.get());
  uint8_t* hot_flags = nullptr;
  bool all_hot = false;
  int64_t selected = 0;
  SOK_RETURN_IF_ERROR(AllHot(keys, &flags_buffer, &hot_flags, &all_hot, &selected, context));
  if (all_hot) return Status::Ok();
  std::vector<int64_t> cold_keys, cold_at;
  SOK_RETURN_IF_ERROR(memory_->Flagged(keys, hot_flags, false, &cold_keys, &cold_at, context));
  if (cold_keys.empty()) return Status::Ok();
  const int64_t count = static_cast<int64_t>(cold_keys.size());
  float* rows = nullptr;
  SOK_RETURN_IF_ERROR(Stage(kUpValues, count * options_.dim, &rows));
  SOK_RETURN_IF_ERROR(
      cold_->Find(TableKeys{cold_keys.data(), count, 1, 0}, rows, HostContext(context)));
  return memory_->ScatterRows(values, cold_at.data(), rows, count, options_.dim, context);
}

Status TieredTable::FindOrInsert(const TableKeys& keys, float* values, float admit_probability,
                                 EvictedRows* evicted, const TableContext& context) {
  std::lock_guard<std::mutex> lock(mutex_);
  // The last write-back goes on while the hot tier sorts the batch into hits and misses;
  // the lookup waits for it (the wait counted here too) just before it reads the host tier.
  ScopedNanos lookup_time(&counts_.lookup_ns);
  bool alone = false;
  SOK_RETURN_IF_ERROR(HotTierAlone(keys.stride == 1 ? keys.n : INT64_MAX / 4, context, &alone));
  if (alone) {
    SOK_RETURN_IF_ERROR(hot_->FindOrInsert(keys, values, admit_probability, evicted, context));
    hot_size_ += keys.n;
    hot_size_exact_ = false;
    counts_.ids_looked_up += keys.n;
    counts_.hot_hits += keys.n;
    return Status::Ok();
  }
  HotBuffer flags_buffer(memory_.get());
  uint8_t* hot_flags = nullptr;
  bool all_hot = false;
  int64_t selected = 0, absent_ids = 0;
  SOK_RETURN_IF_ERROR(
      AllHot(keys, &flags_buffer, &hot_flags, &all_hot, &selected, context, &absent_ids));
  if (all_hot) {  // a use of each key (nothing is admitted) gives the rows and their scores
    counts_.ids_looked_up += selected;
    counts_.hot_hits += selected;
    return hot_->FindOrInsert(keys, values, 0.0f, nullptr, context);
  }
  // Only the batch's distinct misses come to the host.
  std::vector<int64_t> missing;
  SOK_RETURN_IF_ERROR(memory_->Flagged(keys, hot_flags, true, &missing, nullptr, context));
  const int64_t hits = selected - absent_ids;
  const int64_t budget = hot_row_budget(), misses = static_cast<int64_t>(missing.size());
  // The batch's hot keys (at most `hits`, exactly when that already fits) and its misses
  // must fit the hot tier together.
  int64_t batch_hot = hits;
  if (hits + misses > budget) SOK_RETURN_IF_ERROR(DistinctHotKeys(keys, hot_flags, &batch_hot, context));
  if (batch_hot + misses > budget) {
    return Status::InvalidArgument(
        "a lookup of " + std::to_string(batch_hot + misses) + " distinct keys does not fit the "
        "tiered table's HBM budget of " + std::to_string(hot_bytes_) + " bytes (" +
        std::to_string(budget) + " rows of " +
        std::to_string(RowBytes(options_.dim, options_.value_type, hot_->state_dim())) +
        " bytes with optimizer state); raise max_hbm_for_vectors");
  }
  counts_.ids_looked_up += selected;
  counts_.hot_hits += hits;
  // Host memory for the misses and the rows moving down, before anything changes.
  const int64_t demoted = DemoteCount(misses, batch_hot);
  if (demoted < hot_size() + misses - budget) {
    return Status::Internal("tiered table: the hot tier cannot make room for " +
                            std::to_string(misses) + " rows");
  }
  std::vector<int64_t> evicted_keys;
  std::vector<float> evicted_values;
  RowsUp up;
  SOK_RETURN_IF_ERROR(FinishWriteBack());
  {
    ScopedNanos take_up_time(&counts_.take_up_ns);
    // Room for the rows moving down, and for the misses' rows should they have to go back.
    SOK_RETURN_IF_ERROR(cold_->GrowFor(misses + demoted));
    if (!missing.empty()) {
      // The host table hands out the misses' rows, initialises those of keys new to the whole
      // table that its filter admits, and evicts its coldest keys past max_capacity.
      LendCapacity();
      EvictedRows host_evicted;
      host_evicted.allocate = [&](int64_t count, int64_t** k, float** v) {
        evicted_keys.resize(count);
        evicted_values.resize(count * options_.dim);
        *k = evicted_keys.data();
        *v = evicted_values.data();
        return Status::Ok();
      };
      SOK_RETURN_IF_ERROR(TakeUp(missing, admit_probability, &host_evicted, &up, context));
    }
  }
  Status demoted_status;
  {
    ScopedNanos move_down_time(&counts_.move_down_ns);
    demoted_status = Demote(demoted, keys, context);  // none of the batch's rows
  }
  if (!demoted_status.ok()) {  // the misses' rows go back where they were
    const Status written = FinishWriteBack();
    if (!missing.empty()) SOK_RETURN_IF_ERROR(PutBack(missing, up, context));
    SOK_RETURN_IF_ERROR(written);
    return demoted_status;
  }
  if (!missing.empty()) {
    ScopedNanos move_up_time(&counts_.move_up_ns);
    SOK_RETURN_IF_ERROR(MoveUp(missing, up, context));
  }
  SOK_RETURN_IF_ERROR(HandOutEvicted(evicted_keys, evicted_values, evicted, context));
  // Every row of the batch is hot now: a use of each id (nothing is admitted) gives the rows
  // and counts the uses, of the rows that moved up too.
  return hot_->FindOrInsert(keys, values, 0.0f, nullptr, context);
}

Status TieredTable::InsertOrAssign(const int64_t* keys, int64_t n, const float* values,
                                   const float* state, const TableContext& context) {
  std::lock_guard<std::mutex> lock(mutex_);
  SOK_RETURN_IF_ERROR(FinishWriteBack());
  bool alone = false;
  SOK_RETURN_IF_ERROR(HotTierAlone(n, context, &alone));
  if (alone) {
    SOK_RETURN_IF_ERROR(hot_->InsertOrAssign(keys, n, values, state, context));
    hot_size_ += n;
    hot_size_exact_ = false;
    return Status::Ok();
  }
  std::vector<int64_t> key;
  std::vector<uint8_t> absent;
  SOK_RETURN_IF_ERROR(Split(TableKeys{keys, n, 1, 0}, nullptr, &key, &absent, nullptr, context));
  std::vector<int64_t> hot_at, cold_at;
  for (int64_t j = 0; j < n; ++j) (absent[j] ? cold_at : hot_at).push_back(j);
  if (cold_at.empty()) return hot_->InsertOrAssign(keys, n, values, state, context);
  // Hot keys are assigned in the hot tier, the others on the host.
  const int64_t dim = options_.dim, state_dim = state != nullptr ? hot_->state_dim() : 0;
  std::vector<float> host_values(n * dim), host_state(n * state_dim);
  SOK_RETURN_IF_ERROR(memory_->ToHost(host_values.data(), values, n * dim * 4, context));
  SOK_RETURN_IF_ERROR(memory_->ToHost(host_state.data(), state, n * state_dim * 4, context));
  if (!hot_at.empty()) {
    const int64_t count = static_cast<int64_t>(hot_at.size());
    SOK_RETURN_IF_ERROR(AssignHot(Pick(key, hot_at, 1).data(), Pick(host_values, hot_at, dim).data(),
                                  Pick(host_state, hot_at, state_dim).data(), count,
                                  state != nullptr, context));
  }
  LendCapacity();
  const std::vector<float> cold_state = Pick(host_state, cold_at, state_dim);
  return cold_->InsertOrAssign(Pick(key, cold_at, 1).data(), static_cast<int64_t>(cold_at.size()),
                               Pick(host_values, cold_at, dim).data(),
                               state ? cold_state.data() : nullptr, HostContext(context));
}

Status TieredTable::Replace(const int64_t* keys, int64_t n, const float* values,
                            const float* state, int64_t state_dim, const TableContext& context) {
  std::lock_guard<std::mutex> lock(mutex_);
  SOK_RETURN_IF_ERROR(FinishWriteBack());
  if (n > options_.max_capacity) {
    return Status::ResourceExhausted("restoring " + std::to_string(n) +
                                     " keys into a table whose max_capacity is " +
                                     std::to_string(options_.max_capacity));
  }
  const int64_t dim = options_.dim, width = state != nullptr ? state_dim : 0;
  std::vector<int64_t> host_keys(n);
  std::vector<float> host_values(n * dim), host_state(n * width);
  SOK_RETURN_IF_ERROR(memory_->ToHost(host_keys.data(), keys, n * 8, context));
  SOK_RETURN_IF_ERROR(memory_->ToHost(host_values.data(), values, n * dim * 4, context));
  SOK_RETURN_IF_ERROR(memory_->ToHost(host_state.data(), state, n * width * 4, context));
  // Everything restored lands on the host; rows rise to the hot tier as they are used.
  SOK_RETURN_IF_ERROR(hot_->Replace(nullptr, 0, nullptr, nullptr, state_dim, context));
  hot_size_ = 0;
  hot_size_exact_ = true;
  cold_->SetMaxCapacity(options_.max_capacity);
  SOK_RETURN_IF_ERROR(cold_->Replace(host_keys.data(), n, host_values.data(),
                                     state ? host_state.data() : nullptr, state_dim,
                                     HostContext(context)));
  options_.state_dim = hot_->state_dim();
  return Status::Ok();
}

Status TieredTable::Erase(const int64_t* keys, int64_t n, int64_t* erased,
                          const TableContext& context) {
  std::lock_guard<std::mutex> lock(mutex_);
  SOK_RETURN_IF_ERROR(FinishWriteBack());
  std::vector<int64_t> key(n);
  SOK_RETURN_IF_ERROR(memory_->ToHost(key.data(), keys, n * 8, context));
  HotBuffer buffer(memory_.get());
  int64_t* hot_count = nullptr;
  SOK_RETURN_IF_ERROR(buffer.Get(1, &hot_count));
  SOK_RETURN_IF_ERROR(hot_->Erase(keys, n, hot_count, context));
  int64_t hot_erased = 0, cold_erased = 0;
  SOK_RETURN_IF_ERROR(memory_->ToHost(&hot_erased, hot_count, sizeof(int64_t), context));
  SOK_RETURN_IF_ERROR(cold_->Erase(key.data(), n, &cold_erased, HostContext(context)));
  hot_size_ -= hot_erased;
  const int64_t total = hot_erased + cold_erased;
  return memory_->FromHost(erased, &total, sizeof(total), context);
}

Status TieredTable::Export(int64_t written_after_us, bool with_state, const ExportOutputs& outputs,
                           const TableContext& context) {
  std::lock_guard<std::mutex> lock(mutex_);
  SOK_RETURN_IF_ERROR(FinishWriteBack());
  HotBuffer buffer(memory_.get());
  const int64_t dim = options_.dim, state_dim = with_state ? hot_->state_dim() : 0;
  HotBuffer::Rows hot;
  SOK_RETURN_IF_ERROR(
      hot_->Export(written_after_us, with_state, buffer.Receiver(dim, state_dim, &hot), context));
  const int64_t hot_n = hot.n;
  HostRows cold;
  SOK_RETURN_IF_ERROR(cold_->Export(written_after_us, with_state,
                                    cold.Receiver(dim, state_dim), HostContext(context)));
  const int64_t cold_n = static_cast<int64_t>(cold.keys.size());
  int64_t* keys = nullptr;
  float *values = nullptr, *state = nullptr;
  SOK_RETURN_IF_ERROR(outputs(hot_n + cold_n, &keys, &values, with_state ? &state : nullptr));
  SOK_RETURN_IF_ERROR(memory_->Copy(keys, hot.keys, hot_n * 8, context));
  SOK_RETURN_IF_ERROR(memory_->Copy(values, hot.values, hot_n * dim * 4, context));
  SOK_RETURN_IF_ERROR(memory_->FromHost(keys + hot_n, cold.keys.data(), cold_n * 8, context));
  SOK_RETURN_IF_ERROR(
      memory_->FromHost(values + hot_n * dim, cold.values.data(), cold_n * dim * 4, context));
  if (!with_state) return Status::Ok();
  SOK_RETURN_IF_ERROR(memory_->Copy(state, hot.state, hot_n * state_dim * 4, context));
  return memory_->FromHost(state + hot_n * state_dim, cold.state.data(),
                           cold_n * state_dim * 4, context);
}

Status TieredTable::MatchColdState(const SparseUpdate& update, const TableContext& context) {
  options_.state_dim = hot_->state_dim();
  options_.state_initial_value = hot_->options().state_initial_value;
  // A write-back reads the host table's state width, never changes it: no wait to read it.
  if (cold_->state_dim() >= hot_->state_dim()) return Status::Ok();
  SOK_RETURN_IF_ERROR(FinishWriteBack());
  std::vector<float> hyper(update.hyper_count);
  SOK_RETURN_IF_ERROR(memory_->ToHost(hyper.data(), update.hyper, hyper.size() * 4, context));
  SparseUpdate widen = update;
  widen.hyper = hyper.data();
  widen.keys = nullptr;
  widen.grads = nullptr;
  widen.n = 0;
  widen.state_dim = hot_->state_dim();
  return cold_->ApplySparseUpdate(widen, HostContext(context));
}

Status TieredTable::ApplySparseUpdate(const SparseUpdate& update, const TableContext& context) {
  std::lock_guard<std::mutex> lock(mutex_);
  // A training step's update follows its lookup, whose rows are all hot: the host tier's
  // write-back goes on beside it unless the update needs host rows.
  if (!write_back_.valid() && cold_size() == 0) {  // every row is hot
    SOK_RETURN_IF_ERROR(hot_->ApplySparseUpdate(update, context));
    return MatchColdState(update, context);
  }
  const TableKeys keys{update.keys, update.n, 1, 0};
  HotBuffer flags_buffer(memory_.get());
  uint8_t* hot_flags = nullptr;
  bool all_hot = false;
  int64_t selected = 0;
  SOK_RETURN_IF_ERROR(AllHot(keys, &flags_buffer, &hot_flags, &all_hot, &selected, context));
  if (all_hot) {  // as after a lookup: every row is hot
    SOK_RETURN_IF_ERROR(hot_->ApplySparseUpdate(update, context));
    return MatchColdState(update, context);
  }
  SOK_RETURN_IF_ERROR(FinishWriteBack());
  std::vector<int64_t> key;
  std::vector<uint8_t> absent;
  SOK_RETURN_IF_ERROR(Split(keys, hot_flags, &key, &absent, nullptr, context));
  std::vector<int64_t> hot_at, cold_at;
  for (int64_t j = 0; j < update.n; ++j) (absent[j] ? cold_at : hot_at).push_back(j);
  // Rows that moved down since their lookup are updated where they are now.
  const int64_t dim = options_.dim;
  std::vector<float> grads(update.n * dim), hyper(update.hyper_count);
  SOK_RETURN_IF_ERROR(memory_->ToHost(grads.data(), update.grads, grads.size() * 4, context));
  SOK_RETURN_IF_ERROR(memory_->ToHost(hyper.data(), update.hyper, hyper.size() * 4, context));
  HotBuffer buffer(memory_.get());
  SparseUpdate hot_update = update;
  int64_t* hot_keys = nullptr;
  float* hot_grads = nullptr;
  const int64_t hot_n = static_cast<int64_t>(hot_at.size());
  SOK_RETURN_IF_ERROR(buffer.Upload(Pick(key, hot_at, 1).data(), hot_n, &hot_keys, context));
  SOK_RETURN_IF_ERROR(
      buffer.Upload(Pick(grads, hot_at, dim).data(), hot_n * dim, &hot_grads, context));
  hot_update.keys = hot_keys;
  hot_update.grads = hot_grads;
  hot_update.n = hot_n;
  SOK_RETURN_IF_ERROR(hot_->ApplySparseUpdate(hot_update, context));
  SOK_RETURN_IF_ERROR(MatchColdState(update, context));
  const std::vector<int64_t> cold_keys = Pick(key, cold_at, 1);
  const std::vector<float> cold_grads = Pick(grads, cold_at, dim);
  SparseUpdate cold_update = update;
  cold_update.hyper = hyper.data();
  cold_update.keys = cold_keys.data();
  cold_update.grads = cold_grads.data();
  cold_update.n = static_cast<int64_t>(cold_at.size());
  return cold_->ApplySparseUpdate(cold_update, HostContext(context));
}

Status TieredTable::Take(const int64_t* keys, int64_t n, float* values, float* state,
                         uint8_t* found, const TableContext& context) {
  std::lock_guard<std::mutex> lock(mutex_);
  SOK_RETURN_IF_ERROR(FinishWriteBack());
  const int64_t dim = options_.dim, state_dim = state != nullptr ? hot_->state_dim() : 0;
  std::vector<int64_t> key;
  std::vector<uint8_t> absent;
  SOK_RETURN_IF_ERROR(Split(TableKeys{keys, n, 1, 0}, nullptr, &key, &absent, nullptr, context));
  SOK_RETURN_IF_ERROR(hot_->Take(keys, n, values, state, found, context));
  std::vector<int64_t> cold_keys, cold_at;
  for (int64_t j = 0; j < n; ++j) {
    if (!absent[j]) {
      --hot_size_;
    } else {
      cold_keys.push_back(key[j]);
      cold_at.push_back(j);
    }
  }
  const int64_t count = static_cast<int64_t>(cold_keys.size());
  if (count == 0 || cold_size() == 0) return Status::Ok();
  std::vector<float> cold_values(count * dim), cold_state(count * state_dim);
  std::vector<uint8_t> cold_found(count);
  SOK_RETURN_IF_ERROR(cold_->Take(cold_keys.data(), count, cold_values.data(),
                                  state ? cold_state.data() : nullptr, cold_found.data(),
                                  HostContext(context)));
  // Merged on the host: the hot tier's outputs with the host rows put in their places.
  std::vector<float> out_values(n * dim), out_state(n * state_dim);
  std::vector<uint8_t> out_found(n);
  SOK_RETURN_IF_ERROR(memory_->ToHost(out_values.data(), values, n * dim * 4, context));
  SOK_RETURN_IF_ERROR(memory_->ToHost(out_state.data(), state, n * state_dim * 4, context));
  SOK_RETURN_IF_ERROR(memory_->ToHost(out_found.data(), found, n, context));
  for (int64_t j = 0; j < count; ++j) {
    const int64_t at = cold_at[j];
    out_found[at] = cold_found[j];
    std::copy_n(cold_values.begin() + j * dim, dim, out_values.begin() + at * dim);
    std::copy_n(cold_state.begin() + j * state_dim, state_dim, out_state.begin() + at * state_dim);
  }
  SOK_RETURN_IF_ERROR(memory_->FromHost(values, out_values.data(), n * dim * 4, context));
  SOK_RETURN_IF_ERROR(memory_->FromHost(state, out_state.data(), n * state_dim * 4, context));
  return memory_->FromHost(found, out_found.data(), n, context);
}

Status TieredTable::Absent(const TableKeys& keys, uint8_t* absent, const TableContext& context) {
  std::lock_guard<std::mutex> lock(mutex_);
  SOK_RETURN_IF_ERROR(FinishWriteBack());
  std::vector<int64_t> key, position;
  std::vector<uint8_t> hot_absent;
  SOK_RETURN_IF_ERROR(Split(keys, nullptr, &key, &hot_absent, &position, context));
  std::vector<int64_t> cold_keys;
  for (size_t j = 0; j < key.size(); ++j) cold_keys.push_back(key[j]);
  std::vector<uint8_t> cold_absent(cold_keys.size());
  SOK_RETURN_IF_ERROR(cold_->Absent(
      TableKeys{cold_keys.data(), static_cast<int64_t>(cold_keys.size()), 1, 0},
      cold_absent.data(), HostContext(context)));
  std::vector<uint8_t> out(keys.n, 0);
  for (size_t j = 0; j < key.size(); ++j) out[position[j]] = hot_absent[j] && cold_absent[j];
  return memory_->FromHost(absent, out.data(), keys.n, context);
}

Status TieredTable::AgeScores(const TableContext& context) {
  std::lock_guard<std::mutex> lock(mutex_);
  SOK_RETURN_IF_ERROR(FinishWriteBack());
  SOK_RETURN_IF_ERROR(hot_->AgeScores(context));
  return cold_->AgeScores(HostContext(context));
}

Status TieredTable::EvictLowest(int64_t count, const TableKeys& keep, const ExportOutputs& outputs,
                                const TableContext& context) {
  // The host tier holds the least used rows: they go first.
  std::lock_guard<std::mutex> lock(mutex_);
  SOK_RETURN_IF_ERROR(FinishWriteBack());
  std::vector<int64_t> kept(keep.n * keep.stride);
  SOK_RETURN_IF_ERROR(memory_->ToHost(kept.data(), keep.data, kept.size() * 8, context));
  HostRows rows;
  const int64_t dim = options_.dim, state_dim = cold_->state_dim();
  const TableKeys host_keep{kept.data(), keep.n, keep.stride, keep.table};
  SOK_RETURN_IF_ERROR(
      cold_->EvictLowest(count, host_keep, rows.Receiver(dim, state_dim), HostContext(context)));
  const int64_t n = static_cast<int64_t>(rows.keys.size());
  int64_t* out_keys = nullptr;
  float *out_values = nullptr, *out_state = nullptr;
  SOK_RETURN_IF_ERROR(outputs(n, &out_keys, &out_values, &out_state));
  SOK_RETURN_IF_ERROR(memory_->FromHost(out_keys, rows.keys.data(), n * 8, context));
  SOK_RETURN_IF_ERROR(memory_->FromHost(out_values, rows.values.data(), n * dim * 4, context));
  if (out_state == nullptr) return Status::Ok();
  return memory_->FromHost(out_state, rows.state.data(), n * state_dim * 4, context);
}

}  // namespace sok
