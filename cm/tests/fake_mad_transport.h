// An in-process fabric for CommManager tests: every endpoint is a MadTransport on one shared
// fake clock; sent MADs wait in a queue until the test delivers them (or drops them: loss,
// a dead peer), so a test decides exactly what each side sees and when.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "cm/comm_manager.h"
#include "cm/mad_transport.h"

namespace softrdma::cm::testing {

class FakeFabric;

/// One device's transport on the fabric.
class FakeTransport final : public MadTransport {
 public:
  FakeTransport(FakeFabric& fabric, uint32_t ip) : fabric_(fabric), ip_(ip) {}
  void send(const MadAddress& to, std::span<const uint8_t, kMadBytes> mad) override;
  uint64_t now_ns() override;
  uint32_t ip() const { return ip_; }

 private:
  FakeFabric& fabric_;
  uint32_t ip_;
};

/// A MAD in flight.
struct InFlight {
  uint32_t from_ip;
  MadAddress to;
  std::array<uint8_t, kMadBytes> bytes;
  /// Its decoded form (every MAD the CMs send decodes).
  Mad decoded() const { return *decode(bytes).mad; }
  const char* name() const { return attr_name(decoded().header.attr_id); }
};

class FakeFabric {
 public:
  /// Adds a device at `ip` with its own CommManager. Several at one `ip` are processes
  /// sharing the address: each receives every MAD sent there (net/address_share.h).
  CommManager& add(uint32_t ip, CmConfig config = {}) {
    auto t = std::make_unique<FakeTransport>(*this, ip);
    auto cm = std::make_unique<CommManager>(*t, std::move(config));
    CommManager& ref = *cm;
    nodes_.emplace(ip, Node{std::move(t), std::move(cm)});
    return ref;
  }
  /// The (first) manager at `ip`.
  CommManager& cm(uint32_t ip) { return *nodes_.find(ip)->second.cm; }

  uint64_t now() const { return now_; }
  std::deque<InFlight>& queue() { return queue_; }
  /// Every MAD ever sent, in order.
  const std::vector<InFlight>& sent() const { return sent_; }

  /// Delivers queued MADs (and those their handlers send) until none is left; MADs for which
  /// `drop` returns true are lost. Bounded: at most `max` deliveries. Returns how many.
  size_t deliver(const std::function<bool(const InFlight&)>& drop = nullptr, size_t max = 1000) {
    size_t n = 0;
    while (!queue_.empty() && n < max) {
      InFlight m = queue_.front();
      queue_.pop_front();
      ++n;
      if (drop && drop(m)) continue;
      auto [first, last] = nodes_.equal_range(m.to.ip);  // nobody there: lost
      for (auto it = first; it != last; ++it)
        it->second.cm->on_mad(m.bytes, MadAddress{m.from_ip, kGsiQpn});
    }
    return n;
  }
  /// Moves the clock to the earliest timer of any manager (or by `max_ns`, whichever is
  /// first) and runs the due timers. Returns false when no timer is armed.
  bool advance_to_next_timer(uint64_t max_ns = ~0ull) {
    uint64_t next = ~0ull;
    for (auto& [ip, n] : nodes_)
      if (auto d = n.cm->next_deadline()) next = std::min(next, *d);
    if (next == ~0ull) return false;
    const uint64_t target = std::max(now_, next);
    now_ = target - now_ > max_ns ? now_ + max_ns : target;
    for (auto& [ip, n] : nodes_) n.cm->on_timer();
    return true;
  }
  void advance(uint64_t ns) {
    now_ += ns;
    for (auto& [ip, n] : nodes_) n.cm->on_timer();
  }

  void push(uint32_t from, const MadAddress& to, std::span<const uint8_t, kMadBytes> mad) {
    InFlight m{from, to, {}};
    std::copy(mad.begin(), mad.end(), m.bytes.begin());
    queue_.push_back(m);
    sent_.push_back(m);
  }

 private:
  struct Node {
    std::unique_ptr<FakeTransport> transport;
    std::unique_ptr<CommManager> cm;
  };
  std::multimap<uint32_t, Node> nodes_;
  std::deque<InFlight> queue_;
  std::vector<InFlight> sent_;
  uint64_t now_ = 1'000'000'000;
};

inline void FakeTransport::send(const MadAddress& to, std::span<const uint8_t, kMadBytes> mad) {
  fabric_.push(ip_, to, mad);
}
inline uint64_t FakeTransport::now_ns() {
  return fabric_.now();
}

}  // namespace softrdma::cm::testing
