// Placement: executing the data of a SEND or RDMA WRITE packet against the receive WQE and
// the registered memory it targets — what the RC/XRC responder (responder.cpp) and the UC
// and UD receive units (uc.cpp, ud.cpp) share. Each returns what happened; what a failure
// means (a NAK and ERR for RC, a dropped message for UC, a dropped datagram for UD) is the
// caller's policy (IBTA vol 1 9.9.3 error classes per service; rxe_resp.c's execute(),
// send_data_in(), write_data_in() with the class A–E handling of rxe_responder()).
#pragma once

#include <cstdint>
#include <span>

#include "engine/qp.h"

namespace softrdma::engine::placement {

/// What executing a packet's data found.
enum class Outcome : uint8_t {
  kDone,        ///< placed (and the message completed, when the packet ended it)
  kNoRecvWqe,   ///< a receive WQE was needed and none is posted (RC: RNR)
  kLength,      ///< the message does not fit the receive WQE (nothing completed)
  kProtection,  ///< an SGE of the receive WQE is not local-writable memory of the PD
  kAccess,      ///< the RETH's R_Key, range or access is refused
  kInvalid,     ///< the WRITE's payload does not match its DMA length
  /// The R_Key a SEND with invalidate names cannot be invalidated (not a bound type 2
  /// window); the receive WQE stays held for the caller to complete in error.
  kInvalidate,
};

/// Host address of remote access [va, va+len) through `rkey` for `need` (a remote Access
/// bit): the QP must allow it, the MR must exist in the responder's PD (the XRC SRQ's for
/// an XRC request) and allow it, the range must lie inside — or `rkey` is a memory window's,
/// which must grant it (engine/mw.h). nullptr otherwise.
uint8_t* check_remote(QueuePair& qp, Transport& t, uint32_t rkey, uint64_t va, uint64_t len,
                      uint32_t need);

/// Copies `data` into the receive WQE the QP holds (qp.resp.wqe) at byte `offset`:
/// kLength past its end, kProtection for an SGE that is not local-writable memory of the
/// responder's PD or whose memory was unmapped since registration (net/fault_guard.h).
Outcome scatter(QueuePair& qp, Transport& t, uint64_t offset, std::span<const uint8_t> data);

/// A SEND packet: its first/only packet takes a receive WQE (kNoRecvWqe when none), the
/// payload goes in at the message's offset, and its last/only packet completes the WQE
/// (IBV_WC_RECV, immediate data, or the invalidated R_Key of a SEND with invalidate) and
/// counts the message (MSN). On kLength / kProtection / kInvalidate the WQE stays held: the
/// caller completes it in error or keeps it for the next message.
Outcome send(QueuePair& qp, const wire::Packet& pkt, Transport& t);

/// An RDMA WRITE packet: a RETH (first/only) is checked against the responder's memory
/// (kAccess); the payload must fit the DMA length and end it exactly on the last packet
/// (kInvalid); memory unmapped since registration is kAccess too (counted in
/// resp_access_faults); a WRITE with immediate takes its receive WQE before touching memory
/// (kNoRecvWqe, so a retried packet is applied once) and completes it
/// (IBV_WC_RECV_RDMA_WITH_IMM) with its last packet.
Outcome write(QueuePair& qp, const wire::Packet& pkt, Transport& t);

/// PSNs of a message of `dma_length` bytes at the QP's MTU (a READ's responses, a WRITE's
/// packets); at least 1.
uint32_t message_psns(const QueuePair& qp, uint64_t dma_length);

}  // namespace softrdma::engine::placement
