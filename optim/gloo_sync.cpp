#include "optim/gloo_sync.h"

#include <torch/torch.h>
#if GOSSAMER_HAVE_GLOO
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif

#include <algorithm>

#include "core/wire.h"
#include "optim/data_parallel.h"

namespace gossamer::optim {

#if !GOSSAMER_HAVE_GLOO

bool gloo_available() { return false; }

Result<GlooDataParallel> make_gloo_data_parallel(const GlooOptions&, const Group&) {
  return error(ErrorCode::kUnavailable,
               "ddp.engine = gloo: this build's LibTorch came without Gloo's headers (PyTorch's own LibTorch ships none), so the Gloo "
               "engine was left out: use ddp.engine = links, or build against Debian's LibTorch with libgloo-dev");
}

#else

bool gloo_available() { return true; }

namespace {

using ProcessGroup = c10::intrusive_ptr<c10d::ProcessGroupGloo>;

ProcessGroup make_process_group(c10::intrusive_ptr<c10d::Store> store, int rank, int size, const GlooOptions& o) {
  store->setTimeout(o.timeout);
  auto opts = c10d::ProcessGroupGloo::Options::create();
  opts->timeout = o.timeout;
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(o.interface_host));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
}

// Rendezvous through the options' FileStore or fixed-port TCPStore.
ProcessGroup connect_fixed(const GlooOptions& o) {
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
  return make_process_group(std::move(store), o.rank, o.size, o);
}

// Rendezvous over the group's links: rank 0 serves a store on an ephemeral port and says where.
// Throws what c10d throws; returns a Status for what the links report.
Result<ProcessGroup> connect_over_group(const GlooOptions& o, const Group& g) {
  const Deadline deadline = Deadline::after(real_clock(), o.timeout);
  c10::intrusive_ptr<c10d::TCPStore> store;
  if (g.rank == 0) {
    c10d::TCPStoreOptions so;
    so.port = 0;
    so.isServer = true;
    so.waitWorkers = false;
    so.timeout = o.timeout;
    store = c10::make_intrusive<c10d::TCPStore>(o.store_host, so);
    Writer w;
    w.str(o.store_host);
    w.u16(store->getPort());
    const Bytes where = std::move(w).take();
    for (int j = 1; j < g.size; ++j) {
      if (Status st = g.peers[static_cast<std::size_t>(j)]->send(kGlooRendezvousTag, where, deadline); !st.ok()) {
        return st.with_context("telling rank " + std::to_string(j) + " where the gloo store is");
      }
    }
  } else {
    auto got = g.peers[0]->recv(kGlooRendezvousTag, deadline);
    if (!got.ok()) return got.status().with_context("hearing where rank 0's gloo store is");
    Reader r(*got, "gloo store address from rank 0");
    std::string host = r.str(256);
    const std::uint16_t port = r.u16();
    r.expect_end();
    if (!r.ok()) return r.status();
    if (port == 0) return error(ErrorCode::kMalformed, "rank 0 announced a gloo store on port 0");
    c10d::TCPStoreOptions so;
    so.port = port;
    so.isServer = false;
    so.timeout = o.timeout;
    store = c10::make_intrusive<c10d::TCPStore>(host, so);
  }
  return make_process_group(store, g.rank, g.size, o);
}

class GlooDdp final : public DataParallel {
 public:
  GlooDdp(ProcessGroup pg, int size, GlooOptions options) : pg_(std::move(pg)), size_(size), options_(std::move(options)) {}
  Status regroup(Group group) override {
    if (!options_.over_group_links) {
      return error(ErrorCode::kUnavailable, "this gloo ddp engine has a fixed rendezvous and cannot change its members mid-run");
    }
    pg_.reset();
    size_ = 1;
    if (group.size == 1) return Status();
    try {
      auto pg = connect_over_group(options_, group);
      if (!pg.ok()) return pg.status().with_context("forming the gloo group");
      pg_ = std::move(*pg);
      size_ = group.size;
    } catch (const std::exception& e) {
      return error(ErrorCode::kUnavailable, std::string("forming the gloo group failed: ") + e.what());
    }
    return Status();
  }

 protected:
  Status average(at::Tensor& flat, std::int64_t, Deadline deadline, CommStats& stats) override {
    if (size_ == 1) return Status();  // alone: the mean is the gradient
    if (!pg_) return error(ErrorCode::kUnavailable, "no gloo group: the last regroup failed");
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
  ProcessGroup pg_;
  int size_;
  GlooOptions options_;
};

}  // namespace

Result<GlooDataParallel> make_gloo_data_parallel(const GlooOptions& o, const Group& group) {
  const int rank = o.over_group_links ? group.rank : o.rank, size = o.over_group_links ? group.size : o.size;
  GOSSAMER_CHECK(size >= 1 && rank >= 0 && rank < size, "make_gloo_data_parallel: rank outside the group");
  try {
    std::unique_ptr<GlooDdp> ddp;
    if (o.over_group_links) {  // the first group is formed as every later one is
      ddp = std::make_unique<GlooDdp>(ProcessGroup(), 1, o);
      if (Status st = ddp->regroup(group); !st.ok()) return st;
    } else {
      ddp = std::make_unique<GlooDdp>(connect_fixed(o), size, o);
    }
    GlooDataParallel out;
    out.gradient_sync = ddp.get();
    out.outer = std::move(ddp);
    return out;
  } catch (const std::exception& e) {
    return error(ErrorCode::kUnavailable, std::string("gloo rendezvous failed (is rank 0 up and every rank started with the same size?): ") +
                                              e.what());
  }
}

#endif  // GOSSAMER_HAVE_GLOO

}  // namespace gossamer::optim
