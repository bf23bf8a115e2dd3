// The GPU table's optimizer step (gpu_hash_table.cuh): uses claim their rows, the
// gradients of a row used more than once are summed into its head, the rule runs once a
// row; plain SGD without state adds each tile's sums by atomics instead. Also the widening of
// the optimizer state.
#include "kit_src/core/hash_table/gpu_table_internal.cuh"

namespace sok {
namespace {

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
__global__ void FillState(float* state, int64_t rows, int64_t dim, int64_t state_dim,
                          float initial) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < rows * state_dim;
       e += int64_t{gridDim.x} * blockDim.x) {
    state[e] = e % state_dim < dim ? initial : 0.0f;
  }
}

}  // namespace

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
