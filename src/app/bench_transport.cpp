// `gossamer bench transport`: goodput of large messages over one loopback link, next to a plain
// blocking-socket sender and receiver moving the same bytes in the same run; and messages per second
// for small frames. With --relay: the same two peers linked directly and through a relay.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "app/commands.h"
#include "core/clock.h"
#include "transport/gossip.h"
#include "transport/striped_link.h"
#include "transport/tcp_transport.h"

namespace gossamer::app {

namespace {

using namespace std::chrono_literals;

// Plain sockets: a blocking sender write()s each message after an 8-byte length; the receiver reads
// the length, allocates the message (as any message receiver must) and reads it.
double plain_goodput(std::size_t message_bytes, int messages) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  (void)::bind(listener, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  (void)::listen(listener, 1);
  socklen_t len = sizeof(sa);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&sa), &len);
  const int client = ::socket(AF_INET, SOCK_STREAM, 0);
  (void)::connect(client, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  const int server = ::accept(listener, nullptr, nullptr);
  const std::vector<char> payload(message_bytes, 1);

  Stopwatch w(real_clock());
  std::thread receiver([&] {
    for (int m = 0; m < messages; ++m) {
      std::uint64_t n = 0;
      std::size_t got = 0;
      while (got < 8) got += static_cast<std::size_t>(std::max<ssize_t>(0, ::read(server, reinterpret_cast<char*>(&n) + got, 8 - got)));
      std::vector<char> buf(n);
      got = 0;
      while (got < n) {
        const ssize_t r = ::read(server, buf.data() + got, n - got);
        if (r <= 0) return;
        got += static_cast<std::size_t>(r);
      }
    }
  });
  for (int m = 0; m < messages; ++m) {
    const std::uint64_t n = payload.size();
    (void)!::write(client, &n, 8);
    std::size_t sent = 0;
    while (sent < payload.size()) {
      const ssize_t r = ::write(client, payload.data() + sent, payload.size() - sent);
      if (r <= 0) break;
      sent += static_cast<std::size_t>(r);
    }
  }
  receiver.join();
  const double seconds = w.elapsed_seconds();
  ::close(client);
  ::close(server);
  ::close(listener);
  return static_cast<double>(message_bytes) * messages / seconds;
}

double link_goodput(transport::Link& tx, transport::Link& rx, std::size_t message_bytes, int messages) {
  const Bytes payload(message_bytes, std::byte{1});
  Stopwatch w(real_clock());
  std::thread receiver([&] {
    for (int m = 0; m < messages; ++m) {
      if (!rx.recv(1, Deadline::after(real_clock(), 60s)).ok()) return;
    }
  });
  for (int m = 0; m < messages; ++m) {
    if (!tx.send(1, payload, Deadline::after(real_clock(), 60s)).ok()) break;
  }
  receiver.join();
  return static_cast<double>(message_bytes) * messages / w.elapsed_seconds();
}

}  // namespace

