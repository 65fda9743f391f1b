// The interface between the RC transport units (requester, responder, completer) and the
// device that carries their packets. Keeping it this small lets each unit be tested with a
// fake that records packets and controls time.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <span>

#include "engine/counters.h"
#include "engine/dcqcn.h"
#include "wire/roce.h"

namespace softrdma::engine {

class CompletionQueue;
class MemoryRegion;
class MemoryWindow;
class QueuePair;
struct Cqe;

/// Services a device provides to its QPs' transport units. All calls happen with the
/// device lock held.
class Transport {
 public:
  virtual ~Transport() = default;
  /// Queues one packet: `h` (BTH opcode decides which extended headers are written; the
  /// pad count is filled in here) followed by `payload_len` bytes gathered from `payload`,
  /// to `dst_ip`:4791. The ICRC is computed here. Payload memory must stay valid until
  /// flush(), which every progress round ends with.
  virtual void transmit(wire::Headers h, uint32_t dst_ip, std::span<const iovec> payload,
                        uint32_t payload_len) = 0;
  /// Sends everything transmit() queued.
  virtual void flush() = 0;
  /// The MR with this lkey/rkey, or nullptr.
  virtual MemoryRegion* find_mr(uint32_t key) = 0;
  /// The memory window whose current R_Key is `rkey`, or nullptr. The default has none.
  virtual MemoryWindow* find_mw(uint32_t rkey) {
    (void)rkey;
    return nullptr;
  }
  /// The device's counters.
  virtual Counters& counters() = 0;
  /// Monotonic time, ns.
  virtual uint64_t now_ns() = 0;
  /// Delivers a receive completion to `cq` (IBTA: the CQE of an incoming SEND or WRITE
  /// with immediate). A device may hold it until the ACK for that message has been sent, so
  /// that a completion the application sees implies its ACK is on its way — as with a NIC,
  /// a process killed right after it saw the completion has still acknowledged the message.
  /// The default delivers at once.
  virtual void deliver_recv_completion(CompletionQueue& cq, const Cqe& cqe, bool solicited);
  /// Tells the device that `qp` now has a timer due at `deadline_ns` (ns, now_ns() clock):
  /// the device queues the QP for that time and may wake its progress thread earlier than
  /// planned. Only QPs with an armed timer are ever visited by the timer round.
  virtual void timer_armed(QueuePair& qp, uint64_t deadline_ns) = 0;
  /// Whether this device's QPs take part in selective retransmission
  /// (SOFTRDMA_SELECTIVE_RETX): requesters mark their requests as able to take selective
  /// NAKs, responders keep out-of-order packets of requesters that do and report the gaps
  /// (docs/wide-area.md). The default is off.
  virtual bool selective_retransmit() const { return false; }
  /// Whether requesters towards `dst_ip` (host order) pace their packets with DCQCN
  /// (SOFTRDMA_CC); if so `out` gets the reaction point's parameters (the line rate: the
  /// rate of the emulated link towards `dst_ip`, when there is one). The default is off.
  virtual bool congestion_control(uint32_t dst_ip, DcqcnParams& out) const {
    (void)dst_ip;
    (void)out;
    return false;
  }
};

}  // namespace softrdma::engine
