// GPU functor of Sok>StaticApply (static_apply_functor.h): kit_src/core/optimizers/
// sparse_apply.cu on TensorFlow's stream, all the update's tables in one group, the Keras slot
// variables as the rule's state sections. An id outside the table is found on the device, nothing is written, and the op
// fails once the stream has passed the check (no host thread waits); with validate=false
// (ids lookup_sparse checked) the op neither checks nor waits.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kit_src/core/embedding/key_partition.h"
#include "kit_src/core/optimizers/sparse_apply.cuh"
#include "kit_src/tf/kernels/core_bridge.h"
#include "kit_src/tf/kernels/gpu_op_util.h"
#include "kit_src/tf/kernels/static_apply_functor.h"

namespace sok::functor {
template <>
void StaticApply<GpuDevice>::operator()(tf::OpKernelContext* ctx, const StaticApplyGroup& args,
                                        std::function<void(tf::Status)> finish) {
  std::vector<SparseApplyMember> members(args.tables.size());
  int64_t uses = 0;
  for (size_t t = 0; t < args.tables.size(); ++t) {
    const StaticApplyTable& from = args.tables[t];
    SparseApplyMember& member = members[t];
    member.table.values = from.table;
    member.table.rows = from.rows;
    member.table.dim = args.dim;
    member.table.num_slots = static_cast<int>(from.slots.size());
    member.table.state_dim = member.table.num_slots * args.dim;
    for (int s = 0; s < member.table.num_slots; ++s) member.table.slots[s] = from.slots[s];
    member.gradient = SparseGradient{from.indices, from.grads, from.n, from.grad_rows,
                                     from.grad_scales, from.grad_source_rows};
    member.first_use = uses;
    uses += from.n;
  }
  auto memory = std::make_shared<GpuCallMemory>(ctx);
  SparseApplyMember* members_device = nullptr;
  tf::Status status;
  if (SparseApplyGroupReadsDeviceMembers(args.rule, members[0].table, args.validate)) {
    status = ToTfStatus(memory->Upload(members, &members_device));
  }
  GpuCheck check;
  if (status.ok() && args.validate) status = ToTfStatus(check.Init(memory.get()));
  if (!status.ok()) return finish(status);
  const cudaError_t launched =
      SparseApplyGroupGpuAsync(args.rule, args.hyper, args.hyper_count, args.nesterov, members,
                               members_device, memory->Scratch(), check.device, GpuStream(ctx));
  if (!memory->scratch_error().ok()) return finish(ToTfStatus(memory->scratch_error()));
  status = CudaToTf(launched, "sparse apply");
  // Ids checked by the caller: done once enqueued, nothing waits for the stream.
  if (!args.validate) return finish(status.ok() ? ReleaseAfterStream(ctx, memory) : status);
  if (status.ok()) status = ToTfStatus(check.CopyToHost(memory.get()));
  if (!status.ok()) return finish(status);
  const LookupCheck* host = check.host;
  std::vector<std::pair<std::string, int64_t>> tables;  // name and rows, for the error
  for (const StaticApplyTable& table : args.tables) tables.emplace_back(table.name, table.rows);
  AfterStream(ctx, memory, [host, tables, finish]() {
    if (host->first_bad == kNoError) return finish(tf::Status());
    const auto& table = tables[BadGroup(host->first_bad)];
    finish(ToTfStatus(IdOutOfRange(table.first, host->value_a, table.second)));
  });
}

template <>
tf::Status StaticApply<GpuDevice>::Copy(tf::OpKernelContext* ctx, void* dst, const void* src,
                                        int64_t bytes) {
  return CudaToTf(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, GpuStream(ctx)),
                  "copy on write");
}

}  // namespace sok::functor
