#include <doctest/doctest.h>

#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "core/signal.h"
#include "sim/scheduler.h"

using namespace gossamer;
using namespace gossamer::sim;
using namespace std::chrono_literals;

TEST_CASE("virtual time advances only when every simulated thread waits, in time order") {
  Scheduler s;
  std::vector<std::string> log;
  std::vector<std::unique_ptr<ClockThread>> threads;
  for (int i = 0; i < 3; ++i) {
    threads.push_back(s.start_thread([&, i] {
      for (int k = 0; k < 3; ++k) {
        s.sleep_for(Nanos((i + 1) * 10));
        log.push_back(std::to_string(s.now().count()) + ":" + std::to_string(i));
      }
    }));
  }
  REQUIRE(s.run().ok());
  CHECK(s.now() == 90ns);
  // Equal times go in the order the wake-ups were scheduled: deterministic, whatever the host does.
  const std::vector<std::string> expected = {"10:0", "20:1", "20:0", "30:2", "30:0", "40:1", "60:2", "60:1", "90:2"};
  CHECK(log == expected);
}

TEST_CASE("a simulated Signal wakes waiters on notify and times out at its virtual deadline") {
  Scheduler s;
  std::mutex mu;
  auto sig = s.make_signal();
  bool flag = false;
  Nanos woke{-1}, timed_out{-1};
  auto waiter = s.start_thread([&] {
    std::unique_lock<std::mutex> lock(mu);
    CHECK(sig->wait(lock, Deadline::never(), [&] { return flag; }));
    woke = s.now();
  });
  auto impatient = s.start_thread([&] {
    std::unique_lock<std::mutex> lock(mu);
    CHECK_FALSE(sig->wait(lock, Deadline::after(s, 5ms), [] { return false; }));
    timed_out = s.now();
  });
  auto notifier = s.start_thread([&] {
    s.sleep_for(7ms);
    std::lock_guard<std::mutex> lock(mu);
    flag = true;
    sig->notify_all();
  });
  REQUIRE(s.run().ok());
  CHECK(woke == 7ms);
  CHECK(timed_out == 5ms);
}

TEST_CASE("join from a simulated thread waits in virtual time") {
  Scheduler s;
  Nanos joined{-1};
  auto outer = s.start_thread([&] {
    auto inner = s.start_thread([&] { s.sleep_for(3s); });
    inner->join();
    joined = s.now();
  });
  REQUIRE(s.run().ok());
  CHECK(joined == 3s);
}

TEST_CASE("a simulated deadlock is reported, not hung on") {
  Scheduler s;
  std::mutex mu;
  auto sig = s.make_signal();
  auto stuck = s.start_thread([&] {
    std::unique_lock<std::mutex> lock(mu);
    sig->wait(lock, Deadline::never(), [] { return false; });
  });
  Status st = s.run();
  CHECK(st.code() == ErrorCode::kAborted);
}

TEST_CASE("an exception in a simulated thread reaches run()") {
  Scheduler s;
  auto bad = s.start_thread([&] {
    s.sleep_for(1ms);
    throw std::runtime_error("boom");
  });
  auto other = s.start_thread([&] { s.sleep_for(1h); });
  CHECK_THROWS_WITH_AS((void)s.run(), "boom", std::runtime_error);
}

TEST_CASE("timer callbacks run at their time, between simulated threads") {
  Scheduler s;
  std::vector<Nanos> at;
  s.call_at(4ms, [&] { at.push_back(s.now()); });
  auto t = s.start_thread([&] {
    s.sleep_for(2ms);
    s.call_at(s.now() + 1ms, [&] { at.push_back(s.now()); });
    s.sleep_for(10ms);
  });
  REQUIRE(s.run().ok());
  CHECK(at == std::vector<Nanos>{3ms, 4ms});
  CHECK(s.now() == 12ms);
}

TEST_CASE("each simulated thread keeps its own LibTorch grad mode across switches") {
  Scheduler s;
  bool a_saw_disabled = false, b_saw_enabled = false, b_after = false;
  auto a = s.start_thread([&] {
    torch::NoGradGuard no_grad;
    s.sleep_for(2s);  // b runs meanwhile
    a_saw_disabled = !torch::GradMode::is_enabled();
  });
  auto b = s.start_thread([&] {
    s.sleep_for(1s);  // a is parked with grad mode off
    b_saw_enabled = torch::GradMode::is_enabled();
    auto x = torch::ones({2}, torch::requires_grad());
    b_after = (x * 2).sum().requires_grad();
  });
  REQUIRE(s.run().ok());
  CHECK(a_saw_disabled);
  CHECK(b_saw_enabled);
  CHECK(b_after);
  CHECK(torch::GradMode::is_enabled());  // the caller's own state is back
}

TEST_CASE("many simulated threads switch thousands of times, deterministically") {
  auto trace = [] {
    Scheduler s;
    std::vector<int> order;
    std::vector<std::unique_ptr<ClockThread>> threads;
    for (int i = 0; i < 200; ++i) {
      threads.push_back(s.start_thread([&, i] {
        for (int k = 0; k < 50; ++k) {
          s.sleep_for(std::chrono::milliseconds(1 + (i * 7 + k) % 5));
          order.push_back(i);
        }
      }));
    }
    REQUIRE(s.run().ok());
    return order;
  };
  const auto first = trace();
  CHECK(first.size() == 200 * 50);
  CHECK(first == trace());
}

TEST_CASE("stop() unwinds parked threads, one waiting in a join inside a destructor included") {
  struct JoinOnExit {
    std::unique_ptr<ClockThread> t;
    ~JoinOnExit() { t->join(); }
  };
  Scheduler s;
  bool sleeper_unwound = false, joiner_done = false;
  auto joiner = s.start_thread([&] {
    {
      JoinOnExit j{s.start_thread([&] {
        struct Mark {
          bool& flag;
          ~Mark() { flag = true; }
        } mark{sleeper_unwound};
        s.sleep_for(1000s);
      })};
    }  // parks in ~JoinOnExit until the sleeper ends
    joiner_done = true;
  });
  auto failing = s.start_thread([&] {
    s.sleep_for(1s);
    throw std::runtime_error("boom");
  });
  CHECK_THROWS_WITH_AS(s.run(), "boom", std::runtime_error);
  s.stop();  // the joiner resumes inside a destructor: its join gives up instead of throwing
  CHECK(sleeper_unwound);
  CHECK(joiner_done);
  s.stop();  // idempotent
}
