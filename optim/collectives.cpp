#include "optim/collectives.h"

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <span>

#include <spdlog/spdlog.h>

#include "core/check.h"
#include "quant/codec.h"
#include "quant/kernels.h"
#include "optim/collective_parts.h"
#include "transport/protocol.h"

namespace gossamer::optim {

CommStats& CommStats::operator+=(const CommStats& o) {
  bytes_sent += o.bytes_sent;
  bytes_received += o.bytes_received;
  seconds += o.seconds;
  left_out += o.left_out;
  return *this;
}

namespace detail {

std::int64_t chunk_begin(std::int64_t n, int size, int j) { return n * j / size; }

Segments::Segments(std::int64_t n_values, int ranks, std::int64_t segment_values) : n(n_values), m(ranks) {
  const std::int64_t largest = chunk_begin(n, m, m) - chunk_begin(n, m, m - 1);
  count = std::max<std::int64_t>(1, (largest + segment_values - 1) / segment_values);
}

std::int64_t Segments::begin(int j, std::int64_t s) const {
  const std::int64_t b = chunk_begin(n, m, j), len = chunk_begin(n, m, j + 1) - b;
  return b + len * s / count;
}

Status send_counted(transport::Link& link, transport::Tag tag, const Bytes& payload, Deadline deadline, CommStats& stats) {
  Status st = link.send(tag, payload, deadline);
  if (st.ok()) stats.bytes_sent += payload.size() + transport::kFrameHeaderBytes;
  return st;
}

// Sends an encoding in its two pieces (an fp32 body straight from the tensor: no joining copy).
Status send_counted(transport::Link& link, transport::Tag tag, const quant::EncodedView& payload, Deadline deadline, CommStats& stats) {
  const std::array<ByteView, 2> parts = {ByteView(payload.head), payload.body};
  Status st = link.send_parts(tag, parts, deadline);
  if (st.ok()) stats.bytes_sent += payload.size() + transport::kFrameHeaderBytes;
  return st;
}

// Receives one encoded chunk of `expect` values (the untrusted bytes are only inspected here).
Result<Bytes> recv_chunk(transport::Link& link, transport::Tag tag, std::int64_t expect, Deadline deadline, CommStats& stats) {
  auto bytes = link.recv(tag, deadline);
  if (!bytes.ok()) return bytes.status();
  stats.bytes_received += bytes->size() + transport::kFrameHeaderBytes;
  auto info = quant::inspect(*bytes, expect);
  if (!info.ok()) return info.status().with_context("chunk from peer " + link.peer().to_string());
  if (info->numel != expect) {
    return error(ErrorCode::kMalformed, "peer " + link.peer().to_string() + " sent a chunk of " + std::to_string(info->numel) +
                                            " values where " + std::to_string(expect) + " were expected (group out of step?)");
  }
  return std::move(*bytes);
}

std::span<float> span_of(at::Tensor& t) { return {t.data_ptr<float>(), static_cast<std::size_t>(t.numel())}; }

Status decoded(Status st, const transport::Link* from) {
  if (st.ok() || from == nullptr) return st;
  return st.with_context("chunk from peer " + from->peer().to_string());
}

// Receives one encoded chunk and decodes it straight into `dst` (contiguous fp32, the expected size).
Status recv_into(transport::Link& link, transport::Tag tag, at::Tensor dst, Deadline deadline, CommStats& stats) {
  auto bytes = recv_chunk(link, tag, dst.numel(), deadline, stats);
  if (!bytes.ok()) return bytes.status();
  Status st = decoded(quant::decode_into(*bytes, span_of(dst)), &link);
  link.recycle(std::move(*bytes));
  return st;
}

// Errors of the bytes themselves (a contribution to leave out under a robust rule), as against a
// link's (lost peer, deadline), which fail the collective whatever the rule.
bool bad_payload(const Status& st) {
  switch (st.code()) {
    case ErrorCode::kMalformed:
    case ErrorCode::kVersionMismatch:
    case ErrorCode::kOutOfRange:
    case ErrorCode::kDataLoss:
      return true;
    default:
      return false;
  }
}

bool finite(std::span<const float> v) { return quant::kernels::check_finite_fp32(reinterpret_cast<const std::uint8_t*>(v.data()), v.size()); }

float median_of(std::vector<float>& v) {  // v is reordered
  const std::size_t h = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(h), v.end());
  const float hi = v[h];
  if (v.size() % 2 == 1) return hi;
  const float lo = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(h));
  return lo + (hi - lo) / 2;
}

