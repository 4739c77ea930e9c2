#include <doctest/doctest.h>

#include <torch/torch.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "quant/codec.h"
#include "quant/device_encode.h"
#include "quant/kernels.h"
#include "quant/reference.h"

using namespace gossamer;
using namespace gossamer::quant;

namespace {

const std::vector<CodecId> kAll = {CodecId::kFp32,    CodecId::kBf16,    CodecId::kInt8,    CodecId::kFp8E4M3, CodecId::kFp8E5M2,
                                   CodecId::kFp16,    CodecId::kInt4,    CodecId::kFp4E3M0, CodecId::kFp4E2M1, CodecId::kInt2};

EncodeOptions opts(CodecId c, std::uint32_t block = 128) {
  EncodeOptions o;
  o.codec = c;
  o.block_size = block;
  return o;
}

at::Tensor roundtrip(const at::Tensor& x, const EncodeOptions& o) {
  auto d = decode(encode(x, o));
  REQUIRE(d.ok());
  return *d;
}

double rel_rmse(const at::Tensor& x, const at::Tensor& y) {
  return ((x - y).pow(2).mean().sqrt() / x.pow(2).mean().sqrt()).item<double>();
}

// Heavy-tailed: Gaussian with a log-normal scale per element (kurtosis far above 3).
at::Tensor heavy_tailed(std::int64_t n, std::uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randn({n}, gen) * torch::exp(1.5 * torch::randn({n}, gen));
}

at::Tensor gaussian(at::IntArrayRef shape, std::uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randn(shape, gen);
}

}  // namespace

TEST_CASE("the codec table is pinned and names resolve") {
  CHECK(codec_table().size() == kNumCodecs);
  for (int i = 0; i < kNumCodecs; ++i) CHECK(static_cast<int>(codec_table()[static_cast<std::size_t>(i)].id) == i);
  CHECK(*codec_from_name("fp4_e2m1") == CodecId::kFp4E2M1);
  CHECK(codec_from_name("fp5").status().code() == ErrorCode::kInvalidArgument);
  CHECK(codec_from_name("fp5").status().message().find("fp8_e4m3") != std::string::npos);
  EncodeOptions o = opts(CodecId::kFp4E3M0, 128);
  CHECK(bits_per_value(o) == 4.25);
  o.scale_format = ScaleFormat::kBf16;
  CHECK(bits_per_value(o) == 4.125);
  CHECK(bits_per_value(opts(CodecId::kInt8, 64)) == 8.5);
  CHECK(bits_per_value(opts(CodecId::kBf16)) == 16);
}

TEST_CASE("fast kernels agree bit for bit with the LibTorch-ops reference") {
  for (CodecId c : kAll) {
    for (std::uint32_t block : {32u, 128u}) {
      for (std::int64_t n : {1, 7, 128, 1001}) {
        CAPTURE(traits(c).name);
        CAPTURE(block);
        CAPTURE(n);
        at::Tensor x = heavy_tailed(n, static_cast<std::uint64_t>(n) * 7 + block);
        if (n == 1001) {  // a first block of exact ties between neighbouring codes, whatever the format
          x.slice(0, 0, block).copy_(
              torch::tensor({2.0f, 1.5f, 3.0f, 6.0f, 12.0f, 0.75f, -0.0f, 0.0f, 24.0f, 1.25f, 2.5f, 5.0f, 10.0f, 20.0f, 48.0f, 64.0f}).repeat({block / 16}));
        }
        const at::Tensor fast = roundtrip(x, opts(c, block));
        const at::Tensor ref = reference::decode(reference::encode(x, c, block), c, block, x.sizes());
        CHECK(torch::equal(fast, ref));
      }
    }
  }
}

