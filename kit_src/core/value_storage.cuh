// A table value's storage type on the GPU (table_math.h's ValueType): reads widen to float,
// writes round to nearest even, as the CPU table's Eigen::half / Eigen::bfloat16 do.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kit_src/core/hash_table/table_math.h"

namespace sok {

__device__ __forceinline__ float Widen(float v) { return v; }
__device__ __forceinline__ float Widen(__half v) { return __half2float(v); }
__device__ __forceinline__ float Widen(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T Narrow(float v);
template <>
__device__ __forceinline__ float Narrow<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half Narrow<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 Narrow<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Calls visit(T{}) with T the storage type of `type`.
template <typename Visit>
void VisitValueType(ValueType type, const Visit& visit) {
  switch (type) {
    case ValueType::kFloat32: visit(float{}); return;
    case ValueType::kFloat16: visit(__half{}); return;
    case ValueType::kBfloat16: visit(__nv_bfloat16{}); return;
  }
}

inline size_t ValueBytes(ValueType type) { return type == ValueType::kFloat32 ? 4 : 2; }

}  // namespace sok
