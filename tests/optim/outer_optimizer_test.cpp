#include <doctest/doctest.h>

#include <torch/torch.h>

#include <limits>

#include "optim/flat_params.h"
#include "optim/outer_optimizer.h"
#include "optim/ranks.h"

using namespace gossamer;
using namespace gossamer::optim;
using namespace std::chrono_literals;
using testing::mesh;
using testing::on_ranks;
using testing::in;

namespace {

std::vector<ParamBlock> toy(float v) {
  std::vector<ParamBlock> b;
  b.push_back({"embed", {torch::full({4}, v)}});
  for (int l = 0; l < 4; ++l) b.push_back({"block." + std::to_string(l), {torch::full({3}, v + static_cast<float>(l))}});
  b.push_back({"final", {torch::full({2}, v)}});
  return b;
}

at::Tensor toy_flat(float v) {
  std::vector<at::Tensor> ts;
  for (auto& blk : toy(v)) {
    for (auto& t : blk.tensors) ts.push_back(t);
  }
  return optim::flatten(ts);
}

OuterConfig config(const std::string& method) {
  OuterConfig c;
  c.method = *parse_method(method);
  c.diloco.inner_steps = 2;
  c.noloco.inner_steps = 2;
  c.co2.inner_steps = 2;
  c.sparseloco.inner_steps = 2;
  c.muloco.inner_steps = 2;
  c.muloco.error_feedback = true;
  c.muloco.codec.codec = quant::CodecId::kInt2;
  c.streaming.inner_steps = 4;
  c.streaming.overlap = 1;
  c.fragments.fragments = 2;
  return c;
}

}  // namespace

TEST_CASE("every method is made by name and its state saves and loads exactly") {
  for (const auto& method : outer_methods()) {
    CAPTURE(method);
    auto blocks_a = toy(1.0f), blocks_b = toy(5.0f);
    auto ga = mesh(1), gb = mesh(1);
    auto a = make_outer_optimizer(config(method), blocks_a, ga[0]);
    auto b = make_outer_optimizer(config(method), blocks_b, gb[0]);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(a->outer->name() == method);
    CHECK((a->gradient_sync != nullptr) == (method == "ddp"));
    // A few steps of "training" and outer steps.
    for (std::int64_t s = 1; s <= 8; ++s) {
      for (auto& blk : blocks_a) {
        for (auto& t : blk.tensors) t += 0.5f;
      }
      REQUIRE(a->outer->step(s, in(5s)).ok());
    }
    const Bytes state = a->outer->save();
    REQUIRE(b->outer->load(state).ok());
    CHECK((b->outer->save() == state));
    CHECK(b->outer->rounds() == a->outer->rounds());
    // Another method's state, or a truncated one, is refused.
    const std::string other = method == "diloco" ? "noloco" : "diloco";
    auto c = make_outer_optimizer(config(other), toy(0.0f), mesh(1)[0]);
    REQUIRE(c.ok());
    CHECK_FALSE(c->outer->load(state).ok());
    Bytes cut = state;
    cut.resize(cut.size() - 1);
    CHECK_FALSE(b->outer->load(cut).ok());
  }
  auto bad = parse_method("sgd");  // a method name is parsed once (optim/method.h), before anything is made
  CHECK(bad.status().code() == ErrorCode::kInvalidArgument);
  CHECK(bad.status().message().find("streaming_diloco") != std::string::npos);
  // compare's default methods are the table's rows marked for it, in the table's order.
  CHECK(default_compare_methods() == std::vector<std::string>{"ddp", "diloco", "streaming_diloco", "noloco", "co2"});
}