// One segment's robust combination on its owner (Aggregation's kFiltered and kTrimmedMean). `terms`:
// every rank's contribution (a payload, or the owner's own values), `usable[j]` false where it did
// not arrive in a usable form. Writes the result into `out` and marks what it left out in `usable`
// (false). `rows` is scratch space.
Status robust_segment(const Aggregation& agg, std::vector<quant::MeanTerm>& terms, std::vector<char>& usable, std::span<float> out,
                      std::vector<float>& rows) {
  const std::size_t m = terms.size(), n = out.size();
  rows.resize(m * n);
  auto row = [&](std::size_t j) { return std::span<float>(rows.data() + j * n, n); };
  std::vector<std::size_t> in;
  for (std::size_t j = 0; j < m; ++j) {
    if (!usable[j]) continue;
    if (!terms[j].payload.empty()) {
      usable[j] = quant::decode_into(terms[j].payload, row(j)).ok();  // NaN and Inf are refused by the decoder
    } else {
      usable[j] = finite(terms[j].values);
      if (usable[j]) std::copy(terms[j].values.begin(), terms[j].values.end(), row(j).begin());
    }
    if (usable[j]) in.push_back(j);
  }
  if (in.empty()) return error(ErrorCode::kAborted, "no contribution could be averaged (every one was malformed or non-finite)");
  std::vector<float> column(in.size());
  if (agg.rule == Aggregation::Rule::kTrimmedMean) {
    const std::size_t v = in.size(), b = std::min<std::size_t>(static_cast<std::size_t>(std::max(0, agg.trim)), (v - 1) / 2);
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t k = 0; k < v; ++k) column[k] = rows[in[k] * n + i];
      std::sort(column.begin(), column.end());
      double sum = 0;
      for (std::size_t k = b; k < v - b; ++k) sum += column[k];
      out[i] = static_cast<float>(sum / static_cast<double>(v - 2 * b));
    }
    return Status();
  }
  if (in.size() >= 3) {  // with two, neither is the odd one out
    std::vector<double> distance(m, 0.0);
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t k = 0; k < in.size(); ++k) column[k] = rows[in[k] * n + i];
      const float med = median_of(column);
      for (const std::size_t j : in) {
        const double d = static_cast<double>(rows[j * n + i]) - med;
        distance[j] += d * d;
      }
    }
    std::vector<float> ds;
    for (const std::size_t j : in) ds.push_back(static_cast<float>(std::sqrt(distance[j])));
    const double typical = median_of(ds);
    std::vector<std::size_t> kept;
    for (const std::size_t j : in) {
      const double d = std::sqrt(distance[j]);
      if (d > 0 && d > agg.outlier_factor * typical) {
        usable[j] = 0;
      } else {
        kept.push_back(j);
      }
    }
    in = std::move(kept);
  }
  // The rows decoded above, summed as mean_into sums payloads: the same bits, without decoding twice.
  std::vector<quant::MeanTerm> kept_terms;
  for (const std::size_t j : in) kept_terms.push_back(quant::MeanTerm{{}, row(j)});
  std::ptrdiff_t failed = -1;
  return quant::mean_into(kept_terms, static_cast<float>(in.size()), out, failed);
}

std::optional<Bytes> special_contribution(const Group& g, std::span<const float> values, const quant::EncodeOptions& codec, bool robust,
                                          bool& abstained) {
  if (robust && !finite(values)) {  // abstains: an empty contribution, left out by the owner
    if (!abstained) spdlog::warn("allreduce: this rank's contribution holds NaN or Inf: it abstains, and takes the others' result");
    abstained = true;
    return quant::encode(torch::empty({0}), codec);
  }
  if (g.poison && g.poison->nan && !values.empty()) {
    GOSSAMER_CHECK(codec.codec == quant::CodecId::kFp32 && !codec.zstd, "allreduce_mean: NaN poisoning needs the plain fp32 codec");
    quant::EncodedView view = quant::encode_view(values, codec);
    const std::size_t head = view.head.size();
    Bytes poisoned = joined(std::move(view));
    const float nan = std::nanf("");
    std::memcpy(poisoned.data() + head, &nan, sizeof nan);  // the first value, in an fp32 body
    return poisoned;
  }
  return std::nullopt;
}

