// What the CPU and GPU dynamic tables compute alike, so a key lands on the same initial row,
// the same admission draw and the same eviction score on either device: the key hash, the
// low-frequency filter's draw, each column of a key's initial row, and the layout of a row's
// metadata word. Host and device code (nvcc sees __host__ __device__).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define SOK_TABLE_MATH __host__ __device__ __forceinline__
#else
#define SOK_TABLE_MATH inline
#endif

namespace sok {

// SplitMix64's finaliser: a well-mixed 64-bit hash, so consecutive keys give independent
// streams.
SOK_TABLE_MATH uint64_t MixBits(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Murmur3's finaliser: where a key's probe starts.
SOK_TABLE_MATH uint64_t HashKey(int64_t key) {
  uint64_t x = static_cast<uint64_t>(key);
  x = (x ^ (x >> 33)) * 0xff51afd7ed558ccdULL;
  x = (x ^ (x >> 33)) * 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

// The low-frequency filter: a missing key is admitted with `probability`, drawn per
// (key, call clock).
SOK_TABLE_MATH bool AdmitKey(int64_t key, uint64_t clock, float probability) {
  if (probability >= 1.0f) return true;
  if (probability <= 0.0f) return false;
  const uint64_t threshold =
      static_cast<uint64_t>(static_cast<double>(probability) * 18446744073709551615.0);
  return HashKey(key ^ static_cast<int64_t>(HashKey(clock))) <= threshold;
}

// How a row's value is stored. Reads widen to float32 and writes round to nearest even, so
// 16-bit storage halves a table's memory while its interface stays float32. Optimizer state
// is always float32.
enum class ValueType { kFloat32, kFloat16, kBfloat16 };

enum class InitKind : int { kNormal = 0, kUniform, kConstant };

// Column d of key's initial row: a pure function of (seed, key, d). Worked in double with
// explicit fma and rounded once to float, so the host's libm and CUDA's agree bit for bit
// (their log and cos differ in a double's last bit at most, far below a float's).
// The random bits behind column d of key's initial row: one stream per (seed, key).
SOK_TABLE_MATH uint64_t InitialStream(uint64_t seed, int64_t key) {
  return MixBits(seed ^ MixBits(static_cast<uint64_t>(key)));
}
SOK_TABLE_MATH uint64_t ColumnBits(uint64_t stream, int64_t d) {
  return MixBits(stream + static_cast<uint64_t>(d) * 0x632be59bd9b4e019ULL);
}

// Uniform in (0, 1) from the top 24 bits, never exactly 0 (log is taken of it).
SOK_TABLE_MATH double UnitInterval(uint64_t bits) {
  return (static_cast<double>(bits >> 40) + 0.5) / 16777216.0;
}

// Box-Muller's angle is kTwoPi * u2, rounded to double, then its cosine.
constexpr double kTwoPi = 6.283185307179586;

SOK_TABLE_MATH float InitialValue(InitKind kind, float a, float b, uint64_t seed, int64_t key,
                                   int64_t d) {
  if (kind == InitKind::kConstant) return a;
  const uint64_t bits = ColumnBits(InitialStream(seed, key), d);
  const double u1 = UnitInterval(bits);
  if (kind == InitKind::kUniform) {
    return static_cast<float>(fma(static_cast<double>(b) - static_cast<double>(a), u1,
                                  static_cast<double>(a)));
  }
  const double u2 = UnitInterval(MixBits(bits));
  const double normal = sqrt(-2.0 * log(u1)) * cos(kTwoPi * u2);  // Box-Muller
  return static_cast<float>(fma(static_cast<double>(b), normal, static_cast<double>(a)));
}

// A row's metadata word: bit 63 live, bits 32-61 the eviction score (LRU: the last call that
// used the key; LFU: uses; saturating), bits 0-31 the write stamp (ms since the table's
// creation, saturating).
constexpr uint64_t kRowLive = uint64_t{1} << 63;
constexpr int kScoreShift = 32;
constexpr uint64_t kMaxScore = (uint64_t{1} << 30) - 1;
constexpr uint64_t kScoreBits = kMaxScore << kScoreShift;
constexpr uint64_t kStampBits = 0xffffffffu;

// Open addressing keeps used slots (live, or erased on the GPU) at most this share of all.
constexpr double kMaxSlotLoad = 0.7;

// A power of two of slots that holds `keys` within kMaxSlotLoad.
inline int64_t SlotsForKeys(int64_t keys) {
  int64_t slots = 16;
  while (static_cast<double>(slots) * kMaxSlotLoad < static_cast<double>(keys)) slots *= 2;
  return slots;
}

// Write stamps: microseconds since the Unix epoch, and a time as milliseconds since the
// table's creation (saturating in 32 bits).
inline int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}
inline uint32_t WriteStampAt(int64_t created_us, int64_t time_us) {
  return static_cast<uint32_t>(
      std::clamp<int64_t>((time_us - created_us) / 1000, 0, static_cast<int64_t>(kStampBits)));
}

}  // namespace sok
