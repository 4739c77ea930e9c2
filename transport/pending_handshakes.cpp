#include "transport/pending_handshakes.h"

#include <vector>

namespace gossamer::transport {

std::shared_ptr<PendingHandshakes::Place> PendingHandshakes::take(const std::string& ip, std::size_t max_total, std::size_t max_per_ip) {
  std::function<void()> close_oldest;
  std::shared_ptr<Place> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (by_ip_.count(ip) != 0 && by_ip_[ip] >= max_per_ip) return nullptr;
    while (total_ >= max_total && !order_.empty()) {
      auto oldest = order_.begin()->second.lock();
      order_.erase(order_.begin());
      if (!oldest || !oldest->counted) continue;  // going already
      uncount(*oldest);
      evicted_.fetch_add(1);
      close_oldest = std::move(oldest->close);
      break;
    }
    if (total_ >= max_total) return nullptr;
    ++total_;
    ++by_ip_[ip];
    out = std::shared_ptr<Place>(new Place{ip, ++seq_, true, {}}, [self = shared_from_this()](Place* p) {
      self->give_back(*p);
      delete p;
    });
    order_.emplace(out->seq, out);
  }
  if (close_oldest) close_oldest();
  return out;
}

void PendingHandshakes::close_all() {
  std::vector<std::function<void()>> closes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [seq, weak] : order_) {
      if (auto place = weak.lock(); place && place->close) closes.push_back(place->close);
    }
  }
  for (auto& close : closes) close();
}

void PendingHandshakes::uncount(Place& p) {
  p.counted = false;
  --total_;
  auto it = by_ip_.find(p.ip);
  if (it != by_ip_.end() && --it->second == 0) by_ip_.erase(it);
}

void PendingHandshakes::give_back(Place& p) {
  std::lock_guard<std::mutex> lock(mu_);
  order_.erase(p.seq);
  if (p.counted) uncount(p);
}

}  // namespace gossamer::transport
