// Per-device counters in the spirit of Linux rxe's hw_counters (rxe_hw_counters.c), plus
// softrdma's own drop reasons. Each open device publishes its counters in a small shared
// memory file, /dev/shm/softrdma.<ipv4>.<pid>, so `softrdma stat` can read the counters of
// every running softrdma process without talking to it.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace softrdma::engine {

// X(name, help). Names follow rxe where rxe has the counter.
#define SOFTRDMA_COUNTERS(X)                                                                       \
  X(sent_pkts, "RoCEv2 packets sent")                                                              \
  X(rcvd_pkts, "RoCEv2 packets received and accepted")                                             \
  X(sent_bytes, "UDP payload bytes sent")                                                          \
  X(rcvd_bytes, "UDP payload bytes received")                                                      \
  X(duplicate_request, "duplicate requests seen by the responder (re-ACKed / replayed)")           \
  X(duplicate_dropped, "duplicate READ/atomic requests dropped: no record of executing them")      \
  X(atomic_write_executed, "RDMA ATOMIC WRITE requests executed by the responder (8-byte stores)") \
  X(out_of_seq_request, "requests with a PSN ahead of the expected one (NAK sent once)")           \
  X(rcvd_seq_err, "PSN sequence error NAKs received")                                              \
  X(send_rnr_err, "RNR NAKs sent (SEND with no receive posted)")                                   \
  X(rcvd_rnr_err, "RNR NAKs received")                                                             \
  X(send_nak, "NAKs sent (sequence, access, invalid request)")                                     \
  X(rcvd_nak, "NAKs received (sequence, access, invalid request)")                                 \
  X(ack_sent, "ACK / atomic ACK packets sent")                                                     \
  X(retransmit_timeouts, "retransmit timer expirations")                                           \
  X(retransmitted_pkts, "request packets sent again (go-back-N or selective)")                     \
  X(selective_retransmitted_pkts, "request packets sent again because a selective NAK named them") \
  X(selective_nak_sent, "selective NAKs sent (a range of PSNs missing, the rest kept)")            \
  X(selective_nak_rcvd, "selective NAKs received")                                                 \
  X(selective_runs_repaired,                                                                       \
    "missing runs a selective ACK listed, resent: their selective NAK or resend was lost")         \
  X(selective_ack_sent, "selective ACKs sent (PSNs held beyond a gap, counted for the requester)") \
  X(selective_ack_rcvd, "selective ACKs received and used")                                        \
  X(selective_nak_repeated,                                                                        \
    "selective NAKs naming a gap again: a placed copy asked for an ACK (once per expected PSN)")   \
  X(ooo_placed, "request packets placed out of order (selective retransmission)")                  \
  X(ooo_staged,                                                                                    \
    "SEND / WRITE-with-immediate packets beyond a gap kept to execute in order (selective)")       \
  X(ooo_read_responses, "READ responses placed out of order (selective retransmission)")           \
  X(read_gap_requests, "READ requests for responses a gap lacks (selective retransmission)")       \
  X(ooo_refused,                                                                                   \
    "out-of-order WRITEs/SENDs not kept: checks failed, zero length, not after a kept PSN")        \
  X(ooo_contested, "second copies of a PSN placed out of order that differ: both dropped, resent") \
  X(ooo_unplaced,                                                                                  \
    "PSNs placed out of order then forgotten: an unmarked packet arrived behind them")             \
  X(ooo_beyond_span,                                                                               \
    "out-of-order requests beyond the responder's largest tracking span: dropped, reported later") \
  X(selective_nak_clipped,                                                                         \
    "selective NAKs naming PSNs never sent: cut to what was sent, or dropped")                     \
  X(retry_exceeded_err, "QPs failed with IBV_WC_RETRY_EXC_ERR")                                    \
  X(retry_rnr_exceeded_err, "QPs failed with IBV_WC_RNR_RETRY_EXC_ERR")                            \
  X(dead_peer_err, "QPs failed at once because their same-host peer process is gone")              \
  X(icmp_unreachable_rcvd, "ICMP destination unreachable errors for packets sent (a closed port)") \
  X(stalled_peer_timeouts,                                                                         \
    "retransmit timeouts not counted: the peer process was stopped or starved")                    \
  X(rcvd_icrc_err, "packets dropped: ICRC mismatch")                                               \
  X(rcvd_icrc_id_recovered, "packets from senders with a non-zero IPv4 id, ICRC verified")         \
  X(rcvd_malformed, "packets dropped: truncated or malformed headers")                             \
  X(rcvd_unknown_qpn, "packets dropped: destination QPN not found")                                \
  X(rcvd_bad_state, "packets dropped: QP not in a state to accept them")                           \
  X(rcvd_addr_err, "packets dropped: source address is not the QP's peer")                         \
  X(rcvd_wrong_service, "packets dropped: opcode of a service (RC/UC/UD/XRC) the QP is not")       \
  X(rcvd_qkey_err, "UD packets dropped: DETH Q_Key is not the QP's (IBTA 10.2.5)")                 \
  X(rcvd_bad_xrc_srq, "XRC requests naming no XRC SRQ of the target QP's XRC domain")              \
  X(ud_dropped_pkts, "UD datagrams dropped: no receive WQE, or one too small for GRH + data")      \
  X(ud_send_too_long, "UD sends over the port MTU completed without a packet (IBTA C10-93.1.1)")   \
  X(uc_dropped_pkts, "UC packets dropped: a PSN gap or refused packet lost the rest of a message") \
  X(rcvd_stale_response, "responses dropped: PSN outside the outstanding window")                  \
  X(emulated_drops, "packets dropped on transmit by the link emulator (SOFTRDMA_NETEM)")           \
  X(wan_shaped, "packets that crossed an emulated wide-area link (SOFTRDMA_WAN)")                  \
  X(wan_held, "packets held in the WAN emulator's timed queue (delay, queueing, copies)")          \
  X(wan_dropped_loss, "packets lost on an emulated WAN link: random loss")                         \
  X(wan_dropped_burst, "packets lost on an emulated WAN link: burst (Gilbert-Elliott) loss")       \
  X(wan_dropped_queue, "packets tail-dropped by an emulated WAN link's full queue")                \
  X(wan_ecn_marked, "packets an emulated WAN link marked Congestion Experienced")                  \
  X(wan_duplicated, "packets an emulated WAN link duplicated")                                     \
  X(wan_corrupted, "packets an emulated WAN link corrupted (one bit flipped)")                     \
  X(wan_reordered, "packets an emulated WAN link sent ahead of others (reorder)")                  \
  X(ecn_ce_rcvd, "packets received with the IPv4 ECN field Congestion Experienced")                \
  X(cnp_sent, "RoCEv2 CNPs sent (a CE-marked request; at most one per QP per 50 us)")              \
  X(cnp_rcvd, "RoCEv2 CNPs received by a requester")                                               \
  X(dcqcn_rate_cuts, "DCQCN rate cuts (CNPs that lowered a QP's rate)")                            \
  X(paced_waits, "times a requester waited for its pacer (DCQCN, or the window without it)")       \
  X(resend_again_pkts, "lost resends sent again ~1.5 RTT after the resend (selective)")            \
  X(tail_loss_probes,                                                                              \
    "tail-loss probes (~2 RTT after the last delivery): last PSN, oldest, or head READ")           \
  X(partial_ack_rewinds, "go-back-N after an ACK answering a resend or probe stopped short")       \
  X(partial_ack_resends,                                                                           \
    "resends again after an ACK stopped at a resent PSN, a selective peer's gaps (no go-back-N)")  \
  X(random_losses, "losses on a long path with no standing queue: the window kept")                \
  X(resp_access_faults, "requests NAKed: their target memory was unmapped since registration")     \
  X(local_access_faults, "local buffers found unmapped: WQE in error or packet not sent")          \
  X(send_err, "sendmsg failures")                                                                  \
  X(sent_gso_batches, "UDP GSO sends (several RoCEv2 packets in one sendmsg)")                     \
  X(sent_shm_pkts, "packets sent through the same-host shared-memory path")                        \
  X(rcvd_shm_pkts, "packets received through the same-host shared-memory path")                    \
  X(sent_placed_msgs, "same-host RDMA WRITEs whose payload the requester placed itself")           \
  X(sent_placed_bytes, "... their bytes (one copy: requester memory to responder memory)")         \
  X(placement_fallbacks, "same-host WRITEs sent with their payload: the peer's table refused")     \
  X(rcvd_placed_pkts, "same-host RDMA WRITE packets received with their payload already placed")   \
  X(placed_after_dereg, "placed WRITEs whose region was deregistered before their headers came")   \
  X(shm_drops, "packets dropped: peer's shared-memory ring full (or no mailbox, shm only)")        \
  X(shm_ring_full_resends, "QPs sent back to a request a full same-host ring dropped")             \
  X(shm_backlogged, "packets held in order by the sender: the peer's same-host ring was full")     \
  X(shm_doorbell_refused,                                                                          \
    "same-host peers whose doorbell was refused (gone, or in another network namespace): UDP")     \
  X(path_waits, "times a requester held back: packets to its peer waited in a same-host backlog")  \
  X(rcvd_gro_batches, "UDP GRO receives (several RoCEv2 packets in one datagram buffer)")          \
  X(rcvd_socket_overflows, "datagrams the kernel dropped: the UDP receive buffer was full")        \
  X(share_forwarded, "packets handed to another process sharing this address (its QPN's slot)")    \
  X(share_forward_drops, "packets for another process at this address lost (gone or full)")        \
  X(share_backlogged, "... of share_forwarded that waited in the owner's backlog (socket full)")   \
  X(share_rcvd, "packets received from the owner of this address's UDP port (forwarded)")          \
  X(mcast_rcvd_pkts, "datagrams received for a multicast group some QP is attached to")            \
  X(mcast_delivered, "multicast datagrams placed in an attached QP (one per QP)")

