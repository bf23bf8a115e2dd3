// The all-to-all between GPU workers, over NCCL point-to-point calls on the caller's stream.
//
// NCCL is loaded at run time (dlopen of libnccl.so.2, or $SOK_NCCL_LIBRARY): the op library
// builds and loads where NCCL is absent, and only a multi-GPU exchange needs it. One
// communicator per process, made once (sok.init) from a unique id that rank 0 creates and
// the launcher (Horovod) broadcasts. Calls on it must be issued in the same order on every
// worker; the Python layer chains them (communication.py).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kit_src/core/status.h"

namespace sok::comm {

constexpr int kNcclUniqueIdBytes = 128;  // sizeof(ncclUniqueId)

// Fills `id` (host, 128 bytes) with a new NCCL unique id; rank 0 calls it.
Status NcclCreateUniqueId(uint8_t* id);

class NcclExchange {
 public:
  // Makes this process's communicator on CUDA device `device` (collective: every worker
  // calls it with the same id). Replaces an earlier one.
  static Status Init(const uint8_t* id, int rank, int num_workers, int device);
  // The process's communicator, or nullptr before Init.
  static NcclExchange* Get();

  int rank() const { return rank_; }
  int num_workers() const { return num_workers_; }
  int device() const { return device_; }

  // Sends send_bytes[w] bytes from `send` (peers' blocks back to back, in worker order) to
  // worker w and receives recv_bytes[w] bytes from it into `recv` (same layout). Byte
  // counts are host arrays of num_workers entries; both buffers are device memory.
  // Enqueued on `stream`; nothing waits on the host.
  Status AllToAll(const void* send, const int64_t* send_bytes, void* recv,
                  const int64_t* recv_bytes, cudaStream_t stream);

 private:
  NcclExchange(void* comm, int rank, int num_workers, int device)
      : comm_(comm), rank_(rank), num_workers_(num_workers), device_(device) {}
  void* comm_;  // ncclComm_t
  int rank_, num_workers_, device_;
};

}  // namespace sok::comm
