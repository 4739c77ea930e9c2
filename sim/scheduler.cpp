#include "sim/scheduler.h"

#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/AutogradState.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/version.h>

#include "core/check.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define GOSSAMER_FIBER_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define GOSSAMER_FIBER_TSAN 1
#endif

namespace gossamer::sim {

namespace {

constexpr std::size_t kStackBytes = std::size_t{8} << 20;  // reserved, committed as touched
constexpr std::size_t kGuardBytes = 64 << 10;               // unmapped below the stack: overflow faults

// A stack for one fiber: mapped lazily, with a guard region at its low end.
class FiberStack {
 public:
  FiberStack() {
    void* p = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    GOSSAMER_CHECK(p != MAP_FAILED, "simulator: cannot map a stack for a simulated thread");
    GOSSAMER_CHECK(mprotect(p, kGuardBytes, PROT_NONE) == 0, "simulator: cannot protect a stack guard");
    base_ = static_cast<std::byte*>(p);
  }
  ~FiberStack() { munmap(base_, kStackBytes + kGuardBytes); }
  FiberStack(const FiberStack&) = delete;
  FiberStack& operator=(const FiberStack&) = delete;
  void* bottom() const { return base_ + kGuardBytes; }
  std::size_t size() const { return kStackBytes; }

 private:
  std::byte* base_ = nullptr;
};

// The part of LibTorch's thread-local state that a training thread changes: grad, inference and
// forward-grad modes, and the dispatch keys that guards (no-grad, below-autograd) include or exclude.
// Two plain values, captured and restored at every switch; the rest of at::ThreadLocalState
// (profiler callbacks, debug info, Python modes) is not used by simulated threads, and capturing it
// whole cost more than the messages that made the switch.
struct TorchTls {
  c10::AutogradState autograd;
  c10::impl::LocalDispatchKeySet keys;
  static TorchTls capture() { return {c10::AutogradState::get_tls_state(), c10::impl::tls_local_dispatch_key_set()}; }
  void restore() const {
    c10::AutogradState::set_tls_state(autograd);
    c10::impl::_force_tls_local_dispatch_key_set(keys);
  }
};

// One execution context: a simulated thread (a fiber with its own stack) or the thread that called
// run() (no stack of ours). Each keeps LibTorch's thread-local state (grad mode, dispatch keys) across
// switches, since every fiber runs on the same OS thread.
struct Context {
  ucontext_t uc{};
  std::optional<TorchTls> torch_tls;
  const void* stack_bottom = nullptr;  // for the sanitizers
  std::size_t stack_size = 0;
#if defined(GOSSAMER_FIBER_TSAN)
  void* tsan_fiber = nullptr;
#endif
};

struct Actor {
  Context ctx;
  std::unique_ptr<FiberStack> stack;
  std::function<void()> body;
  Scheduler::Impl* scheduler = nullptr;
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

thread_local Actor* t_current = nullptr;  // the actor running on this thread, if any

}  // namespace

struct Scheduler::Impl {
  Nanos now{0};
  std::uint64_t seq = 0;
  // A binary heap (std::push_heap/pop_heap with Later): the earliest event is moved out, never copied
  // (a delivery's callback carries its payload).
  std::vector<Event> events;
  void push(Event e) {
    events.push_back(std::move(e));
    std::push_heap(events.begin(), events.end(), Later{});
  }
  std::deque<Actor*> ready;
  std::vector<std::unique_ptr<Actor>> actors;
  std::size_t finished = 0;
  Context main;                       // the thread in run() (or the destructor)
  // What a new simulated thread starts with, as a new OS thread would: grad mode on, no guards.
  TorchTls fresh_tls{
#if TORCH_VERSION_MAJOR >= 2
      c10::AutogradState(/*grad_mode=*/true, /*inference_mode=*/false, /*fw_grad_mode=*/true, /*multithreading_enabled=*/true),
#else
      c10::AutogradState(/*grad_mode=*/true, /*inference_mode=*/false, /*fw_grad_mode=*/true),
#endif
      c10::impl::LocalDispatchKeySet(c10::impl::PODLocalDispatchKeySet{})};  // zero: the defaults, as a new thread has
  bool stopping = false;
  std::exception_ptr failure;
  std::vector<Actor*> spent;  // finished actors whose stacks go once control has left them