TEST_CASE("decoding every code of every scaled codec gives its table value times the block's scale") {
  // Codes an encoder never writes (int8 -128, int4 -8) come from peers all the same; odd block sizes
  // put 4-bit blocks on odd nibbles.
  for (CodecId c : kAll) {
    if (traits(c).bits > 8 || c == CodecId::kBf16) continue;
    const int bits = traits(c).bits;
    const std::size_t codes_n = std::size_t{1} << bits, per_byte = static_cast<std::size_t>(8 / bits);
    const float* table = kernels::code_values(c);
    for (std::uint32_t block : {7u, 128u}) {
      CAPTURE(traits(c).name);
      CAPTURE(block);
      const std::size_t n = 3 * codes_n + 5;
      const std::size_t blocks = (n + block - 1) / block;
      std::vector<float> scale(blocks);
      for (std::size_t b = 0; b < blocks; ++b) scale[b] = 0.25f + 0.125f * static_cast<float>(b % 9);
      std::vector<std::uint8_t> scales(4 * blocks), packed(kernels::packed_bytes(c, n), 0);
      std::memcpy(scales.data(), scale.data(), 4 * blocks);  // fp32 scales, little-endian host
      std::vector<std::uint32_t> code(n);
      for (std::size_t i = 0; i < n; ++i) {
        code[i] = static_cast<std::uint32_t>((i * 37 + 11) % codes_n);
        packed[i / per_byte] = static_cast<std::uint8_t>(packed[i / per_byte] | (code[i] << (bits * (i % per_byte))));
      }
      bool any_invalid = false;
      for (std::size_t i = 0; i < n; ++i) any_invalid = any_invalid || std::isnan(table[code[i]]);
      std::vector<float> out(n);
      const bool ok = kernels::decode_scaled(c, scales.data(), packed.data(), n, block, ScaleFormat::kFp32, out.data());
      CHECK(ok == !any_invalid);
      for (std::size_t i = 0; i < n; ++i) {
        if (std::isnan(table[code[i]])) continue;
        CAPTURE(i);
        CHECK(std::bit_cast<std::uint32_t>(out[i]) == std::bit_cast<std::uint32_t>(table[code[i]] * scale[i / block]));
      }
    }
  }
}

TEST_CASE("fp16 decoding gives fp16_to_float of every finite code and refuses every Inf and NaN") {
  std::vector<std::uint8_t> finite;
  std::vector<float> expected;
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const std::uint8_t bytes[2] = {static_cast<std::uint8_t>(h & 0xFF), static_cast<std::uint8_t>(h >> 8)};
    if ((h & 0x7C00u) == 0x7C00u) {
      float out = 0;
      CHECK_FALSE(kernels::decode_fp16(bytes, 1, &out));
      continue;
    }
    finite.insert(finite.end(), bytes, bytes + 2);
    expected.push_back(kernels::fp16_to_float(static_cast<std::uint16_t>(h)));
  }
  std::vector<float> out(expected.size());
  REQUIRE(kernels::decode_fp16(finite.data(), out.size(), out.data()));
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < out.size(); ++i) mismatches += std::bit_cast<std::uint32_t>(out[i]) != std::bit_cast<std::uint32_t>(expected[i]);
  CHECK(mismatches == 0);
}

TEST_CASE("relative RMSE stays within each codec's budget (docs/quant.md)") {
  // budget on Gaussian, budget on heavy-tailed data; block 128, fp32 scales, round to nearest even.
  struct Budget {
    CodecId codec;
    double gaussian, heavy;
  };
  const std::vector<Budget> budgets = {
      {CodecId::kFp32, 0.0, 0.0},        {CodecId::kBf16, 2.2e-3, 2.2e-3},    {CodecId::kFp16, 2.8e-4, 2.8e-4},
      {CodecId::kInt8, 9.0e-3, 2.5e-2},  {CodecId::kFp8E4M3, 3.3e-2, 2.1e-2}, {CodecId::kFp8E5M2, 6.5e-2, 4.2e-2},
      {CodecId::kInt4, 1.5e-1, 2.4e-1},  {CodecId::kFp4E2M1, 1.4e-1, 1.8e-1}, {CodecId::kFp4E3M0, 2.5e-1, 1.55e-1},
      // int2 clips at 2 RMS on purpose (error feedback carries the rest): near the best 4-level
      // quantizer of a Gaussian (0.343), far from it on heavy tails.
      {CodecId::kInt2, 3.5e-1, 9.0e-1},
  };
  const at::Tensor g = gaussian({1 << 16}, 1), h = heavy_tailed(1 << 16, 2);
  for (const auto& b : budgets) {
    CAPTURE(traits(b.codec).name);
    const double eg = rel_rmse(g, roundtrip(g, opts(b.codec))), eh = rel_rmse(h, roundtrip(h, opts(b.codec)));
    MESSAGE(traits(b.codec).name << ": gaussian " << eg << ", heavy-tailed " << eh);
    CHECK(eg <= b.gaussian);
    CHECK(eh <= b.heavy);
    if (b.codec != CodecId::kFp32) CHECK(eg > 0.0);  // lossy codecs lose something: the measurement is real
  }
}

