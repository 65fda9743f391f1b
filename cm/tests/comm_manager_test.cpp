// The CM protocol between two (or three) CommManagers on a fake fabric with a fake clock:
// the connection handshake, rejects, lost and duplicate MADs, dead peers, disconnects with
// time-wait, and SIDR. Each test drives time and delivery itself; nothing sleeps.
#include <gtest/gtest.h>

#include <vector>

#include "cm/tests/fake_mad_transport.h"

namespace softrdma::cm {
namespace {

using testing::FakeFabric;
using testing::InFlight;

constexpr uint32_t kA = 0x7f003f0a;  // 127.0.63.10: the active side
constexpr uint32_t kP = 0x7f003f0b;  // 127.0.63.11: the passive side
constexpr uint64_t kService = ip_service_id(0x0106, 18300);

/// Records every event of the IDs it handles.
struct Recorder {
  std::vector<CmEvent> events;
  std::vector<Mad> mads;  // copies of the received messages (the event's pointer dies)
  std::function<void(const CmEvent&)> also;
  CmHandler handler() {
    return [this](const CmEvent& e) {
      events.push_back(e);
      mads.push_back(e.mad ? *e.mad : Mad{});
      if (also) also(e);
    };
  }
  std::vector<CmEventType> types() const {
    std::vector<CmEventType> t;
    for (auto& e : events) t.push_back(e.type);
    return t;
  }
};

CmConfig fast_config() {
  CmConfig c;
  c.response_timeout = 12;  // 16.8 ms
  c.packet_life_time = 10;  // 4.2 ms
  c.max_retries = 3;
  c.ca_guid = 0x1111;
  return c;
}

Req make_req() {
  Req r;
  r.service_id = kService;
  r.local_qpn = 0x11;
  r.starting_psn = 0x100;
  r.private_data[40] = 0xab;
  return r;
}

Rep make_rep() {
  Rep r;
  r.local_qpn = 0x22;
  r.starting_psn = 0x200;
  r.private_data[0] = 0xcd;
  return r;
}

class CmTest : public ::testing::Test {
 protected:
  CmTest() : a(fabric.add(kA, fast_config())), p(fabric.add(kP, fast_config())) {}

  /// Passive listens on kService; every new ID's events go to `passive`.
  uint32_t listen() {
    uint32_t lid = p.create_id(passive.handler());
    EXPECT_EQ(p.listen(lid, kService), 0);
    return lid;
  }
  /// Runs a full handshake; returns (active ID, passive ID).
  std::pair<uint32_t, uint32_t> connect() {
    listen();
    uint32_t aid = a.create_id(active.handler());
    EXPECT_EQ(a.send_req(aid, {kP}, make_req()), 0);
    fabric.deliver();
    EXPECT_EQ(passive.events.size(), 1u);
    uint32_t pid = passive.events.back().id;
    EXPECT_EQ(p.send_rep(pid, make_rep()), 0);
    fabric.deliver();
    EXPECT_EQ(active.types().back(), CmEventType::kRepReceived);
    EXPECT_EQ(a.send_rtu(aid, {}), 0);
    fabric.deliver();
    EXPECT_EQ(passive.types().back(), CmEventType::kRtuReceived);
    return {aid, pid};
  }

