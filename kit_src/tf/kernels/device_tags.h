// Device tags for the kernels' functors: the OpKernel is written once, templated on the tag,
// and each device's work is a functor specialisation (TensorFlow uses Eigen's device types;
// tags keep the CPU build free of Eigen's GPU headers).
#pragma once

#include <type_traits>

namespace sok {

struct CpuDevice {};
struct GpuDevice {};

template <typename Device>
constexpr bool kOnGpu = std::is_same<Device, GpuDevice>::value;

}  // namespace sok
