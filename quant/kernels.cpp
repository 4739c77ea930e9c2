#include "quant/kernels.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/check.h"

namespace gossamer::quant::kernels {

namespace {

inline std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }
inline float float_of(std::uint32_t b) { return std::bit_cast<float>(b); }

// Counter-based uniform 32-bit draw for element i: the same whatever the blocking or threading.
inline std::uint32_t draw(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<std::uint32_t>((z ^ (z >> 31)) >> 32);
}

// Round to nearest even for |v| < 2^22 (adds and removes 1.5 * 2^23).
inline float rne(float v) {
  constexpr float kMagic = 12582912.0f;
  return (v + kMagic) - kMagic;
}

// A small float format: M mantissa bits, exponent bias, largest code (magnitude), the smallest normal
// value, and the subnormal step 2^(1 - bias - M).
struct MiniFloat {
  int mbits;
  int bias;
  std::uint32_t max_code;
  int sign_shift;
  float min_normal;
  float sub_step;
};

constexpr MiniFloat kE4M3{3, 7, 0x7E, 7, 0x1p-6f, 0x1p-9f};     // OCP fp8 E4M3 (fn): max 448, no Inf
constexpr MiniFloat kE5M2{2, 15, 0x7B, 7, 0x1p-14f, 0x1p-16f};  // fp8 E5M2: max 57344 (Inf/NaN codes unused)
constexpr MiniFloat kE2M1{1, 1, 0x7, 3, 1.0f, 0.5f};           // OCP MX fp4 E2M1: 0, 0.5 ... 6
constexpr MiniFloat kE3M0{0, 7, 0x7, 3, 0x1p-6f, 0x1p-6f};     // fp4 E3M0: 0, 2^-6 ... 2^0

const MiniFloat& minifloat(CodecId c) {
  switch (c) {
    case CodecId::kFp8E4M3: return kE4M3;
    case CodecId::kFp8E5M2: return kE5M2;
    case CodecId::kFp4E2M1: return kE2M1;
    default: return kE3M0;
  }
}

std::array<float, 256> build_code_values(const MiniFloat& f, int total_bits) {
  std::array<float, 256> v{};
  const int n = 1 << total_bits;
  const std::uint32_t mag_mask = (1u << f.sign_shift) - 1u;
  for (int c = 0; c < n; ++c) {
    const std::uint32_t mag = static_cast<std::uint32_t>(c) & mag_mask;
    float value;
    if (mag > f.max_code) {
      value = std::numeric_limits<float>::quiet_NaN();  // Inf/NaN codes and codes beyond the max
    } else if ((mag >> f.mbits) == 0) {
      value = static_cast<float>(mag) * f.sub_step;
    } else {
      const int e = static_cast<int>(mag >> f.mbits) - f.bias;
      const float m = 1.0f + static_cast<float>(mag & ((1u << f.mbits) - 1u)) / static_cast<float>(1u << f.mbits);
      value = std::ldexp(m, e);
    }
    v[static_cast<std::size_t>(c)] = (static_cast<std::uint32_t>(c) >> f.sign_shift) & 1u ? -value : value;
  }
  return v;
}

std::array<float, 256> build_int_values(int total_bits) {
  std::array<float, 256> v{};
  const int n = 1 << total_bits;
  for (int c = 0; c < n; ++c) {
    // Two's complement of total_bits bits.
    const int s = c >= n / 2 ? c - n : c;
    v[static_cast<std::size_t>(c)] = static_cast<float>(s);
  }
  return v;
}

// A minifloat code's value computed from its bits (what build_code_values tabulates, bit for bit):
// a normal's exponent and mantissa fields shifted into a float's and rebiased, a subnormal as
// mantissa times the step, then the sign. Integer work and one select, so a loop over codes
// vectorizes where a table lookup per element does not. `invalid` is set for codes beyond the max.
struct MiniFloatDecoder {
  std::uint32_t mag_mask, max_code, sign_shift, mbits, shift, exp_offset;
  float sub_step;

  explicit MiniFloatDecoder(const MiniFloat& f)
      : mag_mask((1u << f.sign_shift) - 1u),
        max_code(f.max_code),
        sign_shift(static_cast<std::uint32_t>(f.sign_shift)),
        mbits(static_cast<std::uint32_t>(f.mbits)),
        shift(static_cast<std::uint32_t>(23 - f.mbits)),
        exp_offset(static_cast<std::uint32_t>(127 - f.bias) << 23),
        sub_step(f.sub_step) {}

