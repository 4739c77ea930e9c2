#include "optim/collectives.h"

#include <torch/torch.h>

#include "core/check.h"
#include "quant/codec.h"
#include "transport/protocol.h"

namespace gossamer::optim {

CommStats& CommStats::operator+=(const CommStats& o) {
  bytes_sent += o.bytes_sent;
  bytes_received += o.bytes_received;
  seconds += o.seconds;
  return *this;
}

namespace {

std::int64_t chunk_begin(std::int64_t n, int size, int j) { return n * j / size; }

Status send_counted(transport::Link& link, transport::Tag tag, const Bytes& payload, Deadline deadline, CommStats& stats) {
  Status st = link.send(tag, payload, deadline);
  if (st.ok()) stats.bytes_sent += payload.size() + transport::kFrameHeaderBytes;
  return st;
}

Result<at::Tensor> recv_chunk(transport::Link& link, transport::Tag tag, std::int64_t expected, Deadline deadline, CommStats& stats) {
  auto bytes = link.recv(tag, deadline);
  if (!bytes.ok()) return bytes.status();
  stats.bytes_received += bytes->size() + transport::kFrameHeaderBytes;
  auto t = quant::decode(*bytes, expected);
  if (!t.ok()) return t.status().with_context("chunk from peer " + link.peer().to_string());
  if (t->numel() != expected) {
    return error(ErrorCode::kMalformed, "peer " + link.peer().to_string() + " sent a chunk of " + std::to_string(t->numel()) +
                                            " values where " + std::to_string(expected) + " were expected (group out of step?)");
  }
  return t->to(at::kFloat).reshape({-1});
}

}  // namespace

Status allreduce_mean(const Group& g, at::Tensor& tensor, const quant::EncodeOptions& codec, transport::Tag tag, Deadline deadline,
                      CommStats* stats_out) {
  GOSSAMER_CHECK(g.size >= 1 && g.rank >= 0 && g.rank < g.size, "allreduce_mean: rank outside the group");
  GOSSAMER_CHECK(static_cast<int>(g.peers.size()) == g.size, "allreduce_mean: the group needs one link slot per rank");
  GOSSAMER_CHECK(tensor.is_floating_point(), "allreduce_mean: floating-point tensors only");
  Stopwatch watch(real_clock());
  CommStats stats;
  if (g.size == 1) return Status();
  const at::Tensor flat = tensor.detach().to(at::kCPU, at::kFloat).contiguous().reshape({-1});
  const std::int64_t n = flat.numel();
  const int r = g.rank, m = g.size;
  auto chunk = [&](const at::Tensor& t, int j) { return t.slice(0, chunk_begin(n, m, j), chunk_begin(n, m, j + 1)); };
  for (int j = 0; j < m; ++j) GOSSAMER_CHECK(j == r || g.peers[static_cast<std::size_t>(j)], "allreduce_mean: no link to rank " + std::to_string(j));

  // 1. Each chunk, encoded once, to its owner.
  for (int j = 0; j < m; ++j) {
    if (j == r) continue;
    if (Status st = send_counted(*g.peers[static_cast<std::size_t>(j)], tag, quant::encode(chunk(flat, j), codec), deadline, stats); !st.ok()) {
      return st.with_context("allreduce: rank " + std::to_string(r) + " sending to rank " + std::to_string(j));
    }
  }
  // 2. The owner accumulates every contribution in fp32, in rank order, and takes the mean.
  const std::int64_t mine = chunk(flat, r).numel();
  at::Tensor acc = torch::zeros({mine}, torch::kFloat);
  for (int j = 0; j < m; ++j) {
    if (j == r) {
      auto own = quant::decode(quant::encode(chunk(flat, r), codec));  // our contribution passes the same codec
      GOSSAMER_CHECK(own.ok(), "allreduce_mean: own payload failed to decode");
      acc += own->to(at::kFloat).reshape({-1});
      continue;
    }
    auto c = recv_chunk(*g.peers[static_cast<std::size_t>(j)], tag, mine, deadline, stats);
    if (!c.ok()) return c.status().with_context("allreduce: rank " + std::to_string(r) + " receiving from rank " + std::to_string(j));
    acc += *c;
  }
  acc /= static_cast<float>(m);
  // 3. The mean, encoded once, to everyone; every rank (the owner too) decodes the same bytes.
  const Bytes mean = quant::encode(acc, codec);
  for (int j = 0; j < m; ++j) {
    if (j == r) continue;
    if (Status st = send_counted(*g.peers[static_cast<std::size_t>(j)], tag, mean, deadline, stats); !st.ok()) {
      return st.with_context("allreduce: rank " + std::to_string(r) + " sending the mean to rank " + std::to_string(j));
    }
  }
  at::Tensor out = torch::empty({n}, torch::kFloat);
  auto own_mean = quant::decode(mean);
  GOSSAMER_CHECK(own_mean.ok(), "allreduce_mean: own payload failed to decode");
  chunk(out, r).copy_(own_mean->reshape({-1}));
  for (int j = 0; j < m; ++j) {
    if (j == r) continue;
    auto c = recv_chunk(*g.peers[static_cast<std::size_t>(j)], tag, chunk(out, j).numel(), deadline, stats);
    if (!c.ok()) return c.status().with_context("allreduce: rank " + std::to_string(r) + " receiving the mean from rank " + std::to_string(j));
    chunk(out, j).copy_(*c);
  }
  // Only now, with every chunk in hand, does the caller's tensor change.
  tensor.copy_(out.view(tensor.sizes()));
  stats.seconds = watch.elapsed_seconds();
  if (stats_out != nullptr) *stats_out += stats;
  return Status();
}

Result<at::Tensor> pair_exchange(transport::Link& peer, const at::Tensor& mine, const quant::EncodeOptions& codec, transport::Tag tag,
                                 Deadline deadline, CommStats* stats_out) {
  Stopwatch watch(real_clock());
  CommStats stats;
  if (Status st = send_counted(peer, tag, quant::encode(mine, codec), deadline, stats); !st.ok()) return st.with_context("pair exchange");
  auto theirs = recv_chunk(peer, tag, mine.numel(), deadline, stats);
  if (!theirs.ok()) return theirs.status().with_context("pair exchange");
  stats.seconds = watch.elapsed_seconds();
  if (stats_out != nullptr) *stats_out += stats;
  return theirs->view(mine.sizes());
}

}  // namespace gossamer::optim
