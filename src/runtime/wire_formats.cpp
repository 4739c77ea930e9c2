#include "runtime/wire_formats.h"

#include <cstring>
#include <sstream>

#include <torch/torch.h>

#include "core/clock.h"
#include "model/safetensors.h"
#include "optim/state_io.h"
#include "quant/codec.h"
#include "quant/format.h"
#include "quant/sparse.h"
#include "runtime/announcements.h"
#include "runtime/coordinator_messages.h"
#include "runtime/link_probe.h"
#include "runtime/pipeline_agreement.h"
#include "runtime/state_sync_parts.h"
#include "runtime/update_codec.h"
#include "train/checkpoint.h"
#include "train/run.h"
#include "train/worker.h"
#include "train/pipeline_wire.h"
#include "transport/gossip_core.h"
#include "transport/protocol.h"
#include "transport/reach_probe.h"
#include "transport/relay.h"
#include "transport/tags.h"

namespace gossamer::runtime {

namespace {

std::string hex_tag(transport::Tag tag) {
  std::ostringstream out;
  out << "tag 0x" << std::hex << tag;
  return out.str();
}

// Values that are the same on every machine: a ramp, not a random draw.
at::Tensor ramp(std::vector<std::int64_t> shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return torch::arange(n, torch::kFloat32).mul_(0.37f).sin_().reshape(shape);
}

template <typename T>
Status status_of(const Result<T>& r) {
  return r.ok() ? Status() : r.status();
}

// A clock that stands still: a gossip node's messages then carry the same times on every run.
class StillClock final : public Clock {
 public:
  Nanos now() const override { return Nanos(1'000'000'000); }
  void sleep_until(Nanos) override {}
};

StillClock& still_clock() {
  static StillClock clock;
  return clock;
}

transport::GossipOptions gossip_options(std::uint64_t self, const std::string& seed) {
  transport::GossipOptions o;
  o.self = transport::PeerId{self};
  o.seeds = {seed};
  return o;
}

// A broadcast of node 101 that has heard node 202 (so the message carries its member news too).
Bytes gossip_sample() {
  transport::GossipCore a(gossip_options(101, "tcp://192.0.2.2:7000"), "tcp://192.0.2.1:7000", still_clock(), 1);
  transport::GossipCore b(gossip_options(202, "tcp://192.0.2.1:7000"), "tcp://192.0.2.2:7000", still_clock(), 2);
  for (auto& s : b.tick()) (void)a.handle(s.message, "192.0.2.2");
  GOSSAMER_CHECK(a.broadcast("gossamer.round", as_bytes(std::string_view("the run goes on"))).ok(), "the wire registry's gossip sample");
  const auto sends = a.take_broadcasts();
  GOSSAMER_CHECK(!sends.empty(), "the wire registry's gossip sample: nothing to send");
  return sends.front().message;
}

// A message a fresh node takes (ok) or drops (the reason is counted; here an error).
Status gossip_decode(ByteView bytes) {
  transport::GossipCore c(gossip_options(303, "tcp://192.0.2.1:7000"), "tcp://192.0.2.3:7000", still_clock(), 3);
  (void)c.handle(bytes, "192.0.2.1");
  if (c.dropped() > 0) return error(ErrorCode::kMalformed, "the gossip node dropped the message");
  return Status();
}

std::vector<WireFormat> transport_rows() {
  std::vector<WireFormat> rows;
  rows.push_back({"Gossip messages", "transport/gossip_core.h", "ZeroMQ, gossip's port", transport::GossipCore::kWireVersion, 64 * 1024 + 1024,
                  gossip_sample, gossip_decode});
  rows.push_back({"HELLO", "transport/protocol.h", "first bytes of a connection", transport::kWireMajor, transport::kHelloBytes,
                  [] {
                    transport::Hello h;
                    h.capabilities = transport::kCapEncrypted;
                    h.peer = transport::PeerId{0x0123456789ABCDEFull};
                    for (std::size_t i = 0; i < h.run.bytes.size(); ++i) h.run.bytes[i] = static_cast<std::uint8_t>(i * 7);
                    return transport::encode_hello(h);
                  },
                  [](ByteView b) { return status_of(transport::decode_hello(b)); }});
  rows.push_back({"Frames", "transport/protocol.h", "every message on a link", transport::kWireMajor, transport::kFrameHeaderBytes,
                  [] {
                    Bytes out(transport::kFrameHeaderBytes);
                    transport::encode_frame_header(transport::FrameHeader{transport::FrameType::kData, 0, transport::tags::kDiLoCo | 7u, 1234},
                                                   reinterpret_cast<std::uint8_t*>(out.data()));
                    return out;
                  },
                  [](ByteView b) { return status_of(transport::decode_frame_header(b, std::uint64_t{1} << 40)); }});
  rows.push_back({"Dial-back requests", "transport/reach_probe.h", "beside gossip on its port", transport::kReachVersion, 4096,
                  [] {
                    transport::ReachRequest r;
                    r.nonce = 0xFEEDFACE;
                    r.requester = transport::PeerId{42};
                    r.addresses = {"198.51.100.7:7000", "0.0.0.0:7001"};
                    return transport::encode_reach_request(r);
                  },
                  [](ByteView b) { return status_of(transport::decode_reach_request(b)); }});
  rows.push_back({"Dial-back answers", "transport/reach_probe.h", "beside gossip on its port", transport::kReachVersion, 4096,
                  [] {
                    transport::ReachAnswer a;
                    a.nonce = 0xFEEDFACE;
                    a.observed_ip = "203.0.113.9";
                    a.results = {transport::ReachResult{transport::ReachOutcome::kReached, ""},
                                 transport::ReachResult{transport::ReachOutcome::kUnreached, "connection refused"}};
                    return transport::encode_reach_answer(a);
                  },
                  [](ByteView b) { return status_of(transport::decode_reach_answer(b)); }});
  rows.push_back({"Relay requests", "transport/relay.h", "first bytes of a connection to a relay", transport::kRelayVersion, transport::kRelayRequestBytes,
                  [] {
                    transport::RelayRequest r;
                    r.from = transport::PeerId{1};
                    r.to = transport::PeerId{2};
                    r.session = 77;
                    r.relay = transport::PeerId{3};
                    r.time_ms = 1'800'000'000'000ull;
                    for (std::size_t i = 0; i < r.nonce.size(); ++i) r.nonce[i] = static_cast<std::uint8_t>(i);
                    return transport::encode_relay_request(r, std::nullopt);
                  },
                  [](ByteView b) { return status_of(transport::decode_relay_request(b, std::nullopt)); }});
  rows.push_back({"Relay answers", "transport/relay.h", "a relay's answer to a request", transport::kRelayVersion, 8,
                  [] { return transport::encode_relay_answer(transport::RelayStatus::kPaired); },
                  [](ByteView b) { return status_of(transport::decode_relay_answer(b)); }});
  return rows;
}

std::vector<WireFormat> tensor_rows() {
  std::vector<WireFormat> rows;
  rows.push_back({"Quantized tensors", "quant/codec.h", "inside collectives, updates and activations", quant::kPayloadVersion, std::size_t{1} << 36,
                  [] {
                    quant::EncodeOptions o;
                    o.codec = quant::CodecId::kInt8;
                    return quant::encode(ramp({3, 70}), o);
                  },
                  [](ByteView b) { return status_of(quant::decode(b)); }});
  rows.push_back({"Sparse tensors", "quant/sparse.h", hex_tag(transport::tags::kSparseLoCo) + " | round", quant::kSparseVersion, std::size_t{1} << 36,
                  [] {
                    const at::Tensor v = ramp({300});
                    quant::SparseOptions o;
                    o.chunk = 128;
                    o.topk = 8;
                    return quant::encode_sparse(std::span<const float>(v.data_ptr<float>(), 300), o);
                  },
                  [](ByteView b) {
                    std::vector<float> acc(300, 0.0f);
                    return quant::decode_sparse_add(b, acc);
                  }});
  rows.push_back({"Kept updates", "src/runtime/update_codec.h", "state transfer answers", kUpdateVersion, std::size_t{1} << 36,
                  [] {
                    const at::Tensor v = ramp({64});
                    return encode_update(std::span<const float>(v.data_ptr<float>(), 64));
                  },
                  [](ByteView b) {
                    std::vector<float> out(64);
                    return decode_update(b, out);
                  }});
  rows.push_back({"Activations", "src/train/pipeline_wire.h", hex_tag(transport::tags::kPipeline) + " | iteration", train::kActivationVersion,
                  std::size_t{1} << 36,
                  [] {
                    train::ActivationHeader h;
                    h.iteration = 9;
                    h.microbatch = 2;
                    h.hop = 1;
                    quant::EncodeOptions o;
                    o.codec = quant::CodecId::kFp32;
                    return train::encode_activation(h, ramp({2, 4, 8}), o);
                  },
                  [](ByteView b) { return status_of(train::decode_activation(b, train::ActivationLimits{2, 4, 8})); }});
  return rows;
}

std::vector<WireFormat> file_rows() {
  std::vector<WireFormat> rows;
  rows.push_back({"Checkpoints", "src/train/checkpoint.h", "file", train::kCheckpointVersion, std::size_t{1} << 40,
                  [] {
                    train::CheckpointState s;
                    s.config_toml = "[train]\nsteps = 10\n";
                    s.step = 5;
                    s.next_batch = 6;
                    s.tokens_seen = 640;
                    s.rng_state = Bytes(8, std::byte{3});
                    s.outer_state = Bytes(16, std::byte{4});
                    s.shard = 1;
                    s.shards = 2;
                    s.tensors = Bytes(32, std::byte{5});
                    return train::encode_checkpoint(s);
                  },
                  [](ByteView b) { return status_of(train::decode_checkpoint(b, "sample")); }});
  rows.push_back({"safetensors", "src/model/safetensors.h", "file", 1, std::size_t{1} << 40,
                  [] { return model::encode_safetensors({model::NamedTensor{"w", ramp({2, 3})}}, {{"format", "pt"}}); },
                  [](ByteView b) { return status_of(model::decode_safetensors(b)); }});
  rows.push_back({"State requests", "src/runtime/state_sync.h", hex_tag(transport::tags::kStateRequest), state_sync_parts::kVersion, 14,
                  [] { return state_sync_parts::request(state_sync_parts::kAskChunk, 12, 3); },
                  [](ByteView b) { return status_of(state_sync_parts::decode_request(b, "sample")); }});
  rows.push_back({"State answers", "src/runtime/state_sync.h", hex_tag(transport::tags::kStateResponse), state_sync_parts::kVersion,
                  state_sync_parts::kMaxChunk + 64 + 6,
                  [] { return state_sync_parts::answer(Bytes(40, std::byte{9})); },
                  [](ByteView b) { return status_of(state_sync_parts::decode_answer(b, "sample")); }});
  rows.push_back({"Link probe rows", "src/runtime/link_probe.h", hex_tag(transport::tags::kPipelineProbeRow), kRowVersion, 1 << 20,
                  [] {
                    ProbeRow r;
                    r.forward_s = 0.25;
                    r.latency_s = {0.01, 0.04};
                    r.bandwidth_Bps = {1.25e7, 6.25e6};
                    return encode_probe_row(r);
                  },
                  [](ByteView b) { return status_of(decode_probe_row(b, 4, 1)); }});
  return rows;
}

// A worker of a tiny model, whose inner optimizer's state is the sample (before its first step: the
// same bytes on every machine) and takes the decoded bytes.
train::Worker& tiny_worker() {
  static const train::RunConfig config = [] {
    train::RunConfig c;
    c.model.layers = 1;
    c.model.width = 8;
    c.model.heads = 2;
    c.model.context = 4;
    c.data.synthetic.bytes = 4000;
    c.train.batch_size = 2;
    return c;
  }();
  static const train::Corpus corpus = [] {
    auto loaded = train::load_corpus(config);
    GOSSAMER_CHECK(loaded.ok(), "the wire registry's tiny corpus: " + loaded.status().to_string());
    return std::move(*loaded);
  }();
  static train::Worker worker(config, corpus.dataset, 0, 1, real_clock());
  return worker;
}

std::vector<WireFormat> run_rows() {
  std::vector<WireFormat> rows;
  rows.push_back({"Run spec", "src/runtime/announcements.h", "gossip topic gossamer.spec", announcement_wire::kSpecVersion, kMaxSpec + 64,
                  [] { return announcement_wire::encode_spec(Spec{"[model]\npreset = \"gpt2-124m\"\n", 4}, 17, true); },
                  [](ByteView b) { return status_of(announcement_wire::decode_spec(b, "sample")); }});
  rows.push_back({"Join board", "src/runtime/announcements.h", "gossip topic gossamer.state", announcement_wire::kBoardVersion, 2 + 8 + 8 + 4 + 256,
                  [] { return announcement_wire::encode_board({announcement_wire::kOffer, 0x1234, 42, "198.51.100.7:7001", 0}); },
                  [](ByteView b) { return status_of(announcement_wire::decode_board(b, "sample")); }});
  rows.push_back({"Round agreement", "src/runtime/coordinator.h", "gossip topic gossamer.round", coordinator_parts::kVersion, 320,
                  [] {
                    return coordinator_parts::encode_ready(9, 4, 120, transport::PeerId{0x1234}, 4, coordinator_parts::kUnlinked,
                                                           "198.51.100.7:7001");
                  },
                  [](ByteView b) { return coordinator_parts::check_round_message(b); }});
  rows.push_back({"Round agreement, GROUP", "src/runtime/coordinator.h", "gossip topic gossamer.round", coordinator_parts::kVersion, 64 * 1024,
                  [] {
                    const std::vector<MemberInfo> before = {{transport::PeerId{3}, "198.51.100.3:7001"}, {transport::PeerId{5}, "198.51.100.5:7001"}};
                    GroupView g;
                    g.round = 9;
                    g.epoch = 5;
                    g.leader = transport::PeerId{3};
                    g.prior = 4;
                    g.members = {{transport::PeerId{3}, "198.51.100.3:7001"}, {transport::PeerId{7}, ""}};  // 5 left, 7 (behind NAT) came
                    return coordinator_parts::encode_group(g, 4, &before);
                  },
                  [](ByteView b) { return coordinator_parts::check_round_message(b); }});
  rows.push_back({"Pipeline commits", "src/runtime/pipeline_agreement.h", hex_tag(transport::tags::kPipelineCommit), pipeline_agreement::kVersion, 9,
                  [] { return pipeline_agreement::encode_commit(12); },
                  [](ByteView b) { return status_of(pipeline_agreement::decode_commit(b, "sample")); }});
  rows.push_back({"Pipeline views", "src/runtime/pipeline_agreement.h", hex_tag(transport::tags::kPipelineView), pipeline_agreement::kVersion, 9 + 4096,
                  [] { return pipeline_agreement::encode_view({7, {true, true, false, true}}); },
                  [](ByteView b) { return status_of(pipeline_agreement::decode_view(b, 4, "sample")); }});
  rows.push_back({"Outer optimizer state", "optim/state_io.h", "state transfer answers, checkpoints", optim::kStateFormatVersion, std::size_t{1} << 36,
                  [] { return optim::save_state("diloco", {3, 1}, {ramp({4, 3}), ramp({5})}); },
                  [](ByteView b) {
                    std::vector<std::int64_t> counters(2);
                    std::vector<at::Tensor> tensors{torch::zeros({4, 3}), torch::zeros({5})};
                    return optim::load_state(b, "diloco", counters, tensors);
                  }});
  rows.push_back({"The inner optimizer's state", "src/train/worker.h", "state transfer answers (ddp)", train::Worker::kOptimizerStateVersion,
                  std::size_t{1} << 36, [] { return tiny_worker().optimizer_state(); },
                  [](ByteView b) { return tiny_worker().load_optimizer_state(b); }});
  return rows;
}

}  // namespace

std::vector<WireFormat> wire_formats() {
  std::vector<WireFormat> rows = transport_rows();
  for (auto* part : {&tensor_rows, &file_rows, &run_rows}) {
    auto more = (*part)();
    for (auto& r : more) rows.push_back(std::move(r));
  }
  return rows;
}

}  // namespace gossamer::runtime