namespace {

struct LinkPair {
  std::unique_ptr<transport::Transport> a, b;
  std::shared_ptr<transport::Link> ab, ba;
};

Result<LinkPair> link_pair(std::optional<transport::RunKey> key) {
  transport::TcpOptions o;
  o.key = std::move(key);
  auto a = transport::make_tcp_transport(o);
  if (!a.ok()) return a.status();
  auto b = transport::make_tcp_transport(o);
  if (!b.ok()) return b.status();
  auto ab = (*a)->connect((*b)->address(), Deadline::after(real_clock(), 5s));
  if (!ab.ok()) return ab.status();
  auto ba = (*b)->accept(Deadline::after(real_clock(), 5s));
  if (!ba.ok()) return ba.status();
  return LinkPair{std::move(*a), std::move(*b), *ab, *ba};
}

// Median round trip of a 64-byte message and its echo.
double round_trip_s(transport::Link& a, transport::Link& b, int pings) {
  const Bytes tiny(64, std::byte{3});
  std::vector<double> rtts;
  std::thread echo([&] {
    for (int i = 0; i < pings; ++i) {
      auto m = b.recv(3, Deadline::after(real_clock(), 10s));
      if (!m.ok() || !b.send(4, *m, Deadline::after(real_clock(), 10s)).ok()) return;
    }
  });
  for (int i = 0; i < pings; ++i) {
    Stopwatch w(real_clock());
    if (!a.send(3, tiny, Deadline::after(real_clock(), 10s)).ok() || !a.recv(4, Deadline::after(real_clock(), 10s)).ok()) break;
    rtts.push_back(w.elapsed_seconds());
  }
  echo.join();
  return rtts.empty() ? 0.0 : median(rtts);
}

// The same two encrypted transports linked directly and through a third as relay (transport/relay.h),
// measured in alternation: goodput of large messages and the round trip of small ones.
int bench_relay(const BenchArgs& args) {
  transport::TcpOptions o;
  o.key = transport::generate_run_key();
  std::unique_ptr<transport::Transport> t[3];
  for (auto& x : t) {
    auto made = transport::make_tcp_transport(o);
    if (!made.ok()) return report_failure(made.status());
    x = std::move(*made);
  }
  auto& a = *t[0];
  auto& b = *t[1];
  auto& relay = *t[2];
  auto direct = a.connect(b.address(), Deadline::after(real_clock(), 5s));
  if (!direct.ok()) return report_failure(direct.status());
  auto direct_b = b.accept(Deadline::after(real_clock(), 5s));
  if (!direct_b.ok()) return report_failure(direct_b.status());
  Result<std::shared_ptr<transport::Link>> relayed_b = error(ErrorCode::kTimeout, "not asked");
  std::thread other([&] { relayed_b = b.connect_relayed(relay.address(), relay.self(), a.self(), 1, false, Deadline::after(real_clock(), 10s)); });
  auto relayed = a.connect_relayed(relay.address(), relay.self(), b.self(), 1, true, Deadline::after(real_clock(), 10s));
  other.join();
  if (!relayed.ok()) return report_failure(relayed.status());
  if (!relayed_b.ok()) return report_failure(relayed_b.status());

  const std::size_t big = static_cast<std::size_t>(args.message_mib) << 20;
  const int per_round = 4, pings = 2000;
  fmt::print("bench transport, relay: encrypted links, {} MiB messages ({} per round) and {} round trips of 64 bytes, direct and through a relay, "
             "alternating, {} rounds, loopback\n", args.message_mib, per_round, pings, args.rounds);
  std::vector<double> ratios, added, d_gs, r_gs, d_rtt, r_rtt;
  for (std::int64_t r = 0; r < args.rounds; ++r) {
    double dg = 0, rg = 0, drt = 0, rrt = 0;
    const auto run_direct = [&] {
      dg = link_goodput(**direct, **direct_b, big, per_round);
      drt = round_trip_s(**direct, **direct_b, pings);
    };
    const auto run_relayed = [&] {
      rg = link_goodput(**relayed, **relayed_b, big, per_round);
      rrt = round_trip_s(**relayed, **relayed_b, pings);
    };
    if (r % 2 == 0) {
      run_direct();
      run_relayed();
    } else {
      run_relayed();
      run_direct();
    }
    d_gs.push_back(dg);
    r_gs.push_back(rg);
    d_rtt.push_back(drt);
    r_rtt.push_back(rrt);
    ratios.push_back(rg / dg);
    added.push_back(rrt - drt);
    fmt::print("  round {}: direct {:.2f} GB/s, rtt {:.1f} us; relayed {:.2f} GB/s, rtt {:.1f} us; goodput ratio {:.3f}, added rtt {:.1f} us\n", r + 1,
               dg / 1e9, drt * 1e6, rg / 1e9, rrt * 1e6, rg / dg, (rrt - drt) * 1e6);
  }
  fmt::print("median: direct {:.2f} GB/s, relayed {:.2f} GB/s, ratio {:.3f}; round trip direct {:.1f} us, relayed {:.1f} us, added {:.1f} us; "
             "the relay forwarded {:.2f} GB\n",
             median(d_gs) / 1e9, median(r_gs) / 1e9, median(ratios), median(d_rtt) * 1e6, median(r_rtt) * 1e6, median(added) * 1e6,
             relay.stats().relay_forwarded_bytes / 1e9);
  return 0;
}


// Small frames: one sender, one receiver, 64-byte messages.
void small_frames(transport::Link& ab, transport::Link& ba) {
  const int small = 100000;
  const double rate = link_goodput(ab, ba, 64, small) / 64;  // messages per second
  fmt::print("small frames: {} messages of 64 bytes in {:.3f} s: {:.0f} messages/s\n", small, small / rate, rate);
}

// Gossip convergence: nodes join through one seed (default period); the time until every node sees
// all the others alive. Whether they did within a minute.
Result<bool> gossip_convergence(int nodes_wanted) {
  transport::GossipOptions go;
  std::vector<std::unique_ptr<transport::Gossip>> nodes;
  Stopwatch gw(real_clock());
  for (int i = 0; i < nodes_wanted; ++i) {
    if (i > 0) go.seeds = {nodes[0]->address()};
    auto g = transport::make_gossip(go);
    if (!g.ok()) return g.status();
    nodes.push_back(std::move(*g));
  }
  const Deadline limit = Deadline::after(real_clock(), 60s);
  bool full = false;
  while (!full && !limit.expired(real_clock())) {
    full = true;
    for (auto& n : nodes) {
      std::size_t alive = 0;
      for (const auto& m : n->members()) alive += m.state == transport::MemberState::kAlive ? 1 : 0;
      if (alive != nodes.size() - 1) {
        full = false;
        break;
      }
    }
    if (!full) std::this_thread::sleep_for(5ms);
  }
  const double seconds = gw.elapsed_seconds();
  fmt::print("gossip: {} peers {} full membership in {:.2f} s ({:.1f} periods of {} ms, fanout {})\n", nodes_wanted,
             full ? "reached" : "did NOT reach", seconds, seconds / std::chrono::duration<double>(go.period).count(),
             std::chrono::duration_cast<std::chrono::milliseconds>(go.period).count(), go.fanout);
  return full;
}

}  // namespace

