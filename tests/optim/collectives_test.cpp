// Collectives with in-process ranks (threads) over in-memory links.
#include <doctest/doctest.h>

#include <torch/torch.h>

#include <cmath>
#include <optional>
#include <thread>

#include "optim/collectives.h"
#include "quant/codec.h"
#include "optim/ranks.h"
#include "transport/memory_link.h"

using namespace gossamer;
using namespace gossamer::optim;
using namespace std::chrono_literals;
using testing::mesh;
using testing::on_ranks;
using testing::codec;
using testing::in;

TEST_CASE("the mean over 1..8 ranks is exact on integer-valued tensors, whole chunks or segmented") {
  for (int m = 1; m <= 8; ++m) {
    for (std::int64_t n : {1, 7, 1000}) {
     for (std::int64_t segment : {kAllreduceSegmentValues, std::int64_t{1}, std::int64_t{37}}) {
      auto groups = mesh(m);
      std::vector<at::Tensor> t(static_cast<std::size_t>(m));
      // Rank r holds i*m + 2r: the mean i*m + (m - 1) is an integer.
      for (int r = 0; r < m; ++r) t[static_cast<std::size_t>(r)] = torch::arange(n, torch::kFloat) * m + 2 * r;
      const at::Tensor expected = torch::arange(n, torch::kFloat) * m + (m - 1);
      std::vector<Status> st(static_cast<std::size_t>(m));
      on_ranks(m, [&](int r) {
        st[static_cast<std::size_t>(r)] = allreduce_mean(groups[static_cast<std::size_t>(r)], t[static_cast<std::size_t>(r)],
                                                         codec(quant::CodecId::kFp32), 1, in(10s), nullptr, segment);
      });
      for (int r = 0; r < m; ++r) {
        CAPTURE(m);
        CAPTURE(n);
        CAPTURE(segment);
        REQUIRE(st[static_cast<std::size_t>(r)].ok());
        CHECK(torch::equal(t[static_cast<std::size_t>(r)], expected));
      }
     }
    }
  }
}

TEST_CASE("quantized all-reduce: bit-identical on every rank and within the codec's budget, whole chunks or segmented") {
  const int m = 4;
  for (std::int64_t segment : {kAllreduceSegmentValues, std::int64_t{300}}) {
    CAPTURE(segment);
    auto groups = mesh(m);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
    std::vector<at::Tensor> t(m);
    for (auto& x : t) x = torch::randn({3, 1000}, gen);
    const at::Tensor exact = (t[0] + t[1] + t[2] + t[3]) / 4;
    on_ranks(m, [&](int r) {
      REQUIRE(allreduce_mean(groups[static_cast<std::size_t>(r)], t[static_cast<std::size_t>(r)], codec(quant::CodecId::kFp4E2M1), 2, in(10s),
                             nullptr, segment)
                  .ok());
    });
    for (int r = 1; r < m; ++r) CHECK(torch::equal(t[0], t[static_cast<std::size_t>(r)]));
    // Two quantizations (contributions, then the mean) of fp4 E2M1: the mean of four independent
    // errors shrinks the first, the second adds its own; 0.14 is the single-pass budget (docs/quant.md).
    const double rel = ((t[0] - exact).pow(2).mean().sqrt() / exact.pow(2).mean().sqrt()).item<double>();
    MESSAGE("fp4 all-reduce relative RMSE " << rel);
    CHECK(rel < 0.20);
  }
}

TEST_CASE("bytes on the wire are 2(M-1)/M x n x bytes per value, headers within 1%") {
  const int m = 4;
  const std::int64_t n = 1 << 20;
  for (auto [id, segment] : {std::pair{quant::CodecId::kFp32, kAllreduceSegmentValues}, std::pair{quant::CodecId::kInt8, kAllreduceSegmentValues},
                             std::pair{quant::CodecId::kFp32, std::int64_t{1} << 14}}) {
    CAPTURE(segment);
    auto groups = mesh(m);
    std::vector<at::Tensor> t(m);
    for (int r = 0; r < m; ++r) t[static_cast<std::size_t>(r)] = torch::full({n}, static_cast<float>(r));
    std::vector<CommStats> stats(m);
    on_ranks(m, [&](int r) {
      REQUIRE(allreduce_mean(groups[static_cast<std::size_t>(r)], t[static_cast<std::size_t>(r)], codec(id), 3, in(10s),
                             &stats[static_cast<std::size_t>(r)], segment)
                  .ok());
    });
    const double bits = quant::bits_per_value(codec(id));
    const double expected = 2.0 * (m - 1) / m * static_cast<double>(n) * bits / 8.0;
    for (const auto& s : stats) {
      CAPTURE(static_cast<int>(id));
      CHECK(static_cast<double>(s.bytes_sent) == doctest::Approx(expected).epsilon(0.01));
      CHECK(static_cast<double>(s.bytes_sent) >= expected);
      CHECK(s.bytes_received == s.bytes_sent);
    }
  }
}

