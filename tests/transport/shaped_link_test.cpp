// The shaper: rate within 5% for messages of 1 MiB and more, latency within 1 ms.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <vector>
#include <thread>

#include "transport/shaped_link.h"
#include "transport/tcp_transport.h"

using namespace gossamer;
using namespace gossamer::transport;
using namespace std::chrono_literals;

namespace {

struct Pair {
  std::unique_ptr<Transport> a, b;
  std::shared_ptr<Link> ab, ba;
};

Pair make_pair() {
  TcpOptions o;
  auto a = make_tcp_transport(o), b = make_tcp_transport(o);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  Pair p{std::move(*a), std::move(*b), nullptr, nullptr};
  auto ab = p.a->connect(p.b->address(), Deadline::after(real_clock(), 5s));
  REQUIRE(ab.ok());
  auto ba = p.b->accept(Deadline::after(real_clock(), 5s));
  REQUIRE(ba.ok());
  p.ab = *ab;
  p.ba = *ba;
  return p;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

// Real-time checks on a shared machine: a stall of the host only ever adds delay, so "never early"
// and "never faster" hold in every attempt, while "on time" and "at full rate" need to hold in one
// of three attempts (a shaper that is wrong fails all three).
constexpr int kAttempts = 3;

// Runs `measure` until `good` holds of its figure, at most kAttempts times; the figures measured.
template <typename Measure, typename Good>
std::vector<double> until_good(Measure measure, Good good) {
  std::vector<double> figures;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    figures.push_back(measure());
    if (good(figures.back())) break;
  }
  return figures;
}

TEST_CASE("the shaper adds its latency within 1 ms") {
  Pair p = make_pair();
  LinkProfile profile;
  profile.latency = 20ms;
  auto shaped = make_shaped_link(p.ab, profile);
  REQUIRE(shaped.ok());
  const auto on_time = [](double median_ms) { return median_ms <= 21.0; };
  const std::vector<double> medians = until_good(
      [&] {
        std::vector<double> ms;
        for (int i = 0; i < 9; ++i) {
          const auto t0 = std::chrono::steady_clock::now();
          REQUIRE((*shaped)->send(1, Bytes(64), Deadline::never()).ok());
          REQUIRE(p.ba->recv(1, Deadline::after(real_clock(), 5s)).ok());
          ms.push_back(seconds_since(t0) * 1e3);
          CHECK(ms.back() >= 20.0);  // never early
        }
        std::sort(ms.begin(), ms.end());
        return ms[4];
      },
      on_time);
  CAPTURE(medians.front());
  CAPTURE(medians.back());
  CHECK(on_time(medians.back()));
}

TEST_CASE("the shaper delivers within 5% of its configured rate for messages of 1 MiB and more") {
  Pair p = make_pair();
  for (std::size_t size : {std::size_t{1} << 20, std::size_t{4} << 20}) {
    // The sender pauses 20 ms before each message, as a caller preparing the next one does; the
    // send buffer (84 ms at this rate) keeps the wire busy meanwhile. Without it, the pauses would
    // cost 100 ms of the 0.5 s that 6 MiB take: 20% of the rate.
    LinkProfile profile;
    profile.bandwidth_bytes_per_s = 100e6 / 8;  // 100 Mbit/s
    profile.latency = 10ms;
    CHECK(profile.goodput_bytes_per_s() == doctest::Approx(profile.bandwidth_bytes_per_s * 1448.0 / 1514.0));
    const int messages = 6;
    const Bytes payload(size, std::byte{1});
    const std::vector<double> rates = until_good(
        [&] {
          auto shaped = make_shaped_link(p.ab, profile);
          REQUIRE(shaped.ok());
          const auto t0 = std::chrono::steady_clock::now();
          std::thread sender([&] {
            for (int i = 0; i < messages; ++i) {
              if (i > 0) std::this_thread::sleep_for(20ms);
              REQUIRE((*shaped)->send(2, payload, Deadline::never()).ok());
            }
          });
          for (int i = 0; i < messages; ++i) REQUIRE(p.ba->recv(2, Deadline::after(real_clock(), 30s)).ok());
          const double elapsed = seconds_since(t0);
          sender.join();
          // Delivery of the last byte = all bytes at the configured rate + one latency. The configured
          // rate is on the wire; payload goes at the goodput (about 95.6% of it with 1500-byte packets).
          const double rate = static_cast<double>(messages) * static_cast<double>(size) / (elapsed - 0.010);
          CAPTURE(size);
          CAPTURE(rate);
          CHECK(rate <= profile.goodput_bytes_per_s() * 1.05);  // never faster
          return rate;
        },
        [&](double rate) { return rate >= profile.goodput_bytes_per_s() * 0.95; });
    CAPTURE(size);
    CAPTURE(rates.front());
    CAPTURE(rates.back());
    CHECK(rates.back() == doctest::Approx(profile.goodput_bytes_per_s()).epsilon(0.05));
  }
}

TEST_CASE("a shaped link going away still delivers what its sends accepted") {
  Pair p = make_pair();
  LinkProfile profile;
  profile.bandwidth_bytes_per_s = 100e6 / 8;
  profile.latency = 1s;
  auto shaped = make_shaped_link(p.ab, profile);
  REQUIRE(shaped.ok());
  Bytes payload(std::size_t{3} << 20);
  for (std::size_t i = 0; i < payload.size(); i += 4096) payload[i] = static_cast<std::byte>(i / 4096);
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE((*shaped)->send(5, payload, Deadline::never()).ok());
  // send() returned with the last MiB still to go out (84 ms) and the second of latency ahead; the
  // link is destroyed long before the message is due, and must deliver it all the same.
  CHECK(seconds_since(t0) < 1.0);
  shaped->reset();
  auto got = p.ba->recv(5, Deadline::after(real_clock(), 5s));
  REQUIRE(got.ok());
  CHECK(*got == payload);
  CHECK(seconds_since(t0) >= 1.25);  // 3 MiB of wire bytes at 100 Mbit/s, plus 1 s: never early
}

TEST_CASE("jitter never reorders, loss only delays, and a send past its deadline fails") {
  Pair p = make_pair();
  LinkProfile profile;
  profile.latency = 2ms;
  profile.jitter = 3ms;
  profile.loss = 0.2;
  profile.bandwidth_bytes_per_s = 50e6;
  auto shaped = make_shaped_link(p.ab, profile, 7);
  REQUIRE(shaped.ok());
  for (std::uint32_t i = 0; i < 50; ++i) {
    Bytes m(4 + i * 100);
    std::memcpy(m.data(), &i, 4);
    REQUIRE((*shaped)->send(3, m, Deadline::never()).ok());
  }
  for (std::uint32_t i = 0; i < 50; ++i) {
    auto m = p.ba->recv(3, Deadline::after(real_clock(), 10s));
    REQUIRE(m.ok());
    std::uint32_t got = 0;
    std::memcpy(&got, m->data(), 4);
    CHECK(got == i);
  }
  LinkProfile slow;
  slow.bandwidth_bytes_per_s = 1e3;
  auto crawl = make_shaped_link(p.ab, slow);
  REQUIRE(crawl.ok());
  CHECK((*crawl)->send(4, Bytes(1 << 20), Deadline::after(real_clock(), 100ms)).code() == ErrorCode::kTimeout);
  // The refused message occupies nothing: a small one after it goes out at once (0.2 s of wire;
  // behind the refused one it would need 18 minutes and time out too).
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE((*crawl)->send(4, Bytes(64), Deadline::after(real_clock(), 100ms)).ok());
  auto small = p.ba->recv(4, Deadline::after(real_clock(), 5s));
  REQUIRE(small.ok());
  CHECK(small->size() == 64);
  CHECK(seconds_since(t0) < 2.0);
  LinkProfile invalid;
  invalid.loss = 2.0;
  CHECK(make_shaped_link(p.ab, invalid).status().code() == ErrorCode::kInvalidArgument);
}
