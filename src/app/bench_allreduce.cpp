// `gossamer bench allreduce`: the mean all-reduce of one large fp32 tensor across in-process ranks
// that talk over TCP on loopback: Gossamer's collective (optim/collectives.h) with fp32, int8 and fp4
// codecs, next to Gloo through LibTorch's c10d ProcessGroupGloo (the engine PyTorch DDP uses on CPUs),
// interleaved in one run. Reports algorithm bandwidth (tensor bytes / time) and the ratio to Gloo, and
// the CPU time (all threads, kernel included) each all-reduce took: on loopback both are bound by the
// CPU the socket copies take, so that figure says why one is faster.
#include <torch/torch.h>
#if GOSSAMER_HAVE_GLOO
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

#include <algorithm>
#include <thread>
#include <utility>

#include <sys/resource.h>

#include <fmt/format.h>

#include "app/commands.h"
#include "optim/collectives.h"
#include "quant/codec.h"
#include "transport/tcp_transport.h"

namespace gossamer::app {

#if !GOSSAMER_HAVE_GLOO
int bench_allreduce(const BenchArgs&) {
  return report_failure(error(ErrorCode::kUnavailable, "bench allreduce times our all-reduce against Gloo, and this build's LibTorch came without "
                                                       "Gloo's headers (PyTorch's own LibTorch ships none): build against Debian's LibTorch "
                                                       "with libgloo-dev to run it"));
}
#else

namespace {

using namespace std::chrono_literals;

// CPU seconds this process has used, user and kernel, all threads.
double process_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec); };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

// One timed all-reduce: bandwidth (tensor bytes per second) and the CPU seconds it took.
struct Timed {
  double bandwidth = 0;
  double cpu = 0;
};

template <typename F>
void on_ranks(int m, F fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < m; ++r) threads.emplace_back([&fn, r] { fn(r); });
  for (auto& t : threads) t.join();
}


// Gossamer: a full mesh of TCP links between m transports (kept in `transports`), as m groups.
Result<std::vector<optim::Group>> loopback_mesh(int m, std::vector<std::unique_ptr<transport::Transport>>& transports) {
  for (int r = 0; r < m; ++r) {
    auto t = transport::make_tcp_transport(transport::TcpOptions{});
    if (!t.ok()) return t.status();
    transports.push_back(std::move(*t));
  }
  std::vector<optim::Group> groups(static_cast<std::size_t>(m));
  for (int r = 0; r < m; ++r) {
    groups[static_cast<std::size_t>(r)].rank = r;
    groups[static_cast<std::size_t>(r)].size = m;
    groups[static_cast<std::size_t>(r)].peers.resize(static_cast<std::size_t>(m));
  }
  for (int a = 0; a < m; ++a) {
    for (int b = a + 1; b < m; ++b) {
      auto ab = transports[static_cast<std::size_t>(a)]->connect(transports[static_cast<std::size_t>(b)]->address(), Deadline::after(real_clock(), 10s));
      if (!ab.ok()) return ab.status();
      auto ba = transports[static_cast<std::size_t>(b)]->accept(Deadline::after(real_clock(), 10s));
      if (!ba.ok()) return ba.status();
      groups[static_cast<std::size_t>(a)].peers[static_cast<std::size_t>(b)] = *ab;
      groups[static_cast<std::size_t>(b)].peers[static_cast<std::size_t>(a)] = *ba;
    }
  }
  return groups;
}

// Gloo: one process group per rank over a shared in-process store.
std::vector<c10::intrusive_ptr<c10d::ProcessGroupGloo>> gloo_groups(int m) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<c10::intrusive_ptr<c10d::ProcessGroupGloo>> gloo(static_cast<std::size_t>(m));
  on_ranks(m, [&](int r) {
    auto opts = c10d::ProcessGroupGloo::Options::create();
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    gloo[static_cast<std::size_t>(r)] = c10::make_intrusive<c10d::ProcessGroupGloo>(store, r, m, opts);
  });
  return gloo;
}

// One all-reduce on every rank at once, each rank reducing in place a fresh copy of its data made
// before the clock starts (as DDP reduces its gradient buckets): bandwidth and CPU seconds, and
// whether every rank succeeded (`reduce(r, tensor)` says whether rank r did).
template <typename Reduce>
std::pair<Timed, bool> timed_on_ranks(const std::vector<at::Tensor>& data, double bytes, Reduce reduce) {
  const int m = static_cast<int>(data.size());
  std::vector<at::Tensor> in;
  for (int r = 0; r < m; ++r) in.push_back(data[static_cast<std::size_t>(r)].clone());
  std::vector<int> ok(static_cast<std::size_t>(m), 0);
  const double cpu = process_cpu_seconds();
  Stopwatch w(real_clock());
  on_ranks(m, [&](int r) { ok[static_cast<std::size_t>(r)] = reduce(r, in[static_cast<std::size_t>(r)]) ? 1 : 0; });
  const double seconds = w.elapsed_seconds();
  return {Timed{bytes / seconds, process_cpu_seconds() - cpu}, std::count(ok.begin(), ok.end(), 0) == 0};
}

}  // namespace