  [[gnu::always_inline]] float operator()(std::uint32_t c, std::uint32_t& invalid) const {
    const std::uint32_t mag = c & mag_mask;
    invalid |= static_cast<std::uint32_t>(mag > max_code);
    const std::uint32_t normal = (mag << shift) + exp_offset;
    const std::uint32_t sub = std::bit_cast<std::uint32_t>(static_cast<float>(static_cast<std::int32_t>(mag)) * sub_step);
    const std::uint32_t is_sub = 0u - static_cast<std::uint32_t>((mag >> mbits) == 0);
    return std::bit_cast<float>((sub & is_sub) | (normal & ~is_sub) | (((c >> sign_shift) & 1u) << 31));
  }
};

inline void store_scale(ScaleFormat f, float s, std::uint8_t* out) {
  if (f == ScaleFormat::kBf16) {
    const std::uint16_t b = float_to_bf16(s);
    out[0] = static_cast<std::uint8_t>(b & 0xFF);
    out[1] = static_cast<std::uint8_t>(b >> 8);
  } else {
    const std::uint32_t b = bits_of(s);
    for (int i = 0; i < 4; ++i) out[i] = static_cast<std::uint8_t>(b >> (8 * i));
  }
}

inline float load_scale(ScaleFormat f, const std::uint8_t* in) {
  if (f == ScaleFormat::kBf16) return bf16_to_float(static_cast<std::uint16_t>(in[0] | (in[1] << 8)));
  std::uint32_t b = 0;
  for (int i = 0; i < 4; ++i) b |= static_cast<std::uint32_t>(in[i]) << (8 * i);
  return float_of(b);
}

// The block scale as stored: absmax / max_magnitude, rounded up in bf16 so no value overflows.
inline float block_scale(float absmax, float max_magnitude, ScaleFormat f) {
  float s = absmax / max_magnitude;
  if (f == ScaleFormat::kBf16 && s > 0.0f) {
    float r = bf16_to_float(float_to_bf16(s));
    if (r < s) r = bf16_to_float(static_cast<std::uint16_t>(float_to_bf16(s) + 1));
    s = r;
  }
  return s;
}

// Codes (one byte per element, sign included) of x[0..n) for a minifloat format. Branch-free and in
// 32-bit signed arithmetic so GCC vectorizes it even for baseline x86-64.
template <bool Stochastic>
[[gnu::always_inline]] inline void minifloat_codes(const MiniFloat& f, const float* x, std::size_t n, float inv, std::uint64_t seed, std::uint64_t first,
                     std::uint8_t* out) {
  const int drop = 23 - f.mbits;
  const std::int32_t half = (1 << (drop - 1)) - 1;
  const std::int32_t offset = (127 - f.bias) << f.mbits;
  const std::int32_t max_code = static_cast<std::int32_t>(f.max_code);
  const float sub_inv = 1.0f / f.sub_step;  // a power of two: exact
  const float min_normal = f.min_normal;
  const int sign_shift = f.sign_shift;
  for (std::size_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float y = std::fabs(v) * inv;
    const std::int32_t b = std::bit_cast<std::int32_t>(y);
    std::int32_t add;
    float q;
    if constexpr (Stochastic) {
      const std::uint32_t r = draw(seed, first + i);
      add = static_cast<std::int32_t>(r >> (32 - drop));
      q = std::floor(y * sub_inv + static_cast<float>(r >> 8) * 0x1p-24f);
    } else {
      add = half + ((b >> drop) & 1);
      q = rne(y * sub_inv);
    }
    const std::int32_t normal = ((b + add) >> drop) - offset;
    const std::int32_t sub = static_cast<std::int32_t>(q);
    // Selects as bit masks: keeps the loop free of control flow, so it vectorizes.
    const std::int32_t is_sub = -static_cast<std::int32_t>(y < min_normal);
    std::int32_t code = (sub & is_sub) | (normal & ~is_sub);
    const std::int32_t over = code - max_code;
    code = max_code + (over & (over >> 31));  // min(code, max_code)
    code |= static_cast<std::int32_t>(std::bit_cast<std::uint32_t>(v) >> 31) << sign_shift;
    out[i] = static_cast<std::uint8_t>(code);
  }
}

// Two's complement codes of round(x * inv) clamped to [-qmax, qmax].
template <bool Stochastic>
[[gnu::always_inline]] inline void int_codes(int qmax, const float* x, std::size_t n, float inv, std::uint64_t seed, std::uint64_t first, std::uint8_t* out) {
  for (std::size_t i = 0; i < n; ++i) {
    float q;
    if constexpr (Stochastic) {
      q = std::floor(x[i] * inv + static_cast<float>(draw(seed, first + i) >> 8) * 0x1p-24f);
    } else {
      q = rne(x[i] * inv);
    }
    // |x * inv| <= qmax (+ rounding), so the conversion is safe; clamp with masks to stay vectorizable.
    std::int32_t c = static_cast<std::int32_t>(q);
    const std::int32_t over = c - qmax, under = c + qmax;
    c = qmax + (over & (over >> 31));      // min(c, qmax)
    c = c - (under & (under >> 31));       // max(c, -qmax)
    out[i] = static_cast<std::uint8_t>(c);
  }
}

// Writes byte codes for elements [k, k + n) into the code stream: as is for 8-bit codecs, packed two
// per byte (lower index in the low nibble) for 4-bit ones.
[[gnu::always_inline]] inline void store_codes(const std::uint8_t* tmp, std::size_t k, std::size_t n, bool four_bit, std::uint8_t* codes) {
  if (!four_bit) {
    std::memcpy(codes + k, tmp, n);
    return;
  }
  std::size_t i = 0;
  if ((k & 1u) != 0 && n > 0) {  // odd start: finish the shared byte
    codes[k >> 1] = static_cast<std::uint8_t>((codes[k >> 1] & 0x0F) | ((tmp[0] & 0x0F) << 4));
    i = 1;
  }
  std::uint8_t* out = codes + ((k + i) >> 1);
  const std::size_t pairs = (n - i) / 2;
  for (std::size_t p = 0; p < pairs; ++p) {
    out[p] = static_cast<std::uint8_t>((tmp[i + 2 * p] & 0x0F) | ((tmp[i + 2 * p + 1] & 0x0F) << 4));
  }
  if (((n - i) & 1u) != 0) out[pairs] = static_cast<std::uint8_t>(tmp[n - 1] & 0x0F);
}

// Largest |x| of a block; `finite` is cleared if any element is NaN or Inf.
// Works on the magnitudes' bit patterns, which order like the values for non-negative floats: an
// integer max, which GCC vectorizes (a float max with NaN semantics it does not).
[[gnu::always_inline]] inline float block_absmax(const float* x, std::size_t n, bool& finite) {
  std::uint32_t m = 0, bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t a = std::bit_cast<std::uint32_t>(x[i]) & 0x7FFFFFFFu;
    m = a > m ? a : m;
    bad |= static_cast<std::uint32_t>(a >= 0x7F800000u);
  }
  if (bad != 0) finite = false;
  return std::bit_cast<float>(m);
}

}  // namespace

