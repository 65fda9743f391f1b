// The work-request table: one row per send work-request opcode (enum ibv_wr_opcode) saying
// what that request is — its class, which flags and fields it honours, the completion it
// produces and the wire opcodes that carry it. The requester, completer, QP and the verbs
// layer read this row instead of switching on the opcode; the wire packet table
// (wire/roce.h) describes packets, this one describes requests. Linux rxe keeps the same
// pair: rxe_wr_opcode_info[] beside rxe_opcode_info[] (rxe_opcode.c).
#pragma once

#include <cstdint>

#include "engine/types.h"
#include "wire/roce.h"

namespace softrdma::engine {

/// What a work request does at the target (IBTA vol 1, 9.4): the four RC operation kinds.
enum class WrClass : uint8_t {
  kSend,    ///< SEND: consumes a receive WQE at the target
  kWrite,   ///< RDMA WRITE: places data at a remote address
  kRead,    ///< RDMA READ: asks for data, answered by read responses
  kAtomic,  ///< ATOMIC: 8-byte compare&swap / fetch&add, answered by an atomic ACK
  /// RDMA ATOMIC WRITE (IBTA vol 1 rel. 1.5): one request packet with a RETH and the 8 bytes
  /// the target stores atomically, answered by a plain ACK. Like READ and atomics it takes
  /// one of max_rd_atomic's credits (the responder keeps a resource for it) and a fence
  /// waits for it; its local data is read, not written.
  kAtomicWrite,
  /// A local operation on this device's memory windows (BIND_MW, LOCAL_INV): executed when
  /// the requester reaches it, no packet, no PSN; completed in SQ order (IBTA 10.6.7.2).
  kLocal,
};

/// One row of the work-request table.
struct WrOpcodeInfo {
  const char* name;  ///< the ibv_wr_opcode spelling, e.g. "IBV_WR_SEND_WITH_IMM"
  WrClass cls;
  /// Carries immediate data (ImmDt on its last/only packet, IBTA 9.3.4).
  bool has_imm;
  /// IBV_SEND_INLINE is honoured (data copied at post time); ignored where false, as
  /// rdma-core providers do for READ and atomics, whose local buffer is written, not read.
  bool inline_allowed;
  /// Opcode of the send completion (ibv_wc_opcode).
  WcOpcode wc_opcode;
  /// BTH opcodes of the request packets: first/middle/last of a multi-packet message and
  /// the only packet of a single-packet one. READ and atomics send one request packet per
  /// request (a READ chunk), so all four are that packet's opcode.
  wire::Opcode first, middle, last, only;
  /// The target completes a receive WQE for this request (SEND, WRITE with immediate);
  /// the same fact the wire table's kConsumesRecvWqe gives per packet.
  bool consumes_recv_wqe;
  /// Carries a response (READ, atomics): it takes one of max_rd_atomic's credits, a fence
  /// waits for it, its local SGEs are written and so need LOCAL_WRITE.
  bool read_or_atomic;
  /// The message length this request must have, bytes (8 for atomics); 0: any.
  uint8_t fixed_length;

  /// Takes one of max_rd_atomic's credits until it is answered, and a fence waits for it
  /// (IBTA 10.8.3.3): READs, atomics and ATOMIC WRITE.
  constexpr bool takes_rd_atomic_credit() const {
    return read_or_atomic || cls == WrClass::kAtomicWrite;
  }

