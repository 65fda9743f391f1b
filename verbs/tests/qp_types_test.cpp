// The QP types besides RC between two processes, each its own device: UD datagrams (GRH
// area and wc.src_qp, a Q_Key mismatch dropped and counted, a message over the MTU not
// sent), UC (WRITE and SEND, a lost packet losing only its message), an SRQ shared by two
// QPs with its limit event, and XRC (an XRC send QP reaching the SRQ it names through an
// XRC receive QP, ibv_open_qp on the target's domain). Plain libibverbs calls only.
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <functional>
#include <map>
#include <sstream>

#include "verbs/softrdma_private.h"
#include "verbs/tests/harness.h"
#include "verbs/tests/qp_helpers.h"

namespace softrdma::verbs_test {
namespace {

Spec two_roles(std::function<void(Role&)> r0, std::function<void(Role&)> r1) {
  Spec s;
  s.roles.resize(2);
  s.roles[0].fn = std::move(r0);
  s.roles[1].fn = std::move(r1);
  s.deadline = seconds(60);
  return s;
}

/// A QP of `type` with its own CQ on r's device, moved to RTS towards its counterpart in
/// role `peer` (each side sends its QPN, then reads the peer's: the setup sockets buffer
/// both); destroyed, QP then CQ, with the object. Receives are posted after construction:
/// the roles meet at a barrier before anything is sent.
struct PairedQp {
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  uint32_t peer_qpn = 0;
  PairedQp(Role& r, ibv_qp_type type, int peer) {
    qp = make_qp(r, type, cq);
    r.send_value(peer, qp->qp_num);
    peer_qpn = r.recv_value<uint32_t>(peer);
    to_rts(qp, r.peer_info(peer).gid, peer_qpn);
  }
  ~PairedQp() {
    ibv_destroy_qp(qp);
    ibv_destroy_cq(cq);
  }
  PairedQp(const PairedQp&) = delete;
  PairedQp& operator=(const PairedQp&) = delete;
};

/// A UD QP with an address handle on role `peer`'s device.
struct UdEnd : PairedQp {
  ibv_ah* ah;
  UdEnd(Role& r, int peer) : PairedQp(r, IBV_QPT_UD, peer), ah(make_ah(r, r.peer_info(peer).gid)) {}
  ~UdEnd() { ibv_destroy_ah(ah); }
  int send(Role& r, uint64_t wr_id, uint64_t off, uint32_t len, uint32_t qkey = kQkey,
           bool imm = false) {
    return post_ud(qp, ah, peer_qpn, qkey, wr_id, r.buf() + off, len, r.lkey(), imm);
  }
};

// ---- UD ---------------------------------------------------------------------------------

// Three datagrams (one with immediate data) land after the 40-byte GRH area, whose last 20
// bytes are the sender's IPv4 header; the completion names the sender's QP. The answer goes
// back through an AH made from that completion (ibv_create_ah_from_wc).
TEST(Ud, SendRecvWithGrhAndSourceQp) {
  run_roles(two_roles(
      [](Role& r) {
        UdEnd u(r, 1);
        ASSERT_EQ(0, post_recv(u.qp, 50, r.buf() + 8192, 40 + 512, r.lkey()));
        fill_pattern(r.buf(), 3 * 1000, 7);
        r.barrier();
        for (uint64_t i = 0; i < 3; ++i) ASSERT_EQ(0, u.send(r, i, i * 1000, 1000, kQkey, i == 2));
        for (uint64_t i = 0; i < 3; ++i) poll_success(u.cq, i, IBV_WC_SEND);
        ibv_wc wc = poll_success(u.cq, 50, IBV_WC_RECV);  // the answer
        EXPECT_EQ(u.peer_qpn, wc.src_qp);
        EXPECT_EQ(40u + 512u, wc.byte_len);
        EXPECT_TRUE(HasPattern(r.buf() + 8192 + 40, 512, 9));
        r.barrier();
      },
      [](Role& r) {
        UdEnd u(r, 0);
        for (uint64_t i = 0; i < 3; ++i)
          ASSERT_EQ(0, post_recv(u.qp, 100 + i, r.buf() + i * 2048, 2048, r.lkey()));
        r.barrier();
        ibv_wc last{};
        for (uint64_t i = 0; i < 3; ++i) {
          ibv_wc wc = poll_success(u.cq, 100 + i, IBV_WC_RECV);
          EXPECT_EQ(u.peer_qpn, wc.src_qp);
          EXPECT_EQ(u.qp->qp_num, wc.qp_num);
          EXPECT_TRUE(wc.wc_flags & IBV_WC_GRH);
          EXPECT_EQ(i == 2, (wc.wc_flags & IBV_WC_WITH_IMM) != 0);
          if (i == 2) {
            EXPECT_EQ(htonl(0xabcd0002), wc.imm_data);
          }
          EXPECT_EQ(40u + 1000u, wc.byte_len);
          const uint8_t* grh = r.buf() + i * 2048;
          EXPECT_EQ(0x45, grh[20]) << "an IPv4 header in the GRH's last 20 bytes";
          EXPECT_EQ(17, grh[29]) << "protocol UDP";
          uint32_t src = 0;
          std::memcpy(&src, grh + 32, 4);
          EXPECT_EQ(r.peer_info(0).ipv4, ntohl(src)) << "source address";
          EXPECT_TRUE(HasPattern(grh + 40, 1000, 7, i * 1000));
          last = wc;
        }
        ibv_ah* ah = ibv_create_ah_from_wc(r.dev().pd, &last,
                                           reinterpret_cast<ibv_grh*>(r.buf() + 2 * 2048), 1);
        ASSERT_NE(nullptr, ah) << strerror(errno);
        fill_pattern(r.buf() + 65536, 512, 9);
        ASSERT_EQ(0, post_ud(u.qp, ah, last.src_qp, kQkey, 60, r.buf() + 65536, 512, r.lkey()));
        poll_success(u.cq, 60, IBV_WC_SEND);
        r.barrier();
        EXPECT_EQ(0, ibv_destroy_ah(ah));
      }));
}

// A UD receive completion's SL carries the RoCE packet type as a ConnectX reports it
// (engine::ud::kSlRoceV2Ipv4: UDP header present, L3 header type 2 = IPv4), in ibv_wc.sl
// and in ibv_wc_read_sl of an extended CQ; a send completion's SL stays 0. UCX's ud_verbs
// picks the destination address out of the GRH area by these bits (2: the last 4 bytes,
// the IPv4 destination, checked here; otherwise the last 16 as an IPv6 GID) and drops every
// datagram not addressed to one of its GIDs: with sl 0 it dropped them all (issue 22).
TEST(Ud, RecvCompletionSlIsRoceV2Ipv4PacketType) {
  run_roles(two_roles(
      [](Role& r) {
        UdEnd u(r, 1);
        r.barrier();
        ASSERT_EQ(0, u.send(r, 1, 0, 64));
        ASSERT_EQ(0, u.send(r, 2, 0, 64));
        for (uint64_t i = 1; i <= 2; ++i) EXPECT_EQ(0, int(poll_success(u.cq, i, IBV_WC_SEND).sl));
        r.barrier();
      },
      [](Role& r) {
        // One QP whose receive CQ is extended, so both ibv_wc and ibv_wc_read_sl are seen:
        // the first datagram is polled through ibv_poll_cq, the second through ibv_start_poll.
        ibv_cq_init_attr_ex ca{};
        ca.cqe = 16;
        ca.wc_flags = IBV_WC_STANDARD_FLAGS;
        ibv_cq_ex* cqx = ibv_create_cq_ex(r.dev().ctx, &ca);
        ASSERT_NE(nullptr, cqx) << strerror(errno);
        ibv_cq* cq = ibv_cq_ex_to_cq(cqx);
        ibv_qp* qp = make_qp(r, IBV_QPT_UD, cq);
        r.send_value(0, qp->qp_num);
        const auto peer_qpn = r.recv_value<uint32_t>(0);
        to_rts(qp, r.peer_info(0).gid, peer_qpn);
        for (uint64_t i = 0; i < 2; ++i)
          ASSERT_EQ(0, post_recv(qp, 10 + i, r.buf() + i * 4096, 4096, r.lkey()));
        r.barrier();
        const ibv_wc wc = poll_success(cq, 10, IBV_WC_RECV);
        EXPECT_EQ(0xa, int(wc.sl)) << "RoCEv2 (bit 3) over IPv4 (bits 2:0 = 2)";
        EXPECT_TRUE(wc.wc_flags & IBV_WC_GRH);
        uint32_t dst = 0;
        std::memcpy(&dst, r.buf() + 40 - 4, 4);
        EXPECT_EQ(r.dev().ipv4, ntohl(dst)) << "what UCX compares with its own GID's IPv4";

        ibv_poll_cq_attr pa{};
        int rc = ENOENT;
        for (int tries = 0; tries < 50000 && rc == ENOENT; ++tries) {
          rc = ibv_start_poll(cqx, &pa);
          if (rc == ENOENT) usleep(100);
        }
        ASSERT_EQ(0, rc);
        EXPECT_EQ(11u, cqx->wr_id);
        EXPECT_EQ(IBV_WC_SUCCESS, cqx->status);
        EXPECT_EQ(0xa, int(ibv_wc_read_sl(cqx)));
        EXPECT_EQ(0u, ibv_wc_read_slid(cqx));
        ibv_end_poll(cqx);
        r.barrier();
        EXPECT_EQ(0, ibv_destroy_qp(qp));
        EXPECT_EQ(0, ibv_destroy_cq(cq));
      }));
}

// A datagram whose DETH Q_Key is not the receiving QP's is dropped and counted
// (rcvd_qkey_err); the next, with the right Q_Key, is received. A Q_Key with the most
// significant bit set in the WR sends the QP's own (IBTA 10.2.5) and is received.
TEST(Ud, QkeyMismatchIsDroppedAndCounted) {
  run_roles(two_roles(
      [](Role& r) {
        UdEnd u(r, 1);
        r.barrier();
        ASSERT_EQ(0, u.send(r, 1, 0, 64, kQkey + 1));
        poll_success(u.cq, 1, IBV_WC_SEND);
        r.barrier();  // the peer has seen the drop
        ASSERT_EQ(0, u.send(r, 2, 0, 64, 0x80000000));
        poll_success(u.cq, 2, IBV_WC_SEND);
        r.barrier();
      },
      [](Role& r) {
        UdEnd u(r, 0);
        ASSERT_EQ(0, post_recv(u.qp, 7, r.buf(), 4096, r.lkey()));
        const Counters before = r.counters();
        r.barrier();
        EXPECT_GE(wait_counter_growth(r.dev().addr, getpid(), {"rcvd_qkey_err"}, before, 1), 1u)
            << "the mismatched Q_Key was not counted";
        EXPECT_TRUE(no_completion(u.cq, 50ms)) << "a datagram with a foreign Q_Key was received";
        r.barrier();
        ibv_wc wc = poll_success(u.cq, 7, IBV_WC_RECV);
        EXPECT_EQ(40u + 64u, wc.byte_len);
        r.barrier();
      }));
}

// IBTA C10-93.1.1 (and rxe): a UD message over the port MTU is not sent and completes
// successfully; the receiver sees nothing; the sender counts it (ud_send_too_long).
TEST(Ud, MessageOverTheMtuIsNotSent) {
  run_roles(two_roles(
      [](Role& r) {
        UdEnd u(r, 1);
        const uint32_t mtu = mtu_bytes(r.dev().port.active_mtu);
        r.barrier();
        const Counters before = r.counters();
        ASSERT_EQ(0, u.send(r, 1, 0, mtu + 1));
        poll_success(u.cq, 1, IBV_WC_SEND);
        EXPECT_EQ(1u, r.counters()["ud_send_too_long"] - before["ud_send_too_long"]);
        ASSERT_EQ(0, u.send(r, 2, 0, mtu));
        poll_success(u.cq, 2, IBV_WC_SEND);
        r.barrier();
      },
      [](Role& r) {
        UdEnd u(r, 0);
        for (uint64_t i = 0; i < 2; ++i)
          ASSERT_EQ(0, post_recv(u.qp, 10 + i, r.buf() + i * 16384, 16384, r.lkey()));
        r.barrier();
        ibv_wc wc = poll_success(u.cq, 10, IBV_WC_RECV);
        EXPECT_EQ(40u + mtu_bytes(r.dev().port.active_mtu), wc.byte_len)
            << "the first datagram received is the second one sent";
        r.barrier();
      }));
}

// ---- UC ---------------------------------------------------------------------------------

// RDMA WRITE (with and without immediate) and SEND over UC, with no ACK on the wire.
TEST(Uc, WriteAndSend) {
  run_roles(two_roles(
      [](Role& r) {
        PairedQp u(r, IBV_QPT_UC, 1);
        const PeerInfo& peer = r.peer_info(1);
        r.barrier();  // the peer's receives are posted
        fill_pattern(r.buf(), 3 * 8192, 3);
        ASSERT_EQ(0, post_send(u.qp, IBV_WR_RDMA_WRITE, 1, r.buf(), 8192, r.lkey(), peer.addr,
                               peer.rkey));
        ASSERT_EQ(0, post_send(u.qp, IBV_WR_RDMA_WRITE_WITH_IMM, 2, r.buf() + 8192, 8192, r.lkey(),
                               peer.addr + 8192, peer.rkey, htonl(77)));
        ASSERT_EQ(0, post_send(u.qp, IBV_WR_SEND, 3, r.buf() + 16384, 5000, r.lkey()));
        poll_success(u.cq, 1, IBV_WC_RDMA_WRITE);
        poll_success(u.cq, 2, IBV_WC_RDMA_WRITE);
        poll_success(u.cq, 3, IBV_WC_SEND);
        EXPECT_EQ(EINVAL,
                  post_send(u.qp, IBV_WR_RDMA_READ, 4, r.buf(), 8, r.lkey(), peer.addr, peer.rkey))
            << "UC has no RDMA READ";
        r.barrier();
      },
      [](Role& r) {
        PairedQp u(r, IBV_QPT_UC, 0);
        ASSERT_EQ(0, post_recv(u.qp, 20, nullptr, 0, r.lkey()));
        ASSERT_EQ(0, post_recv(u.qp, 21, r.buf() + 65536, 8192, r.lkey()));
        const Counters before = r.counters();
        r.barrier();
        ibv_wc wc = poll_success(u.cq, 20, IBV_WC_RECV_RDMA_WITH_IMM);
        EXPECT_TRUE(CarriesImm(wc, htonl(77)));
        EXPECT_EQ(8192u, wc.byte_len);
        wc = poll_success(u.cq, 21, IBV_WC_RECV);
        EXPECT_EQ(5000u, wc.byte_len);
        EXPECT_TRUE(HasPattern(r.buf(), 2 * 8192, 3));
        EXPECT_TRUE(HasPattern(r.buf() + 65536, 5000, 3, 16384));
        EXPECT_EQ(0u, r.counters()["ack_sent"] - before["ack_sent"]) << "UC acknowledges nothing";
        r.barrier();
      }));
}

// The sender's link drops its 6th packet (SOFTRDMA_NETEM every=6): the second of three
// SENDs (4, 4 and 3 packets) loses its 2nd packet, so its last two are dropped and counted
// at the receiver (uc_dropped_pkts); the first and third messages arrive whole, the third
// in the receive WQE the second had taken.
TEST(Uc, DroppedPacketLosesOnlyItsMessage) {
  Spec s = two_roles(
      [](Role& r) {
        PairedQp u(r, IBV_QPT_UC, 1);
        r.barrier();
        fill_pattern(r.buf(), 3 * 4096, 5);
        // 4 + 4 + 3 packets: the 6th is dropped, the 12th never exists.
        for (uint64_t i = 0; i < 3; ++i)
          ASSERT_EQ(0, post_send(u.qp, IBV_WR_SEND, i, r.buf() + i * 4096, i == 2 ? 3072 : 4096,
                                 r.lkey()));
        for (uint64_t i = 0; i < 3; ++i) poll_success(u.cq, i, IBV_WC_SEND);
        EXPECT_EQ(1u, r.counters()["emulated_drops"]);
        r.barrier();
      },
      [](Role& r) {
        PairedQp u(r, IBV_QPT_UC, 0);
        for (uint64_t i = 0; i < 3; ++i)
          ASSERT_EQ(0, post_recv(u.qp, 30 + i, r.buf() + i * 8192, 8192, r.lkey()));
        const Counters before = r.counters();
        r.barrier();
        ibv_wc wc = poll_success(u.cq, 30, IBV_WC_RECV);
        EXPECT_EQ(4096u, wc.byte_len);
        EXPECT_TRUE(HasPattern(r.buf(), 4096, 5));
        wc = poll_success(u.cq, 31, IBV_WC_RECV);
        EXPECT_EQ(3072u, wc.byte_len) << "message 3, not message 2";
        EXPECT_TRUE(HasPattern(r.buf() + 8192, 3072, 5, 8192));
        EXPECT_TRUE(no_completion(u.cq, 50ms));
        EXPECT_EQ(2u, r.counters()["uc_dropped_pkts"] - before["uc_dropped_pkts"]);
        r.barrier();
      });
  s.roles[0].env = {{"SOFTRDMA_NETEM", "every=6"}};
  run_roles(s);
}

// ---- QP1 ------------------------------------------------------------------------------

/// QP1 of r's device (softrdma_create_qp1) at RTS, on CQ `cq`.
ibv_qp* make_qp1(Role& r, ibv_cq*& cq) {
  cq = ibv_create_cq(r.dev().ctx, 64, nullptr, nullptr, 0);
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_UD;
  ia.cap = {16, 16, 1, 1, 0};
  ibv_qp* qp = softrdma_create_qp1(r.dev().pd, &ia);
  if (!qp) fail_fatal(std::string("softrdma_create_qp1: ") + strerror(errno));
  to_rts(qp, {}, 0);
  return qp;
}

// A 256-byte MAD from QP1 to QP1 of another device, sent with the GSI Q_Key 0x80010000 (its
// most significant bit: the QP's own, which QP1's always is): received with wc.src_qp 1. A
// datagram to QP1 from an ordinary UD QP with another Q_Key is dropped and counted.
TEST(Gsi, MadsTravelBetweenQp1s) {
  run_roles(two_roles(
      [](Role& r) {
        ibv_cq* cq = nullptr;
        ibv_qp* qp1 = make_qp1(r, cq);
        UdEnd other(r, 1);  // an ordinary UD QP, sending to QP1 with another Q_Key
        ibv_ah* ah = make_ah(r, r.peer_info(1).gid);
        r.barrier();
        fill_pattern(r.buf(), 256, 21);
        ASSERT_EQ(0, post_ud(qp1, ah, 1, 0x80010000, 1, r.buf(), 256, r.lkey()));
        poll_success(cq, 1, IBV_WC_SEND);
        ASSERT_EQ(0, post_ud(other.qp, other.ah, 1, kQkey, 2, r.buf(), 256, r.lkey()));
        poll_success(other.cq, 2, IBV_WC_SEND);
        r.barrier();
        ibv_destroy_ah(ah);
        ibv_destroy_qp(qp1);
        ibv_destroy_cq(cq);
      },
      [](Role& r) {
        ibv_cq* cq = nullptr;
        ibv_qp* qp1 = make_qp1(r, cq);
        EXPECT_EQ(1u, qp1->qp_num);
        UdEnd other(r, 0);
        for (uint64_t i = 0; i < 2; ++i)
          ASSERT_EQ(0, post_recv(qp1, 10 + i, r.buf() + i * 4096, 4096, r.lkey()));
        const Counters before = r.counters();
        r.barrier();
        ibv_wc wc = poll_success(cq, 10, IBV_WC_RECV);
        EXPECT_EQ(1u, wc.src_qp);
        EXPECT_EQ(1u, wc.qp_num);
        EXPECT_EQ(40u + 256u, wc.byte_len);
        EXPECT_TRUE(HasPattern(r.buf() + 40, 256, 21));
        r.barrier();
        EXPECT_GE(wait_counter_growth(r.dev().addr, getpid(), {"rcvd_qkey_err"}, before, 1), 1u);
        EXPECT_TRUE(no_completion(cq, 20ms));
        ibv_destroy_qp(qp1);
        ibv_destroy_cq(cq);
      }));
}

// ---- SRQ --------------------------------------------------------------------------------

// Two RC QPs of one process receive from one SRQ, in posting order; when the WQEs left fall
// below the armed limit, IBV_EVENT_SRQ_LIMIT_REACHED arrives once on the async fd, and
// ibv_destroy_srq is EBUSY while the QPs exist.
TEST(Srq, SharedByTwoQpsWithLimitEvent) {
  run_roles(two_roles(
      [](Role& r) {
        ibv_cq* cq = nullptr;
        ibv_qp* q[2] = {make_qp(r, IBV_QPT_RC, cq), make_qp(r, IBV_QPT_RC, cq)};
        const auto peer = r.recv_value<std::array<uint32_t, 2>>(1);
        r.send_value(1, std::array<uint32_t, 2>{q[0]->qp_num, q[1]->qp_num});
        for (int i = 0; i < 2; ++i) to_rts(q[i], r.peer_info(1).gid, peer[i]);
        r.barrier();
        fill_pattern(r.buf(), 4096, 11);
        for (uint64_t i = 0; i < 4; ++i)
          ASSERT_EQ(0, post_send(q[i % 2], IBV_WR_SEND, i, r.buf() + i * 256, 256, r.lkey()));
        for (uint64_t i = 0; i < 4; ++i) poll_one(cq);
        r.barrier();
        for (ibv_qp* x : q) ibv_destroy_qp(x);
        ibv_destroy_cq(cq);
      },
      [](Role& r) {
        ibv_context* ctx = r.dev().ctx;
        const int fl = fcntl(ctx->async_fd, F_GETFL);
        ASSERT_EQ(0, fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK));
        ibv_srq_init_attr sa{};
        sa.attr = {8, 1, 0};
        ibv_srq* srq = ibv_create_srq(r.dev().pd, &sa);
        ASSERT_NE(nullptr, srq) << strerror(errno);
        ibv_cq* cq = nullptr;
        ibv_qp* q[2] = {make_qp(r, IBV_QPT_RC, cq, srq), make_qp(r, IBV_QPT_RC, cq, srq)};
        EXPECT_EQ(srq, q[0]->srq);
        for (uint64_t i = 0; i < 6; ++i) {
          ibv_sge sg{reinterpret_cast<uintptr_t>(r.buf() + i * 256), 256, r.lkey()};
          ibv_recv_wr wr{};
          wr.wr_id = 200 + i;
          wr.sg_list = &sg;
          wr.num_sge = 1;
          ibv_recv_wr* bad = nullptr;
          ASSERT_EQ(0, ibv_post_srq_recv(srq, &wr, &bad));
        }
        ibv_srq_attr lim{};
        lim.srq_limit = 3;
        ASSERT_EQ(0, ibv_modify_srq(srq, &lim, IBV_SRQ_LIMIT));
        r.send_value(0, std::array<uint32_t, 2>{q[0]->qp_num, q[1]->qp_num});
        const auto peer = r.recv_value<std::array<uint32_t, 2>>(0);
        for (int i = 0; i < 2; ++i) to_rts(q[i], r.peer_info(0).gid, peer[i]);
        r.barrier();
        uint32_t by_qp[2] = {0, 0};
        for (uint64_t i = 0; i < 4; ++i) {
          ibv_wc wc = poll_success(cq, 200 + i, IBV_WC_RECV);  // posting order, across QPs
          by_qp[wc.qp_num == q[1]->qp_num] += 1;
          EXPECT_EQ(256u, wc.byte_len);
          EXPECT_TRUE(HasPattern(r.buf() + i * 256, 256, 11, i * 256));
        }
        EXPECT_EQ(2u, by_qp[0]);
        EXPECT_EQ(2u, by_qp[1]);
        pollfd p{ctx->async_fd, POLLIN, 0};
        ASSERT_EQ(1, poll(&p, 1, 5000)) << "no SRQ limit event";
        ibv_async_event e{};
        ASSERT_EQ(0, ibv_get_async_event(ctx, &e));
        EXPECT_EQ(IBV_EVENT_SRQ_LIMIT_REACHED, e.event_type) << ibv_event_type_str(e.event_type);
        EXPECT_EQ(srq, e.element.srq);
        ibv_ack_async_event(&e);
        EXPECT_EQ(-1, ibv_get_async_event(ctx, &e)) << "one event per arming";
        ibv_srq_attr now{};
        ASSERT_EQ(0, ibv_query_srq(srq, &now));
        EXPECT_EQ(0u, now.srq_limit) << "disarmed once fired";
        EXPECT_EQ(8u, now.max_wr);
        EXPECT_EQ(EBUSY, ibv_destroy_srq(srq)) << "QPs still use it";
        r.barrier();
        for (ibv_qp* x : q) ibv_destroy_qp(x);
        EXPECT_EQ(0, ibv_destroy_srq(srq));
        ibv_destroy_cq(cq);
      }));
}

// ---- XRC --------------------------------------------------------------------------------

struct XrcInfo {
  uint32_t recv_qpn;  ///< the XRC receive (target) QP
  uint32_t send_qpn;  ///< the XRC send (initiator) QP
  uint32_t srqn[2];   ///< two XRC SRQs of the target
  uint64_t addr;
  uint32_t rkey;
};

// Role 0's XRC send QP reaches role 1's XRC receive QP; each SEND lands in the SRQ its WR
// names (completions on that SRQ's CQ, wc.qp_num the receive QP); an RDMA WRITE goes through
// the same QP checked against the SRQ's PD. In role 1, ibv_open_qp finds the receive QP in
// the domain opened twice through one file.
TEST(Xrc, SendQpReachesTheSrqItNames) {
  run_roles(two_roles(
      [](Role& r) {
        ibv_cq* cq = ibv_create_cq(r.dev().ctx, 64, nullptr, nullptr, 0);
        ibv_qp_init_attr_ex ia{};
        ia.qp_type = IBV_QPT_XRC_SEND;
        ia.send_cq = cq;
        ia.cap.max_send_wr = 16;
        ia.cap.max_send_sge = 1;
        ia.comp_mask = IBV_QP_INIT_ATTR_PD;
        ia.pd = r.dev().pd;
        ibv_qp* ini = ibv_create_qp_ex(r.dev().ctx, &ia);
        ASSERT_NE(nullptr, ini) << strerror(errno);
        const auto t = r.recv_value<XrcInfo>(1);
        r.send_value(1, ini->qp_num);
        to_rts(ini, r.peer_info(1).gid, t.recv_qpn);
        r.barrier();
        fill_pattern(r.buf(), 8192, 13);
        for (uint64_t i = 0; i < 4; ++i) {
          ibv_sge s{reinterpret_cast<uintptr_t>(r.buf() + i * 1024), 1024, r.lkey()};
          ibv_send_wr wr{};
          wr.wr_id = i;
          wr.sg_list = &s;
          wr.num_sge = 1;
          wr.opcode = IBV_WR_SEND;
          wr.send_flags = IBV_SEND_SIGNALED;
          wr.qp_type.xrc.remote_srqn = t.srqn[i % 2];
          ibv_send_wr* bad = nullptr;
          ASSERT_EQ(0, ibv_post_send(ini, &wr, &bad));
        }
        ibv_sge s{reinterpret_cast<uintptr_t>(r.buf() + 4096), 4096, r.lkey()};
        ibv_send_wr wr{};
        wr.wr_id = 9;
        wr.sg_list = &s;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_RDMA_WRITE;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.wr.rdma.remote_addr = t.addr + 65536;
        wr.wr.rdma.rkey = t.rkey;
        wr.qp_type.xrc.remote_srqn = t.srqn[0];
        ibv_send_wr* bad = nullptr;
        ASSERT_EQ(0, ibv_post_send(ini, &wr, &bad));
        for (uint64_t i = 0; i < 4; ++i) poll_success(cq, i, IBV_WC_SEND);
        poll_success(cq, 9, IBV_WC_RDMA_WRITE);
        r.barrier();
        EXPECT_EQ(0, ibv_destroy_qp(ini));
        EXPECT_EQ(0, ibv_destroy_cq(cq));
      },
      [](Role& r) {
        ibv_context* ctx = r.dev().ctx;
        char path[] = "/tmp/softrdma-xrcd-XXXXXX";
        const int fd = mkstemp(path);
        ASSERT_GE(fd, 0);
        unlink(path);
        ibv_xrcd_init_attr xa{};
        xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
        xa.fd = fd;
        xa.oflags = O_CREAT;
        ibv_xrcd* xrcd = ibv_open_xrcd(ctx, &xa);
        ASSERT_NE(nullptr, xrcd) << strerror(errno);
        ibv_xrcd* again = ibv_open_xrcd(ctx, &xa);  // the same domain, through the same file
        ASSERT_NE(nullptr, again) << strerror(errno);
        ibv_cq* cqs[2] = {ibv_create_cq(ctx, 64, nullptr, nullptr, 0),
                          ibv_create_cq(ctx, 64, nullptr, nullptr, 0)};
        ibv_srq* srq[2];
        XrcInfo info{};
        for (int i = 0; i < 2; ++i) {
          ibv_srq_init_attr_ex sa{};
          sa.attr = {16, 1, 0};
          sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ |
                         IBV_SRQ_INIT_ATTR_PD;
          sa.srq_type = IBV_SRQT_XRC;
          sa.xrcd = xrcd;
          sa.cq = cqs[i];
          sa.pd = r.dev().pd;
          srq[i] = ibv_create_srq_ex(ctx, &sa);
          ASSERT_NE(nullptr, srq[i]) << strerror(errno);
          ASSERT_EQ(0, ibv_get_srq_num(srq[i], &info.srqn[i]));
          for (uint64_t k = 0; k < 2; ++k) {
            ibv_sge sg{reinterpret_cast<uintptr_t>(r.buf() + (i * 2 + k) * 4096), 4096, r.lkey()};
            ibv_recv_wr wr{};
            wr.wr_id = 100 * (i + 1) + k;
            wr.sg_list = &sg;
            wr.num_sge = 1;
            ibv_recv_wr* bad = nullptr;
            ASSERT_EQ(0, ibv_post_srq_recv(srq[i], &wr, &bad));
          }
        }
        EXPECT_NE(info.srqn[0], info.srqn[1]);
        ibv_qp_init_attr_ex ia{};
        ia.qp_type = IBV_QPT_XRC_RECV;
        ia.comp_mask = IBV_QP_INIT_ATTR_XRCD;
        ia.xrcd = xrcd;
        ibv_qp* tgt = ibv_create_qp_ex(ctx, &ia);
        ASSERT_NE(nullptr, tgt) << strerror(errno);
        ibv_qp_open_attr oa{};
        oa.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
        oa.qp_num = tgt->qp_num;
        oa.xrcd = again;
        oa.qp_type = IBV_QPT_XRC_RECV;
        ibv_qp* opened = ibv_open_qp(ctx, &oa);
        ASSERT_NE(nullptr, opened) << strerror(errno);
        EXPECT_EQ(tgt->qp_num, opened->qp_num);
        info.recv_qpn = tgt->qp_num;
        info.addr = reinterpret_cast<uintptr_t>(r.buf());
        info.rkey = r.mr()->rkey;
        r.send_value(0, info);
        const auto ini_qpn = r.recv_value<uint32_t>(0);
        to_rts(tgt, r.peer_info(0).gid, ini_qpn);
        r.barrier();
        for (int i = 0; i < 2; ++i)
          for (uint64_t k = 0; k < 2; ++k) {
            ibv_wc wc = poll_success(cqs[i], 100 * (i + 1) + k, IBV_WC_RECV);
            EXPECT_EQ(tgt->qp_num, wc.qp_num);
            EXPECT_EQ(1024u, wc.byte_len);
            EXPECT_TRUE(HasPattern(r.buf() + (i * 2 + k) * 4096, 1024, 13, (k * 2 + i) * 1024));
          }
        r.barrier();  // the WRITE is acknowledged, so placed
        EXPECT_TRUE(HasPattern(r.buf() + 65536, 4096, 13, 4096));
        EXPECT_EQ(0, ibv_close_xrcd(xrcd)) << "another handle on the domain remains";
        EXPECT_EQ(EBUSY, ibv_close_xrcd(again))
            << "the domain's last handle is busy while its SRQs and QPs exist";
        EXPECT_EQ(0, ibv_destroy_qp(opened));
        EXPECT_EQ(0, ibv_destroy_qp(tgt));
        for (ibv_srq* x : srq) EXPECT_EQ(0, ibv_destroy_srq(x));
        EXPECT_EQ(0, ibv_close_xrcd(again));
        for (ibv_cq* c : cqs) EXPECT_EQ(0, ibv_destroy_cq(c));
        close(fd);
      }));
}

// ---- capture ------------------------------------------------------------------------------

/// Creates role r's side of an XRC pair: on role 1 an XRC domain, XRC SRQ (one WQE posted)
/// and XRC receive QP; on role 0 an XRC send QP. Returns the QP; *srqn gets the SRQ number
/// (role 1).
struct XrcSide {
  ibv_xrcd* xrcd = nullptr;
  ibv_srq* srq = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  uint32_t srqn = 0;
  void destroy() {
    if (qp) ibv_destroy_qp(qp);
    if (srq) ibv_destroy_srq(srq);
    if (xrcd) ibv_close_xrcd(xrcd);
    if (cq) ibv_destroy_cq(cq);
  }
};
XrcSide make_xrc(Role& r, bool target) {
  XrcSide x;
  ibv_context* ctx = r.dev().ctx;
  x.cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
  if (target) {
    ibv_xrcd_init_attr xa{};
    xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    xa.fd = -1;
    x.xrcd = ibv_open_xrcd(ctx, &xa);
    ibv_srq_init_attr_ex sa{};
    sa.attr = {4, 1, 0};
    sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ |
                   IBV_SRQ_INIT_ATTR_PD;
    sa.srq_type = IBV_SRQT_XRC;
    sa.xrcd = x.xrcd;
    sa.cq = x.cq;
    sa.pd = r.dev().pd;
    x.srq = ibv_create_srq_ex(ctx, &sa);
    if (!x.srq) fail_fatal(std::string("ibv_create_srq_ex: ") + strerror(errno));
    ibv_get_srq_num(x.srq, &x.srqn);
    ibv_sge sg{reinterpret_cast<uintptr_t>(r.buf() + 65536), 4096, r.lkey()};
    ibv_recv_wr wr{};
    wr.sg_list = &sg;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    EXPECT_EQ(0, ibv_post_srq_recv(x.srq, &wr, &bad));
    ibv_qp_init_attr_ex ia{};
    ia.qp_type = IBV_QPT_XRC_RECV;
    ia.comp_mask = IBV_QP_INIT_ATTR_XRCD;
    ia.xrcd = x.xrcd;
    x.qp = ibv_create_qp_ex(ctx, &ia);
  } else {
    ibv_qp_init_attr ia{};
    ia.send_cq = x.cq;
    ia.qp_type = IBV_QPT_XRC_SEND;
    ia.cap.max_send_wr = 4;
    ia.cap.max_send_sge = 1;
    x.qp = ibv_create_qp(r.dev().pd, &ia);
  }
  if (!x.qp) fail_fatal(std::string("XRC QP: ") + strerror(errno));
  return x;
}

struct Numbers {
  uint32_t ud, uc, xrc, srqn;
};

// One UD datagram, one UC SEND and one XRC SEND (with its XRC ACK) between two devices, the
// receiver capturing (SOFTRDMA_PCAP): Debian's tshark decodes every frame as InfiniBand with
// the UD, UC and XRC opcodes, the UD frame's DETH (Q_Key, source QP), and no malformed frame.
TEST(Capture, UdUcXrcDecodeInTshark) {
  if (!have_tool("tshark"))
    FAIL() << "tshark is missing: install Debian's tshark (scripts/deps.sh)";
  const std::string file = "/tmp/softrdma-qptypes-" + std::to_string(::getpid()) + ".pcap";
  Spec s = two_roles(
      [](Role& r) {
        ibv_cq *ucq = nullptr, *ccq = nullptr;
        ibv_qp* ud = make_qp(r, IBV_QPT_UD, ucq);
        ibv_qp* uc = make_qp(r, IBV_QPT_UC, ccq);
        XrcSide x = make_xrc(r, false);
        const auto peer = r.recv_value<Numbers>(1);
        r.send_value(1, Numbers{ud->qp_num, uc->qp_num, x.qp->qp_num, 0});
        const ibv_gid g = r.peer_info(1).gid;
        to_rts(ud, g, 0);
        to_rts(uc, g, peer.uc);
        to_rts(x.qp, g, peer.xrc);
        r.barrier();
        ibv_ah* ah = make_ah(r, g);
        ASSERT_EQ(0, post_ud(ud, ah, peer.ud, kQkey, 1, r.buf(), 100, r.lkey()));
        poll_success(ucq, 1, IBV_WC_SEND);
        ASSERT_EQ(0, post_send(uc, IBV_WR_SEND, 2, r.buf(), 100, r.lkey()));
        poll_success(ccq, 2, IBV_WC_SEND);
        ibv_sge sg{reinterpret_cast<uintptr_t>(r.buf()), 100, r.lkey()};
        ibv_send_wr wr{};
        wr.wr_id = 3;
        wr.sg_list = &sg;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.qp_type.xrc.remote_srqn = peer.srqn;
        ibv_send_wr* bad = nullptr;
        ASSERT_EQ(0, ibv_post_send(x.qp, &wr, &bad));
        poll_success(x.cq, 3, IBV_WC_SEND);
        r.barrier();
        ibv_destroy_ah(ah);
        ibv_destroy_qp(ud);
        ibv_destroy_qp(uc);
        x.destroy();
        ibv_destroy_cq(ucq);
        ibv_destroy_cq(ccq);
      },
      [](Role& r) {
        ibv_cq *ucq = nullptr, *ccq = nullptr;
        ibv_qp* ud = make_qp(r, IBV_QPT_UD, ucq);
        ibv_qp* uc = make_qp(r, IBV_QPT_UC, ccq);
        XrcSide x = make_xrc(r, true);
        r.send_value(0, Numbers{ud->qp_num, uc->qp_num, x.qp->qp_num, x.srqn});
        const auto peer = r.recv_value<Numbers>(0);
        const ibv_gid g = r.peer_info(0).gid;
        to_rts(ud, g, 0);
        to_rts(uc, g, peer.uc);
        to_rts(x.qp, g, peer.xrc);
        ASSERT_EQ(0, post_recv(ud, 1, r.buf(), 4096, r.lkey()));
        ASSERT_EQ(0, post_recv(uc, 2, r.buf() + 4096, 4096, r.lkey()));
        r.barrier();
        poll_success(ucq, 1, IBV_WC_RECV);
        poll_success(ccq, 2, IBV_WC_RECV);
        poll_success(x.cq, 0, IBV_WC_RECV);
        r.barrier();
        ibv_destroy_qp(ud);
        ibv_destroy_qp(uc);
        x.destroy();
        ibv_destroy_cq(ucq);
        ibv_destroy_cq(ccq);
      });
  s.roles[1].env = {{"SOFTRDMA_PCAP", file}};
  run_roles(s);
  const std::string text = command_output(
      "tshark -r '" + file +
      "' -Y infiniband -T fields -E separator=, -e infiniband.bth.opcode -e infiniband.deth.q_key "
      "-e infiniband.deth.srcqp -e _ws.malformed 2>/dev/null");
  std::remove(file.c_str());
  std::map<unsigned, int> seen;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream f(line);
    std::string op, qkey, srcqp, malformed;
    std::getline(f, op, ',');
    std::getline(f, qkey, ',');
    std::getline(f, srcqp, ',');
    std::getline(f, malformed, ',');
    const unsigned o = unsigned(std::stoul(op, nullptr, 0));
    ++seen[o];
    EXPECT_TRUE(malformed.empty()) << "opcode 0x" << std::hex << o << " decoded as malformed";
    if (o == 0x64) {
      EXPECT_EQ(kQkey, std::stoul(qkey, nullptr, 0)) << "DETH Q_Key";
      EXPECT_FALSE(srcqp.empty()) << "DETH source QP";
    }
  }
  EXPECT_EQ(1, seen[0x64]) << "UD_SEND_ONLY";
  EXPECT_EQ(1, seen[0x24]) << "UC_SEND_ONLY";
  EXPECT_EQ(1, seen[0xa4]) << "XRC_SEND_ONLY";
  EXPECT_EQ(1, seen[0xb1]) << "XRC_ACKNOWLEDGE";
  EXPECT_EQ(4u, seen.size()) << text;
}

}  // namespace
}  // namespace softrdma::verbs_test
