#include "optim/gloo_sync.h"

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "optim/flat_params.h"
#include "optim/state_io.h"

namespace gossamer::optim {

namespace {

class GlooDdp final : public OuterOptimizer, public GradientSync {
 public:
  GlooDdp(c10::intrusive_ptr<c10d::ProcessGroupGloo> pg, int size) : pg_(std::move(pg)), size_(size) {}
  std::string_view name() const override { return "ddp"; }
  Result<bool> step(std::int64_t, Deadline) override { return false; }
  void skip_round() override { ++skipped_; }
  Status regroup(Group) override {
    return error(ErrorCode::kUnavailable, "the gloo ddp engine cannot change its members mid-run (use ddp.engine = \"links\")");
  }
  std::int64_t rounds() const override { return rounds_; }
  std::int64_t skipped_rounds() const override { return skipped_; }
  CommStats comm() const override { return comm_; }
  Bytes save() const override { return save_state("ddp", {rounds_, skipped_}, {}); }
  Status load(ByteView state) override {
    std::vector<std::int64_t> c(2);
    std::vector<at::Tensor> t;
    if (Status st = load_state(state, "ddp", c, t); !st.ok()) return st;
    rounds_ = c[0];
    skipped_ = c[1];
    return Status();
  }

  Status sync_gradients(const std::vector<at::Tensor>& params, std::int64_t, Deadline deadline) override {
    Stopwatch watch(real_clock());
    std::vector<at::Tensor> grads;
    for (const auto& p : params) grads.push_back(p.grad().defined() ? p.grad() : torch::zeros_like(p));
    std::vector<at::Tensor> flat{flatten(grads)};
    try {
      c10d::AllreduceOptions o;
      constexpr std::chrono::milliseconds kLongest = std::chrono::hours(24);  // never() as Gloo's timeout
      o.timeout = deadline.is_never() ? kLongest
                                      : std::min(kLongest, std::chrono::duration_cast<std::chrono::milliseconds>(deadline.remaining(real_clock())));
      auto work = pg_->allreduce(flat, o);
      if (!work->wait(o.timeout)) return error(ErrorCode::kTimeout, "gloo all-reduce did not finish before the deadline");
    } catch (const std::exception& e) {
      return error(ErrorCode::kPeerLost, std::string("gloo all-reduce failed (a peer died?): ") + e.what());
    }
    flat[0].div_(size_);
    write_flat(grads, flat[0]);  // grads[i] is the parameter's own gradient where it has one
    // Ring all-reduce: 2 (M-1)/M of the buffer each way (Gloo does not report its own counts).
    const auto bytes = static_cast<std::uint64_t>(2.0 * (size_ - 1) / size_ * static_cast<double>(flat[0].numel()) * 4.0);
    comm_ += CommStats{bytes, bytes, watch.elapsed_seconds()};
    ++rounds_;
    return Status();
  }

 private:
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  int size_;
  std::int64_t rounds_ = 0, skipped_ = 0;
  CommStats comm_;
};

}  // namespace

Result<GlooDataParallel> make_gloo_data_parallel(const GlooOptions& o) {
  GOSSAMER_CHECK(o.size >= 1 && o.rank >= 0 && o.rank < o.size, "make_gloo_data_parallel: rank outside the group");
  try {
    c10::intrusive_ptr<c10d::Store> store;
    if (!o.store_file.empty()) {
      store = c10::make_intrusive<c10d::FileStore>(o.store_file, o.size);
    } else {
      c10d::TCPStoreOptions so;
      so.port = o.store_port;
      so.isServer = o.rank == 0;
      so.numWorkers = static_cast<std::size_t>(o.size);
      so.timeout = o.timeout;
      store = c10::make_intrusive<c10d::TCPStore>(o.store_host, so);
    }
    store->setTimeout(o.timeout);
    auto opts = c10d::ProcessGroupGloo::Options::create();
    opts->timeout = o.timeout;
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(o.interface_host));
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, o.rank, o.size, opts);
    auto ddp = std::make_unique<GlooDdp>(std::move(pg), o.size);
    GlooDataParallel out;
    out.gradient_sync = ddp.get();
    out.outer = std::move(ddp);
    return out;
  } catch (const std::exception& e) {
    return error(ErrorCode::kUnavailable, std::string("gloo rendezvous failed (is rank 0 up and every rank started with the same size?): ") +
                                              e.what());
  }
}

}  // namespace gossamer::optim
