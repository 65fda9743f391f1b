// Fakes of the engine's two seams (object_registry.h, transport.h) for unit tests that run
// QPs back to back in one process: a device with a lock, the QPN / key / SRQ tables and an
// active MTU of 4096 B; a transport that records each packet as bytes and owns the clock.
#pragma once

#include <gtest/gtest.h>

#include <endian.h>
#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "engine/cq.h"
#include "engine/memory.h"
#include "engine/mw.h"
#include "engine/object_registry.h"
#include "engine/qp.h"

namespace softrdma::engine {

/// The device side of the seam: a lock and the QPN and key tables, an active MTU of 4096 B,
/// no progress of its own (the test delivers every packet and fires every timer).
class FakeDevice : public ObjectRegistry {
 public:
  std::mutex& mutex() override { return mu_; }
  uint32_t register_qp(QueuePair* qp) override {
    qps_[next_qpn_] = qp;
    return next_qpn_++;
  }
  bool register_qp_at(QueuePair* qp, uint32_t qpn) override { return qps_.emplace(qpn, qp).second; }
  uint32_t register_srq(SharedReceiveQueue* srq) override {
    srqs_[next_srqn_] = srq;
    return next_srqn_++;
  }
  void unregister_srq(uint32_t srqn) override { srqs_.erase(srqn); }
  SharedReceiveQueue* find_srq(uint32_t srqn) {
    auto it = srqs_.find(srqn);
    return it == srqs_.end() ? nullptr : it->second;
  }
  void unregister_qp(uint32_t qpn) override { qps_.erase(qpn); }
  uint32_t register_mr(MemoryRegion* mr) override {
    next_key_ += 0x100;
    mrs_[next_key_] = mr;
    return next_key_;
  }
  void unregister_mr(uint32_t key) override { mrs_.erase(key); }
  uint32_t register_mw(MemoryWindow* mw) override {
    next_key_ += 0x100;
    mws_[next_key_ >> 8] = mw;
    return next_key_;
  }
  void unregister_mw(uint32_t rkey) override { mws_.erase(rkey >> 8); }
  MemoryWindow* find_mw(uint32_t rkey) {
    auto it = mws_.find(rkey >> 8);
    return it == mws_.end() || it->second->rkey() != rkey ? nullptr : it->second;
  }
  uint8_t active_mtu() const override { return 5; }
  Transport& transport() override { return *transport_; }
  void try_progress() override {}

  MemoryRegion* find_mr(uint32_t key) {
    auto it = mrs_.find(key);
    return it == mrs_.end() ? nullptr : it->second;
  }
  /// The address the QPs' address vectors name (any IPv4 address will do).
  uint32_t ip() const { return 0x7f000001; }
  /// Where QPs created on this device send until the test points them elsewhere.
  Transport* transport_ = nullptr;

