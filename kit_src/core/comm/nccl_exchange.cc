#include "kit_src/core/comm/nccl_exchange.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "kit_src/core/cuda_util.h"

namespace sok::comm {
namespace {

// NCCL's C ABI, the part used here (nccl.h is not needed to build).
struct NcclUniqueId {
  char internal[kNcclUniqueIdBytes];
};
constexpr int kNcclSuccess = 0;
constexpr int kNcclUint8 = 1;  // ncclDataType_t

struct NcclApi {
  int (*get_unique_id)(NcclUniqueId*);
  int (*comm_init_rank)(void**, int, NcclUniqueId, int);
  int (*comm_destroy)(void*);
  int (*send)(const void*, size_t, int, int, void*, cudaStream_t);
  int (*recv)(void*, size_t, int, int, void*, cudaStream_t);
  int (*group_start)();
  int (*group_end)();
  const char* (*error_string)(int);
};

template <typename F>
bool Bind(void* library, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(library, name));
  return *out != nullptr;
}

// Loads NCCL once; the error names the library and why it did not load.
const NcclApi* LoadNccl(Status* status) {
  static NcclApi api;
  static Status load_status = [] {
    const char* path = std::getenv("SOK_NCCL_LIBRARY");
    const std::string name = path != nullptr ? path : "libnccl.so.2";
    void* library = dlopen(name.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (library == nullptr) {
      return Status::Internal("cannot load NCCL (" + name + "): " + dlerror() +
                              "; the GPU exchange needs libnccl.so.2 on LD_LIBRARY_PATH or "
                              "SOK_NCCL_LIBRARY naming it");
    }
    const bool bound = Bind(library, "ncclGetUniqueId", &api.get_unique_id) &&
                       Bind(library, "ncclCommInitRank", &api.comm_init_rank) &&
                       Bind(library, "ncclCommDestroy", &api.comm_destroy) &&
                       Bind(library, "ncclSend", &api.send) &&
                       Bind(library, "ncclRecv", &api.recv) &&
                       Bind(library, "ncclGroupStart", &api.group_start) &&
                       Bind(library, "ncclGroupEnd", &api.group_end) &&
                       Bind(library, "ncclGetErrorString", &api.error_string);
    return bound ? Status::Ok()
                 : Status::Internal(name + " lacks point-to-point calls (NCCL >= 2.7 needed)");
  }();
  *status = load_status;
  return load_status.ok() ? &api : nullptr;
}

Status NcclStatus(const NcclApi& api, int result, const char* what) {
  if (result == kNcclSuccess) return Status::Ok();
  return Status::Internal(std::string("NCCL error in ") + what + ": " + api.error_string(result));
}

std::mutex registry_mutex;
std::unique_ptr<NcclExchange> registry;

}  // namespace

Status NcclCreateUniqueId(uint8_t* id) {
  Status status;
  const NcclApi* api = LoadNccl(&status);
  if (api == nullptr) return status;
  NcclUniqueId unique;
  if (Status s = NcclStatus(*api, api->get_unique_id(&unique), "ncclGetUniqueId"); !s.ok()) {
    return s;
  }
  std::memcpy(id, unique.internal, kNcclUniqueIdBytes);
  return Status::Ok();
}

Status NcclExchange::Init(const uint8_t* id, int rank, int num_workers, int device) {
  if (num_workers < 1 || rank < 0 || rank >= num_workers) {
    return Status::InvalidArgument("rank " + std::to_string(rank) + " outside [0, " +
                                   std::to_string(num_workers) + ")");
  }
  Status status;
  const NcclApi* api = LoadNccl(&status);
  if (api == nullptr) return status;
  NcclUniqueId unique;
  std::memcpy(unique.internal, id, kNcclUniqueIdBytes);
  void* comm = nullptr;
  {
    ScopedDevice on(device);
    status = NcclStatus(*api, api->comm_init_rank(&comm, num_workers, unique, rank),
                        "ncclCommInitRank");
  }
  if (!status.ok()) return status;
  std::lock_guard<std::mutex> lock(registry_mutex);
  if (registry != nullptr) api->comm_destroy(registry->comm_);
  registry.reset(new NcclExchange(comm, rank, num_workers, device));
  return Status::Ok();
}

NcclExchange* NcclExchange::Get() {
  std::lock_guard<std::mutex> lock(registry_mutex);
  return registry.get();
}

Status NcclExchange::AllToAll(const void* send, const int64_t* send_bytes, void* recv,
                              const int64_t* recv_bytes, cudaStream_t stream) {
  Status status;
  const NcclApi* api = LoadNccl(&status);
  if (api == nullptr) return status;
  ScopedDevice on(device_);
  const char* send_at = static_cast<const char*>(send);
  char* recv_at = static_cast<char*>(recv);
  // Peers with nothing to exchange are skipped on both sides: each side knows the count.
  if (Status s = NcclStatus(*api, api->group_start(), "ncclGroupStart"); !s.ok()) return s;
  for (int peer = 0; peer < num_workers_; ++peer) {
    if (peer == rank_) {
      if (send_bytes[peer] != recv_bytes[peer]) {
        status = Status::Internal("all-to-all: " + std::to_string(send_bytes[peer]) +
                                  " bytes sent to self but " +
                                  std::to_string(recv_bytes[peer]) + " expected");
      } else if (send_bytes[peer] > 0) {
        status = CudaStatus(cudaMemcpyAsync(recv_at, send_at, send_bytes[peer],
                                            cudaMemcpyDeviceToDevice, stream),
                            "all-to-all self copy");
      }
    } else {
      if (status.ok() && send_bytes[peer] > 0) {
        status = NcclStatus(*api, api->send(send_at, send_bytes[peer], kNcclUint8, peer, comm_,
                                            stream), "ncclSend");
      }
      if (status.ok() && recv_bytes[peer] > 0) {
        status = NcclStatus(*api, api->recv(recv_at, recv_bytes[peer], kNcclUint8, peer, comm_,
                                            stream), "ncclRecv");
      }
    }
    send_at += send_bytes[peer];
    recv_at += recv_bytes[peer];
  }
  // The group is always closed, even after an error, so the communicator stays usable.
  const Status ended = NcclStatus(*api, api->group_end(), "ncclGroupEnd");
  return status.ok() ? ended : status;
}

}  // namespace sok::comm