Status reduce_segment(const Group& g, const quant::EncodeOptions& codec, const Aggregation& agg, std::vector<Bytes>& contributions,
                      std::vector<char>& usable, std::span<const float> own, std::span<float> out, std::vector<quant::MeanTerm>& terms,
                      std::vector<float>& rows, std::ptrdiff_t& failed) {
  const int m = g.size, r = g.rank;
  const bool robust = agg.rule != Aggregation::Rule::kMean;
  const bool exact = codec.codec == quant::CodecId::kFp32;  // fp32 round-trips bit for bit
  // A NaN-poisoned rank's own contribution counts as non-finite too (its sends carry the NaN).
  const bool own_finite = !robust || (finite(own) && !(g.poison && g.poison->nan));
  if (!exact && own_finite) contributions[static_cast<std::size_t>(r)] = quant::encode_view(own, codec).head;  // ours passes the codec too
  terms.resize(static_cast<std::size_t>(m));
  for (int j = 0; j < m; ++j) {
    terms[static_cast<std::size_t>(j)] = j == r && exact ? quant::MeanTerm{{}, own} : quant::MeanTerm{contributions[static_cast<std::size_t>(j)], {}};
  }
  if (!own_finite) usable[static_cast<std::size_t>(r)] = 0;
  failed = -1;
  if (robust) return robust_segment(agg, terms, usable, out, rows);
  const Status summed = quant::mean_into(terms, static_cast<float>(m), out, failed);
  GOSSAMER_CHECK(summed.ok() || !(exact && failed == r), "allreduce_mean: the tensor holds NaN or Inf");
  return summed;
}

void keep_and_report(const Group& g, std::int64_t n, bool tapped, std::vector<std::vector<Bytes>>& parts, const std::vector<char>& left,
                     transport::Tag tag, CommStats& stats) {
  if (tapped) {
    std::vector<Bytes> payloads;
    for (auto& chunk : parts) {
      for (auto& part : chunk) payloads.push_back(std::move(part));
    }
    g.mean_tap->add(n, std::move(payloads));
  }
  std::string who;
  for (std::size_t j = 0; j < left.size(); ++j) {
    if (!left[j]) continue;
    ++stats.left_out;
    who += (who.empty() ? "" : ", ") + std::to_string(j);
  }
  if (!who.empty()) {
    spdlog::warn("allreduce (tag {:#x}): rank {} left out the contribution of rank(s) {} to its chunk (malformed, non-finite or an outlier)", tag, g.rank, who);
  }
}

Bytes joined(quant::EncodedView view) {
  Bytes out = std::move(view.head);
  out.insert(out.end(), view.body.begin(), view.body.end());
  return out;
}

MeanRound::MeanRound(const Group& group, const at::Tensor& tensor, const quant::EncodeOptions& encoding, std::int64_t segment_values,
                     const Aggregation& aggregation)
    : g(group),
      codec(encoding),
      agg(aggregation),
      r(group.rank),
      m(group.size),
      robust(aggregation.rule != Aggregation::Rule::kMean),
      exact(encoding.codec == quant::CodecId::kFp32),
      flat(tensor.detach().to(at::kCPU, at::kFloat).contiguous().reshape({-1})),
      // A simulated poisoned worker sends scaled values (its own chunk's contribution too).
      sent_values(group.poison && group.poison->scale != 1.0 ? flat * group.poison->scale : flat),
      sent_data(sent_values.data_ptr<float>()),
      n(flat.numel()),
      cuts(n, m, segment_values),
      mine_begin(chunk_begin(n, m, r)),
      acc_len(static_cast<std::size_t>(chunk_begin(n, m, r + 1) - mine_begin)),
      acc(std::make_unique_for_overwrite<float[]>(acc_len)),
      contributions(static_cast<std::size_t>(m)),
      usable(static_cast<std::size_t>(m), 1),
      left(static_cast<std::size_t>(m), 0),
      parts(static_cast<std::size_t>(m), std::vector<Bytes>(static_cast<std::size_t>(cuts.count))) {}

std::span<float> MeanRound::acc_segment(std::int64_t s) const {
  return {acc.get() + (cuts.begin(r, s) - mine_begin), static_cast<std::size_t>(cuts.length(r, s))};
}

