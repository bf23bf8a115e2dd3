// Registers an op's one OpKernel template on both devices: Op<CpuDevice>, and in a CUDA build
// Op<GpuDevice>. The optional last argument continues the GPU kernel's definition, naming the
// inputs and outputs the host reads or writes, e.g. `.HostMemory("handle")`.
#pragma once

#include "kit_src/tf/kernels/device_tags.h"
#include "tensorflow/core/framework/op_kernel.h"

#define SOK_REGISTER_CPU_KERNEL(name, Op) \
  REGISTER_KERNEL_BUILDER(Name(name).Device(::tensorflow::DEVICE_CPU), Op<::sok::CpuDevice>)

#if GOOGLE_CUDA
#define SOK_REGISTER_KERNELS(name, Op, ...)                                     \
  SOK_REGISTER_CPU_KERNEL(name, Op);                                            \
  REGISTER_KERNEL_BUILDER(Name(name).Device(::tensorflow::DEVICE_GPU) __VA_ARGS__, \
                          Op<::sok::GpuDevice>)
#else
#define SOK_REGISTER_KERNELS(name, Op, ...) SOK_REGISTER_CPU_KERNEL(name, Op)
#endif
