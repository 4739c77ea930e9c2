#include <doctest/doctest.h>

#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>

#include "model/gpt_script.h"
#include "quant/sparse.h"
#include "sim/cluster.h"
#include "train/worker.h"
#include "transport/protocol.h"
#include "tiny.h"

using namespace gossamer;
using namespace gossamer::sim;

namespace {

train::RunConfig tiny(const std::string& method) {
  train::RunConfig c = testing::tiny_run(method, 3, 24);
  c.diloco.inner_steps = 6;
  c.noloco.inner_steps = 6;
  c.co2.inner_steps = 6;
  c.sparseloco.inner_steps = 6;
  c.muloco.inner_steps = 6;
  c.streaming_diloco.inner_steps = 6;
  c.streaming_diloco.fragment_layers = 1;
  return c;
}

ClusterResult run(const train::RunConfig& c) { return testing::simulate(c); }

// What the method's collectives sent (gossip's membership traffic aside, which depends on time).
double link_bytes(const train::WorkerAccount& a) { return static_cast<double>(a.bytes_sent - a.gossip_bytes_sent - a.state_bytes_sent); }

}  // namespace

TEST_CASE("a seeded simulation reruns bit-identically: metrics and final parameters") {
  for (const char* method : {"diloco", "streaming_diloco", "co2"}) {
    CAPTURE(method);
    const auto a = run(tiny(method)), b = run(tiny(method));
    REQUIRE(a.records.size() == b.records.size());
    for (std::size_t i = 0; i < a.records.size(); ++i) CHECK(a.records[i].dump() == b.records[i].dump());
    for (std::size_t w = 0; w < a.final_params.size(); ++w) CHECK(torch::equal(a.final_params[w], b.final_params[w]));
    CHECK(a.sim_time_s == b.sim_time_s);
  }
}

TEST_CASE("every method trains in the simulator and accounts its bytes and time") {
  for (const char* method : {"ddp", "diloco", "streaming_diloco", "noloco", "co2", "local", "sparseloco", "muloco"}) {
    CAPTURE(method);
    const auto r = run(tiny(method));
    REQUIRE(r.accounts.size() == 3);
    for (const auto& a : r.accounts) {
      CHECK(a.steps == 24);
      CHECK(a.compute_s == doctest::Approx(24 * 0.05));
      if (std::string(method) == "local") {
        CHECK(a.bytes_sent == 0);
      } else {
        CHECK(a.bytes_sent > 0);
        const std::string m = method;
        if (m == "ddp" || m == "diloco" || m == "noloco") CHECK(a.blocked_s > 0);  // synchronous rounds wait
      }
    }
    CHECK(r.sim_time_s >= 24 * 0.05 - 1e-9);
    bool has_val = false;
    for (const auto& rec : r.records) has_val = has_val || rec.contains("val_loss");
    CHECK(has_val);
  }
}

TEST_CASE("ddp sends every step what diloco sends once per round") {
  const auto ddp = run(tiny("ddp")), diloco = run(tiny("diloco"));
  const double ratio = link_bytes(ddp.accounts[0]) / link_bytes(diloco.accounts[0]);
  CHECK(ratio == doctest::Approx(6.0).epsilon(0.02));  // H = 6: same payload, 6 times as often
}

TEST_CASE("sparseloco sends each round one sparse payload to each other worker, and its last round flushes the accumulators") {
  const auto r = run(tiny("sparseloco"));
  const auto n = static_cast<std::uint64_t>(r.final_params[0].numel());
  const double payload = static_cast<double>(quant::sparse_payload_bytes(n, quant::SparseOptions{}) + transport::kFrameHeaderBytes);
  for (const auto& a : r.accounts) {
    CHECK(a.rounds == 4);  // H = 6 over 24 steps
    CHECK(link_bytes(a) == doctest::Approx(4 * 2 * payload).epsilon(0.02));
  }
  const auto ddp = run(tiny("ddp"));
  CHECK(link_bytes(ddp.accounts[0]) > 50 * link_bytes(r.accounts[0]));
  // With a flush codec the last round all-reduces the whole accumulator in it (fp4: 4.25 bits a
  // value, 2 x 2/3 of them sent by each of 3 workers) in place of its sparse payloads.
  auto c = tiny("sparseloco");
  c.sparseloco.flush_codec = quant::CodecId::kFp4E2M1;
  const auto flushed = run(c);
  const double fp4 = 2.0 * 2.0 / 3.0 * static_cast<double>(n) * 4.25 / 8.0;
  for (std::size_t w = 0; w < 3; ++w) {
    CHECK(flushed.accounts[w].rounds == 4);
    CHECK(link_bytes(flushed.accounts[w]) - link_bytes(r.accounts[w]) == doctest::Approx(fp4 - 2 * payload).epsilon(0.05));
  }
  CHECK(torch::equal(flushed.final_params[0], flushed.final_params[2]));
}