  // Frees the stacks of finished actors (never the one running: a finished actor only hands off).
  // The Actor stays: joins and stale wake-ups still look at it.
  void reclaim() {
    for (Actor* a : spent) {
#if defined(GOSSAMER_FIBER_TSAN)
      if (a->ctx.tsan_fiber != nullptr) {
        __tsan_destroy_fiber(a->ctx.tsan_fiber);
        a->ctx.tsan_fiber = nullptr;
      }
#endif
      a->stack.reset();
    }
    spent.clear();
  }

  void make_ready(Actor* a) {
    a->parked = false;
    ++a->wait_token;
    ready.push_back(a);
  }

  // The scheduling loop, run by whichever context holds control (one at a time): the next actor that
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
      std::pop_heap(events.begin(), events.end(), Later{});
      Event e = std::move(events.back());
      events.pop_back();
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

  // Switches from the running context to `to` (nullptr: the thread in run()); returns when something
  // switches back. A finished actor's switch never returns.
  void switch_to(Actor* from, Actor* to) {
    Context& a = from != nullptr ? from->ctx : main;
    Context& b = to != nullptr ? to->ctx : main;
    a.torch_tls = TorchTls::capture();  // this context's LibTorch thread-local state
    t_current = to;
#if defined(GOSSAMER_FIBER_ASAN)
    void* fake_stack = nullptr;
    __sanitizer_start_switch_fiber(from != nullptr && from->finished ? nullptr : &fake_stack, b.stack_bottom, b.stack_size);
#endif
#if defined(GOSSAMER_FIBER_TSAN)
    if (a.tsan_fiber == nullptr) a.tsan_fiber = __tsan_get_current_fiber();  // the thread in run(), first time
    __tsan_switch_to_fiber(b.tsan_fiber, 0);
#endif
    GOSSAMER_CHECK(swapcontext(&a.uc, &b.uc) == 0, "simulator: swapcontext failed");
    // Back in `from`.
#if defined(GOSSAMER_FIBER_ASAN)
    const void* prev_bottom = nullptr;
    std::size_t prev_size = 0;
    __sanitizer_finish_switch_fiber(fake_stack, &prev_bottom, &prev_size);
    if (main.stack_bottom == nullptr && from == nullptr) {
      main.stack_bottom = prev_bottom;
      main.stack_size = prev_size;
    }
#endif
    t_current = from;
    if (a.torch_tls) a.torch_tls->restore();
    reclaim();
  }

  // Hands control from `self` (parking, or finished) straight to the next actor, or back to run()
  // when nothing can run; when `self` is next it simply goes on.
  void hand_off(Actor* self) {
    Actor* n = stopping ? nullptr : next();
    if (n == self) return;
    switch_to(self, n);
  }

  // Called by the running actor: give up control until woken.
  // Once stopping, a wait never parks: it throws at once, so unwinding never hands control back.
  void park(Actor* a) {
    if (stopping) throw SimulationStopped();
    a->parked = true;
    hand_off(a);
    if (stopping) throw SimulationStopped();
  }

  void schedule_wake(Actor* a, Nanos t) { push(Event{t, seq++, a, a->wait_token + 1, {}}); }
  // wait_token + 1 is the token the actor will hold while parked (make_ready bumps it on wake-up).