TEST_CASE("ddp averages gradients every step before the inner optimizer") {
  const int m = 2;
  auto groups = mesh(m);
  std::vector<std::vector<ParamBlock>> blocks = {toy(0.0f), toy(0.0f)};
  std::vector<OuterSetup> setups;
  for (int r = 0; r < m; ++r) {
    auto s = make_outer_optimizer(config("ddp"), blocks[static_cast<std::size_t>(r)], groups[static_cast<std::size_t>(r)]);
    REQUIRE(s.ok());
    setups.push_back(std::move(*s));
  }
  std::vector<std::vector<at::Tensor>> params(m);
  for (int r = 0; r < m; ++r) {
    for (auto& blk : blocks[static_cast<std::size_t>(r)]) {
      for (auto& t : blk.tensors) {
        t.mutable_grad() = torch::full(t.sizes(), static_cast<float>(2 * r + 1));  // rank 0: 1, rank 1: 3
        params[static_cast<std::size_t>(r)].push_back(t);
      }
    }
  }
  on_ranks(m, [&](int r) {
    REQUIRE(setups[static_cast<std::size_t>(r)].gradient_sync->sync_gradients(params[static_cast<std::size_t>(r)], 1, in(5s)).ok());
  });
  for (int r = 0; r < m; ++r) {
    for (const auto& p : params[static_cast<std::size_t>(r)]) CHECK(torch::equal(p.grad(), torch::full(p.sizes(), 2.0f)));
    CHECK(setups[static_cast<std::size_t>(r)].outer->rounds() == 1);
    CHECK(setups[static_cast<std::size_t>(r)].outer->comm().bytes_sent > 0);
  }
}

TEST_CASE("flatten, flatten_into and write_flat move parameters in order, in place where they can") {
  std::vector<at::Tensor> ts = {torch::randn({3, 4}), torch::randn({5}), torch::zeros({0}), torch::randn({2, 2, 2})};
  const at::Tensor flat = optim::flatten(ts);
  REQUIRE(flat.numel() == 25);
  CHECK(torch::equal(flat.slice(0, 12, 17), ts[1]));
  at::Tensor buffer = torch::empty({25});
  const void* where = buffer.data_ptr();
  optim::flatten_into(ts, buffer);
  CHECK(buffer.data_ptr() == where);  // the buffer is reused
  CHECK(torch::equal(buffer, flat));
  at::Tensor wrong = torch::empty({7});
  optim::flatten_into(ts, wrong);  // the wrong length: a new buffer
  CHECK(torch::equal(wrong, flat));
  // Non-contiguous and non-fp32 tensors take the general path and agree with the fast one.
  std::vector<at::Tensor> mixed = {ts[0].t(), ts[1].to(torch::kDouble)};
  CHECK(torch::equal(optim::flatten(mixed), torch::cat({ts[0].t().reshape({-1}), ts[1]})));
  std::vector<at::Tensor> out = {torch::empty({3, 4}), torch::empty({5}), torch::empty({0}), torch::empty({2, 2, 2})};
  const auto version = out[0].unsafeGetTensorImpl()->version_counter().current_version();
  optim::write_flat(out, flat * 2);
  for (std::size_t i = 0; i < ts.size(); ++i) CHECK(torch::equal(out[i], ts[i] * 2));
  CHECK(out[0].unsafeGetTensorImpl()->version_counter().current_version() > version);  // recorded as an in-place write
  CHECK_THROWS(optim::write_flat(out, torch::zeros({24})));
}

TEST_CASE("diloco, streaming_diloco, sparseloco and muloco evaluate their outer weights and give the model its own back") {
  for (const auto& method : outer_methods()) {
    CAPTURE(method);
    auto blocks = toy(1.0f);
    auto setup = make_outer_optimizer(config(method), blocks, mesh(1)[0]);
    REQUIRE(setup.ok());
    // Local steps with no outer step yet: the outer weights are still the starting ones (1.0 ...).
    for (auto& blk : blocks) {
      for (auto& t : blk.tensors) t.add_(0.25f);
    }
    std::vector<at::Tensor> params;
    for (auto& blk : blocks) {
      for (auto& t : blk.tensors) params.push_back(t);
    }
    const at::Tensor local = optim::flatten(params);
    const at::Tensor start = optim::flatten(params) - 0.25f;
    at::Tensor seen;
    const double v = setup->outer->evaluate_outer([&] {
      seen = optim::flatten(params);
      return 42.0;
    });
    CHECK(v == 42.0);
    const bool outer = method == "diloco" || method == "streaming_diloco" || method == "sparseloco" || method == "muloco";
    CHECK(torch::equal(seen, outer ? start : local));
    CHECK(torch::equal(optim::flatten(params), local));  // the model's own weights are back
    // ...also when the evaluation throws.
    CHECK_THROWS(setup->outer->evaluate_outer([]() -> double { throw std::runtime_error("eval failed"); }));
    CHECK(torch::equal(optim::flatten(params), local));
  }
}