TEST_CASE("a crashed worker stops contributing and the rest go on") {
  auto c = tiny("diloco");
  c.sim.crash_worker = 2;
  c.sim.crash_at_step = 10;
  const auto r = run(c);
  CHECK(r.crashed[2]);
  CHECK(r.accounts[2].steps == 9);
  CHECK(r.accounts[0].steps == 24);
  CHECK(r.accounts[1].steps == 24);
  // The survivors re-form the group and keep synchronizing: every round applied, none skipped, and
  // after the last one both hold the same weights.
  CHECK(r.accounts[0].rounds == 4);
  CHECK(r.accounts[0].skipped_rounds == 0);
  CHECK(r.accounts[1].rounds == 4);
  CHECK(torch::equal(r.final_params[0], r.final_params[1]));
  CHECK_FALSE(torch::equal(r.final_params[0], r.final_params[2]));
}

TEST_CASE("after a crash every method goes on synchronizing over the survivors") {
  for (const char* method : {"ddp", "streaming_diloco", "noloco", "co2", "sparseloco", "muloco"}) {
    CAPTURE(method);
    auto c = tiny(method);
    c.sim.crash_worker = 1;
    c.sim.crash_at_step = 8;
    c.train.round_timeout_s = 5;
    const auto r = run(c);
    CHECK(r.crashed[1]);
    for (int w : {0, 2}) {
      CHECK(r.accounts[static_cast<std::size_t>(w)].steps == 24);
      CHECK(r.accounts[static_cast<std::size_t>(w)].rounds > r.accounts[static_cast<std::size_t>(w)].skipped_rounds);
    }
    // Rounds after the crash still move bytes between the two survivors.
    double sent_late = 0;
    for (const auto& rec : r.records) {
      if (rec["worker"] == 0 && rec["step"].get<int>() == 24) sent_late = rec["bytes_sent"].get<double>();
    }
    double sent_at_crash = 0;
    for (const auto& rec : r.records) {
      if (rec["worker"] == 0 && rec["step"].get<int>() <= 8) sent_at_crash = rec["bytes_sent"].get<double>();
    }
    CHECK(sent_late > sent_at_crash);
    CHECK(r.sim_time_s < 30);  // nobody waited out a round timeout
  }
}

TEST_CASE("a straggler stretches the simulated time of synchronous methods") {
  auto c = tiny("diloco");
  const auto even = run(c);
  c.sim.straggler = 1;
  c.sim.straggler_factor = 3.0;
  const auto slow = run(c);
  // Its compute is 3x (2.4 s more); every round waits for it, most of that lands on the run's time.
  CHECK(slow.sim_time_s - even.sim_time_s > 0.75 * 2 * 24 * 0.05);
  CHECK(slow.accounts[1].compute_s == doctest::Approx(3 * even.accounts[1].compute_s));
  CHECK(slow.accounts[0].blocked_s > even.accounts[0].blocked_s);  // the others wait for it
}

