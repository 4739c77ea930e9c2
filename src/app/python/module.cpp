// _gossamer: the extension module under the Python package `gossamer` (gossamer/__init__.py holds
// the classes users call). It runs one real peer (runtime::run_peer, as `gossamer peer` does) on a
// thread of its own over the caller's model: the caller makes each inner step with its own module,
// data and optimizer and hands it over with step(); between two of the caller's steps the runtime
// does what a peer does between two of its own (rounds, joins, catch-up, checkpoints), then hands
// the next step back.
//
// Threading: the runtime's thread never holds the GIL except inside the caller's callbacks (the
// optimizer's step, its state, evaluation), which it calls while the caller waits in step() with the
// GIL released. Waits check for signals every 100 ms: Ctrl-C stops the peer (it leaves the run as
// `gossamer peer` does on Ctrl-C) and raises KeyboardInterrupt. Errors: a config or argument the run
// refuses is ValueError, a failed run RuntimeError, both with the runtime's message.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <torch/csrc/autograd/python_variable.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cmath>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>

#include "core/log.h"
#include "optim/method.h"
#include "runtime/peer.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/outer.h"
#include "train/worker.h"
#include "transport/secure_channel.h"

namespace py = pybind11;

namespace gossamer::python {

namespace {

using namespace std::chrono_literals;

[[noreturn]] void raise(const Status& st) {
  if (st.code() == ErrorCode::kInvalidArgument || st.code() == ErrorCode::kNotFound) throw py::value_error(st.message());
  throw std::runtime_error(st.message());
}

Nanos seconds(double s) { return std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(s)); }

// The hand-over of steps between the runtime (Worker::step on its thread) and the caller.
// granted: steps the runtime asked for; made: steps the caller handed over. The caller may make step
// `made + 1` while granted > made.
class StepGate {
 public:
  // The runtime's side: asks for step `next` and waits until the caller made it (or stopped), serving
  // the caller's requests for the state meanwhile; then `between`, while the caller still waits.
  train::StepResult runtime_step(std::int64_t next, const std::function<void()>& between, const std::function<Result<train::CheckpointState>()>& snapshot) {
    std::unique_lock lock(mu_);
    ++granted_;
    next_ = next;
    granted_at_ = std::chrono::steady_clock::now();
    cv_.notify_all();
    for (;;) {
      cv_.wait(lock, [&] { return made_ >= granted_ || cancelled_ || want_state_; });
      if (want_state_ && made_ < granted_ && !cancelled_) {
        want_state_ = false;
        lock.unlock();
        Result<Bytes> state = error(ErrorCode::kUnavailable, "the runtime keeps no state to give");
        if (snapshot) {
          auto cs = snapshot();
          state = cs.ok() ? Result<Bytes>(train::encode_checkpoint(*cs)) : Result<Bytes>(cs.status());
        }
        lock.lock();
        state_.emplace(std::move(state));
        cv_.notify_all();
        continue;
      }
      break;
    }
    if (made_ < granted_) {  // the caller stopped: no step was made
      stopped_mid_step_ = true;
      train::StepResult r;
      r.replaced = true;
      return r;
    }
    train::StepResult r = pending_;
    lock.unlock();
    between();
    return r;
  }

  // The runtime ended (or is ending): the caller waits no more.
  void end() {
    std::lock_guard lock(mu_);
    over_ = true;
    cv_.notify_all();
  }
  void cancel() {
    std::lock_guard lock(mu_);
    cancelled_ = true;
    cv_.notify_all();
  }

