// The UC receive unit (uc.cpp).
// Declared here, not in qp.h, so that qp_type.cpp can name the units without the QP's whole
// definition (one header per transport unit).
#pragma once

#include "engine/transport.h"
#include "wire/roce.h"

namespace softrdma::engine {

class QueuePair;

/// UC receive unit (uc.cpp): executes SEND and RDMA WRITE packets of an unreliable
/// connection. No ACK, NAK or duplicate handling: a packet whose PSN is not the expected one
/// or that cannot be executed (no receive WQE, bad R_Key, length) loses the rest of its
/// message, which is dropped and counted (uc_dropped_pkts) until the next first/only packet
/// (IBTA vol 1 ch. 9 UC; rxe check_psn, resp.drop_msg).
namespace uc {
void on_request(QueuePair& qp, const wire::Packet& pkt, const RxMeta& meta, Transport& t);
}  // namespace uc

}  // namespace softrdma::engine