TEST_CASE("heterogeneous links: a slow worker's link stretches the synchronous rounds") {
  auto c = tiny("diloco");
  c.sim.network = "custom";
  c.sim.bandwidth_mbit = 1000;
  c.sim.latency_ms = 1;
  auto spec = network_spec(c);
  REQUIRE(spec.ok());
  CHECK(spec->nodes[2].link.bandwidth_bytes_per_s == doctest::Approx(1000e6 / 8));
  const auto fast = run(c);
  c.sim.slow_link_workers = 1;
  c.sim.slow_link_mbit = 1;
  spec = network_spec(c);
  REQUIRE(spec.ok());
  CHECK(spec->nodes[2].link.bandwidth_bytes_per_s == doctest::Approx(1e6 / 8));
  CHECK(spec->nodes[1].link.bandwidth_bytes_per_s == doctest::Approx(1000e6 / 8));
  const auto slow = run(c);
  CHECK(slow.accounts[0].blocked_s > 5 * fast.accounts[0].blocked_s);
  CHECK(link_bytes(slow.accounts[0]) == link_bytes(fast.accounts[0]));  // same traffic, slower
  CHECK(slow.accounts[0].gossip_bytes_sent > 0);
}

TEST_CASE("the skippipe-geo network: workers at the reference's places, each pair its own latency and bandwidth") {
  auto c = tiny("diloco");
  c.sim.workers = 3;
  c.sim.network = "skippipe-geo";
  auto spec = network_spec(c);
  REQUIRE(spec.ok());
  REQUIRE(spec->pairs.size() == 9);
  // Worker 0 in Australia, 1 in Belgium, 2 in Canada: AU-BE 129 ms and 0.00983 GiB/s.
  CHECK(spec->pairs[1].latency == std::chrono::microseconds(129000));
  CHECK(spec->pairs[1].bandwidth_bytes_per_s == doctest::Approx(0.00983 * 1024.0 * 1024 * 1024));
  CHECK(spec->pairs[5].latency == std::chrono::microseconds(41000));  // BE-CA
  CHECK(std::isinf(spec->nodes[0].link.bandwidth_bytes_per_s));
  const auto geo = run(c);
  c.sim.network = "datacenter";
  const auto near = run(c);
  CHECK(geo.accounts[0].blocked_s > 2 * near.accounts[0].blocked_s);  // rounds across continents wait longer
  CHECK(link_bytes(geo.accounts[0]) == link_bytes(near.accounts[0]));
}

TEST_CASE("sites: workers in contiguous blocks behind a shared link that slows their rounds") {
  auto c = tiny("diloco");
  c.sim.workers = 4;
  c.sim.network = "custom";
  c.sim.bandwidth_mbit = 1000;
  c.sim.latency_ms = 1;
  auto spec = network_spec(c);
  REQUIRE(spec.ok());
  CHECK(spec->sites.empty());
  const auto flat = run(c);
  c.sim.sites = 2;
  c.sim.site_uplink_mbit = 10;
  c.sim.site_latency_ms = 20;
  spec = network_spec(c);
  REQUIRE(spec.ok());
  REQUIRE(spec->sites.size() == 2);
  CHECK(spec->nodes[0].site == 0);
  CHECK(spec->nodes[1].site == 0);
  CHECK(spec->nodes[2].site == 1);
  CHECK(spec->nodes[3].site == 1);
  CHECK(spec->sites[1].bandwidth_bytes_per_s == doctest::Approx(10e6 / 8));
  const auto sited = run(c);
  CHECK(sited.accounts[0].blocked_s > 5 * flat.accounts[0].blocked_s);
  CHECK(link_bytes(sited.accounts[0]) == link_bytes(flat.accounts[0]));
  c.sim.sites = 5;
  CHECK_FALSE(train::validate(c).ok());  // more sites than workers
}

