// The inner loops of pooling, of its gradient and of the one-id gather: an output row as a
// weighted sum of rows, or as a copy of one. Outputs far larger than the caches are written
// with non-temporal ("streamed") stores: an ordinary store first reads the line it writes,
// which for a [batch, dim] output that leaves the caches anyway is a third more memory
// traffic (measured on 2 cores, C1: dim 128 one id 19.4 -> 15.2 ms, 1..10 ids 94 -> 84 ms).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace sok {

// Whether an op writing `output_bytes` should stream them. Below a few MiB the outputs may
// still be in a cache when the next op reads them; above, streaming saves the lines' reads
// and costs at most a re-read from memory that would have cost as much.
constexpr int64_t kStreamAboveBytes = int64_t{8} << 20;
inline bool WorthStreaming(int64_t output_bytes) { return output_bytes > kStreamAboveBytes; }

// out = sum over k in [0, n) of scale(k) * row(k), each element summed in k order starting
// from scale(0) * row(0) (zeros when n == 0).
template <typename T, typename RowAt, typename ScaleAt>
inline void WeightedRowSum(int64_t n, const RowAt& row, const ScaleAt& scale, int64_t dim,
                           T* out, bool /*stream*/) {
  if (n == 0) {
    std::fill(out, out + dim, T(0));
    return;
  }
  const T first = static_cast<T>(scale(0));
  const T* first_row = row(0);
  for (int64_t d = 0; d < dim; ++d) out[d] = first * first_row[d];
  for (int64_t k = 1; k < n; ++k) {
    const T s = static_cast<T>(scale(k));
    const T* r = row(k);
    for (int64_t d = 0; d < dim; ++d) out[d] += s * r[d];
  }
}

// out = a copy of row `from`.
template <typename T>
inline void CopyRow(const T* from, int64_t dim, T* out, bool /*stream*/) {
  std::memcpy(out, from, dim * sizeof(T));
}

#ifdef __AVX2__
// Above this many rows, the rows of one sum no longer stay in L1 across the column blocks.
constexpr int64_t kRowsSummedInRegisters = 16;

// Columns [d, d + 8 * kVectors) of the sum, held in registers across the n rows, so that out
// is written once and never read.
template <int kVectors, typename RowAt, typename ScaleAt>
inline void WeightedColumnsSum(int64_t n, const RowAt& row, const ScaleAt& scale, int64_t d,
                               float* out, bool stream) {
  __m256 acc[kVectors];
  const __m256 s0 = _mm256_set1_ps(scale(0));
  const float* r0 = row(0) + d;
#pragma GCC unroll 4
  for (int v = 0; v < kVectors; ++v) acc[v] = _mm256_mul_ps(s0, _mm256_loadu_ps(r0 + 8 * v));
  for (int64_t k = 1; k < n; ++k) {
    const __m256 s = _mm256_set1_ps(scale(k));
    const float* r = row(k) + d;
#pragma GCC unroll 4
    for (int v = 0; v < kVectors; ++v) {
      acc[v] = _mm256_fmadd_ps(s, _mm256_loadu_ps(r + 8 * v), acc[v]);
    }
  }
#pragma GCC unroll 4
  for (int v = 0; v < kVectors; ++v) {
    if (stream) {
      _mm256_stream_ps(out + d + 8 * v, acc[v]);
    } else {
      _mm256_store_ps(out + d + 8 * v, acc[v]);
    }
  }
}

inline bool VectorRows(int64_t dim, const float* out) {
  return dim % 8 == 0 && reinterpret_cast<uintptr_t>(out) % 32 == 0;
}

// float rows whose width is a multiple of 8, out 32-byte aligned: 32 columns at a time in
// registers; with `stream`, out's lines are streamed.
template <typename RowAt, typename ScaleAt>
inline void WeightedRowSum(int64_t n, const RowAt& row, const ScaleAt& scale, int64_t dim,
                           float* out, bool stream) {
  if (n == 0 || n > kRowsSummedInRegisters || !VectorRows(dim, out)) {
    WeightedRowSum<float, RowAt, ScaleAt>(n, row, scale, dim, out, stream);
    return;
  }
  int64_t d = 0;
  for (; d + 32 <= dim; d += 32) WeightedColumnsSum<4>(n, row, scale, d, out, stream);
  for (; d < dim; d += 8) WeightedColumnsSum<1>(n, row, scale, d, out, stream);
}

inline void CopyRow(const float* from, int64_t dim, float* out, bool stream) {
  if (!stream || !VectorRows(dim, out)) {
    std::memcpy(out, from, dim * sizeof(float));
    return;
  }
  for (int64_t d = 0; d < dim; d += 8) _mm256_stream_ps(out + d, _mm256_loadu_ps(from + d));
}

// Orders this thread's streamed stores before whatever it does next (a thread pool's "done").
inline void StreamedStoresDone() { _mm_sfence(); }
#else
inline void StreamedStoresDone() {}
#endif

}  // namespace sok
