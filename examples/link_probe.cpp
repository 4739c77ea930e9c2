// link_probe: measures goodput over one Gossamer link between two processes, optionally through the
// userspace shaper. Used by netns_tbf.sh to compare the shaper with the kernel's tbf.
//   link_probe serve HOST:PORT               receive messages until the sender closes
//   link_probe send HOST:PORT MIB [MBIT]     send MIB MiB in 1 MiB messages, shaped to MBIT if given
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/clock.h"
#include "transport/shaped_link.h"
#include "transport/tcp_transport.h"

using namespace gossamer;
using namespace gossamer::transport;
using namespace std::chrono_literals;

namespace {
int usage() {
  std::fprintf(stderr, "usage: link_probe serve HOST:PORT | link_probe send HOST:PORT MIB [MBIT]\n");
  return 2;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return usage();
  const std::string mode = argv[1], address = argv[2];
  TcpOptions o;
  if (mode == "serve") {
    o.listen = address;
    auto t = make_tcp_transport(o);
    if (!t.ok()) return std::fprintf(stderr, "link_probe: %s\n", t.status().message().c_str()), 1;
    std::printf("serving on %s\n", (*t)->address().c_str());
    std::fflush(stdout);
    auto link = (*t)->accept(Deadline::after(real_clock(), 60s));
    if (!link.ok()) return std::fprintf(stderr, "link_probe: %s\n", link.status().message().c_str()), 1;
    std::size_t bytes = 0;
    Stopwatch w(real_clock());
    double first = -1, last = 0;  // arrival of the first and the last message
    for (;;) {
      auto m = (*link)->recv(1, Deadline::after(real_clock(), 60s));
      if (!m.ok()) break;  // the sender closed the link
      last = w.elapsed_seconds();
      if (first < 0) {
        first = last;
      } else {
        bytes += m->size();  // bytes that arrived after the first message, over the time they took
      }
    }
    const double span = last - first;
    std::printf("received %zu bytes after the first message in %.3f s: %.1f Mbit/s\n", bytes, span, span > 0 ? bytes * 8 / span / 1e6 : 0.0);
    return 0;
  }
  if (mode != "send" || argc < 4) return usage();
  const long mib = std::atol(argv[3]);
  auto t = make_tcp_transport(o);
  if (!t.ok()) return std::fprintf(stderr, "link_probe: %s\n", t.status().message().c_str()), 1;
  auto link = (*t)->connect(address, Deadline::after(real_clock(), 10s));
  if (!link.ok()) return std::fprintf(stderr, "link_probe: %s\n", link.status().message().c_str()), 1;
  std::shared_ptr<Link> out = *link;
  if (argc >= 5) {
    LinkProfile p;
    p.name = "probe";
    p.bandwidth_bytes_per_s = std::atof(argv[4]) * 1e6 / 8;
    auto shaped = make_shaped_link(out, p);
    if (!shaped.ok()) return std::fprintf(stderr, "link_probe: %s\n", shaped.status().message().c_str()), 1;
    out = *shaped;
  }
  const Bytes chunk(std::size_t{1} << 20, std::byte{1});
  Stopwatch w(real_clock());
  for (long i = 0; i < mib; ++i) {
    if (Status st = out->send(1, chunk, Deadline::after(real_clock(), 120s)); !st.ok()) {
      return std::fprintf(stderr, "link_probe: %s\n", st.message().c_str()), 1;
    }
  }
  // A shaped link delivers what its sends accepted as it goes away (its last MiB is still buffered).
  out.reset();
  std::printf("sent %ld MiB in %.3f s\n", mib, w.elapsed_seconds());
  (*link)->close();
  return 0;
}
