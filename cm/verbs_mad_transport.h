// MADs over QP1 of a softrdma device: the General Services Interface the RDMA-CM talks
// through (IBTA 13.5.1; on RoCEv2 a UD QP whose packets are UDP datagrams to port 4791, so a
// capture shows BTH + DETH + the 256-byte MAD, which Wireshark decodes as CM).
//
// QP1 comes from the drop-in libibverbs' private hook softrdma_create_qp1 (found with dlsym:
// another libibverbs has no QP1 for user space, and the CM then says it needs softrdma's).
// Sends are UD SENDs with Q_Key 0x80010000 to QP1 of the peer (an address handle per peer
// address, kept); receives land in 40 + 256-byte buffers (the GRH area, then the MAD).
//
// Threading: not thread-safe; the owner (cm_device.cpp) serialises send() and poll().
#pragma once

#include <infiniband/verbs.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cm/mad_transport.h"

namespace softrdma::cm {

class VerbsMadTransport final : public MadTransport {
 public:
  /// Receive WQEs QP1 keeps posted: Linux's MAD layer's IB_MAD_QP_RECV_SIZE (512). UD has no
  /// flow control — a MAD that finds no receive posted is dropped (`ud_dropped_pkts`) and
  /// costs its sender a resend after the CM response timeout (4.3 s by default): with 64,
  /// dtestcm's burst of 100 REQs lost 40 MADs.
  static constexpr size_t kRecvSlots = 512;
  /// Send WQEs (and 256-byte buffers) of QP1: Linux's IB_MAD_QP_SEND_SIZE (128). A send
  /// with every slot still in flight after reaping is dropped and counted in send_drops().
  static constexpr size_t kSendSlots = 128;

  /// Creates QP1 on `ctx`: its PD, a CQ on a completion channel, receive buffers, and moves
  /// it to RTS if the hook returned it in RESET. Returns nullptr with `error` set (a message
  /// for the user) and `err` an errno: ENOSYS when the running libibverbs is not softrdma's.
  static std::unique_ptr<VerbsMadTransport> create(ibv_context* ctx, std::string& error, int& err);
  ~VerbsMadTransport() override;

  void send(const MadAddress& to, std::span<const uint8_t, kMadBytes> mad) override;
  uint64_t now_ns() override;

  /// The completion channel's fd: readable when QP1 completed something (after arm()).
  int event_fd() const;
  /// Requests a completion event for the next completion (ibv_req_notify_cq), after draining
  /// the channel's pending events.
  void arm();
  /// Reaps completions: each received MAD goes to `on_mad` (its bytes and source address),
  /// its buffer is posted again; send completions free their slots. With no `on_mad` (send()
  /// reaping its slots) received MADs are kept for the next call that has one. Returns how
  /// many MADs were handed over. Bounded by the CQ's size per call.
  size_t poll(const std::function<void(std::span<const uint8_t>, const MadAddress&)>& on_mad);

  /// MADs dropped here: no free send slot, or a post or address handle that failed.
  uint64_t send_drops() const { return send_drops_; }
  /// Sends posted whose completion poll() has not reaped yet (0 … kSendSlots).
  size_t sends_in_flight() const;
  /// Receives without a usable source address (no GRH) or with a receive error.
  uint64_t recv_drops() const { return recv_drops_; }

 private:
  VerbsMadTransport() = default;
  bool post_recv(size_t slot);
  ibv_ah* ah_for(uint32_t ip);

  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  ibv_mr* mr_ = nullptr;
  std::vector<uint8_t> buffers_;  ///< kRecvSlots receive slots, then kSendSlots send slots
  std::vector<bool> send_busy_;
  size_t next_send_ = 0;
  std::map<uint32_t, ibv_ah*> ahs_;
  struct Received {
    std::array<uint8_t, kMadBytes> bytes;
    size_t length;
    MadAddress from;
  };
  std::vector<Received> pending_;
  uint64_t send_drops_ = 0;
  uint64_t recv_drops_ = 0;
};

}  // namespace softrdma::cm
