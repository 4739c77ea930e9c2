#include <doctest/doctest.h>

#include <torch/torch.h>

#include <filesystem>
#include <unistd.h>

#include "optim/gloo_sync.h"
#include "optim/ranks.h"

using namespace gossamer;
using namespace gossamer::optim;
using namespace std::chrono_literals;

TEST_CASE("gloo ddp averages every gradient exactly and agrees with our all-reduce" * doctest::skip(!gossamer::optim::gloo_available())) {
  const std::filesystem::path store = std::filesystem::temp_directory_path() / ("gossamer-gloo-" + std::to_string(::getpid()));
  std::filesystem::remove(store);
  constexpr int m = 3;
  std::vector<std::vector<at::Tensor>> params(m), ours(m);
  std::vector<int> ok(m, 0);
  auto groups = testing::mesh(m);
  testing::on_ranks(m, [&](int r) {
    GlooOptions o;
    o.rank = r;
    o.size = m;
    o.store_file = store.string();
    o.timeout = 30000ms;
    auto ddp = make_gloo_data_parallel(o);
    REQUIRE(ddp.ok());
    for (int i = 0; i < 2; ++i) {
      at::Tensor p = torch::zeros({i == 0 ? 5 : 7, 3}).requires_grad_(true);
      // Integer-valued gradients: the sum is exact, and so is the mean after division by 3 of multiples of 3.
      p.mutable_grad() = torch::arange(p.numel(), torch::kFloat).view(p.sizes()) * 3.0 * (r + 1);
      params[static_cast<std::size_t>(r)].push_back(p);
    }
    at::Tensor flat = torch::cat({params[static_cast<std::size_t>(r)][0].grad().reshape({-1}), params[static_cast<std::size_t>(r)][1].grad().reshape({-1})});
    quant::EncodeOptions fp32;
    REQUIRE(allreduce_mean(groups[static_cast<std::size_t>(r)], flat, fp32, 7, testing::in(30s)).ok());
    ours[static_cast<std::size_t>(r)] = {flat};
    ok[static_cast<std::size_t>(r)] = ddp->gradient_sync->sync_gradients(params[static_cast<std::size_t>(r)], 1, testing::in(30s)).ok();
    CHECK(ddp->outer->rounds() == 1);
    CHECK(ddp->outer->comm().bytes_sent > 0);
  });
  std::filesystem::remove(store);
  for (int r = 0; r < m; ++r) {
    CHECK(ok[static_cast<std::size_t>(r)] == 1);
    const auto& p = params[static_cast<std::size_t>(r)];
    CHECK(torch::equal(p[0].grad(), torch::arange(15, torch::kFloat).view({5, 3}) * 6.0));  // 3 * (1+2+3) / 3
    CHECK(torch::equal(p[1].grad(), torch::arange(21, torch::kFloat).view({7, 3}) * 6.0));
    CHECK(torch::equal(torch::cat({p[0].grad().reshape({-1}), p[1].grad().reshape({-1})}), ours[static_cast<std::size_t>(r)][0]));
  }
}

TEST_CASE("gloo rendezvous that no peer joins fails with a Status, not an exception" * doctest::skip(!gossamer::optim::gloo_available())) {
  const std::filesystem::path store = std::filesystem::temp_directory_path() / ("gossamer-gloo-alone-" + std::to_string(::getpid()));
  std::filesystem::remove(store);
  GlooOptions o;
  o.rank = 0;
  o.size = 2;
  o.store_file = store.string();
  o.timeout = 500ms;
  auto ddp = make_gloo_data_parallel(o);
  CHECK_FALSE(ddp.ok());
  CHECK(ddp.status().code() == ErrorCode::kUnavailable);
  std::filesystem::remove(store);
}

TEST_CASE("ddp.engine = nccl in a build without NCCL fails at once and says what to use instead" * doctest::skip(gossamer::optim::nccl_available())) {
  GlooOptions o;
  o.timeout = 500ms;
  auto ddp = make_nccl_data_parallel(o);
  REQUIRE_FALSE(ddp.ok());
  CHECK(ddp.status().code() == ErrorCode::kUnavailable);
  CHECK(ddp.status().message().find("ddp.engine = links or gloo") != std::string::npos);
  OuterConfig c;
  c.method = Method::kDdp;
  c.ddp_engine = OuterConfig::DdpEngine::kNccl;
  auto outer = make_outer_optimizer(c, {}, Group{});
  REQUIRE_FALSE(outer.ok());
  CHECK(outer.status().code() == ErrorCode::kUnavailable);
}

// Two ranks on two GPUs (NCCL refuses two ranks on one): the same exact mean as Gloo's case above.
TEST_CASE("ddp on NCCL averages every gradient exactly on two GPUs (CUDA)" * doctest::skip(!gossamer::optim::nccl_available())) {
  if (torch::cuda::device_count() < 2) {
    MESSAGE("ddp on NCCL: " << torch::cuda::device_count() << " GPU(s) here; it needs two, one per rank");
    return;
  }
  const std::filesystem::path store = std::filesystem::temp_directory_path() / ("gossamer-nccl-" + std::to_string(::getpid()));
  std::filesystem::remove(store);
  constexpr int m = 2;
  std::vector<at::Tensor> grads(m);
  std::vector<int> ok(m, 0);
  testing::on_ranks(m, [&](int r) {
    GlooOptions o;
    o.rank = r;
    o.size = m;
    o.store_file = store.string();
    o.timeout = 60000ms;
    auto ddp = make_nccl_data_parallel(o);
    REQUIRE(ddp.ok());
    const auto device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(r));
    at::Tensor p = torch::zeros({5, 3}, torch::TensorOptions().device(device)).requires_grad_(true);
    p.mutable_grad() = (torch::arange(15, torch::kFloat).view({5, 3}) * 2.0 * (r + 1)).to(device);
    std::vector<at::Tensor> params{p};
    ok[static_cast<std::size_t>(r)] = ddp->gradient_sync->sync_gradients(params, 1, testing::in(60s)).ok();
    grads[static_cast<std::size_t>(r)] = p.grad().cpu();
  });
  std::filesystem::remove(store);
  for (int r = 0; r < m; ++r) {
    CHECK(ok[static_cast<std::size_t>(r)] == 1);
    CHECK(torch::equal(grads[static_cast<std::size_t>(r)], torch::arange(15, torch::kFloat).view({5, 3}) * 3.0));  // 2 (1+2) / 2
  }
}