TEST_CASE("values exactly representable in a format survive bit-exactly") {
  std::mt19937 rng(4);
  for (CodecId c : kAll) {
    CAPTURE(traits(c).name);
    const std::int64_t n = 256;
    at::Tensor x = torch::empty({n});
    auto* p = x.data_ptr<float>();
    const CodecTraits& t = traits(c);
    if (c == CodecId::kInt2) {
      // Its scale is the block's RMS: 24 of every 64 values at +-1.5 and 40 at +-0.5 make it exactly 1
      // level unit (24 x 2.25 + 40 x 0.25 = 64), here 2^-3.
      for (std::int64_t i = 0; i < n; ++i) {
        const float sign = rng() % 2 == 0 ? 1.0f : -1.0f;
        p[i] = sign * (i % 64 < 24 ? 1.5f : 0.5f) * 0.125f;
      }
      CHECK(torch::equal(x, roundtrip(x, opts(c, 64))));
    } else if (t.scaled) {
      // Block of 64 with scale 2^-3: every element is a code's value times the scale, and each block
      // holds the largest magnitude so that absmax / max_magnitude is exactly the scale.
      const float* values = kernels::code_values(c);
      const int codes = 1 << t.bits;
      for (std::int64_t i = 0; i < n; ++i) {
        float v;
        do v = values[rng() % static_cast<unsigned>(codes)];
        while (!(std::fabs(v) <= t.max_magnitude));  // codes the encoder never emits (NaN, int -128) excluded
        p[i] = (i % 64 == 0 ? t.max_magnitude : v) * 0.125f;
      }
      const at::Tensor y = roundtrip(x, opts(c, 64));
      CHECK(torch::equal(x, y));
    } else {
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint32_t bits = rng();
        if (c == CodecId::kBf16) bits &= 0xFFFF0000u;
        float v = std::bit_cast<float>(bits);
        if (c == CodecId::kFp16) v = kernels::fp16_to_float(static_cast<std::uint16_t>(rng()));
        if (!std::isfinite(v)) v = 1.0f;
        p[i] = v;
      }
      CHECK(torch::equal(x, roundtrip(x, opts(c))));
    }
  }
}

TEST_CASE("conversions round to nearest even at the tie points") {
  // bf16: 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1); 1 + 3*2^-8 ties up.
  CHECK(kernels::bf16_to_float(kernels::float_to_bf16(1.0f + 0x1p-8f)) == 1.0f);
  CHECK(kernels::bf16_to_float(kernels::float_to_bf16(1.0f + 3 * 0x1p-8f)) == 1.0f + 0x1p-6f);
  // fp16: the same at 2^-11, subnormals, overflow to Inf like IEEE.
  CHECK(kernels::fp16_to_float(kernels::float_to_fp16(1.0f + 0x1p-11f)) == 1.0f);
  CHECK(kernels::fp16_to_float(kernels::float_to_fp16(0x1p-24f)) == 0x1p-24f);
  CHECK(kernels::fp16_to_float(kernels::float_to_fp16(0x1p-25f)) == 0.0f);
  CHECK(std::isinf(kernels::fp16_to_float(kernels::float_to_fp16(70000.0f))));
  CHECK(kernels::fp16_to_float(kernels::float_to_fp16(65504.0f)) == 65504.0f);
  // Against LibTorch's own conversions on many values.
  const at::Tensor x = heavy_tailed(1 << 14, 9);
  CHECK(torch::equal(roundtrip(x, opts(CodecId::kBf16)), x.to(torch::kBFloat16).to(torch::kFloat)));
  CHECK(torch::equal(roundtrip(x, opts(CodecId::kFp16)), x.to(torch::kHalf).to(torch::kFloat)));
  // fp4 E2M1 holds exactly 0, 0.5, 1, 1.5, 2, 3, 4, 6; 2.5 ties to 2 (even code), 5 ties to 4.
  const at::Tensor v = torch::tensor({6.0f, 2.5f, 5.0f, 0.25f, 0.75f, -1.25f, 3.5f});
  CHECK(torch::equal(roundtrip(v, opts(CodecId::kFp4E2M1)), torch::tensor({6.0f, 2.0f, 4.0f, 0.0f, 1.0f, -1.0f, 4.0f})));
}