Status MeanRound::reduce(std::int64_t s, std::ptrdiff_t& failed) {
  const Status summed = reduce_segment(g, codec, agg, contributions, usable, sent(r, s), acc_segment(s), terms, rows, failed);
  for (int j = 0; j < m; ++j) {
    if (!usable[static_cast<std::size_t>(j)]) left[static_cast<std::size_t>(j)] = 1;
  }
  return summed;
}

Status MeanRound::finish(at::Tensor& tensor, transport::Tag tag, CommStats& stats, const std::function<transport::Link*(int)>& source, int& failed) {
  const bool direct = tensor.device().is_cpu() && tensor.scalar_type() == at::kFloat && tensor.is_contiguous();
  at::Tensor out = direct ? flat : torch::empty({n}, torch::kFloat);
  float* const out_data = out.data_ptr<float>();
  // A member keeping updates for a newcomer keeps the mean's own bytes (fp32 would gain nothing).
  const bool tapped = !exact && g.mean_tap && g.mean_tap->enabled();
  for (int j = 0; j < m; ++j) {
    if (j == r && exact) {
      std::copy(acc.get(), acc.get() + acc_len, out_data + mine_begin);
      continue;
    }
    transport::Link* const from = j != r && source ? source(j) : nullptr;
    for (std::int64_t s = 0; s < cuts.count; ++s) {
      if (Status st = quant::decode_into(part(j, s), cuts.of(out_data, j, s)); !st.ok()) {
        failed = j;
        return decoded(st, from);
      }
      if (from != nullptr && !tapped) from->recycle(std::move(part(j, s)));
    }
  }
  if (!direct) tensor.copy_(out.view(tensor.sizes()));
  keep_and_report(g, n, tapped, parts, left, tag, stats);
  return Status();
}

}  // namespace detail

using namespace detail;

at::Tensor allreduce_contribution(const at::Tensor& tensor, int size, const quant::EncodeOptions& codec, std::int64_t segment_values) {
  GOSSAMER_CHECK(size >= 1 && segment_values >= 1, "allreduce_contribution: a group of at least one rank, segments of at least one value");
  at::Tensor out = tensor.detach().to(at::kCPU, at::kFloat).reshape({-1}).clone();
  if (codec.codec == quant::CodecId::kFp32 || size == 1) return out;  // fp32 round-trips; a group of one sends nothing
  const Segments cuts(out.numel(), size, segment_values);
  float* base = out.data_ptr<float>();
  for (int j = 0; j < size; ++j) {
    for (std::int64_t s = 0; s < cuts.count; ++s) {
      const std::span<float> values = cuts.of(base, j, s);
      if (values.empty()) continue;
      const Bytes payload = quant::encode(torch::from_blob(values.data(), {static_cast<std::int64_t>(values.size())}, at::kFloat), codec);
      const Status st = quant::decode_into(payload, values);
      GOSSAMER_CHECK(st.ok(), "allreduce_contribution: the codec did not decode its own encoding: " + st.message());
    }
  }
  return out;
}

namespace {

// The full mesh (collectives.h): each segment of rank j's chunk goes straight to rank j, and its mean
// straight back to everyone.
class MeshMean {
 public:
  MeshMean(const Group& g, const at::Tensor& tensor, const quant::EncodeOptions& codec, transport::Tag tag, Deadline deadline,
           std::int64_t segment_values, const Aggregation& agg)
      : round_(g, tensor, codec, segment_values, agg), tag_(tag), mean_tag_(tag | kAllreduceMeanPhase), deadline_(deadline) {
    for (int j = 0; j < round_.m; ++j) {
      GOSSAMER_CHECK(j == round_.r || g.peers[static_cast<std::size_t>(j)], "allreduce_mean: no link to rank " + std::to_string(j));
    }
  }