TEST_CASE("a late joiner learns the run over gossip, fetches the members' state, takes part from a round boundary and then holds the group's weights") {
  for (const std::string method : {"diloco", "ddp", "streaming_diloco", "noloco", "co2", "sparseloco", "muloco"}) {
    CAPTURE(method);
    auto c = tiny(method);
    c.sim.workers = 4;  // even once it is in: NoLoCo pairs everyone every round
    c.sim.join_worker = 3;
    c.sim.join_at_step = 7;  // it starts just after the first round (H = 6)
    const auto r = run(c);
    const auto& newcomer = r.accounts[3];
    CHECK(newcomer.steps == 24);
    const std::int64_t per_step = c.train.batch_size * c.model.context;
    const std::int64_t trained = newcomer.tokens / per_step;  // only the steps it trained
    CHECK(newcomer.tokens == trained * per_step);
    CHECK(trained >= 6);
    CHECK(trained <= 24 - 7);
    // Its compute: the steps it trained, and any it trained before it was left out of a round and
    // caught up again with a second transfer (the tokens count from the last one).
    CHECK(newcomer.compute_s >= static_cast<double>(trained) * 0.05 - 1e-9);
    CHECK(newcomer.compute_s <= (24 - 7) * 0.05 + 1e-9);
    CHECK(newcomer.state_bytes_received > 100'000);  // parameters and outer state (and AdamW's for ddp)
    CHECK(newcomer.bytes_received > newcomer.state_bytes_received);  // and the rounds after
    // The donors sent it exactly what it received.
    std::uint64_t donated = 0;
    int donors = 0;
    for (int w = 0; w < 3; ++w) {
      donated += r.accounts[static_cast<std::size_t>(w)].state_bytes_sent;
      donors += r.accounts[static_cast<std::size_t>(w)].state_bytes_sent > 0 ? 1 : 0;
    }
    CHECK(donated == newcomer.state_bytes_received);
    // Every member offers the same bytes (ddp's inner optimizer included), so the state comes from
    // all of them at once; NoLoCo's members differ by design and one donor serves.
    if (method != "noloco") CHECK(donors == 3);
    for (int w = 0; w < 3; ++w) CHECK(r.accounts[static_cast<std::size_t>(w)].steps == 24);
    bool newcomer_recorded_early = false;
    for (const auto& rec : r.records) newcomer_recorded_early = newcomer_recorded_early || (rec["worker"] == 3 && rec["step"].get<int>() <= 24 - trained);
    CHECK_FALSE(newcomer_recorded_early);
    if (method == "diloco" || method == "ddp" || method == "co2" || method == "sparseloco" || method == "muloco") {
      // After the last round every member, the newcomer included, holds the same bits (CO2's
      // average in flight went with the state and stayed with the members across the join), and
      // joining at a round boundary cut no round short.
      for (int w = 1; w < 4; ++w) CHECK(torch::equal(r.final_params[static_cast<std::size_t>(w)], r.final_params[0]));
      for (const auto& a : r.accounts) CHECK(a.skipped_rounds == 0);
    }
  }
}

TEST_CASE("a late join reruns bit-identically") {
  auto c = tiny("diloco");
  c.sim.join_worker = 1;
  c.sim.join_at_step = 7;
  const auto a = run(c), b = run(c);
  REQUIRE(a.records.size() == b.records.size());
  for (std::size_t i = 0; i < a.records.size(); ++i) CHECK(a.records[i].dump() == b.records[i].dump());
  CHECK(torch::equal(a.final_params[1], b.final_params[1]));
  CHECK(a.sim_time_s == b.sim_time_s);
}

TEST_CASE("a newcomer nobody can serve does not join, and the run still ends") {
  auto c = tiny("diloco");
  c.sim.workers = 2;
  c.sim.join_worker = 1;
  c.sim.join_at_step = 12;
  c.sim.crash_worker = 0;  // the only member dies before the join step
  c.sim.crash_at_step = 5;
  const auto r = run(c);
  CHECK(r.accounts[0].steps == 4);
  CHECK(r.accounts[1].steps == 0);
  CHECK(r.accounts[1].state_bytes_received == 0);
}

TEST_CASE("a round that fails just before a join is retried without the newcomer") {
  auto c = tiny("diloco");
  c.sim.workers = 4;
  c.sim.join_worker = 3;
  c.sim.join_at_step = 13;
  c.sim.crash_worker = 1;
  c.sim.crash_at_step = 12;  // 1 dies while the others wait for it in the round at step 12
  c.sim.straggler = 1;       // (it is slow, so they are already waiting)
  c.sim.straggler_factor = 1.5;
  c.train.round_timeout_s = 30;
  const auto r = run(c);
  CHECK(r.crashed[1]);
  CHECK(r.accounts[0].skipped_rounds == 0);  // retried over {0, 2}, not over a group waiting for 3
  CHECK(r.accounts[3].steps == 24);
  CHECK(torch::equal(r.final_params[0], r.final_params[3]));
  CHECK(r.sim_time_s < 20);  // nobody waited out a round timeout
}