TEST_CASE("stochastic rounding is unbiased and reproducible") {
  const at::Tensor x = gaussian({512}, 5);
  for (CodecId c : {CodecId::kInt4, CodecId::kFp4E2M1, CodecId::kFp4E3M0, CodecId::kFp8E4M3, CodecId::kInt8}) {
    CAPTURE(traits(c).name);
    EncodeOptions o = opts(c, 64);
    o.rounding = Rounding::kStochastic;
    const at::Tensor xd = x.to(torch::kDouble);
    at::Tensor sum = torch::zeros_like(xd), sum_sq = torch::zeros_like(xd);
    const int trials = 2000;
    for (int s = 0; s < trials; ++s) {
      o.seed = static_cast<std::uint64_t>(s);
      const at::Tensor err = roundtrip(x, o).to(torch::kDouble) - xd;
      sum += err;
      sum_sq += err * err;
    }
    const at::Tensor mean = sum / trials, sd = (sum_sq / trials - mean * mean).clamp_min(0).sqrt();
    // The signed mean error summed over all elements is within 5 standard errors of zero. (A per-element
    // z-test is unreliable: an element just above a representable value rounds up with tiny
    // probability, so its sample deviation is often exactly zero.)
    const double total = mean.sum().item<double>();
    const double se = std::sqrt((sd * sd).sum().item<double>() / trials);
    INFO("summed mean error " << total << ", standard error " << se);
    CHECK(std::fabs(total) <= 5.0 * se + 1e-6);
    // Round to nearest is biased on the same data (its error does not average out per element).
    const at::Tensor rn_err = (roundtrip(x, opts(c, 64)).to(torch::kDouble) - xd).abs().mean();
    CHECK(mean.abs().mean().item<double>() < 0.2 * rn_err.item<double>());
    o.seed = 77;
    CHECK(torch::equal(roundtrip(x, o), roundtrip(x, o)));
  }
}

TEST_CASE("int2: four levels at +-0.5 and +-1.5 block RMS, stochastic rounding unbiased inside them") {
  // Nearest: in units of the block's RMS (2.22 x r here) the values are 0.27, 1.08, 2.43 (clipped),
  // -0.18, -0.9 and 0, and their levels 0.5, 1.5, 1.5, -0.5, -0.5 and 0.5.
  const float r = 2.0f;
  at::Tensor x = torch::tensor({0.3f, 1.2f, 2.7f, -0.2f, -1.0f, 0.0f, 0.0f, 0.0f}) * r;
  const float rms = std::sqrt((x * x).mean().item<float>());
  const at::Tensor y = roundtrip(x, opts(CodecId::kInt2, 8));
  const at::Tensor levels = torch::tensor({0.5f, 1.5f, 1.5f, -0.5f, -0.5f, 0.5f, 0.5f, 0.5f}) * rms;
  CHECK(torch::allclose(y, levels, 1e-6, 1e-6));
  CHECK(encode(x, opts(CodecId::kInt2, 8)).size() - encode(torch::zeros({0}), opts(CodecId::kInt2, 8)).size() == 4 + 2);  // a scale, 8 codes in 2 bytes
  // Stochastic: values within +-1.5 RMS average to themselves.
  at::Tensor z = gaussian({512}, 6).clamp(-1.0, 1.0);
  EncodeOptions o = opts(CodecId::kInt2, 64);
  o.rounding = Rounding::kStochastic;
  at::Tensor sum = torch::zeros({512}, torch::kDouble);
  const int trials = 2000;
  for (int s = 0; s < trials; ++s) {
    o.seed = static_cast<std::uint64_t>(s);
    sum += roundtrip(z, o).to(torch::kDouble);
  }
  const double bias = (sum / trials - z.to(torch::kDouble)).abs().mean().item<double>();
  const double rn = (roundtrip(z, opts(CodecId::kInt2, 64)) - z).abs().mean().item<double>();
  INFO("mean |bias| " << bias << ", round-to-nearest mean |error| " << rn);
  CHECK(bias < 0.1 * rn);
}