TEST_CASE("the fp32 mean is summed in rank order then divided, bit for bit, with many segments in flight") {
  // Random values (no integer shortcut): every rank must hold exactly ((x0 + x1) + x2 + ...) / m.
  for (int m : {2, 3, 5}) {
    for (std::int64_t segment : {kAllreduceSegmentValues, std::int64_t{37}}) {
      CAPTURE(m);
      CAPTURE(segment);
      const std::int64_t n = 4099;
      auto groups = mesh(m);
      std::vector<at::Tensor> t(static_cast<std::size_t>(m));
      for (int r = 0; r < m; ++r) t[static_cast<std::size_t>(r)] = torch::randn({n}) * (r + 1);
      at::Tensor expected = t[0].clone();
      for (int r = 1; r < m; ++r) expected.add_(t[static_cast<std::size_t>(r)]);
      expected.div_(static_cast<float>(m));
      std::vector<Status> st(static_cast<std::size_t>(m));
      on_ranks(m, [&](int r) {
        st[static_cast<std::size_t>(r)] = allreduce_mean(groups[static_cast<std::size_t>(r)], t[static_cast<std::size_t>(r)],
                                                         codec(quant::CodecId::kFp32), 1, in(10s), nullptr, segment);
      });
      for (int r = 0; r < m; ++r) {
        REQUIRE(st[static_cast<std::size_t>(r)].ok());
        CHECK(torch::equal(t[static_cast<std::size_t>(r)], expected));
      }
    }
  }
}

TEST_CASE("values too large to average give every rank an error, not an exception") {
  const int m = 2;
  auto groups = mesh(m);
  std::vector<at::Tensor> t = {torch::full({100}, 3.0e38f), torch::full({100}, 3.0e38f)};
  std::vector<Status> st(m);
  on_ranks(m, [&](int r) {
    st[static_cast<std::size_t>(r)] = allreduce_mean(groups[static_cast<std::size_t>(r)], t[static_cast<std::size_t>(r)],
                                                     codec(quant::CodecId::kFp32), 1, in(5s));
  });
  for (int r = 0; r < m; ++r) {
    CHECK(st[static_cast<std::size_t>(r)].code() == ErrorCode::kOutOfRange);
    CHECK(st[static_cast<std::size_t>(r)].message().find("overflowed") != std::string::npos);
  }
}

TEST_CASE("a lost peer fails the all-reduce and leaves the tensor untouched") {
  const int m = 3;
  auto groups = mesh(m);
  groups[0].peers[2]->close();  // rank 2 is gone for rank 0
  at::Tensor x = torch::ones({10});
  const at::Tensor before = x.clone();
  Status st = allreduce_mean(groups[0], x, codec(quant::CodecId::kFp32), 4, in(1s));
  CHECK(st.code() == ErrorCode::kPeerLost);
  CHECK(st.message().find("rank 2") != std::string::npos);
  CHECK(torch::equal(x, before));
  // A silent peer: the deadline ends it.
  auto g2 = mesh(2);
  Stopwatch w(real_clock());
  CHECK(allreduce_mean(g2[0], x, codec(quant::CodecId::kFp32), 5, in(200ms)).code() == ErrorCode::kTimeout);
  CHECK(w.elapsed() < 3s);  // ends at its deadline, nothing hangs (3 s: room for a stalled host)
  CHECK(torch::equal(x, before));
}

