// Plain SGD over uses whose rows repeat (a one-id lookup's gradient holds every use, a hot row
// thousands of times, and atomic adds on one address queue): a block sorts a tile of uses by
// row in shared memory (CUB's block radix sort), then groups of `lanes` lanes walk the sorted
// tile, each a share of it, summing each run's gradients and adding the step with one float4
// atomic, so a hot row takes a few adds a tile instead of one a use. Shared by the static
// tables' update (the row is the id) and the GPU hash table's (the row its probe found).
#pragma once

#include <cub/cub.cuh>

#include <cstdint>

#include "kit_src/core/cuda_atomic.cuh"

namespace sok {

// A tile is 256 uses, one a thread: tiles of 1,024 (four a thread, the walk 16 batches a warp)
// leave a table of few uses (the ragged form's deduplicated ids) to a few blocks, slower than
// one atomic a use.
constexpr int kSgdTileUses = 256;
constexpr int kSgdRowsInFlight = 8;  // gradient rows a group loads before summing them

union SgdTileStorage {
  typename cub::BlockRadixSort<uint32_t, kSgdTileUses, 1, int32_t>::TempStorage sort;
  struct {
    uint32_t row[kSgdTileUses];
    int32_t use[kSgdTileUses];  // the use's index in the tile; -1: no row
  } sorted;
};

// Where a use's gradient row is: its own row of `grads`, or (rows set) scales[use] times row
// rows[use] of a [source_rows, ...] matrix (zeros for a row outside it).
struct GradRows {
  const int64_t* rows = nullptr;
  const float* scales = nullptr;
  int64_t source_rows = 0;

  __device__ __forceinline__ float4 Read(const float4* grads, int64_t use, int64_t width,
                                         int64_t d) const {
    if (rows == nullptr) return grads[use * width + d];
    const int64_t row = rows[use];
    if (row < 0 || row >= source_rows) return make_float4(0.f, 0.f, 0.f, 0.f);
    const float s = scales[use];
    const float4 g = grads[row * width + d];
    return make_float4(s * g.x, s * g.y, s * g.z, s * g.w);
  }
};

// Bits of the largest row: the tile sorts rows below 2^end_bit (end_bit <= 32).
inline int SgdTileEndBit(int64_t rows) {
  int end_bit = 1;
  while (end_bit < 63 && (int64_t{1} << end_bit) < rows) ++end_bit;
  return end_bit;
}

// Sorts the block's (key, use) pairs, one a thread, by key (below 2^end_bit) into
// tile.sorted; called by every thread of a kSgdTileUses-thread block (it synchronises it).
__device__ __forceinline__ void SortTile(SgdTileStorage& tile, uint32_t key, int32_t use,
                                         int end_bit) {
  uint32_t keys[1] = {key};
  int32_t uses[1] = {use};
  __syncthreads();  // the previous tile's walk is done with the shared memory
  cub::BlockRadixSort<uint32_t, kSgdTileUses, 1, int32_t>(tile.sort).Sort(keys, uses, 0, end_bit);
  __syncthreads();
  tile.sorted.row[threadIdx.x] = keys[0];
  tile.sorted.use[threadIdx.x] = uses[0];
  __syncthreads();
}

// One tile, called by every thread of a kSgdTileUses-thread block (it synchronises the
// block): thread t holds use first + t, `row` its row (below 2^end_bit) or negative for none;
// `lanes` is RowLanes(width) (cuda_scratch.cuh), so that groups split the tile evenly.
// Rows are `width` float4s (dim / 4) at values + row * width, gradients at grads + use * width
// (or where grad_rows says).
// With lr = -1 it adds each row's summed gradients to `values` (the claimed update's sums).
__device__ __forceinline__ void ApplySgdTile(SgdTileStorage& tile, int64_t row, int64_t first,
                                             const float4* __restrict__ grads, int64_t width,
                                             float lr, float4* values, int end_bit, int lanes,
                                             const GradRows& grad_rows = GradRows()) {
  SortTile(tile, row >= 0 ? static_cast<uint32_t>(row) : 0u,
           row >= 0 ? static_cast<int32_t>(threadIdx.x) : -1, end_bit);
  const int lane = threadIdx.x % lanes, share = lanes;  // kSgdTileUses / (threads / lanes)
  const int begin = threadIdx.x / lanes * share, end = begin + share;
  for (int64_t d = lane; d < width; d += lanes) {
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
    bool named = false;  // whether the run so far holds a use with a row
    for (int i0 = begin; i0 < end; i0 += kSgdRowsInFlight) {
      float4 g[kSgdRowsInFlight];
#pragma unroll
      for (int u = 0; u < kSgdRowsInFlight; ++u) {
        const int32_t at = i0 + u < end ? tile.sorted.use[i0 + u] : -1;
        g[u] = at >= 0 ? grad_rows.Read(grads, first + at, width, d)
                       : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int u = 0; u < kSgdRowsInFlight; ++u) {
        const int i = i0 + u;
        if (i == end) break;  // a share shorter than kSgdRowsInFlight
        sum.x += g[u].x; sum.y += g[u].y; sum.z += g[u].z; sum.w += g[u].w;
        named |= tile.sorted.use[i] >= 0;
        if (i + 1 < end && tile.sorted.row[i + 1] == tile.sorted.row[i]) continue;
        if (named) {
          AtomicAddFloat4(values + int64_t{tile.sorted.row[i]} * width + d,
                          make_float4(-lr * sum.x, -lr * sum.y, -lr * sum.z, -lr * sum.w));
        }
        sum = make_float4(0.f, 0.f, 0.f, 0.f);
        named = false;
      }
    }
  }
}

}  // namespace sok
