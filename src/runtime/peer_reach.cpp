// Peer: whether the others can reach this peer, and what follows when they cannot (behind NAT):
// the dial-back check, the refusal of a second outbound-only peer in a run without a key, and
// stopping when no member that accepts connections is left (peer_runtime.h).
#include <chrono>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "runtime/peer_runtime.h"

namespace gossamer::runtime {

using namespace std::chrono_literals;

void Peer::check_reachable(const std::string& address, const std::string& what) {
  if (outbound_only_ || plan_.first) return;
  std::optional<Result<transport::Reachability>> checked = env_.host->check_reachable({address}, plan_.stop);
  if (!checked) return;  // every peer reaches every other
  Result<transport::Reachability>& reach = *checked;
  if (!reach.ok() && reach.status().code() == ErrorCode::kAborted) return;  // stopping: the caller sees it next
  if (!reach.ok()) {
    spdlog::warn("could not check whether the others can connect to this peer's {} ({}); assuming they can", what, reach.status().message());
    return;
  }
  if (reach->reachable && !reach->unchecked.empty()) {
    spdlog::info("a member ({}) would not dial this peer's {} at {}: {}; taken as reachable, as advertised", reach->helper, what, address,
                 fmt::format("{}", fmt::join(reach->unchecked, "; ")));
    return;
  }
  if (reach->reachable) {
    spdlog::info("reachable: a member ({}) connected back to this peer's {} at {}", reach->helper, what, address);
    return;
  }
  const std::string seen = reach->observed_ip.empty() ? std::string() : " (it sees this peer as " + reach->observed_ip + ")";
  spdlog::warn("a member{} could not connect back to this peer's {}: {}. Taking part as outbound-only: this peer dials the others, and "
               "its links to other outbound-only peers go through a relay{}. To accept connections, forward both ports to this machine "
               "and pass --advertise PUBLIC_ADDRESS:PORT (docs/deploy.md)",
               seen, what, fmt::format("{}", fmt::join(reach->failed, "; ")), plan_.keyed ? "" : " (in a run with a key only: --key)");
  outbound_only_ = true;
  if (Status st = gossip_.set_outbound_only(true); !st.ok()) spdlog::warn("gossip: {}", st.to_string());
}

Status Peer::check_not_stranded() const {
  if (!outbound_only_) return Status();
  for (const auto& m : gossip_.members()) {
    if (!m.outbound_only && (m.state == transport::MemberState::kAlive || m.state == transport::MemberState::kSuspect)) return Status();
  }
  return error(ErrorCode::kUnavailable, "every peer that accepts connections has left or died, and this peer accepts none (behind NAT, "
                                        "outbound-only): it can reach no other member, nor they it. Start a peer with a reachable address "
                                        "(a public IP, or a port forward and --advertise; see docs/deploy.md), then restart this one with --resume");
}

Status Peer::check_relay_needs_key() {
  if (!outbound_only_ || plan_.keyed) return Status();
  // The others' outbound-only flags travel with gossip rows: a few periods for them to arrive (two
  // peers found outbound-only at the same moment see each other).
  clock_.sleep_for(1s);
  bool under_way = false;
  {
    std::lock_guard lock(heard_->mu);
    under_way = heard_->latest_round >= 0;
  }
  const transport::PeerId self = gossip_.self();
  for (const auto& m : gossip_.members()) {
    if (m.id == self || !m.outbound_only || (m.state != transport::MemberState::kAlive && m.state != transport::MemberState::kSuspect)) continue;
    if (!under_way && self < m.id) continue;  // both at the start: the smaller id stays
    return error(ErrorCode::kInvalidArgument,
                 "this peer accepts no connections (behind NAT), nor does peer " + m.id.to_string() + " in this run, so their link would go through " +
                     "a relay, and a run without a key relays nothing: start the run's peers with --key FILE (the same file on every peer; "
                     "gossamer keygen writes one), or give this machine a port forward and --advertise (docs/deploy.md)");
  }
  return Status();
}

}  // namespace gossamer::runtime
