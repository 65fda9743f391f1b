// The seam between the engine's objects and the device that owns them. QPs, MRs, PDs and
// CQs see a device only through this interface and Transport (engine/transport.h), never
// through Device itself: Device implements both, and a unit test gives fakes of both so
// that QPs run back to back in one process with no socket (engine/tests). UCX draws the
// same line between its RC protocol (uct rc/base) and its verbs device (rc/verbs).
#pragma once

#include <cstdint>
#include <mutex>

namespace softrdma::engine {

class MemoryRegion;
class MemoryWindow;
class QueuePair;
class SharedReceiveQueue;
class Transport;

/// What an engine object needs from its device besides the packet path: the device lock,
/// the QPN and key tables, the port's active MTU, and progress driven by a poller.
class ObjectRegistry {
 public:
  virtual ~ObjectRegistry() = default;
  /// The lock that guards every object of the device (QP state, tables, transmit queue).
  virtual std::mutex& mutex() = 0;
  /// Publishes `qp` in the QPN table; returns its QPN (24 bits, never 0 or 1). Lock held.
  virtual uint32_t register_qp(QueuePair* qp) = 0;
  /// Publishes `qp` under the QPN `qpn` (QP1, the GSI); returns false, publishing nothing,
  /// when that QPN is taken. Lock held.
  virtual bool register_qp_at(QueuePair* qp, uint32_t qpn) = 0;
  /// Removes a QPN from the table; packets to it are dropped from now on. Lock held.
  virtual void unregister_qp(uint32_t qpn) = 0;
  /// Publishes `mr` in the key table; returns its key (lkey == rkey). Lock held.
  virtual uint32_t register_mr(MemoryRegion* mr) = 0;
  /// Removes a key from the table; accesses through it fail from now on. Lock held.
  virtual void unregister_mr(uint32_t key) = 0;
  /// Publishes a memory window in the same key table (its index is never an MR's); returns
  /// its first R_Key. Lock held.
  virtual uint32_t register_mw(MemoryWindow* mw) = 0;
  /// Removes the window that holds `rkey`'s index. Lock held.
  virtual void unregister_mw(uint32_t rkey) = 0;
  /// Publishes `srq` in the SRQ-number table (XRC requests name SRQs by number); returns its
  /// SRQ number (24 bits, never 0). Lock held.
  virtual uint32_t register_srq(SharedReceiveQueue* srq) = 0;
  /// Removes an SRQ number from the table. Lock held.
  virtual void unregister_srq(uint32_t srqn) = 0;
  /// What same-host peers may write without the ring (net/shm_placement.h): `mr`'s range
  /// while it allows remote writes; `gone` (deregistration, or before a rereg changes it)
  /// withdraws it and returns only once no peer can still write through it. Lock held. The
  /// default publishes nothing.
  virtual void publish_mr(const MemoryRegion& mr, bool gone) {
    (void)mr;
    (void)gone;
  }
  /// Likewise for `qp`: an RC QP in RTR/RTS/SQD that allows remote writes is published with
  /// its PD, any other state (or `gone`) withdraws it. Lock held.
  virtual void publish_qp(const QueuePair& qp, bool gone) {
    (void)qp;
    (void)gone;
  }
  /// Processes the packets already waiting on the same-host rings (and sends what they
  /// draw, e.g. ACKs). Called before modify_qp takes a QP to ERR or RESET, after withdrawing
  /// it (publish_qp(gone), which waits for senders between copy and headers): a placed
  /// WRITE's bytes are visible to the application before this device has read its headers
  /// (net/shm_placement.h), so an application that saw them and tears its QP down must not
  /// leave them unacknowledged. Lock held. The default does nothing.
  virtual void drain_inbound() {}
  /// Active MTU of the port as an IB MTU enum (1 = 256 B … 5 = 4096 B): the largest
  /// path_mtu a QP may be given.
  virtual uint8_t active_mtu() const = 0;
  /// Where the device's QPs send their packets.
  virtual Transport& transport() = 0;
  /// Processes pending packets and timers on the calling thread if the lock is free;
  /// returns at once otherwise (a CQ poll that found nothing calls it).
  virtual void try_progress() = 0;
};

}  // namespace softrdma::engine
