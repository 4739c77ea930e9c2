#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "train/config.h"
#include "train/memory.h"

using namespace gossamer;
using namespace gossamer::train;

namespace {
Status apply(RunConfig& c, const std::string& toml) { return apply_toml(c, toml, "test.toml"); }
bool mentions(const Status& st, const std::string& s) { return st.message().find(s) != std::string::npos; }
}  // namespace

TEST_CASE("TOML overlays defaults and keys not given keep their values") {
  RunConfig c;
  REQUIRE(apply(c, "[model]\nlayers = 6\n[train]\nlr = 1e-3\n[data.synthetic]\nwords = 100\n").ok());
  CHECK(c.model.layers == 6);
  CHECK(c.train.lr == 1e-3);
  CHECK(c.data.synthetic.words == 100);
  CHECK(c.model.width == RunConfig{}.model.width);
  // Integers are accepted where a number is expected.
  REQUIRE(apply(c, "train.lr = 1").ok());
  CHECK(c.train.lr == 1.0);
}

TEST_CASE("--set overrides parse values as TOML, or as a bare string") {
  RunConfig c;
  REQUIRE(apply_override(c, "model.layers=4").ok());
  CHECK(c.model.layers == 4);
  REQUIRE(apply_override(c, "data.path=some/file.txt").ok());
  CHECK(c.data.path == "some/file.txt");
  REQUIRE(apply_override(c, "data.path=\"quoted.txt\"").ok());
  CHECK(c.data.path == "quoted.txt");
  CHECK(apply_override(c, "model.layers").code() == ErrorCode::kInvalidArgument);
}

TEST_CASE("bad config gives one clear error naming the key and what is allowed") {
  RunConfig c;
  const RunConfig before = c;
  SUBCASE("unknown key, with a suggestion") {
    Status st = apply(c, "[model]\nlayer = 3\n");
    CHECK(st.code() == ErrorCode::kInvalidArgument);
    CHECK(mentions(st, "model.layer"));
    CHECK(mentions(st, "did you mean 'model.layers'"));
  }
  SUBCASE("unknown section") {
    Status st = apply(c, "[modle]\nlayers = 3\n");
    CHECK(mentions(st, "unknown config key 'modle'"));
  }
  SUBCASE("wrong type") {
    Status st = apply(c, "model.layers = \"four\"\n");
    CHECK(mentions(st, "model.layers"));
    CHECK(mentions(st, "wrong type"));
    CHECK(mentions(st, "an integer in [1, 256]"));
  }
  SUBCASE("out of range") {
    Status st = apply_override(c, "model.dropout=1.5");
    CHECK(mentions(st, "model.dropout"));
    CHECK(mentions(st, "out of range"));
    CHECK(mentions(st, "[0.0, 0.99]"));
    CHECK(mentions(apply_override(c, "train.lr=0"), "(0.0, 10.0]"));
  }
  SUBCASE("a method that is not one of the key's, named with the ones that are") {
    Status st = apply_override(c, "pipeline.stage_sync=local");
    CHECK(mentions(st, "pipeline.stage_sync"));
    CHECK(mentions(st, "one of 'ddp' 'diloco' 'streaming_diloco' 'noloco' 'co2'"));
    CHECK(mentions(apply_override(c, "outer.method=sgd"), "'sparseloco' 'muloco'"));
    REQUIRE(apply_override(c, "outer.method=muloco").ok());
    CHECK(c.outer.method == optim::Method::kMuLoCo);
    c.outer.method = before.outer.method;
  }
  SUBCASE("syntax error names the line") {
    Status st = apply(c, "[model]\nlayers = = 3\n");
    CHECK(mentions(st, "test.toml:2"));
  }
  SUBCASE("missing file") {
    Status st = apply_toml_file(c, "/nonexistent/run.toml");
    CHECK(st.code() == ErrorCode::kInvalidArgument);
    CHECK(mentions(st, "/nonexistent/run.toml"));
  }
  SUBCASE("cross-key rule") {
    REQUIRE(apply_override(c, "model.heads=3").ok());
    Status st = validate(c);
    CHECK(mentions(st, "model.width"));
    CHECK(mentions(st, "model.heads"));
  }
  // A failed overlay leaves the config untouched.
  if (c.model.heads != 3) CHECK(to_toml(c) == to_toml(before));
}

TEST_CASE("the effective config round-trips through TOML exactly") {
  RunConfig c;
  REQUIRE(apply_override(c, "train.lr=0.000123456789").ok());
  REQUIRE(apply_override(c, "data.path=a \"quoted\" path").ok());
  REQUIRE(apply_override(c, "model.layers=7").ok());
  const std::string text = to_toml(c);
  RunConfig back;
  REQUIRE(apply(back, text).ok());
  CHECK(to_toml(back) == text);
  CHECK(back.train.lr == c.train.lr);
  CHECK(back.data.path == c.data.path);
  CHECK(config_keys().size() > 20);
}