  Status run(at::Tensor& tensor, CommStats& stats) {
    // Segment by segment, so the sums and the means of early segments overlap later ones in flight,
    // and what a link reads in is summed while it is still in cache. Contributions run kLookahead
    // segments ahead of the sums: a rank waiting for a slow peer's segment s has already handed
    // segments up to s + kLookahead to the others, so nobody idles on it (on 4 ranks over loopback,
    // 10 to 15% faster than sending in lockstep).
    constexpr std::int64_t kLookahead = 4;
    const std::int64_t segs = round_.cuts.count;
    for (std::int64_t s = 0; s < segs; ++s) {
      for (; sent_ < std::min(segs, s + 1 + kLookahead); ++sent_) {
        if (Status st = send_contributions(sent_, stats); !st.ok()) return st;
      }
      if (Status st = sum_and_send_mean(s, stats); !st.ok()) return st;
    }
    for (std::int64_t s = 0; s < segs; ++s) {
      for (int k = 1; k < round_.m; ++k) {
        const int j = from(k);
        auto got = recv_chunk(link(j), mean_tag_, round_.cuts.length(j, s), deadline_, stats);
        if (!got.ok()) return context(got.status(), "receiving the mean from", j);
        round_.part(j, s) = std::move(*got);
      }
    }
    // Only now, with every segment in hand, does the caller's tensor change.
    int failed = -1;
    Status st = round_.finish(tensor, tag_, stats, [this](int j) { return &link(j); }, failed);
    return st.ok() ? st : context(st, "decoding the mean of", failed);
  }

 private:
  // Rank r talks to r+1, r+2, ... in turn (and hears from r-1, r-2, ...), so the ranks do not all
  // queue on rank 0 first.
  int to(int k) const { return (round_.r + k) % round_.m; }
  int from(int k) const { return (round_.r - k + round_.m) % round_.m; }
  transport::Link& link(int j) const { return *round_.g.peers[static_cast<std::size_t>(j)]; }
  Status context(Status st, const char* what, int j) const {
    return st.with_context("allreduce: rank " + std::to_string(round_.r) + " " + what + " rank " + std::to_string(j));
  }

  // 1. Segment s of each chunk, encoded once, to its owner (fp32 straight from the tensor).
  Status send_contributions(std::int64_t s, CommStats& stats) {
    for (int k = 1; k < round_.m; ++k) {
      const int j = to(k);
      const std::span<float> values = round_.sent(j, s);
      Status st;
      if (auto special = special_contribution(round_.g, values, round_.codec, round_.robust, round_.abstained)) {
        st = send_counted(link(j), tag_, *special, deadline_, stats);
      } else {
        st = send_counted(link(j), tag_, quant::encode_view(values, round_.codec), deadline_, stats);
      }
      if (!st.ok()) return context(st, "sending to", j);
    }
    return Status();
  }

  // 2. The owner sums every contribution in fp32 in rank order (the same order every run), each
  // straight from its payload (ours from the tensor when exact), and divides: one pass over them.
  // 3. The mean, encoded once, to everyone; every rank (the owner too) decodes the same bytes.
  Status sum_and_send_mean(std::int64_t s, CommStats& stats) {
    const int r = round_.r, m = round_.m;
    std::fill(round_.usable.begin(), round_.usable.end(), 1);
    for (int k = 1; k < m; ++k) {
      const int j = from(k);
      Bytes& contribution = round_.contributions[static_cast<std::size_t>(j)];
      auto got = recv_chunk(link(j), tag_, round_.cuts.length(r, s), deadline_, stats);
      if (!got.ok() && round_.robust && bad_payload(got.status())) {
        round_.usable[static_cast<std::size_t>(j)] = 0;
        contribution.clear();
        continue;
      }
      if (!got.ok()) return context(got.status(), "receiving from", j);
      contribution = std::move(*got);
    }
    std::ptrdiff_t failed = -1;
    const Status summed = round_.reduce(s, failed);
    for (int k = 1; k < m; ++k) link(from(k)).recycle(std::move(round_.contributions[static_cast<std::size_t>(from(k))]));
    if (!summed.ok()) {
      const int j = static_cast<int>(failed);
      if (round_.robust || j < 0) return context(summed, "averaging the chunk of", r);
      return context(decoded(summed, j == r ? nullptr : &link(j)), "reducing the chunk of", j);
    }
    const quant::EncodedView mean = quant::encode_view(std::span<const float>(round_.acc_segment(s)), round_.codec);
    if (!round_.exact) round_.part(r, s) = joined(mean);
    for (int k = 1; k < m; ++k) {
      const int j = to(k);
      if (Status st = send_counted(link(j), mean_tag_, mean, deadline_, stats); !st.ok()) return context(st, "sending the mean to", j);
      if (round_.g.crash_drill && s == round_.cuts.count - 1 && k == m / 2) round_.g.crash_drill();
    }
    return Status();
  }