TEST_CASE("churn: seeded crashes and restarts from the last checkpoint go through the real runtime, rerun bit-identically, and the run ends together") {
  auto c = tiny("diloco");
  c.sim.workers = 6;
  c.train.steps = 240;
  c.train.eval_every = 120;
  c.train.checkpoint_every = 12;
  c.sim.churn_rate = 0.5;
  c.sim.churn_downtime_s = 1.0;
  const auto a = run(c);
  int rejoined = 0;
  for (const auto& acc : a.accounts) rejoined += acc.state_bytes_received > 0 ? 1 : 0;
  CHECK(rejoined >= 2);  // restarted workers fetched the members' state to catch up
  for (int w = 0; w < 6; ++w) CHECK_FALSE(a.crashed[static_cast<std::size_t>(w)]);  // everyone came back
  // Those that finished hold the same weights: the restarted ones caught up exactly.
  int finished = 0;
  for (int w = 0; w < 6; ++w) {
    if (a.accounts[static_cast<std::size_t>(w)].steps != 240) continue;
    ++finished;
    CHECK(torch::equal(a.final_params[static_cast<std::size_t>(w)], a.final_params[0]));
  }
  CHECK(finished >= 4);
  const auto b = run(c);
  REQUIRE(a.records.size() == b.records.size());
  for (std::size_t i = 0; i < a.records.size(); ++i) CHECK(a.records[i].dump() == b.records[i].dump());
  CHECK(a.sim_time_s == b.sim_time_s);
}

TEST_CASE("a scripted crash with a restart: the worker resumes its checkpoint, catches up and ends with the members' weights") {
  auto c = tiny("diloco");
  c.train.steps = 36;
  c.train.checkpoint_every = 6;
  c.sim.compute = train::ComputeModel::kFixed;
  c.sim.step_time_s = 1.0;
  c.sim.crash_worker = 2;
  c.sim.crash_at_step = 9;
  c.sim.crash_restart_s = 0;
  const auto a = run(c);
  CHECK_FALSE(a.crashed[2]);
  CHECK(a.accounts[2].state_bytes_received > 0);  // it fetched the members' newer state
  for (int w = 0; w < 3; ++w) CHECK(a.accounts[static_cast<std::size_t>(w)].steps == 36);
  CHECK(torch::equal(a.final_params[2], a.final_params[0]));
  // A rerun is bit-identical.
  const auto b = run(c);
  REQUIRE(a.records.size() == b.records.size());
  for (std::size_t i = 0; i < a.records.size(); ++i) CHECK(a.records[i].dump() == b.records[i].dump());
  // Without the restart it stays down.
  c.sim.crash_restart_s = -1;
  const auto down = run(c);
  CHECK(down.crashed[2]);
  CHECK(down.accounts[2].steps < 36);
}

TEST_CASE("a TorchScript model runs DiLoCo and Streaming DiLoCo in the simulator, bit-identically on rerun and as the GPT it scripts") {
  const auto path = std::filesystem::temp_directory_path() / ("gossamer_sim_ts_" + std::to_string(::getpid()) + ".pt");
  for (const char* method : {"diloco", "streaming_diloco"}) {
    CAPTURE(method);
    train::RunConfig gpt = tiny(method);
    // The same initial weights as every simulated GPT worker, as a TorchScript file.
    model::script_gpt(model::Gpt(train::gpt_config(gpt, 0))).save(path.string());
    train::RunConfig ts = gpt;
    ts.model.kind = train::ModelKind::kTorchScript;
    ts.model.path = path.string();
    const auto a = run(ts), b = run(ts), reference = run(gpt);
    REQUIRE(a.records.size() == b.records.size());
    for (std::size_t i = 0; i < a.records.size(); ++i) CHECK(a.records[i].dump() == b.records[i].dump());
    for (std::size_t w = 0; w < a.final_params.size(); ++w) {
      CHECK(torch::equal(a.final_params[w], b.final_params[w]));
      // Same computation, another interpreter: the runs agree closely (not necessarily bit for bit).
      CHECK(torch::allclose(a.final_params[w], reference.final_params[w], 1e-4, 1e-5));
    }
    CHECK(a.parameters == reference.parameters);
  }
  std::filesystem::remove(path);
}