int bench_allreduce(const BenchArgs& args) {
  const int m = static_cast<int>(args.ranks);
  const std::int64_t n = args.elements_allreduce;
  // Per rank, for each of the two collectives: its tensor, the result and the transfer buffers.
  if (Status st = check_bench_memory(6.0 * 4.0 * static_cast<double>(n) * m, "--values " + std::to_string(n) + " on --ranks " + std::to_string(m));
      !st.ok()) {
    return report_failure(st);
  }
  torch::set_num_threads(1);

  std::vector<std::unique_ptr<transport::Transport>> transports;
  auto mesh = loopback_mesh(m, transports);
  if (!mesh.ok()) return report_failure(mesh.status());
  std::vector<optim::Group>& groups = *mesh;
  const auto gloo = gloo_groups(m);

  std::vector<at::Tensor> data(static_cast<std::size_t>(m));
  for (int r = 0; r < m; ++r) data[static_cast<std::size_t>(r)] = torch::randn({n});
  const double bytes = static_cast<double>(n) * 4;

  auto timed = [&](auto reduce) { return timed_on_ranks(data, bytes, reduce); };
  // Each returns the figures, or the first rank's failure (never a figure for a failed run).
  auto time_ours = [&](quant::CodecId codec, std::int64_t segment_values = optim::kAllreduceSegmentValues) -> Result<Timed> {
    quant::EncodeOptions o;
    o.codec = codec;
    std::vector<Status> st(static_cast<std::size_t>(m));
    const auto [t, ok] = timed([&](int r, at::Tensor& x) {
      st[static_cast<std::size_t>(r)] =
          optim::allreduce_mean(groups[static_cast<std::size_t>(r)], x, o, 1, Deadline::after(real_clock(), 120s), nullptr, segment_values);
      return st[static_cast<std::size_t>(r)].ok();
    });
    if (!ok) {
      for (const auto& s : st) {
        if (!s.ok()) return s.with_context("gossamer all-reduce");
      }
    }
    return t;
  };
  auto time_gloo = [&]() -> Result<Timed> {
    const auto [t, ok] = timed([&](int r, at::Tensor& x) {
      std::vector<at::Tensor> ts{x};
      try {
        if (!gloo[static_cast<std::size_t>(r)]->allreduce(ts)->wait()) return false;
      } catch (const std::exception&) {
        return false;
      }
      ts[0].div_(m);  // Gloo sums; DDP divides afterwards
      return true;
    });
    if (!ok) return error(ErrorCode::kInternal, "the gloo all-reduce failed");
    return t;
  };

  fmt::print("bench allreduce: mean of {} fp32 values ({} MiB) over {} in-process ranks on TCP loopback, {} rounds after a warm-up\n", n,
             (n * 4) >> 20, m, args.rounds);
  // One untimed call of each first: connections, buffer pools and allocator arenas warm up on both sides.
  for (const Result<Timed>& warm : {time_gloo(), time_ours(quant::CodecId::kFp32), time_ours(quant::CodecId::kFp32, n),
                                    time_ours(quant::CodecId::kInt8), time_ours(quant::CodecId::kFp4E2M1)}) {
    if (!warm.ok()) return report_failure(warm.status());
  }
  std::vector<double> g, f32, whole, i8, f4, ratio, g_cpu, f32_cpu;
  for (std::int64_t round = 0; round < args.rounds; ++round) {
    Result<Timed> gl = Timed{}, a = Timed{};
    if (round % 2 == 0) {
      gl = time_gloo();
      a = time_ours(quant::CodecId::kFp32);
    } else {
      a = time_ours(quant::CodecId::kFp32);
      gl = time_gloo();
    }
    // The same collective moving each chunk whole (one message), to show what segmenting buys.
    const Result<Timed> w = time_ours(quant::CodecId::kFp32, n);
    const Result<Timed> b = time_ours(quant::CodecId::kInt8), c = time_ours(quant::CodecId::kFp4E2M1);
    for (const Result<Timed>* r : std::initializer_list<const Result<Timed>*>{&gl, &a, &w, &b, &c}) {
      if (!r->ok()) return report_failure(r->status());
    }
    g.push_back(gl->bandwidth);
    f32.push_back(a->bandwidth);
    whole.push_back(w->bandwidth);
    i8.push_back(b->bandwidth);
    f4.push_back(c->bandwidth);
    ratio.push_back(a->bandwidth / gl->bandwidth);
    g_cpu.push_back(gl->cpu);
    f32_cpu.push_back(a->cpu);
    fmt::print("  round {}: gloo {:.2f} GB/s ({:.0f} ms CPU), gossamer fp32 {:.2f} GB/s ({:.0f} ms CPU; ratio {:.3f}; whole chunks {:.2f} GB/s), "
               "int8 {:.2f} GB/s, fp4 {:.2f} GB/s\n",
               round + 1, gl->bandwidth / 1e9, gl->cpu * 1e3, a->bandwidth / 1e9, a->cpu * 1e3, a->bandwidth / gl->bandwidth,
               w->bandwidth / 1e9, b->bandwidth / 1e9, c->bandwidth / 1e9);
  }
  fmt::print("median: gloo {:.2f} GB/s ({:.0f} ms CPU), gossamer fp32 {:.2f} GB/s ({:.0f} ms CPU), ratio {:.3f} (whole chunks {:.2f} GB/s, "
             "{:.2f}x gloo); int8 {:.2f} GB/s ({:.2f}x gloo), fp4 {:.2f} GB/s ({:.2f}x gloo)\n",
             median(g) / 1e9, median(g_cpu) * 1e3, median(f32) / 1e9, median(f32_cpu) * 1e3, median(ratio), median(whole) / 1e9,
             median(whole) / median(g), median(i8) / 1e9, median(i8) / median(g), median(f4) / 1e9, median(f4) / median(g));
  return 0;
}

#endif  // GOSSAMER_HAVE_GLOO

}  // namespace gossamer::app
