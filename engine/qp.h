// Queue pairs of every type the engine implements — RC, UC, UD, XRC send and XRC receive
// (the QP-type table, qp_type.h, says what each is): the state machine (IBTA vol 1, 10.3 and
// table 91 of valid modify transitions), the send and receive queues, and the state the
// transport units keep per QP:
//   requester (requester.cpp) — turns send WQEs into request packets (rxe_req.c),
//   responder (responder.cpp) — executes incoming RC/XRC requests, sends ACK/NAK/responses
//                               (rxe_resp.c); placement.cpp holds what it shares with
//   uc (uc.cpp), ud (ud.cpp)  — the receive units of the unreliable services,
//   completer (completer.cpp) — matches ACKs and responses to WQEs, retries, and
//                               produces send CQEs (rxe_comp.c).
// All QP state is guarded by the owning device's lock.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "engine/congestion_window.h"
#include "engine/memory.h"
#include "engine/object_registry.h"
#include "engine/qp_type.h"
#include "engine/queue_memory.h"
#include "engine/received_psns.h"
#include "engine/recovery.h"
#include "engine/transport.h"
#include "engine/types.h"
#include "engine/wr_table.h"
#include "wire/roce.h"

namespace softrdma::engine {

class CompletionQueue;
class SharedReceiveQueue;
class XrcDomain;

/// A PSN value no packet carries (PSNs are 24 bits): "none".
inline constexpr uint32_t kNoPsn = 0xffffffff;
/// How long a peer whose process is alive but does not run (stopped, or starved of CPU:
/// Transport::peer_liveness) keeps its connections before retransmit timeouts count against
/// retry_cnt again, ns: a debugger's breakpoint, a SIGSTOP/SIGCONT, a loaded machine's
/// scheduling delays. A NIC keeps acknowledging for a stopped process indefinitely; a
/// software device cannot, and a peer stuck longer than this is treated as lost.
inline constexpr uint64_t kMaxPeerStallNs = 60'000'000'000;

/// A posted send work request and the requester's progress through it.
struct SendWqe {
  SendWr wr;              ///< as posted (sg_list not used; see sges / inline_data)
  std::vector<Sge> sges;  ///< copy of the posted SGE list
  std::vector<uint8_t> inline_data;
  std::vector<iovec> local;  ///< SGEs resolved to host memory when the WQE starts
  uint64_t length = 0;       ///< message bytes
  uint32_t first_psn = 0;    ///< valid once started
  uint32_t npsn = 0;         ///< PSNs the message uses (≥ 1)
  /// READ: byte offsets inside a chunk where a request ended because the window had no room
  /// for the rest of it (requester.cpp emit_read_request). The responder may have executed
  /// that request as new, so no later request for this WQE may cross the offset: a duplicate
  /// READ must lie within the one executed (IBTA vol 1 9.7.5.1.3.1). Usually empty.
  std::vector<uint64_t> read_cuts;
  bool started = false;
  /// An RC WRITE without immediate data: the first transmission of each of its packets may be
  /// placed in the responder's memory by the device (Transport::place_write) and then carries
  /// the placed mark and its length; its resends carry the payload.
  bool placeable = false;
  /// Sent as one RDMA WRITE Only per packet, each with its RETH (the remote address of its
  /// own bytes): a responder that lost a packet places every one after it, where a lost
  /// WRITE First left the MIDDLEs without an address (refused, resent). IRN carries a RETH
  /// in every packet for this (Mittal et al. 2018, 3.3); a run of WRITE Onlys is what any
  /// IBTA responder takes. Only on long paths whose responder has reported a gap; decided
  /// when the WQE starts (requester.cpp, reth_each()).
  bool reth_each = false;
  /// Bytes [placed_from, placed_end) of the message are in the responder's memory (the last
  /// run the device placed; requester.cpp placed_run()).
  uint64_t placed_from = 0, placed_end = 0;
  /// READ, selective mode: bit i set when the response at PSN first_psn + i was placed while
  /// an earlier one was missing (completer.cpp read_response_ahead). Allocated at the first
  /// such response: npsn / 8 bytes, for READs that met a loss only.
  std::vector<uint64_t> read_placed;
  uint32_t last_psn() const { return wire::psn_add(first_psn, npsn - 1); }
  /// READ: whether the response at `psn` (one of this WQE's) was placed out of order.
  bool read_placed_at(uint32_t psn) const {
    const uint32_t i = static_cast<uint32_t>(wire::psn_diff(psn, first_psn));
    return i / 64 < read_placed.size() && (read_placed[i / 64] >> (i % 64) & 1);
  }
  /// READ: records (or, `on` false, forgets) the response at `psn` as placed out of order.
  void mark_read_placed(uint32_t psn, bool on) {
    const uint32_t i = static_cast<uint32_t>(wire::psn_diff(psn, first_psn));
    if (read_placed.empty()) read_placed.assign((npsn + 63) / 64, 0);
    const uint64_t bit = uint64_t{1} << (i % 64);
    read_placed[i / 64] = on ? read_placed[i / 64] | bit : read_placed[i / 64] & ~bit;
  }
  /// The work-request table's row for this WQE's opcode.
  const WrOpcodeInfo& info() const { return wr_info(wr.opcode); }
};

/// Requester progress (rxe's qp->req).
struct RequesterState {
  uint64_t next = 0;     ///< SQ index (absolute) of the WQE being transmitted
  uint64_t offset = 0;   ///< bytes of that WQE already transmitted / requested
  uint32_t psn = 0;      ///< next PSN to send
  uint32_t max_psn = 0;  ///< one past the highest PSN ever sent (for late ACKs)
  uint32_t noack_pkts = 0;
  /// One past the last PSN sent with its payload, or without one (every request packet but a
  /// placed one); kNoPsn: all acknowledged. A WRITE packet is placed only once the completer has
  /// passed it: a request the responder may still refuse (RNR, an access error, a sequence
  /// error) leaves the WRITE behind it unexecuted on the wire, and placing it would write
  /// memory that the responder never lets a NAKed stream reach.
  uint32_t inband_end = kNoPsn;
  /// Payload bytes of placeable WRITE packets (first transmissions) sent in-band although the
  /// path could place them, only because in-band requests before them were unacknowledged;
  /// 0 again once one is placed. A requester that keeps the path full never sees its in-band
  /// tail acknowledged, so a stream that began in-band (behind a SEND, or before the peer's
  /// table was mapped) would stay there: at kPlaceRunBytes the packet goes with AckReq and
  /// placeable WRITEs wait (place_hold) until the tail is acknowledged, one round trip per
  /// kPlaceRunBytes at most.
  uint64_t inband_starved = 0;
  bool place_hold = false;
  /// Scratch for the local pieces of one placed run.
  std::vector<iovec> place_iov;
  /// Where loss recovery stands (requester::enter_recovery changes it, logging each
  /// transition at debug with its cause; the explicit form of rxe_comp.c's named states).
  Recovery recovery = Recovery::kNone;
  /// The recovery ends when everything sent before it began is acknowledged: one past the
  /// highest PSN sent then (req.max_psn; kNoPsn with Recovery::kNone).
  uint32_t recovery_end = kNoPsn;
  /// Paused until the completer's RNR deadline.
  bool rnr_wait() const { return recovery == Recovery::kRnrWait; }
  /// Congestion window (the completer reports ACKs, NAKs and timeouts to it).
  CongestionWindow window;
  /// When the requester last sent a packet, ns (0: never); see flight_psn.
  uint64_t last_send_ns = 0;
  /// The requester's last run ended with every posted WQE started: the application, not the
  /// window, held it back (BBR's app-limited); see flight_psn.
  bool ran_dry = false;
  /// The first PSN of the latest flight: PSNs sent after the requester had run dry (ran_dry)
  /// and sent nothing for more than an eighth of the smallest RTT (CongestionWindow::
  /// idle_gap_ns); kNoPsn once an ACK has passed it (or before any). An ACK that covers
  /// only PSNs before it starts no ACK train: timed from a lone packet sent before the pause
  /// (kv's zero-length path probe), the flight's train spread over the pause and measured the
  /// idle sender, not the path (CongestionWindow::on_delivered).
  uint32_t flight_psn = kNoPsn;
  /// PSN ranges selective NAKs named, oldest first: sent again before any new PSN, without
  /// moving `psn` back (IRN, Mittal et al. 2018, 3.2). Cleared by a go-back-N rewind.
  std::deque<PsnRange> retx;
  /// The PSN whose round trip is being timed (kNoPsn: none) and when it was sent; a resend
  /// of it (or a go-back over it) cancels the measurement (Karn's rule). `timed_behind_gap`:
  /// an earlier PSN was sent again since, so the cumulative ACK that passes the timed one
  /// waits for that repair and is no sample; a selective ACK that holds it still is
  /// (completer.cpp, on_selective_ack).
  uint32_t timed_psn = kNoPsn;
  uint64_t timed_ns = 0;
  bool timed_behind_gap = false;
  /// DCQCN (Transport::congestion_control): the reaction point's rate and the pacer that
  /// holds packets to it. `cc_checked`: the transport was asked (at the first run in RTS),
  /// as it was whether the path is host-local (the window's set_host_local).
  bool cc_checked = false;
  bool cc_on = false;
  DcqcnRate rate;
  Pacer pacer;
};

/// Completer progress (rxe's qp->comp).
struct CompleterState {
  uint32_t psn = 0;  ///< oldest PSN not yet acknowledged / responded to
  uint8_t retry_left = 0;
  uint8_t rnr_retry_left = 0;
  uint64_t timer_ns = 0;          ///< retransmit check time (0: not armed); lazily re-armed
  uint64_t last_progress_ns = 0;  ///< last transmission or forward progress
  /// Last time an ACK, a selective ACK or a READ response placed ahead delivered PSNs
  /// (completer.cpp count_delivered), ns: the tail-loss probe waits from it, as RACK-TLP
  /// re-arms its probe timeout on an ACK that delivers, SACKed data included (RFC 8985 7.2).
  uint64_t last_delivery_ns = 0;
  /// When the last window sample was logged (completer.cpp trace_window; debug level), ns.
  uint64_t trace_ns = 0;
  /// First retransmit timeout, since the last ACK progress, at which the peer was found
  /// stalled (Transport::peer_liveness; 0: none): such timeouts cost no retry until
  /// kMaxPeerStallNs after it.
  uint64_t stalled_since_ns = 0;
  uint32_t fast_retry_psn = kNoPsn;  ///< PSN of the last out-of-order-triggered rewind
  uint64_t rnr_ns = 0;               ///< RNR back-off deadline (0: none)
  /// Last PSN of each READ request / atomic sent and not yet answered, oldest first.
  std::deque<uint32_t> rd_atomic_inflight;
  /// A sequence NAK without progress started a go-back-N and nothing has been acknowledged
  /// since: further such NAKs neither rewind again nor use up retry_cnt (rxe's
  /// comp.started_retry); the retransmit timer still counts.
  bool nak_retry_started = false;
  /// Selective recovery: the window was halved for a loss below this PSN (req.max_psn when
  /// the episode began); further selective NAKs below it do not halve it again, as one
  /// TCP NewReno recovery episode (RFC 6582). kNoPsn: not in recovery.
  uint32_t recovery_psn = kNoPsn;
  /// The pacer holds the requester until this time, ns (0: not waiting).
  uint64_t pace_ns = 0;
  /// Selective recovery: PSNs resent and when, oldest first (acknowledged ones are dropped
  /// lazily). The oldest unacknowledged PSN, unacknowledged resend_check_ns() after it
  /// was last resent (never resent: after it became the oldest), is sent once more — its
  /// resend or the selective NAK naming it was lost — without the retransmit timer's
  /// go-back-N and window collapse (IRN's RTO_low; the evidence is time, as RACK's, RFC
  /// 8985).
  struct Resent {
    uint32_t psn;
    uint64_t sent_ns;
    uint32_t max_psn;  ///< RequesterState::max_psn then: PSNs from it on left after this resend
  };
  std::deque<Resent> resent;
  /// Time of the next check of the oldest unacknowledged PSN, ns (0: none armed).
  uint64_t resend_check_ns = 0;
  /// When `psn` last moved (an ACK or response acknowledged something), ns.
  uint64_t head_since_ns = 0;
  /// The oldest PSN as the resend check last sent it again (kNoPsn: none since the ACK moved
  /// past it). An ACK that then stops right after it says the next PSN is missing too.
  uint32_t again_psn = kNoPsn;
  /// The oldest unacknowledged PSN's latest resend went out when req.max_psn was this
  /// (kNoPsn: it was not resent since it became the oldest). A selective ACK that still
  /// expects it but holds more PSNs beyond it than were sent before that resend holds one
  /// sent after it: the path keeps order, so the resend was lost (completer.cpp
  /// on_selective_ack) — known about one round trip after the resend, not 1.5 SRTT.
  uint32_t head_resent_before = kNoPsn;
  /// Tail-loss probe (RACK-TLP, RFC 8985 7; IRN's RTO_low plays the same part, Mittal et al.
  /// 2018, 3.1): when the probe timeout (completer::probe_timeout_ns) passes with PSNs
  /// outstanding and neither an ACK nor a transmission since, one PSN goes out once more —
  /// the last sent to a responder known to keep what arrives beyond a gap, the oldest
  /// unacknowledged to a go-back-N one (requester::probe says why). `probe_ns`: that check's
  /// time (0: not armed; lazily moved on, as timer_ns). `probe_sent`: a probe went out and
  /// no ACK has moved since (one per stall: then the retransmit timer recovers).
  uint64_t probe_ns = 0;
  bool probe_sent = false;
  /// The probe resent the oldest unacknowledged PSN when req.max_psn was this (kNoPsn: no
  /// such probe since the ACK last moved). The ACK that answers it and stops short of this
  /// says the responder dropped the rest: go-back-N from there (completer.cpp
  /// note_progress).
  uint32_t head_probe_end = kNoPsn;
  /// The responder has sent a selective NAK: it keeps what arrives around a gap, so resending
  /// the oldest PSN alone (resend_check_ns) can fill it. Against a go-back-N responder that
  /// resend would only be dropped again; recovery stays IBTA's (NAK or timeout).
  bool peer_selective = false;
  /// The latest selective ACK (NakCode::kSelectiveAck): the responder's expected PSN then
  /// (kNoPsn: none since the last go-back-N rewind) and the PSNs it held beyond it. The
  /// requester counts them out of what it has in flight (requester.cpp window_room).
  uint32_t sack_epsn = kNoPsn;
  uint32_t sack_held = 0;
  /// The runs a selective ACK lists missing (wire::SackReport) beyond the oldest PSN are looked
  /// at again from this time on, ns (completer.cpp repair_listed_runs): at most eight times
  /// per smoothed RTT — each look scans the resends outstanding, and a selective ACK comes
  /// every kAckEvery packets. A list of the oldest run alone costs no look.
  uint64_t sack_runs_ns = 0;
  /// Selective mode, READs: one past the last PSN whose missing responses were asked for
  /// again (completer.cpp ask_for_unanswered; kNoPsn: none). A go-back-N rewind sets it to
  /// req.max_psn: it asks for all of that again anyway.
  uint32_t read_gap_end = kNoPsn;
  /// Selective mode: the highest PSN known acknowledged while a READ before it was unanswered
  /// (a cumulative ACK or a READ response beyond it; kNoPsn: none). SEND/WRITEs up to it
  /// complete once the READs before them do (completer.cpp pass_answered).
  uint32_t acked_beyond = kNoPsn;
  /// Selective mode: READ responses asked for again (requester::ask_read_responses), oldest
  /// first: PSNs [first, end) and when, ns. Those still missing resend_check_ns() after
  /// their request are asked for once more (completer.cpp check_resends): that request or
  /// its responses were lost too. Dropped once `psn` passes `end`; a go-back-N rewind
  /// clears them (it asks for everything again). At most one per request sent, each gone
  /// within a few round trips.
  struct ReadAsk {
    uint32_t first;
    uint32_t end;
    uint64_t sent_ns;
  };
  std::deque<ReadAsk> read_asks;
  /// requester::held_psns when the window was last told of deliveries (completer.cpp
  /// newly_delivered): what an ACK or a selective ACK newly delivered is the change of
  /// comp.psn plus the change of held_psns since.
  uint32_t sack_counted = 0;
  /// Selective mode: READ response PSNs placed beyond comp.psn (completer.cpp
  /// read_response_ahead) and not yet passed by it. They count as delivered for the window's
  /// delivery rate and growth when they arrive (newly_delivered) and are out of flight
  /// (requester.cpp window_room), as the PSNs a selective ACK says are held.
  uint32_t read_ahead = 0;
};

/// What the responder executed for one READ or ATOMIC request, kept so a duplicate of it
/// can be answered again (IBTA vol 1, 9.7.5.1.3; rxe's responder resources). Only requests
/// with such a record are ever re-served: a "duplicate" READ the responder never executed
/// (e.g. forged with a PSN behind the expected one) is dropped, never NAKed.
struct ResponderResource {
  bool read = false;         ///< READ (else ATOMIC)
  uint32_t psn = 0;          ///< first PSN of the request
  uint32_t last_psn = 0;     ///< last response PSN (== psn for an atomic)
  uint64_t va = 0;           ///< READ: RETH virtual address
  uint32_t rkey = 0;         ///< READ: RETH rkey
  uint64_t length = 0;       ///< READ: RETH DMA length, bytes
  uint64_t atomic_orig = 0;  ///< ATOMIC: the original value returned
};

/// A response the responder owes its requester and has not sent yet, because the path to
/// it is paused (a full same-host ring: Transport::path_busy): the rest of a READ's
/// responses, or an ACK/NAK/atomic ACK that must follow them — responses leave in PSN order
/// (IBTA vol 1, 9.7.5.1). A READ keeps its R_Key and address, not a pointer: the memory is
/// looked up again (and checked) each time sending resumes.
struct PendingResponse {
  bool read = false;      ///< READ responses (else `control`, a ready ACK/NAK/atomic ACK)
  wire::Headers control;  ///< !read: the packet's headers
  uint32_t psn = 0;       ///< READ: PSN of its first response
  uint32_t msn = 0;       ///< READ: the MSN its responses carry
  uint32_t rkey = 0;      ///< READ: RETH R_Key
  uint64_t va = 0;        ///< READ: RETH virtual address
  uint64_t length = 0;    ///< READ: bytes
  uint32_t packets = 0;   ///< READ: responses in all (1 for a zero-length READ)
  uint32_t sent = 0;      ///< READ: responses sent so far
};

/// Responder progress (rxe's qp->resp).
struct ResponderState {
  uint32_t epsn = 0;         ///< expected PSN
  uint32_t msn = 0;          ///< message sequence number (24 bits)
  bool nak_sent = false;     ///< a PSN sequence (or RNR) NAK is outstanding for epsn
  uint32_t ooo_max_psn = 0;  ///< highest out-of-sequence PSN seen since that NAK
  /// The expected PSN when a gap before a placed PSN was last reported again
  /// (responder.cpp report_gap_again: once per expected PSN).
  uint32_t gap_repeated_psn = kNoPsn;
  bool in_send = false;      ///< inside a multi-packet SEND
  bool in_write = false;     ///< inside a multi-packet WRITE
  uint64_t recv_offset = 0;  ///< bytes scattered into the head receive WQE
  uint8_t* write_ptr = nullptr;
  uint64_t write_left = 0;
  uint64_t write_length = 0;      ///< dma_length of the current WRITE
  uint8_t* write_base = nullptr;  ///< where the current WRITE's first byte went
  uint32_t write_first_psn = 0;   ///< PSN of the current WRITE's first packet
  /// The current WRITE's R_Key and first address (RETH): each later packet's range is
  /// checked again, so that a region deregistered mid-message is not written after
  /// ibv_dereg_mr returned (rxe holds a reference on the MR across the message instead).
  uint32_t write_rkey = 0;
  uint64_t write_va = 0;
  bool ack_pending = false;  ///< coalesced ACK to send at the end of the batch
  uint32_t ack_psn = 0;
  /// When this QP last sent a CNP, ns (0: never).
  uint64_t last_cnp_ns = 0;
  /// READs and atomics executed, newest last; at most max(16, max_dest_rd_atomic).
  std::deque<ResponderResource> resources;
  /// Responses owed, oldest first (responder::resume sends them); empty unless the path to
  /// the requester paused mid-READ.
  std::deque<PendingResponse> pending;
  /// The requester asked for selective retransmission (Bth::selective) on a request that
  /// was accepted in order; only then are requests placed out of order (responder.cpp).
  bool peer_selective = false;
  /// The requester also understands selective ACKs (Bth::sack on a request accepted in
  /// order): placed packets that ask for an ACK are answered with one (responder.cpp).
  bool peer_sack = false;
  /// ... and selective ACKs that list the missing ranges (Bth::sack_ranges, likewise).
  bool peer_sack_ranges = false;
  /// Selective retransmission: packets kept beyond the expected PSN and the gaps reported;
  /// allocated at the first out-of-order packet of a requester that asked for it.
  std::unique_ptr<ReceivedPsns> ooo;
  /// The receive WQE of the message being received, taken from the receive queue or the
  /// SRQ at its first packet (QueuePair::take_recv_wqe), and the CQ its completion goes to.
  std::optional<RecvWqe> wqe;
  CompletionQueue* wqe_cq = nullptr;
  /// XRC receive QPs: the XRC SRQ the packet being executed names (its XRCETH), whose PD
  /// checks memory accesses and whose WQEs and CQ receive its messages (annex A14).
  SharedReceiveQueue* xrc_srq = nullptr;
  /// UC: packets are dropped until the next first/only packet — a packet of the message in
  /// progress was lost or refused (IBTA vol 1 ch. 9, UC: a lost packet loses its whole
  /// message; rxe check_psn and resp.drop_msg).
  bool uc_drop = false;
};

/// What a QP is created with (ibv_qp_init_attr_ex, resolved to engine objects). Which of
/// the objects a type needs is its row's business (QueuePair::validate_init checks).
struct QpInit {
  QpType type = QpType::kRc;
  ProtectionDomain* pd = nullptr;      ///< all but XRC_RECV
  CompletionQueue* send_cq = nullptr;  ///< types with a send queue
  CompletionQueue* recv_cq = nullptr;  ///< RC, UC, UD
  SharedReceiveQueue* srq = nullptr;   ///< optional for RC, UC, UD (a basic SRQ)
  XrcDomain* xrcd = nullptr;           ///< XRC_RECV
  QpCap cap;
  bool sq_sig_all = false;
  /// A QPN to take instead of the next free one (1: the GSI); 0: any.
  uint32_t qpn = 0;
  /// Where the send and receive queues keep their WQEs (null: the heap); sized with
  /// queue_bytes(cap.max_*_wr, sizeof(SendWqe) / sizeof(RecvWqe)).
  QueueMemory sq_memory;
  QueueMemory rq_memory;
};

/// A queue pair.
class QueuePair {
 public:
  /// Creates a QP in RESET and publishes it in the device's QPN table; its packets go to
  /// `dev.transport()`. `init` was accepted by validate_init(). With init.qpn set, check
  /// qpn() afterwards: 0 means that QPN was taken and the QP is unusable (destroy it).
  QueuePair(ObjectRegistry& dev, const QpInit& init);
  /// An RC QP without SRQ (what the RC tests build).
  QueuePair(ObjectRegistry& dev, ProtectionDomain& pd, CompletionQueue& send_cq,
            CompletionQueue& recv_cq, const QpCap& cap, bool sq_sig_all);
  ~QueuePair();
  QueuePair(const QueuePair&) = delete;
  QueuePair& operator=(const QueuePair&) = delete;

