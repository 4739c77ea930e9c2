// libFuzzer target: a kept update as a newcomer decodes it (runtime::update_values, runtime::decode_update)
// on arbitrary bytes, with a bound of 4096 values. An accepted update must hold at most the bound,
// decode into exactly its values, all finite, and re-encode to its bytes when it is an fp32 one.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/wire.h"
#include "records.h"
#include "runtime/update_codec.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  using namespace gossamer;
  if (fuzz::seeds_wanted()) {
    std::vector<float> v(300);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 17) - 8.0f;
    fuzz::write_seed("fp32", runtime::encode_update(v));
    // Two fp32 quantized payloads (quant/codec.h's layout), of 100 and 200 values.
    auto payload = [&](std::size_t from, std::size_t n) {
      Writer w;
      w.raw(as_bytes("GQNT"));
      for (std::uint8_t b : {1, 0, 0, 0, 1, 0}) w.u8(b);  // version, codec fp32, dtype, flags, ndim, no scales
      w.u16(0);
      w.u32(0);
      w.i64(static_cast<std::int64_t>(n));
      w.u64(n * 4);
      w.raw(ByteView(reinterpret_cast<const std::byte*>(v.data() + from), n * 4));
      return std::move(w).take();
    };
    std::vector<Bytes> payloads{payload(0, 100), payload(100, 200)};
    fuzz::write_seed("payloads", runtime::encode_update(v, payloads));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gossamer;
  const ByteView bytes(reinterpret_cast<const std::byte*>(data), size);
  auto n = runtime::update_values(bytes, 4096);
  if (!n.ok()) return 0;
  if (*n < 0 || *n > 4096) __builtin_trap();
  std::vector<float> out(static_cast<std::size_t>(*n));
  if (!runtime::decode_update(bytes, out).ok()) return 0;
  for (float f : out) {
    if (!std::isfinite(f)) __builtin_trap();
  }
  if (size == runtime::kUpdateHeaderBytes + out.size() * 4 && bytes[5] == std::byte{0}) {
    const Bytes again = runtime::encode_update(out);
    if (again.size() != size || !std::equal(again.begin(), again.end(), bytes.begin())) __builtin_trap();
  }
  return 0;
}
