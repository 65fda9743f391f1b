// Unit tests of the QP types besides RC — UD, UC, QPs on an SRQ, XRC send/receive — run back
// to back over the fakes (fakes.h): every packet is the test's to deliver, drop or inspect.
// The device's receive checks (service, Q_Key, source) are covered by the verbs tests.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "engine/cq.h"
#include "engine/memory.h"
#include "engine/qp.h"
#include "engine/srq.h"
#include "engine/tests/fakes.h"
#include "engine/xrcd.h"

namespace softrdma::engine {
namespace {

using wire::Opcode;
using wire::Service;

constexpr uint32_t kAll = kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic;
constexpr uint32_t kPsn = 0x123456;
constexpr uint32_t kQkey = 0x11111111;
constexpr uint32_t kMtu = 1024;

class QpTypesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dev = std::make_unique<FakeDevice>();
    pd = std::make_unique<ProtectionDomain>(*dev);
    cq_a = std::make_unique<CompletionQueue>(*dev, 1024, nullptr, nullptr);
    cq_b = std::make_unique<CompletionQueue>(*dev, 1024, nullptr, nullptr);
    ta = std::make_unique<FakeTransport>(*dev);
    tb = std::make_unique<FakeTransport>(*dev);
    dev->transport_ = ta.get();
    src.resize(64 * 1024);
    dst.resize(64 * 1024);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 13 + 5);
    mr_src = std::make_unique<MemoryRegion>(*pd, src.data(), src.size(),
                                            reinterpret_cast<uintptr_t>(src.data()), kAll);
    mr_dst = std::make_unique<MemoryRegion>(*pd, dst.data(), dst.size(),
                                            reinterpret_cast<uintptr_t>(dst.data()), kAll);
  }
  void TearDown() override {
    // QPs before the SRQs, domains and CQs they hold.
    qps.clear();
    srqs.clear();
    mr_src.reset();
    mr_dst.reset();
  }

  /// A QP of `init.type` on the fake device; PD, CQs and capacities filled in where unset.
  QueuePair& make(QpInit init, FakeTransport& t, CompletionQueue& cq) {
    if (init.type != QpType::kXrcRecv && !init.pd) init.pd = pd.get();
    const QpTypeInfo& type = *qp_type_info(init.type);
    if (type.has_send_queue) init.send_cq = &cq;
    if (type.has_recv_queue) init.recv_cq = &cq;
    if (init.cap.max_send_wr == 0) init.cap = {64, 64, 4, 4, 64};
    init.sq_sig_all = true;
    EXPECT_EQ(QueuePair::validate_init(init), kOk);
    qps.push_back(std::make_unique<QueuePair>(*dev, init));
    qps.back()->transport = &t;
    return *qps.back();
  }
  SharedReceiveQueue& make_srq(uint32_t max_wr,
                               SharedReceiveQueue::Kind kind = SharedReceiveQueue::Kind::kBasic,
                               CompletionQueue* cq = nullptr, XrcDomain* xrcd = nullptr) {
    SharedReceiveQueue::Attr a{max_wr, 4, 0};
    EXPECT_EQ(SharedReceiveQueue::validate(a), kOk);
    srqs.push_back(std::make_unique<SharedReceiveQueue>(*dev, *pd, kind, a, cq, xrcd));
    return *srqs.back();
  }

  /// Walks `q` RESET → INIT → RTR → RTS with exactly the attributes its type requires
  /// (the QP-type table's masks) towards `dest_qpn`.
  void connect(QueuePair& q, uint32_t dest_qpn) {
    QpAttr at;
    at.port_num = 1;
    at.access_flags = kAll;
    at.qkey = kQkey;
    at.path_mtu = 3;  // 1024
    at.dest_qp_num = dest_qpn;
    at.rq_psn = kPsn;
    at.sq_psn = kPsn;
    at.max_dest_rd_atomic = 4;
    at.max_rd_atomic = 4;
    at.min_rnr_timer = 1;
    at.timeout = 14;
    at.retry_cnt = 2;
    at.rnr_retry = 2;
    at.ah.is_global = true;
    at.ah.dgid = Gid::from_ipv4(dev->ip());
    const QpState path[] = {QpState::kReset, QpState::kInit, QpState::kRtr, QpState::kRts};
    for (int i = 1; i < 4; ++i) {
      uint32_t mask = kAttrState;
      for (const QpTransition& t : q.type_info().transitions)
        if (t.from == path[i - 1] && t.to == path[i]) mask |= t.required;
      at.state = path[i];
      ASSERT_EQ(q.modify(at, mask), kOk) << q.type_info().name << " to state " << i;
    }
  }

  Status post(QueuePair& q, WrOpcode op, uint64_t off, uint32_t len, uint64_t wr_id = 1,
              uint32_t remote_qpn = 0, uint32_t qkey = kQkey) {
    Sge s{reinterpret_cast<uintptr_t>(src.data()) + off, len, mr_src->key()};
    SendWr wr;
    wr.wr_id = wr_id;
    wr.opcode = op;
    wr.flags = kSignaled;
    wr.sg_list = &s;
    wr.num_sge = 1;
    wr.remote_addr = reinterpret_cast<uintptr_t>(dst.data()) + off;
    wr.rkey = mr_dst->key();
    wr.ud_dst_ip = dev->ip();
    wr.remote_qpn = remote_qpn;
    wr.remote_qkey = qkey;
    return q.post_send(wr);
  }
  Sge recv_sge(uint64_t off, uint32_t len) {
    return {reinterpret_cast<uintptr_t>(dst.data()) + off, len, mr_dst->key()};
  }
  void post_recv(QueuePair& q, uint64_t off, uint32_t len, uint64_t wr_id = 7) {
    const Sge s = recv_sge(off, len);
    ASSERT_EQ(q.post_recv(wr_id, &s, 1), kOk);
  }

  /// Delivers `from`'s packets to `to` as the device does: requests to the type's request
  /// unit, responses to the completer (fakes.h).
  size_t deliver(FakeTransport& from, QueuePair& to, FakeTransport& to_t) {
    return deliver_all(*dev, from, to, to_t);
  }
  static std::vector<Cqe> drain(CompletionQueue& cq) {
    std::vector<Cqe> out(256);
    const int n = cq.poll(256, out.data());
    out.resize(n < 0 ? 0 : size_t(n));
    return out;
  }

  std::unique_ptr<FakeDevice> dev;
  std::unique_ptr<ProtectionDomain> pd;
  std::unique_ptr<CompletionQueue> cq_a, cq_b;
  std::unique_ptr<FakeTransport> ta, tb;
  std::vector<uint8_t> src, dst;
  std::unique_ptr<MemoryRegion> mr_src, mr_dst;
  XrcDomain domains[2];  // outlive the SRQs and QPs TearDown destroys
  std::vector<std::unique_ptr<SharedReceiveQueue>> srqs;
  std::vector<std::unique_ptr<QueuePair>> qps;
};