  /// Checks requested capacities against device limits; rounds nothing. EINVAL if over.
  static Status validate_cap(const QpCap& cap);
  /// Checks creation attributes against the type's row: a type the engine implements
  /// (else EOPNOTSUPP, as ibv_create_qp on a device without it), the PD, CQs, SRQ and XRC
  /// domain the type needs and no SRQ where it has none (EINVAL), an SRQ of the basic kind,
  /// capacities (validate_cap).
  static Status validate_init(const QpInit& init);

  uint32_t qpn() const { return qpn_; }
  ObjectRegistry& registry() const { return dev_; }
  /// The QP's PD (every type but XRC_RECV has one).
  ProtectionDomain& pd() const { return *pd_; }
  ProtectionDomain* pd_ptr() const { return pd_; }
  const QpTypeInfo& type_info() const { return *type_; }
  QpType type() const { return type_->type; }
  /// The SRQ the QP receives from (created with one), or nullptr.
  SharedReceiveQueue* const srq;
  /// XRC_RECV: its XRC domain.
  XrcDomain* const xrcd;

  /// ibv_modify_qp: validates the transition and attributes (required/optional masks of
  /// IBTA table 91 for the QP's type, ranges of each field) and applies them. EINVAL on
  /// any error.
  Status modify(const QpAttr& attr, uint32_t mask);
  /// ibv_query_qp: current attributes.
  QpAttr query() const;