TEST_CASE("a poisoned worker: filtered aggregation leaves it out and the run ends as a clean one would, the plain mean does not") {
  train::RunConfig clean = tiny("diloco");
  clean.sim.workers = 4;
  train::RunConfig poisoned = clean;
  poisoned.sim.poison = train::PoisonKind::kScale;
  poisoned.sim.poison_scale = 50.0;
  train::RunConfig robust = poisoned;
  robust.outer.aggregation = train::Aggregation::kFiltered;
  REQUIRE(train::validate(robust).ok());
  const auto c = run(clean), p = run(poisoned), r = run(robust);
  // The honest workers (0..2) end alike in every run; with the filter they hold the mean of the
  // honest contributions, so they are close to the clean run (which also averaged the fourth worker's).
  for (std::size_t w = 1; w < 3; ++w) CHECK(torch::equal(r.final_params[0], r.final_params[w]));
  std::uint64_t left = 0;
  for (const auto& a : r.accounts) left += a.left_out;
  CHECK(left == static_cast<std::uint64_t>(4 * r.accounts[0].rounds));  // every owner, every round
  for (const auto& a : c.accounts) CHECK(a.left_out == 0);
  const double drift_robust = (r.final_params[0] - c.final_params[0]).norm().item<double>();
  const double drift_poisoned = (p.final_params[0] - c.final_params[0]).norm().item<double>();
  CHECK(drift_robust * 10 < drift_poisoned);
  // Refused where it cannot apply.
  train::RunConfig bad = robust;
  bad.outer.method = optim::Method::kNoLoCo;
  CHECK_FALSE(train::validate(bad).ok());
  bad = poisoned;
  bad.sim.poison = train::PoisonKind::kNan;
  bad.diloco.codec = quant::CodecId::kInt8;
  CHECK_FALSE(train::validate(bad).ok());
  bad.sim.poison_workers = 4;
  CHECK_FALSE(train::validate(bad).ok());
}

namespace {

// A run whose newcomer (worker 3) sits behind a slow link: its state takes several rounds to arrive
// (a round: 6 steps of 0.2 s, and the members' all-reduce over 100 Mbit/s).
train::RunConfig slow_join(const std::string& method, double newcomer_mbit = 3) {
  auto c = tiny(method);
  c.sim.workers = 4;
  c.train.steps = 96;
  c.train.eval_every = 96;
  c.ddp.round_steps = 6;
  c.sim.network = "custom";
  c.sim.bandwidth_mbit = 100;
  c.sim.latency_ms = 5;
  c.sim.slow_link_workers = 1;
  c.sim.slow_link_mbit = newcomer_mbit;
  c.sim.step_time_s = 0.2;
  c.sim.join_worker = 3;
  c.sim.join_at_step = 7;
  return c;
}

// The last record of worker w holding `key`.
std::optional<nlohmann::json> last_with(const ClusterResult& r, int w, const char* key) {
  std::optional<nlohmann::json> out;
  for (const auto& rec : r.records) {
    if (rec["worker"] == w && rec.contains(key)) out = rec;
  }
  return out;
}

}  // namespace