namespace {

// Two ranks of `method` with their parameters on `device` and the outer state on `state_device`,
// eight steps that move the ranks' weights apart: each rank's final flat weights and saved state.
struct TwoRanks {
  std::vector<at::Tensor> weights;
  std::vector<Bytes> states;
};

TwoRanks two_ranks(const std::string& method, at::Device device, at::Device state_device) {
  OuterConfig c = config(method);
  c.diloco.state_device = c.streaming.state_device = c.noloco.state_device = c.co2.state_device = c.sparseloco.state_device = state_device;
  auto groups = mesh(2);
  std::vector<std::vector<ParamBlock>> blocks = {toy(1.0f), toy(3.0f)};
  std::vector<OuterSetup> setups;
  for (int r = 0; r < 2; ++r) {
    for (auto& blk : blocks[static_cast<std::size_t>(r)]) {
      for (auto& t : blk.tensors) t = t.to(device);
    }
    auto s = make_outer_optimizer(c, blocks[static_cast<std::size_t>(r)], groups[static_cast<std::size_t>(r)]);
    REQUIRE(s.ok());
    setups.push_back(std::move(*s));
  }
  on_ranks(2, [&](int r) {
    for (std::int64_t s = 1; s <= 8; ++s) {
      for (auto& blk : blocks[static_cast<std::size_t>(r)]) {
        for (auto& t : blk.tensors) t.add_(0.25f * static_cast<float>((r + 1) * s));
      }
      auto stepped = setups[static_cast<std::size_t>(r)].outer->step(s, in(10s));
      REQUIRE(stepped.ok());
    }
    REQUIRE(setups[static_cast<std::size_t>(r)].outer->settle(in(10s)).ok());
  });
  TwoRanks out;
  for (int r = 0; r < 2; ++r) {
    std::vector<at::Tensor> params;
    for (auto& blk : blocks[static_cast<std::size_t>(r)]) {
      for (auto& t : blk.tensors) {
        CHECK(t.device() == device);  // the outer optimizer wrote the parameters where they live
        params.push_back(t);
      }
    }
    out.weights.push_back(optim::flatten(params));
    out.states.push_back(setups[static_cast<std::size_t>(r)].outer->save());
    CHECK(setups[static_cast<std::size_t>(r)].outer->rounds() > 0);
  }
  return out;
}

}  // namespace

TEST_CASE("outer state on the training device runs the same rounds as in host memory, and its state loads either way") {
  // On a machine without a GPU the training device is the CPU; with one, the parameters are on the
  // GPU and the state is kept there or in host memory (GPU kernels may fuse multiply-adds: close,
  // not bit-identical).
  std::vector<at::Device> devices = {at::kCPU};
  if (torch::cuda::is_available()) devices.emplace_back(at::kCUDA, 0);
  for (const at::Device device : devices) {
    for (const std::string method : {"diloco", "streaming_diloco", "noloco", "co2", "sparseloco", "muloco"}) {
      CAPTURE(method);
      CAPTURE(device.str());
      const TwoRanks host = two_ranks(method, device, at::kCPU), on_device = two_ranks(method, device, device);
      for (int r = 0; r < 2; ++r) {
        if (device.is_cpu()) {
          CHECK(torch::equal(host.weights[static_cast<std::size_t>(r)], on_device.weights[static_cast<std::size_t>(r)]));
        } else {
          CHECK(torch::allclose(host.weights[static_cast<std::size_t>(r)], on_device.weights[static_cast<std::size_t>(r)], 1e-5, 1e-6));
        }
      }
      CHECK_FALSE(torch::equal(host.weights[0], toy_flat(1.0f)));  // training and rounds moved them
      // A state saved from host memory loads into an optimizer that keeps it on the device, and back.
      OuterConfig c = config(method);
      c.diloco.state_device = c.streaming.state_device = c.noloco.state_device = c.co2.state_device = c.sparseloco.state_device = device;
      auto blocks = toy(0.0f);
      for (auto& blk : blocks) {
        for (auto& t : blk.tensors) t = t.to(device);
      }
      auto fresh = make_outer_optimizer(c, blocks, mesh(1)[0]);
      REQUIRE(fresh.ok());
      REQUIRE(fresh->outer->load(host.states[0]).ok());
      const Bytes again = fresh->outer->save();
      if (device.is_cpu()) CHECK((again == host.states[0]));
      CHECK(again.size() == host.states[0].size());
    }
  }
}