TEST_CASE("payloads describe themselves: dtype, shape and codec come back from the bytes") {
  const at::Tensor x = gaussian({3, 5, 7}, 3).to(torch::kBFloat16);
  for (CodecId c : kAll) {
    const Bytes b = encode(x, opts(c, 16));
    auto info = inspect(b);
    REQUIRE(info.ok());
    CHECK(info->codec == c);
    CHECK(info->shape == std::vector<std::int64_t>{3, 5, 7});
    CHECK(info->numel == 105);
    auto y = decode(b);
    REQUIRE(y.ok());
    CHECK((y->scalar_type() == torch::kBFloat16));
    CHECK(y->sizes() == x.sizes());
  }
  // Scalars and empty tensors.
  CHECK(roundtrip(torch::tensor(3.0f), opts(CodecId::kInt8)).dim() == 0);
  CHECK(roundtrip(torch::empty({0, 4}), opts(CodecId::kFp4E2M1)).sizes() == torch::IntArrayRef({0, 4}));
  // Encoding NaN is a caller bug.
  CHECK_THROWS_AS(encode(torch::tensor({1.0f, NAN}), opts(CodecId::kInt8)), ContractError);
  CHECK_THROWS_AS(encode(torch::tensor({1.0f, INFINITY}), opts(CodecId::kFp32)), ContractError);
}

TEST_CASE("zstd wraps any codec, is recorded in the header and shrinks redundant data") {
  at::Tensor x = torch::zeros({1 << 14});
  x.slice(0, 0, 100).copy_(gaussian({100}, 8));
  for (CodecId c : kAll) {
    EncodeOptions o = opts(c);
    const Bytes plain = encode(x, o);
    o.zstd = true;
    const Bytes packed = encode(x, o);
    CHECK(packed.size() < plain.size() / 4);
    CHECK(inspect(packed)->zstd);
    CHECK(torch::equal(*decode(packed), *decode(plain)));
  }
}

TEST_CASE("golden bytes pin the payload format of every codec") {
  const at::Tensor x = torch::tensor({1.0f, -0.5f, 0.3f, 2.0f, -3.25f, 0.0f});
  const std::vector<std::pair<CodecId, std::string>> golden = {
#include "golden_payloads.inc"
  };
  REQUIRE(golden.size() == kAll.size());
  for (const auto& [c, hex] : golden) {
    CAPTURE(traits(c).name);
    const Bytes b = encode(x, opts(c, 4));
    std::string got;
    for (auto byte : b) {
      static constexpr char kHex[] = "0123456789abcdef";
      got += kHex[static_cast<int>(byte) >> 4];
      got += kHex[static_cast<int>(byte) & 15];
    }
    CHECK(got == hex);
  }
}

TEST_CASE("decode_add adds exactly what decode returns, for every codec and odd block sizes") {
  for (CodecId c : kAll) {
    for (std::uint32_t block : {std::uint32_t{128}, std::uint32_t{7}}) {
      for (std::int64_t n : {std::int64_t{1}, std::int64_t{8191}, std::int64_t{20011}}) {
        CAPTURE(traits(c).name);
        CAPTURE(block);
        CAPTURE(n);
        const at::Tensor x = torch::randn({n});
        EncodeOptions o = opts(c, block);
        o.zstd = n == 20011 && block == 7;
        const Bytes payload = encode(x, o);
        at::Tensor acc = torch::randn({n});
        const at::Tensor expected = acc + roundtrip(x, o);
        REQUIRE(decode_add(payload, std::span<float>(acc.data_ptr<float>(), static_cast<std::size_t>(n))).ok());
        CHECK(torch::equal(acc, expected));
      }
    }
  }
}

TEST_CASE("decode_add refuses NaN in an fp32 payload") {
  at::Tensor x = torch::ones({64});
  Bytes payload = encode(x, opts(CodecId::kFp32));
  const float nan = std::nanf("");
  std::memcpy(payload.data() + payload.size() - 4 * 10, &nan, 4);
  at::Tensor acc = torch::zeros({64});
  Status st = decode_add(payload, std::span<float>(acc.data_ptr<float>(), 64));
  CHECK(st.code() == ErrorCode::kMalformed);
}