std::uint16_t float_to_bf16(float x) {
  const std::uint32_t b = bits_of(x);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((b >> 16) | 0x40u);  // quiet NaN
  return static_cast<std::uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

float bf16_to_float(std::uint16_t b) { return float_of(static_cast<std::uint32_t>(b) << 16); }

std::uint16_t float_to_fp16(float x) {
  std::uint32_t f = bits_of(x);
  const std::uint32_t sign = (f >> 16) & 0x8000u;
  f &= 0x7FFFFFFFu;
  std::uint32_t h;
  if (f >= 0x47800000u) {  // >= 65536, Inf or NaN
    h = f > 0x7F800000u ? 0x7E00u : 0x7C00u;
  } else if (f < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    // Adding 0.5 aligns the half's subnormal grid with the float's last mantissa bits; the FPU rounds.
    h = bits_of(float_of(f) + 0.5f) - 0x3F000000u;
  } else {
    const std::uint32_t odd = (f >> 13) & 1u;
    f += (static_cast<std::uint32_t>(15 - 127) << 23) + 0xFFFu + odd;
    h = f >> 13;  // a carry out of the mantissa bumps the exponent; past the max it gives Inf
  }
  return static_cast<std::uint16_t>(h | sign);
}

float fp16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  float v;
  if (exp == 0) {
    v = static_cast<float>(man) * 0x1p-24f;
  } else if (exp == 31) {
    v = man == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  } else {
    v = float_of(((exp + 127 - 15) << 23) | (man << 13));
  }
  return float_of(bits_of(v) | sign);
}

