#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <unistd.h>

#include "core/file.h"
#include "sim/pipeline_cluster.h"
#include "sim/report.h"
#include "tiny.h"

using namespace gossamer;
using namespace gossamer::sim;

namespace {

train::RunConfig tiny(const std::string& method) {
  train::RunConfig c = testing::tiny_run(method, 2, 12);
  c.diloco.inner_steps = 4;
  return c;
}

nlohmann::json read_json(const std::filesystem::path& p) {
  auto text = read_text_file(p, 1 << 24);
  REQUIRE(text.ok());
  return nlohmann::json::parse(*text);
}

}  // namespace

TEST_CASE("summary.json holds every field, consistent with the metrics, report.html is self-contained") {
  std::vector<MethodRun> runs;
  for (const char* m : {"ddp", "diloco"}) {
    const auto c = tiny(m);
    auto corpus = train::load_corpus(c);
    REQUIRE(corpus.ok());
    auto r = run_cluster(c, *corpus);
    REQUIRE(r.ok());
    runs.push_back(MethodRun{m, c, std::move(*r)});
  }
  const auto out = std::filesystem::temp_directory_path() / ("gossamer-report-" + std::to_string(::getpid()));
  std::filesystem::remove_all(out);
  ReportContext ctx;
  ctx.title = "test comparison";
  ctx.data_description = "synthetic";
  ctx.network_description = "2 workers";
  ctx.entropy_floor = 0.6;
  ctx.target_loss = default_target_loss(runs);
  REQUIRE(write_comparison(out, runs, ctx).ok());

  const auto summary = read_json(out / "summary.json");
  REQUIRE(summary["methods"].size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    const auto& m = summary["methods"][i];
    for (const char* key : {"name", "final_val_loss", "tokens", "bytes_sent_per_worker", "sim_time_s", "compute_utilization", "time_to_target_s"}) {
      CAPTURE(key);
      CHECK(m.contains(key));
    }
    // Consistent with the metrics stream written beside it.
    std::ifstream metrics(out / m["name"].get<std::string>() / "metrics.jsonl");
    std::string line;
    double last_val = -1, sent_sum = 0, gossip_sum = 0;
    std::map<int, double> last_sent, last_gossip;
    std::int64_t tokens = 0;
    std::map<int, std::int64_t> last_tokens;
    while (std::getline(metrics, line)) {
      const auto rec = nlohmann::json::parse(line);
      if (rec.contains("val_loss")) last_val = rec["val_loss"].get<double>();
      last_sent[rec["worker"].get<int>()] = rec["bytes_sent"].get<double>();
      last_gossip[rec["worker"].get<int>()] = rec["gossip_bytes_sent"].get<double>();
      last_tokens[rec["worker"].get<int>()] = rec["tokens"].get<std::int64_t>();
    }
    for (auto [w, s] : last_sent) sent_sum += s;
    for (auto [w, g] : last_gossip) gossip_sum += g;
    for (auto [w, t] : last_tokens) tokens += t;
    CHECK(m["final_val_loss"].get<double>() == last_val);
    CHECK(m["bytes_sent_per_worker"].get<double>() == doctest::Approx(sent_sum / 2));
    CHECK(m["gossip_bytes_sent_per_worker"].get<double>() == doctest::Approx(gossip_sum / 2));
    CHECK(m["gossip_bytes_sent_per_worker"].get<double>() > 0);
    CHECK(m["gossip_bytes_sent_per_worker"].get<double>() < m["bytes_sent_per_worker"].get<double>());
    // Membership itself is part of gossip, beside the rounds' broadcasts.
    CHECK(m["membership_bytes_sent_per_worker"].get<double>() > 0);
    CHECK(m["membership_bytes_sent_per_worker"].get<double>() < m["gossip_bytes_sent_per_worker"].get<double>());
    CHECK(m["tokens"].get<std::int64_t>() == tokens);
    CHECK(m["tokens"].get<std::int64_t>() == 2 * 12 * 4 * 16);
    CHECK(m["compute_utilization"].get<double>() > 0);
    CHECK(m["compute_utilization"].get<double>() <= 1);
    CHECK(m["sim_time_s"].get<double>() >= 12 * 0.05 - 1e-9);
    if (!m["time_to_target_s"].is_null()) CHECK(m["time_to_target_s"].get<double>() <= m["sim_time_s"].get<double>());
  }
  // ddp talks every step, diloco every 4: 4 times the bytes.
  CHECK(summary["methods"][0]["bytes_sent_per_worker"].get<double>() ==
        doctest::Approx(4 * summary["methods"][1]["bytes_sent_per_worker"].get<double>()).epsilon(0.02));

  auto html = read_text_file(out / "report.html", 1 << 24);
  REQUIRE(html.ok());
  CHECK(html->find("<svg") != std::string::npos);
  CHECK(html->find("Validation loss vs bytes sent per worker") != std::string::npos);
  // The frontier: one point per method, and the target corner drawn from ddp.
  CHECK(html->find("Final validation loss vs bytes sent per worker") != std::string::npos);
  CHECK(html->find("data-method=\"ddp\"") != std::string::npos);
  CHECK(html->find("data-method=\"diloco\"") != std::string::npos);
  CHECK(html->find("1000x fewer than ddp") != std::string::npos);
  CHECK(html->find("entropy floor 0.600") != std::string::npos);
  CHECK(html->find("<td>diloco</td>") != std::string::npos);
  CHECK(html->find("<li><b>diloco</b> averages the pseudo-gradient") != std::string::npos);  // a note on each method run
  CHECK(html->find("<li><b>co2</b>") == std::string::npos);                                  // and none on those not run
  CHECK(html->find("<script") == std::string::npos);
  CHECK(html->find("src=\"http") == std::string::npos);  // nothing fetched from elsewhere
  std::filesystem::remove_all(out);
}