// ---- UD ---------------------------------------------------------------------------------

TEST_F(QpTypesTest, UdSendIsOneDatagramWithDethAndLandsAfterTheGrh) {
  QueuePair& a = make({.type = QpType::kUd}, *ta, *cq_a);
  QueuePair& b = make({.type = QpType::kUd}, *tb, *cq_b);
  connect(a, 0);
  connect(b, 0);
  post_recv(b, 0, 40 + 600);
  ASSERT_EQ(post(a, WrOpcode::kSendImm, 0, 600, 1, b.qpn()), kOk);
  ASSERT_EQ(ta->sent.size(), 1u);
  const wire::Packet p = parse(ta->sent.front());
  EXPECT_EQ(p.hdr.bth.opcode, 0x65);  // UD_SEND_ONLY_WITH_IMMEDIATE
  EXPECT_EQ(p.hdr.bth.dest_qpn, b.qpn());
  EXPECT_EQ(p.hdr.bth.psn, kPsn);
  EXPECT_FALSE(p.hdr.bth.ack_req);
  EXPECT_EQ(p.hdr.deth.qkey, kQkey);
  EXPECT_EQ(p.hdr.deth.src_qpn, a.qpn());
  // Unreliable: the send completes once on the wire, with nothing to wait for.
  auto sc = drain(*cq_a);
  ASSERT_EQ(sc.size(), 1u);
  EXPECT_EQ(sc[0].status, WcStatus::kSuccess);
  EXPECT_EQ(sc[0].opcode, WcOpcode::kSend);
  deliver(*ta, b, *tb);
  EXPECT_TRUE(tb->sent.empty()) << "UD sends no ACK";
  auto rc = drain(*cq_b);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].status, WcStatus::kSuccess);
  EXPECT_EQ(rc[0].byte_len, 40u + 600u);
  EXPECT_EQ(rc[0].src_qp, a.qpn());
  EXPECT_EQ(rc[0].qp_num, b.qpn());
  EXPECT_EQ(rc[0].wc_flags, uint32_t(kWcGrh | kWcWithImm));
  EXPECT_EQ(std::memcmp(dst.data() + 40, src.data(), 600), 0);
  // The GRH area: 20 zero bytes, then an IPv4 header from the sender's address.
  for (int i = 0; i < 20; ++i) EXPECT_EQ(dst[i], 0) << i;
  EXPECT_EQ(dst[20], 0x45);
  EXPECT_EQ(dst[29], 17);  // UDP
  EXPECT_EQ(dst[32], 0x0a);
  EXPECT_EQ(dst[35], 0x01);  // source 10.0.0.1
}