bool decode_bf16(const std::uint8_t* in, std::size_t n, float* out) {
  std::uint32_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t b = static_cast<std::uint32_t>(in[2 * i]) | (static_cast<std::uint32_t>(in[2 * i + 1]) << 8);
    bad |= static_cast<std::uint32_t>((b & 0x7F80u) == 0x7F80u);
    out[i] = float_of(b << 16);
  }
  return bad == 0;
}

// IEEE half precision read as a minifloat (10 mantissa bits, bias 15): fp16_to_float's values, bit
// for bit, without its branches or a table, so the loop vectorizes. Inf and NaN (exponent 31) are
// the codes beyond the largest finite one.
[[gnu::target_clones("avx2", "default")]] bool decode_fp16(const std::uint8_t* in, std::size_t n, float* out) {
  constexpr MiniFloat kHalf{10, 15, 0x7BFF, 15, 0x1p-14f, 0x1p-24f};
  const MiniFloatDecoder half(kHalf);
  std::uint32_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t h = static_cast<std::uint32_t>(in[2 * i]) | (static_cast<std::uint32_t>(in[2 * i + 1]) << 8);
    out[i] = half(h, bad);
  }
  return bad == 0;
}

[[gnu::target_clones("avx2", "default")]] bool copy_finite_fp32(const std::uint8_t* in, std::size_t n, float* out) {
  std::uint32_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t b;
    std::memcpy(&b, in + 4 * i, 4);  // little-endian host (checked in codec.cpp)
    bad |= static_cast<std::uint32_t>((b & 0x7F800000u) == 0x7F800000u);
    out[i] = std::bit_cast<float>(b);
  }
  return bad == 0;
}

[[gnu::target_clones("avx2", "default")]] bool add_fp32(const std::uint8_t* in, std::size_t n, float* acc) {
  std::uint32_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t b;
    std::memcpy(&b, in + 4 * i, 4);
    bad |= static_cast<std::uint32_t>((b & 0x7F800000u) == 0x7F800000u);
    acc[i] += std::bit_cast<float>(b);
  }
  return bad == 0;
}

[[gnu::target_clones("avx2", "default")]] bool divide_finite_fp32(float* x, std::size_t n, float divisor) {
  std::uint32_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float v = x[i] / divisor;
    bad |= static_cast<std::uint32_t>((std::bit_cast<std::uint32_t>(v) & 0x7F800000u) == 0x7F800000u);
    x[i] = v;
  }
  return bad == 0;
}

[[gnu::target_clones("avx2", "default")]] bool check_finite_fp32(const std::uint8_t* in, std::size_t n) {
  std::uint32_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t b;
    std::memcpy(&b, in + 4 * i, 4);  // little-endian host (checked in codec.cpp)
    bad |= static_cast<std::uint32_t>((b & 0x7F800000u) == 0x7F800000u);
  }
  return bad == 0;
}

namespace {
bool check_finite_16(const std::uint8_t* in, std::size_t n, std::uint32_t exp_mask) {
  std::uint32_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t h = static_cast<std::uint32_t>(in[2 * i]) | (static_cast<std::uint32_t>(in[2 * i + 1]) << 8);
    bad |= static_cast<std::uint32_t>((h & exp_mask) == exp_mask);
  }
  return bad == 0;
}
}  // namespace

bool check_finite_bf16(const std::uint8_t* in, std::size_t n) { return check_finite_16(in, n, 0x7F80u); }
bool check_finite_fp16(const std::uint8_t* in, std::size_t n) { return check_finite_16(in, n, 0x7C00u); }

std::size_t scale_bytes(ScaleFormat f) {
  switch (f) {
    case ScaleFormat::kFp32: return 4;
    case ScaleFormat::kBf16: return 2;
    case ScaleFormat::kNone: return 0;
  }
  return 0;
}

std::size_t packed_bytes(CodecId codec, std::size_t n) {
  const int bits = traits(codec).bits;
  if (bits == 2) return (n + 3) / 4;
  return bits == 4 ? (n + 1) / 2 : n * static_cast<std::size_t>(bits / 8);
}

