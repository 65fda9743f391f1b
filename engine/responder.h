// The responder transport unit (responder.cpp): requests against the RQ and MRs, ACKs, NAKs,
// duplicates, out-of-order placement, CNPs (IBTA vol 1, 9.7.4-9.7.5.1; rxe_resp.c).
// Declared here, not in qp.h, so that qp_type.cpp can name the units without the QP's whole
// definition (one header per transport unit).
#pragma once

#include <cstdint>

#include "engine/transport.h"
#include "wire/roce.h"

namespace softrdma::engine {

class QueuePair;

/// Responder: executes incoming requests against the QP's receive queue and MRs.
namespace responder {
/// What the responder's checks say about a request before it is executed (rxe's
/// check_psn, check_op_seq and check_length). Anything but kNew, kDuplicate and
/// kOutOfSequence is an invalid request: NAK, then the QP goes to ERR (IBTA 9.9.3).
enum class RequestCheck : uint8_t {
  kNew,            ///< the expected PSN in a valid opcode sequence: execute it
  kDuplicate,      ///< behind the expected PSN: re-acknowledge or replay (9.7.5.1.3)
  kOutOfSequence,  ///< ahead of the expected PSN: a gap, NAKed once (9.7.5.1.2)
  kMissingFirst,   ///< middle/last packet with no message of its kind in progress
  kMissingLast,    ///< a new message (or READ/ATOMIC) inside an unfinished SEND/WRITE
  kBadLength,      ///< payload over the path MTU, or a first/middle not exactly one MTU
};
/// The outcome's name, e.g. "missing first packet".
const char* to_string(RequestCheck c);
/// Runs the checks, in order, on a request for this QP; changes nothing.
RequestCheck check_request(const QueuePair& qp, const wire::Packet& pkt);
/// Handles one request packet addressed to this QP.
void on_request(QueuePair& qp, const wire::Packet& pkt, Transport& t);
/// Sends the coalesced ACK, if one is pending (end of a receive batch).
void flush_ack(QueuePair& qp, Transport& t);
/// Sends the responses `qp` still owes (ResponderState::pending) while the path to its
/// requester has room; when it pauses again, registers the QP with Transport::wait_for_path.
/// A QP in ERR or RESET owes nothing (they are dropped).
void resume(QueuePair& qp, Transport& t);
/// Response bytes queued between two looks at Transport::path_busy: a pause costs at most
/// this much held in the sender's backlog (copied there), instead of whole READs. 64 KiB:
/// a UDP GSO run's size (net::kMaxGsoBytes), so the looks split no run on the UDP path.
inline constexpr uint64_t kResponseBurstBytes = 64 * 1024;
/// A request for this QP arrived CE-marked: send the requester a RoCEv2 CNP (IBTA vol 1
/// annex A17.9.3: BTH opcode 0x81, DestQP = the requester's QP, 16 reserved bytes, ICRC),
/// at most one per kMinTimeBetweenCnpsNs per QP (the notification point of DCQCN).
void on_congestion_experienced(QueuePair& qp, Transport& t);
/// The least time between two CNPs of one QP, ns (mlx5's NP default min_time_between_cnps,
/// 50 µs; Zhu et al. 2015, 3.1: "at most once every 50 µs").
inline constexpr uint64_t kMinTimeBetweenCnpsNs = 50'000;
}  // namespace responder

}  // namespace softrdma::engine
