// Gloo through LibTorch's c10d ProcessGroupGloo (the engine PyTorch DDP uses on CPUs), or NCCL through
// ProcessGroupNCCL (the one it uses on GPUs), as the ddp baseline's gradient averaging in real
// multi-process runs, beside our own all-reduce on Links.
//
// Rendezvous goes through a c10d store: a TCPStore served by rank 0 at store_host:store_port, or a
// FileStore at store_file (every rank on one machine, or a shared file system), or, for real peers
// whose members change (over_group_links), a TCPStore that rank 0 of each group serves on an
// ephemeral port and announces over the group's links (tag kGlooRendezvousTag: host str | port u16);
// regroup() then builds a new process group over the new members. c10d types stay in the .cpp file.
// Ownership: the returned object owns its process group. Threading: one training thread calls
// sync_gradients(); every rank must call it with the same parameter shapes in the same order.
// Errors: construction failures (store unreachable, peers missing past the timeout) and collective
// failures (a peer died) come back as Status values; Gloo's own exceptions never escape.
#pragma once

#include <memory>

#include "core/status.h"
#include "optim/gloo_options.h"
#include "optim/outer_optimizer.h"
#include "transport/tags.h"

namespace gossamer::optim {

// A GradientSync whose sync_gradients() averages every parameter's gradient with Gloo (one flat
// buffer, summed by Gloo's ring, divided by size), and an OuterOptimizer named "ddp" that counts the
// steps it synchronized.
struct GlooDataParallel {
  std::unique_ptr<OuterOptimizer> outer;
  GradientSync* gradient_sync = nullptr;  // points into `outer`
};
// OK where the engine is built; kUnavailable, saying what to use instead, where the build's LibTorch
// came without Gloo's headers (PyTorch's own): make_gloo_data_parallel then fails with it.
[[nodiscard]] Status gloo_built();
[[nodiscard]] inline bool gloo_available() { return gloo_built().ok(); }

// `group` is used only with over_group_links (its rank and size replace the options').
[[nodiscard]] Result<GlooDataParallel> make_gloo_data_parallel(const GlooOptions& options, const Group& group = Group{});

// The same over NCCL (c10d's ProcessGroupNCCL, nccl_sync.cpp): the gradients stay on the GPU, one GPU
// per rank (NCCL refuses two ranks on one), the rendezvous as for Gloo (interface_host unused). Not
// built where the build's LibTorch has no CUDA and NCCL (Debian's).
[[nodiscard]] Status nccl_built();
[[nodiscard]] inline bool nccl_available() { return nccl_built().ok(); }
[[nodiscard]] Result<GlooDataParallel> make_nccl_data_parallel(const GlooOptions& options, const Group& group = Group{});

inline constexpr transport::Tag kGlooRendezvousTag = transport::tags::kGlooRendezvous;

}  // namespace gossamer::optim