  /// Wire opcode of a data packet: `first`/`last` say where in the message it lies.
  constexpr wire::Opcode wire_opcode(bool is_first, bool is_last) const {
    return is_first ? (is_last ? only : first) : (is_last ? last : middle);
  }
};

/// Rows of the table: ibv_wr_opcode values IBV_WR_RDMA_WRITE (0) … IBV_WR_ATOMIC_WRITE (15).
/// Rows without a name (TSO 10, DRIVER1 11, 12, 13, FLUSH 14) are opcodes the engine does not
/// implement.
inline constexpr unsigned kWrOpcodeCount = 16;

/// The wire opcodes of a request that sends none (a local operation).
inline constexpr wire::Opcode kNoWireOpcode = wire::Opcode::kCnp;

/// The table, indexed by WrOpcode (ibv_wr_opcode value).
inline constexpr WrOpcodeInfo kWrOpcodeTable[kWrOpcodeCount] = {
    {.name = "IBV_WR_RDMA_WRITE",
     .cls = WrClass::kWrite,
     .has_imm = false,
     .inline_allowed = true,
     .wc_opcode = WcOpcode::kRdmaWrite,
     .first = wire::Opcode::kWriteFirst,
     .middle = wire::Opcode::kWriteMiddle,
     .last = wire::Opcode::kWriteLast,
     .only = wire::Opcode::kWriteOnly,
     .consumes_recv_wqe = false,
     .read_or_atomic = false,
     .fixed_length = 0},
    {.name = "IBV_WR_RDMA_WRITE_WITH_IMM",
     .cls = WrClass::kWrite,
     .has_imm = true,
     .inline_allowed = true,
     .wc_opcode = WcOpcode::kRdmaWrite,
     .first = wire::Opcode::kWriteFirst,
     .middle = wire::Opcode::kWriteMiddle,
     .last = wire::Opcode::kWriteLastImm,
     .only = wire::Opcode::kWriteOnlyImm,
     .consumes_recv_wqe = true,
     .read_or_atomic = false,
     .fixed_length = 0},
    {.name = "IBV_WR_SEND",
     .cls = WrClass::kSend,
     .has_imm = false,
     .inline_allowed = true,
     .wc_opcode = WcOpcode::kSend,
     .first = wire::Opcode::kSendFirst,
     .middle = wire::Opcode::kSendMiddle,
     .last = wire::Opcode::kSendLast,
     .only = wire::Opcode::kSendOnly,
     .consumes_recv_wqe = true,
     .read_or_atomic = false,
     .fixed_length = 0},
    {.name = "IBV_WR_SEND_WITH_IMM",
     .cls = WrClass::kSend,
     .has_imm = true,
     .inline_allowed = true,
     .wc_opcode = WcOpcode::kSend,
     .first = wire::Opcode::kSendFirst,
     .middle = wire::Opcode::kSendMiddle,
     .last = wire::Opcode::kSendLastImm,
     .only = wire::Opcode::kSendOnlyImm,
     .consumes_recv_wqe = true,
     .read_or_atomic = false,
     .fixed_length = 0},
    {.name = "IBV_WR_RDMA_READ",
     .cls = WrClass::kRead,
     .has_imm = false,
     .inline_allowed = false,
     .wc_opcode = WcOpcode::kRdmaRead,
     .first = wire::Opcode::kReadRequest,
     .middle = wire::Opcode::kReadRequest,
     .last = wire::Opcode::kReadRequest,
     .only = wire::Opcode::kReadRequest,
     .consumes_recv_wqe = false,
     .read_or_atomic = true,
     .fixed_length = 0},
    {.name = "IBV_WR_ATOMIC_CMP_AND_SWP",
     .cls = WrClass::kAtomic,
     .has_imm = false,
     .inline_allowed = false,
     .wc_opcode = WcOpcode::kCompSwap,
     .first = wire::Opcode::kCompareSwap,
     .middle = wire::Opcode::kCompareSwap,
     .last = wire::Opcode::kCompareSwap,
     .only = wire::Opcode::kCompareSwap,
     .consumes_recv_wqe = false,
     .read_or_atomic = true,
     .fixed_length = 8},
    {.name = "IBV_WR_ATOMIC_FETCH_AND_ADD",
     .cls = WrClass::kAtomic,
     .has_imm = false,
     .inline_allowed = false,
     .wc_opcode = WcOpcode::kFetchAdd,
     .first = wire::Opcode::kFetchAdd,
     .middle = wire::Opcode::kFetchAdd,
     .last = wire::Opcode::kFetchAdd,
     .only = wire::Opcode::kFetchAdd,
     .consumes_recv_wqe = false,
     .read_or_atomic = true,
     .fixed_length = 8},
    {.name = "IBV_WR_LOCAL_INV",
     .cls = WrClass::kLocal,
     .has_imm = false,
     .inline_allowed = false,
     .wc_opcode = WcOpcode::kLocalInv,
     .first = kNoWireOpcode,
     .middle = kNoWireOpcode,
     .last = kNoWireOpcode,
     .only = kNoWireOpcode,
     .consumes_recv_wqe = false,
     .read_or_atomic = false,
     .fixed_length = 0},
    {.name = "IBV_WR_BIND_MW",
     .cls = WrClass::kLocal,
     .has_imm = false,
     .inline_allowed = false,
     .wc_opcode = WcOpcode::kBindMw,
     .first = kNoWireOpcode,
     .middle = kNoWireOpcode,
     .last = kNoWireOpcode,
     .only = kNoWireOpcode,
     .consumes_recv_wqe = false,
     .read_or_atomic = false,
     .fixed_length = 0},
    {.name = "IBV_WR_SEND_WITH_INV",
     .cls = WrClass::kSend,
     .has_imm = false,
     .inline_allowed = true,
     .wc_opcode = WcOpcode::kSend,
     .first = wire::Opcode::kSendFirst,
     .middle = wire::Opcode::kSendMiddle,
     .last = wire::Opcode::kSendLastInv,
     .only = wire::Opcode::kSendOnlyInv,
     .consumes_recv_wqe = true,
     .read_or_atomic = false,
     .fixed_length = 0},
    {},  // 10 IBV_WR_TSO: UD over Ethernet only (mlx5)
    {},  // 11 IBV_WR_DRIVER1
    {},
    {},
    {},  // 14 IBV_WR_FLUSH
    {.name = "IBV_WR_ATOMIC_WRITE",
     .cls = WrClass::kAtomicWrite,
     .has_imm = false,
     .inline_allowed = true,
     .wc_opcode = WcOpcode::kAtomicWrite,
     .first = wire::Opcode::kAtomicWrite,
     .middle = wire::Opcode::kAtomicWrite,
     .last = wire::Opcode::kAtomicWrite,
     .only = wire::Opcode::kAtomicWrite,
     .consumes_recv_wqe = false,
     .read_or_atomic = false,
     .fixed_length = 8},
};

/// Whether `opcode` (an ibv_wr_opcode value as the application passed it) is one the
/// engine implements; the others (TSO, DRIVER1, FLUSH) are refused with EINVAL at post
/// time, as rxe refuses opcodes its QP type does not allow.
constexpr bool wr_opcode_supported(uint32_t opcode) {
  return opcode < kWrOpcodeCount && kWrOpcodeTable[opcode].name != nullptr;
}

/// The row of a supported opcode (check wr_opcode_supported() first for untrusted values).
constexpr const WrOpcodeInfo& wr_info(WrOpcode op) {
  return kWrOpcodeTable[static_cast<uint8_t>(op)];
}

// The rows are in ibv_wr_opcode order and agree with the wire table.
static_assert(static_cast<unsigned>(WrOpcode::kAtomicWrite) + 1 == kWrOpcodeCount);
static_assert(wr_info(WrOpcode::kAtomicWrite).only == wire::Opcode::kAtomicWrite);
static_assert(wr_info(WrOpcode::kAtomicWrite).takes_rd_atomic_credit());
static_assert(wr_info(WrOpcode::kBindMw).wc_opcode == WcOpcode::kBindMw);
static_assert(wr_info(WrOpcode::kSendInv).only == wire::Opcode::kSendOnlyInv);
static_assert(wr_info(WrOpcode::kRdmaWrite).wc_opcode == WcOpcode::kRdmaWrite);
static_assert(wr_info(WrOpcode::kSendImm).only == wire::Opcode::kSendOnlyImm);
static_assert(wr_info(WrOpcode::kRdmaRead).cls == WrClass::kRead);
static_assert(wr_info(WrOpcode::kCompareSwap).wc_opcode == WcOpcode::kCompSwap);
static_assert(wr_info(WrOpcode::kFetchAdd).only == wire::Opcode::kFetchAdd);
static_assert([] {
  for (const WrOpcodeInfo& i : kWrOpcodeTable) {
    if (!i.name) continue;  // not implemented
    if (i.cls == WrClass::kLocal) {
      if (i.inline_allowed || i.read_or_atomic || i.consumes_recv_wqe) return false;
      continue;
    }
    const bool response = i.cls == WrClass::kRead || i.cls == WrClass::kAtomic;
    if (i.read_or_atomic != response || i.inline_allowed == response) return false;
    if ((i.fixed_length != 0) != (i.cls == WrClass::kAtomic || i.cls == WrClass::kAtomicWrite))
      return false;
    if (i.consumes_recv_wqe != (i.cls == WrClass::kSend || i.has_imm)) return false;
  }
  return true;
}());

}  // namespace softrdma::engine