const float* code_values(CodecId codec) {
  static const std::array<float, 256> e4m3 = build_code_values(kE4M3, 8);
  static const std::array<float, 256> e5m2 = build_code_values(kE5M2, 8);
  static const std::array<float, 256> e2m1 = build_code_values(kE2M1, 4);
  static const std::array<float, 256> e3m0 = build_code_values(kE3M0, 4);
  static const std::array<float, 256> i8 = build_int_values(8);
  static const std::array<float, 256> i4 = build_int_values(4);
  static const std::array<float, 256> i2 = {-1.5f, -0.5f, 0.5f, 1.5f};
  switch (codec) {
    case CodecId::kInt2: return i2.data();
    case CodecId::kFp8E4M3: return e4m3.data();
    case CodecId::kFp8E5M2: return e5m2.data();
    case CodecId::kFp4E2M1: return e2m1.data();
    case CodecId::kFp4E3M0: return e3m0.data();
    case CodecId::kInt8: return i8.data();
    case CodecId::kInt4: return i4.data();
    default: break;
  }
  GOSSAMER_CHECK(false, "code_values: codec has no code table");
  return nullptr;
}

namespace {

// int2 (format.h): the block's scale is its RMS, as stored; code = clamp(floor(x / scale) + 2, 0, 3)
// (the nearest of the levels (code - 1.5) x scale), or with stochastic rounding the level below or
// above x at odds that make the code unbiased within the levels' range. Four codes per byte, the lower
// index in the low bits.
bool encode_int2(const float* x, std::size_t n, std::uint32_t block, ScaleFormat scale_format, Rounding rounding, std::uint64_t seed,
                 std::uint8_t* scales, std::uint8_t* codes) {
  const std::size_t sb = scale_bytes(scale_format);
  const bool stochastic = rounding == Rounding::kStochastic;
  bool finite = true;
  std::fill(codes, codes + packed_bytes(CodecId::kInt2, n), std::uint8_t{0});
  for (std::size_t start = 0, b = 0; start < n; start += block, ++b) {
    const std::size_t len = std::min<std::size_t>(block, n - start);
    const float* xb = x + start;
    double squares = 0.0;  // in double: no finite float's square overflows it, so NaN or Inf shows here
    for (std::size_t i = 0; i < len; ++i) squares += static_cast<double>(xb[i]) * xb[i];
    if (!std::isfinite(squares)) finite = false;
    float scale = static_cast<float>(std::sqrt(squares / static_cast<double>(len)));
    if (scale_format == ScaleFormat::kBf16) scale = bf16_to_float(float_to_bf16(scale));
    store_scale(scale_format, scale, scales + b * sb);
    const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    for (std::size_t i = 0; i < len; ++i) {
      const std::size_t k = start + i;
      const float t = xb[i] * inv;
      float q = stochastic ? std::floor(t + 1.5f + static_cast<float>(draw(seed, k) >> 8) * 0x1p-24f) : std::floor(t) + 2.0f;
      q = std::clamp(q, 0.0f, 3.0f);  // a NaN only comes from a NaN, and finite is already false then
      codes[k >> 2] = static_cast<std::uint8_t>(codes[k >> 2] | (static_cast<std::uint32_t>(q) << (2 * (k & 3u))));
    }
  }
  return finite;
}

}  // namespace

// Compiled twice, for AVX2 and for baseline x86-64; the loader picks the one the CPU runs.
[[gnu::target_clones("avx2", "default")]] bool encode_scaled(CodecId codec, const float* x, std::size_t n, std::uint32_t block, ScaleFormat scale_format,
                   Rounding rounding, std::uint64_t seed, std::uint8_t* scales, std::uint8_t* codes) {
  if (codec == CodecId::kInt2) return encode_int2(x, n, block, scale_format, rounding, seed, scales, codes);
  const CodecTraits& t = traits(codec);
  const bool four_bit = t.bits == 4;
  const bool is_int = codec == CodecId::kInt8 || codec == CodecId::kInt4;
  const bool stochastic = rounding == Rounding::kStochastic;
  const MiniFloat& f = minifloat(codec);
  const int qmax = static_cast<int>(t.max_magnitude);
  const std::size_t sb = scale_bytes(scale_format);
  constexpr std::size_t kChunk = 2048;
  std::uint8_t tmp[kChunk];
  bool finite = true;
  for (std::size_t start = 0, b = 0; start < n; start += block, ++b) {
    const std::size_t len = std::min<std::size_t>(block, n - start);
    const float* xb = x + start;
    const float absmax = block_absmax(xb, len, finite);
    const float scale = block_scale(absmax, t.max_magnitude, scale_format);
    store_scale(scale_format, scale, scales + b * sb);
    const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    // The block is still in L1: quantize it now, a chunk at a time.
    for (std::size_t c = 0; c < len; c += kChunk) {
      const std::size_t m = std::min(kChunk, len - c);
      const std::size_t k = start + c;
      if (is_int) {
        stochastic ? int_codes<true>(qmax, xb + c, m, inv, seed, k, tmp) : int_codes<false>(qmax, xb + c, m, inv, seed, k, tmp);
      } else {
        stochastic ? minifloat_codes<true>(f, xb + c, m, inv, seed, k, tmp) : minifloat_codes<false>(f, xb + c, m, inv, seed, k, tmp);
      }
      store_codes(tmp, k, m, four_bit, codes);
    }
  }
  return finite;
}