  /// ibv_post_send for one WR. EINVAL in RESET/INIT/RTR, on a type without a send queue,
  /// for too many SGEs, an opcode the QP type does not allow (UC: no READ or atomics, UD:
  /// SENDs only), a UD WR without an address handle, inline data over max_inline_data or a
  /// bad inline SGE; ENOMEM when the SQ is full. In ERR the WR completes at once with
  /// IBV_WC_WR_FLUSH_ERR. A UD message over the port MTU is accepted and completes
  /// successfully without a packet (IBTA C10-93.1.1, as rxe), counted in ud_send_too_long.
  Status post_send(const SendWr& wr);
  /// ibv_post_recv for one WR. EINVAL in RESET, with too many SGEs, on a QP that receives
  /// through an SRQ or has no receive queue (XRC); ENOMEM when full.
  Status post_recv(uint64_t wr_id, const Sge* sges, uint32_t num_sge);
  /// Applies a batch of posts under one lock acquisition (see post_send / post_recv); on
  /// error `bad` gets the index of the failing WR.
  Status post_send_batch(const SendWr* wrs, size_t n, size_t& bad);

  // ---- used by the transport units and the device, device lock held -----------------
  QpAttr attr;
  QpCap cap;
  bool sq_sig_all;
  CompletionQueue* const send_cq;  ///< nullptr for XRC_RECV
  CompletionQueue* const recv_cq;  ///< nullptr for the XRC types
  /// Where this QP's packets go: its device, or a test double.
  Transport* transport;
  /// Runs the requester over the send queue and flushes the packets it produced to the
  /// transport (device lock held): what a post or a move to RTS does to start sending. On
  /// an unreliable type, every WQE the requester has sent whole is then completed.
  void transmit_pending_requests();
  uint32_t remote_ip = 0;  ///< from attr.ah.dgid at RTR
  /// The peer's process when it is a softrdma device of this host, as found at RTR
  /// (Transport::peer_pid); 0: not known.
  uint32_t peer_pid = 0;
  uint32_t mtu = 256;  ///< path MTU, bytes

