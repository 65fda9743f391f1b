// Value types shared by the engine's units: work requests, completions, QP attributes.
// Enumerations use the numeric values of the verbs API (<infiniband/verbs.h>) so the ABI
// layer can pass them through; verbs/ static_asserts that they match.
#pragma once

#include <cstdint>
#include <system_error>
#include <vector>

namespace softrdma::engine {

/// Result of an engine call: std::errc{} on success, else the errno verbs returns.
using Status = std::errc;
inline constexpr Status kOk = Status{};

/// QP states (IBTA vol 1, 10.3.1; values of enum ibv_qp_state).
enum class QpState : uint8_t { kReset = 0, kInit, kRtr, kRts, kSqd, kSqe, kErr };

/// Memory access rights (values of enum ibv_access_flags).
enum Access : uint32_t {
  kLocalWrite = 1u << 0,
  kRemoteWrite = 1u << 1,
  kRemoteRead = 1u << 2,
  kRemoteAtomic = 1u << 3,
  kMwBind = 1u << 4,
  kZeroBased = 1u << 5,
  kOnDemand = 1u << 6,
  kHugetlb = 1u << 7,
  kRelaxedOrdering = 1u << 20,
};

/// Scatter/gather element: `length` bytes at virtual address `addr` of the MR `lkey`.
struct Sge {
  uint64_t addr = 0;
  uint32_t length = 0;
  uint32_t lkey = 0;
};

/// Send work request opcodes (values of enum ibv_wr_opcode).
enum class WrOpcode : uint8_t {
  kRdmaWrite = 0,
  kRdmaWriteImm = 1,
  kSend = 2,
  kSendImm = 3,
  kRdmaRead = 4,
  kCompareSwap = 5,
  kFetchAdd = 6,
  kLocalInv = 7,  ///< invalidate a type 2 memory window of this QP (IBTA 10.6.7.2.2)
  kBindMw = 8,    ///< bind a memory window to an MR range (IBTA 10.6.7.2.1)
  kSendInv = 9,   ///< SEND that invalidates the responder's R_Key (IETH)
  /// RDMA ATOMIC WRITE (IBTA vol 1 rel. 1.5): 8 bytes stored atomically at remote_addr/rkey.
  kAtomicWrite = 15,
};

/// Send WR flags (values of enum ibv_send_flags).
enum SendFlag : uint32_t {
  kFence = 1u << 0,
  kSignaled = 1u << 1,
  kSolicited = 1u << 2,
  kInline = 1u << 3,
};

/// What a BIND_MW work request binds (ibv_send_wr::bind_mw, ibv_mw_bind_info): the window
/// named by its current R_Key, given R_Key `rkey` (same index, new 8-bit key), over
/// [addr, addr+length) of the MR `mr_lkey` with `access` (Access bits). length 0 unbinds a
/// type 1 window.
struct MwBind {
  uint32_t mw_rkey = 0;
  uint32_t rkey = 0;
  uint32_t mr_lkey = 0;
  uint64_t addr = 0;
  uint64_t length = 0;
  uint32_t access = 0;
};

/// A send work request as posted (the ABI layer fills it from ibv_send_wr).
struct SendWr {
  uint64_t wr_id = 0;
  WrOpcode opcode = WrOpcode::kSend;
  uint32_t flags = 0;   ///< SendFlag bits
  uint32_t imm_be = 0;  ///< immediate data, network order as in ibv_send_wr
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint64_t compare_add = 0;  ///< CmpSwap compare value / FetchAdd addend
  uint64_t swap = 0;         ///< CmpSwap swap value
  const Sge* sg_list = nullptr;
  uint32_t num_sge = 0;
  uint32_t invalidate_rkey = 0;  ///< SEND_WITH_INV / LOCAL_INV: the R_Key to invalidate
  MwBind bind;                   ///< BIND_MW
  /// UD (wr.ud): the destination from the address handle, resolved at post (host-order
  /// IPv4 address; 0: no AH given), the destination QP and its Q_Key (one with the most
  /// significant bit set means "the QP's own Q_Key", IBTA vol 1 10.2.5).
  uint32_t ud_dst_ip = 0;
  uint32_t remote_qpn = 0;
  uint32_t remote_qkey = 0;
  /// XRC send QPs (qp_type.xrc.remote_srqn): the XRC SRQ at the target (24 bits).
  uint32_t remote_srqn = 0;
};

/// A posted receive work request (on a QP's receive queue or an SRQ).
struct RecvWqe {
  uint64_t wr_id = 0;
  std::vector<Sge> sges;
  uint64_t length = 0;  ///< sum of SGE lengths
};

/// Completion status (values of enum ibv_wc_status).
enum class WcStatus : uint8_t {
  kSuccess = 0,
  kLocLenErr = 1,
  kLocQpOpErr = 2,
  kLocEecOpErr = 3,
  kLocProtErr = 4,
  kWrFlushErr = 5,
  kMwBindErr = 6,
  kBadRespErr = 7,
  kLocAccessErr = 8,
  kRemInvReqErr = 9,
  kRemAccessErr = 10,
  kRemOpErr = 11,
  kRetryExcErr = 12,
  kRnrRetryExcErr = 13,
  kLocRddViolErr = 14,
  kRemInvRdReqErr = 15,
  kRemAbortErr = 16,
  kInvEecnErr = 17,
  kInvEecStateErr = 18,
  kFatalErr = 19,
  kRespTimeoutErr = 20,
  kGeneralErr = 21,
};

/// Completion opcodes (values of enum ibv_wc_opcode).
enum class WcOpcode : uint8_t {
  kSend = 0,
  kRdmaWrite = 1,
  kRdmaRead = 2,
  kCompSwap = 3,
  kFetchAdd = 4,
  kBindMw = 5,
  kLocalInv = 6,
  kAtomicWrite = 9,
  kRecv = 128,
  kRecvRdmaWithImm = 129,
};

/// Completion flags (values of enum ibv_wc_flags).
enum WcFlag : uint32_t { kWcGrh = 1u << 0, kWcWithImm = 1u << 1, kWcWithInv = 1u << 3 };

/// A completion queue entry (maps 1:1 onto struct ibv_wc).
struct Cqe {
  uint64_t wr_id = 0;
  WcStatus status = WcStatus::kSuccess;
  WcOpcode opcode = WcOpcode::kSend;
  uint32_t vendor_err = 0;
  uint32_t byte_len = 0;
  /// Immediate data (network order) with kWcWithImm, or the invalidated R_Key (host order)
  /// with kWcWithInv: the union ibv_wc keeps in one field.
  uint32_t imm_be = 0;
  uint32_t qp_num = 0;
  uint32_t src_qp = 0;
  uint32_t wc_flags = 0;
  /// ibv_wc.sl. 0 except on a UD receive completion, where it carries the RoCE packet type
  /// as a ConnectX reports it there (kSlRoceV2Ipv4; see ud::on_request).
  uint8_t sl = 0;
};

/// QP attribute mask bits (values of enum ibv_qp_attr_mask).
enum QpAttrMask : uint32_t {
  kAttrState = 1u << 0,
  kAttrCurState = 1u << 1,
  kAttrEnSqdAsyncNotify = 1u << 2,
  kAttrAccessFlags = 1u << 3,
  kAttrPkeyIndex = 1u << 4,
  kAttrPort = 1u << 5,
  kAttrQkey = 1u << 6,
  kAttrAv = 1u << 7,
  kAttrPathMtu = 1u << 8,
  kAttrTimeout = 1u << 9,
  kAttrRetryCnt = 1u << 10,
  kAttrRnrRetry = 1u << 11,
  kAttrRqPsn = 1u << 12,
  kAttrMaxQpRdAtomic = 1u << 13,
  kAttrAltPath = 1u << 14,
  kAttrMinRnrTimer = 1u << 15,
  kAttrSqPsn = 1u << 16,
  kAttrMaxDestRdAtomic = 1u << 17,
  kAttrPathMigState = 1u << 18,
  kAttrCap = 1u << 19,
  kAttrDestQpn = 1u << 20,
  kAttrRateLimit = 1u << 25,
};

/// A 16-byte GID; softrdma uses the IPv4-mapped form ::ffff:a.b.c.d (RoCEv2).
struct Gid {
  uint8_t raw[16] = {};
  /// The GID for a host-order IPv4 address.
  static Gid from_ipv4(uint32_t ip);
  /// True if this is an IPv4-mapped GID; then `ip` receives the address (host order).
  bool to_ipv4(uint32_t& ip) const;
};

/// Address vector: where a connected QP sends, or what an address handle names
/// (ibv_ah_attr with its GRH).
struct AddressVector {
  bool is_global = false;
  Gid dgid;
  uint32_t flow_label = 0;
  uint8_t sgid_index = 0;
  uint8_t hop_limit = 0;
  uint8_t traffic_class = 0;
  uint8_t sl = 0;
  uint8_t port_num = 0;
  uint8_t static_rate = 0;
  uint16_t dlid = 0;
  uint8_t src_path_bits = 0;
};

/// QP capacities (ibv_qp_cap).
struct QpCap {
  uint32_t max_send_wr = 0;
  uint32_t max_recv_wr = 0;
  uint32_t max_send_sge = 0;
  uint32_t max_recv_sge = 0;
  uint32_t max_inline_data = 0;
};

/// QP attributes settable by modify and returned by query (subset of ibv_qp_attr that an
/// RC QP uses). Units: timeout and min_rnr_timer are IBTA 5-bit codes; path_mtu is the IB
/// MTU enum (1 = 256 B … 5 = 4096 B).
struct QpAttr {
  QpState state = QpState::kReset;
  QpState cur_state = QpState::kReset;
  uint8_t path_mtu = 0;
  uint32_t qkey = 0;
  uint32_t rq_psn = 0;
  uint32_t sq_psn = 0;
  uint32_t dest_qp_num = 0;
  uint32_t access_flags = 0;
  QpCap cap;
  AddressVector ah;
  uint16_t pkey_index = 0;
  bool en_sqd_async_notify = false;
  bool sq_draining = false;
  uint8_t max_rd_atomic = 0;
  uint8_t max_dest_rd_atomic = 0;
  uint8_t min_rnr_timer = 0;
  uint8_t port_num = 0;
  uint8_t timeout = 0;
  uint8_t retry_cnt = 0;
  uint8_t rnr_retry = 0;
};

/// QP types (values of enum ibv_qp_type). XRC_SEND is IBTA's XRC initiator (INI), XRC_RECV
/// its target (TGT), annex A14.
enum class QpType : uint8_t { kRc = 2, kUc = 3, kUd = 4, kXrcSend = 9, kXrcRecv = 10 };

/// Device limits reported by query_device and enforced at object creation.
struct DeviceLimits {
  static constexpr uint32_t kMaxQp = 1u << 16;
  /// Work requests per send or receive queue: mlx5's 32,768 (rxe reports 16,384). A send
  /// queue's WQEs are held only while posted (QueuePair::sq), so the depth costs nothing
  /// until used; kv keeps up to this many 32 KiB WRITEs outstanding per QP on a long path —
  /// at 16,384, two QPs' 1 GiB could not cover 100 Gbit/s × 50 ms with 0.1 % loss, where
  /// the WRITEs behind each hole hold their slots for the round trip its repair takes
  /// (docs/kv.md, Llama-3-70B 32 K).
  static constexpr uint32_t kMaxQpWr = 32768;
  static constexpr uint32_t kMaxSge = 32;
  static constexpr uint32_t kMaxCq = 1u << 16;
  static constexpr uint32_t kMaxCqe = 1u << 20;
  static constexpr uint32_t kMaxMr = 1u << 20;
  static constexpr uint64_t kMaxMrSize = ~0ull;
  static constexpr uint32_t kMaxPd = 1u << 16;
  static constexpr uint32_t kMaxMw = 1u << 16;
  static constexpr uint32_t kMaxQpRdAtom = 128;
  static constexpr uint32_t kMaxInlineData = 256;
  static constexpr uint32_t kMaxSrq = 1u << 16;
  static constexpr uint32_t kMaxSrqWr = 16384;
  static constexpr uint32_t kMaxSrqSge = 32;
  static constexpr uint32_t kMaxAh = 1u << 16;
  /// Multicast groups a device's QPs can be attached to at once: each costs the device one
  /// UDP socket (engine/multicast.cpp), so far fewer than rxe's 8192.
  static constexpr uint32_t kMaxMcastGrp = 64;
  /// QPs attached to one group (rxe's value).
  static constexpr uint32_t kMaxMcastQpAttach = 56;
  static constexpr uint32_t kMaxTotalMcastQpAttach = kMaxMcastGrp * kMaxMcastQpAttach;
  /// Largest message, bytes. IBTA allows 2^31; rxe caps at 8 MiB, we go to 2 GiB.
  static constexpr uint64_t kMaxMsgSize = 1ull << 31;
};

/// Bytes in an IB MTU enum value (1 → 256 … 5 → 4096); 0 if out of range.
constexpr uint32_t mtu_bytes(uint8_t mtu_enum) {
  return (mtu_enum >= 1 && mtu_enum <= 5) ? (128u << mtu_enum) : 0u;
}

}  // namespace softrdma::engine