/// The live counters of one device. Lives in shared memory; every field is a relaxed
/// atomic so the progress thread, application threads and `softrdma stat` can touch it.
struct Counters {
#define SOFTRDMA_COUNTER_FIELD(name, help) std::atomic<uint64_t> name{0};
  SOFTRDMA_COUNTERS(SOFTRDMA_COUNTER_FIELD)
#undef SOFTRDMA_COUNTER_FIELD
};

/// Adds n to a counter (relaxed).
inline void bump(std::atomic<uint64_t>& c, uint64_t n = 1) noexcept {
  c.fetch_add(n, std::memory_order_relaxed);
}

/// Adds n to a counter that only threads holding the device lock write (the per-packet
/// counters of transmit and receive): a plain load and store, no locked read-modify-write.
/// Readers (`softrdma stat`, other threads) still see whole values. Why: a locked instruction
/// is a full barrier on x86, and on the per-packet path it made the device thread wait for
/// the previous packet's payload copy to drain — 27 % of a READ initiator's device thread
/// sat on one such increment (docs/performance.md, "per-packet barriers").
inline void bump_locked(std::atomic<uint64_t>& c, uint64_t n = 1) noexcept {
  c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

/// One counter's name, help text and value.
struct CounterValue {
  std::string name;
  std::string help;
  uint64_t value = 0;
};

/// A snapshot of one device's counters as published in /dev/shm.
struct DeviceStats {
  std::string path;     ///< the shared-memory file
  std::string address;  ///< the device's IPv4 address, dotted quad
  int pid = 0;          ///< owning process
  bool alive = false;   ///< whether that process still exists
  std::vector<CounterValue> counters;
  /// Value of a counter by name; 0 if there is no such counter.
  uint64_t get(const std::string& name) const;
};

/// Reads every published device's counters (files named softrdma.* in `dir`, by default
/// /dev/shm). Files of processes that have exited are reported with alive = false.
/// Unreadable or short files are skipped.
std::vector<DeviceStats> read_published_stats(const std::string& dir = "/dev/shm");

/// Counters of the live device bound to `address` (dotted quad) owned by process `pid`
/// (0: any live process). Returns false if none is published.
bool read_device_stats(const std::string& address, DeviceStats& out, int pid = 0);

}  // namespace softrdma::engine
