#include "optim/gloo_sync.h"

#if GOSSAMER_HAVE_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "optim/c10d_ddp.h"
#endif

namespace gossamer::optim {

#if !GOSSAMER_HAVE_GLOO

Status gloo_built() {
  return error(ErrorCode::kUnavailable,
               "ddp.engine = gloo: this build's LibTorch came without Gloo's headers (PyTorch's own LibTorch ships none), so the Gloo "
               "engine was left out: use ddp.engine = links, or build against Debian's LibTorch with libgloo-dev");
}

Result<GlooDataParallel> make_gloo_data_parallel(const GlooOptions&, const Group&) { return gloo_built(); }

#else

Status gloo_built() { return Status(); }

Result<GlooDataParallel> make_gloo_data_parallel(const GlooOptions& o, const Group& group) {
  c10d_ddp::Engine<c10d::ProcessGroupGloo> gloo{"gloo", false, [](c10::intrusive_ptr<c10d::Store> store, int rank, int size, const GlooOptions& opt) {
    auto opts = c10d::ProcessGroupGloo::Options::create();
    opts->timeout = opt.timeout;
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(opt.interface_host));
    return c10::make_intrusive<c10d::ProcessGroupGloo>(std::move(store), rank, size, opts);
  }};
  return c10d_ddp::make(o, group, std::move(gloo));
}

#endif  // GOSSAMER_HAVE_GLOO

}  // namespace gossamer::optim
