#include "kit_src/core/embedding/lookup_check.h"

#include <mutex>

#include "kit_src/core/embedding/key_partition.h"
#include "kit_src/core/embedding/packed_key.h"

namespace sok {

namespace {

std::string Num(int64_t value) { return std::to_string(value); }

Status RowSplitsEnds(const std::string& lookup, int64_t first, int64_t last,
                     const std::string& end) {
  return Status::InvalidArgument(lookup + ": row_splits must start at 0 and end at " + end +
                                 ", got [" + Num(first) + ", ..., " + Num(last) + "]");
}

Status RowSplitsDecrease(const std::string& lookup, int64_t sample) {
  return Status::InvalidArgument(lookup + ": row_splits decrease at sample " + Num(sample));
}

}  // namespace

Status GatheredIdsStatus(const LookupCheck& check, const std::vector<std::string>& table_names) {
  if (check.first_bad == kNoError) return Status::Ok();
  const int64_t l = BadGroup(check.first_bad);
  const std::string lookup = "lookup " + Num(l);
  switch (BadKindOf(check.first_bad)) {
    case BadKind::kRowSplitsEnds:
      return RowSplitsEnds(lookup, check.value_a, check.value_b, "its number of ids");
    case BadKind::kRowSplitsDecrease:
      return RowSplitsDecrease(lookup, BadItem(check.first_bad));
    default:
      return IdOutOfRange(l < static_cast<int64_t>(table_names.size()) ? table_names[l] : lookup,
                          check.value_a, check.value_b);
  }
}

Status PooledCheckStatus(const LookupCheck& check, int64_t num_rows, int32_t num_tables) {
  if (check.first_bad == kNoError) return Status::Ok();
  const int64_t l = BadGroup(check.first_bad), item = BadItem(check.first_bad);
  const std::string lookup = "lookup " + Num(l);
  switch (BadKindOf(check.first_bad)) {
    case BadKind::kPositionsLeft:
      return Status::InvalidArgument(lookup + " has " + Num(check.value_a) + " ids but only " +
                                     Num(check.value_b) + " positions are left");
    case BadKind::kRowSplitsEnds:
      return RowSplitsEnds(lookup, check.value_a, check.value_b,
                           "the " + Num(check.value_b) + " ids");
    case BadKind::kRowSplitsDecrease:
      return RowSplitsDecrease(lookup, item);
    case BadKind::kBadPosition:
      return Status::InvalidArgument("row position " + Num(check.value_a) +
                                     " is out of range [0, " + Num(num_rows) + ")");
    case BadKind::kBadKey:
      return Status::InvalidArgument(
          "key " + Num(check.value_a) + " (table " + Num(PackedTable(check.value_a)) +
          ", local row " + Num(PackedRow(check.value_a)) + ") names no row of the " +
          Num(num_tables) + " local shards");
    default:
      return Status::InvalidArgument("bad input (" + lookup + ", item " + Num(item) + ")");
  }
}

Status CombineCheckStatus(const LookupCheck& check, int64_t num_rows, int32_t num_tables,
                          const std::vector<int64_t>& weight_counts) {
  if (check.first_bad == kNoError) return Status::Ok();
  const int64_t l = BadGroup(check.first_bad);
  const BadKind kind = BadKindOf(check.first_bad);
  if (kind == BadKind::kWeightsCount) {
    return Status::InvalidArgument("weights of lookup " + Num(l) + " have " +
                                   Num(weight_counts[l]) + " values but its ids have " +
                                   Num(check.value_a) +
                                   "; weights must match the ids one to one");
  }
  if (kind == BadKind::kPositionsLeft && l == static_cast<int64_t>(weight_counts.size())) {
    return Status::InvalidArgument("the lookups have " + Num(check.value_a) +
                                   " ids but position has " + Num(check.value_b));
  }
  return PooledCheckStatus(check, num_rows, num_tables);
}

namespace {

std::mutex& DeferredMutex() {
  static std::mutex* mutex = new std::mutex();
  return *mutex;
}
Status& DeferredPending() {
  static Status* status = new Status();
  return *status;
}

}  // namespace

void DeferredIdError::Record(const Status& status) {
  std::lock_guard<std::mutex> lock(DeferredMutex());
  if (DeferredPending().ok()) DeferredPending() = status;
}

bool DeferredIdError::Pending() {
  std::lock_guard<std::mutex> lock(DeferredMutex());
  return !DeferredPending().ok();
}

Status DeferredIdError::Take() {
  std::lock_guard<std::mutex> lock(DeferredMutex());
  const Status status = DeferredPending();
  DeferredPending() = Status();
  return status;
}

}  // namespace sok