TEST_F(QpTypesTest, UdQkeyWithTheHighBitSetMeansTheQpsOwn) {
  QueuePair& a = make({.type = QpType::kUd}, *ta, *cq_a);
  connect(a, 0);
  ASSERT_EQ(post(a, WrOpcode::kSend, 0, 8, 1, 0x42, 0x80000005), kOk);
  ASSERT_EQ(post(a, WrOpcode::kSend, 0, 8, 2, 0x42, 0x7fffffff), kOk);
  ASSERT_EQ(ta->sent.size(), 2u);
  EXPECT_EQ(parse(ta->sent[0]).hdr.deth.qkey, kQkey);
  EXPECT_EQ(parse(ta->sent[1]).hdr.deth.qkey, 0x7fffffffu);
}

// IBTA C10-93.1.1, rxe: a UD message over the port MTU emits nothing and is no error.
TEST_F(QpTypesTest, UdMessageOverTheMtuCompletesWithoutAPacket) {
  QueuePair& a = make({.type = QpType::kUd}, *ta, *cq_a);
  connect(a, 0);
  EXPECT_EQ(a.mtu, 4096u) << "a UD QP's messages are bounded by the port MTU";
  ASSERT_EQ(post(a, WrOpcode::kSend, 0, 4097, 1, 0x42), kOk);
  ASSERT_EQ(post(a, WrOpcode::kSend, 0, 4096, 2, 0x42), kOk);
  ASSERT_EQ(ta->sent.size(), 1u);
  EXPECT_EQ(parse(ta->sent[0]).payload.size(), 4096u);
  EXPECT_EQ(ta->counters_.ud_send_too_long.load(), 1u);
  auto c = drain(*cq_a);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].wr_id, 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
}

TEST_F(QpTypesTest, UdDatagramWithoutRoomIsDroppedAndCountedAndTheWqeKept) {
  QueuePair& a = make({.type = QpType::kUd}, *ta, *cq_a);
  QueuePair& b = make({.type = QpType::kUd}, *tb, *cq_b);
  connect(a, 0);
  connect(b, 0);
  ASSERT_EQ(post(a, WrOpcode::kSend, 0, 100, 1, b.qpn()), kOk);
  deliver(*ta, b, *tb);  // no receive posted
  post_recv(b, 0, 40 + 99, 5);
  ASSERT_EQ(post(a, WrOpcode::kSend, 0, 100, 2, b.qpn()), kOk);
  deliver(*ta, b, *tb);  // one byte short of GRH + payload
  EXPECT_EQ(tb->counters_.ud_dropped_pkts.load(), 2u);
  EXPECT_TRUE(drain(*cq_b).empty());
  ASSERT_EQ(post(a, WrOpcode::kSend, 0, 99, 3, b.qpn()), kOk);
  deliver(*ta, b, *tb);
  auto c = drain(*cq_b);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].wr_id, 5u);
  EXPECT_EQ(c[0].byte_len, 40u + 99u);
}