TEST_CASE("pair exchange swaps tensors through the codec") {
  auto [ab, ba] = transport::make_memory_link_pair(transport::PeerId{1}, transport::PeerId{2});
  const at::Tensor a = torch::arange(12, torch::kFloat).view({3, 4}), b = -a;
  Result<at::Tensor> got_a = error(ErrorCode::kAborted, "not run"), got_b = error(ErrorCode::kAborted, "not run");
  std::thread peer([&] { got_b = pair_exchange(*ba, b, codec(quant::CodecId::kFp32), 9, in(5s), real_clock()); });
  got_a = pair_exchange(*ab, a, codec(quant::CodecId::kFp32), 9, in(5s), real_clock());
  peer.join();
  REQUIRE(got_a.ok());
  REQUIRE(got_b.ok());
  CHECK(torch::equal(*got_a, b));
  CHECK(torch::equal(*got_b, a));
}

namespace {

// m ranks all-reduce their tensors under `agg`; the last `poisoned` ranks send poisoned contributions.
struct RobustRun {
  std::vector<at::Tensor> t;
  std::vector<Status> st;
  std::vector<CommStats> stats;
};

RobustRun robust_run(std::vector<at::Tensor> t, const Aggregation& agg, std::optional<Poison> poison, int poisoned, std::int64_t segment,
                     quant::CodecId id = quant::CodecId::kFp32, Nanos timeout = 10s) {
  const int m = static_cast<int>(t.size());
  auto groups = mesh(m);
  for (int r = m - poisoned; r < m; ++r) groups[static_cast<std::size_t>(r)].poison = poison;
  RobustRun out{std::move(t), std::vector<Status>(static_cast<std::size_t>(m)), std::vector<CommStats>(static_cast<std::size_t>(m))};
  on_ranks(m, [&](int r) {
    const auto i = static_cast<std::size_t>(r);
    out.st[i] = allreduce_mean(groups[i], out.t[i], codec(id), 9, in(timeout), &out.stats[i], segment, agg);
  });
  return out;
}

std::uint64_t left_out(const RobustRun& run) {
  std::uint64_t n = 0;
  for (const auto& s : run.stats) n += s.left_out;
  return n;
}

// Rank r of m holds (i * 8 + r): integer-valued, so every mean below is exact.
std::vector<at::Tensor> ramp(int m, std::int64_t n) {
  std::vector<at::Tensor> t;
  for (int r = 0; r < m; ++r) t.push_back(torch::arange(n, torch::kFloat) * 8 + r);
  return t;
}

}  // namespace

TEST_CASE("filtered aggregation leaves out exactly the poisoned rank, keeps ranks bit-identical, and equals the plain mean when nobody is odd") {
  const int m = 5;
  const std::int64_t n = 40;
  Aggregation filtered;
  filtered.rule = Aggregation::Rule::kFiltered;
  for (std::int64_t segment : {kAllreduceSegmentValues, std::int64_t{3}}) {
    CAPTURE(segment);
    // Nobody poisoned: bit for bit the mean, nothing left out.
    const RobustRun plain = robust_run(ramp(m, n), Aggregation{}, std::nullopt, 0, segment);
    const RobustRun clean = robust_run(ramp(m, n), filtered, std::nullopt, 0, segment);
    for (int r = 0; r < m; ++r) {
      REQUIRE(clean.st[static_cast<std::size_t>(r)].ok());
      CHECK(torch::equal(clean.t[static_cast<std::size_t>(r)], plain.t[static_cast<std::size_t>(r)]));
    }
    CHECK(left_out(clean) == 0);
    // The honest four's mean: (i * 8) + 1.5.
    const at::Tensor honest = torch::arange(n, torch::kFloat) * 8 + 1.5f;
    for (const Poison poison : {Poison{100.0, false}, Poison{-3.0, false}, Poison{1.0, true}}) {
      CAPTURE(poison.scale);
      CAPTURE(poison.nan);
      const RobustRun run = robust_run(ramp(m, n), filtered, poison, 1, segment);
      for (int r = 0; r < m; ++r) {
        REQUIRE(run.st[static_cast<std::size_t>(r)].ok());
        CHECK(torch::equal(run.t[static_cast<std::size_t>(r)], honest));  // the poisoned rank too receives the honest mean
      }
      // Every owner, rank 4 included for its own chunk, left rank 4 out once.
      CHECK(left_out(run) == 5);
      for (int r = 0; r < m; ++r) CHECK(run.stats[static_cast<std::size_t>(r)].left_out == 1);
    }
    // Under the plain mean a NaN fails the collective (as before), and a scaled contribution goes in.
    const RobustRun nan_mean = robust_run(ramp(m, n), Aggregation{}, Poison{1.0, true}, 1, segment, quant::CodecId::kFp32, 500ms);
    bool failed = false;
    for (const auto& st : nan_mean.st) failed = failed || !st.ok();
    CHECK(failed);
  }
}