  FakeFabric fabric;
  CommManager& a;
  CommManager& p;
  Recorder active, passive;
};

TEST_F(CmTest, HandshakeReqRepRtuEstablishesBothSides) {
  auto [aid, pid] = connect();
  EXPECT_EQ(a.state(aid), CmState::kEstablished);
  EXPECT_EQ(p.state(pid), CmState::kEstablished);
  ASSERT_EQ(passive.events[0].type, CmEventType::kReqReceived);
  EXPECT_EQ(passive.events[0].service_id, kService);
  EXPECT_EQ(passive.events[0].peer.ip, kA);
  const Req& req = std::get<Req>(passive.mads[0].message);
  EXPECT_EQ(req.local_qpn, 0x11u);
  EXPECT_EQ(req.private_data[40], 0xab);
  EXPECT_EQ(req.max_cm_retries, 3);
  EXPECT_EQ(req.local_ca_guid, 0x1111u);
  const Rep& rep = std::get<Rep>(active.mads[0].message);
  EXPECT_EQ(rep.local_qpn, 0x22u);
  EXPECT_EQ(rep.private_data[0], 0xcd);
  EXPECT_EQ(a.remote_qpn(aid), 0x22u);
  EXPECT_EQ(p.remote_qpn(pid), 0x11u);
  // One TID for the whole handshake (REP and RTU reuse the REQ's), three MADs in all.
  ASSERT_EQ(fabric.sent().size(), 3u);
  uint64_t tid = fabric.sent()[0].decoded().header.transaction_id;
  for (auto& m : fabric.sent()) EXPECT_EQ(m.decoded().header.transaction_id, tid);
  EXPECT_FALSE(a.next_deadline());  // nothing left to resend
  EXPECT_FALSE(p.next_deadline());
}

TEST_F(CmTest, ReqNobodyListensToIsRejectedInvalidServiceId) {
  uint32_t aid = a.create_id(active.handler());
  ASSERT_EQ(a.send_req(aid, {kP}, make_req()), 0);
  fabric.deliver();
  EXPECT_TRUE(active.events.empty());  // held a moment for a listener …
  EXPECT_EQ(p.counters().reqs_held, 1u);
  uint64_t t0 = fabric.now();
  ASSERT_TRUE(fabric.advance_to_next_timer());
  // … half the REQ's own response timeout (16.8 ms here; 1 s at most): before its resend.
  EXPECT_EQ(fabric.now() - t0, ib_time_ns(12) / 2);
  fabric.deliver();
  ASSERT_EQ(active.types(), std::vector{CmEventType::kRejReceived});
  const Rej& rej = std::get<Rej>(active.mads[0].message);
  EXPECT_EQ(rej.reason, uint16_t(RejReason::kInvalidServiceId));
  EXPECT_EQ(rej.message, MessageRef::kReq);
  EXPECT_EQ(rej.remote_comm_id, aid);
  EXPECT_EQ(a.state(aid), CmState::kIdle);
  EXPECT_EQ(p.counters().rej_sent, 1u);
  EXPECT_FALSE(a.next_deadline());
}

TEST_F(CmTest, ReqJustBeforeTheListenerIsHeldAndDeliveredToIt) {
  uint32_t aid = a.create_id(active.handler());
  ASSERT_EQ(a.send_req(aid, {kP}, make_req()), 0);
  fabric.deliver();
  fabric.advance(ib_time_ns(12) / 4);
  EXPECT_TRUE(passive.events.empty());
  listen();  // the server re-listens (perftest -R's second connection)
  ASSERT_EQ(passive.types(), std::vector{CmEventType::kReqReceived});
  EXPECT_EQ(p.send_rep(passive.events[0].id, make_rep()), 0);
  fabric.deliver();
  EXPECT_EQ(active.types(), std::vector{CmEventType::kRepReceived});
  EXPECT_EQ(p.counters().rej_sent, 0u);
}

TEST_F(CmTest, ConsumerRejectCarriesReasonAndPrivateData) {
  listen();
  uint32_t aid = a.create_id(active.handler());
  a.send_req(aid, {kP}, make_req());
  fabric.deliver();
  const uint8_t why[] = {'n', 'o'};
  ASSERT_EQ(p.send_rej(passive.events[0].id, RejReason::kConsumerDefined, why), 0);
  fabric.deliver();
  ASSERT_EQ(active.types(), std::vector{CmEventType::kRejReceived});
  const Rej& rej = std::get<Rej>(active.mads[0].message);
  EXPECT_EQ(rej.reason, 28);
  EXPECT_EQ(rej.private_data[0], 'n');
  EXPECT_EQ(rej.private_data[1], 'o');
}

TEST_F(CmTest, LostReqIsResentAfterTheResponseTimeout) {
  listen();
  uint32_t aid = a.create_id(active.handler());
  a.send_req(aid, {kP}, make_req());
  fabric.deliver([](const InFlight&) { return true; });  // the first REQ is lost
  EXPECT_TRUE(passive.events.empty());
  uint64_t t0 = fabric.now();
  ASSERT_TRUE(fabric.advance_to_next_timer());
  // 2 × packet life time + response timeout: 2 × 4.19 ms + 16.8 ms.
  EXPECT_EQ(fabric.now() - t0, 2 * ib_time_ns(10) + ib_time_ns(12));
  EXPECT_EQ(a.counters().mads_resent, 1u);
  fabric.deliver();
  ASSERT_EQ(passive.events.size(), 1u);
  EXPECT_EQ(passive.events[0].type, CmEventType::kReqReceived);
}

TEST_F(CmTest, DeadPassiveEndsInReqErrorAfterMaxRetries) {
  uint32_t aid = a.create_id(active.handler());
  a.send_req(aid, {0x7f003f63}, make_req());  // nobody at 127.0.63.99
  size_t rounds = 0;
  while (active.events.empty() && rounds++ < 100) {
    fabric.deliver();
    ASSERT_TRUE(fabric.advance_to_next_timer());
  }
  ASSERT_EQ(active.types(), std::vector{CmEventType::kReqError});
  EXPECT_EQ(a.counters().mads_sent, 1u + 3u);  // the REQ and Max CM Retries resends
  EXPECT_EQ(a.counters().timeouts, 1u);
  EXPECT_EQ(a.state(aid), CmState::kIdle);
  EXPECT_FALSE(a.next_deadline());
}

TEST_F(CmTest, DeadActiveAfterRepEndsInRepErrorAndRejTimeout) {
  listen();
  uint32_t aid = a.create_id(active.handler());
  a.send_req(aid, {kP}, make_req());
  fabric.deliver();
  uint32_t pid = passive.events[0].id;
  p.send_rep(pid, make_rep());
  // The active side dies: nothing reaches it any more.
  auto to_active = [](const InFlight& m) { return m.to.ip == kA; };
  size_t rounds = 0;
  while (passive.events.size() < 2 && rounds++ < 100) {
    fabric.deliver(to_active);
    ASSERT_TRUE(fabric.advance_to_next_timer());
  }
  ASSERT_EQ(passive.types().back(), CmEventType::kRepError);
  EXPECT_EQ(p.state(pid), CmState::kIdle);
  // REP + 3 resends + REJ(timeout) carrying the passive CA GUID.
  ASSERT_EQ(fabric.sent().back().decoded().header.attr_id, uint16_t(AttrId::kRej));
  const Rej rej = std::get<Rej>(fabric.sent().back().decoded().message);
  EXPECT_EQ(rej.reason, uint16_t(RejReason::kTimeout));
  EXPECT_EQ(rej.ari[7], 0x11);
}

TEST_F(CmTest, DuplicateReqWhileConsumerThinksDrawsMraAndExtendsTheWait) {
  listen();
  uint32_t aid = a.create_id(active.handler());
  a.send_req(aid, {kP}, make_req());
  fabric.deliver();
  ASSERT_EQ(passive.events.size(), 1u);
  // The consumer does not answer; the active side resends the REQ.
  ASSERT_TRUE(fabric.advance_to_next_timer());
  fabric.deliver();
  EXPECT_EQ(passive.events.size(), 1u);  // no second REQ event
  EXPECT_EQ(p.counters().mads_duplicate, 1u);
  EXPECT_EQ(fabric.sent().back().decoded().header.attr_id, uint16_t(AttrId::kMra));
  EXPECT_EQ(a.state(aid), CmState::kMraReqRcvd);
  // The REP may now come late and still connect.
  fabric.advance(ib_time_ns(12));
  ASSERT_EQ(p.send_rep(passive.events[0].id, make_rep()), 0);
  fabric.deliver();
  EXPECT_EQ(active.types(), std::vector{CmEventType::kRepReceived});
}

TEST_F(CmTest, LostRtuIsRecoveredByTheResentRep) {
  listen();
  uint32_t aid = a.create_id(active.handler());
  a.send_req(aid, {kP}, make_req());
  fabric.deliver();
  uint32_t pid = passive.events[0].id;
  p.send_rep(pid, make_rep());
  fabric.deliver();
  a.send_rtu(aid, {});
  fabric.deliver([](const InFlight& m) { return m.decoded().header.attr_id == 0x14; });
  EXPECT_EQ(p.state(pid), CmState::kRepSent);
  ASSERT_TRUE(fabric.advance_to_next_timer());  // passive resends REP
  fabric.deliver();                             // active answers the duplicate with RTU
  EXPECT_EQ(a.counters().mads_duplicate, 1u);
  EXPECT_EQ(p.state(pid), CmState::kEstablished);
  EXPECT_EQ(passive.types().back(), CmEventType::kRtuReceived);
}

TEST_F(CmTest, CommEstablishedWithoutRtu) {
  listen();
  uint32_t aid = a.create_id(active.handler());
  a.send_req(aid, {kP}, make_req());
  fabric.deliver();
  uint32_t pid = passive.events[0].id;
  p.send_rep(pid, make_rep());
  ASSERT_EQ(p.establish(pid), 0);
  EXPECT_EQ(passive.types().back(), CmEventType::kUserEstablished);
  EXPECT_EQ(p.state(pid), CmState::kEstablished);
  EXPECT_FALSE(p.next_deadline());
  EXPECT_EQ(p.establish(pid), EISCONN);  // as Linux's cm_establish
}

TEST_F(CmTest, DisconnectDreqDrepThenTimeWaitExit) {
  auto [aid, pid] = connect();
  ASSERT_EQ(a.send_dreq(aid, {}), 0);
  fabric.deliver();
  EXPECT_EQ(passive.types().back(), CmEventType::kDreqReceived);
  const Dreq& dreq = std::get<Dreq>(passive.mads.back().message);
  EXPECT_EQ(dreq.remote_qpn, 0x22u);  // the passive QP
  ASSERT_EQ(p.send_drep(pid, {}), 0);
  fabric.deliver();
  EXPECT_EQ(active.types().back(), CmEventType::kDrepReceived);
  EXPECT_EQ(a.state(aid), CmState::kTimeWait);
  EXPECT_EQ(p.state(pid), CmState::kTimeWait);
  // Time-wait lasts the local ACK timeout: cm_ack_timeout(15, 10) = 15 → 134 ms.
  uint64_t t0 = fabric.now();
  ASSERT_TRUE(fabric.advance_to_next_timer());
  EXPECT_EQ(fabric.now() - t0, ib_time_ns(ack_timeout(15, 10)));
  EXPECT_EQ(active.types().back(), CmEventType::kTimeWaitExit);
  EXPECT_EQ(passive.types().back(), CmEventType::kTimeWaitExit);
  EXPECT_EQ(a.state(aid), CmState::kIdle);
}

TEST_F(CmTest, CrossingDreqsBothSeeDreqReceived) {
  auto [aid, pid] = connect();
  a.send_dreq(aid, {});
  p.send_dreq(pid, {});
  fabric.deliver();
  EXPECT_EQ(active.types().back(), CmEventType::kDreqReceived);
  EXPECT_EQ(passive.types().back(), CmEventType::kDreqReceived);
  EXPECT_EQ(a.send_drep(aid, {}), 0);
  EXPECT_EQ(p.send_drep(pid, {}), 0);
  fabric.deliver();
  EXPECT_EQ(a.state(aid), CmState::kTimeWait);
  EXPECT_EQ(p.state(pid), CmState::kTimeWait);
  EXPECT_FALSE(a.counters().timeouts);
}

TEST_F(CmTest, DreqToAPeerThatDiedEndsInDreqError) {
  auto [aid, pid] = connect();
  (void)pid;
  a.send_dreq(aid, {});
  size_t rounds = 0;
  while (active.types().back() != CmEventType::kDreqError && rounds++ < 100) {
    fabric.deliver([](const InFlight& m) { return m.to.ip == kP; });
    ASSERT_TRUE(fabric.advance_to_next_timer());
  }
  EXPECT_EQ(active.types().back(), CmEventType::kDreqError);
  EXPECT_EQ(a.state(aid), CmState::kTimeWait);
}

TEST_F(CmTest, DestroyingAnEstablishedIdSendsDreqAndTheTimeWaitAnswersTheDrep) {
  auto [aid, pid] = connect();
  a.destroy_id(aid);
  EXPECT_FALSE(a.state(aid));  // gone for the user …
  fabric.deliver();
  EXPECT_EQ(passive.types().back(), CmEventType::kDreqReceived);
  p.send_drep(pid, {});
  fabric.deliver();  // … but its time-wait record takes the DREP without complaint
  EXPECT_EQ(a.counters().mads_unmatched, 0u);
  // A late duplicate DREQ is answered from time-wait.
  EXPECT_TRUE(fabric.advance_to_next_timer());
  EXPECT_FALSE(a.next_deadline());  // time-wait over, record gone
}

TEST_F(CmTest, DreqForAnUnknownIdIsAnsweredWithDrep) {
  Dreq d;
  d.local_comm_id = 77;
  d.remote_comm_id = 0xdead;
  MadHeader h;
  h.transaction_id = 5;
  auto bytes = encode(h, d);
  a.on_mad(bytes, {kP});
  ASSERT_EQ(fabric.queue().size(), 1u);
  Mad reply = fabric.queue().front().decoded();
  EXPECT_EQ(reply.header.attr_id, uint16_t(AttrId::kDrep));
  EXPECT_EQ(reply.header.transaction_id, 5u);
  EXPECT_EQ(std::get<Drep>(reply.message).remote_comm_id, 77u);
  EXPECT_EQ(a.counters().mads_unmatched, 1u);
}

TEST_F(CmTest, DestroyingAPendingActiveIdSendsRejTimeout) {
  listen();
  uint32_t aid = a.create_id(active.handler());
  a.send_req(aid, {kP}, make_req());
  fabric.deliver();
  a.destroy_id(aid);
  fabric.deliver();
  EXPECT_EQ(passive.types().back(), CmEventType::kRejReceived);
  EXPECT_EQ(std::get<Rej>(passive.mads.back().message).reason, uint16_t(RejReason::kTimeout));
  EXPECT_FALSE(a.next_deadline());
}

TEST_F(CmTest, MadsFromAnotherPeerOrForUnknownIdsAreDroppedAndCounted) {
  auto [aid, pid] = connect();
  (void)pid;
  Rtu rtu;
  rtu.remote_comm_id = aid;
  a.on_mad(encode(MadHeader{}, rtu), {0x7f003f63});
  EXPECT_EQ(a.counters().mads_wrong_peer, 1u);
  rtu.remote_comm_id = aid + 1;
  a.on_mad(encode(MadHeader{}, rtu), {kP});
  EXPECT_EQ(a.counters().mads_unmatched, 1u);
  std::array<uint8_t, kMadBytes> junk{};
  a.on_mad(junk, {kP});
  EXPECT_EQ(a.counters().mads_malformed, 1u);
  junk = encode(MadHeader{}, rtu);
  junk[1] = 0x04;  // Performance Management
  a.on_mad(junk, {kP});
  EXPECT_EQ(a.counters().mads_not_cm, 1u);
  a.on_mad(std::span<const uint8_t>(junk).first(100), {kP});
  EXPECT_EQ(a.counters().mads_malformed, 2u);
  EXPECT_EQ(a.state(aid), CmState::kEstablished);
  EXPECT_TRUE(fabric.queue().empty());
}

TEST_F(CmTest, ApiCallsInTheWrongStateReturnEinval) {
  uint32_t aid = a.create_id(active.handler());
  EXPECT_EQ(a.send_rep(aid, make_rep()), EINVAL);
  EXPECT_EQ(a.send_rtu(aid, {}), EINVAL);
  EXPECT_EQ(a.send_dreq(aid, {}), EINVAL);
  EXPECT_EQ(a.send_drep(aid, {}), EINVAL);
  EXPECT_EQ(a.send_rej(aid, RejReason::kConsumerDefined, {}), EINVAL);
  EXPECT_EQ(a.establish(aid), EINVAL);
  EXPECT_EQ(a.send_req(0x12345, {kP}, make_req()), EINVAL);  // no such ID
  uint32_t l1 = a.create_id(nullptr), l2 = a.create_id(nullptr);
  EXPECT_EQ(a.listen(l1, kService), 0);
  EXPECT_EQ(a.listen(l2, kService), EADDRINUSE);
  EXPECT_EQ(a.listen(l1, kService + 1), EINVAL);  // already listening
  a.destroy_id(l1);
  EXPECT_EQ(a.listen(l2, kService), 0);  // the service ID is free again
}

TEST_F(CmTest, SidrRequestReplyAndDuplicateIsAnsweredAgain) {
  listen();
  uint32_t aid = a.create_id(active.handler());
  SidrReq req;
  req.service_id = kService;
  req.private_data[0] = 9;
  ASSERT_EQ(a.send_sidr_req(aid, {kP}, req), 0);
  fabric.deliver();
  ASSERT_EQ(passive.types(), std::vector{CmEventType::kSidrReqReceived});
  EXPECT_EQ(std::get<SidrReq>(passive.mads[0].message).private_data[0], 9);
  SidrRep rep;
  rep.qpn = 0x33;
  rep.qkey = 0x01234567;
  ASSERT_EQ(p.send_sidr_rep(passive.events[0].id, rep), 0);
  fabric.deliver([](const InFlight&) { return true; });  // the SIDR_REP is lost
  ASSERT_TRUE(fabric.advance_to_next_timer());           // SIDR_REQ resent
  fabric.deliver();                                      // answered again from the record
  ASSERT_EQ(active.types(), std::vector{CmEventType::kSidrRepReceived});
  const SidrRep& got = std::get<SidrRep>(active.mads[0].message);
  EXPECT_EQ(got.status, SidrStatus::kSuccess);
  EXPECT_EQ(got.qpn, 0x33u);
  EXPECT_EQ(got.qkey, 0x01234567u);
  EXPECT_EQ(got.service_id, kService);
  EXPECT_EQ(passive.events.size(), 1u);
}

TEST_F(CmTest, SidrToNobodyIsUnsupportedAndToADeadPeerTimesOut) {
  uint32_t aid = a.create_id(active.handler());
  SidrReq req;
  req.service_id = kService;
  a.send_sidr_req(aid, {kP}, req);
  fabric.deliver();
  ASSERT_TRUE(fabric.advance_to_next_timer());  // the hold for a listener ends
  fabric.deliver();
  ASSERT_EQ(active.types(), std::vector{CmEventType::kSidrRepReceived});
  EXPECT_EQ(std::get<SidrRep>(active.mads[0].message).status, SidrStatus::kUnsupported);

  uint32_t bid = a.create_id(active.handler());
  a.send_sidr_req(bid, {0x7f003f63}, req);
  size_t rounds = 0;
  while (active.events.size() < 2 && rounds++ < 100) {
    fabric.deliver();
    ASSERT_TRUE(fabric.advance_to_next_timer());
  }
  EXPECT_EQ(active.types().back(), CmEventType::kSidrReqError);
}

TEST_F(CmTest, HandlerMayDestroyItsIdFromInsideTheEvent) {
  listen();
  passive.also = [&](const CmEvent& e) {
    if (e.type == CmEventType::kReqReceived) p.destroy_id(e.id);  // reject by destroying
  };
  uint32_t aid = a.create_id(active.handler());
  a.send_req(aid, {kP}, make_req());
  fabric.deliver();
  ASSERT_EQ(active.types(), std::vector{CmEventType::kRejReceived});
  EXPECT_EQ(std::get<Rej>(active.mads[0].message).reason, uint16_t(RejReason::kConsumerDefined));
}

TEST(CmTimes, AckTimeoutFollowsLinux) {
  EXPECT_EQ(ack_timeout(15, 16), 17);  // RoCE defaults: 2^17 × 4.096 µs ≈ 537 ms
  EXPECT_EQ(ack_timeout(15, 10), 15);
  EXPECT_EQ(ack_timeout(0, 13), 14);
  EXPECT_EQ(ack_timeout(31, 31), 31);
  EXPECT_EQ(ib_time_ns(0), 4096u);
  EXPECT_EQ(ib_time_ns(20), 4096ull << 20);
}

// Two processes sharing the passive address (net/address_share.h): both CMs receive every
// MAD sent there. The one listening takes the REQ; the other leaves it (no hold, no REJ)
// because the shared port table says another process listens. Later MADs name the
// listener's communication ID, whose top bits are its slot: the other CM drops them without
// answering — also a DREQ, which a CM answers with a DREP when the ID is unknown.
TEST(CmSharedAddress, TheListenersProcessAnswersAndTheOtherStaysSilent) {
  FakeFabric fabric;
  CommManager& a = fabric.add(kA, fast_config());
  bool other_listens = false;
  CmConfig c0 = fast_config();
  c0.slot = 0;
  c0.listened_elsewhere = [&](uint64_t sid) { return other_listens && sid == kService; };
  CmConfig c1 = fast_config();
  c1.slot = 1;
  CommManager& p0 = fabric.add(kP, c0);
  CommManager& p1 = fabric.add(kP, c1);
  Recorder active, idle, listener;
  uint32_t lid = p1.create_id(listener.handler());
  EXPECT_EQ(lid >> kCommIdSlotShift, 1u);
  EXPECT_EQ(p0.create_id(idle.handler()) >> kCommIdSlotShift, 0u);
  ASSERT_EQ(p1.listen(lid, kService), 0);
  other_listens = true;

  uint32_t aid = a.create_id(active.handler());
  ASSERT_EQ(a.send_req(aid, {kP}, make_req()), 0);
  fabric.deliver();
  ASSERT_EQ(listener.types(), std::vector{CmEventType::kReqReceived});
  const uint32_t pid = listener.events[0].id;
  EXPECT_EQ(pid >> kCommIdSlotShift, 1u);
  EXPECT_EQ(p0.counters().reqs_held, 0u);
  EXPECT_EQ(p0.counters().mads_other_process, 1u);
  ASSERT_EQ(p1.send_rep(pid, make_rep()), 0);
  fabric.deliver();
  ASSERT_EQ(a.send_rtu(aid, {}), 0);
  fabric.deliver();
  EXPECT_EQ(p1.state(pid), CmState::kEstablished);
  EXPECT_EQ(a.state(aid), CmState::kEstablished);
  ASSERT_EQ(a.send_dreq(aid, {}), 0);
  fabric.deliver();
  EXPECT_EQ(p1.state(pid), CmState::kDreqRcvd);
  ASSERT_EQ(p1.send_drep(pid, {}), 0);
  fabric.deliver();
  EXPECT_EQ(p1.state(pid), CmState::kTimeWait);
  EXPECT_EQ(p0.counters().mads_other_process, 3u);  // the REQ, the RTU and the DREQ
  EXPECT_EQ(p0.counters().mads_unmatched, 0u);
  EXPECT_TRUE(idle.events.empty());
  // No REJ and exactly one DREP: process 0 never answered.
  size_t rej = 0, drep = 0;
  for (auto& m : fabric.sent()) {
    rej += std::holds_alternative<Rej>(m.decoded().message);
    drep += std::holds_alternative<Drep>(m.decoded().message);
  }
  EXPECT_EQ(rej, 0u);
  EXPECT_EQ(drep, 1u);
  EXPECT_FALSE(p0.next_deadline());
}

}  // namespace
}  // namespace softrdma::cm