namespace {

// A 4-bit two's complement code, sign-extended.
[[gnu::always_inline]] inline float int4_value(std::uint32_t nibble) {
  return static_cast<float>(static_cast<std::int32_t>(nibble << 28) >> 28);
}

// Decodes n codes of 8 (or, with FourBit, 4) bits starting at element `first` of the code stream
// (4-bit: two per byte, the lower index in the low nibble) into value(code) * scale.
template <bool FourBit, typename Value>
[[gnu::always_inline]] inline void decode_codes(const std::uint8_t* codes, std::size_t first, std::size_t n, float scale, Value value, float* out) {
  if constexpr (!FourBit) {
    const std::uint8_t* cb = codes + first;
    for (std::size_t i = 0; i < n; ++i) out[i] = value(cb[i]) * scale;
  } else {
    std::size_t i = 0;
    if ((first & 1u) != 0 && n > 0) {  // an odd start (odd block sizes): the high nibble of a shared byte
      out[0] = value(static_cast<std::uint32_t>(codes[first >> 1] >> 4)) * scale;
      i = 1;
    }
    const std::uint8_t* cb = codes + ((first + i) >> 1);
    const std::size_t pairs = (n - i) / 2;
    float* o = out + i;
    for (std::size_t p = 0; p < pairs; ++p) {
      const std::uint32_t c = cb[p];
      o[2 * p] = value(c & 0x0Fu) * scale;
      o[2 * p + 1] = value(c >> 4) * scale;
    }
    if (((n - i) & 1u) != 0) o[2 * pairs] = value(cb[pairs] & 0x0Fu) * scale;  // an odd tail: a low nibble
  }
}

}  // namespace

// Value times scale, then the finiteness check over the block. Codes become values by arithmetic
// (integer codes by conversion, minifloats from their bits), not by a table lookup per element.
[[gnu::target_clones("avx2", "default")]] bool decode_scaled(CodecId codec, const std::uint8_t* scales, const std::uint8_t* codes, std::size_t n, std::uint32_t block,
                   ScaleFormat scale_format, float* out) {
  const std::size_t sb = scale_bytes(scale_format);
  const MiniFloatDecoder minifloat_of(minifloat(codec));
  std::uint32_t bad = 0;
  for (std::size_t start = 0, b = 0; start < n; start += block, ++b) {
    const std::size_t len = std::min<std::size_t>(block, n - start);
    const float scale = load_scale(scale_format, scales + b * sb);
    bad |= static_cast<std::uint32_t>(!(scale >= 0.0f && scale <= FLT_MAX));
    float* ob = out + start;
    std::uint32_t invalid = 0;
    switch (codec) {
      case CodecId::kInt8:
        decode_codes<false>(codes, start, len, scale, [](std::uint32_t c) { return static_cast<float>(static_cast<std::int8_t>(c)); }, ob);
        break;
      case CodecId::kInt4:
        decode_codes<true>(codes, start, len, scale, int4_value, ob);
        break;
      case CodecId::kInt2:
        for (std::size_t i = 0; i < len; ++i) {
          const std::size_t k = start + i;
          ob[i] = (static_cast<float>((codes[k >> 2] >> (2 * (k & 3u))) & 3u) - 1.5f) * scale;
        }
        break;
      case CodecId::kFp8E4M3:
      case CodecId::kFp8E5M2:
        decode_codes<false>(codes, start, len, scale, [&](std::uint32_t c) { return minifloat_of(c, invalid); }, ob);
        break;
      default:
        decode_codes<true>(codes, start, len, scale, [&](std::uint32_t c) { return minifloat_of(c, invalid); }, ob);
    }
    bad |= invalid;
    for (std::size_t i = 0; i < len; ++i) bad |= static_cast<std::uint32_t>(!(std::fabs(ob[i]) <= FLT_MAX));
  }
  return bad == 0;
}

}  // namespace gossamer::quant::kernels