TEST_CASE("catch-up: a newcomer given a member's state of an earlier round and the updates since ends bit-identical to it") {
  for (const std::string method : {"diloco", "streaming_diloco", "noloco", "co2", "sparseloco", "muloco"}) {
    CAPTURE(method);
    OuterConfig cfg = config(method);
    if (method == "noloco") cfg.noloco.outer_lr_gamma = 0.4;  // beta != gamma: both means travel and are replayed
    auto groups = mesh(2);
    std::vector<std::pair<std::int64_t, at::Tensor>> updates;  // rank 0's
    Bytes snapshot, final_state;
    at::Tensor final_params;
    constexpr std::int64_t kSnapshotStep = 4, kSteps = 12;
    on_ranks(2, [&](int r) {
      auto blocks = toy(1.0f);  // every member starts from the same model
      auto setup = make_outer_optimizer(cfg, blocks, groups[static_cast<std::size_t>(r)]);
      REQUIRE(setup.ok());
      if (r == 0) setup->outer->record_updates([&](std::int64_t step, const at::Tensor& u) { updates.emplace_back(step, u.clone()); });
      for (std::int64_t s = 1; s <= kSteps; ++s) {
        for (auto& b : blocks) {
          for (auto& t : b.tensors) t.add_(torch::linspace(0.01, 0.05, t.numel()) * static_cast<float>((r + 1) * s));  // "training"
        }
        auto done = setup->outer->step(s, in(10s));
        REQUIRE(done.ok());
        if (r == 0 && s == kSnapshotStep) {
          REQUIRE(setup->outer->settle(in(10s)).ok());
          snapshot = setup->outer->save();
        }
      }
      REQUIRE(setup->outer->settle(in(10s)).ok());
      if (r == 0) {
        final_state = setup->outer->save();
        std::vector<at::Tensor> ts;
        for (auto& b : blocks) ts.insert(ts.end(), b.tensors.begin(), b.tensors.end());
        final_params = optim::flatten(ts);
      }
    });
    REQUIRE_FALSE(updates.empty());

    auto blocks = toy(9.0f);  // a newcomer's own model, before it takes the state
    auto solo = mesh(1);
    auto newcomer = make_outer_optimizer(cfg, blocks, solo[0]);
    REQUIRE(newcomer.ok());
    REQUIRE(newcomer->outer->load(snapshot).ok());
    newcomer->outer->drop_replica_state();
    newcomer->outer->take_shared_weights();
    int replayed = 0;
    for (const auto& [step, u] : updates) {
      if (step <= kSnapshotStep) continue;
      REQUIRE(newcomer->outer->replay(step, u).ok());
      ++replayed;
    }
    CHECK(replayed >= 2);
    Bytes caught_up = newcomer->outer->save();
    if (method == "sparseloco" || method == "muloco") {
      // The accumulator (MuLoCo: the error residual) is the donor's own and stays behind: the donor's state without it.
      auto donor_blocks = toy(0.0f);
      auto donor = make_outer_optimizer(cfg, donor_blocks, mesh(1)[0]);
      REQUIRE(donor.ok());
      REQUIRE(donor->outer->load(final_state).ok());
      donor->outer->drop_replica_state();
      CHECK((caught_up == donor->outer->save()));
    } else {
      CHECK((caught_up == final_state));
    }
    std::vector<at::Tensor> ts;
    for (auto& b : blocks) ts.insert(ts.end(), b.tensors.begin(), b.tensors.end());
    if (method != "streaming_diloco") CHECK(torch::equal(optim::flatten(ts), final_params));  // the model holds the shared weights

    // Updates are untrusted: another size, non-finite values or a step that is no round change nothing.
    const Bytes before = newcomer->outer->save();
    const auto& [step, u] = updates.back();
    CHECK(newcomer->outer->replay(step + 2 * 4, u.slice(0, 1)).code() == ErrorCode::kMalformed);
    at::Tensor nan = u.clone();
    nan[0] = std::numeric_limits<float>::quiet_NaN();
    CHECK(newcomer->outer->replay(step + 2 * 4, nan).code() == ErrorCode::kMalformed);
    CHECK(newcomer->outer->replay(step + 1, u).code() == ErrorCode::kMalformed);
    if (method == "co2") {
      // A gap (the round before has no update: an average lost, or a round skipped) is not guessed
      // at: a newer snapshot is needed.
      CHECK(newcomer->outer->replay(step + 2 * 4, u).code() == ErrorCode::kDataLoss);
    }
    CHECK((newcomer->outer->save() == before));
  }
}