namespace {
std::span<float> span_of(at::Tensor& t) { return {t.data_ptr<float>(), static_cast<std::size_t>(t.numel())}; }
std::span<const float> cspan_of(const at::Tensor& t) { return {t.data_ptr<float>(), static_cast<std::size_t>(t.numel())}; }
}  // namespace

TEST_CASE("mean_into is decode_into of the first term, decode_add of the rest and a division, bit for bit") {
  // All fp32 (the one-pass path, over several blocks and a partial one) and with a lossy codec among
  // them (term by term); own values first, in the middle and absent.
  for (CodecId c : {CodecId::kFp32, CodecId::kInt8}) {
    for (int own_at : {0, 2, -1}) {
      for (std::int64_t n : {std::int64_t{1}, std::int64_t{5000}}) {
        CAPTURE(traits(c).name);
        CAPTURE(own_at);
        CAPTURE(n);
        const int k = 4;
        std::vector<at::Tensor> x;
        std::vector<Bytes> payloads(k);
        std::vector<MeanTerm> terms(k);
        for (int t = 0; t < k; ++t) {
          x.push_back(gaussian({n}, 100 + static_cast<std::uint64_t>(t)) * (t + 1));
          if (t == own_at) {
            terms[static_cast<std::size_t>(t)].values = cspan_of(x.back());
          } else {
            payloads[static_cast<std::size_t>(t)] = encode(x.back(), opts(t == 1 ? c : CodecId::kFp32));
            terms[static_cast<std::size_t>(t)].payload = payloads[static_cast<std::size_t>(t)];
          }
        }
        at::Tensor expected = torch::empty({n});
        for (int t = 0; t < k; ++t) {
          const auto ts = static_cast<std::size_t>(t);
          if (t == own_at) {
            if (t == 0) {
              expected.copy_(x[ts]);
            } else {
              expected.add_(x[ts]);
            }
          } else {
            REQUIRE((t == 0 ? decode_into(payloads[ts], span_of(expected)) : decode_add(payloads[ts], span_of(expected))).ok());
          }
        }
        expected.div_(static_cast<float>(k));
        at::Tensor out = torch::full({n}, 7.0f);
        std::ptrdiff_t failed = 99;
        REQUIRE(mean_into(terms, static_cast<float>(k), span_of(out), failed).ok());
        CHECK(failed == -1);
        CHECK(torch::equal(out, expected));
      }
    }
  }
}

TEST_CASE("mean_into names the term that holds NaN, and refuses a mean that overflows") {
  const std::int64_t n = 3000;
  at::Tensor a = torch::ones({n}), b = torch::ones({n});
  Bytes pa = encode(a, opts(CodecId::kFp32)), pb = encode(b, opts(CodecId::kFp32));
  const float nan = std::nanf("");
  std::memcpy(pb.data() + pb.size() - 4 * 10, &nan, 4);  // late in the last block
  at::Tensor out = torch::empty({n});
  std::ptrdiff_t failed = 99;
  std::vector<MeanTerm> terms = {{pa, {}}, {pb, {}}};
  Status st = mean_into(terms, 2.0f, span_of(out), failed);
  CHECK(st.code() == ErrorCode::kMalformed);
  CHECK(failed == 1);

  at::Tensor own = torch::ones({n});
  own[5] = std::numeric_limits<float>::infinity();
  terms = {{pa, {}}, {{}, cspan_of(own)}};
  CHECK(mean_into(terms, 2.0f, span_of(out), failed).code() == ErrorCode::kMalformed);
  CHECK(failed == 1);

  // Every value finite, the sum not: a peer cannot make the owner produce (or throw on) an Inf mean.
  at::Tensor huge = torch::full({n}, 3.0e38f);
  Bytes ph = encode(huge, opts(CodecId::kFp32));
  terms = {{ph, {}}, {ph, {}}};
  st = mean_into(terms, 2.0f, span_of(out), failed);
  CHECK(st.code() == ErrorCode::kOutOfRange);
  CHECK(failed == -1);
}

