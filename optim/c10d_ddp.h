// ddp's gradient averaging through a c10d process group (Gloo's or NCCL's): the rendezvous through a
// c10d store (fixed, or over the group's links) and one all-reduce of the flat gradient per step.
// Included only by the engines' own .cpp files (gloo_sync.cpp, nccl_sync.cpp), so that c10d's types
// stay out of every other header. Threading and errors as gloo_sync.h says.
#pragma once

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>

#include "core/wire.h"
#include "optim/data_parallel.h"
#include "optim/gloo_sync.h"

namespace gossamer::optim::c10d_ddp {

// Makes an engine's process group over a store.
template <class Pg>
using MakeGroup = std::function<c10::intrusive_ptr<Pg>(c10::intrusive_ptr<c10d::Store>, int rank, int size, const GlooOptions&)>;

// Rendezvous through the options' FileStore or fixed-port TCPStore.
template <class Pg>
c10::intrusive_ptr<Pg> connect_fixed(const GlooOptions& o, const MakeGroup<Pg>& make) {
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
  return make(std::move(store), o.rank, o.size, o);
}

// Rendezvous over the group's links: rank 0 serves a store on an ephemeral port and says where.
// Throws what c10d throws; returns a Status for what the links report.
template <class Pg>
Result<c10::intrusive_ptr<Pg>> connect_over_group(const GlooOptions& o, const Group& g, const MakeGroup<Pg>& make, const std::string& engine) {
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
        return st.with_context("telling rank " + std::to_string(j) + " where the " + engine + " store is");
      }
    }
  } else {
    auto got = g.peers[0]->recv(kGlooRendezvousTag, deadline);
    if (!got.ok()) return got.status().with_context("hearing where rank 0's " + engine + " store is");
    Reader r(*got, engine + " store address from rank 0");
    std::string host = r.str(256);
    const std::uint16_t port = r.u16();
    r.expect_end();
    if (!r.ok()) return r.status();
    if (port == 0) return error(ErrorCode::kMalformed, "rank 0 announced a " + engine + " store on port 0");
    c10d::TCPStoreOptions so;
    so.port = port;
    so.isServer = false;
    so.timeout = o.timeout;
    store = c10::make_intrusive<c10d::TCPStore>(host, so);
  }
  store->setTimeout(o.timeout);
  return make(store, g.rank, g.size, o);
}

// What sets one engine apart: its name in messages, whether it all-reduces GPU tensors only, and how
// it makes its process group.
template <class Pg>
struct Engine {
  std::string name;
  bool gpu_only = false;
  MakeGroup<Pg> make;
};

template <class Pg>
class Ddp final : public DataParallel {
 public:
  Ddp(c10::intrusive_ptr<Pg> pg, int size, GlooOptions options, Engine<Pg> engine)
      : pg_(std::move(pg)), size_(size), options_(std::move(options)), make_(std::move(engine.make)), engine_(std::move(engine.name)),
        gpu_only_(engine.gpu_only) {}
  Status regroup(Group group) override {
    if (!options_.over_group_links) {
      return error(ErrorCode::kUnavailable, "this " + engine_ + " ddp engine has a fixed rendezvous and cannot change its members mid-run");
    }
    pg_.reset();
    size_ = 1;
    if (group.size == 1) return Status();
    try {
      auto pg = connect_over_group<Pg>(options_, group, make_, engine_);
      if (!pg.ok()) return pg.status().with_context("forming the " + engine_ + " group");
      pg_ = std::move(*pg);
      size_ = group.size;
    } catch (const std::exception& e) {
      return error(ErrorCode::kUnavailable, "forming the " + engine_ + " group failed: " + e.what());
    }
    return Status();
  }

 protected:
  Status average(at::Tensor& flat, std::int64_t, Deadline deadline, CommStats& stats) override {
    if (gpu_only_ && !flat.is_cuda()) {  // said alone too, before a second peer makes it fail
      return error(ErrorCode::kInvalidArgument, "ddp.engine = " + engine_ + " all-reduces tensors on a GPU, and this peer trains on " + flat.device().str() +
                                                    ": run every peer with train.device = cuda:N, a GPU of its own");
    }
    if (size_ == 1) return Status();  // alone: the mean is the gradient
    if (!pg_) return error(ErrorCode::kUnavailable, "no " + engine_ + " group: the last regroup failed");
    Stopwatch watch(real_clock());
    std::vector<at::Tensor> buffers{flat};
    try {
      c10d::AllreduceOptions o;
      // never() as the longest wait; an expired deadline as the shortest (0 would mean "no timeout").
      constexpr std::chrono::milliseconds kLongest = std::chrono::hours(24), kShortest{1};
      o.timeout = deadline.is_never()
                      ? kLongest
                      : std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(deadline.remaining(real_clock())), kShortest, kLongest);
      auto work = pg_->allreduce(buffers, o);
      if (!work->wait(o.timeout)) return error(ErrorCode::kTimeout, engine_ + " all-reduce did not finish before the deadline");
    } catch (const std::exception& e) {
      return error(ErrorCode::kPeerLost, engine_ + " all-reduce failed (a peer died?): " + e.what());
    }
    flat.div_(size_);
    // Ring all-reduce: 2 (M-1)/M of the buffer each way (the engines do not report their own counts).
    const auto bytes = static_cast<std::uint64_t>(2.0 * (size_ - 1) / size_ * static_cast<double>(flat.numel()) * 4.0);
    stats += CommStats{bytes, bytes, watch.elapsed_seconds()};
    return Status();
  }

 private:
  c10::intrusive_ptr<Pg> pg_;
  int size_;
  GlooOptions options_;
  MakeGroup<Pg> make_;
  std::string engine_;
  bool gpu_only_;
};

// The engine over the options' rendezvous (fixed, or over `group`'s links).
template <class Pg>
Result<GlooDataParallel> make(const GlooOptions& o, const Group& group, Engine<Pg> engine) {
  const int rank = o.over_group_links ? group.rank : o.rank, size = o.over_group_links ? group.size : o.size;
  GOSSAMER_CHECK(size >= 1 && rank >= 0 && rank < size, "make_" + engine.name + "_data_parallel: rank outside the group");
  const std::string name = engine.name;
  try {
    std::unique_ptr<Ddp<Pg>> ddp;
    if (o.over_group_links) {  // the first group is formed as every later one is
      ddp = std::make_unique<Ddp<Pg>>(c10::intrusive_ptr<Pg>(), 1, o, std::move(engine));
      if (Status st = ddp->regroup(group); !st.ok()) return st;
    } else {
      auto pg = connect_fixed<Pg>(o, engine.make);
      ddp = std::make_unique<Ddp<Pg>>(std::move(pg), size, o, std::move(engine));
    }
    GlooDataParallel out;
    out.gradient_sync = ddp.get();
    out.outer = std::move(ddp);
    return out;
  } catch (const std::exception& e) {
    return error(ErrorCode::kUnavailable, name + " rendezvous failed (is rank 0 up and every rank started with the same size?): " + e.what());
  }
}

}  // namespace gossamer::optim::c10d_ddp
