// ddp on NCCL through c10d's ProcessGroupNCCL. Built where LibTorch has CUDA and NCCL's headers are
// found (CMake's GOSSAMER_NCCL); everywhere else the engine says it was left out.
#include "optim/gloo_sync.h"

#if GOSSAMER_HAVE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "optim/c10d_ddp.h"
#endif

namespace gossamer::optim {

#if !GOSSAMER_HAVE_NCCL

Status nccl_built() {
  return error(ErrorCode::kUnavailable,
               "ddp.engine = nccl: this build has no NCCL (its LibTorch has no CUDA, or NCCL's headers were not found when it was "
               "configured): use ddp.engine = links or gloo, or build against a CUDA LibTorch (PyTorch's own) on a GPU machine");
}

Result<GlooDataParallel> make_nccl_data_parallel(const GlooOptions&, const Group&) { return nccl_built(); }

#else

Status nccl_built() { return Status(); }

Result<GlooDataParallel> make_nccl_data_parallel(const GlooOptions& o, const Group& group) {
  c10d_ddp::Engine<c10d::ProcessGroupNCCL> nccl{"nccl", true, [](c10::intrusive_ptr<c10d::Store> store, int rank, int size, const GlooOptions& opt) {
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = opt.timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(std::move(store), rank, size, opts);
  }};
  return c10d_ddp::make(o, group, std::move(nccl));
}

#endif  // GOSSAMER_HAVE_NCCL

}  // namespace gossamer::optim