TEST_CASE("encode_view gives encode's bytes in two pieces, borrowing an fp32 tensor's storage") {
  const at::Tensor t = torch::randn({3, 50});
  for (int c = 0; c < kNumCodecs; ++c) {
    EncodeOptions o;
    o.codec = static_cast<CodecId>(c);
    CAPTURE(c);
    const EncodedView v = encode_view(t, o);
    Bytes joined = v.head;
    joined.insert(joined.end(), v.body.begin(), v.body.end());
    CHECK((joined == encode(t, o)));
    if (o.codec == CodecId::kFp32) {
      CHECK(static_cast<const void*>(v.body.data()) == t.data_ptr());  // no copy
      CHECK(v.body.size() == 150 * 4);
    } else {
      CHECK(v.body.empty());
    }
  }
  EncodeOptions fp32;
  CHECK(encode_view(t.t(), fp32).body.empty());  // not contiguous: encoded whole
  at::Tensor bad = t.clone();
  bad[1][2] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS(encode_view(bad, fp32));
}

TEST_CASE("encode_view of a span of floats is encode_view of the same values as a 1-D tensor") {
  const at::Tensor t = torch::randn({150});
  for (int c = 0; c < kNumCodecs; ++c) {
    EncodeOptions o;
    o.codec = static_cast<CodecId>(c);
    CAPTURE(c);
    const EncodedView a = encode_view(std::span<const float>(t.data_ptr<float>(), 150), o), b = encode_view(t, o);
    CHECK((a.head == b.head));
    CHECK(a.body.data() == b.body.data());  // fp32 borrows the same memory; the others have no body
    CHECK(a.body.size() == b.body.size());
  }
  std::vector<float> bad(8, 1.0f);
  bad[3] = std::numeric_limits<float>::infinity();
  CHECK_THROWS(encode_view(std::span<const float>(bad), EncodeOptions{}));
}

TEST_CASE("encoding with LibTorch ops (as on a GPU) writes the CPU kernels' bytes") {
  // Values on the formats' edges too: zeros of both signs, powers of two (where an exponent taken by
  // a logarithm could be off by one), halfway points, tiny values on the subnormal grid.
  at::Tensor edges = torch::tensor({0.0f, -0.0f, 1.0f, -2.0f, 0.5f, 0.75f, 1.5f, 3.0f, 6.0f, 448.0f, 0x1p-10f, -0x1p-20f, 1e-30f, 7.0f, 0.25f});
  edges = torch::cat({edges, edges * 3.0f, torch::zeros({40})});
  for (CodecId c : kAll) {
    for (ScaleFormat sf : {ScaleFormat::kFp32, ScaleFormat::kBf16}) {
      for (std::uint32_t block : {7u, 32u, 128u}) {
        for (std::int64_t n : {1, 2, 3, 128, 1001, 20011}) {
          EncodeOptions o = opts(c, block);
          o.scale_format = sf;
          o.zstd = n == 1001;
          if (!device::covers(o)) continue;
          CAPTURE(traits(c).name);
          CAPTURE(static_cast<int>(sf));
          CAPTURE(block);
          CAPTURE(n);
          at::Tensor x = heavy_tailed(n, static_cast<std::uint64_t>(n) * 11 + block);
          if (n > static_cast<std::int64_t>(edges.numel())) x.slice(0, 0, edges.numel()).copy_(edges);
          const Bytes host = encode(x.view({1, n}), o, EncodePath::kHostKernels);
          CHECK((encode(x.view({1, n}), o, EncodePath::kTensorOps) == host));
          CHECK((encode(x.to(at::kBFloat16), o, EncodePath::kTensorOps) == encode(x.to(at::kBFloat16), o, EncodePath::kHostKernels)));
        }
      }
    }
  }
  // What the tensor ops do not cover is refused when forced, and kAuto keeps CPU tensors on the kernels.
  EncodeOptions stochastic = opts(CodecId::kInt8);
  stochastic.rounding = Rounding::kStochastic;
  CHECK_FALSE(device::covers(stochastic));
  CHECK_FALSE(device::covers(opts(CodecId::kFp32)));
  CHECK_THROWS_AS((void)encode(gaussian({64}, 3), stochastic, EncodePath::kTensorOps), ContractError);
  CHECK_THROWS_AS((void)encode(torch::full({9}, std::nanf("")), opts(CodecId::kInt4), EncodePath::kTensorOps), ContractError);
  CHECK((encode(gaussian({64}, 3), opts(CodecId::kInt4)) == encode(gaussian({64}, 3), opts(CodecId::kInt4), EncodePath::kHostKernels)));
}
