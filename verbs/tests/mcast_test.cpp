// UD multicast between processes, each its own device: ibv_attach_mcast puts UD QPs in a
// group (an IPv4-mapped multicast GID); a UD send to the group's GID with destination QPN
// 0xFFFFFF reaches every attached QP of every process — each with the GRH area (the IPv4
// header's destination is the group) and the sender's QPN — and no QP that is not attached,
// detached, or of another Q_Key. And the verbs' own checks (the kernel's errno values).
// Groups: 239.77.0.0/24 (this file only).
#include <arpa/inet.h>

#include <cstring>
#include <vector>

#include "verbs/tests/harness.h"
#include "verbs/tests/qp_helpers.h"

namespace softrdma::verbs_test {
namespace {

constexpr uint32_t kMulticastQpn = 0xffffff;

/// ::ffff:239.77.0.<n>, the GID rdma_cm gives a RoCEv2 group.
ibv_gid group_gid(uint8_t n) {
  ibv_gid g{};
  g.raw[10] = g.raw[11] = 0xff;
  g.raw[12] = 239;
  g.raw[13] = 77;
  g.raw[14] = 0;
  g.raw[15] = n;
  return g;
}

uint32_t group_ip(uint8_t n) {
  return (239u << 24) | (77u << 16) | n;
}

/// A UD QP at RTS with its own CQ (destroyed by the test).
struct UdQp {
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  UdQp(Role& r, uint32_t qkey = kQkey) {
    qp = make_qp(r, IBV_QPT_UD, cq);
    to_rts(qp, ibv_gid{}, 0, qkey);
  }
};

// One sender, two receiving processes: the first with two QPs attached and one not, the
// second with a QP attached under another Q_Key. Five datagrams to the group reach both
// attached QPs of the first (GRH: source = sender, destination = group; src_qp = sender's
// QP), none of the others (the Q_Key mismatch counted). After one QP detaches, the next
// datagram reaches the other only. A QP still attached cannot be destroyed (EBUSY).
TEST(UdMulticast, EveryAttachedQpGetsACopyAndNoOtherDoes) {
  constexpr uint8_t kGroup = 1;
  constexpr int kMsgs = 5;
  constexpr uint32_t kLen = 700;
  Spec s;
  s.roles.resize(3);
  s.deadline = seconds(60);
  s.roles[0].fn = [](Role& r) {  // the sender (not attached to anything)
    UdQp u(r);
    r.send_value(1, u.qp->qp_num);
    ibv_ah* ah = make_ah(r, group_gid(kGroup));
    fill_pattern(r.buf(), kMsgs * kLen, 41);
    r.barrier();  // receivers attached, receives posted
    for (int i = 0; i < kMsgs; ++i)
      ASSERT_EQ(0, post_ud(u.qp, ah, kMulticastQpn, kQkey, i, r.buf() + i * kLen, kLen, r.lkey(),
                           i == kMsgs - 1));
    for (int i = 0; i < kMsgs; ++i) poll_success(u.cq, i, IBV_WC_SEND);
    r.barrier();  // received; one receiver QP detaches
    r.barrier();
    ASSERT_EQ(0, post_ud(u.qp, ah, kMulticastQpn, kQkey, 9, r.buf(), kLen, r.lkey()));
    poll_success(u.cq, 9, IBV_WC_SEND);
    r.barrier();
    EXPECT_EQ(0, ibv_destroy_ah(ah));
    EXPECT_EQ(0, ibv_destroy_qp(u.qp));
    EXPECT_EQ(0, ibv_destroy_cq(u.cq));
  };
  s.roles[1].fn = [](Role& r) {  // two QPs attached, one not
    const uint32_t sender_qpn = r.recv_value<uint32_t>(0);
    UdQp a(r), b(r), c(r);
    const ibv_gid g = group_gid(kGroup);
    ASSERT_EQ(0, ibv_attach_mcast(a.qp, &g, 0));
    ASSERT_EQ(0, ibv_attach_mcast(b.qp, &g, 0));
    ASSERT_EQ(0, ibv_attach_mcast(b.qp, &g, 0)) << "attaching twice is not an error";
    constexpr uint32_t kSlot = 2048;
    for (int i = 0; i < kMsgs + 1; ++i) {
      ASSERT_EQ(0, post_recv(a.qp, 100 + i, r.buf() + i * kSlot, kSlot, r.lkey()));
      ASSERT_EQ(0, post_recv(b.qp, 200 + i, r.buf() + (16 + i) * kSlot, kSlot, r.lkey()));
    }
    ASSERT_EQ(0, post_recv(c.qp, 300, r.buf() + 40 * kSlot, kSlot, r.lkey()));
    const Counters before = r.counters();
    r.barrier();
    for (int q = 0; q < 2; ++q) {
      UdQp& u = q == 0 ? a : b;
      for (int i = 0; i < kMsgs; ++i) {
        SCOPED_TRACE("QP " + std::string(q == 0 ? "a" : "b") + " datagram " + std::to_string(i));
        const ibv_wc wc = poll_success(u.cq, (q == 0 ? 100 : 200) + i, IBV_WC_RECV);
        EXPECT_EQ(sender_qpn, wc.src_qp);
        EXPECT_EQ(u.qp->qp_num, wc.qp_num);
        EXPECT_TRUE(wc.wc_flags & IBV_WC_GRH);
        EXPECT_EQ(i == kMsgs - 1, (wc.wc_flags & IBV_WC_WITH_IMM) != 0);
        EXPECT_EQ(40u + kLen, wc.byte_len);
        const uint8_t* grh = r.buf() + ((q == 0 ? 0 : 16) + i) * kSlot;
        uint32_t src = 0, dst = 0;
        std::memcpy(&src, grh + 32, 4);
        std::memcpy(&dst, grh + 36, 4);
        EXPECT_EQ(r.peer_info(0).ipv4, ntohl(src)) << "source address";
        EXPECT_EQ(group_ip(kGroup), ntohl(dst)) << "destination: the group";
        EXPECT_TRUE(HasPattern(grh + 40, kLen, 41, i * kLen));
      }
    }
    ibv_wc wc{};
    EXPECT_TRUE(no_completion(c.cq, 50ms, &wc)) << "a QP not attached received " << describe(wc);
    const Growth grown{before, r.counters()};
    EXPECT_EQ(uint64_t{kMsgs}, grown["mcast_rcvd_pkts"]) << grown.str();
    EXPECT_EQ(uint64_t{2 * kMsgs}, grown["mcast_delivered"]) << grown.str();
    EXPECT_EQ(EBUSY, ibv_destroy_qp(a.qp)) << "a QP attached to a group";
    ASSERT_EQ(0, ibv_detach_mcast(a.qp, &g, 0));
    EXPECT_EQ(EINVAL, ibv_detach_mcast(a.qp, &g, 0)) << "detached already";
    r.barrier();
    r.barrier();  // sent once more
    poll_success(b.cq, 200 + kMsgs, IBV_WC_RECV);
    EXPECT_TRUE(no_completion(a.cq, 50ms, &wc)) << "a detached QP received " << describe(wc);
    r.barrier();
    EXPECT_EQ(0, ibv_detach_mcast(b.qp, &g, 0));
    for (UdQp* u : {&a, &b, &c}) {
      EXPECT_EQ(0, ibv_destroy_qp(u->qp));
      EXPECT_EQ(0, ibv_destroy_cq(u->cq));
    }
  };
  s.roles[2].fn = [](Role& r) {  // attached, but its Q_Key is another one
    UdQp u(r, kQkey + 1);
    const ibv_gid g = group_gid(kGroup);
    ASSERT_EQ(0, ibv_attach_mcast(u.qp, &g, 0));
    ASSERT_EQ(0, post_recv(u.qp, 1, r.buf(), 4096, r.lkey()));
    const Counters before = r.counters();
    r.barrier();
    EXPECT_GE(wait_counter_growth(r.dev().addr, getpid(), {"rcvd_qkey_err"}, before, kMsgs),
              uint64_t{kMsgs})
        << "the datagrams of another Q_Key were not counted";
    ibv_wc wc{};
    EXPECT_TRUE(no_completion(u.cq, 20ms, &wc)) << "received under another Q_Key: " << describe(wc);
    r.barrier();
    r.barrier();
    r.barrier();
    // Destroying the QP without detaching is refused; the process ending frees it all.
    EXPECT_EQ(EBUSY, ibv_destroy_qp(u.qp));
    EXPECT_EQ(0, ibv_detach_mcast(u.qp, &g, 0));
    EXPECT_EQ(0, ibv_destroy_qp(u.qp));
    EXPECT_EQ(0, ibv_destroy_cq(u.cq));
  };
  run_roles(s);
}

// The kernel's checks (ib_attach_mcast, ib_uverbs_detach_mcast) and the device's limits.
TEST(UdMulticast, AttachChecksItsArguments) {
  run_in_one_process(
      [](Role& r) {
        ibv_device_attr attr{};
        ASSERT_EQ(0, ibv_query_device(r.dev().ctx, &attr));
        EXPECT_GT(attr.max_mcast_grp, 0) << "pyverbs skips multicast tests at 0";
        EXPECT_GT(attr.max_mcast_qp_attach, 0);
        EXPECT_EQ(attr.max_mcast_grp * attr.max_mcast_qp_attach, attr.max_total_mcast_qp_attach);

        UdQp u(r);
        ibv_cq* rc_cq = nullptr;
        ibv_qp* rc = make_qp(r, IBV_QPT_RC, rc_cq);
        const ibv_gid g = group_gid(10);
        EXPECT_EQ(EINVAL, ibv_attach_mcast(rc, &g, 0)) << "an RC QP";
        const ibv_gid unicast = r.dev().gid;
        EXPECT_EQ(EINVAL, ibv_attach_mcast(u.qp, &unicast, 0)) << "not a multicast GID";
        ibv_gid v6{};
        v6.raw[0] = 0xff;
        v6.raw[1] = 0x0e;
        v6.raw[15] = 1;
        EXPECT_EQ(EOPNOTSUPP, ibv_attach_mcast(u.qp, &v6, 0)) << "an IPv6 group (IPv4 device)";
        EXPECT_EQ(EINVAL, ibv_detach_mcast(u.qp, &g, 0)) << "never attached";

        // max_mcast_grp groups, then one more is ENOMEM; all detach again.
        std::vector<ibv_gid> groups;
        for (int i = 0; i < attr.max_mcast_grp; ++i) {
          groups.push_back(group_gid(static_cast<uint8_t>(100 + i)));
          ASSERT_EQ(0, ibv_attach_mcast(u.qp, &groups.back(), 0)) << "group " << i;
        }
        const ibv_gid extra = group_gid(99);
        EXPECT_EQ(ENOMEM, ibv_attach_mcast(u.qp, &extra, 0)) << "over max_mcast_grp";
        for (const ibv_gid& x : groups) EXPECT_EQ(0, ibv_detach_mcast(u.qp, &x, 0));
        EXPECT_EQ(0, ibv_destroy_qp(rc));
        EXPECT_EQ(0, ibv_destroy_cq(rc_cq));
        EXPECT_EQ(0, ibv_destroy_qp(u.qp));
        EXPECT_EQ(0, ibv_destroy_cq(u.cq));
      },
      seconds(60));
}

}  // namespace
}  // namespace softrdma::verbs_test