TEST_CASE("trimmed mean drops the extremes of every coordinate, catches a sign flip, and a rank with NaN of its own abstains") {
  const int m = 5;
  const std::int64_t n = 12;
  Aggregation trimmed;
  trimmed.rule = Aggregation::Rule::kTrimmedMean;
  trimmed.trim = 1;
  // Values r = 0..4 per coordinate offset: dropping 0 and 4 leaves the mean of 1, 2, 3 = 2.
  const RobustRun clean = robust_run(ramp(m, n), trimmed, std::nullopt, 0, 5);
  for (int r = 0; r < m; ++r) {
    REQUIRE(clean.st[static_cast<std::size_t>(r)].ok());
    CHECK(torch::equal(clean.t[static_cast<std::size_t>(r)], torch::arange(n, torch::kFloat) * 8 + 2));
  }
  CHECK(left_out(clean) == 0);  // trimming is not leaving out
  // Rank 4 flips its sign: per coordinate the values are 8i + {0, 1, 2, 3} and -(8i + 4); the trimmed
  // mean keeps three of the honest values, never the flipped one (except at i = 0, where -4 is the smallest).
  const RobustRun flipped = robust_run(ramp(m, n), trimmed, Poison{-1.0, false}, 1, 5);
  const at::Tensor i = torch::arange(n, torch::kFloat) * 8;
  for (int r = 0; r < m; ++r) {
    REQUIRE(flipped.st[static_cast<std::size_t>(r)].ok());
    CHECK(torch::equal(flipped.t[static_cast<std::size_t>(r)], i + 1));  // 8i + {0, 1, 2}: -(8i + 4) and 8i + 3 dropped
  }
  // A rank whose own tensor holds NaN abstains and takes the others' result; the plain mean refuses it.
  auto t = ramp(m, n);
  t[2].fill_(std::nanf(""));
  Aggregation filtered;
  filtered.rule = Aggregation::Rule::kFiltered;
  const RobustRun abstained = robust_run(t, filtered, std::nullopt, 0, 5);
  const at::Tensor others = i + 2;  // (0 + 1 + 3 + 4) / 4
  for (int r = 0; r < m; ++r) {
    REQUIRE(abstained.st[static_cast<std::size_t>(r)].ok());
    CHECK(torch::equal(abstained.t[static_cast<std::size_t>(r)], others));
  }
  CHECK(left_out(abstained) == 5);  // every owner, rank 2 included, left rank 2's contribution out
  // Every contribution unusable: an error, not an exception.
  std::vector<at::Tensor> all_nan;
  for (int r = 0; r < 3; ++r) all_nan.push_back(torch::full({4}, std::nanf("")));
  const RobustRun none = robust_run(all_nan, filtered, std::nullopt, 0, kAllreduceSegmentValues, quant::CodecId::kFp32, 500ms);
  for (const auto& st : none.st) CHECK_FALSE(st.ok());
}

TEST_CASE("robust aggregation works with quantized codecs: a scaled poisoned rank is left out") {
  const int m = 4;
  Aggregation filtered;
  filtered.rule = Aggregation::Rule::kFiltered;
  std::vector<at::Tensor> t;
  torch::manual_seed(11);
  const at::Tensor base = torch::randn({300});
  for (int r = 0; r < m; ++r) t.push_back(base + 0.05f * torch::randn({300}));
  const at::Tensor honest = (t[0] + t[1] + t[2]) / 3;
  const RobustRun run = robust_run(t, filtered, Poison{50.0, false}, 1, kAllreduceSegmentValues, quant::CodecId::kInt8);
  for (int r = 0; r < m; ++r) {
    REQUIRE(run.st[static_cast<std::size_t>(r)].ok());
    CHECK(torch::equal(run.t[static_cast<std::size_t>(r)], run.t[0]));
    CHECK((run.t[static_cast<std::size_t>(r)] - honest).abs().max().item<float>() < 0.05f);  // int8's error, not 50x
  }
  CHECK(left_out(run) >= 3);
}

