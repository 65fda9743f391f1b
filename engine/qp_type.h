// The QP-type table: one row per ibv_qp_type the engine implements, saying what a QP of
// that type is — the transport service its packets carry (wire/roce.h), whether it is
// reliable (ACKs, a PSN window, retransmission) and connected (one address vector and one
// destination QP), which queues it has, which work requests it takes, the required and
// optional attribute masks of its state transitions (IBTA vol 1 table 91, the table Linux
// keeps in ib_modify_qp_is_ok) and the unit that executes the requests it receives. The QP,
// the requester and the device read the row instead of testing the type (rxe spreads the
// same facts over `qp_type(qp) == IB_QPT_...` tests); the work-request table (wr_table.h)
// and the wire opcode table are the other two tables of the same kind.
#pragma once

#include <cstdint>
#include <span>

#include "engine/transport.h"
#include "engine/types.h"
#include "engine/wr_table.h"
#include "wire/roce.h"

namespace softrdma::engine {

class QueuePair;

/// One valid state transition of a QP type: the attributes ibv_modify_qp must give
/// (`required`) and may give (`optional`) besides IBV_QP_STATE.
struct QpTransition {
  QpState from, to;
  uint32_t required, optional;
};

/// Executes one request packet addressed to a QP of the type (the device's receive checks
/// have passed): the RC/XRC responder, the UC or the UD receive unit.
using RequestHandler = void (*)(QueuePair& qp, const wire::Packet& pkt, const RxMeta& meta,
                                Transport& t);

/// One row of the QP-type table.
struct QpTypeInfo {
  const char* name;  ///< the ibv_qp_type spelling, e.g. "IBV_QPT_UD"
  QpType type;
  /// Service of its packets: their opcodes' top bits, and the service a received packet
  /// must have to reach it.
  wire::Service service;
  /// ACK/NAK, PSN window, retransmit and RNR timers (IBTA 9.7): RC and XRC. UC and UD send
  /// each packet once and complete a send WQE when its last packet has left.
  bool reliable;
  /// One peer, fixed by the AV and destination QPN at RTR; packets from another address
  /// are dropped. UD names its peer per work request (an address handle).
  bool connected;
  bool has_send_queue;   ///< ibv_post_send allowed (not XRC_RECV)
  bool has_recv_queue;   ///< ibv_post_recv or an SRQ at creation (not the XRC types)
  bool takes_requests;   ///< receives request packets (has a responder)
  bool takes_responses;  ///< receives ACKs and responses (has a completer): RC, XRC_SEND
  /// Messages are single packets of at most the port's MTU (UD, IBTA C10-93.1.1).
  bool single_packet;
  /// Work-request classes ibv_post_send takes: bit (1 << WrClass) each.
  uint32_t wr_classes;
  /// Valid transitions besides "any state → RESET" and "any state → ERR" (which take no
  /// other attribute).
  std::span<const QpTransition> transitions;
  /// Executes a request packet (takes_requests).
  RequestHandler on_request;

  /// Whether ibv_post_send takes `cls` on this type.
  constexpr bool allows(WrClass cls) const { return wr_classes & (1u << unsigned(cls)); }
  /// The BTH opcode of `op` in this type's service.
  constexpr uint8_t opcode(wire::Opcode op) const { return wire::opcode_of(service, op); }
};

/// The row of `type`, or nullptr for a type the engine does not implement (RD, raw packet,
/// driver-specific types).
const QpTypeInfo* qp_type_info(QpType type);

}  // namespace softrdma::engine