TEST_F(QpTypesTest, UdTakesSendsWithAnAddressHandleOnly) {
  QueuePair& a = make({.type = QpType::kUd}, *ta, *cq_a);
  connect(a, 0);
  for (WrOpcode op : {WrOpcode::kRdmaWrite, WrOpcode::kRdmaWriteImm, WrOpcode::kRdmaRead})
    EXPECT_EQ(post(a, op, 0, 8, 1, 0x42), std::errc::invalid_argument);
  Sge s{reinterpret_cast<uintptr_t>(src.data()), 8, mr_src->key()};
  SendWr wr;
  wr.opcode = WrOpcode::kSend;
  wr.sg_list = &s;
  wr.num_sge = 1;
  EXPECT_EQ(a.post_send(wr), std::errc::invalid_argument) << "no address handle";
  EXPECT_TRUE(ta->sent.empty());
}

// IBTA table 91, UD column: RESET→INIT needs the Q_Key (and no access flags), RTR needs
// nothing, RTS only the SQ PSN.
TEST_F(QpTypesTest, UdTransitionsFollowTheUdColumn) {
  QueuePair& a = make({.type = QpType::kUd}, *ta, *cq_a);
  QpAttr at;
  at.port_num = 1;
  at.qkey = kQkey;
  at.state = QpState::kInit;
  EXPECT_EQ(a.modify(at, kAttrState | kAttrPkeyIndex | kAttrPort), std::errc::invalid_argument);
  EXPECT_EQ(a.modify(at, kAttrState | kAttrPkeyIndex | kAttrPort | kAttrQkey | kAttrAccessFlags),
            std::errc::invalid_argument);
  ASSERT_EQ(a.modify(at, kAttrState | kAttrPkeyIndex | kAttrPort | kAttrQkey), kOk);
  at.state = QpState::kRtr;
  EXPECT_EQ(a.modify(at, kAttrState | kAttrAv), std::errc::invalid_argument);
  ASSERT_EQ(a.modify(at, kAttrState), kOk);
  at.state = QpState::kRts;
  EXPECT_EQ(a.modify(at, kAttrState), std::errc::invalid_argument);
  ASSERT_EQ(a.modify(at, kAttrState | kAttrSqPsn), kOk);
  EXPECT_EQ(a.query().qkey, kQkey);
}

// ---- UC ---------------------------------------------------------------------------------

TEST_F(QpTypesTest, UcSendAndWriteWithImmediateNeedNoAcknowledgement) {
  QueuePair& a = make({.type = QpType::kUc}, *ta, *cq_a);
  QueuePair& b = make({.type = QpType::kUc}, *tb, *cq_b);
  connect(a, b.qpn());
  connect(b, a.qpn());
  post_recv(b, 0, 8192, 1);
  post_recv(b, 0, 0, 2);
  ASSERT_EQ(post(a, WrOpcode::kSend, 0, 3 * kMtu + 7, 10), kOk);
  ASSERT_EQ(post(a, WrOpcode::kRdmaWriteImm, 16384, 2 * kMtu, 11), kOk);
  ASSERT_EQ(ta->sent.size(), 4u + 2u);
  for (const auto& b : ta->sent) {
    const wire::Packet p = parse(b);
    EXPECT_EQ(p.info->service, Service::kUc) << p.info->name;
    EXPECT_FALSE(p.hdr.bth.ack_req) << p.info->name;
  }
  EXPECT_EQ(drain(*cq_a).size(), 2u) << "UC sends complete at once";
  deliver(*ta, b, *tb);
  EXPECT_TRUE(tb->sent.empty()) << "UC sends no ACK";
  auto c = drain(*cq_b);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].opcode, WcOpcode::kRecv);
  EXPECT_EQ(c[0].byte_len, 3 * kMtu + 7);
  EXPECT_EQ(c[1].opcode, WcOpcode::kRecvRdmaWithImm);
  EXPECT_EQ(c[1].byte_len, 2 * kMtu);
  EXPECT_EQ(std::memcmp(dst.data() + 16384, src.data() + 16384, 2 * kMtu), 0);
}

