// The interface between the RC transport units (requester, responder, completer) and the
// device that carries their packets. Keeping it this small lets each unit be tested with a
// fake that records packets and controls time.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "engine/congestion_window.h"
#include "engine/counters.h"
#include "engine/dcqcn.h"
#include "wire/roce.h"

namespace softrdma::engine {

class CompletionQueue;
class MemoryRegion;
class MemoryWindow;
class QueuePair;
class SharedReceiveQueue;
struct Cqe;

/// What the device knows of the IPv4/UDP datagram a received packet came in, beyond the
/// RoCEv2 payload: the UD receive unit writes it into the GRH area of the receive buffer
/// (IBTA vol 1 11.4.1.1; RoCEv2 puts the IPv4 header in its last 20 bytes, annex A17.4.5.1).
struct RxMeta {
  uint32_t src_ip = 0;  ///< host order
  uint32_t dst_ip = 0;  ///< host order
  uint8_t tos = 0;
  uint8_t ttl = 64;
  uint16_t ip_id = 0;              ///< as recovered from the ICRC (0 on the same-host path)
  uint16_t udp_payload_bytes = 0;  ///< BTH … ICRC
};

/// Why a connected QP's peer does not answer, as far as the device can tell (asked at each
/// retransmit timeout; net/peer_liveness.h).
enum class PeerLiveness : uint8_t {
  kUnknown,  ///< a peer on another host (or not a softrdma device here): count the timeout
  kRunning,  ///< its process runs (or sleeps, and would wake for a packet): count it
  kStalled,  ///< its process is alive but did not run — stopped (SIGSTOP, a debugger) or
             ///< starved of CPU: the timeout is not the peer's answer; a NIC would have
             ///< acknowledged meanwhile
  kDead,     ///< its process is gone (no such pid, or a zombie): it will never answer
};

/// Services a device provides to its QPs' transport units. All calls happen with the
/// device lock held.
/// Payloads of at most this many bytes are copied by Transport::transmit() at once.
inline constexpr size_t kTransmitCopyBytes = 256;

class Transport {
 public:
  virtual ~Transport() = default;
  /// Queues one packet: `h` (BTH opcode decides which extended headers are written; the
  /// pad count is filled in here) followed by `payload_len` bytes gathered from `payload`,
  /// to `dst_ip`:4791. The ICRC is computed here. Payload memory must stay valid until
  /// flush(), which every progress round ends with — but a payload of at most
  /// kTransmitCopyBytes is copied before transmit() returns. `h` is taken by reference: a Headers
  /// passed by value is copied with wide loads right after the caller's narrow field stores
  /// (a store-forwarding stall per packet; docs/performance.md).
  virtual void transmit(const wire::Headers& h, uint32_t dst_ip, std::span<const iovec> payload,
                        uint32_t payload_len) = 0;
  /// Writes RC RDMA WRITE payload straight into the responder's memory: `len` bytes gathered
  /// from `local` at `remote_va` of region `rkey`, through the responder's QP `dest_qpn` at
  /// `dst_ip` (host order). A device whose path to `dst_ip` can (the same-host path with a
  /// peer's published table, net/shm_placement.h) checks the write against that table, copies
  /// and returns true; the requester then sends the packets with the placed mark and their
  /// lengths instead of their payloads (wire::Bth::placed). `commit`, when given, runs after
  /// the copy while the responder's QP is still pinned: the requester sends the headers there,
  /// so that a responder tearing its QP down (it may have seen the bytes) waits for them and
  /// acknowledges them first (ObjectRegistry::drain_inbound). The default: false.
  virtual bool place_write(uint32_t dst_ip, uint32_t dest_qpn, uint32_t rkey, uint64_t remote_va,
                           std::span<const iovec> local, uint64_t len,
                           const std::function<void()>& commit = {}) {
    (void)dst_ip;
    (void)dest_qpn;
    (void)rkey;
    (void)remote_va;
    (void)local;
    (void)len;
    (void)commit;
    return false;
  }
  /// Whether place_write() to `dst_ip` (host order) can place now: the path to it is the
  /// same-host one and the peer's placement table is mapped and verified. The requester asks
  /// it only while its WRITEs go in-band behind unacknowledged requests (requester.cpp,
  /// RequesterState::inband_starved). The default: false.
  virtual bool can_place(uint32_t dst_ip) {
    (void)dst_ip;
    return false;
  }
  /// Sends everything transmit() queued.
  virtual void flush() = 0;
  /// Sends what transmit() queued so far, without flush()'s end-of-round work (coalesced
  /// ACKs, backlogs): a sender that paces itself by path_busy() calls it to learn whether
  /// what it queued found room. The default does nothing.
  virtual void send_queued() {}
  /// The MR with this lkey/rkey, or nullptr.
  virtual MemoryRegion* find_mr(uint32_t key) = 0;
  /// The memory window whose current R_Key is `rkey`, or nullptr. The default has none.
  virtual MemoryWindow* find_mw(uint32_t rkey) {
    (void)rkey;
    return nullptr;
  }
  /// The SRQ with this SRQ number (an XRC request's XRCETH names one), or nullptr. The
  /// default has none.
  virtual SharedReceiveQueue* find_srq(uint32_t srqn) {
    (void)srqn;
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
  /// Whether packets to `dst_ip` (host order) are waiting to leave the device (a full
  /// same-host ring's backlog): a requester then sends nothing new and calls wait_for_path();
  /// the device runs it again once they have left. A lossless link's pause (PFC), where the
  /// sender can see the receiver's free space. The default: never.
  virtual bool path_busy(uint32_t dst_ip) {
    (void)dst_ip;
    return false;
  }
  /// Registers `qp` to be run again (requester::run, and responder::resume for the READ
  /// responses it still owes) when path_busy(its peer) turns false.
  virtual void wait_for_path(QueuePair& qp) { (void)qp; }
  /// The process behind QPN `qpn` at `ip` (host order) when that is a softrdma device of
  /// this host, else 0. The default: 0.
  virtual uint32_t peer_pid(uint32_t ip, uint32_t qpn) {
    (void)ip;
    (void)qpn;
    return 0;
  }
  /// Why `qp`'s peer (its remote address and destination QPN) may be silent. Costs a few
  /// system calls; asked at retransmit timeouts only. `who` gets a description of the peer
  /// for error messages ("127.0.0.3 qpn 0x1a2 (pid 4711, stopped)"), when known. The
  /// default: kUnknown.
  virtual PeerLiveness peer_liveness(const QueuePair& qp, std::string* who = nullptr) {
    (void)qp;
    (void)who;
    return PeerLiveness::kUnknown;
  }
  /// How far beyond its expected PSN a responder keeps out-of-order packets at most, PSNs
  /// (ReceivedPsns::max_span(); its ring holds 4.5 bytes per PSN of the span it grows to, so
  /// this bounds a QP's tracking memory: 18 MiB at 2^22). The default: the requester's
  /// largest window, CongestionWindow::kMaxPsns.
  virtual uint32_t ooo_max_psns() const { return CongestionWindow::kMaxPsns; }
  /// Whether packets to `dst_ip` (host order) stay on this host: the peer is a softrdma
  /// device of this host (`peer_pid` as peer_pid() found it at RTR, non-zero) and no emulated
  /// link (SOFTRDMA_WAN) joins the two addresses. A round trip there is scheduling and
  /// queueing, never propagation (CongestionWindow::set_host_local). The default: false.
  virtual bool host_local_path(uint32_t dst_ip, uint32_t peer_pid) const {
    (void)dst_ip;
    (void)peer_pid;
    return false;
  }
  /// The start-up state the QPs of this transport towards `dst_ip` (host order) share
  /// (their ACK-train jumps' claims, CongestionWindow::set_path_share), valid as long as
  /// the transport; nullptr: none shared. The default: nullptr.
  virtual PathShare* path_share(uint32_t dst_ip) {
    (void)dst_ip;
    return nullptr;
  }
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