TEST_CASE("a true-or-false key takes TOML's booleans only, round-trips and shows in the differences") {
  RunConfig c;
  CHECK_FALSE(c.pipeline.enabled);
  REQUIRE(apply_override(c, "pipeline.enabled=true").ok());
  CHECK(c.pipeline.enabled);
  Status st = apply_override(c, "pipeline.enabled=1");
  CHECK(mentions(st, "pipeline.enabled"));
  CHECK(mentions(st, "true or false"));
  CHECK(mentions(apply(c, "[pipeline]\nenabled = \"yes\"\n"), "wrong type"));
  CHECK(c.pipeline.enabled);  // untouched by the refused values
  RunConfig back;
  REQUIRE(apply_toml(back, to_toml(c), "round trip").ok());
  CHECK(back.pipeline.enabled);
  const auto diff = config_differences(RunConfig{}, c);
  REQUIRE(diff.size() == 1);
  CHECK(diff[0] == "pipeline.enabled: false -> true");
}

TEST_CASE("model.preset sets a well-known shape that the other model keys of the same file refine, and round-trips") {
  RunConfig c;
  REQUIRE(apply_override(c, "model.preset=gpt2-124m").ok());
  CHECK(c.model.layers == 12);
  CHECK(c.model.width == 768);
  CHECK(c.model.heads == 12);
  CHECK(c.model.context == 1024);
  REQUIRE(apply_override(c, "model.context=256").ok());  // later keys refine it
  CHECK(c.model.context == 256);
  // In a file the preset applies first, whatever the keys' order.
  RunConfig f;
  REQUIRE(apply_toml(f, "[model]\nlayers = 4\npreset = \"gpt2-350m\"\n", "t").ok());
  CHECK(f.model.layers == 4);
  CHECK(f.model.width == 1024);
  RunConfig back;
  REQUIRE(apply_toml(back, to_toml(f), "round trip").ok());
  CHECK(config_differences(f, back).empty());
  CHECK_FALSE(apply_override(c, "model.preset=gpt5").ok());
  // The GPT-2 small shape has GPT-2's 124M parameters at its vocabulary.
  RunConfig g;
  for (const char* kv : {"model.preset=gpt2-124m", "data.format=tokens", "data.path=x", "data.vocab_size=50257"}) REQUIRE(apply_override(g, kv).ok());
  CHECK(estimate_memory(g, 1).parameters == doctest::Approx(124.44e6).epsilon(0.001));
}

TEST_CASE("outer.state_device: host or device, and on a GPU the memory estimate puts the outer state where it says") {
  RunConfig c;
  CHECK(c.outer.state_device == StateDevice::kHost);
  CHECK_FALSE(apply_override(c, "outer.state_device=gpu").ok());
  for (const char* kv : {"model.preset=gpt2-124m", "data.format=tokens", "data.path=x", "data.vocab_size=50257", "outer.method=diloco"}) {
    REQUIRE(apply_override(c, kv).ok());
  }
  REQUIRE(apply_override(c, "train.device=cpu").ok());
  const MemoryEstimate cpu = estimate_memory(c, 2);
  CHECK_FALSE(cpu.on_gpu);
  CHECK(cpu.host_bytes == cpu.total_bytes);  // on the CPU everything is host memory
  CHECK(cpu.device_bytes == 0);
  CHECK(cpu.outer_bytes == doctest::Approx(2 * 4 * cpu.parameters));  // DiLoCo: outer weights and momentum, fp32
  REQUIRE(apply_override(c, "train.device=cuda:1").ok());  // estimated from the config, whether or not this machine has one
  const MemoryEstimate host = estimate_memory(c, 2);
  CHECK(host.on_gpu);
  // On a GPU the activations are the device's and a checkpoint's buffer is host memory: both count.
  CHECK(cpu.total_bytes == doctest::Approx(2 * cpu.state_bytes + std::max(cpu.activation_bytes, cpu.checkpoint_bytes) + cpu.corpus_bytes));
  CHECK(host.total_bytes == doctest::Approx(2 * host.state_bytes + host.activation_bytes + host.checkpoint_bytes + host.corpus_bytes));
  CHECK(cpu.checkpoint_bytes == doctest::Approx(4 * (3 + 2) * cpu.parameters));  // weights, AdamW's moments, DiLoCo's outer state
  CHECK(host.host_bytes + host.device_bytes == doctest::Approx(host.total_bytes));
  CHECK(host.host_bytes >= 2 * host.outer_bytes);  // both workers' outer state in host memory
  CHECK(host.device_bytes > 2 * 4 * 4 * host.parameters);  // weights, gradients, AdamW's two moments
  REQUIRE(apply_override(c, "outer.state_device=device").ok());
  const MemoryEstimate device = estimate_memory(c, 2);
  // Only the runtime's share and a checkpoint's buffer are left in host memory.
  CHECK(device.host_bytes - device.checkpoint_bytes < 0.1 * (host.host_bytes - host.checkpoint_bytes));
  CHECK(device.device_bytes == doctest::Approx(host.device_bytes + host.host_bytes - device.host_bytes));
}