 private:
  std::mutex mu_;
  std::unordered_map<uint32_t, QueuePair*> qps_;
  std::unordered_map<uint32_t, MemoryRegion*> mrs_;
  std::unordered_map<uint32_t, MemoryWindow*> mws_;
  std::unordered_map<uint32_t, SharedReceiveQueue*> srqs_;
  uint32_t next_qpn_ = 0x100;
  uint32_t next_srqn_ = 1;
  uint32_t next_key_ = 0;
};

/// Records transmitted packets as bytes; time moves only when the test says so.
class FakeTransport : public Transport {
 public:
  explicit FakeTransport(FakeDevice& dev) : dev_(dev), now_(3600'000'000'000ull) {}
  void transmit(const wire::Headers& given, uint32_t, std::span<const iovec> payload,
                uint32_t payload_len) override {
    wire::Headers h = given;
    h.bth.pad_count = wire::pad_for(payload_len);
    std::vector<uint8_t> b(wire::kMaxTransportHeaderBytes);
    b.resize(wire::encode_headers(h, b));
    for (const iovec& v : payload)
      b.insert(b.end(), static_cast<uint8_t*>(v.iov_base),
               static_cast<uint8_t*>(v.iov_base) + v.iov_len);
    b.resize(b.size() + h.bth.pad_count + wire::kIcrcBytes, 0);
    sent.push_back(std::move(b));
  }
  void flush() override {}
  MemoryRegion* find_mr(uint32_t key) override { return dev_.find_mr(key); }
  MemoryWindow* find_mw(uint32_t rkey) override { return dev_.find_mw(rkey); }
  SharedReceiveQueue* find_srq(uint32_t srqn) override { return dev_.find_srq(srqn); }
  Counters& counters() override { return counters_; }
  uint64_t now_ns() override { return now_; }
  void timer_armed(QueuePair&, uint64_t) override {}
  bool selective_retransmit() const override { return selective; }
  uint32_t ooo_max_psns() const override { return ooo_max; }
  bool congestion_control(uint32_t, DcqcnParams& out) const override {
    out = dcqcn_params;
    return dcqcn;
  }

  /// With `placing`, the same-host path's direct placement: the payload copied to `remote_va`
  /// (this process's memory), `commit` run, true.
  bool place_write(uint32_t, uint32_t, uint32_t, uint64_t remote_va, std::span<const iovec> local,
                   uint64_t len, const std::function<void()>& commit) override {
    if (!placing || len == 0) return false;
    auto* d = reinterpret_cast<uint8_t*>(remote_va);
    for (const iovec& v : local) d = std::copy_n(static_cast<uint8_t*>(v.iov_base), v.iov_len, d);
    placed_bytes += len;
    if (commit) commit();
    return true;
  }
  bool can_place(uint32_t) override { return placing; }

  bool path_busy(uint32_t) override { return sent.size() >= busy_after; }
  void wait_for_path(QueuePair& qp) override { path_waiters.push_back(&qp); }

  void advance(uint64_t ns) { now_ += ns; }
  std::deque<std::vector<uint8_t>> sent;
  /// path_busy() once this many packets are queued in `sent` (a paused same-host path).
  size_t busy_after = SIZE_MAX;
  std::vector<QueuePair*> path_waiters;  ///< wait_for_path() calls
  Counters counters_;
  bool placing = false;       ///< place_write() places (a same-host peer's table is mapped)
  uint64_t placed_bytes = 0;  ///< bytes place_write() copied
  bool selective = false;     ///< SOFTRDMA_SELECTIVE_RETX of this side
  bool dcqcn = false;         ///< SOFTRDMA_CC=dcqcn on this side
  /// The responder's largest out-of-order span, PSNs (Transport::ooo_max_psns).
  uint32_t ooo_max = CongestionWindow::kMaxPsns;
  DcqcnParams dcqcn_params;

 private:
  FakeDevice& dev_;
  uint64_t now_;
};

inline wire::Packet parse(const std::vector<uint8_t>& b) {
  wire::Packet p;
  EXPECT_EQ(wire::parse(b, p), wire::ParseError::kOk);
  return p;
}

/// Delivers every packet `from` has sent to `to`, as the device does once its receive checks
/// pass: a request to the QP type's request unit (then its coalesced ACK), a response to
/// the completer; under the device lock. The datagrams come from 10.0.0.1 to 10.0.0.2 (what
/// a UD receiver writes into its GRH area). Returns how many.
inline size_t deliver_all(FakeDevice& dev, FakeTransport& from, QueuePair& to,
                          FakeTransport& to_t) {
  size_t n = 0;
  std::lock_guard lk(dev.mutex());
  while (!from.sent.empty()) {
    auto bytes = std::move(from.sent.front());
    from.sent.pop_front();
    wire::Packet p = parse(bytes);
    if (p.hdr.bth.placed) {  // as Device::check_placed: the payload is its length only
      static const uint8_t kPlaced[4096] = {};
      uint32_t len = 0;
      EXPECT_EQ(sizeof len, p.payload.size());
      std::memcpy(&len, p.payload.data(), sizeof len);
      p.payload = {kPlaced, std::min<size_t>(le32toh(len), sizeof kPlaced)};
    }
    if (p.info->mask & wire::kIsRequest) {
      const RxMeta meta{0x0a000001, 0x0a000002, 0, 64, 0x1234, uint16_t(bytes.size())};
      to.type_info().on_request(to, p, meta, to_t);
      responder::flush_ack(to, to_t);
    } else {
      completer::on_response(to, p, to_t);
    }
    ++n;
  }
  return n;
}

}  // namespace softrdma::engine