  // A simulated thread's first frame: runs the body, then hands control on for good.
  static void entry() {
    Actor* a = t_current;
    Impl& st = *a->scheduler;
#if defined(GOSSAMER_FIBER_ASAN)
    const void* prev_bottom = nullptr;
    std::size_t prev_size = 0;
    __sanitizer_finish_switch_fiber(nullptr, &prev_bottom, &prev_size);
    if (st.main.stack_bottom == nullptr) {
      st.main.stack_bottom = prev_bottom;
      st.main.stack_size = prev_size;
    }
#endif
    st.fresh_tls.restore();
    st.reclaim();
    if (!st.stopping) {
      try {
        a->body();
      } catch (const SimulationStopped&) {
      } catch (...) {
        if (!st.failure) st.failure = std::current_exception();
      }
    }
    a->body = nullptr;
    {
      std::lock_guard<std::mutex> lock(a->done_mu);
      a->done->notify_all();  // joiners become ready before control moves on
      a->finished = true;
    }
    ++st.finished;
    st.spent.push_back(a);
    st.hand_off(a);
    GOSSAMER_CHECK(false, "simulator: a finished simulated thread was resumed");
  }
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
    if (scheduler_.in_actor()) {  // wait in virtual time for the actor to finish
      std::unique_lock<std::mutex> lock(actor_->done_mu);
      try {
        actor_->done->wait(lock, Deadline::never(), [&] { return actor_->finished; });
      } catch (const SimulationStopped&) {
        // Joins run in destructors: when the simulation stops, give up on the actor instead of
        // throwing out of one (it is unwound on its own).
      }
    }
    joined_ = true;  // its stack goes with the Scheduler
  }
  ~SimThread() override = default;  // the Scheduler joins what is left

 private:
  Scheduler& scheduler_;
  Actor* actor_;
  bool joined_ = false;
};

}  // namespace

Scheduler::Scheduler() : impl_(std::make_unique<Impl>()) {}

void Scheduler::stop() {
  auto& s = *impl_;
  GOSSAMER_CHECK(t_current == nullptr, "Scheduler::stop called from a simulated thread");
  s.stopping = true;
  // Each unfinished actor resumes, its wait throws SimulationStopped, and since no wait parks any
  // more it runs to its end and switches back.
  for (auto& a : s.actors) {
    if (!a->finished) s.switch_to(nullptr, a.get());
  }
}

Scheduler::~Scheduler() {
  GOSSAMER_CHECK(t_current == nullptr, "a Scheduler was destroyed from one of its simulated threads");
  stop();
#if defined(GOSSAMER_FIBER_TSAN)
  auto& s = *impl_;
  for (auto& a : s.actors) {
    if (a->ctx.tsan_fiber != nullptr) __tsan_destroy_fiber(a->ctx.tsan_fiber);
  }
#endif
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
  a->body = std::move(body);
  a->scheduler = &s;
  a->stack = std::make_unique<FiberStack>();
  a->ctx.stack_bottom = a->stack->bottom();
  a->ctx.stack_size = a->stack->size();
  GOSSAMER_CHECK(getcontext(&a->ctx.uc) == 0, "simulator: getcontext failed");
  a->ctx.uc.uc_stack.ss_sp = a->stack->bottom();
  a->ctx.uc.uc_stack.ss_size = a->stack->size();
  a->ctx.uc.uc_link = nullptr;  // entry() never returns
  makecontext(&a->ctx.uc, &Impl::entry, 0);
#if defined(GOSSAMER_FIBER_TSAN)
  a->ctx.tsan_fiber = __tsan_create_fiber(0);
#endif
  a->parked = true;
  s.make_ready(a);
  s.actors.push_back(std::move(actor));
  return std::make_unique<SimThread>(*this, a);
}

void Scheduler::call_at(Nanos t, std::function<void()> fn) {
  auto& s = *impl_;
  s.push(Event{std::max(t, s.now), s.seq++, nullptr, 0, std::move(fn)});
}

Status Scheduler::run() {
  auto& s = *impl_;
  GOSSAMER_CHECK(t_current == nullptr, "Scheduler::run called from a simulated thread");
  // Control passes from actor to actor; this thread only starts the first and gets control back at the end.
  if (Actor* first = s.next(); first != nullptr) s.switch_to(nullptr, first);
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