// A lost packet loses its own message only: the rest of it is dropped and counted, the
// next message (its first packet) is received whole into the same receive WQE.
TEST_F(QpTypesTest, UcLostPacketLosesOnlyItsMessage) {
  QueuePair& a = make({.type = QpType::kUc}, *ta, *cq_a);
  QueuePair& b = make({.type = QpType::kUc}, *tb, *cq_b);
  connect(a, b.qpn());
  connect(b, a.qpn());
  for (uint64_t i = 0; i < 3; ++i) post_recv(b, i * 8192, 8192, 100 + i);
  for (uint64_t i = 0; i < 3; ++i) ASSERT_EQ(post(a, WrOpcode::kSend, i * 4096, 4 * kMtu, i), kOk);
  ASSERT_EQ(ta->sent.size(), 12u);
  ta->sent.erase(ta->sent.begin() + 5);  // the second packet of message 1
  deliver(*ta, b, *tb);
  EXPECT_EQ(tb->counters_.uc_dropped_pkts.load(), 2u) << "the two packets after the gap";
  auto c = drain(*cq_b);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].wr_id, 100u);
  EXPECT_EQ(c[1].wr_id, 101u) << "message 2 took the WQE message 1 left";
  EXPECT_EQ(c[1].byte_len, 4 * kMtu);
  EXPECT_EQ(std::memcmp(dst.data() + 8192, src.data() + 8192, 4 * kMtu), 0);
}

TEST_F(QpTypesTest, UcRefusesReadsAndAtomics) {
  QueuePair& a = make({.type = QpType::kUc}, *ta, *cq_a);
  connect(a, 0x42);
  EXPECT_EQ(post(a, WrOpcode::kRdmaRead, 0, 8), std::errc::invalid_argument);
  EXPECT_EQ(post(a, WrOpcode::kFetchAdd, 0, 8), std::errc::invalid_argument);
  EXPECT_EQ(post(a, WrOpcode::kCompareSwap, 0, 8), std::errc::invalid_argument);
  EXPECT_EQ(post(a, WrOpcode::kRdmaWrite, 0, 8), kOk);
}

// ---- SRQ --------------------------------------------------------------------------------

TEST_F(QpTypesTest, SrqFeedsTwoQpsInPostingOrderAndFiresItsLimitOnce) {
  SharedReceiveQueue& srq = make_srq(8);
  int events = 0;
  srq.on_limit_reached = [&] { ++events; };
  QueuePair& a1 = make({.type = QpType::kRc}, *ta, *cq_a);
  QueuePair& a2 = make({.type = QpType::kRc}, *ta, *cq_a);
  QueuePair& b1 = make({.type = QpType::kRc, .srq = &srq}, *tb, *cq_b);
  QueuePair& b2 = make({.type = QpType::kRc, .srq = &srq}, *tb, *cq_b);
  const Sge s = recv_sge(0, 64);
  EXPECT_EQ(b1.post_recv(1, &s, 1), std::errc::invalid_argument) << "its receives go to the SRQ";
  EXPECT_EQ(srq.users.load(), 2);
  for (uint64_t i = 0; i < 4; ++i) {
    const Sge r = recv_sge(i * 64, 64);
    ASSERT_EQ(srq.post_recv(200 + i, &r, 1), kOk);
  }
  ASSERT_EQ(srq.modify({0, 0, 3}, kSrqLimit), kOk);
  connect(a1, b1.qpn());
  connect(b1, a1.qpn());
  connect(a2, b2.qpn());
  connect(b2, a2.qpn());
  ASSERT_EQ(post(a1, WrOpcode::kSend, 0, 64, 1), kOk);
  deliver(*ta, b1, *tb);
  EXPECT_EQ(events, 0) << "3 left: not below the limit";
  ASSERT_EQ(post(a2, WrOpcode::kSend, 64, 64, 2), kOk);
  deliver(*ta, b2, *tb);
  EXPECT_EQ(events, 1) << "2 left: below the limit of 3";
  EXPECT_EQ(srq.query().srq_limit, 0u) << "disarmed once fired";
  ASSERT_EQ(post(a1, WrOpcode::kSend, 128, 64, 3), kOk);
  deliver(*ta, b1, *tb);
  EXPECT_EQ(events, 1) << "fires once per arming";
  auto c = drain(*cq_b);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].wr_id, 200u);
  EXPECT_EQ(c[0].qp_num, b1.qpn());
  EXPECT_EQ(c[1].wr_id, 201u);
  EXPECT_EQ(c[1].qp_num, b2.qpn());
  EXPECT_EQ(c[2].wr_id, 202u);
  EXPECT_EQ(srq.posted(), 1u);
}

