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
