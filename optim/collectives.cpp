#include "optim/collectives.h"

#include <torch/torch.h>

#include <span>

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

// Receives one encoded chunk and decodes it straight into `dst` (contiguous fp32, the expected size).
Status recv_into(transport::Link& link, transport::Tag tag, at::Tensor dst, Deadline deadline, CommStats& stats) {
  auto bytes = link.recv(tag, deadline);
  if (!bytes.ok()) return bytes.status();
  stats.bytes_received += bytes->size() + transport::kFrameHeaderBytes;
  auto info = quant::inspect(*bytes, dst.numel());
  if (!info.ok()) return info.status().with_context("chunk from peer " + link.peer().to_string());
  if (info->numel != dst.numel()) {
    return error(ErrorCode::kMalformed, "peer " + link.peer().to_string() + " sent a chunk of " + std::to_string(info->numel) +
                                            " values where " + std::to_string(dst.numel()) + " were expected (group out of step?)");
  }
  return quant::decode_into(*bytes, std::span<float>(dst.data_ptr<float>(), static_cast<std::size_t>(dst.numel())))
      .with_context("chunk from peer " + link.peer().to_string());
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

  // Rank r talks to r+1, r+2, ... in turn (and hears from r-1, r-2, ...), so the ranks do not all
  // queue on rank 0 first.
  auto to = [&](int k) { return (r + k) % m; };
  auto from = [&](int k) { return (r - k + m) % m; };
  // 1. Each chunk, encoded once, to its owner.
  for (int k = 1; k < m; ++k) {
    const int j = to(k);
    if (Status st = send_counted(*g.peers[static_cast<std::size_t>(j)], tag, quant::encode(chunk(flat, j), codec), deadline, stats); !st.ok()) {
      return st.with_context("allreduce: rank " + std::to_string(r) + " sending to rank " + std::to_string(j));
    }
  }
  // 2. The owner accumulates every contribution in fp32, in rank order, and takes the mean.
  const std::int64_t mine = chunk(flat, r).numel();
  at::Tensor contributions = torch::empty({m, mine}, torch::kFloat);  // row j: rank j's contribution
  const bool exact = codec.codec == quant::CodecId::kFp32;  // fp32 round-trips bit for bit: no need to
  if (exact) {                                             // pass our own values through it
    contributions[r].copy_(chunk(flat, r));
  } else {
    const Bytes own = quant::encode(chunk(flat, r), codec);  // our contribution passes the same codec
    Status st = quant::decode_into(own, std::span<float>(contributions[r].data_ptr<float>(), static_cast<std::size_t>(mine)));
    GOSSAMER_CHECK(st.ok(), "allreduce_mean: own payload failed to decode");
  }
  for (int k = 1; k < m; ++k) {
    const int j = from(k);
    if (Status st = recv_into(*g.peers[static_cast<std::size_t>(j)], tag, contributions[j], deadline, stats); !st.ok()) {
      return st.with_context("allreduce: rank " + std::to_string(r) + " receiving from rank " + std::to_string(j));
    }
  }
  at::Tensor acc = contributions[0].clone();
  for (int j = 1; j < m; ++j) acc += contributions[j];  // rank order: the same sum on every rank
  acc /= static_cast<float>(m);
  // 3. The mean, encoded once, to everyone; every rank (the owner too) decodes the same bytes.
  const Bytes mean = quant::encode(acc, codec);
  for (int k = 1; k < m; ++k) {
    const int j = to(k);
    if (Status st = send_counted(*g.peers[static_cast<std::size_t>(j)], tag, mean, deadline, stats); !st.ok()) {
      return st.with_context("allreduce: rank " + std::to_string(r) + " sending the mean to rank " + std::to_string(j));
    }
  }
  at::Tensor out = torch::empty({n}, torch::kFloat);
  if (exact) {
    chunk(out, r).copy_(acc);  // what the others decode from `mean`, bit for bit
  } else {
    at::Tensor mine_out = chunk(out, r);
    Status st = quant::decode_into(mean, std::span<float>(mine_out.data_ptr<float>(), static_cast<std::size_t>(mine_out.numel())));
    GOSSAMER_CHECK(st.ok(), "allreduce_mean: own payload failed to decode");
  }
  for (int k = 1; k < m; ++k) {
    const int j = from(k);
    if (Status st = recv_into(*g.peers[static_cast<std::size_t>(j)], tag, chunk(out, j), deadline, stats); !st.ok()) {
      return st.with_context("allreduce: rank " + std::to_string(r) + " receiving the mean from rank " + std::to_string(j));
    }
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
  at::Tensor theirs = torch::empty({mine.numel()}, torch::kFloat);
  if (Status st = recv_into(peer, tag, theirs, deadline, stats); !st.ok()) return st.with_context("pair exchange");
  stats.seconds = watch.elapsed_seconds();
  if (stats_out != nullptr) *stats_out += stats;
  return theirs.view(mine.sizes());
}

}  // namespace gossamer::optim