int bench_transport(const BenchArgs& args) {
  if (args.relay) return bench_relay(args);
  auto plain_pair = link_pair(std::nullopt);
  if (!plain_pair.ok()) return report_failure(plain_pair.status());
  std::optional<LinkPair> secure_pair;
  if (args.encrypted) {
    auto p = link_pair(transport::generate_run_key());
    if (!p.ok()) return report_failure(p.status());
    secure_pair = std::move(*p);
  }
  auto& ab = plain_pair->ab;
  auto& ba = plain_pair->ba;

  // A striped link: 4 TCP streams to the same peer.
  std::shared_ptr<transport::Link> striped_tx, striped_rx;
  {
    transport::StripedAcceptor acceptor(*plain_pair->b);
    Status accept_status;
    std::thread server([&] {
      auto l = acceptor.accept(Deadline::after(real_clock(), 10s));
      if (l.ok()) {
        striped_rx = *l;
      } else {
        accept_status = l.status();
      }
    });
    transport::StripeOptions so;
    so.lanes = 4;
    auto l = transport::connect_striped(*plain_pair->a, plain_pair->b->address(), so, Deadline::after(real_clock(), 10s));
    server.join();
    if (!l.ok()) return report_failure(l.status());
    if (!accept_status.ok()) return report_failure(accept_status);
    striped_tx = *l;
  }

  const std::size_t big = static_cast<std::size_t>(args.message_mib) << 20;
  const int per_round = 4;
  fmt::print("bench transport: {} MiB messages, {} per round, {} rounds, loopback\n", args.message_mib, per_round, args.rounds);
  std::vector<double> ours, secure, plain, ratios, secure_ratios, striped;
  for (std::int64_t r = 0; r < args.rounds; ++r) {
    double g = 0, s = 0, p = 0;
    auto run_ours = [&] { g = link_goodput(*ab, *ba, big, per_round); };
    auto run_secure = [&] { s = secure_pair ? link_goodput(*secure_pair->ab, *secure_pair->ba, big, per_round) : 0.0; };
    auto run_plain = [&] { p = plain_goodput(big, per_round); };
    double st = link_goodput(*striped_tx, *striped_rx, big, per_round);
    if (r % 2 == 0) {
      run_ours();
      run_secure();
      run_plain();
    } else {
      run_plain();
      run_secure();
      run_ours();
    }
    ours.push_back(g);
    secure.push_back(s);
    plain.push_back(p);
    ratios.push_back(g / p);
    striped.push_back(st);
    secure_ratios.push_back(s / p);
    fmt::print("  round {}: gossamer link {:.2f} GB/s, encrypted {:.2f} GB/s, plain sockets {:.2f} GB/s, ratios {:.3f} / {:.3f}\n", r + 1,
               g / 1e9, s / 1e9, p / 1e9, g / p, s / p);
  }
  fmt::print("median: gossamer link {:.2f} GB/s, plain sockets {:.2f} GB/s, ratio {:.3f}\n", median(ours) / 1e9, median(plain) / 1e9,
             median(ratios));
  fmt::print("median: striped link (4 TCP streams) {:.2f} GB/s\n", median(striped) / 1e9);
  if (secure_pair) {
    fmt::print("median: encrypted gossamer link {:.2f} GB/s, ratio to plain sockets {:.3f} (encryption costs {:.0f}% of goodput)\n",
               median(secure) / 1e9, median(secure_ratios), 100.0 * (1.0 - median(secure) / median(ours)));
  }

  small_frames(*ab, *ba);
  auto gossip = gossip_convergence(static_cast<int>(args.gossip_peers));
  if (!gossip.ok()) return report_failure(gossip.status());
  return *gossip ? 0 : 1;
}

}  // namespace gossamer::app