  /// The memory sq and rq allocate from (QpInit::sq_memory, rq_memory), declared before
  /// them so that it outlives them.
  const QueueMemory sq_memory;
  const QueueMemory rq_memory;
  std::pmr::deque<SendWqe> sq;  ///< sq[i] is SQ index sq_base + i
  uint64_t sq_base = 0;         ///< absolute index of sq.front()
  std::pmr::deque<RecvWqe> rq;

  RequesterState req;
  CompleterState comp;
  ResponderState resp;

  SendWqe& wqe(uint64_t index) { return sq[index - sq_base]; }
  uint64_t sq_end() const { return sq_base + sq.size(); }

  /// Completes the oldest SQ WQE (must be sq_base) with `status` and removes it; a CQE is
  /// generated when signaled, for errors, or with sq_sig_all.
  void retire_send(WcStatus status, uint32_t byte_len = 0);
  /// Moves the QP to ERR: the oldest uncompleted WQE completes with `status` (unless it
  /// is kWrFlushErr), everything else on both queues with IBV_WC_WR_FLUSH_ERR.
  void enter_error(WcStatus status);
  /// Called by enter_error (under the device lock, so it must not block or call back into
  /// the engine) when the engine moves the QP to ERR, with enter_error's status:
  /// kWrFlushErr when the responder refused a request (IBTA 9.9.3 class C/D, no WQE to
  /// report it on), the requester's error status otherwise. ibv_modify_qp to ERR does not
  /// call it. The verbs layer turns it into an affiliated async event.
  std::function<void(WcStatus)> on_error;
  /// Called each time a QP created with an SRQ enters ERR — by ibv_modify_qp or by the
  /// engine (after on_error) — once its queues are flushed, the WQE it held from the SRQ
  /// included: no WQE of the SRQ completes on this QP any more (IBTA 11.6.3.1 "Last WQE
  /// Reached"; rxe raises it in flush_recv_queue). Under the device lock, like on_error: it
  /// must not block or call back into the engine. The verbs layer raises
  /// IBV_EVENT_QP_LAST_WQE_REACHED; consumers that share an SRQ (uDAPL's dtestsrq, MPI's
  /// SRQ transports) wait for it before they destroy the QP.
  std::function<void()> on_last_wqe_reached;
  /// Makes sure resp.wqe holds the receive WQE of the message being received: the one
  /// held already, else the oldest of the SRQ (the XRC SRQ of the packet, or the QP's) or of
  /// the receive queue. False when none is posted.
  bool take_recv_wqe();
  /// Completes resp.wqe (taken by take_recv_wqe) to its CQ and lets it go; `src_qp` is the
  /// sender's QPN (UD: from the DETH; others: the destination QP), `sl` ibv_wc.sl (UD:
  /// ud::kSlRoceV2Ipv4).
  void complete_recv(WcStatus status, WcOpcode opcode, uint32_t byte_len, uint32_t imm_be,
                     uint32_t wc_flags, bool solicited);
  void complete_recv(WcStatus status, WcOpcode opcode, uint32_t byte_len, uint32_t imm_be,
                     uint32_t wc_flags, bool solicited, uint32_t src_qp, uint8_t sl = 0);
  /// The PD that checks the memory a received request touches: the XRC SRQ's for an XRC
  /// request (annex A14.4), else the QP's.
  ProtectionDomain& responder_pd() const;
  /// Earliest armed timer of this QP, ns (0 if none).
  uint64_t next_deadline() const;
  /// Deadline of this QP's live entry in the device's timer queue (0: none queued).
  uint64_t timer_queued_ns = 0;
  /// Whether a request from the peer may be accepted / a response processed now.
  bool accepts_requests() const {
    return attr.state == QpState::kRtr || attr.state == QpState::kRts ||
           attr.state == QpState::kSqd;
  }
  bool accepts_responses() const {
    return attr.state == QpState::kRts || attr.state == QpState::kSqd;
  }
  /// Retransmit timeout (IBTA 9.7.6.1.3: 4.096 µs · 2^timeout), ns; 0 when timeout is 0
  /// (infinite). Floored at 1 ms, as rxe's jiffy-based timer is.
  uint64_t retransmit_timeout_ns() const;

