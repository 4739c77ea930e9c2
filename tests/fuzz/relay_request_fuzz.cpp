// libFuzzer target: the relay's request and answer (transport/relay.h) and the dial-back messages
// (transport/reach_probe.h), all read from connections anyone can open. A request is taken only with
// the run key's tag and then re-encodes to its bytes; decoded dial-back messages re-encode to theirs,
// and a helper dials nothing but the request's own IP.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "transport/reach_probe.h"
#include "transport/relay.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gossamer;
  using namespace gossamer::transport;
  static const RunKey key = [] {
    RunKey k;
    for (std::size_t i = 0; i < k.bytes.size(); ++i) k.bytes[i] = static_cast<std::uint8_t>(i * 13 + 1);
    return k;
  }();
  const ByteView bytes(reinterpret_cast<const std::byte*>(data), size);
  for (const auto& k : {std::optional<RunKey>(key), std::optional<RunKey>()}) {
    auto req = decode_relay_request(bytes, k);
    if (req.ok() && !(encode_relay_request(*req, k) == Bytes(bytes.begin(), bytes.end()))) std::abort();
  }
  if (auto answer = decode_relay_answer(bytes); answer.ok() && !(encode_relay_answer(*answer) == Bytes(bytes.begin(), bytes.end()))) std::abort();
  if (auto request = decode_reach_request(bytes); request.ok()) {
    if (request->addresses.empty() || request->addresses.size() > kMaxReachAddresses) std::abort();
    if (!(encode_reach_request(*request) == Bytes(bytes.begin(), bytes.end()))) std::abort();
    for (const auto& a : request->addresses) {
      auto target = reach_target(a, "192.0.2.9");
      if (target.ok() && target->rfind("192.0.2.9:", 0) != 0) std::abort();  // only the request's own IP is dialled
    }
  }
  if (auto answer = decode_reach_answer(bytes); answer.ok() && !(encode_reach_answer(*answer) == Bytes(bytes.begin(), bytes.end()))) std::abort();
  return 0;
}
