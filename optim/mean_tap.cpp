#include "optim/mean_tap.h"

#include <cstring>

#include "quant/format.h"

namespace gossamer::optim {

void MeanTap::enable(bool on) {
  std::lock_guard lock(mu_);
  on_ = on;
  if (!on) records_.clear();
}

bool MeanTap::enabled() const {
  std::lock_guard lock(mu_);
  return on_;
}

void MeanTap::add(std::int64_t numel, std::vector<Bytes> payloads) {
  std::lock_guard lock(mu_);
  if (!on_) return;
  records_.push_back(Record{numel, std::move(payloads)});
  while (records_.size() > kMaxRecords) records_.pop_front();
}

std::optional<std::vector<Bytes>> MeanTap::take(std::span<const float> values) {
  std::lock_guard lock(mu_);
  for (auto it = records_.rbegin(); it != records_.rend(); ++it) {
    if (it->numel != static_cast<std::int64_t>(values.size()) || !decodes_to(it->payloads, values)) continue;
    std::vector<Bytes> found = std::move(it->payloads);
    records_.erase(records_.begin(), it.base());  // it and everything older
    return found;
  }
  return std::nullopt;
}

std::size_t MeanTap::size() const {
  std::lock_guard lock(mu_);
  return records_.size();
}

bool decodes_to(const std::vector<Bytes>& payloads, std::span<const float> values) {
  std::vector<float> scratch;
  std::size_t at = 0;
  for (const Bytes& p : payloads) {
    auto info = quant::inspect(p, static_cast<std::int64_t>(values.size() - at));
    if (!info.ok()) return false;
    const auto n = static_cast<std::size_t>(info->numel);
    if (n > values.size() - at) return false;
    scratch.resize(n);
    if (!quant::decode_into(p, scratch).ok()) return false;
    if (n > 0 && std::memcmp(scratch.data(), values.data() + at, n * sizeof(float)) != 0) return false;
    at += n;
  }
  return at == values.size();
}

}  // namespace gossamer::optim