  MeanRound round_;
  const transport::Tag tag_, mean_tag_;
  const Deadline deadline_;
  std::int64_t sent_ = 0;  // segments whose contributions have left
};

}  // namespace

Status allreduce_mean(const Group& g, at::Tensor& tensor, const quant::EncodeOptions& codec, transport::Tag tag, Deadline deadline,
                      CommStats* stats_out, std::int64_t segment_values, const Aggregation& agg) {
  GOSSAMER_CHECK(g.size >= 1 && g.rank >= 0 && g.rank < g.size, "allreduce_mean: rank outside the group");
  GOSSAMER_CHECK(static_cast<int>(g.peers.size()) == g.size, "allreduce_mean: the group needs one link slot per rank");
  GOSSAMER_CHECK(tensor.is_floating_point(), "allreduce_mean: floating-point tensors only");
  GOSSAMER_CHECK((tag & kAllreduceMeanPhase) == 0, "allreduce_mean: the tag's top bit is the collective's own");
  GOSSAMER_CHECK(segment_values >= 1, "allreduce_mean: segments need at least one value");
  if (g.size == 1) return Status();
  Stopwatch watch(*g.clock);
  CommStats stats;
  const Status st = g.width >= 2 && g.size > g.width ? grid_mean(g, tensor, codec, tag, deadline, segment_values, agg, stats)
                                                     : MeshMean(g, tensor, codec, tag, deadline, segment_values, agg).run(tensor, stats);
  if (!st.ok()) return st;
  stats.seconds = watch.elapsed_seconds();
  if (stats_out != nullptr) *stats_out += stats;
  return Status();
}

Result<std::vector<Bytes>> allgather(const Group& g, Bytes mine, transport::Tag tag, Deadline deadline, CommStats* stats_out) {
  Stopwatch watch(*g.clock);
  CommStats stats;
  const int r = g.rank, m = g.size;
  for (int j = 0; j < m; ++j) GOSSAMER_CHECK(j == r || g.peers[static_cast<std::size_t>(j)], "allgather: no link to rank " + std::to_string(j));
  auto link = [&](int j) -> transport::Link& { return *g.peers[static_cast<std::size_t>(j)]; };
  // As allreduce_mean: rank r sends to r+1, r+2, ... and hears from r-1, r-2, ...
  for (int k = 1; k < m; ++k) {
    const int j = (r + k) % m;
    if (Status st = send_counted(link(j), tag, mine, deadline, stats); !st.ok()) {
      return st.with_context("allgather: rank " + std::to_string(r) + " sending to rank " + std::to_string(j));
    }
    if (g.crash_drill && k == m / 2) g.crash_drill();
  }
  std::vector<Bytes> out(static_cast<std::size_t>(m));
  for (int k = 1; k < m; ++k) {
    const int j = (r - k + m) % m;
    auto got = link(j).recv(tag, deadline);
    if (!got.ok()) return got.status().with_context("allgather: rank " + std::to_string(r) + " receiving from rank " + std::to_string(j));
    stats.bytes_received += got->size() + transport::kFrameHeaderBytes;
    out[static_cast<std::size_t>(j)] = std::move(*got);
  }
  out[static_cast<std::size_t>(r)] = std::move(mine);
  stats.seconds = watch.elapsed_seconds();
  if (stats_out != nullptr) *stats_out += stats;
  return out;
}

Result<at::Tensor> pair_exchange(transport::Link& peer, const at::Tensor& mine, const quant::EncodeOptions& codec, transport::Tag tag,
                                 Deadline deadline, const Clock& clock, CommStats* stats_out) {
  Stopwatch watch(clock);
  CommStats stats;
  if (Status st = send_counted(peer, tag, quant::encode(mine, codec), deadline, stats); !st.ok()) return st.with_context("pair exchange");
  at::Tensor theirs = torch::empty({mine.numel()}, torch::kFloat);
  if (Status st = recv_into(peer, tag, theirs, deadline, stats); !st.ok()) return st.with_context("pair exchange");
  stats.seconds = watch.elapsed_seconds();
  if (stats_out != nullptr) *stats_out += stats;
  return theirs.view(mine.sizes());
}

}  // namespace gossamer::optim
