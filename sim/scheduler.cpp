#include "sim/scheduler.h"

#include <algorithm>
#include <deque>
#include <exception>
#include <mutex>
#include <queue>
#include <semaphore>
#include <string>
#include <thread>
#include <vector>

#include "core/check.h"

namespace gossamer::sim {

namespace {

struct Actor {
  std::binary_semaphore resume{0};  // posted by the scheduler to let this actor run
  std::thread thread;
  bool finished = false;
  std::uint64_t wait_token = 0;     // bumped each time the actor parks; stale wake-ups carry an old one
  bool parked = false;
  std::mutex done_mu;
  std::unique_ptr<Signal> done;     // notified when the actor finishes (join waits on it)
};

struct Event {
  Nanos time;
  std::uint64_t seq;
  Actor* wake = nullptr;        // wake this actor (if it is still parked with `token`)...
  std::uint64_t token = 0;
  std::function<void()> call;   // ...or run this callback
};

struct Later {
  bool operator()(const Event& a, const Event& b) const { return a.time != b.time ? a.time > b.time : a.seq > b.seq; }
};

thread_local Actor* t_current = nullptr;

}  // namespace

struct Scheduler::Impl {
  Nanos now{0};
  std::uint64_t seq = 0;
  std::priority_queue<Event, std::vector<Event>, Later> events;
  std::deque<Actor*> ready;
  std::vector<std::unique_ptr<Actor>> actors;
  std::size_t finished = 0;
  std::binary_semaphore idle{0};  // posted to run()'s thread when nothing can run any more
  bool stopping = false;
  std::exception_ptr failure;

  void make_ready(Actor* a) {
    a->parked = false;
    ++a->wait_token;
    ready.push_back(a);
  }

  // The scheduling loop, run by whichever thread holds control (one at a time): the next actor that
  // may run, advancing virtual time through pending events as needed; nullptr when nothing can.
  Actor* next() {
    for (;;) {
      if (failure) return nullptr;
      if (!ready.empty()) {
        Actor* a = ready.front();
        ready.pop_front();
        return a;
      }
      if (events.empty() || finished == actors.size()) return nullptr;  // what is left cannot affect an actor
      Event e = events.top();
      events.pop();
      if (e.wake != nullptr) {
        if (!e.wake->parked || e.wake->wait_token != e.token) continue;  // stale: that wait already ended; time stays
        now = std::max(now, e.time);
        make_ready(e.wake);
      } else {
        now = std::max(now, e.time);
        e.call();
      }
    }
  }

  // Hands control from `self` (parking, or finished) straight to the next actor, without a round
  // trip through run()'s thread; when `self` is next it simply goes on.
  void hand_off(Actor* self) {
    Actor* n = stopping ? nullptr : next();
    if (n == self) return;
    if (n != nullptr) {
      n->resume.release();
    } else {
      idle.release();
    }
    if (!self->finished) self->resume.acquire();
  }

  // Called on the actor's own thread: give up control until woken.
  void park(Actor* a) {
    a->parked = true;
    hand_off(a);
    if (stopping) throw SimulationStopped();
  }

  void schedule_wake(Actor* a, Nanos t) { events.push(Event{t, seq++, a, a->wait_token + 1, {}}); }
  // wait_token + 1 is the token the actor will hold while parked (make_ready bumps it on wake-up).
};

namespace {

class SimSignal final : public Signal {
 public:
  explicit SimSignal(Scheduler::Impl& s) : s_(s) {}
  bool wait(std::unique_lock<std::mutex>& lock, Deadline deadline, const std::function<bool()>& ready) override {
    Actor* a = t_current;
    GOSSAMER_CHECK(a != nullptr, "a simulated Signal was waited on outside a simulated thread");
    while (!ready()) {
      if (!deadline.is_never() && s_.now >= deadline.time()) return false;
      waiters_.push_back({a, a->wait_token + 1});
      if (!deadline.is_never()) s_.schedule_wake(a, deadline.time());
      ++a->wait_token;  // the token of this wait
      lock.unlock();
      try {
        s_.park(a);
      } catch (...) {
        lock.lock();
        throw;
      }
      lock.lock();
    }
    return true;
  }
  void notify_all() override {
    for (auto [a, token] : waiters_) {
      if (a->parked && a->wait_token == token) s_.make_ready(a);
    }
    waiters_.clear();
  }