 private:
  /// What a validated modify will do: the state to move to and the peer of a new AV.
  struct ModifyPlan {
    QpState next = QpState::kReset;
    uint32_t peer_ip = 0;  ///< host order; set when the mask holds IBV_QP_AV
  };
  /// The checks of modify (transition and required/optional masks of IBTA table 91, each
  /// field's range); changes nothing. EINVAL, with a debug log naming the attribute
  /// refused and why (rxe_qp_chk_attr).
  Status validate_modify(const QpAttr& a, uint32_t mask, ModifyPlan& plan) const;
  /// Applies a validated modify (rxe_qp_from_attr): attributes, then the state change.
  void apply_modify(const QpAttr& a, uint32_t mask, const ModifyPlan& plan);
  Status post_send_locked(const SendWr& wr);
  void flush_queues();
  /// A QP with an SRQ just entered ERR and was flushed: on_last_wqe_reached.
  void last_wqe_reached();
  /// Lets resp.wqe go without a completion (and the CQ it held in use).
  void release_recv_wqe();
  /// Unreliable types: completes the WQEs the requester has sent whole (after the flush,
  /// so their inline data outlived the packets that carry it).
  void complete_sent_unreliable();

  ObjectRegistry& dev_;
  const QpTypeInfo* type_;
  ProtectionDomain* pd_;
  uint32_t qpn_ = 0;
};

}  // namespace softrdma::engine

// The transport units that operate on a QueuePair.
#include "engine/completer.h"
#include "engine/requester.h"
#include "engine/responder.h"
#include "engine/uc.h"
#include "engine/ud.h"
