// Atomic adds the CUDA kernels share.
#pragma once

#include <cuda_runtime.h>

namespace sok {

// Adds four floats atomically: one vector atomic on sm_90 (16-byte aligned `to`), four scalar
// atomics before it. With its result unused it compiles to a reduction (no round trip).
__device__ __forceinline__ void AtomicAddFloat4(float4* to, float4 x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(to, x);
#else
  atomicAdd(&to->x, x.x);
  atomicAdd(&to->y, x.y);
  atomicAdd(&to->z, x.z);
  atomicAdd(&to->w, x.w);
#endif
}

}  // namespace sok