TEST_F(QpTypesTest, SrqOverflowIsEnomemAndModifyChecksItsRanges) {
  SharedReceiveQueue& srq = make_srq(2);
  const Sge s = recv_sge(0, 64);
  EXPECT_EQ(srq.post_recv(1, &s, 1), kOk);
  EXPECT_EQ(srq.post_recv(2, &s, 1), kOk);
  EXPECT_EQ(srq.post_recv(3, &s, 1), std::errc::not_enough_memory);
  std::vector<Sge> many(5, s);
  EXPECT_EQ(srq.modify({4, 0, 0}, kSrqMaxWr), kOk);
  EXPECT_EQ(srq.post_recv(4, many.data(), 5), std::errc::invalid_argument) << "over max_sge";
  EXPECT_EQ(srq.modify({1, 0, 0}, kSrqMaxWr), std::errc::invalid_argument) << "below posted";
  EXPECT_EQ(srq.modify({0, 0, 5}, kSrqLimit), std::errc::invalid_argument) << "over max_wr";
  EXPECT_EQ(srq.modify({0, 0, 0}, 1u << 7), std::errc::invalid_argument);
  EXPECT_EQ(SharedReceiveQueue::validate({0, 1, 0}), std::errc::invalid_argument);
  EXPECT_EQ(SharedReceiveQueue::validate({DeviceLimits::kMaxSrqWr + 1, 1, 0}),
            std::errc::invalid_argument);
}

// ---- XRC --------------------------------------------------------------------------------

TEST_F(QpTypesTest, XrcSendReachesTheSrqItNamesAndIsAcknowledged) {
  XrcDomain& xrcd = domains[0];
  SharedReceiveQueue& other = make_srq(4, SharedReceiveQueue::Kind::kXrc, cq_a.get(), &xrcd);
  SharedReceiveQueue& srq = make_srq(4, SharedReceiveQueue::Kind::kXrc, cq_b.get(), &xrcd);
  QueuePair& ini = make({.type = QpType::kXrcSend}, *ta, *cq_a);
  QueuePair& tgt = make({.type = QpType::kXrcRecv, .xrcd = &xrcd}, *tb, *cq_b);
  EXPECT_EQ(tgt.pd_ptr(), nullptr);
  connect(ini, tgt.qpn());
  connect(tgt, ini.qpn());
  const Sge r = recv_sge(0, 8192);
  ASSERT_EQ(srq.post_recv(55, &r, 1), kOk);
  ASSERT_EQ(other.post_recv(66, &r, 1), kOk);
  Sge s{reinterpret_cast<uintptr_t>(src.data()), 3 * kMtu, mr_src->key()};
  SendWr wr;
  wr.wr_id = 9;
  wr.opcode = WrOpcode::kSend;
  wr.flags = kSignaled;
  wr.sg_list = &s;
  wr.num_sge = 1;
  wr.remote_srqn = srq.srqn();
  ASSERT_EQ(ini.post_send(wr), kOk);
  ASSERT_EQ(ta->sent.size(), 3u);
  for (const auto& b : ta->sent) {
    const wire::Packet p = parse(b);
    EXPECT_EQ(p.info->service, Service::kXrc);
    EXPECT_EQ(p.hdr.xrceth.srqn, srq.srqn());
  }
  deliver(*ta, tgt, *tb);
  ASSERT_EQ(tb->sent.size(), 1u);
  EXPECT_EQ(parse(tb->sent.front()).hdr.bth.opcode, 0xb1);  // XRC_ACKNOWLEDGE
  deliver(*tb, ini, *ta);
  auto rc = drain(*cq_b);  // the SRQ's CQ
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].wr_id, 55u);
  EXPECT_EQ(rc[0].qp_num, tgt.qpn());
  EXPECT_EQ(rc[0].byte_len, 3 * kMtu);
  auto sc = drain(*cq_a);
  ASSERT_EQ(sc.size(), 1u);
  EXPECT_EQ(sc[0].wr_id, 9u);
  EXPECT_EQ(sc[0].status, WcStatus::kSuccess);
  EXPECT_EQ(other.posted(), 1u) << "the SRQ not named keeps its WQE";
}

