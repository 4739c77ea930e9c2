// PendingHandshakes: the places for connections in their handshake on the TCP transport's accept
// side, in all and per source address (tcp_transport.cpp). Internal header of the transport.
//
// A place is a handle that gives its spot back when the last copy goes (the handlers holding it may
// outlive the transport). When all max_total places are taken, the oldest is evicted (its
// connection closed where it is in its handshake, its spot given to the newcomer): connections that
// send nothing, opened from many addresses, hold a place only until max_total newer ones came, while
// a genuine handshake needs a round trip or two. An address that holds max_per_ip places is refused
// without evicting.
// Threading: take() on the I/O thread (it runs the evicted one's close there); places may be let go
// from any thread (a mutex guards the counts).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace gossamer::transport {

class PendingHandshakes : public std::enable_shared_from_this<PendingHandshakes> {
 public:
  struct Place {
    std::string ip;
    std::uint64_t seq = 0;
    bool counted = true;          // in total_ and by_ip_ (false once evicted); under mu_
    std::function<void()> close;  // closes the connection, wherever it is in its handshake (I/O thread)
  };
  // nullptr: refused.
  std::shared_ptr<Place> take(const std::string& ip, std::size_t max_total, std::size_t max_per_ip);
  std::uint64_t evicted() const { return evicted_.load(); }
  // Closes every connection still in its handshake (I/O thread): the transport is shutting down, and
  // a handshake left waiting would hold its socket open.
  void close_all();

 private:
  void uncount(Place& p);  // under mu_
  void give_back(Place& p);
  std::mutex mu_;
  std::size_t total_ = 0;
  std::uint64_t seq_ = 0;
  std::map<std::string, std::size_t> by_ip_;
  std::map<std::uint64_t, std::weak_ptr<Place>> order_;  // by age, oldest first
  std::atomic<std::uint64_t> evicted_{0};
};

}  // namespace gossamer::transport
