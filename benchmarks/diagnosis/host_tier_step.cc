// The host tier's work in a tiered table's miss step, on the CPU alone. A host table of
// `fill` keys of `dim` floats (SGD: no state) in the row-per-slot or the pooled layout; each
// step `moved` distinct random keys are looked up (Find, as an eval step reads host rows),
// come up (TakeOrAdmit: their rows out, erased), and as many rows go down (InsertNew), as in
// T6c where 182,542 rows move each way a step. Built and run by host_tier_step.py.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "kit_src/core/hash_table/cpu_hash_table.h"

namespace {

// Splits the work over the machine's threads, as a kernel's thread pool does: by the work's
// cost, so a few costly units (the erase's ranges of slots) spread too.
void AllThreads(int64_t total, int64_t cost_per_unit, const sok::ShardWork& work) {
  const int64_t threads =
      std::min<int64_t>(total, std::max(1u, std::thread::hardware_concurrency()));
  if (threads <= 1 || total * cost_per_unit < 100000) return work(0, total);
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) {
    pool.emplace_back([&, t] { work(total * t / threads, total * (t + 1) / threads); });
  }
  work(0, total / threads);
  for (auto& thread : pool) thread.join();
}

double MsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: host_tier_step FILL MOVED STEPS POOLED(0|1) DIM\n");
    return 2;
  }
  const int64_t fill = std::atoll(argv[1]), moved = std::atoll(argv[2]);
  const int64_t dim = std::atoll(argv[5]);
  const int steps = std::atoi(argv[3]);
  sok::HashTableOptions options;
  options.dim = dim;
  options.init_capacity = fill;
  options.pooled_rows = std::atoi(argv[4]) != 0;
  sok::CpuHashTable table(options, sok::RowInitializer());
  sok::TableContext context;
  context.parallel_for = AllThreads;
  std::vector<int64_t> held(fill);  // the host tier's keys
  std::iota(held.begin(), held.end(), 0);
  std::vector<float> rows(moved * dim, 0.5f);
  for (int64_t start = 0; start < fill; start += moved) {
    table.InsertNew(held.data() + start, std::min(moved, fill - start), rows.data(), nullptr,
                    context);
  }
  std::vector<int64_t> hot(moved);  // the keys in the GPU tier, the next to go down
  std::iota(hot.begin(), hot.end(), fill);
  std::vector<float> out(moved * dim);
  std::vector<uint8_t> found(moved);
  std::mt19937_64 rng(2);
  double find_ms = 0, up_ms = 0, down_ms = 0;
  for (int step = 0; step < steps; ++step) {
    std::vector<int64_t> picked(moved);
    for (auto& p : picked) p = static_cast<int64_t>(rng() % fill);
    std::sort(picked.begin(), picked.end());
    picked.erase(std::unique(picked.begin(), picked.end()), picked.end());
    std::shuffle(picked.begin(), picked.end(), rng);
    const int64_t n = static_cast<int64_t>(picked.size());
    std::vector<int64_t> missing(n);
    for (int64_t j = 0; j < n; ++j) missing[j] = held[picked[j]];
    auto start = std::chrono::steady_clock::now();
    table.Find(sok::TableKeys{missing.data(), n, 1, 0}, out.data(), context);
    find_ms += MsSince(start);
    start = std::chrono::steady_clock::now();
    table.GrowFor(2 * n);
    table.TakeOrAdmit(missing.data(), n, 1.0f, out.data(), nullptr, found.data(), nullptr,
                      context);
    up_ms += MsSince(start);
    start = std::chrono::steady_clock::now();
    table.InsertNew(hot.data(), n, rows.data(), nullptr, context);
    down_ms += MsSince(start);
    for (int64_t j = 0; j < n; ++j) {  // what went down is held; what came up is hot
      held[picked[j]] = hot[j];
      hot[j] = missing[j];
    }
  }
  std::printf("{\"find_ms\": %.3f, \"take_up_ms\": %.3f, \"insert_down_ms\": %.3f}\n",
              find_ms / steps, up_ms / steps, down_ms / steps);
  return 0;
}