  // The caller's side. `wait` waits on the gate's condition, checking for signals (it returns false
  // when interrupted).
  template <typename Pred>
  bool wait(std::unique_lock<std::mutex>& lock, Pred pred) {
    while (!pred()) {
      if (cv_.wait_for(lock, 100ms, pred)) break;
      lock.unlock();
      bool interrupted = false;
      {
        py::gil_scoped_acquire gil;
        interrupted = PyErr_CheckSignals() != 0;
      }
      lock.lock();
      if (interrupted) return false;
    }
    return true;
  }
  std::mutex& mu() { return mu_; }
  bool open_step() const { return granted_ > made_; }  // (under mu)
  bool over() const { return over_; }
  std::int64_t next() const { return next_; }
  void hand_over(double loss, std::int64_t tokens, double lr) {  // (under mu, with open_step())
    pending_ = train::StepResult{};
    pending_.loss = loss;
    pending_.tokens = tokens;
    pending_.lr = lr;
    pending_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - granted_at_).count();
    ++made_;
    cv_.notify_all();
  }
  void ask_state() {  // (under mu)
    state_.reset();
    want_state_ = true;
    cv_.notify_all();
  }
  std::optional<Result<Bytes>>& state() { return state_; }
  // The caller stopped while it made a step (its code was interrupted, not a wait of ours).
  bool stopped_mid_step() const { return stopped_mid_step_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::int64_t granted_ = 0, made_ = 0, next_ = 0;
  bool over_ = false, cancelled_ = false, want_state_ = false, stopped_mid_step_ = false;
  std::chrono::steady_clock::time_point granted_at_;
  train::StepResult pending_;
  std::optional<Result<Bytes>> state_;
};

// A Python exception as a Status (on the runtime's thread, GIL held).
Status from_python(const py::error_already_set& e, const std::string& what) {
  return error(ErrorCode::kInternal, what + " raised " + e.what());
}

class Runtime {
 public:
  Runtime(const std::string& config_toml, const py::list& parameters, py::object update, py::object save_optimizer, py::object load_optimizer,
          py::object evaluate, const std::string& out, const std::string& listen, const std::vector<std::string>& join, const std::string& advertise,
          std::optional<int> link_port, bool outbound_only, const std::string& key, bool resume, int wait_for, double dead_after_s,
          double start_timeout_s, double join_timeout_s, const std::string& device, const std::string& log_level)
      : update_(std::move(update)), save_optimizer_(std::move(save_optimizer)), load_optimizer_(std::move(load_optimizer)), evaluate_(std::move(evaluate)) {
    static bool logging = false;  // (the process's logger is made once; later peers set its level)
    if (!logging) {
      if (Status st = init_logging(log_level); !st.ok()) raise(st);
      logging = true;
    } else {
      spdlog::set_level(spdlog::level::from_str(log_level));
    }
    train::RunConfig config;
    if (Status st = train::apply_toml(config, config_toml, "the outer optimizer's settings"); !st.ok()) raise(st);
    if (Status st = train::validate(config); !st.ok()) raise(st);
    if (auto outer = train::outer_config(config); !outer.ok()) raise(outer.status());
    for (const auto& w : train::config_warnings(config)) spdlog::warn("{}", w);

    external_ = std::make_shared<train::ExternalTraining>();
    for (const auto& item : parameters) {
      auto pair = item.cast<py::tuple>();
      const auto name = pair[0].cast<std::string>();
      PyObject* obj = pair[1].ptr();
      if (!THPVariable_Check(obj)) throw py::type_error("parameter " + name + " is not a torch.Tensor");
      external_->parameters.push_back({name, THPVariable_Unpack(obj)});
    }
    external_->block_pattern = config.model.block_pattern;
    external_->step = [this](std::int64_t next, const std::function<void()>& between) {
      train::StepResult r = gate_.runtime_step(next, between, external_->snapshot);
      if (gate_.stopped_mid_step()) external_->stopped_mid_step = true;
      return r;
    };
    external_->update = [this]() -> Status {
      py::gil_scoped_acquire gil;
      try {
        update_();
        return Status();
      } catch (const py::error_already_set& e) {
        return from_python(e, "the optimizer's step");
      }
    };
    external_->save_optimizer = [this]() -> Result<Bytes> {
      py::gil_scoped_acquire gil;
      try {
        const std::string b = save_optimizer_().cast<py::bytes>();
        const auto* p = reinterpret_cast<const std::byte*>(b.data());
        return Bytes(p, p + b.size());
      } catch (const py::error_already_set& e) {
        return from_python(e, "saving the optimizer's state");
      }
    };
    external_->load_optimizer = [this](ByteView bytes) -> Status {
      py::gil_scoped_acquire gil;
      try {
        load_optimizer_(py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
        return Status();
      } catch (const py::error_already_set& e) {
        return error(ErrorCode::kMalformed, std::string("the optimizer's state: ") + e.what());
      }
    };
    if (!evaluate_.is_none()) {
      external_->evaluate = [this]() -> double {
        py::gil_scoped_acquire gil;
        try {
          return evaluate_().cast<double>();
        } catch (const py::error_already_set& e) {
          spdlog::warn("evaluate raised {}", e.what());
          return std::numeric_limits<double>::quiet_NaN();
        }
      };
    }

    request_.listen = listen;
    request_.join = join;
    request_.advertise = advertise;
    if (link_port) request_.link_port = static_cast<std::uint16_t>(*link_port);
    request_.outbound_only = outbound_only;
    if (!key.empty()) {
      auto k = transport::read_run_key(key);
      if (!k.ok()) raise(k.status());
      request_.key = *k;
    } else {
      spdlog::warn("no key: links and gossip are neither authenticated nor encrypted (fine on a trusted network only)");
    }
    request_.config = config;
    request_.out_dir = out;
    request_.resume = resume;
    request_.wait_for = static_cast<std::size_t>(std::max(1, wait_for));
    request_.dead_after = seconds(dead_after_s);
    request_.start_timeout = seconds(start_timeout_s);
    request_.spec_timeout = seconds(join_timeout_s);
    if (!device.empty()) request_.device = device;
    request_.stop = &stop_;
    request_.external = external_;
  }

  ~Runtime() {
    py::gil_scoped_release release;
    stop_and_join();
  }

  void load_state(const py::bytes& state) {
    if (thread_.joinable()) throw py::value_error("load_state_dict() must come before the peer starts: construct with start=False, load, then start()");
    const std::string b = state;
    auto cs = train::decode_checkpoint(ByteView(reinterpret_cast<const std::byte*>(b.data()), b.size()), "the state given");
    if (!cs.ok()) raise(cs.status());
    request_.resume_state = std::move(*cs);
    request_.resume = false;
  }

  // Starts the peer and waits until it hands over its first step (it joined the run, caught up, and
  // the caller's parameters hold the run's state) or the run ended.
  void start() {
    if (thread_.joinable()) throw py::value_error("the peer has started already");
    thread_ = std::thread([this] {
      auto r = runtime::run_peer(request_);
      {
        std::lock_guard lock(gate_.mu());
        outcome_.emplace(std::move(r));
      }
      gate_.end();
    });
    py::gil_scoped_release release;
    std::unique_lock lock(gate_.mu());
    if (!gate_.wait(lock, [&] { return gate_.open_step() || gate_.over(); })) interrupted(lock);
    check_failed(lock);
  }

  // The caller made its step: hands it over, waits for the next. False once the run is over.
  bool step(double loss, std::int64_t tokens, double lr) {
    if (!thread_.joinable()) throw py::value_error("the peer has not started: call start() first");
    py::gil_scoped_release release;
    std::unique_lock lock(gate_.mu());
    if (!gate_.open_step()) {
      check_failed(lock);
      return false;
    }
    gate_.hand_over(loss, tokens, lr);
    if (!gate_.wait(lock, [&] { return gate_.open_step() || gate_.over(); })) interrupted(lock);
    check_failed(lock);
    return gate_.open_step();
  }

  // The whole training state between two steps, as checkpoint bytes.
  py::bytes state() {
    if (!thread_.joinable()) throw py::value_error("the peer has not started: there is no state yet");
    std::string out;
    {
      py::gil_scoped_release release;
      std::unique_lock lock(gate_.mu());
      if (!gate_.open_step()) throw py::value_error("the run is over: its state is in the out folder's checkpoint.bin");
      gate_.ask_state();
      if (!gate_.wait(lock, [&] { return gate_.state().has_value() || gate_.over(); })) interrupted(lock);
      check_failed(lock);
      if (!gate_.state()) throw std::runtime_error("the run ended before it gave its state");
      Result<Bytes> got = std::move(*gate_.state());
      gate_.state().reset();
      if (!got.ok()) raise(got.status());
      out.assign(reinterpret_cast<const char*>(got->data()), got->size());
    }
    return py::bytes(out);
  }

  void close() {
    py::gil_scoped_release release;
    stop_and_join();
  }

  bool training() {
    std::lock_guard lock(gate_.mu());
    return thread_.joinable() && gate_.open_step() && !gate_.over();
  }
  std::int64_t next_step() {
    std::lock_guard lock(gate_.mu());
    return gate_.next();
  }
  int shard() const { return external_->shard; }
  int shards() const { return external_->shards; }

  py::object outcome() {
    std::optional<runtime::PeerOutcome> out;
    {
      std::lock_guard lock(gate_.mu());
      if (!outcome_ || !outcome_->ok()) return py::none();
      out = **outcome_;
    }
    py::dict d;
    d["steps"] = out->steps;
    d["rounds"] = out->rounds;
    d["skipped_rounds"] = out->skipped_rounds;
    d["retries"] = out->retries;
    d["finished"] = out->finished;
    d["params_digest"] = out->params_digest;
    d["shared_digest"] = out->shared_digest;
    d["final_val_loss"] = out->final_val_loss ? py::cast(*out->final_val_loss) : py::none();
    d["bytes_sent"] = out->account.bytes_sent;
    d["bytes_received"] = out->account.bytes_received;
    d["compute_s"] = out->account.compute_s;
    d["blocked_s"] = out->account.blocked_s;
    return d;
  }

 private:
  void stop_and_join() {
    stop_ = true;
    gate_.cancel();
    if (thread_.joinable()) thread_.join();
  }
  // Ctrl-C while waiting: the peer leaves the run, then KeyboardInterrupt (pending) is raised.
  [[noreturn]] void interrupted(std::unique_lock<std::mutex>& lock) {
    lock.unlock();
    spdlog::warn("interrupted: leaving the run");
    stop_and_join();
    py::gil_scoped_acquire gil;
    throw py::error_already_set();
  }
  void check_failed(std::unique_lock<std::mutex>& lock) {
    if (!outcome_ || outcome_->ok()) return;
    const Status st = outcome_->status();
    lock.unlock();
    if (thread_.joinable()) thread_.join();
    raise(st);  // (C++ exceptions: pybind11 turns them into Python's once the GIL is back)
  }

  py::object update_, save_optimizer_, load_optimizer_, evaluate_;
  std::shared_ptr<train::ExternalTraining> external_;
  runtime::PeerRequest request_;
  std::atomic<bool> stop_{false};
  StepGate gate_;
  std::optional<Result<runtime::PeerOutcome>> outcome_;
  std::thread thread_;
};

}  // namespace

}  // namespace gossamer::python

