// The seam between the CM protocol (comm_manager.h) and whatever carries its MADs: QP1 of a
// softrdma device in a program (verbs_mad_transport.h), an in-process switch in unit tests
// (cm/tests/fake_mad_transport.h). Gloo's transport/pair.h is the model: the protocol is
// written against this page alone, so it can be read and tested without a device.
#pragma once

#include <cstdint>
#include <span>

#include "cm/mad.h"

namespace softrdma::cm {

/// Where a MAD comes from or goes to: a device's IPv4 address and a QP on it (QP1, the GSI,
/// for every CM MAD; a reply goes to the QP the request came from, IBTA 13.5.1.1).
struct MadAddress {
  uint32_t ip = 0;  ///< host order
  uint32_t qpn = kGsiQpn;
  bool operator==(const MadAddress&) const = default;
};

/// Sends MADs for one CommManager, and tells it the time.
class MadTransport {
 public:
  virtual ~MadTransport() = default;
  /// Sends one 256-byte MAD to `to` (UD SEND with Q_Key 0x80010000). Never blocks and never
  /// fails visibly: a MAD that cannot be sent is lost, as on a lossy wire — the CM's
  /// retransmissions cover it (the transport counts what it could not send).
  virtual void send(const MadAddress& to, std::span<const uint8_t, kMadBytes> mad) = 0;
  /// Monotonic time, ns. The CM's timers (retransmission, time-wait) read only this clock.
  virtual uint64_t now_ns() = 0;
};

}  // namespace softrdma::cm