TEST_CASE("a pipeline comparison's report: makespans predicted and simulated, per-node time, and each variant's timeline") {
  std::vector<MethodRun> runs;
  for (const char* mode : {"full", "skippipe"}) {
    train::RunConfig c;
    c.model.layers = 3;
    c.model.width = 16;
    c.model.heads = 2;
    c.model.context = 8;
    c.data.synthetic.bytes = 40'000;
    c.train.batch_size = 2;
    c.train.steps = 2;
    c.train.eval_batches = 1;
    c.pipeline.nodes = 6;
    c.pipeline.stages = 3;
    c.pipeline.path_length = 2;
    c.pipeline.mbs_per_origin = 2;
    c.pipeline.mbs_per_agent = 1;
    c.pipeline.gcma_trials = 20;
    c.pipeline.mode = *train::parse_choice<train::PipelineMode>(mode);
    auto corpus = train::load_corpus(c);
    REQUIRE(corpus.ok());
    auto r = run_pipeline_cluster(c, *corpus);
    REQUIRE_MESSAGE(r.ok(), r.status().to_string());
    runs.push_back(MethodRun{pipeline_method_name(mode), c, std::move(*r)});
  }
  const auto out = std::filesystem::temp_directory_path() / ("gossamer-pipeline-report-" + std::to_string(::getpid()));
  std::filesystem::remove_all(out);
  ReportContext ctx;
  ctx.title = "pipelines";
  ctx.target_loss = default_target_loss(runs);
  REQUIRE(write_comparison(out, runs, ctx).ok());
  const auto summary = read_json(out / "summary.json");
  REQUIRE(summary["methods"].size() == 2);
  for (const auto& m : summary["methods"]) {
    REQUIRE(m.contains("pipeline"));
    const auto& p = m["pipeline"];
    CHECK(p["makespan_s"].get<double>() > 0);
    CHECK(p["predicted_makespan_s"].get<double>() > 0);
    CHECK(p["node_busy_s"].size() == 6);
    CHECK(p["node_idle_s"].size() == 6);
    CHECK_FALSE(p.contains("timeline"));  // in the report, not the summary
    CHECK(m["final_val_loss"].is_number());
    // The omission check at the end (the second half of the stages left out), and the model as
    // trained beside the depth-scaled one: the same for the full pipeline, whose shares are all 1.
    CHECK(p["omitted_stages"] == nlohmann::json::array({1, 2}));
    CHECK(p["val_loss"].get<double>() == m["final_val_loss"].get<double>());
    CHECK(p["omitted_val_loss"].get<double>() != p["val_loss"].get<double>());
    const auto shares = p["stage_shares"].get<std::vector<double>>();
    REQUIRE(shares.size() == 3);
    if (m["name"] == "pipeline-full") {
      CHECK(shares == std::vector<double>{1.0, 1.0, 1.0});
      CHECK(p["val_loss_as_trained"].get<double>() == p["val_loss"].get<double>());
    } else {
      CHECK(shares[1] + shares[2] == doctest::Approx(1.0));  // each micro-batch visits one non-zero stage
      CHECK(shares[1] < 1.0);
      CHECK(p["val_loss_as_trained"].get<double>() != p["val_loss"].get<double>());
    }
  }
  CHECK(summary["methods"][0]["name"] == "pipeline-full");
  auto html = read_text_file(out / "report.html", 1 << 24);
  REQUIRE(html.ok());
  CHECK(html->find("Pipeline iterations") != std::string::npos);
  CHECK(html->find("pipeline-full: the first iteration") != std::string::npos);
  CHECK(html->find("skippipe-cbs: the first iteration") != std::string::npos);
  CHECK(html->find("micro-batch 0 forward") != std::string::npos);
  CHECK(html->find("head and loss") != std::string::npos);
  CHECK(html->find("omission check") != std::string::npos);
  CHECK(html->find("1, 2 out: ") != std::string::npos);
  CHECK(html->find("(unscaled: ") != std::string::npos);  // the skipping variant's
  std::filesystem::remove_all(out);
}