 private:
  Scheduler::Impl& s_;
  std::vector<std::pair<Actor*, std::uint64_t>> waiters_;
};

class SimThread final : public ClockThread {
 public:
  SimThread(Scheduler& scheduler, Actor* a) : scheduler_(scheduler), actor_(a) {}
  void join() override {
    if (joined_) return;
    if (scheduler_.in_actor()) {  // wait in virtual time for the actor to finish, then reap its OS thread
      std::unique_lock<std::mutex> lock(actor_->done_mu);
      actor_->done->wait(lock, Deadline::never(), [&] { return actor_->finished; });
    }
    if (actor_->thread.joinable()) actor_->thread.join();
    joined_ = true;
  }
  ~SimThread() override = default;  // the Scheduler joins what is left

 private:
  Scheduler& scheduler_;
  Actor* actor_;
  bool joined_ = false;
};

}  // namespace

Scheduler::Scheduler() : impl_(std::make_unique<Impl>()) {}

Scheduler::~Scheduler() {
  auto& s = *impl_;
  s.stopping = true;
  for (auto& a : s.actors) {
    if (!a->finished && a->thread.joinable()) {
      a->resume.release();  // unwinds it with SimulationStopped; it posts `idle` as it finishes
      s.idle.acquire();
    }
  }
  for (auto& a : s.actors) {
    if (a->thread.joinable()) a->thread.join();
  }
}

Nanos Scheduler::now() const { return impl_->now; }
bool Scheduler::in_actor() const { return t_current != nullptr; }

void Scheduler::sleep_until(Nanos t) {
  Actor* a = t_current;
  GOSSAMER_CHECK(a != nullptr, "Scheduler::sleep_until called outside a simulated thread");
  auto& s = *impl_;
  if (t < s.now) t = s.now;
  s.schedule_wake(a, t);
  ++a->wait_token;
  s.park(a);
}

std::unique_ptr<Signal> Scheduler::make_signal() { return std::make_unique<SimSignal>(*impl_); }

std::unique_ptr<ClockThread> Scheduler::start_thread(std::function<void()> body) {
  auto& s = *impl_;
  auto actor = std::make_unique<Actor>();
  Actor* a = actor.get();
  a->done = make_signal();
  a->thread = std::thread([this, a, body = std::move(body)] {
    auto& st = *impl_;
    a->resume.acquire();
    t_current = a;
    if (!st.stopping) {
      try {
        body();
      } catch (const SimulationStopped&) {
      } catch (...) {
        if (!st.failure) st.failure = std::current_exception();
      }
    }
    {
      std::lock_guard<std::mutex> lock(a->done_mu);
      a->done->notify_all();  // joiners become ready before control moves on
      a->finished = true;
    }
    t_current = nullptr;
    ++st.finished;
    st.hand_off(a);
  });
  a->parked = true;
  s.make_ready(a);
  s.actors.push_back(std::move(actor));
  return std::make_unique<SimThread>(*this, a);
}

void Scheduler::call_at(Nanos t, std::function<void()> fn) {
  auto& s = *impl_;
  s.events.push(Event{std::max(t, s.now), s.seq++, nullptr, 0, std::move(fn)});
}

Status Scheduler::run() {
  auto& s = *impl_;
  GOSSAMER_CHECK(t_current == nullptr, "Scheduler::run called from a simulated thread");
  // Control passes from actor to actor; this thread only starts the first and waits for the end.
  if (Actor* first = s.next(); first != nullptr) {
    first->resume.release();
    s.idle.acquire();
  }
  if (s.failure) std::rethrow_exception(s.failure);
  std::size_t waiting = 0;
  for (const auto& a : s.actors) waiting += a->finished ? 0 : 1;
  if (waiting > 0) {
    return error(ErrorCode::kAborted, "simulation deadlock: " + std::to_string(waiting) +
                                          " simulated threads wait with nothing left that could wake them");
  }
  return Status();
}

}  // namespace gossamer::sim