TEST_CASE("catch-up: a newcomer whose state takes rounds to arrive joins once, replays the rounds it missed and ends bit-identical") {
  for (const std::string method : {"diloco", "ddp", "streaming_diloco", "noloco", "co2", "sparseloco"}) {
    CAPTURE(method);
    const auto c = slow_join(method);
    const auto r = run(c);
    const auto& newcomer = r.accounts[3];
    CHECK(newcomer.steps == 96);
    const auto rec = last_with(r, 3, "joins");
    REQUIRE(rec.has_value());
    CHECK((*rec)["joins"] == 1);  // one state transfer, however long it took
    const std::int64_t behind = (*rec)["join_rounds_behind"].get<std::int64_t>();
    MESSAGE("rounds behind " << behind << ", state fetch " << (*rec)["state_fetch_s"].get<double>() << " s");
    if (method == "ddp") {
      CHECK(behind == 0);  // ddp's members wait for a newcomer (a round of its updates outweighs its state)
    } else {
      CHECK(behind >= 1);  // the run went on while the state came; the updates since were replayed
    }
    // Shaping applied: the state took at least its bytes over the newcomer's link.
    const double floor_s = static_cast<double>(newcomer.state_bytes_received) * 8 / (c.sim.slow_link_mbit * 1e6);
    CHECK((*rec)["state_fetch_s"].get<double>() >= floor_s * 0.9);
    std::uint64_t donated = 0;
    int donors = 0;
    for (int w = 0; w < 3; ++w) {
      donated += r.accounts[static_cast<std::size_t>(w)].state_bytes_sent;
      donors += r.accounts[static_cast<std::size_t>(w)].state_bytes_sent > 0 ? 1 : 0;
    }
    CHECK(donated == newcomer.state_bytes_received);
    // Every member offers the same bytes (ddp's inner optimizer included), so the state comes from
    // all of them at once; NoLoCo's members differ by design and one donor serves.
    if (method != "noloco") CHECK(donors == 3);
    for (int w = 0; w < 3; ++w) {
      const auto kept = last_with(r, w, "update_log_bytes");
      CHECK(kept.has_value());  // the donors kept the updates and say how much memory they took
    }
    if (method == "diloco" || method == "ddp" || method == "co2" || method == "sparseloco") {
      for (int w = 1; w < 4; ++w) CHECK(torch::equal(r.final_params[static_cast<std::size_t>(w)], r.final_params[0]));
    }
    for (const auto& a : r.accounts) CHECK(a.skipped_rounds == 0);
  }
}

TEST_CASE("catch-up: a newcomer whose state takes more than 5 rounds to arrive still joins once and ends bit-identical") {
  // At 0.3 Mbit/s the snapshot takes over 5 rounds, and an fp32 update of DiLoCo (half the state) over
  // 2: catching up cannot gain on the members, so the newcomer names its round and they wait there.
  for (const std::string method : {"diloco", "ddp", "streaming_diloco", "noloco", "co2", "sparseloco"}) {
    CAPTURE(method);
    const auto c = slow_join(method, 0.3);
    const auto r = run(c);
    const auto rec = last_with(r, 3, "joins");
    REQUIRE(rec.has_value());
    CHECK((*rec)["joins"] == 1);
    CHECK(r.accounts[3].steps > 0);
    const double round_s = static_cast<double>(c.ddp.round_steps) * c.sim.step_time_s;
    const double transfer_s = (*rec)["state_transfer_s"].get<double>();
    const std::int64_t behind = (*rec)["join_rounds_behind"].get<std::int64_t>();
    MESSAGE("snapshot transfer " << transfer_s << " s, rounds behind " << behind);
    CHECK(transfer_s >= 5 * round_s);
    if (method == "ddp") {
      CHECK(behind == 0);
    } else {
      CHECK(behind >= 5);  // the run went on while the state came, and the newcomer replayed it
    }
    if (method == "diloco" || method == "ddp" || method == "co2" || method == "sparseloco") {
      for (int w = 1; w < 4; ++w) CHECK(torch::equal(r.final_params[static_cast<std::size_t>(w)], r.final_params[0]));
    }
    for (const auto& a : r.accounts) CHECK(a.skipped_rounds == 0);
  }
}

TEST_CASE("catch-up reruns bit-identically") {
  for (const double mbit : {3.0, 0.3}) {  // the newcomer catches up; the members wait for it
    CAPTURE(mbit);
    const auto c = slow_join("diloco", mbit);
    const auto a = run(c), b = run(c);
    REQUIRE(a.records.size() == b.records.size());
    for (std::size_t i = 0; i < a.records.size(); ++i) CHECK(a.records[i].dump() == b.records[i].dump());
    CHECK(torch::equal(a.final_params[3], b.final_params[3]));
  }
}