TEST_CASE("the bytes frontier: the methods no other beats on both loss and bytes") {
  auto m = [](const char* name, double bytes, double loss) {
    return nlohmann::json{{"name", name}, {"bytes_sent_per_worker", bytes}, {"final_val_loss", loss}};
  };
  nlohmann::json methods = nlohmann::json::array({m("ddp", 1e9, 1.00), m("diloco", 1e7, 1.01), m("streaming", 2e7, 1.02),  // beaten by diloco
                                                   m("sparse", 1e6, 1.05), m("worse", 1e8, 1.20), m("same", 1e7, 1.01)});
  methods.push_back(nlohmann::json{{"name", "nothing"}, {"bytes_sent_per_worker", 0.0}, {"final_val_loss", 3.0}});  // local: no point
  methods.push_back(nlohmann::json{{"name", "unfinished"}, {"bytes_sent_per_worker", 5e5}, {"final_val_loss", nullptr}});
  const auto on = frontier_methods(methods);
  CHECK(on == std::vector<std::string>{"sparse", "diloco", "same", "ddp"});
  const std::string svg = svg_frontier(methods);
  CHECK(svg.find("data-method=\"worse\"") != std::string::npos);     // drawn, off the frontier
  CHECK(svg.find("data-method=\"nothing\"") == std::string::npos);   // no bytes: no point on a log scale
  CHECK(svg.find("diloco (100x)") != std::string::npos);               // how many times fewer bytes than ddp
  CHECK(svg_frontier(nlohmann::json::array()).find("no data") != std::string::npos);
}

TEST_CASE("the bytes frontier of one method alone has axes that say something") {
  // One point spans no loss and no decade of bytes: the axes still get distinct ticks on both.
  const nlohmann::json one = nlohmann::json::array({nlohmann::json{{"name", "muloco"}, {"bytes_sent_per_worker", 2.26e6}, {"final_val_loss", 1.3043}}});
  const std::string svg = svg_frontier(one);
  auto labels = [&](const std::string& anchor) {
    std::vector<std::string> out;
    const std::string open = "text-anchor=\"" + anchor + "\" class=\"k\">";
    for (std::size_t at = svg.find(open); at != std::string::npos; at = svg.find(open, at + 1)) {
      const std::size_t from = at + open.size();
      out.push_back(svg.substr(from, svg.find('<', from) - from));
    }
    return out;
  };
  const auto y = labels("end"), x = labels("middle");
  CHECK(y.size() >= 2);
  CHECK(std::set<std::string>(y.begin(), y.end()).size() == y.size());
  CHECK(x.size() >= 2);
  CHECK(std::set<std::string>(x.begin(), x.end()).size() == x.size());
  CHECK(svg.find("data-method=\"muloco\"") != std::string::npos);
}