PYBIND11_MODULE(_gossamer, m) {
  using gossamer::python::Runtime;
  m.doc() = "Gossamer's runtime under the Python package (use the classes of `gossamer`)";
  m.def("methods", [] { return gossamer::optim::method_names(); }, "The outer methods of the registry, by their config names");
  m.def("config_keys", [] {
    std::vector<std::string> out;
    for (const auto& k : gossamer::train::config_keys()) out.push_back(k.name);
    return out;
  }, "Every key a run config takes");
  py::class_<Runtime>(m, "Runtime")
      .def(py::init<const std::string&, const py::list&, py::object, py::object, py::object, py::object, const std::string&, const std::string&,
                    const std::vector<std::string>&, const std::string&, std::optional<int>, bool, const std::string&, bool, int, double, double, double,
                    const std::string&, const std::string&>(),
           py::arg("config"), py::arg("parameters"), py::arg("update"), py::arg("save_optimizer"), py::arg("load_optimizer"), py::arg("evaluate"),
           py::arg("out"), py::arg("listen"), py::arg("join"), py::arg("advertise"), py::arg("link_port"), py::arg("outbound_only"), py::arg("key"),
           py::arg("resume"), py::arg("wait_for"), py::arg("dead_after"), py::arg("start_timeout"), py::arg("join_timeout"), py::arg("device"),
           py::arg("log_level"))
      .def("start", &Runtime::start)
      .def("step", &Runtime::step, py::arg("loss"), py::arg("tokens"), py::arg("lr"))
      .def("state", &Runtime::state)
      .def("load_state", &Runtime::load_state)
      .def("close", &Runtime::close)
      .def_property_readonly("training", &Runtime::training)
      .def_property_readonly("next_step", &Runtime::next_step)
      .def_property_readonly("shard", &Runtime::shard)
      .def_property_readonly("shards", &Runtime::shards)
      .def_property_readonly("outcome", &Runtime::outcome);
}