TEST_CASE("catch-up: a newcomer killed mid-transfer and started again resumes from the chunks it verified, and joins once") {
  auto c = slow_join("diloco", 0.3);
  c.sim.crash_worker = 3;  // the newcomer: killed when the run reaches step 33, its state half-way (5 chunks of 64 KiB over 0.3 Mbit/s)
  c.sim.crash_at_step = 33;
  c.sim.crash_restart_s = 0.5;
  const auto r = run(c);
  const auto rec = last_with(r, 3, "joins");
  REQUIRE(rec.has_value());
  CHECK((*rec)["joins"] == 1);  // the life that finished joined once
  const auto resumed = (*rec)["state_resumed_bytes"].get<std::uint64_t>();
  const auto snapshot = (*rec)["state_snapshot_bytes"].get<std::uint64_t>();
  MESSAGE("resumed " << resumed << " of " << snapshot << " bytes");
  CHECK(resumed > 0);  // what the first life verified was not fetched again
  CHECK(resumed < snapshot);
  CHECK(r.accounts[3].steps > 0);
  for (int w = 1; w < 4; ++w) CHECK(torch::equal(r.final_params[static_cast<std::size_t>(w)], r.final_params[0]));
  // The same run again: the same records.
  const auto again = run(c);
  REQUIRE(again.records.size() == r.records.size());
  for (std::size_t i = 0; i < r.records.size(); ++i) CHECK(again.records[i].dump() == r.records[i].dump());
}

TEST_CASE("catch-up: a donor that dies mid-transfer costs only its chunks in flight, and the newcomer still joins once") {
  auto c = slow_join("diloco");
  c.sim.crash_worker = 1;
  c.sim.crash_at_step = 16;  // while the newcomer's state is on its way (it starts at step 12)
  const auto r = run(c);
  CHECK(r.crashed[1]);
  const auto rec = last_with(r, 3, "joins");
  REQUIRE(rec.has_value());
  CHECK((*rec)["joins"] == 1);
  CHECK(r.accounts[3].steps == 96);
  std::uint64_t donated = 0;
  int donors = 0;
  for (int w = 0; w < 3; ++w) {
    donated += r.accounts[static_cast<std::size_t>(w)].state_bytes_sent;
    donors += r.accounts[static_cast<std::size_t>(w)].state_bytes_sent > 0 ? 1 : 0;
  }
  CHECK(donors >= 2);  // the state came from several donors at once
  CHECK(donated >= r.accounts[3].state_bytes_received);  // (what the dead one sent but never delivered is lost)
  CHECK(torch::equal(r.final_params[3], r.final_params[0]));
  CHECK(torch::equal(r.final_params[2], r.final_params[0]));
}

TEST_CASE("catch-up: updates are kept in the codec's own bytes, so an int8 run's newcomer fetches a quarter of fp32 per round it missed") {
  auto c = slow_join("diloco", 0.3);
  c.diloco.codec = quant::CodecId::kInt8;
  const auto r = run(c);
  const auto rec = last_with(r, 3, "joins");
  REQUIRE(rec.has_value());
  CHECK((*rec)["joins"] == 1);
  const auto replayed = (*rec)["updates_replayed"].get<std::int64_t>();
  const auto behind = (*rec)["join_rounds_behind"].get<std::int64_t>();
  REQUIRE(replayed >= 1);
  CHECK(behind >= 5);
  const auto snapshot = (*rec)["state_snapshot_bytes"].get<std::uint64_t>();
  const double per_update = static_cast<double>(r.accounts[3].state_bytes_received - snapshot) / static_cast<double>(replayed);
  const double fp32 = static_cast<double>(r.final_params[0].numel()) * 4;
  MESSAGE("rounds behind " << behind << ", " << replayed << " update(s) replayed, " << per_update << " bytes each against " << fp32 << " in fp32");
  CHECK(per_update < 0.35 * fp32);  // int8 with a scale per 128 values, plus headers and the requests' manifests
  bool encoded = false;
  for (int w = 0; w < 3; ++w) {
    const auto kept = last_with(r, w, "updates_kept_encoded");
    encoded = encoded || (kept && (*kept)["updates_kept_encoded"].get<std::int64_t>() > 0);
  }
  CHECK(encoded);
  // What the newcomer replayed is what the members applied: every worker ends bit-identical.
  for (int w = 1; w < 4; ++w) CHECK(torch::equal(r.final_params[static_cast<std::size_t>(w)], r.final_params[0]));
  for (const auto& a : r.accounts) CHECK(a.skipped_rounds == 0);
}
