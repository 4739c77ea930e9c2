#include <doctest/doctest.h>

#include <torch/torch.h>

#include <cstring>
#include <random>

#include "model/gpt.h"
#include "model/safetensors.h"
#include "model/sample.h"

using namespace gossamer;
using namespace gossamer::model;

namespace {

GptConfig small() {
  GptConfig c;
  c.context = 16;
  c.layers = 2;
  c.width = 32;
  c.heads = 4;
  return c;
}

// A file from a header JSON and data bytes, laid out as the format says.
Bytes file_of(const std::string& json, std::size_t data_bytes) {
  Bytes out(8 + json.size() + data_bytes, std::byte{0});
  const std::uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<std::byte>((n >> (8 * i)) & 0xFF);
  std::memcpy(out.data() + 8, json.data(), json.size());
  return out;
}

}  // namespace

TEST_CASE("safetensors: a GPT's weights round-trip bit for bit, with names, shapes and metadata") {
  Gpt gpt(small());
  std::vector<NamedTensor> tensors;
  for (const auto& p : gpt.named_parameters()) tensors.push_back({p.name, p.tensor});
  tensors.push_back({"half", torch::randn({3, 5}).to(torch::kBFloat16)});
  tensors.push_back({"ids", torch::arange(7, torch::kLong)});
  tensors.push_back({"empty", torch::empty({0, 4})});
  const Bytes file = encode_safetensors(tensors, {{"format", "pt"}, {"step", "150"}});
  // The header is 8-byte aligned JSON, as the format's readers expect.
  std::uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  CHECK(n % 8 == 0);
  auto back = decode_safetensors(file);
  REQUIRE_MESSAGE(back.ok(), back.status().to_string());
  REQUIRE(back->tensors.size() == tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    CHECK(back->tensors[i].name == tensors[i].name);
    CHECK((back->tensors[i].tensor.scalar_type() == tensors[i].tensor.scalar_type()));
    CHECK(torch::equal(back->tensors[i].tensor, tensors[i].tensor.detach()));
  }
  CHECK(back->metadata.at("step") == "150");
  // The data is exactly the tensors' bytes.
  std::size_t bytes = 0;
  for (const auto& t : tensors) bytes += static_cast<std::size_t>(t.tensor.numel() * t.tensor.element_size());
  CHECK(file.size() == 8 + n + bytes);
}

TEST_CASE("safetensors: every malformed file is refused, none crashes") {
  auto refused = [](const Bytes& file, const std::string& words) {
    auto r = decode_safetensors(file);
    REQUIRE_FALSE(r.ok());
    INFO(r.status().message());
    CHECK(r.status().code() == ErrorCode::kMalformed);
    CHECK(r.status().message().find(words) != std::string::npos);
  };
  refused(Bytes(4), "shorter than");
  Bytes huge(16, std::byte{0});
  huge[3] = std::byte{0x7F};  // a header length of about 2 GB
  refused(huge, "exceeds the cap");
  Bytes past = file_of("{}", 0);
  past[0] = std::byte{40};
  refused(past, "runs past the end");
  refused(file_of("not json", 0), "not JSON");
  refused(file_of("[1, 2]", 0), "not a JSON object");
  refused(file_of(R"({"a": {"dtype": "F32", "shape": [2]}})", 8), "lacks");
  refused(file_of(R"({"a": {"dtype": "F7", "shape": [2], "data_offsets": [0, 8]}})", 8), "does not know");
  refused(file_of(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8), "needs 12 bytes");
  refused(file_of(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4), "outside the data");
  refused(file_of(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", 8), "outside the data");
  refused(file_of(R"({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8), "bad dimension");
  refused(file_of(R"({"a": {"dtype": "U8", "shape": [1099511627776, 1099511627776, 1099511627776], "data_offsets": [0, 8]}})", 8), "impossibly large");
  refused(file_of(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12),
          "overlaps");
  refused(file_of(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 12), "after its last tensor");
  refused(file_of(R"({"__metadata__": {"k": 1}})", 0), "not a string");
  // Random damage to a good file: refused or decoded, never a crash.
  Gpt gpt(small());
  std::vector<NamedTensor> tensors;
  for (const auto& p : gpt.named_parameters()) tensors.push_back({p.name, p.tensor});
  const Bytes good = encode_safetensors(tensors);
  std::mt19937 rng(11);
  int refused_count = 0;
  for (int i = 0; i < 300; ++i) {
    Bytes bad = good;
    const std::size_t header_end = 8 + 2000;
    for (int k = 0; k < 3; ++k) bad[rng() % header_end] = static_cast<std::byte>(rng());
    if (i % 3 == 0) bad.resize(rng() % bad.size());
    if (!decode_safetensors(bad).ok()) ++refused_count;
  }
  CHECK(refused_count >= 100);  // every truncated file at least
}

TEST_CASE("sampling: the same seed gives the same tokens, another seed others, temperature 0 the most likely") {
  Gpt gpt(small());
  SampleOptions o;
  o.tokens = 30;
  o.seed = 7;
  const std::vector<std::int64_t> prompt = {'a', 'b'};
  const auto a = sample(gpt, prompt, o), b = sample(gpt, prompt, o);
  CHECK(a == b);
  CHECK(a.size() == 30);
  o.seed = 8;
  CHECK(sample(gpt, prompt, o) != a);
  // Longer than the context: the window slides.
  o.tokens = 40;
  CHECK(sample(gpt, prompt, o).size() == 40);
  // Greedy: each token is the argmax of the model's logits for the text so far.
  o.temperature = 0;
  o.tokens = 5;
  const auto greedy = sample(gpt, prompt, o);
  std::vector<std::int64_t> text = prompt;
  torch::NoGradGuard no_grad;
  gpt.train(false);
  for (auto t : greedy) {
    auto logits = gpt.forward(torch::tensor(text, torch::kLong).unsqueeze(0));
    CHECK(logits.index({0, -1}).argmax().item<std::int64_t>() == t);
    text.push_back(t);
  }
  // top-k 1 is greedy too.
  o.temperature = 1.0;
  o.top_k = 1;
  CHECK(sample(gpt, prompt, o) == greedy);
}
