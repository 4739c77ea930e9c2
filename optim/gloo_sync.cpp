#include "optim/gloo_sync.h"

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>

#include "optim/data_parallel.h"

namespace gossamer::optim {

namespace {

class GlooDdp final : public DataParallel {
 public:
  GlooDdp(c10::intrusive_ptr<c10d::ProcessGroupGloo> pg, int size) : pg_(std::move(pg)), size_(size) {}
  Status regroup(Group) override {
    return error(ErrorCode::kUnavailable, "the gloo ddp engine cannot change its members mid-run (use ddp.engine = \"links\")");
  }

 protected:
  Status average(at::Tensor& flat, std::int64_t, Deadline deadline, CommStats& stats) override {
    Stopwatch watch(real_clock());
    std::vector<at::Tensor> buffers{flat};
    try {
      c10d::AllreduceOptions o;
      // never() as Gloo's longest wait; an expired deadline as the shortest (0 would mean "no timeout").
      constexpr std::chrono::milliseconds kLongest = std::chrono::hours(24), kShortest{1};
      o.timeout = deadline.is_never()
                      ? kLongest
                      : std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(deadline.remaining(real_clock())), kShortest, kLongest);
      auto work = pg_->allreduce(buffers, o);
      if (!work->wait(o.timeout)) return error(ErrorCode::kTimeout, "gloo all-reduce did not finish before the deadline");
    } catch (const std::exception& e) {
      return error(ErrorCode::kPeerLost, std::string("gloo all-reduce failed (a peer died?): ") + e.what());
    }
    flat.div_(size_);
    // Ring all-reduce: 2 (M-1)/M of the buffer each way (Gloo does not report its own counts).
    const auto bytes = static_cast<std::uint64_t>(2.0 * (size_ - 1) / size_ * static_cast<double>(flat.numel()) * 4.0);
    stats += CommStats{bytes, bytes, watch.elapsed_seconds()};
    return Status();
  }

 private:
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  int size_;
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