TEST_F(QpTypesTest, XrcRequestNamingAForeignSrqIsRefused) {
  XrcDomain& mine = domains[0];
  XrcDomain& theirs = domains[1];
  SharedReceiveQueue& foreign = make_srq(4, SharedReceiveQueue::Kind::kXrc, cq_b.get(), &theirs);
  QueuePair& ini = make({.type = QpType::kXrcSend}, *ta, *cq_a);
  QueuePair& tgt = make({.type = QpType::kXrcRecv, .xrcd = &mine}, *tb, *cq_b);
  connect(ini, tgt.qpn());
  connect(tgt, ini.qpn());
  Sge s{reinterpret_cast<uintptr_t>(src.data()), 16, mr_src->key()};
  SendWr wr;
  wr.opcode = WrOpcode::kSend;
  wr.flags = kSignaled;
  wr.sg_list = &s;
  wr.num_sge = 1;
  wr.remote_srqn = foreign.srqn();
  ASSERT_EQ(ini.post_send(wr), kOk);
  deliver(*ta, tgt, *tb);
  EXPECT_EQ(tb->counters_.rcvd_bad_xrc_srq.load(), 1u);
  deliver(*tb, ini, *ta);
  auto sc = drain(*cq_a);
  ASSERT_EQ(sc.size(), 1u);
  EXPECT_EQ(sc[0].status, WcStatus::kRemInvReqErr);
  EXPECT_EQ(tgt.query().state, QpState::kErr);
}

TEST_F(QpTypesTest, CreationChecksWhatEachTypeNeeds) {
  XrcDomain& xrcd = domains[0];
  SharedReceiveQueue& basic = make_srq(4);
  SharedReceiveQueue& xsrq = make_srq(4, SharedReceiveQueue::Kind::kXrc, cq_b.get(), &xrcd);
  auto check = [&](QpInit in) { return QueuePair::validate_init(in); };
  const QpCap cap{4, 4, 1, 1, 0};
  EXPECT_EQ(check({.type = QpType::kUd, .pd = pd.get(), .send_cq = cq_a.get(), .cap = cap}),
            std::errc::invalid_argument)
      << "no receive CQ";
  EXPECT_EQ(check({.type = QpType::kUc,
                   .pd = pd.get(),
                   .send_cq = cq_a.get(),
                   .recv_cq = cq_a.get(),
                   .srq = &xsrq,
                   .cap = cap}),
            std::errc::invalid_argument)
      << "an XRC SRQ on a UC QP";
  EXPECT_EQ(check({.type = QpType::kUc,
                   .pd = pd.get(),
                   .send_cq = cq_a.get(),
                   .recv_cq = cq_a.get(),
                   .srq = &basic,
                   .cap = cap}),
            kOk);
  EXPECT_EQ(check({.type = QpType::kXrcRecv, .pd = pd.get(), .xrcd = &xrcd}),
            std::errc::invalid_argument)
      << "an XRC receive QP has no PD";
  EXPECT_EQ(check({.type = QpType::kXrcRecv, .xrcd = &xrcd}), kOk);
  EXPECT_EQ(check({.type = QpType::kXrcSend, .pd = pd.get(), .send_cq = cq_a.get(), .cap = cap}),
            kOk);
  EXPECT_EQ(check({.type = static_cast<QpType>(8), .pd = pd.get()}),
            std::errc::operation_not_supported)
      << "raw packet";
}

TEST_F(QpTypesTest, TheGsiQpnIsTakenOnce) {
  QueuePair& one = make({.type = QpType::kUd, .qpn = 1}, *ta, *cq_a);
  EXPECT_EQ(one.qpn(), 1u);
  QpInit again{
      .type = QpType::kUd, .pd = pd.get(), .send_cq = cq_a.get(), .recv_cq = cq_a.get(), .qpn = 1};
  QueuePair second(*dev, again);
  EXPECT_EQ(second.qpn(), 0u) << "QPN 1 is taken";
}

}  // namespace
}  // namespace softrdma::engine