TEST_CASE("a mean tap keeps the codec's bytes of each mean, which decode bit for bit to what every rank holds") {
  torch::manual_seed(7);
  const int m = 3;
  const std::int64_t n = 1000;
  for (const auto id : {quant::CodecId::kInt8, quant::CodecId::kFp4E3M0, quant::CodecId::kFp32}) {
    for (const std::int64_t segment : {kAllreduceSegmentValues, std::int64_t{37}}) {
      CAPTURE(static_cast<int>(id));
      CAPTURE(segment);
      auto groups = mesh(m);
      std::vector<std::shared_ptr<MeanTap>> taps;
      for (auto& g : groups) {
        taps.push_back(std::make_shared<MeanTap>());
        taps.back()->enable(true);
        g.mean_tap = taps.back();
      }
      std::vector<at::Tensor> t(static_cast<std::size_t>(m));
      for (int r = 0; r < m; ++r) t[static_cast<std::size_t>(r)] = torch::randn({n}, torch::TensorOptions().dtype(torch::kFloat)) * (r + 1);
      on_ranks(m, [&](int r) {
        REQUIRE(allreduce_mean(groups[static_cast<std::size_t>(r)], t[static_cast<std::size_t>(r)], codec(id), 1, in(10s), nullptr, segment).ok());
      });
      for (int r = 0; r < m; ++r) {
        auto& tap = *taps[static_cast<std::size_t>(r)];
        const at::Tensor& mean = t[static_cast<std::size_t>(r)];
        const std::span<const float> values(mean.data_ptr<float>(), static_cast<std::size_t>(n));
        if (id == quant::CodecId::kFp32) {
          CHECK(tap.size() == 0);  // fp32 would gain nothing: nothing kept
          continue;
        }
        REQUIRE(tap.size() == 1);
        // Another tensor of the same size is not this mean.
        const at::Tensor other = mean + 1.0f;
        CHECK_FALSE(tap.take(std::span<const float>(other.data_ptr<float>(), static_cast<std::size_t>(n))).has_value());
        CHECK(tap.size() == 1);
        auto payloads = tap.take(values);
        REQUIRE(payloads.has_value());
        CHECK(tap.size() == 0);
        std::size_t bytes = 0;
        for (const auto& p : *payloads) bytes += p.size();
        // In whole chunks, at most half of fp32 (int8 about a quarter, plus headers); 37-value
        // segments carry a payload header each.
        if (segment == kAllreduceSegmentValues) CHECK(bytes < static_cast<std::size_t>(n) * 4 / 2);
        CHECK(decodes_to(*payloads, values));
      }
    }
  }
}

TEST_CASE("a mean tap that is off keeps nothing, holds at most its cap, and take() drops the older records") {
  MeanTap tap;
  const at::Tensor a = torch::arange(64, torch::kFloat);
  quant::EncodeOptions o = codec(quant::CodecId::kInt8);
  auto encoded = [&](const at::Tensor& x) { return std::vector<Bytes>{quant::encode(x, o)}; };
  tap.add(64, encoded(a));
  CHECK(tap.size() == 0);
  tap.enable(true);
  for (int k = 0; k < 12; ++k) tap.add(64, encoded(a + k));
  CHECK(tap.size() == MeanTap::kMaxRecords);
  // The record of a + 9 (decoded: what a rank would hold), with 8, 9 and everything older gone.
  const at::Tensor held = *quant::decode(encoded(a + 9)[0]);
  REQUIRE(tap.take(std::span<const float>(held.data_ptr<float>(), 64)).has_value());
  CHECK(tap.size() == 2);
  tap.enable(false);
  CHECK(tap.size() == 0);
  // Payloads that hold fewer values, or other values, do not decode to the tensor.
  CHECK_FALSE(decodes_to({quant::encode(a.slice(0, 0, 32), o)}, std::span<const float>(held.data_ptr<float>(), 64)));
  CHECK_FALSE(decodes_to({Bytes{std::byte{1}, std::byte{2}, std::byte{3}}}, std::span<const float>(held.data_ptr<float>(), 64)));
}
