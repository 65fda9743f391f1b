// Unit tests of the RC transport units — requester, responder, completer — driven through
// a fake Transport that records packets and owns the clock, on a fake device (the engine's
// ObjectRegistry seam): no socket, no progress thread. Two QPs are wired back to back by
// hand, so every packet, loss and reordering is the test's choice.
#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <unordered_map>
#include <vector>

#include "engine/cq.h"
#include "engine/memory.h"
#include "engine/object_registry.h"
#include "engine/qp.h"
#include "engine/tests/fakes.h"
#include "wire/icrc.h"

namespace softrdma::engine {
namespace {

using wire::Opcode;

void lose(FakeTransport& t, std::initializer_list<uint32_t> lost);  // below

class TransportTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kSqPsn = 0xfffff0;  // wraps the 24-bit PSN space mid-test
  static constexpr uint32_t kMtu = 1024;

  void SetUp() override {
    dev = std::make_unique<FakeDevice>();
    pd = std::make_unique<ProtectionDomain>(*dev);
    cq = std::make_unique<CompletionQueue>(*dev, 4096, nullptr, nullptr);
    ta = std::make_unique<FakeTransport>(*dev);
    tb = std::make_unique<FakeTransport>(*dev);
    dev->transport_ = ta.get();
    QpCap cap{1024, 1024, 4, 4, 64};
    a = std::make_unique<QueuePair>(*dev, *pd, *cq, *cq, cap, true);
    b = std::make_unique<QueuePair>(*dev, *pd, *cq, *cq, cap, true);
    a->transport = ta.get();
    b->transport = tb.get();
    connect(*a, *b);
    connect(*b, *a);
    src.resize(1 << 20);
    dst.resize(1 << 20);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 1);
    mr_src = std::make_unique<MemoryRegion>(*pd, src.data(), src.size(),
                                            reinterpret_cast<uintptr_t>(src.data()), kAll);
    mr_dst = std::make_unique<MemoryRegion>(*pd, dst.data(), dst.size(),
                                            reinterpret_cast<uintptr_t>(dst.data()), kAll);
  }
  void TearDown() override {
    mr_src.reset();
    mr_dst.reset();
    a.reset();
    b.reset();
  }

  void connect(QueuePair& q, QueuePair& peer) {
    QpAttr at;
    at.state = QpState::kInit;
    at.port_num = 1;
    at.access_flags = kAll;
    ASSERT_EQ(q.modify(at, kAttrState | kAttrPkeyIndex | kAttrPort | kAttrAccessFlags), kOk);
    at.state = QpState::kRtr;
    at.path_mtu = path_mtu;
    at.dest_qp_num = peer.qpn();
    at.rq_psn = kSqPsn;
    at.max_dest_rd_atomic = 4;
    at.min_rnr_timer = 1;  // 10 µs
    at.ah.is_global = true;
    at.ah.dgid = Gid::from_ipv4(dev->ip());
    ASSERT_EQ(q.modify(at, kAttrState | kAttrAv | kAttrPathMtu | kAttrDestQpn | kAttrRqPsn |
                               kAttrMaxDestRdAtomic | kAttrMinRnrTimer),
              kOk);
    at.state = QpState::kRts;
    at.sq_psn = kSqPsn;
    at.timeout = 14;
    at.retry_cnt = 2;
    at.rnr_retry = 2;
    at.max_rd_atomic = 4;
    ASSERT_EQ(q.modify(at, kAttrState | kAttrTimeout | kAttrRetryCnt | kAttrRnrRetry | kAttrSqPsn |
                               kAttrMaxQpRdAtomic),
              kOk);
  }

  Status post(QueuePair& q, WrOpcode op, uint64_t off, uint32_t len, uint64_t remote_off = 0,
              uint64_t wr_id = 1) {
    Sge s{reinterpret_cast<uintptr_t>((op == WrOpcode::kRdmaRead ? dst : src).data()) + off, len,
          (op == WrOpcode::kRdmaRead ? mr_dst : mr_src)->key()};
    SendWr wr;
    wr.wr_id = wr_id;
    wr.opcode = op;
    wr.flags = kSignaled;
    wr.sg_list = &s;
    wr.num_sge = 1;
    const auto& target = op == WrOpcode::kRdmaRead ? src : dst;
    wr.remote_addr = reinterpret_cast<uintptr_t>(target.data()) + remote_off;
    wr.rkey = (op == WrOpcode::kRdmaRead ? mr_src : mr_dst)->key();
    return q.post_send(wr);
  }
  void post_recv(QueuePair& q, uint32_t len, uint64_t wr_id = 7) {
    Sge s{reinterpret_cast<uintptr_t>(dst.data()), len, mr_dst->key()};
    ASSERT_EQ(q.post_recv(wr_id, &s, 1), kOk);
  }

  // Delivers every packet `from` has sent to `to` (requests to the responder, responses to
  // the completer), under the device lock as the device would; returns how many.
  size_t deliver(FakeTransport& from, QueuePair& to, FakeTransport& to_t) {
    return deliver_all(*dev, from, to, to_t);
  }
  // Delivers what `from` has sent to `to`, each packet lost with probability `pct` % (one
  // draw of `rng` per packet); returns how many were lost.
  int deliver_lossy(FakeTransport& from, QueuePair& to, FakeTransport& to_t, int pct,
                    std::mt19937& rng) {
    std::deque<std::vector<uint8_t>> kept;
    int lost = 0;
    for (auto& p : from.sent) {
      if (int(rng() % 100) >= pct)
        kept.push_back(std::move(p));
      else
        ++lost;
    }
    from.sent = std::move(kept);
    deliver(from, to, to_t);
    return lost;
  }
  // When neither side has a packet on the way, moves both clocks past the retransmit
  // timeout and fires the timers (what a lost packet waits for).
  void fire_timers_when_quiet() {
    if (!ta->sent.empty() || !tb->sent.empty()) return;
    ta->advance(a->retransmit_timeout_ns() + 1);
    tb->advance(b->retransmit_timeout_ns() + 1);
    std::lock_guard lk(dev->mutex());
    completer::on_timer(*a, *ta, ta->now_ns());
    completer::on_timer(*b, *tb, tb->now_ns());
  }
  // Fires the requester's due timers at its clock's time, under the device lock.
  void run_requester_timers() {
    std::lock_guard lk(dev->mutex());
    completer::on_timer(*a, *ta, ta->now_ns());
  }
  // Selective recovery on both sides, and a first one-packet WRITE (PSN +0) acknowledged
  // after `rtt`: the requester has measured the round trip.
  void start_selective_after_one_rtt(uint64_t rtt) {
    ta->selective = tb->selective = true;
    ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, kMtu, 0, 1), kOk);
    ta->advance(rtt);
    settle();
  }
  // After start_selective_after_one_rtt(kRtt): a WRITE of `packets` packets (wr_id 2, from
  // PSN +1), `lost` dropped on the way, and the responder's answers (ACKs, selective NAKs)
  // delivered: the requester has resent what they named.
  void write_lose_and_answer(uint32_t packets, std::initializer_list<uint32_t> lost) {
    ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, kMtu, packets * kMtu, kMtu, 2), kOk);
    lose(*ta, lost);
    deliver(*ta, *b, *tb);
    deliver(*tb, *a, *ta);
  }
  // A flight reaches the responder and its ACKs come back to the requester, each
  // `ns_per_psn` × the PSNs it covers after the one before (spaced by a bottleneck).
  // `acked`: the PSN the previous ACK named; updated.
  void ack_spaced(uint32_t& acked, uint64_t ns_per_psn) {
    deliver(*ta, *b, *tb);
    std::deque<std::vector<uint8_t>> acks = std::move(tb->sent);
    tb->sent.clear();
    for (auto& ack : acks) {
      const uint32_t psn = parse(ack).hdr.bth.psn;
      ta->advance(uint64_t(wire::psn_diff(psn, acked)) * ns_per_psn);
      acked = psn;
      tb->sent.push_back(std::move(ack));
      deliver(*tb, *a, *ta);
    }
  }
  // Runs both directions until nothing moves.
  void settle() {
    for (int i = 0; i < 1000; ++i)
      if (deliver(*ta, *b, *tb) + deliver(*tb, *a, *ta) == 0) return;
    FAIL() << "did not settle";
  }
  // Drains the CQ: exactly the WQEs `wr_ids`, in that order, each successful.
  void expect_completed(std::initializer_list<uint64_t> wr_ids) {
    const std::vector<Cqe> c = drain();
    ASSERT_EQ(c.size(), wr_ids.size());
    size_t i = 0;
    for (uint64_t id : wr_ids) {
      EXPECT_EQ(c[i].wr_id, id) << "completion " << i;
      EXPECT_EQ(c[i].status, WcStatus::kSuccess) << "wr " << id;
      ++i;
    }
  }
  std::vector<Cqe> drain() {
    std::vector<Cqe> out(256);
    int n = cq->poll(256, out.data());
    out.resize(n < 0 ? 0 : size_t(n));
    return out;
  }

  static constexpr uint32_t kAll = kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic;
  uint8_t path_mtu = 3;  ///< IBV_MTU_1024 (kMtu); a fixture may set another before SetUp
  std::unique_ptr<FakeDevice> dev;
  std::unique_ptr<ProtectionDomain> pd;
  std::unique_ptr<CompletionQueue> cq;
  std::unique_ptr<QueuePair> a, b;
  std::unique_ptr<FakeTransport> ta, tb;
  std::vector<uint8_t> src, dst;
  std::unique_ptr<MemoryRegion> mr_src, mr_dst;
};

TEST_F(TransportTest, RequesterSegmentsSendByMtuWithAckReqOnLast) {
  post_recv(*b, 11 * kMtu);
  ASSERT_EQ(post(*a, WrOpcode::kSend, 0, 10 * kMtu + 5), kOk);
  ASSERT_EQ(ta->sent.size(), 11u);
  for (size_t i = 0; i < 11; ++i) {
    wire::Packet p = parse(ta->sent[i]);
    EXPECT_EQ(p.hdr.bth.psn, wire::psn_add(kSqPsn, uint32_t(i)));  // wraps past 0xffffff
    EXPECT_EQ(p.hdr.bth.dest_qpn, b->qpn());
    Opcode want = i == 0 ? Opcode::kSendFirst : i == 10 ? Opcode::kSendLast : Opcode::kSendMiddle;
    EXPECT_EQ(p.hdr.bth.opcode, uint8_t(want)) << i;
    EXPECT_EQ(p.payload.size(), i == 10 ? 5u : kMtu);
    EXPECT_EQ(p.hdr.bth.ack_req, i == 10);
  }
  settle();
  auto c = drain();
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].opcode, WcOpcode::kRecv);
  EXPECT_EQ(c[0].byte_len, 10 * kMtu + 5);
  EXPECT_EQ(c[1].opcode, WcOpcode::kSend);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 10 * kMtu + 5), 0);
}

TEST_F(TransportTest, SendLargerThanReceiveIsLengthErrorOnBothSides) {
  post_recv(*b, 10000);
  ASSERT_EQ(post(*a, WrOpcode::kSend, 0, 10 * kMtu + 5), kOk);
  settle();
  auto c = drain();
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].opcode, WcOpcode::kRecv);
  EXPECT_EQ(c[0].status, WcStatus::kLocLenErr);
  EXPECT_EQ(c[1].status, WcStatus::kRemInvReqErr);
}

TEST_F(TransportTest, WindowLimitsInFlightPsnsAndAcksSlideIt) {
  const uint32_t pkts = 3 * CongestionWindow::kInitialPsns;
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, pkts * kMtu), kOk);
  EXPECT_EQ(ta->sent.size(), CongestionWindow::kInitialPsns);
  settle();
  auto c = drain();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), pkts * kMtu), 0);
}

TEST_F(TransportTest, LostPacketGetsOneSequenceNakThenGoBackN) {
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, 8 * kMtu), kOk);
  ta->sent.erase(ta->sent.begin() + 2);  // lose PSN +2
  deliver(*ta, *b, *tb);
  ASSERT_EQ(tb->sent.size(), 1u);  // one NAK for five out-of-sequence packets
  wire::Packet nak = parse(tb->sent[0]);
  EXPECT_EQ(nak.hdr.aeth.syndrome, wire::aeth_nak(wire::NakCode::kPsnSequenceError));
  EXPECT_EQ(nak.hdr.bth.psn, wire::psn_add(kSqPsn, 2));
  EXPECT_EQ(tb->counters_.out_of_seq_request.load(), 5u);
  deliver(*tb, *a, *ta);  // requester goes back to PSN +2
  ASSERT_EQ(ta->sent.size(), 6u);
  EXPECT_EQ(parse(ta->sent[0]).hdr.bth.psn, wire::psn_add(kSqPsn, 2));
  EXPECT_EQ(parse(ta->sent[0]).hdr.bth.opcode, uint8_t(Opcode::kWriteMiddle));
  settle();
  ASSERT_EQ(drain().size(), 1u);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 8 * kMtu), 0);
}

TEST_F(TransportTest, TimeoutRetransmitsThenRetryExceededFlushes) {
  ASSERT_EQ(post(*a, WrOpcode::kSend, 0, 100, 0, 1), kOk);
  ASSERT_EQ(post(*a, WrOpcode::kSend, 0, 100, 0, 2), kOk);
  ta->sent.clear();  // the peer is gone
  const uint64_t rto = a->retransmit_timeout_ns();
  for (int attempt = 0; attempt < 2; ++attempt) {  // retry_cnt = 2
    ta->advance(rto + 1);
    run_requester_timers();
    // After a timeout only the oldest packet goes out, asking for an ACK.
    ASSERT_EQ(ta->sent.size(), 1u) << "attempt " << attempt;
    EXPECT_EQ(parse(ta->sent[0]).hdr.bth.psn, kSqPsn);
    EXPECT_TRUE(parse(ta->sent[0]).hdr.bth.ack_req);
    ta->sent.clear();
  }
  ta->advance(rto + 1);
  run_requester_timers();
  auto c = drain();
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].status, WcStatus::kRetryExcErr);
  EXPECT_EQ(c[0].wr_id, 1u);
  EXPECT_EQ(c[1].status, WcStatus::kWrFlushErr);
  EXPECT_EQ(a->query().state, QpState::kErr);
  EXPECT_EQ(ta->counters_.retry_exceeded_err.load(), 1u);
}

TEST_F(TransportTest, WindowCollapsesOnTimeoutAndGrowsWithAcks) {
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, 8 * kMtu), kOk);
  ta->sent.clear();  // the whole first round is lost
  ta->advance(a->retransmit_timeout_ns() + 1);
  run_requester_timers();
  ASSERT_EQ(ta->sent.size(), 1u);
  EXPECT_EQ(a->req.window.psns(), 1u);
  deliver(*ta, *b, *tb);  // probe arrives and is ACKed
  deliver(*tb, *a, *ta);  // each acknowledged PSN grows the window by one: 2 go out
  EXPECT_EQ(ta->sent.size(), 2u);
  deliver(*ta, *b, *tb);
  deliver(*tb, *a, *ta);  // then 4
  EXPECT_EQ(ta->sent.size(), 4u);
  settle();
  ASSERT_EQ(drain().size(), 1u);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 8 * kMtu), 0);
}

TEST_F(TransportTest, SequenceNakRepeatedWhenRequesterGoesBack) {
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, 4 * kMtu), kOk);
  auto round = ta->sent;
  ta->sent.clear();
  for (int r = 0; r < 2; ++r) {  // the same round twice, first packet lost both times
    for (size_t i = 1; i < round.size(); ++i) ta->sent.push_back(round[i]);
    deliver(*ta, *b, *tb);
    ASSERT_EQ(tb->sent.size(), 1u) << "round " << r;  // one NAK per round
    EXPECT_EQ(parse(tb->sent[0]).hdr.bth.psn, kSqPsn);
    tb->sent.clear();
  }
}

TEST_F(TransportTest, SequenceNakHalvesWindow) {
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, 8 * kMtu), kOk);
  ta->sent.erase(ta->sent.begin());  // lose the first packet
  deliver(*ta, *b, *tb);
  deliver(*tb, *a, *ta);  // NAK: go back, half the window
  EXPECT_EQ(a->req.window.psns(), CongestionWindow::kInitialPsns / 2);
  settle();
  ASSERT_EQ(drain().size(), 1u);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 8 * kMtu), 0);
}

TEST_F(TransportTest, RnrNakBacksOffThenSucceedsWhenReceivePosted) {
  ASSERT_EQ(post(*a, WrOpcode::kSend, 0, 64), kOk);
  deliver(*ta, *b, *tb);
  ASSERT_EQ(tb->sent.size(), 1u);
  EXPECT_EQ(wire::aeth_kind(parse(tb->sent[0]).hdr.aeth.syndrome), wire::AckKind::kRnrNak);
  EXPECT_EQ(a->req.recovery, Recovery::kNone);
  deliver(*tb, *a, *ta);
  EXPECT_TRUE(ta->sent.empty());  // waiting out the RNR timer
  EXPECT_EQ(a->req.recovery, Recovery::kRnrWait);
  post_recv(*b, 64);
  ta->advance(uint64_t{wire::rnr_timer_usec(1)} * 1000 + 1);
  run_requester_timers();
  ASSERT_EQ(ta->sent.size(), 1u);
  EXPECT_EQ(a->req.recovery, Recovery::kGoBackN) << "the RNR retry resends from the NAKed PSN";
  settle();
  auto c = drain();
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[1].status, WcStatus::kSuccess);
  EXPECT_EQ(a->req.recovery, Recovery::kNone) << "acknowledged: recovery over";
}

TEST_F(TransportTest, RnrRetryExhaustedFails) {
  ASSERT_EQ(post(*a, WrOpcode::kSend, 0, 64), kOk);
  for (int i = 0; i < 3; ++i) {  // rnr_retry = 2: the third RNR NAK is fatal
    deliver(*ta, *b, *tb);
    deliver(*tb, *a, *ta);
    ta->advance(1'000'000);
    run_requester_timers();
  }
  auto c = drain();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kRnrRetryExcErr);
}

TEST_F(TransportTest, ReadIsChunkedAndLostResponseIsReRequested) {
  const uint32_t len = 3 * requester::kReadChunkPsns * kMtu + 100;
  ASSERT_EQ(post(*a, WrOpcode::kRdmaRead, 0, len), kOk);
  ASSERT_EQ(ta->sent.size(), 4u);  // 4 chunked READ requests, within max_rd_atomic
  EXPECT_EQ(parse(ta->sent[1]).hdr.bth.psn, wire::psn_add(kSqPsn, requester::kReadChunkPsns));
  deliver(*ta, *b, *tb);
  tb->sent.erase(tb->sent.begin() + 5);  // lose one response
  deliver(*tb, *a, *ta);                 // next one is out of order: re-request from there
  ASSERT_FALSE(ta->sent.empty());
  wire::Packet rr = parse(ta->sent[0]);
  EXPECT_EQ(rr.hdr.bth.psn, wire::psn_add(kSqPsn, 5));
  EXPECT_EQ(rr.hdr.reth.va, reinterpret_cast<uintptr_t>(src.data()) + 5 * kMtu);
  settle();
  auto c = drain();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].opcode, WcOpcode::kRdmaRead);
  EXPECT_EQ(c[0].byte_len, len);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), len), 0);
}

// After a timeout the window is one PSN, and a READ asked for again asks for one response,
// then for more as the window opens (each a duplicate READ for the start of the rest): a
// re-request for the whole chunk drew 7 responses each time, and a periodic loss of one
// packet in 7 dropped the first of them every time, until retry_cnt ran out.
TEST_F(TransportTest, AReadAskedForAgainAsksForNoMoreResponsesThanTheWindowHasRoomFor) {
  const uint32_t len = 7 * kMtu;
  ASSERT_EQ(post(*a, WrOpcode::kRdmaRead, 0, len), kOk);
  ASSERT_EQ(ta->sent.size(), 1u);
  EXPECT_EQ(parse(ta->sent[0]).hdr.reth.dma_length, len);
  deliver(*ta, *b, *tb);
  ASSERT_EQ(tb->sent.size(), 7u);
  tb->sent.clear();  // every response lost
  fire_timers_when_quiet();
  EXPECT_EQ(a->req.window.psns(), 1u);
  ASSERT_EQ(ta->sent.size(), 1u);
  const wire::Packet rr = parse(ta->sent[0]);
  EXPECT_EQ(rr.hdr.bth.psn, kSqPsn);
  EXPECT_EQ(rr.hdr.reth.dma_length, kMtu) << "one response: the window's room";
  // Then each re-request starts where the last one ended and asks for no more than the
  // window it was sent in (it grows as the responses come in).
  uint32_t next = 0, requests = 0;
  for (int i = 0; i < 20 && !ta->sent.empty(); ++i) {
    for (const auto& bytes : ta->sent) {
      const wire::Packet p = parse(bytes);
      EXPECT_EQ(p.hdr.bth.psn, wire::psn_add(kSqPsn, next));
      EXPECT_EQ(p.hdr.reth.va, reinterpret_cast<uintptr_t>(src.data()) + next * kMtu);
      EXPECT_LE(p.hdr.reth.dma_length, a->req.window.psns() * kMtu);
      next += p.hdr.reth.dma_length / kMtu;
      ++requests;
    }
    deliver(*ta, *b, *tb);
    deliver(*tb, *a, *ta);
  }
  EXPECT_EQ(next, 7u);
  EXPECT_GT(requests, 2u) << "the window grew from one PSN: more than one re-request";
  auto c = drain();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].byte_len, len);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), len), 0);
  EXPECT_EQ(tb->counters_.duplicate_dropped.load(), 0u) << "each re-request matched the READ";
}

// A READ whose first request was lost is asked for again in a one-PSN window: that short
// request reaches the responder first and is executed as new. A later go-back with a larger
// window must not ask for more from the same PSN — a duplicate READ longer than the one
// executed matches nothing and is dropped at every retry — but stop where the short one did.
TEST_F(TransportTest, AReadCutShortByTheWindowIsNeverAskedForPastTheCutAgain) {
  const uint32_t len = 7 * kMtu;
  ASSERT_EQ(post(*a, WrOpcode::kRdmaRead, 0, len), kOk);
  ASSERT_EQ(ta->sent.size(), 1u);
  ta->sent.clear();  // the request is lost
  fire_timers_when_quiet();
  ASSERT_EQ(ta->sent.size(), 1u);
  EXPECT_EQ(parse(ta->sent[0]).hdr.reth.dma_length, kMtu) << "one response: the window's room";
  deliver(*ta, *b, *tb);  // executed as a new one-PSN READ
  ASSERT_EQ(tb->sent.size(), 1u);
  tb->sent.clear();  // its response is lost
  {
    // A go-back to the READ's first PSN with room for all of it (what a response arriving
    // out of order does once the window has grown).
    std::lock_guard lk(dev->mutex());
    a->req.window.on_acked(16);
    requester::rewind(*a, kSqPsn);
    requester::run(*a, *ta);
  }
  ASSERT_FALSE(ta->sent.empty());
  const wire::Packet again = parse(ta->sent[0]);
  EXPECT_EQ(again.hdr.bth.psn, kSqPsn);
  EXPECT_EQ(again.hdr.reth.dma_length, kMtu) << "no further than the request executed";
  settle();
  auto c = drain();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(c[0].byte_len, len);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), len), 0);
  EXPECT_EQ(tb->counters_.duplicate_dropped.load(), 0u) << "each re-request matched a READ";
}

TEST_F(TransportTest, DuplicateAtomicIsReplayedNotExecutedTwice) {
  uint64_t& word = *reinterpret_cast<uint64_t*>(dst.data());
  word = 40;
  Sge s{reinterpret_cast<uintptr_t>(src.data()), 8, mr_src->key()};
  SendWr wr;
  wr.opcode = WrOpcode::kFetchAdd;
  wr.flags = kSignaled;
  wr.sg_list = &s;
  wr.num_sge = 1;
  wr.remote_addr = reinterpret_cast<uintptr_t>(dst.data());
  wr.rkey = mr_dst->key();
  wr.compare_add = 2;
  ASSERT_EQ(a->post_send(wr), kOk);
  auto request = ta->sent.front();
  deliver(*ta, *b, *tb);
  tb->sent.clear();             // the atomic ACK is lost
  ta->sent.push_back(request);  // the requester retransmits
  deliver(*ta, *b, *tb);
  EXPECT_EQ(word, 42u);  // executed once
  EXPECT_EQ(tb->counters_.duplicate_request.load(), 1u);
  settle();
  auto c = drain();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].opcode, WcOpcode::kFetchAdd);
  EXPECT_EQ(*reinterpret_cast<uint64_t*>(src.data()), 40u);  // original value returned
}

// RDMA ATOMIC WRITE: one RC_ATOMIC_WRITE packet (RETH + the 8 bytes) stored at the target and
// ACKed; when the ACK is lost the requester resends, and the duplicate is re-ACKed without
// being executed again — a store the target made in between survives it.
TEST_F(TransportTest, AtomicWriteStoresOnceAndItsDuplicateIsOnlyReAcked) {
  uint64_t& word = *reinterpret_cast<uint64_t*>(dst.data() + 64);
  word = 1;
  const uint64_t value = 0x1122334455667788ull;
  std::memcpy(src.data(), &value, 8);
  ASSERT_EQ(post(*a, WrOpcode::kAtomicWrite, 0, 8, 64), kOk);
  ASSERT_EQ(ta->sent.size(), 1u);
  auto request = ta->sent.front();
  wire::Packet p;
  ASSERT_EQ(wire::parse(request, p), wire::ParseError::kOk);
  EXPECT_EQ(p.hdr.bth.opcode, 0x1d);
  EXPECT_EQ(p.hdr.reth.dma_length, 8u);
  EXPECT_EQ(p.payload.size(), 8u);
  EXPECT_TRUE(p.hdr.bth.ack_req);
  deliver(*ta, *b, *tb);
  EXPECT_EQ(word, value);
  EXPECT_EQ(tb->counters_.atomic_write_executed.load(), 1u);
  tb->sent.clear();             // the ACK is lost
  word = 5;                     // the target's CPU stores after the ATOMIC WRITE
  ta->sent.push_back(request);  // the requester retransmits
  deliver(*ta, *b, *tb);
  EXPECT_EQ(word, 5u);  // not executed twice
  EXPECT_EQ(tb->counters_.duplicate_request.load(), 1u);
  EXPECT_EQ(tb->counters_.atomic_write_executed.load(), 1u);
  settle();
  auto c = drain();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(c[0].opcode, WcOpcode::kAtomicWrite);
}

// ATOMIC WRITE holds one of max_rd_atomic's credits (4 here) until its ACK: the fifth waits.
TEST_F(TransportTest, AtomicWritesTakeReadAtomicCredits) {
  for (uint64_t i = 0; i < 5; ++i) ASSERT_EQ(post(*a, WrOpcode::kAtomicWrite, 0, 8, 8 * i, i), kOk);
  EXPECT_EQ(ta->sent.size(), 4u);
  settle();
  auto c = drain();
  ASSERT_EQ(c.size(), 5u);
  for (const Cqe& e : c) EXPECT_EQ(e.status, WcStatus::kSuccess);
}

// A misaligned ATOMIC WRITE is NAKed as an invalid request (rxe: RESPST_ERR_MISALIGNED_ATOMIC).
TEST_F(TransportTest, MisalignedAtomicWriteIsRemoteInvalidRequest) {
  std::memset(dst.data(), 0xee, 64);
  ASSERT_EQ(post(*a, WrOpcode::kAtomicWrite, 0, 8, 4), kOk);
  settle();
  auto c = drain();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kRemInvReqErr);
  for (int i = 0; i < 64; ++i) ASSERT_EQ(dst[size_t(i)], 0xee);
  EXPECT_EQ(post(*a, WrOpcode::kAtomicWrite, 0, 4, 0), std::errc::invalid_argument)
      << "not 8 bytes";
}

// An ATOMIC WRITE whose RETH DMA length is not 8 (a foreign or broken requester) is NAKed as
// an invalid request (rxe's length check) and stores nothing.
TEST_F(TransportTest, AtomicWriteOfOtherThanEightBytesIsRemoteInvalidRequest) {
  std::memset(dst.data(), 0xee, 64);
  ASSERT_EQ(post(*a, WrOpcode::kAtomicWrite, 0, 8, 0), kOk);
  ASSERT_EQ(ta->sent.size(), 1u);
  ta->sent.front()[wire::kBthBytes + 15] = 16;  // RETH DMA length, low byte: 8 → 16
  settle();
  auto c = drain();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kRemInvReqErr);
  for (int i = 0; i < 64; ++i) ASSERT_EQ(dst[size_t(i)], 0xee);
  EXPECT_EQ(tb->counters_.atomic_write_executed.load(), 0u);
}

// A READ "duplicate" the responder never executed — e.g. forged with a PSN behind the
// expected one and an rkey it has no right to — is dropped and counted; it neither NAKs
// nor errors the QP (IBTA 9.7.5.1.3 treats duplicates as retransmissions of requests the
// responder already executed; rxe keeps responder resources for exactly this).
TEST_F(TransportTest, ForgedDuplicateReadIsDroppedAndQpKeepsRunning) {
  post_recv(*b, kMtu);
  ASSERT_EQ(post(*a, WrOpcode::kSend, 0, kMtu), kOk);
  settle();  // responder's expected PSN is now kSqPsn + 1
  ASSERT_EQ(drain().size(), 2u);
  std::mt19937 rng(5);
  for (int i = 0; i < 1000; ++i) {
    wire::Headers h;
    h.bth.opcode = static_cast<uint8_t>(Opcode::kReadRequest);
    h.bth.dest_qpn = b->qpn();
    h.bth.psn = wire::psn_add(kSqPsn, wire::kPsnMask - (rng() % 0x7fffff));  // behind
    h.bth.ack_req = true;
    h.reth.va = rng() % 2 ? reinterpret_cast<uintptr_t>(src.data()) : rng();
    h.reth.rkey = rng() % 2 ? mr_src->key() : static_cast<uint32_t>(rng());
    h.reth.dma_length = rng() % 3 == 0 ? 0x80000000u : static_cast<uint32_t>(rng() % 65536);
    std::vector<uint8_t> bytes(wire::kMaxTransportHeaderBytes);
    bytes.resize(wire::encode_headers(h, bytes));
    bytes.resize(bytes.size() + wire::kIcrcBytes, 0);
    std::lock_guard lk(dev->mutex());
    responder::on_request(*b, parse(bytes), *tb);
    responder::flush_ack(*b, *tb);
  }
  EXPECT_TRUE(tb->sent.empty()) << "a forged duplicate READ drew a response or NAK";
  EXPECT_EQ(tb->counters_.duplicate_dropped.load(), 1000u);
  EXPECT_EQ(b->query().state, QpState::kRts);
  post_recv(*b, kMtu);  // the connection still carries traffic
  ASSERT_EQ(post(*a, WrOpcode::kSend, kMtu, kMtu, 0, 2), kOk);
  settle();
  auto c = drain();
  ASSERT_EQ(c.size(), 2u);
  for (const Cqe& e : c) EXPECT_EQ(e.status, WcStatus::kSuccess);
}

// A genuine duplicate READ — the requester lost a response and asks again from its
// middle — is re-served from the responder's record; one that claims more than the
// original READ covered is not.
TEST_F(TransportTest, DuplicateReadIsReservedOnlyWithinTheExecutedRead) {
  ASSERT_EQ(post(*a, WrOpcode::kRdmaRead, 0, 4 * kMtu), kOk);
  auto request = parse(ta->sent.front());
  deliver(*ta, *b, *tb);
  ASSERT_EQ(tb->sent.size(), 4u);
  tb->sent.clear();  // every response is lost
  auto resend = [&](uint32_t skip_psns, uint32_t len) {
    wire::Headers h = request.hdr;
    h.bth.psn = wire::psn_add(request.hdr.bth.psn, skip_psns);
    h.reth.va += uint64_t{skip_psns} * kMtu;
    h.reth.dma_length = len;
    std::vector<uint8_t> bytes(wire::kMaxTransportHeaderBytes);
    bytes.resize(wire::encode_headers(h, bytes));
    bytes.resize(bytes.size() + wire::kIcrcBytes, 0);
    std::lock_guard lk(dev->mutex());
    responder::on_request(*b, parse(bytes), *tb);
  };
  resend(2, 2 * kMtu);  // the rest of it, from the third response
  ASSERT_EQ(tb->sent.size(), 2u);
  EXPECT_EQ(parse(tb->sent[0]).hdr.bth.psn, wire::psn_add(kSqPsn, 2));
  tb->sent.clear();
  resend(2, 3 * kMtu);  // beyond the original READ's end
  EXPECT_TRUE(tb->sent.empty());
  EXPECT_EQ(tb->counters_.duplicate_dropped.load(), 1u);
  EXPECT_EQ(b->query().state, QpState::kRts);
}

// IBTA 9.7.5.1.2: one sequence NAK per gap. Twenty copies of one out-of-sequence PSN
// draw one NAK, not twenty.
TEST_F(TransportTest, RepeatedOutOfSequencePsnDrawsOneNak) {
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, 4 * kMtu), kOk);
  auto ahead = ta->sent[2];
  ta->sent.clear();
  for (int i = 0; i < 20; ++i) ta->sent.push_back(ahead);
  deliver(*ta, *b, *tb);
  EXPECT_EQ(tb->sent.size(), 1u);
  EXPECT_EQ(tb->counters_.send_nak.load(), 1u);
  EXPECT_EQ(tb->counters_.out_of_seq_request.load(), 20u);
}

TEST_F(TransportTest, WriteWithBadRkeyIsNakedAndLeavesMemoryAlone) {
  std::memset(dst.data(), 0xee, 4096);
  Sge s{reinterpret_cast<uintptr_t>(src.data()), 4096, mr_src->key()};
  SendWr wr;
  wr.opcode = WrOpcode::kRdmaWrite;
  wr.flags = kSignaled;
  wr.sg_list = &s;
  wr.num_sge = 1;
  wr.remote_addr = reinterpret_cast<uintptr_t>(dst.data());
  wr.rkey = mr_dst->key() ^ 0x55;
  ASSERT_EQ(a->post_send(wr), kOk);
  settle();
  auto c = drain();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kRemAccessErr);
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(dst[size_t(i)], 0xee);
  EXPECT_EQ(b->query().state, QpState::kErr);  // IBTA class C: responder QP errors too
}

// Property: under random loss in both directions, with retransmission timers firing,
// every SEND arrives exactly once, in order, with its length and bytes intact.
class LossyTransportTest : public TransportTest, public ::testing::WithParamInterface<int> {};

TEST_P(LossyTransportTest, SendsSurviveRandomLossInBothDirections) {
  std::mt19937 rng(static_cast<unsigned>(GetParam()));
  for (QueuePair* q : {a.get(), b.get()}) q->attr.retry_cnt = q->comp.retry_left = 7;
  constexpr int kMessages = 200;
  constexpr uint32_t kSlot = 8 * kMtu;
  auto len_of = [](int m) { return uint32_t(1 + (m * 2654435761u) % (6 * kMtu)); };
  int posted_recv = 0, posted = 0, received = 0, sent_ok = 0;
  auto post_recvs = [&] {
    while (posted_recv < kMessages && posted_recv - received < 16) {
      Sge s{reinterpret_cast<uintptr_t>(dst.data()) + (posted_recv % 16) * kSlot, kSlot,
            mr_dst->key()};
      ASSERT_EQ(b->post_recv(uint64_t(posted_recv), &s, 1), kOk);
      ++posted_recv;
    }
  };
  for (int round = 0; round < 20000 && received < kMessages; ++round) {
    post_recvs();
    while (posted < kMessages && posted - sent_ok < 8) {
      ASSERT_EQ(
          post(*a, WrOpcode::kSend, (posted % 8) * kSlot, len_of(posted), 0, uint64_t(posted)),
          kOk);
      ++posted;
    }
    deliver_lossy(*ta, *b, *tb, 10, rng);  // 10 % loss each way
    deliver_lossy(*tb, *a, *ta, 10, rng);
    for (const Cqe& c : drain()) {
      ASSERT_EQ(c.status, WcStatus::kSuccess) << "wr " << c.wr_id;
      if (c.opcode == WcOpcode::kRecv) {
        ASSERT_EQ(c.wr_id, uint64_t(received));
        ASSERT_EQ(c.byte_len, len_of(received)) << "message " << received;
        const uint8_t* got = dst.data() + (received % 16) * kSlot;
        ASSERT_EQ(std::memcmp(got, src.data() + (received % 8) * kSlot, c.byte_len), 0)
            << "message " << received;
        ++received;
      } else {
        ASSERT_EQ(c.wr_id, uint64_t(sent_ok));
        ++sent_ok;
      }
    }
    fire_timers_when_quiet();
  }
  EXPECT_EQ(received, kMessages);
}

INSTANTIATE_TEST_SUITE_P(Seeds, LossyTransportTest, ::testing::Range(1, 33));

// The responder's checks name why a request is not executed (rxe check_psn,
// check_op_seq, check_length) and change nothing.
TEST_F(TransportTest, ResponderChecksNameTheirOutcome) {
  std::vector<uint8_t> payload(kMtu);
  auto check = [&](Opcode op, uint32_t psn, size_t len) {
    wire::Headers h;
    h.bth.opcode = static_cast<uint8_t>(op);
    h.bth.dest_qpn = b->qpn();
    h.bth.psn = psn;
    h.bth.pad_count = wire::pad_for(len);
    std::vector<uint8_t> bytes(wire::kMaxTransportHeaderBytes);
    bytes.resize(wire::encode_headers(h, bytes));
    bytes.insert(bytes.end(), payload.begin(), payload.begin() + static_cast<ptrdiff_t>(len));
    bytes.resize(bytes.size() + h.bth.pad_count + wire::kIcrcBytes, 0);
    return responder::check_request(*b, parse(bytes));
  };
  using responder::RequestCheck;
  EXPECT_EQ(check(Opcode::kSendOnly, kSqPsn, 10), RequestCheck::kNew);
  EXPECT_EQ(check(Opcode::kSendOnly, wire::psn_add(kSqPsn, 1), 10), RequestCheck::kOutOfSequence);
  EXPECT_EQ(check(Opcode::kSendOnly, wire::psn_add(kSqPsn, wire::kPsnMask), 10),
            RequestCheck::kDuplicate);
  EXPECT_EQ(check(Opcode::kSendMiddle, kSqPsn, kMtu), RequestCheck::kMissingFirst);
  EXPECT_EQ(check(Opcode::kSendFirst, kSqPsn, kMtu - 4), RequestCheck::kBadLength);
  EXPECT_EQ(check(Opcode::kSendFirst, kSqPsn, kMtu), RequestCheck::kNew);
  EXPECT_STREQ(responder::to_string(RequestCheck::kMissingFirst), "missing first packet");
  EXPECT_EQ(b->resp.epsn, kSqPsn);  // nothing was executed
}

// The window the requester paces with: slow start, then AIMD in PSNs, within 1 … kMaxPsns.
TEST(CongestionWindowTest, SlowStartThenAdditiveIncreaseHalvesOnNakCollapsesOnTimeout) {
  CongestionWindow w;
  EXPECT_EQ(w.psns(), CongestionWindow::kInitialPsns);
  w.on_acked(128);  // slow start: every acknowledged PSN adds one
  EXPECT_EQ(w.psns(), 256u);
  for (int i = 0; i < 20; ++i) w.on_acked(w.psns());
  EXPECT_EQ(w.psns(), CongestionWindow::kMaxPsns);  // never beyond the largest window
  w.on_sequence_nak();
  EXPECT_EQ(w.psns(), CongestionWindow::kMaxPsns / 2);
  EXPECT_EQ(w.threshold(), CongestionWindow::kMaxPsns / 2);
  w.on_acked(w.psns() - 1);  // congestion avoidance: one PSN per window acknowledged
  EXPECT_EQ(w.psns(), CongestionWindow::kMaxPsns / 2);
  w.on_acked(1);
  EXPECT_EQ(w.psns(), CongestionWindow::kMaxPsns / 2 + 1);
  w.on_timeout();
  EXPECT_EQ(w.psns(), 1u);
  w.on_sequence_nak();
  EXPECT_EQ(w.psns(), 1u);  // never below one
  w.on_acked(3);
  EXPECT_EQ(w.psns(), 2u);  // slow start up to the threshold (2 after the halving at 1)
}

TEST_F(TransportTest, ModifyRejectsInvalidTransitionsAndAttributes) {
  QpCap cap{16, 16, 1, 1, 0};
  QueuePair q(*dev, *pd, *cq, *cq, cap, false);
  QpAttr at;
  at.state = QpState::kRtr;  // RESET → RTR is not a valid transition
  EXPECT_EQ(q.modify(at, kAttrState), std::errc::invalid_argument);
  at.state = QpState::kInit;  // missing required PORT / ACCESS_FLAGS
  EXPECT_EQ(q.modify(at, kAttrState | kAttrPkeyIndex), std::errc::invalid_argument);
  at.port_num = 2;  // only port 1 exists
  EXPECT_EQ(q.modify(at, kAttrState | kAttrPkeyIndex | kAttrPort | kAttrAccessFlags),
            std::errc::invalid_argument);
  at.port_num = 1;
  EXPECT_EQ(q.modify(at, kAttrState | kAttrPkeyIndex | kAttrPort | kAttrAccessFlags), kOk);
  at.state = QpState::kRtr;
  at.path_mtu = 6;  // out of range
  at.ah.is_global = true;
  at.ah.dgid = Gid::from_ipv4(dev->ip());
  const uint32_t rtr = kAttrState | kAttrAv | kAttrPathMtu | kAttrDestQpn | kAttrRqPsn |
                       kAttrMaxDestRdAtomic | kAttrMinRnrTimer;
  EXPECT_EQ(q.modify(at, rtr), std::errc::invalid_argument);
  at.path_mtu = 5;
  at.ah.is_global = false;  // RoCE needs a GRH
  EXPECT_EQ(q.modify(at, rtr), std::errc::invalid_argument);
  at.ah.is_global = true;
  EXPECT_EQ(q.modify(at, rtr), kOk);
  EXPECT_EQ(q.query().state, QpState::kRtr);
}

// A loss on a long path whose round trip shows no queue is random: the window is kept (up to
// 1/64 of the window lost per smallest RTT). With a queue, or beyond that share, it halves —
// only down to 1.5 measured bandwidth-delay products: random loss on a long link must not cap
// the window at Mathis's MSS/RTT · 1.22/√p.
TEST(CongestionWindowTest, RandomLossKeepsTheWindowCongestionHalvesItToOneAndAHalfBdps) {
  CongestionWindow w;
  EXPECT_EQ(w.bdp_psns(), 0u);
  w.on_rtt_sample(30'000'000);
  w.on_rtt_sample(20'000'000);  // the smallest round trip counts: 20 ms
  EXPECT_EQ(w.min_rtt_ns(), 20'000'000u);
  uint64_t now = 1'000'000'000;
  for (int i = 0; i < 10; ++i) {  // 30,000 PSNs/s delivered (≈ 1 Gbit/s of 4 KiB)
    now += 20'000'000;
    w.on_delivered(600, now);
  }
  EXPECT_NEAR(double(w.bdp_psns()), 600.0, 2.0);
  for (int i = 0; i < 20; ++i) w.on_acked(w.psns());  // slow start far beyond
  ASSERT_EQ(w.psns(), CongestionWindow::kMaxPsns);
  // The latest round trip is the smallest: no queue, so isolated losses are random.
  EXPECT_FALSE(w.queue_building());
  EXPECT_FALSE(w.on_sequence_nak(now, 1));
  EXPECT_FALSE(w.on_sequence_nak(now + 1'000'000, 100));
  EXPECT_EQ(w.psns(), CongestionWindow::kMaxPsns);
  EXPECT_EQ(w.threshold(), CongestionWindow::kMaxPsns) << "random loss: still in slow start";
  // A burst of more than 1/64 of the window within one smallest RTT is congestion.
  EXPECT_TRUE(w.on_sequence_nak(now + 2'000'000, CongestionWindow::kMaxPsns / 64));
  EXPECT_EQ(w.psns(), CongestionWindow::kMaxPsns / 2);
  // A round trip 25 % over the smallest shows a queue: every loss is congestion now.
  w.on_rtt_sample(25'000'001);
  EXPECT_TRUE(w.queue_building());
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(w.on_sequence_nak(now, 1));  // 2^21 → 2^11
  EXPECT_EQ(w.psns(), 2048u);
  w.on_sequence_nak(now, 1);  // not to 1,024: 1.5 BDPs are 900
  EXPECT_EQ(w.psns(), 1024u);
  w.on_sequence_nak(now, 1);
  EXPECT_EQ(w.psns(), w.bdp_psns() + w.bdp_psns() / 2);
  w.on_sequence_nak(now, 1);
  EXPECT_EQ(w.psns(), w.bdp_psns() + w.bdp_psns() / 2) << "1.5 BDPs stay in flight";
  w.on_timeout();
  EXPECT_EQ(w.psns(), 1u);  // a timeout still starts over
  // A short path (smallest RTT under 1 ms) always takes a loss for congestion.
  CongestionWindow near;
  near.on_rtt_sample(100'000);
  EXPECT_TRUE(near.queue_building());
  EXPECT_TRUE(near.on_sequence_nak(1, 1));
  EXPECT_EQ(near.psns(), CongestionWindow::kInitialPsns / 2);
}

// Congestion avoidance on a long path: +12.5 % of the window per round trip while the round
// trip shows no queue (a slow-start exit a slower sender made early is undone in a few
// round trips), +1 PSN per round trip once it does (RFC 5681); a short path always +1.
TEST(CongestionWindowTest, AvoidanceGrowsAnEighthPerRoundTripWithoutAQueueOnePsnWithOne) {
  CongestionWindow w;
  w.on_rtt_sample(50'000'000);
  for (int i = 0; i < 3; ++i) w.on_acked(w.psns());  // slow start: 128 → 1,024
  ASSERT_EQ(w.psns(), 1024u);
  w.on_rtt_sample(70'000'000);  // a queue: congestion, halve (no BDP measured: no floor)
  ASSERT_TRUE(w.on_sequence_nak(1, 1));
  ASSERT_EQ(w.psns(), 512u);
  w.on_rtt_sample(50'000'000);  // the queue drained
  w.on_acked(512);              // one window: +512/8
  EXPECT_EQ(w.psns(), 576u);
  w.on_acked(576);
  EXPECT_EQ(w.psns(), 648u);
  w.on_rtt_sample(63'000'000);  // 13 ms over the smallest: a queue
  w.on_acked(648);
  EXPECT_EQ(w.psns(), 649u);
  CongestionWindow near;  // 200 µs: RFC 5681's one PSN per window
  near.on_rtt_sample(200'000);
  near.on_acked(128);
  near.on_rtt_sample(400'000);
  ASSERT_TRUE(near.on_sequence_nak(1, 1));
  near.on_rtt_sample(200'000);
  const uint32_t before = near.psns();
  near.on_acked(before);
  EXPECT_EQ(near.psns(), before + 1);
}

// RFC 7661's validation (set_validation): on a long path the window grows only while it
// limits the sender, so a QP its send queue holds below the window keeps the window it last
// used instead of growing 12.5 % per round trip towards a size nothing has tested.
TEST(CongestionWindowTest, ValidatedWindowGrowsOnlyWhileItLimitsTheSender) {
  CongestionWindow w;
  w.set_validation(true);
  w.on_rtt_sample(50'000'000);  // a long path
  w.note_limited();
  w.on_acked(128);  // slow start, the window full: 128 → 256
  ASSERT_EQ(w.psns(), 256u);
  w.on_acked(256);  // limited in the previous round still counts: 256 → 512
  ASSERT_EQ(w.psns(), 512u);
  w.on_acked(512);  // neither this round nor the one before was limited
  EXPECT_EQ(w.psns(), 512u);
  for (int i = 0; i < 10; ++i) w.on_acked(512);
  EXPECT_EQ(w.psns(), 512u) << "a window the sender never fills does not grow";
  w.note_limited();
  w.on_acked(1);
  EXPECT_EQ(w.psns(), 513u) << "limited again: grows again";
  // Off (the default) and on a short path, every ACK grows it as before.
  CongestionWindow bare;
  bare.on_rtt_sample(50'000'000);
  bare.on_acked(128);
  EXPECT_EQ(bare.psns(), 256u);
  CongestionWindow near;
  near.set_validation(true);
  near.on_rtt_sample(200'000);
  near.on_acked(128);
  EXPECT_EQ(near.psns(), 256u);
}

// ---- Selective retransmission (IRN-style; docs/wide-area.md) ---------------------------

// Packets of `t` whose PSN is 0xfffff0 (the tests' first PSN) + one of `lost` are dropped;
// the rest stay queued.
void lose(FakeTransport& t, std::initializer_list<uint32_t> lost) {
  constexpr uint32_t kFirstPsn = 0xfffff0;
  std::deque<std::vector<uint8_t>> kept;
  for (auto& b : t.sent) {
    bool drop = false;
    for (uint32_t l : lost) drop |= parse(b).hdr.bth.psn == wire::psn_add(kFirstPsn, l);
    if (!drop) kept.push_back(std::move(b));
  }
  t.sent = std::move(kept);
}

// The selective NAKs `t` has sent, as ranges of PSNs counted from 0xfffff0 (the tests' first
// PSN): the NAK's PSN and the last missing PSN (carried in the AETH's MSN field).
std::vector<std::pair<uint32_t, uint32_t>> selective_naks(const FakeTransport& t) {
  constexpr uint32_t kFirstPsn = 0xfffff0;
  std::vector<std::pair<uint32_t, uint32_t>> naks;
  for (const auto& bytes : t.sent) {
    wire::Packet p = parse(bytes);
    if (p.hdr.aeth.syndrome == wire::aeth_nak(wire::NakCode::kSelectiveRetransmit))
      naks.emplace_back(uint32_t(wire::psn_diff(p.hdr.bth.psn, kFirstPsn)),
                        uint32_t(wire::psn_diff(p.hdr.aeth.msn, kFirstPsn)));
  }
  return naks;
}

TEST_F(TransportTest, SelectiveNakNamesOnlyTheLostPsnsAndOnlyThoseAreSentAgain) {
  ta->selective = tb->selective = true;
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, 12 * kMtu, 0, 1), kOk);
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 12 * kMtu, 3 * kMtu, 12 * kMtu, 2), kOk);
  for (const auto& b : ta->sent) EXPECT_TRUE(parse(b).hdr.bth.selective);
  lose(*ta, {2, 3, 7, 12});  // 12: the second WRITE's first packet (its RETH)
  deliver(*ta, *b, *tb);
  // Each gap reported once; the second WRITE's middle and last cannot be placed without
  // its RETH, so each of them is reported as it arrives, with the gap before it.
  const std::vector<std::pair<uint32_t, uint32_t>> naks = selective_naks(*tb);
  const std::vector<std::pair<uint32_t, uint32_t>> want{{2, 3}, {7, 7}, {12, 13}, {14, 14}};
  EXPECT_EQ(naks, want);
  EXPECT_EQ(tb->counters_.ooo_placed.load(), 7u);  // 4…6, 8…11
  deliver(*tb, *a, *ta);
  EXPECT_EQ(a->req.recovery, Recovery::kSelective);
  EXPECT_EQ(a->req.recovery_end, wire::psn_add(kSqPsn, 15)) << "ends when all 15 PSNs are ACKed";
  std::vector<uint32_t> resent;
  for (const auto& bytes : ta->sent)
    resent.push_back(uint32_t(wire::psn_diff(parse(bytes).hdr.bth.psn, kSqPsn)));
  EXPECT_EQ(resent, (std::vector<uint32_t>{2, 3, 7, 12, 13, 14}));
  // The ACK of +0…+1 sent before the first NAK grew it by 2 (slow start), then halved once.
  EXPECT_EQ(a->req.window.psns(), (CongestionWindow::kInitialPsns + 2) / 2)
      << "halved once, not thrice";
  settle();
  auto c = drain();
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].wr_id, 1u);  // completions in order
  EXPECT_EQ(c[1].wr_id, 2u);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 15 * kMtu), 0);
  EXPECT_EQ(a->req.recovery, Recovery::kNone);
  EXPECT_EQ(ta->counters_.retransmitted_pkts.load(), 6u);
  EXPECT_EQ(b->resp.epsn, wire::psn_add(kSqPsn, 15));
  EXPECT_FALSE(b->resp.in_write);
}

// A responder that remembers no more WRITEs (ReceivedPsns's max_writes, here 2) does not
// place a later WRITE's FIRST beyond a gap: that WRITE is refused and resent in order, and
// every WRITE completes. Placed without its record, the FIRST was stepped over in order with
// the responder outside the WRITE, its MIDDLE refused as missing its first packet, and the
// QP in error (kv over 100 Gbit/s × 50 ms with 16,384 WRITEs outstanding, 8,192 records).
TEST_F(TransportTest, AWriteTheResponderCannotRememberIsNotPlacedOutOfOrder) {
  ta->selective = tb->selective = true;
  b->resp.ooo = std::make_unique<ReceivedPsns>(ReceivedPsns::kMaxSpanPsns,
                                               ReceivedPsns::kMaxStagedBytes, /*max_writes=*/2);
  b->resp.ooo->next = b->resp.epsn;  // as the responder's own (responder.cpp on_out_of_order)
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, 2 * kMtu, 0, 1), kOk);
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 2 * kMtu, 3 * kMtu, 2 * kMtu, 2), kOk);
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 5 * kMtu, 3 * kMtu, 5 * kMtu, 3), kOk);
  // The first WRITE's LAST: WRITE 1's record (its FIRST came in order) and WRITE 2's fill
  // the two; WRITE 3 arrives beyond the gap with no room for its record.
  lose(*ta, {1});
  deliver(*ta, *b, *tb);
  EXPECT_EQ(tb->counters_.ooo_placed.load(), 3u) << "WRITE 2 (+2…+4), not WRITE 3";
  EXPECT_EQ(b->query().state, QpState::kRts);
  settle();
  auto c = drain();
  ASSERT_EQ(c.size(), 3u);
  for (size_t i = 0; i < c.size(); ++i) {
    EXPECT_EQ(c[i].status, WcStatus::kSuccess) << i;
    EXPECT_EQ(c[i].wr_id, i + 1);
  }
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 8 * kMtu), 0);
  EXPECT_EQ(b->query().state, QpState::kRts);
  EXPECT_EQ(b->resp.epsn, wire::psn_add(kSqPsn, 8));
}

// Selective ACKs (IRN's SACK): a lost first packet holds the oldest unacknowledged PSN for the
// round trips its repair takes; the responder says how many PSNs it holds beyond the gap, and
// the requester counts them out of its flight, so new PSNs go out meanwhile — up to the
// window in flight and kSpanPerWindow windows of span. Every byte still lands, in order of
// completion. Without the count (the same responder, its selective ACKs lost) the span is
// the window, as before.
TEST_F(TransportTest, AGapAtTheHeadHoldsNoWindowWhileTheResponderSaysWhatItHolds) {
  start_selective_after_one_rtt(0);  // PSN +0; the responder now places out of order
  ASSERT_TRUE(drain().size() == 1u);
  const uint32_t first = wire::psn_add(kSqPsn, 1);  // the WRITE's first packet (its RETH)
  const uint32_t head = wire::psn_add(kSqPsn, 2);   // the one lost
  constexpr uint32_t kPsns = 1023;                  // the rest of the 1 MiB buffer
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, kPsns * kMtu, 0, 2), kOk);
  const uint32_t first_flight = uint32_t(ta->sent.size());
  ASSERT_GE(first_flight, CongestionWindow::kInitialPsns);
  for (const auto& bytes : ta->sent) EXPECT_TRUE(parse(bytes).hdr.bth.sack);
  lose(*ta, {2});
  deliver(*ta, *b, *tb);
  EXPECT_EQ(selective_naks(*tb), (std::vector<std::pair<uint32_t, uint32_t>>{{2, 2}}));
  // One selective ACK per AckReq'd packet placed beyond the gap (every kAckEvery and the one
  // that filled the window), each counting what is held by then.
  std::vector<uint32_t> held;
  for (const auto& bytes : tb->sent) {
    const wire::Packet p = parse(bytes);
    if (p.hdr.aeth.syndrome != wire::aeth_nak(wire::NakCode::kSelectiveAck)) continue;
    EXPECT_EQ(p.hdr.bth.psn, head) << "the expected PSN: the lost one";
    held.push_back(p.hdr.aeth.msn);
  }
  ASSERT_FALSE(held.empty());
  EXPECT_EQ(held.back(), first_flight - 2) << "all but the first and the lost one";
  EXPECT_TRUE(std::is_sorted(held.begin(), held.end()));
  EXPECT_EQ(tb->counters_.selective_ack_sent.load(), held.size());
  deliver(*tb, *a, *ta);
  EXPECT_EQ(ta->counters_.selective_ack_rcvd.load(), held.size());
  // The NAK halved the window (a short path: a loss is congestion); the responder holds all
  // but the lost PSN, so the new window's worth, less the one resent, goes out now.
  const uint32_t window = a->req.window.psns();
  EXPECT_LT(window, first_flight);
  uint32_t resent = 0, fresh = 0;
  for (const auto& bytes : ta->sent) {
    const int32_t off = wire::psn_diff(parse(bytes).hdr.bth.psn, first);
    if (off == 1) ++resent;
    if (off >= int32_t(first_flight)) ++fresh;
  }
  EXPECT_EQ(resent, 1u);
  EXPECT_EQ(fresh, window - 1) << "in flight: the resend and these";
  EXPECT_EQ(a->comp.psn, head) << "the gap is not repaired yet";
  EXPECT_LE(uint32_t(wire::psn_diff(a->req.psn, a->comp.psn)), requester::kSpanPerWindow * window);
  settle();
  auto c = drain();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), kPsns * kMtu), 0);
  EXPECT_EQ(ta->counters_.retransmitted_pkts.load(), 1u) << "only the lost PSN went twice";
  EXPECT_EQ(a->comp.psn, wire::psn_add(first, kPsns));
}

// The same loss with every selective ACK lost: the window is the span again, so nothing new
// goes out until the gap is repaired.
TEST_F(TransportTest, WithoutSelectiveAcksTheWindowIsTheSpanFromTheOldestUnackedPsn) {
  start_selective_after_one_rtt(0);
  ASSERT_TRUE(drain().size() == 1u);
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, 1023 * kMtu, 0, 2), kOk);
  lose(*ta, {2});
  deliver(*ta, *b, *tb);
  std::deque<std::vector<uint8_t>> kept;
  for (auto& bytes : tb->sent)
    if (parse(bytes).hdr.aeth.syndrome != wire::aeth_nak(wire::NakCode::kSelectiveAck))
      kept.push_back(std::move(bytes));
  tb->sent = std::move(kept);
  deliver(*tb, *a, *ta);
  // Besides the resend, only what the ACK of +0…+1 (sent before the NAK) opened: two PSNs.
  uint32_t resent = 0, fresh = 0;
  for (const auto& bytes : ta->sent) {
    const int32_t off = wire::psn_diff(parse(bytes).hdr.bth.psn, kSqPsn);
    resent += off == 2;
    fresh += off != 2;
  }
  EXPECT_EQ(resent, 1u);
  EXPECT_LE(fresh, 2u);
  EXPECT_EQ(ta->counters_.selective_ack_rcvd.load(), 0u);
  EXPECT_EQ(a->comp.psn, wire::psn_add(kSqPsn, 2));
  settle();
  EXPECT_EQ(drain().size(), 1u);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 1023 * kMtu), 0);
}

// Selective ACKs that cannot be genuine change nothing: one naming a PSN never sent is
// stale (as any response), one holding more PSNs than were sent beyond its expected PSN is
// malformed, and so is one sent to a requester that never asked.
TEST_F(TransportTest, ASelectiveAckNamingPsnsNeverSentIsMalformed) {
  ta->selective = tb->selective = true;
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, 4 * kMtu, 0, 1), kOk);
  ta->sent.clear();  // all four lost: a is waiting for its first ACK
  ASSERT_EQ(a->req.max_psn, wire::psn_add(kSqPsn, 4));
  const auto forge = [&](uint32_t epsn, uint32_t held_psns) {
    wire::Headers h;
    h.bth.opcode = static_cast<uint8_t>(wire::Opcode::kAcknowledge);  // RC
    h.bth.dest_qpn = a->qpn();
    h.bth.psn = epsn;
    h.aeth.syndrome = wire::aeth_nak(wire::NakCode::kSelectiveAck);
    h.aeth.msn = held_psns;
    tb->transmit(h, dev->ip(), {}, 0);
    deliver(*tb, *a, *ta);
  };
  forge(wire::psn_add(kSqPsn, 5), 0);  // beyond the highest PSN sent: stale, as any response
  EXPECT_EQ(ta->counters_.rcvd_stale_response.load(), 1u);
  forge(kSqPsn, 4);  // four held beyond +0: only +1…+3 were sent
  EXPECT_EQ(ta->counters_.rcvd_malformed.load(), 1u);
  EXPECT_EQ(ta->counters_.selective_ack_rcvd.load(), 0u);
  EXPECT_EQ(a->comp.sack_epsn, kNoPsn);
  forge(kSqPsn, 3);  // possible: taken, but only for the window
  EXPECT_EQ(ta->counters_.selective_ack_rcvd.load(), 1u);
  EXPECT_EQ(a->comp.psn, kSqPsn) << "a selective ACK acknowledges nothing";
  EXPECT_TRUE(drain().empty());
  ta->selective = false;  // a requester that never asked
  forge(kSqPsn, 3);
  EXPECT_EQ(ta->counters_.rcvd_malformed.load(), 2u);
}

// A paused path (a full same-host ring's backlog): the requester queues nothing more, asks
// to be run again, and when run again continues where it stopped — nothing lost, nothing
// sent twice, no window cut.
TEST_F(TransportTest, RequesterHoldsBackWhileThePathIsBusyAndResumesWhereItStopped) {
  ta->busy_after = 3;
  const uint32_t window = a->req.window.psns();
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, 10 * kMtu, 0, 1), kOk);
  ASSERT_EQ(ta->sent.size(), 3u);
  ASSERT_EQ(ta->path_waiters.size(), 1u);
  EXPECT_EQ(ta->path_waiters[0], a.get());
  deliver(*ta, *b, *tb);  // the path drains
  ta->busy_after = SIZE_MAX;
  ta->path_waiters.clear();
  {
    std::lock_guard lk(dev->mutex());
    requester::run(*a, *ta);
  }
  EXPECT_EQ(ta->sent.size(), 7u);
  EXPECT_TRUE(ta->path_waiters.empty());
  settle();
  auto c = drain();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 10 * kMtu), 0);
  EXPECT_EQ(ta->counters_.retransmitted_pkts.load(), 0u);
  EXPECT_GE(a->req.window.psns(), window);
}

// The responder paces READ responses by the path too: on a paused path it stops between
// bursts and owes the rest (nothing dropped, nothing copied aside), an ACK for a later request
// waits behind them (responses leave in PSN order, IBTA 9.7.5.1), and when run again it
// sends the rest in order.
TEST_F(TransportTest, ResponderPausesReadResponsesWhileThePathIsBusyAndKeepsPsnOrder) {
  // Three READ requests (the requester asks kReadChunkPsns packets at a time), then a WRITE.
  constexpr uint32_t kPackets = 3 * requester::kReadChunkPsns;
  ASSERT_EQ(post(*a, WrOpcode::kRdmaRead, 0, kPackets * kMtu, 0, 1), kOk);
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, kMtu, 512 * 1024, 2), kOk);
  tb->busy_after = 1;  // busy once anything is out
  deliver(*ta, *b, *tb);
  // The first READ's responses went; the path then paused: the other two READs and the
  // WRITE's ACK are owed, in that order.
  ASSERT_EQ(tb->sent.size(), size_t{requester::kReadChunkPsns});
  ASSERT_EQ(tb->path_waiters.size(), 1u);
  EXPECT_EQ(tb->path_waiters[0], b.get());
  ASSERT_EQ(b->resp.pending.size(), 3u);
  EXPECT_TRUE(b->resp.pending[0].read);
  EXPECT_TRUE(b->resp.pending[1].read);
  EXPECT_FALSE(b->resp.pending[2].read);
  tb->busy_after = SIZE_MAX;
  tb->path_waiters.clear();
  {
    std::lock_guard lk(dev->mutex());
    responder::resume(*b, *tb);
  }
  EXPECT_TRUE(b->resp.pending.empty());
  EXPECT_TRUE(tb->path_waiters.empty());
  ASSERT_EQ(tb->sent.size(), kPackets + 1u);
  for (size_t i = 0; i < kPackets; ++i) {
    const wire::Packet p = parse(tb->sent[i]);
    ASSERT_EQ(p.hdr.bth.psn, wire::psn_add(kSqPsn, static_cast<uint32_t>(i))) << i;
    ASSERT_TRUE(p.info->mask & wire::kIsRead) << i;
  }
  const wire::Packet ack = parse(tb->sent.back());
  EXPECT_EQ(wire::operation_of(ack.hdr.bth.opcode), wire::Opcode::kAcknowledge);
  EXPECT_EQ(ack.hdr.bth.psn, wire::psn_add(kSqPsn, kPackets));
  settle();
  auto c = drain();
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(c[0].opcode, WcOpcode::kRdmaRead);
  EXPECT_EQ(c[1].status, WcStatus::kSuccess);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), kPackets * kMtu), 0);
  EXPECT_EQ(ta->counters_.retransmitted_pkts.load(), 0u);
}

// READ responses a QP still owes are dropped when it fails, and a deregistered MR found
// when sending resumes NAKs (remote access error) instead of reading freed memory.
TEST_F(TransportTest, OwedReadResponsesEndWithTheQpOrItsMemory) {
  ASSERT_EQ(post(*a, WrOpcode::kRdmaRead, 0, 3 * requester::kReadChunkPsns * kMtu, 0, 1), kOk);
  tb->busy_after = 1;
  deliver(*ta, *b, *tb);
  ASSERT_FALSE(b->resp.pending.empty());
  tb->sent.clear();
  tb->busy_after = SIZE_MAX;
  mr_src.reset();  // the READ's memory is deregistered while its responses are owed
  {
    std::lock_guard lk(dev->mutex());
    responder::resume(*b, *tb);
  }
  EXPECT_TRUE(b->resp.pending.empty());
  ASSERT_EQ(tb->sent.size(), 1u);
  const wire::Packet nak = parse(tb->sent[0]);
  EXPECT_EQ(wire::operation_of(nak.hdr.bth.opcode), wire::Opcode::kAcknowledge);
  EXPECT_EQ(wire::aeth_kind(nak.hdr.aeth.syndrome), wire::AckKind::kNak);
  EXPECT_EQ(b->attr.state, QpState::kErr);
}

// A resend lost as well is sent again ~1.5 smoothed RTTs after it left — well before the
// retransmit timeout — and the window is not collapsed to one PSN (issue 9: at 1 % loss
// every lost resend used to wait for the 134 ms timer and restart from one PSN).
TEST_F(TransportTest, ALostResendIsSentAgainAfterOneAndAHalfRttsWithoutATimeout) {
  constexpr uint64_t kRtt = 10'000'000;  // 10 ms
  start_selective_after_one_rtt(kRtt);   // a first message measures the round trip
  ASSERT_EQ(a->req.window.srtt_ns(), kRtt);
  ASSERT_EQ(completer::resend_check_ns(*a), kRtt * 3 / 2);
  // Then 8 packets; +3 (PSNs counted from kSqPsn) is lost, and so is its first resend.
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, kMtu, 8 * kMtu, kMtu, 2), kOk);
  lose(*ta, {3});
  deliver(*ta, *b, *tb);
  deliver(*tb, *a, *ta);  // the selective NAK: +3 is resent at once...
  ASSERT_EQ(ta->sent.size(), 1u);
  EXPECT_EQ(parse(ta->sent[0]).hdr.bth.psn, wire::psn_add(kSqPsn, 3));
  ta->sent.clear();  // ...and lost
  const uint32_t window = a->req.window.psns();
  // Not before 1.5 RTT...
  ta->advance(kRtt * 3 / 2 - 1000);
  run_requester_timers();
  EXPECT_TRUE(ta->sent.empty());
  // ...but then, long before the retransmit timeout (67 ms at timeout 14).
  ASSERT_LT(kRtt * 3 / 2, a->retransmit_timeout_ns());
  ta->advance(2000);
  ASSERT_NE(a->next_deadline(), 0u);
  ASSERT_LE(a->next_deadline(), ta->now_ns());
  run_requester_timers();
  ASSERT_EQ(ta->sent.size(), 1u);
  EXPECT_EQ(parse(ta->sent[0]).hdr.bth.psn, wire::psn_add(kSqPsn, 3));
  EXPECT_EQ(ta->counters_.resend_again_pkts.load(), 1u);
  EXPECT_EQ(ta->counters_.retransmit_timeouts.load(), 0u);
  EXPECT_EQ(a->req.window.psns(), window) << "the window is not collapsed";
  settle();
  auto c = drain();
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[1].wr_id, 2u);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 9 * kMtu), 0);
  EXPECT_EQ(ta->counters_.retransmitted_pkts.load(), 2u);  // the loss and the lost resend
  EXPECT_TRUE(a->comp.resent.empty());
}

// A resend lost behind an earlier hole: +3 and +10 are lost, both resent for the selective
// NAKs, and both resends are lost too. The resend check sends +3 again; once it arrives the
// ACK moves to +10, whose resend is then 2.5 RTTs old and plainly lost: +10 goes again at
// once. Timed from when it became the oldest it waited 1.5 RTTs more (100 Gbit/s x 50 ms at
// 0.1 % loss: stalls of 1-2 round trips while every WRITE behind it waited).
TEST_F(TransportTest, AResentHeadIsTimedFromItsResendNotFromWhenItBecameTheOldest) {
  constexpr uint64_t kRtt = 10'000'000;  // 10 ms
  start_selective_after_one_rtt(kRtt);
  write_lose_and_answer(16, {3, 10});  // the selective NAKs: +3 and +10 resent...
  ASSERT_EQ(ta->sent.size(), 2u);
  EXPECT_EQ(parse(ta->sent[1]).hdr.bth.psn, wire::psn_add(kSqPsn, 10));
  ta->sent.clear();  // ...and both lost
  ta->advance(kRtt * 3 / 2 + 1000);
  run_requester_timers();  // the resend check: +3 again (the oldest)
  ASSERT_EQ(ta->sent.size(), 1u);
  EXPECT_EQ(parse(ta->sent[0]).hdr.bth.psn, wire::psn_add(kSqPsn, 3));
  ta->advance(kRtt);
  deliver(*ta, *b, *tb);
  deliver(*tb, *a, *ta);  // its ACK moves to +10, resent 2.5 RTTs ago
  EXPECT_EQ(a->comp.psn, wire::psn_add(kSqPsn, 10));
  ASSERT_NE(a->comp.resend_check_ns, 0u);
  EXPECT_LE(a->comp.resend_check_ns, ta->now_ns() + 1) << "due now, not in 0.5 or 1.5 RTTs";
  ta->advance(1);
  run_requester_timers();
  ASSERT_EQ(ta->sent.size(), 1u);
  EXPECT_EQ(parse(ta->sent[0]).hdr.bth.psn, wire::psn_add(kSqPsn, 10));
  EXPECT_EQ(ta->counters_.resend_again_pkts.load(), 2u);
  settle();
  expect_completed({1, 2});
  EXPECT_EQ(ta->counters_.retransmit_timeouts.load(), 0u);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 17 * kMtu), 0);
}

// A lost resend proven by a selective ACK: +3 is lost and its resend too. A second WRITE
// leaves after that resend; when it arrives, the responder's selective ACK still expects +3
// but holds more PSNs beyond it (+4 ... +16 and the new ones) than were sent before the
// resend — one sent after it arrived, and the path keeps order: +3 goes again at once, a
// round trip after its resend instead of the resend check's 1.5.
TEST_F(TransportTest, ASelectiveAckHoldingPsnsSentAfterAResendProvesItLost) {
  constexpr uint64_t kRtt = 10'000'000;  // 10 ms
  start_selective_after_one_rtt(kRtt);
  write_lose_and_answer(16, {3});  // the selective NAK: +3 resent...
  ASSERT_EQ(ta->sent.size(), 1u);
  ta->sent.clear();  // ...and lost
  ASSERT_EQ(a->comp.psn, wire::psn_add(kSqPsn, 3));
  ta->advance(kRtt / 2);
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 17 * kMtu, 4 * kMtu, 17 * kMtu, 3), kOk);
  ASSERT_EQ(ta->sent.size(), 4u);  // +17 ... +20, after the resend
  deliver(*ta, *b, *tb);
  ta->advance(kRtt / 2);
  const uint64_t sacks = ta->counters_.selective_ack_rcvd.load();
  deliver(*tb, *a, *ta);  // the selective ACK of +20: expects +3, holds 17
  EXPECT_EQ(ta->counters_.selective_ack_rcvd.load(), sacks + 1);
  ASSERT_EQ(ta->sent.size(), 1u) << "+3 again, without waiting for the resend check";
  EXPECT_EQ(parse(ta->sent[0]).hdr.bth.psn, wire::psn_add(kSqPsn, 3));
  EXPECT_EQ(ta->counters_.resend_again_pkts.load(), 1u);
  deliver(*tb, *a, *ta);  // nothing more: a second selective ACK would not resend it again
  settle();
  expect_completed({1, 2, 3});
  EXPECT_EQ(ta->counters_.resend_again_pkts.load(), 1u);
  EXPECT_EQ(ta->counters_.retransmit_timeouts.load(), 0u);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 21 * kMtu), 0);
}

// The same selective ACK when the resend was not lost but is still on its way: the
// responder holds only PSNs sent before the resend, which proves nothing, and nothing is
// sent again.
TEST_F(TransportTest, ASelectiveAckHoldingOnlyPsnsSentBeforeAResendProvesNothing) {
  constexpr uint64_t kRtt = 10'000'000;  // 10 ms
  start_selective_after_one_rtt(kRtt);
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, kMtu, 16 * kMtu, kMtu, 2), kOk);
  lose(*ta, {3});
  // Deliver up to +8 only: the selective NAK of +3 comes back while +9 ... +16 are on the way.
  std::deque<std::vector<uint8_t>> later(ta->sent.begin() + 5, ta->sent.end());
  ta->sent.erase(ta->sent.begin() + 5, ta->sent.end());
  deliver(*ta, *b, *tb);
  deliver(*tb, *a, *ta);  // +3 resent
  ASSERT_EQ(ta->sent.size(), 1u);
  std::deque<std::vector<uint8_t>> resend(ta->sent.begin(), ta->sent.end());
  ta->sent = later;  // +9 ... +16 arrive first (sent before the resend); its SACK holds 13
  deliver(*ta, *b, *tb);
  deliver(*tb, *a, *ta);
  EXPECT_GE(ta->counters_.selective_ack_rcvd.load(), 1u);
  EXPECT_TRUE(ta->sent.empty()) << "nothing proves the resend lost";
  EXPECT_EQ(ta->counters_.resend_again_pkts.load(), 0u);
  ta->sent = resend;
  settle();
  expect_completed({1, 2});
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 17 * kMtu), 0);
}

// The selective NAK of a gap behind the oldest one is lost: +3 and +10 are lost, and of the
// two selective NAKs only +3's arrives. The selective ACK of the WRITE's last packet lists the
// runs still missing below the highest PSN received, +3 and +10 (wire::SackReport): +10 was
// never resent, so its NAK was lost, and it goes at once — not when +3's repair makes it the
// oldest PSN, a round trip later, and then only after the resend check's 1.5 RTTs.
TEST_F(TransportTest, ASelectiveAckListingARunWhoseNakWasLostHasItResentAtOnce) {
  constexpr uint64_t kRtt = 10'000'000;  // 10 ms
  start_selective_after_one_rtt(kRtt);
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, kMtu, 16 * kMtu, kMtu, 2), kOk);
  for (const auto& p : ta->sent) EXPECT_TRUE(parse(p).hdr.bth.sack_ranges);
  lose(*ta, {3, 10});
  deliver(*ta, *b, *tb);
  // Drop the selective NAK of +10; keep the one of +3 and the selective ACK after them.
  size_t sacks = 0;
  std::deque<std::vector<uint8_t>> kept;
  for (auto& bytes : tb->sent) {
    const wire::Packet p = parse(bytes);
    if (p.hdr.aeth.syndrome == wire::aeth_nak(wire::NakCode::kSelectiveRetransmit) &&
        p.hdr.bth.psn == wire::psn_add(kSqPsn, 10))
      continue;
    if (p.hdr.aeth.syndrome == wire::aeth_nak(wire::NakCode::kSelectiveAck)) {
      ++sacks;
      wire::SackReport r;
      ASSERT_TRUE(wire::decode_sack_report(p.payload, r));
      EXPECT_EQ(r.highest, wire::psn_add(kSqPsn, 16));
      ASSERT_EQ(r.count, 2u);
      EXPECT_EQ(r.ranges[0].first, wire::psn_add(kSqPsn, 3));
      EXPECT_EQ(r.ranges[0].last, wire::psn_add(kSqPsn, 3));
      EXPECT_EQ(r.ranges[1].first, wire::psn_add(kSqPsn, 10));
      EXPECT_EQ(r.ranges[1].last, wire::psn_add(kSqPsn, 10));
    }
    kept.push_back(std::move(bytes));
  }
  ASSERT_EQ(sacks, 1u) << "the message's last packet asks for an ACK";
  tb->sent = std::move(kept);
  ta->advance(kRtt);
  deliver(*tb, *a, *ta);
  ASSERT_EQ(ta->sent.size(), 2u) << "+3 for its NAK, +10 for the selective ACK's list";
  EXPECT_EQ(parse(ta->sent[0]).hdr.bth.psn, wire::psn_add(kSqPsn, 3));
  EXPECT_EQ(parse(ta->sent[1]).hdr.bth.psn, wire::psn_add(kSqPsn, 10));
  EXPECT_EQ(ta->counters_.selective_runs_repaired.load(), 1u);
  settle();
  expect_completed({1, 2});
  EXPECT_EQ(ta->counters_.retransmitted_pkts.load(), 2u) << "each lost PSN once";
  EXPECT_EQ(ta->counters_.retransmit_timeouts.load(), 0u);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 17 * kMtu), 0);
}

// SENDs and a WRITE with immediate beyond a gap: WRITE +1 ... +8, SEND +9 ... +12, WRITE with
// immediate +13 ... +20; +3 is lost. The responder keeps the SEND packets and the WRITE's
// last packet (staged: their receive WQEs are taken in order) and places the rest, so the
// selective NAK names +3 alone and nothing else is resent; when +3's resend arrives, the
// staged packets execute in PSN order: the SEND fills the first receive WQE, the WRITE's
// immediate completes the second.
TEST_F(TransportTest, ASendBeyondAGapIsKeptAndExecutedInOrderWithoutAResend) {
  constexpr uint64_t kRtt = 10'000'000;  // 10 ms
  start_selective_after_one_rtt(kRtt);
  post_recv(*b, 4 * kMtu, 7);
  post_recv(*b, 4 * kMtu, 8);
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, kMtu, 8 * kMtu, 16 * kMtu, 2), kOk);
  ASSERT_EQ(post(*a, WrOpcode::kSend, 9 * kMtu, 4 * kMtu, 0, 3), kOk);
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWriteImm, 13 * kMtu, 8 * kMtu, 24 * kMtu, 4), kOk);
  lose(*ta, {3});
  deliver(*ta, *b, *tb);
  EXPECT_EQ(tb->counters_.ooo_staged.load(), 5u);   // +9 ... +12, +20
  EXPECT_EQ(tb->counters_.ooo_placed.load(), 12u);  // +4 ... +8, +13 ... +19
  EXPECT_EQ(tb->counters_.ooo_refused.load(), 0u);
  EXPECT_EQ(selective_naks(*tb), (std::vector<std::pair<uint32_t, uint32_t>>{{3, 3}}));
  ta->advance(kRtt);
  deliver(*tb, *a, *ta);
  ASSERT_EQ(ta->sent.size(), 1u);
  EXPECT_EQ(parse(ta->sent[0]).hdr.bth.psn, wire::psn_add(kSqPsn, 3));
  settle();
  std::vector<uint64_t> sends, recvs;
  for (const Cqe& c : drain()) {
    EXPECT_EQ(c.status, WcStatus::kSuccess) << "wr " << c.wr_id;
    if (c.opcode == WcOpcode::kRecv || c.opcode == WcOpcode::kRecvRdmaWithImm) {
      recvs.push_back(c.wr_id);
      EXPECT_EQ(c.byte_len, c.wr_id == 7 ? 4 * kMtu : 8 * kMtu) << "wr " << c.wr_id;
    } else {
      sends.push_back(c.wr_id);
    }
  }
  EXPECT_EQ(recvs, (std::vector<uint64_t>{7, 8}));
  EXPECT_EQ(sends, (std::vector<uint64_t>{1, 2, 3, 4}));
  EXPECT_EQ(ta->counters_.retransmitted_pkts.load(), 1u) << "+3 alone";
  EXPECT_EQ(std::memcmp(dst.data(), src.data() + 9 * kMtu, 4 * kMtu), 0);
  EXPECT_EQ(std::memcmp(dst.data() + 16 * kMtu, src.data() + kMtu, 8 * kMtu), 0);
  EXPECT_EQ(std::memcmp(dst.data() + 24 * kMtu, src.data() + 13 * kMtu, 8 * kMtu), 0);
  EXPECT_EQ(tb->counters_.send_rnr_err.load(), 0u);
}

// A staged SEND that finds no receive WQE when its turn comes draws an RNR NAK as it would
// in order, and its PSN is missing again: the requester sends it again after the RNR timer,
// and once a receive is posted everything completes.
TEST_F(TransportTest, AStagedSendWithoutAReceiveWqeDrawsAnRnrNakAtItsTurn) {
  constexpr uint64_t kRtt = 10'000'000;  // 10 ms
  start_selective_after_one_rtt(kRtt);
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, kMtu, 4 * kMtu, 16 * kMtu, 2), kOk);
  ASSERT_EQ(post(*a, WrOpcode::kSend, 5 * kMtu, kMtu, 0, 3), kOk);
  lose(*ta, {2});
  deliver(*ta, *b, *tb);
  EXPECT_EQ(tb->counters_.ooo_staged.load(), 1u);
  ta->advance(kRtt);
  deliver(*tb, *a, *ta);  // the selective NAK: +2 resent
  deliver(*ta, *b, *tb);  // +2 arrives: +3 ... +4 stepped over, the SEND at +5 has no WQE
  EXPECT_EQ(tb->counters_.send_rnr_err.load(), 1u);
  EXPECT_FALSE(b->resp.ooo->staged(wire::psn_add(kSqPsn, 5)));
  EXPECT_EQ(b->resp.epsn, wire::psn_add(kSqPsn, 5));
  post_recv(*b, kMtu, 7);
  for (int i = 0; i < 8 && a->sq_base != a->sq_end(); ++i) {
    settle();
    ta->advance(kRtt);
    run_requester_timers();
  }
  settle();
  std::vector<uint64_t> ids;
  for (const Cqe& c : drain()) {
    EXPECT_EQ(c.status, WcStatus::kSuccess) << "wr " << c.wr_id;
    ids.push_back(c.wr_id);
  }
  EXPECT_EQ(ids, (std::vector<uint64_t>{1, 2, 7, 3}));
  EXPECT_EQ(std::memcmp(dst.data(), src.data() + 5 * kMtu, kMtu), 0);
  EXPECT_EQ(b->attr.state, QpState::kRts);
}

// A SEND run behind a gap whose packets were lost: WRITE +1 ... +8, SEND +9 ... +12, WRITE
// +13 ... +20; +3 and +9 ... +12 are lost, and so is every selective NAK. The selective ACK of
// +20 lists +3 and +9 ... +12: the SEND run was never resent, so its NAKs were lost, and it goes
// at once, as they would have had it. Those resends are lost too; the selective ACK of a WRITE
// sent after them lists the run again below a PSN sent after its resend, so the resend was
// lost (RACK's rule) and the run goes once more — a SEND run is kept behind a gap now, as a
// WRITE's is. The second resends reach the responder behind the open gap at +3 and are kept
// there (staged), so the next selective ACK lists +3 alone; +3 goes with the resend check
// after 1.5 RTTs, and everything completes without a retransmit timeout.
TEST_F(TransportTest, ASendRunWhoseNakAndResendWereLostIsResentFromTheListAndKeptBehindTheGap) {
  constexpr uint64_t kRtt = 10'000'000;  // 10 ms
  start_selective_after_one_rtt(kRtt);
  post_recv(*b, 4 * kMtu);
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, kMtu, 8 * kMtu, 16 * kMtu, 2), kOk);
  ASSERT_EQ(post(*a, WrOpcode::kSend, 9 * kMtu, 4 * kMtu, 0, 3), kOk);
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 13 * kMtu, 8 * kMtu, 24 * kMtu, 4), kOk);
  lose(*ta, {3, 9, 10, 11, 12});
  deliver(*ta, *b, *tb);
  std::deque<std::vector<uint8_t>> kept;
  for (auto& bytes : tb->sent)
    if (parse(bytes).hdr.aeth.syndrome != wire::aeth_nak(wire::NakCode::kSelectiveRetransmit))
      kept.push_back(std::move(bytes));
  tb->sent = std::move(kept);
  ta->advance(kRtt);
  deliver(*tb, *a, *ta);
  ASSERT_EQ(ta->sent.size(), 4u) << "the SEND run, for the list";
  for (uint32_t i = 0; i < 4; ++i)
    EXPECT_EQ(parse(ta->sent[i]).hdr.bth.psn, wire::psn_add(kSqPsn, 9 + i));
  EXPECT_EQ(ta->counters_.selective_runs_repaired.load(), 1u);
  ta->sent.clear();  // the SEND run's resends are lost
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 21 * kMtu, 2 * kMtu, 32 * kMtu, 5), kOk);
  deliver(*ta, *b, *tb);  // +21 and +22: the selective ACK of +22 lists +3 and +9 ... +12
  ta->advance(kRtt / 4);
  deliver(*tb, *a, *ta);
  ASSERT_EQ(ta->sent.size(), 4u) << "the SEND run again: its resend was lost";
  EXPECT_EQ(parse(ta->sent[0]).hdr.bth.psn, wire::psn_add(kSqPsn, 9));
  EXPECT_EQ(ta->counters_.selective_runs_repaired.load(), 2u);
  deliver(*ta, *b, *tb);  // the SEND resends, behind the gap at +3
  EXPECT_EQ(tb->counters_.ooo_staged.load(), 4u);
  ta->sent.clear();
  ta->advance(kRtt / 4);
  deliver(*tb, *a, *ta);
  EXPECT_TRUE(ta->sent.empty()) << "+3 alone is missing; it waits for the resend check";
  ta->advance(kRtt * 3 / 2);
  run_requester_timers();  // the resend check: +3
  settle();
  for (int i = 0;
       i < 4 && ta->counters_.retransmit_timeouts.load() == 0 && a->sq_base != a->sq_end(); ++i) {
    ta->advance(kRtt * 3 / 2);
    run_requester_timers();
    settle();
  }
  std::vector<uint64_t> sends;
  bool received = false;
  for (const Cqe& c : drain()) {
    EXPECT_EQ(c.status, WcStatus::kSuccess) << "wr " << c.wr_id;
    if (c.opcode == WcOpcode::kRecv)
      received = true;
    else
      sends.push_back(c.wr_id);
  }
  EXPECT_TRUE(received);
  EXPECT_EQ(sends, (std::vector<uint64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(ta->counters_.retransmit_timeouts.load(), 0u);
  EXPECT_EQ(ta->counters_.retransmitted_pkts.load(), 9u);
  EXPECT_EQ(std::memcmp(dst.data(), src.data() + 9 * kMtu, 4 * kMtu), 0);
}

// Resends lost around the oldest gap: +3 and +10 are lost, resent for their selective NAKs,
// and both resends are lost too. A second WRITE leaves after the resends; the selective ACK of
// its last packet still lists +3 and +10 missing below a PSN sent after their resends, and the
// path keeps order: both go again at once — +3 as the oldest (resend_if_sack_proves_lost), +10
// for the list (RACK's rule on the listed run), where before it waited to become the oldest.
TEST_F(TransportTest, ASelectiveAckListingARunResentBeforeItsHighestPsnProvesTheResendLost) {
  constexpr uint64_t kRtt = 10'000'000;  // 10 ms
  start_selective_after_one_rtt(kRtt);
  write_lose_and_answer(16, {3, 10});  // the selective NAKs: +3 and +10 resent
  ASSERT_EQ(ta->sent.size(), 2u);
  EXPECT_EQ(ta->counters_.selective_runs_repaired.load(), 0u) << "both NAKs arrived";
  ta->sent.clear();  // both resends lost
  ta->advance(kRtt / 2);
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 17 * kMtu, 4 * kMtu, 17 * kMtu, 3), kOk);
  ASSERT_EQ(ta->sent.size(), 4u);  // +17 ... +20, after the resends
  deliver(*ta, *b, *tb);
  ta->advance(kRtt / 2);
  deliver(*tb, *a, *ta);  // the selective ACK of +20, listing +3 and +10
  ASSERT_EQ(ta->sent.size(), 2u) << "+3 and +10 again, a round trip after their resends";
  EXPECT_EQ(parse(ta->sent[0]).hdr.bth.psn, wire::psn_add(kSqPsn, 3));
  EXPECT_EQ(parse(ta->sent[1]).hdr.bth.psn, wire::psn_add(kSqPsn, 10));
  EXPECT_EQ(ta->counters_.resend_again_pkts.load(), 1u);
  EXPECT_EQ(ta->counters_.selective_runs_repaired.load(), 1u);
  deliver(*tb, *a, *ta);  // nothing more: no selective ACK resends them twice
  EXPECT_EQ(ta->sent.size(), 2u);
  settle();
  expect_completed({1, 2, 3});
  EXPECT_EQ(ta->counters_.retransmit_timeouts.load(), 0u);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 21 * kMtu), 0);
}

// A resend asks for an ACK (AckReq), even for a middle packet that carried none the first
// time: when the resend arrived and only its ACK was lost, the responder holds the PSN and
// re-acknowledges a duplicate only when asked (IBTA 9.7.5.1.3). Without AckReq the resends
// drew no answer and only the retransmit timeout's go-back could recover (InjectedLoss/Every7
// exhausted retry_cnt that way).
TEST_F(TransportTest, AResendAsksForAnAckSoAResponderThatAlreadyHasItAnswers) {
  constexpr uint64_t kRtt = 10'000'000;  // 10 ms
  start_selective_after_one_rtt(kRtt);
  // 8 packets; +3, a middle packet, is lost.
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, kMtu, 8 * kMtu, kMtu, 2), kOk);
  lose(*ta, {3});
  deliver(*ta, *b, *tb);
  deliver(*tb, *a, *ta);  // the selective NAK: +3 is resent...
  ASSERT_EQ(ta->sent.size(), 1u);
  EXPECT_TRUE(parse(ta->sent[0]).hdr.bth.ack_req) << "a resend asks for its ACK";
  deliver(*ta, *b, *tb);  // ...and arrives: the responder has the whole message
  tb->sent.clear();       // but its ACK is lost
  ta->advance(kRtt * 3 / 2 + 1000);
  run_requester_timers();
  ASSERT_EQ(ta->sent.size(), 1u);  // +3 again, long before the retransmit timeout
  const wire::Packet again = parse(ta->sent[0]);
  EXPECT_EQ(again.hdr.bth.psn, wire::psn_add(kSqPsn, 3));
  EXPECT_TRUE(again.hdr.bth.ack_req);
  deliver(*ta, *b, *tb);
  EXPECT_FALSE(tb->sent.empty()) << "the responder re-acknowledges the duplicate";
  deliver(*tb, *a, *ta);
  auto c = drain();
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[1].wr_id, 2u);
  EXPECT_EQ(ta->counters_.retransmit_timeouts.load(), 0u);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 9 * kMtu), 0);
}

// A burst lost to the end of what was sent: the responder never sees a later packet, so no
// selective NAK names the gap. The resend check sends the oldest PSN again (asking for an
// ACK); the ACK stops right after it, which says the next PSN is missing too — so the
// requester goes back N from there at once (partial_ack_rewinds), not one PSN per resend
// check (1.5 RTT each, with each answer re-arming the retransmit timer: ib_write_bw 8 MiB
// over UDP crawled at 5-70 MB/s).
TEST_F(TransportTest, APartialAckOfTheOldestPsnsResendGoesBackNForTheRest) {
  constexpr uint64_t kRtt = 10'000'000;  // 10 ms
  start_selective_after_one_rtt(kRtt);
  a->comp.peer_selective = true;  // as after an earlier selective NAK from this responder
  // 8 packets, +1 … +8, all lost (a burst a full socket buffer dropped).
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, kMtu, 8 * kMtu, kMtu, 2), kOk);
  lose(*ta, {1, 2, 3, 4, 5, 6, 7, 8});
  ta->advance(kRtt * 3 / 2 + 1000);  // the resend check: the oldest, +1, again
  run_requester_timers();
  ASSERT_EQ(ta->sent.size(), 1u);
  EXPECT_EQ(parse(ta->sent[0]).hdr.bth.psn, wire::psn_add(kSqPsn, 1));
  EXPECT_TRUE(parse(ta->sent[0]).hdr.bth.ack_req);
  deliver(*ta, *b, *tb);
  deliver(*tb, *a, *ta);  // its ACK stops at +1: +2 … +8 go again, at once
  EXPECT_EQ(ta->counters_.partial_ack_rewinds.load(), 1u);
  ASSERT_FALSE(ta->sent.empty()) << "the rest waits for another resend check";
  EXPECT_EQ(parse(ta->sent[0]).hdr.bth.psn, wire::psn_add(kSqPsn, 2));
  settle();
  auto c = drain();
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[1].wr_id, 2u);
  EXPECT_EQ(ta->counters_.retransmit_timeouts.load(), 0u);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 9 * kMtu), 0);
}

// The same partial ACK where the responder has seen packets beyond the gap: +3 and +4 are
// lost, +5 … +15 arrive and are placed out of order, the selective NAK has +3 and +4 resent,
// and both resends are lost too. The resend check sends +3 again; its ACK stops at +4. Only
// +4 goes again (partial_ack_resends): going back N from +4 would resend the 11 packets the
// responder already holds (a loaded run resent 1,159 such for 12 link losses).
TEST_F(TransportTest, APartialAckWithGapsNamedBeyondResendsOnlyWhatWasResent) {
  constexpr uint64_t kRtt = 10'000'000;  // 10 ms
  start_selective_after_one_rtt(kRtt);
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, kMtu, 16 * kMtu, kMtu, 2), kOk);
  lose(*ta, {3, 4});
  deliver(*ta, *b, *tb);
  deliver(*tb, *a, *ta);  // the selective NAK: +3 and +4 resent...
  ASSERT_EQ(ta->sent.size(), 2u);
  ta->sent.clear();  // ...and lost
  ta->advance(kRtt * 3 / 2 + 1000);
  run_requester_timers();  // the resend check: +3 again
  ASSERT_EQ(ta->sent.size(), 1u);
  EXPECT_EQ(parse(ta->sent[0]).hdr.bth.psn, wire::psn_add(kSqPsn, 3));
  deliver(*ta, *b, *tb);
  deliver(*tb, *a, *ta);  // its ACK stops at +4
  EXPECT_EQ(ta->counters_.partial_ack_rewinds.load(), 0u) << "went back N";
  EXPECT_EQ(ta->counters_.partial_ack_resends.load(), 1u);
  ASSERT_EQ(ta->sent.size(), 1u) << "only +4 goes again";
  EXPECT_EQ(parse(ta->sent[0]).hdr.bth.psn, wire::psn_add(kSqPsn, 4));
  EXPECT_TRUE(parse(ta->sent[0]).hdr.bth.ack_req);
  settle();
  auto c = drain();
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[1].wr_id, 2u);
  EXPECT_EQ(ta->counters_.retransmit_timeouts.load(), 0u);
  EXPECT_EQ(tb->counters_.duplicate_request.load(), 0u) << "a packet the responder had, resent";
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 17 * kMtu), 0);
}

// A selective NAK lost: +3 … +8 and +10 are lost, the NAK of +3 … +8 too, +10's resend
// arrives. The resend check sends +3 again; its ACK stops at +4, so the requester resends +4
// and +10 — +10 a duplicate asking for an ACK. The responder, still missing +5 … +8, names
// them again (selective_nak_repeated) and they come back at once: before, only the resend
// check found them, one PSN per 1.5 SRTT (a dapl dtest over UDP crawled ~6,000 PSNs so).
TEST_F(TransportTest, ADuplicateAskingForAnAckWhileAGapIsMissingNamesTheGapAgain) {
  constexpr uint64_t kRtt = 10'000'000;  // 10 ms
  start_selective_after_one_rtt(kRtt);
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, kMtu, 16 * kMtu, kMtu, 2), kOk);
  lose(*ta, {3, 4, 5, 6, 7, 8, 10});
  deliver(*ta, *b, *tb);
  ASSERT_EQ(selective_naks(*tb), (std::vector<std::pair<uint32_t, uint32_t>>{{3, 8}, {10, 10}}));
  std::erase_if(tb->sent, [](const std::vector<uint8_t>& bytes) {  // the NAK of +3 … +8 is lost
    const wire::Packet p = parse(bytes);
    return p.hdr.aeth.syndrome == wire::aeth_nak(wire::NakCode::kSelectiveRetransmit) &&
           p.hdr.bth.psn == wire::psn_add(kSqPsn, 3);
  });
  deliver(*tb, *a, *ta);  // the ACK of +2 and the NAK of +10: +10 is resent and placed
  ASSERT_EQ(ta->sent.size(), 1u);
  deliver(*ta, *b, *tb);
  deliver(*tb, *a, *ta);
  ta->advance(kRtt * 3 / 2 + 1000);
  run_requester_timers();  // the resend check: +3 again
  ASSERT_EQ(ta->sent.size(), 1u);
  deliver(*ta, *b, *tb);
  deliver(*tb, *a, *ta);  // its ACK stops at +4: +4 and +10 go again
  EXPECT_EQ(ta->counters_.partial_ack_resends.load(), 1u);
  ASSERT_EQ(ta->sent.size(), 2u);
  EXPECT_EQ(parse(ta->sent[1]).hdr.bth.psn, wire::psn_add(kSqPsn, 10));
  EXPECT_TRUE(parse(ta->sent[1]).hdr.bth.ack_req);
  deliver(*ta, *b, *tb);
  EXPECT_EQ(selective_naks(*tb), (std::vector<std::pair<uint32_t, uint32_t>>{{5, 8}}))
      << "the gap after +4, named again";
  EXPECT_EQ(tb->counters_.selective_nak_repeated.load(), 1u);
  settle();  // no timer fires from here on
  auto c = drain();
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[1].wr_id, 2u);
  EXPECT_EQ(ta->counters_.retransmit_timeouts.load(), 0u);
  EXPECT_EQ(ta->counters_.resend_again_pkts.load(), 1u);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 17 * kMtu), 0);
}

// A CE-marked request draws one CNP to the requester's QP, then none for 50 µs; the
// requester counts it and, pacing with DCQCN, cuts its rate.
TEST_F(TransportTest, ACeMarkedRequestDrawsARateLimitedCnpThatCutsTheRequestersRate) {
  ta->dcqcn = true;
  ta->dcqcn_params.line_rate = 1e9 / 8 / 1e9;  // 1 Gbit/s
  a->req.cc_checked = false;                   // the move to RTS asked before the test set it
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, 4 * kMtu, 0, 1), kOk);
  ASSERT_TRUE(a->req.cc_on);
  ASSERT_EQ(ta->sent.size(), 4u);
  {
    std::lock_guard lk(dev->mutex());
    for (int i = 0; i < 3; ++i) responder::on_congestion_experienced(*b, *tb);
  }
  ASSERT_EQ(tb->sent.size(), 1u);
  const wire::Packet cnp = parse(tb->sent[0]);
  EXPECT_EQ(cnp.hdr.bth.opcode, 0x81);
  EXPECT_EQ(cnp.hdr.bth.dest_qpn, a->qpn());
  EXPECT_TRUE(cnp.hdr.bth.becn);
  EXPECT_EQ(tb->sent[0].size(), wire::kBthBytes + 16 + wire::kIcrcBytes);
  EXPECT_EQ(tb->counters_.cnp_sent.load(), 1u);
  tb->advance(responder::kMinTimeBetweenCnpsNs);
  {
    std::lock_guard lk(dev->mutex());
    responder::on_congestion_experienced(*b, *tb);
    completer::on_cnp(*a, *ta);
  }
  EXPECT_EQ(tb->counters_.cnp_sent.load(), 2u);
  EXPECT_EQ(ta->counters_.cnp_rcvd.load(), 1u);
  EXPECT_EQ(ta->counters_.dcqcn_rate_cuts.load(), 1u);
  EXPECT_DOUBLE_EQ(a->req.rate.rate(), ta->dcqcn_params.line_rate / 2);
  tb->sent.clear();
  settle();
  EXPECT_EQ(drain().size(), 1u);
}

TEST_F(TransportTest, SelectiveNakIsNotSentToARequesterThatDidNotAsk) {
  tb->selective = true;  // responder on, requester off: go-back-N
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, 8 * kMtu), kOk);
  lose(*ta, {2});
  deliver(*ta, *b, *tb);
  ASSERT_EQ(tb->sent.size(), 1u);
  EXPECT_EQ(parse(tb->sent[0]).hdr.aeth.syndrome, wire::aeth_nak(wire::NakCode::kPsnSequenceError));
  EXPECT_EQ(tb->counters_.ooo_placed.load(), 0u);
  settle();
  ASSERT_EQ(drain().size(), 1u);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 8 * kMtu), 0);
}

TEST_F(TransportTest, RequesterAskingForSelectiveFallsBackToGoBackNWithAPlainResponder) {
  ta->selective = true;  // requester on, responder off
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, 8 * kMtu), kOk);
  lose(*ta, {2});
  deliver(*ta, *b, *tb);
  ASSERT_EQ(tb->sent.size(), 1u);
  EXPECT_EQ(parse(tb->sent[0]).hdr.aeth.syndrome, wire::aeth_nak(wire::NakCode::kPsnSequenceError));
  deliver(*tb, *a, *ta);
  EXPECT_EQ(ta->sent.size(), 6u);  // go back to +2 and send everything after it again
  settle();
  ASSERT_EQ(drain().size(), 1u);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 8 * kMtu), 0);
}

TEST_F(TransportTest, SelectiveNakFromAPeerWeDidNotAskIsIgnored) {
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, 4 * kMtu), kOk);
  wire::Headers h;
  h.bth.opcode = uint8_t(Opcode::kAcknowledge);
  h.bth.dest_qpn = a->qpn();
  h.bth.psn = wire::psn_add(kSqPsn, 1);
  h.aeth.syndrome = wire::aeth_nak(wire::NakCode::kSelectiveRetransmit);
  h.aeth.msn = wire::psn_add(kSqPsn, 1);
  ta->sent.clear();
  tb->transmit(h, 0, {}, 0);
  deliver(*tb, *a, *ta);
  EXPECT_TRUE(ta->sent.empty());
  EXPECT_EQ(ta->counters_.rcvd_malformed.load(), 1u);
  EXPECT_EQ(a->query().state, QpState::kRts);
}

// Property: under random loss both ways, with timers, WRITEs and SENDs interleaved all land
// byte for byte and complete in order, in selective mode; and the packets sent again stay
// a small multiple of the packets lost.
// (The parameter: the loss pattern's seed.)
class SelectiveLossTest : public TransportTest, public ::testing::WithParamInterface<int> {
 protected:
  static constexpr int kMessages = 60;
  static constexpr uint32_t kLen = 7 * kMtu + 100;
  void SetUp() override {
    TransportTest::SetUp();
    ta->selective = tb->selective = true;
    for (QueuePair* q : {a.get(), b.get()}) q->attr.retry_cnt = q->comp.retry_left = 7;
    std::memset(dst.data(), 0, dst.size());
  }
  std::mt19937 rng{static_cast<unsigned>(GetParam())};
};

TEST_P(SelectiveLossTest, WritesAndSendsSurviveRandomLoss) {
  int posted = 0, completed = 0, received = 0, lost = 0;
  for (int m = 0; m < 20; ++m) post_recv(*b, kLen, 1000 + m);
  for (int round = 0; round < 20000 && completed < kMessages; ++round) {
    while (posted < kMessages && posted - completed < 16) {
      // Every third message is a SEND (into dst's tail), the others WRITEs to their slot.
      const WrOpcode op = posted % 3 == 2 ? WrOpcode::kSend : WrOpcode::kRdmaWrite;
      ASSERT_EQ(post(*a, op, uint64_t(posted) * kLen % (src.size() - kLen), kLen,
                     uint64_t(posted + 1) * kLen, uint64_t(posted)),
                kOk);
      ++posted;
    }
    lost += deliver_lossy(*ta, *b, *tb, 5, rng);
    lost += deliver_lossy(*tb, *a, *ta, 2, rng);
    for (const Cqe& c : drain()) {
      ASSERT_EQ(c.status, WcStatus::kSuccess) << "wr " << c.wr_id;
      if (c.opcode == WcOpcode::kRecv) {
        ++received;
        continue;
      }
      ASSERT_EQ(c.wr_id, uint64_t(completed)) << "completions out of order";
      ++completed;
    }
    fire_timers_when_quiet();
  }
  ASSERT_EQ(completed, kMessages);
  EXPECT_EQ(received, kMessages / 3);
  for (int m = 0; m < kMessages; ++m) {
    if (m % 3 == 2) continue;  // SENDs all went to the receive buffer at dst[0, kLen)
    const uint64_t so = uint64_t(m) * kLen % (src.size() - kLen), dof = uint64_t(m + 1) * kLen;
    ASSERT_EQ(std::memcmp(dst.data() + dof, src.data() + so, kLen), 0) << "WRITE " << m;
  }
  EXPECT_GT(ta->counters_.selective_nak_rcvd.load(), 0u);
  EXPECT_LE(ta->counters_.retransmitted_pkts.load(), uint64_t(8 * lost + 16)) << "lost " << lost;
}

INSTANTIATE_TEST_SUITE_P(Seeds, SelectiveLossTest, ::testing::Range(1, 17));

// READs among WRITEs under random loss both ways, in selective mode: lost READ responses are
// asked for again by range, responses beyond them placed (read_response_ahead); every byte
// lands, completions stay in order, and re-sending stays in proportion to the loss.
class SelectiveReadLossTest : public SelectiveLossTest {};

TEST_P(SelectiveReadLossTest, ReadsAndWritesSurviveRandomLoss) {
  int posted = 0, completed = 0, lost = 0;
  for (int round = 0; round < 20000 && completed < kMessages; ++round) {
    while (posted < kMessages && posted - completed < 16) {
      // Odd messages READ src[m·kLen…] into dst's slot m+1, even ones WRITE it there.
      const WrOpcode op = posted % 2 ? WrOpcode::kRdmaRead : WrOpcode::kRdmaWrite;
      const uint64_t s_off = uint64_t(posted) * kLen % (src.size() - kLen);
      const uint64_t d_off = uint64_t(posted + 1) * kLen;
      ASSERT_EQ(op == WrOpcode::kRdmaRead ? post(*a, op, d_off, kLen, s_off, uint64_t(posted))
                                          : post(*a, op, s_off, kLen, d_off, uint64_t(posted)),
                kOk);
      ++posted;
    }
    lost += deliver_lossy(*ta, *b, *tb, 3, rng);
    lost += deliver_lossy(*tb, *a, *ta, 5, rng);
    for (const Cqe& c : drain()) {
      ASSERT_EQ(c.status, WcStatus::kSuccess) << "wr " << c.wr_id;
      ASSERT_EQ(c.wr_id, uint64_t(completed)) << "completions out of order";
      ++completed;
    }
    fire_timers_when_quiet();
  }
  ASSERT_EQ(completed, kMessages);
  for (int m = 0; m < kMessages; ++m) {
    const uint64_t so = uint64_t(m) * kLen % (src.size() - kLen), dof = uint64_t(m + 1) * kLen;
    ASSERT_EQ(std::memcmp(dst.data() + dof, src.data() + so, kLen), 0) << "message " << m;
  }
  EXPECT_GT(ta->counters_.ooo_read_responses.load(), 0u);
  EXPECT_GT(ta->counters_.read_gap_requests.load(), 0u);
  EXPECT_LE(ta->counters_.retransmitted_pkts.load(), uint64_t(8 * lost + 16)) << "lost " << lost;
}

INSTANTIATE_TEST_SUITE_P(Seeds, SelectiveReadLossTest, ::testing::Range(1, 17));

// ---- Forged out-of-order packets (issue 21 item 1) --------------------------------------

// A copy of genuine packet `g` with a different payload (what a blind forger sends at a
// PSN it guessed); `resend` sets Bth::resend (byte 8, 0x20).
std::vector<uint8_t> forged_copy(const std::vector<uint8_t>& g, bool resend = false) {
  std::vector<uint8_t> f = g;
  f[f.size() - 8] ^= 0xff;  // a payload byte (the ICRC is the last 4)
  if (resend) f[8] |= 0x20;
  return f;
}

// Genuine WRITE packets +0…+7 (PSNs counted from the first one) are taken off `t`, so a
// test can deliver them in the order it chooses.
std::vector<std::vector<uint8_t>> take(FakeTransport& t) {
  std::vector<std::vector<uint8_t>> v(t.sent.begin(), t.sent.end());
  t.sent.clear();
  return v;
}

// A forged middle packet lands ahead of the genuine one while an earlier packet is lost: it
// is placed, but the genuine first transmissions then arriving behind it make the responder
// forget it; the genuine copy is placed, the loss recovered, every byte is the requester's.
TEST_F(TransportTest, ForgedPacketAheadOfItsGenuineCopyIsForgottenWhenTheGenuineStreamArrives) {
  start_selective_after_one_rtt(1000000);
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, kMtu, 8 * kMtu, kMtu, 2), kOk);
  auto g = take(*ta);
  ASSERT_EQ(g.size(), 8u);
  for (int i : {0, 1}) ta->sent.push_back(g[i]);
  ta->sent.push_back(forged_copy(g[5]));  // +2 is lost; the forgery reaches +5 first
  for (int i : {3, 4, 5, 6, 7}) ta->sent.push_back(g[i]);
  deliver(*ta, *b, *tb);
  EXPECT_EQ(tb->counters_.ooo_unplaced.load(), 1u);
  EXPECT_EQ(tb->counters_.ooo_contested.load(), 0u);
  settle();
  EXPECT_EQ(drain().size(), 2u);
  EXPECT_EQ(std::memcmp(dst.data() + kMtu, src.data() + kMtu, 8 * kMtu), 0) << "forged data kept";
  EXPECT_EQ(b->attr.state, QpState::kRts);
}

// A forged copy (marked as a resend) of a PSN already placed out of order: the two differ,
// so the PSN is contested — reported missing, taken in order only — and the requester's
// resend is what stays in memory. An identical copy is only a duplicate.
TEST_F(TransportTest, ADifferentSecondCopyOfAPlacedPsnIsContestedAndResentInOrder) {
  start_selective_after_one_rtt(1000000);
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, kMtu, 8 * kMtu, kMtu, 2), kOk);
  auto g = take(*ta);
  ASSERT_EQ(g.size(), 8u);
  for (int i : {0, 1, 3, 4, 5}) ta->sent.push_back(g[i]);  // +2 lost
  ta->sent.push_back(g[5]);                                // a true duplicate
  ta->sent.push_back(forged_copy(g[5], /*resend=*/true));  // a forgery of +5
  for (int i : {6, 7}) ta->sent.push_back(g[i]);
  deliver(*ta, *b, *tb);
  EXPECT_EQ(tb->counters_.ooo_contested.load(), 1u);
  EXPECT_EQ(tb->counters_.duplicate_request.load(), 1u);
  std::vector<std::pair<uint32_t, uint32_t>> naks;
  for (const auto& bytes : tb->sent) {
    wire::Packet p = parse(bytes);
    if (p.hdr.aeth.syndrome == wire::aeth_nak(wire::NakCode::kSelectiveRetransmit))
      naks.emplace_back(p.hdr.bth.psn, p.hdr.aeth.msn);
  }
  const uint32_t base = wire::psn_add(kSqPsn, 1);  // after the warm-up WRITE
  const std::vector<std::pair<uint32_t, uint32_t>> want{
      {wire::psn_add(base, 2), wire::psn_add(base, 2)},
      {wire::psn_add(base, 5), wire::psn_add(base, 5)}};
  EXPECT_EQ(naks, want);
  settle();
  EXPECT_EQ(drain().size(), 2u);
  EXPECT_EQ(std::memcmp(dst.data() + kMtu, src.data() + kMtu, 8 * kMtu), 0);
  EXPECT_EQ(b->attr.state, QpState::kRts);
}

// The selective bit of an out-of-order packet is not the QP's mode: before any request with
// it was accepted in order, a gap draws a go-back-N sequence NAK and nothing is placed.
TEST_F(TransportTest, TheSelectiveBitAloneDoesNotTurnOnOutOfOrderPlacement) {
  ta->selective = tb->selective = true;
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, 8 * kMtu), kOk);
  lose(*ta, {0});  // the very first request: nothing was accepted in order yet
  deliver(*ta, *b, *tb);
  EXPECT_EQ(tb->counters_.ooo_placed.load(), 0u);
  ASSERT_FALSE(tb->sent.empty());
  EXPECT_EQ(parse(tb->sent[0]).hdr.aeth.syndrome, wire::aeth_nak(wire::NakCode::kPsnSequenceError));
  settle();
  ASSERT_EQ(drain().size(), 1u);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 8 * kMtu), 0);
}

// Zero-length WRITEs carry nothing to place and no rkey to check: never placed early (they
// were, and the genuine packet of that PSN was then dropped as a duplicate).
TEST_F(TransportTest, AZeroLengthWriteIsNeverPlacedOutOfOrder) {
  start_selective_after_one_rtt(1000000);
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, 0, 0, 2), kOk);
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, 0, 0, 3), kOk);
  lose(*ta, {1});  // the first zero-length WRITE (the warm-up used +0)
  deliver(*ta, *b, *tb);
  EXPECT_EQ(tb->counters_.ooo_placed.load(), 0u);
  EXPECT_EQ(tb->counters_.ooo_refused.load(), 1u);
  settle();
  EXPECT_EQ(drain().size(), 3u);
  EXPECT_EQ(b->attr.state, QpState::kRts);
}

// On a long path in selective mode whose responder has reported a gap, a multi-packet WRITE
// goes as one WRITE Only per packet, each with its RETH (SendWqe::reth_each): the loss of
// its first packet costs that packet's resend alone. As FIRST/MIDDLE/LAST the MIDDLEs behind
// a lost FIRST had no address and were refused and resent too (2,000 packets per 256 MiB at 1 %
// loss; wan_bench 74 -> 89 %).
TEST_F(TransportTest, OnALongPathAWriteLosingItsFirstPacketResendsThatPacketAlone) {
  start_selective_after_one_rtt(2'000'000);  // PSN +0; smallest RTT 2 ms: a long path
  ASSERT_TRUE(a->req.window.long_path());
  // Until the path has lost a packet, First … Last.
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, 3 * kMtu, 0, 2), kOk);  // +1 … +3
  ASSERT_EQ(ta->sent.size(), 3u);
  EXPECT_EQ(parse(ta->sent[0]).hdr.bth.opcode, uint8_t(Opcode::kWriteFirst));
  lose(*ta, {2});
  settle();  // its selective NAK: the responder reports gaps
  ASSERT_TRUE(a->comp.peer_selective);
  const uint64_t resent = ta->counters_.retransmitted_pkts.load();
  constexpr uint32_t kLen = 8 * kMtu - 100;
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, kLen, 4096, 3), kOk);  // +4 … +11
  ASSERT_EQ(ta->sent.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    const wire::Packet p = parse(ta->sent[i]);
    EXPECT_EQ(p.hdr.bth.opcode, uint8_t(Opcode::kWriteOnly)) << i;
    EXPECT_EQ(p.hdr.reth.va, reinterpret_cast<uintptr_t>(dst.data()) + 4096 + i * kMtu) << i;
    EXPECT_EQ(p.hdr.reth.dma_length, i == 7 ? kLen - 7 * kMtu : kMtu) << i;
  }
  const uint64_t placed = tb->counters_.ooo_placed.load();
  lose(*ta, {4});
  deliver(*ta, *b, *tb);
  EXPECT_EQ(tb->counters_.ooo_placed.load() - placed, 7u);
  EXPECT_EQ(tb->counters_.ooo_refused.load(), 0u);
  settle();
  EXPECT_EQ(ta->counters_.retransmitted_pkts.load() - resent, 1u);
  expect_completed({1, 2, 3});
  EXPECT_TRUE(std::equal(src.begin(), src.begin() + kLen, dst.begin() + 4096));
  // A WRITE with immediate data keeps FIRST … LAST (its CQE reports the message's length).
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWriteImm, 0, 2 * kMtu, 0, 4), kOk);
  ASSERT_EQ(ta->sent.size(), 2u);
  EXPECT_EQ(parse(ta->sent[0]).hdr.bth.opcode, uint8_t(Opcode::kWriteFirst));
}

// Under random loss a gap opens every round trip or so, and a repair holds the cumulative
// ACK back: the round trip of a PSN sent after a lost one is taken from the selective ACK
// that shows it arrived, not lost to Karn's rule (a resend of an earlier PSN used to cancel
// every measurement: SRTT froze at 1 % loss and the window's queue signal went blind).
TEST_F(TransportTest, ARoundTripIsTimedFromTheSelectiveAckBeyondALoss) {
  start_selective_after_one_rtt(1'000'000);                       // PSN +0
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, kMtu, 0, 2), kOk);  // +1: timed
  deliver(*ta, *b, *tb);
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, 8 * kMtu, 0, 3), kOk);  // +2 … +9
  ta->advance(1'000'000);
  deliver(*tb, *a, *ta);  // +1's ACK: a second 1 ms sample
  ASSERT_EQ(a->req.window.srtt_ns(), 1'000'000u);
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, 4 * kMtu, 0, 4), kOk);  // +10 … +13: +10 timed
  lose(*ta, {3});         // (not a WRITE's first: the rest of it could not be placed)
  deliver(*ta, *b, *tb);  // the NAK of +3, selective ACKs at +9 (6 held) and +13 (10 held)
  ta->advance(3'000'000);
  deliver(*tb, *a, *ta);  // +3 sent again; the ACK at +13 holds +10
  EXPECT_EQ(a->req.window.srtt_ns(), (7 * 1'000'000u + 3'000'000u) / 8);
  ta->advance(10'000'000);
  settle();  // the cumulative ACK past +10, after the repair: no sample
  EXPECT_EQ(a->req.window.srtt_ns(), (7 * 1'000'000u + 3'000'000u) / 8);
  EXPECT_EQ(drain().size(), 4u);
}

// Same-host placement (Transport::place_write) of a stream that began in-band, behind a SEND:
// a requester that keeps the path full never has its in-band tail acknowledged, and without
// RequesterState::place_hold its WRITEs went in-band for as long as the stream lasted (the
// CI failure of MrChange.NothingIsWrittenAfterDeregWhileAPeerStreamsWrites).
class InBandStreamTest : public TransportTest {
 protected:
  static constexpr uint32_t kLen = 256 << 10;
  // A SEND, then `writes` WRITEs of kLen bytes into dst's first MiB, with placement possible.
  void start(int writes) {
    ta->placing = true;
    post_recv(*b, 64);
    ASSERT_EQ(post(*a, WrOpcode::kSend, 0, 64, 0, 1), kOk);
    for (int i = 0; i < writes; ++i)
      ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, uint64_t(i % 4) * kLen, kLen, uint64_t(i % 4) * kLen,
                     uint64_t(2 + i)),
                kOk);
  }
  // One round of a full pipeline: the older half of what the requester has on the way is
  // delivered (each request shown to `seen` first, when given), then the responder's answers.
  void pipeline_round(const std::function<void(const wire::Packet&)>& seen = {}) {
    FakeTransport half(*dev);
    for (size_t i = 0, n = (ta->sent.size() + 1) / 2; i < n; ++i) {
      if (seen) seen(parse(ta->sent.front()));
      half.sent.push_back(std::move(ta->sent.front()));
      ta->sent.pop_front();
    }
    deliver(half, *b, *tb);
    deliver(*tb, *a, *ta);
  }
};

TEST_F(InBandStreamTest, AStreamThatBeganInBandIsPlacedAfterOneRunOfInBandBytes) {
  constexpr int kWrites = 16;
  start(kWrites);
  uint64_t inband_write_bytes = 0;
  for (int round = 0; round < 100000 && !(ta->sent.empty() && tb->sent.empty()); ++round)
    pipeline_round([&](const wire::Packet& p) {
      if (!p.hdr.bth.placed && p.hdr.bth.opcode != uint8_t(Opcode::kSendOnly))
        inband_write_bytes += p.payload.size();
    });
  const std::vector<Cqe> c = drain();  // the SEND's, its receive's, the WRITEs'
  ASSERT_EQ(c.size(), kWrites + 2u);
  for (size_t i = 0; i < c.size(); ++i) EXPECT_EQ(c[i].status, WcStatus::kSuccess) << i;
  EXPECT_TRUE(std::equal(src.begin(), src.end(), dst.begin()));
  // One run of in-band bytes, and at most a window's worth sent before its hold took effect.
  EXPECT_GE(inband_write_bytes, requester::kPlaceRunBytes);
  EXPECT_LE(inband_write_bytes, requester::kPlaceRunBytes + 2 * kLen)
      << "placed " << ta->placed_bytes;
  EXPECT_EQ(ta->placed_bytes + inband_write_bytes, uint64_t(kWrites) * kLen);
}

// The hold of place_hold never holds a go-back-N resend: when everything after the in-band
// tail's AckReq packet is lost, the retransmit timeout's rewind sends it again (a held resend
// would wait for the ACK it is itself needed for, until retry_cnt ran out).
TEST_F(InBandStreamTest, APlacementHoldNeverHoldsAResend) {
  start(8);
  for (int round = 0; round < 10000 && !a->req.place_hold; ++round) pipeline_round();
  ASSERT_TRUE(a->req.place_hold);
  ta->sent.clear();  // all lost, the AckReq packet among them
  tb->sent.clear();
  size_t done = 0;  // completions: the SEND's, its receive's, the 8 WRITEs'
  for (int i = 0; i < 50 && (done += drain().size()) < 10; ++i) {
    fire_timers_when_quiet();
    settle();
  }
  EXPECT_EQ(done, 10u);
  EXPECT_EQ(a->attr.state, QpState::kRts);
  EXPECT_TRUE(std::equal(src.begin(), src.end(), dst.begin()));
}

// Tail-loss probe (RACK-TLP, RFC 8985 7; issue 23 item 2). A plain (go-back-N) pair that has
// measured its round trip with a first one-packet WRITE.
// Selective mode: READ responses that arrive beyond lost ones are placed, and only the lost
// ones are asked for again, by one READ request for their range (IRN, Mittal et al. 2018,
// 3.2); go-back-N asks for everything from the gap on (ReadIsChunkedAndLostResponseIs
// ReRequested). No timeout, no probe.
TEST_F(TransportTest, ReadResponsesBeyondALossArePlacedAndOnlyTheLostOnesAskedForAgain) {
  ta->selective = tb->selective = true;
  constexpr uint32_t kLen = 8 * kMtu - 100;
  ASSERT_EQ(post(*a, WrOpcode::kRdmaRead, 0, kLen, 0, 2), kOk);
  deliver(*ta, *b, *tb);
  ASSERT_EQ(tb->sent.size(), 8u);
  lose(*tb, {2, 3});
  deliver(*tb, *a, *ta);
  EXPECT_EQ(ta->counters_.ooo_read_responses.load(), 4u);  // +4 … +7
  EXPECT_TRUE(drain().empty());
  ASSERT_EQ(ta->sent.size(), 1u) << "one READ request for the gap";
  const wire::Packet rr = parse(ta->sent[0]);
  EXPECT_EQ(rr.hdr.bth.psn, wire::psn_add(kSqPsn, 2));
  EXPECT_EQ(rr.hdr.reth.va, reinterpret_cast<uintptr_t>(src.data()) + 2 * kMtu);
  EXPECT_EQ(rr.hdr.reth.dma_length, 2 * kMtu);
  deliver(*ta, *b, *tb);
  EXPECT_EQ(tb->sent.size(), 2u) << "the responder sends the two lost responses, no more";
  settle();
  auto c = drain();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(c[0].opcode, WcOpcode::kRdmaRead);
  EXPECT_EQ(c[0].byte_len, kLen);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), kLen), 0);
  EXPECT_EQ(a->comp.psn, wire::psn_add(kSqPsn, 8));
  EXPECT_EQ(ta->counters_.read_gap_requests.load(), 1u);
  EXPECT_EQ(ta->counters_.retransmitted_pkts.load(), 1u);
  EXPECT_EQ(ta->counters_.retransmit_timeouts.load(), 0u);
  EXPECT_EQ(a->attr.state, QpState::kRts);
}

// The request for a gap's READ responses is lost as well: 1.5 SRTT later the responses still
// missing are asked for once more (the resend check, IRN's RTO_low for READs) — no probe's
// go-back-N, no retransmit timeout.
TEST_F(TransportTest, ALostRequestForMissingReadResponsesIsSentAgainAfterOneAndAHalfRtts) {
  constexpr uint64_t kRtt = 1'000'000;
  start_selective_after_one_rtt(kRtt);
  ASSERT_EQ(drain().size(), 1u);
  ASSERT_EQ(post(*a, WrOpcode::kRdmaRead, 0, 8 * kMtu, 0, 2), kOk);  // PSNs +1 … +8
  deliver(*ta, *b, *tb);
  lose(*tb, {3});
  deliver(*tb, *a, *ta);
  ASSERT_EQ(ta->sent.size(), 1u);
  EXPECT_EQ(parse(ta->sent[0]).hdr.bth.psn, wire::psn_add(kSqPsn, 3));
  ta->sent.clear();  // the request for +3 is lost
  ta->advance(completer::resend_check_ns(*a) - 1000);
  run_requester_timers();
  EXPECT_TRUE(ta->sent.empty()) << "not before 1.5 SRTT";
  ta->advance(2000);
  run_requester_timers();
  ASSERT_EQ(ta->sent.size(), 1u);
  const wire::Packet again = parse(ta->sent[0]);
  EXPECT_EQ(again.hdr.bth.psn, wire::psn_add(kSqPsn, 3));
  EXPECT_EQ(again.hdr.reth.dma_length, kMtu);
  settle();
  auto c = drain();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 8 * kMtu), 0);
  EXPECT_EQ(ta->counters_.retransmit_timeouts.load(), 0u);
  EXPECT_EQ(ta->counters_.tail_loss_probes.load(), 0u);
  EXPECT_EQ(ta->counters_.read_gap_requests.load(), 2u);
}

// A cumulative ACK for a WRITE posted after a READ whose last responses were lost: only those
// responses are asked for, and the WRITE completes after the READ without being sent again.
TEST_F(TransportTest, AnAckBeyondAReadMissingResponsesAsksForThemAloneAndKeepsTheWrite) {
  ta->selective = tb->selective = true;
  ASSERT_EQ(post(*a, WrOpcode::kRdmaRead, 0, 4 * kMtu, 0, 1), kOk);          // +0 … +3
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, 2 * kMtu, 4 * kMtu, 2), kOk);  // +4, +5
  deliver(*ta, *b, *tb);
  lose(*tb, {3});  // the READ's last response; the WRITE's ACK comes
  deliver(*tb, *a, *ta);
  ASSERT_EQ(ta->sent.size(), 1u) << "a READ request for +3 alone, the WRITE not resent";
  const wire::Packet rr = parse(ta->sent[0]);
  EXPECT_EQ(rr.hdr.bth.psn, wire::psn_add(kSqPsn, 3));
  EXPECT_EQ(rr.hdr.reth.dma_length, kMtu);
  EXPECT_TRUE(drain().empty()) << "the WRITE completes after the READ";
  settle();
  expect_completed({1, 2});
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 4 * kMtu), 0);
  EXPECT_EQ(ta->counters_.retransmitted_pkts.load(), 1u);
  EXPECT_EQ(a->comp.psn, wire::psn_add(kSqPsn, 6));
}

// A gap across two READs (the first one's last response and the second one's first): one
// request per READ, each within the READ it re-asks for (a duplicate lies within the READ
// executed, IBTA 9.7.5.1.3.1); completions stay in order.
TEST_F(TransportTest, AReadResponseGapAcrossTwoReadsIsAskedForReadByRead) {
  ta->selective = tb->selective = true;
  ASSERT_EQ(post(*a, WrOpcode::kRdmaRead, 0, 4 * kMtu, 0, 1), kOk);
  ASSERT_EQ(post(*a, WrOpcode::kRdmaRead, 4 * kMtu, 4 * kMtu, 4 * kMtu, 2), kOk);
  deliver(*ta, *b, *tb);
  ASSERT_EQ(tb->sent.size(), 8u);
  lose(*tb, {3, 4});
  deliver(*tb, *a, *ta);
  EXPECT_EQ(ta->counters_.ooo_read_responses.load(), 3u);  // +5 … +7
  ASSERT_EQ(ta->sent.size(), 2u);
  const wire::Packet r1 = parse(ta->sent[0]), r2 = parse(ta->sent[1]);
  EXPECT_EQ(r1.hdr.bth.psn, wire::psn_add(kSqPsn, 3));
  EXPECT_EQ(r1.hdr.reth.va, reinterpret_cast<uintptr_t>(src.data()) + 3 * kMtu);
  EXPECT_EQ(r1.hdr.reth.dma_length, kMtu);
  EXPECT_EQ(r2.hdr.bth.psn, wire::psn_add(kSqPsn, 4));
  EXPECT_EQ(r2.hdr.reth.va, reinterpret_cast<uintptr_t>(src.data()) + 4 * kMtu);
  EXPECT_EQ(r2.hdr.reth.dma_length, kMtu);
  settle();
  expect_completed({1, 2});
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 8 * kMtu), 0);
  EXPECT_EQ(ta->counters_.retransmit_timeouts.load(), 0u);
}

// A second copy of a READ response placed out of order that differs from it (a forgery, or
// the forgery came first): which is genuine cannot be told, so that response is asked for
// again, and the responder's copy is what stays. An identical copy is only a duplicate.
TEST_F(TransportTest, ADifferentCopyOfAReadResponsePlacedOutOfOrderIsAskedForAgain) {
  ta->selective = tb->selective = true;
  ASSERT_EQ(post(*a, WrOpcode::kRdmaRead, 0, 8 * kMtu, 0, 2), kOk);
  deliver(*ta, *b, *tb);
  auto g = take(*tb);
  ASSERT_EQ(g.size(), 8u);
  for (int i : {0, 1, 3, 4}) tb->sent.push_back(g[i]);  // +2 lost
  tb->sent.push_back(forged_copy(g[5]));                // the forgery reaches +5 first
  tb->sent.push_back(g[5]);
  tb->sent.push_back(g[4]);  // a true duplicate of +4
  for (int i : {6, 7}) tb->sent.push_back(g[i]);
  deliver(*tb, *a, *ta);
  EXPECT_EQ(ta->counters_.ooo_contested.load(), 1u);
  ASSERT_EQ(ta->sent.size(), 2u) << "the gap at +2, then +5 alone";
  EXPECT_EQ(parse(ta->sent[0]).hdr.bth.psn, wire::psn_add(kSqPsn, 2));
  const wire::Packet again = parse(ta->sent[1]);
  EXPECT_EQ(again.hdr.bth.psn, wire::psn_add(kSqPsn, 5));
  EXPECT_EQ(again.hdr.reth.dma_length, kMtu);
  settle();
  ASSERT_EQ(drain().size(), 1u);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 8 * kMtu), 0) << "forged data kept";
  EXPECT_EQ(ta->counters_.retransmit_timeouts.load(), 0u);
}

// Without selective mode a READ response ahead of the expected one still means go-back-N
// from the gap (the IBTA requester; rdma-core's rxe does the same), nothing placed ahead.
TEST_F(TransportTest, WithoutSelectiveModeReadResponsesAheadAreNotPlaced) {
  ASSERT_EQ(post(*a, WrOpcode::kRdmaRead, 0, 8 * kMtu, 0, 2), kOk);
  deliver(*ta, *b, *tb);
  lose(*tb, {2});
  deliver(*tb, *a, *ta);
  EXPECT_EQ(ta->counters_.ooo_read_responses.load(), 0u);
  ASSERT_FALSE(ta->sent.empty());
  const wire::Packet rr = parse(ta->sent[0]);
  EXPECT_EQ(rr.hdr.bth.psn, wire::psn_add(kSqPsn, 2));
  EXPECT_EQ(rr.hdr.reth.dma_length, 6 * kMtu) << "everything from the gap to the chunk's end";
  settle();
  ASSERT_EQ(drain().size(), 1u);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 8 * kMtu), 0);
}

// READ responses placed ahead count as delivered when they arrive (the window grows by them
// in slow start then), and the gap's repair counts only the repaired PSNs: counted at the
// repair instead, the whole jump made one delivery-rate sample the link never carried
// (docs/wide-area.md, "READ responses out of order").
TEST_F(TransportTest, ReadResponsesPlacedAheadCountAsDeliveredWhenTheyArrive) {
  // A 2 ms path without a queue: one lost response is random loss, the window stays in slow
  // start (+1 per delivered PSN) and shows what was counted when.
  start_selective_after_one_rtt(2'000'000);
  ASSERT_EQ(drain().size(), 1u);
  ASSERT_TRUE(a->req.window.long_path());
  // Validation off: 8 PSNs never fill the window, and its growth is how this test sees what
  // was counted when (CongestionWindow::set_validation; the requester turned it on).
  a->req.window.set_validation(false);
  const uint32_t start = a->req.window.psns();
  ASSERT_LT(start + 8, a->req.window.threshold());
  ASSERT_EQ(post(*a, WrOpcode::kRdmaRead, 0, 8 * kMtu, 0, 2), kOk);  // PSNs +1 … +8
  deliver(*ta, *b, *tb);
  lose(*tb, {3});
  deliver(*tb, *a, *ta);
  EXPECT_EQ(ta->counters_.random_losses.load(), 1u);
  EXPECT_EQ(a->comp.read_ahead, 5u) << "+4 … +8 placed beyond the gap";
  EXPECT_EQ(a->req.window.psns(), start + 7) << "+1, +2 in order and the five placed ahead";
  settle();
  expect_completed({2});
  EXPECT_EQ(a->comp.read_ahead, 0u);
  EXPECT_EQ(a->req.window.psns(), start + 8) << "the repair delivered one PSN, not six";
}

// Two requests for missing READ responses, the first one lost: it is asked for again
// resend_check_ns after it was sent, however recently the second one went (one deadline for
// all asks kept the head waiting behind newer asks until the retransmit timer fired).
TEST_F(TransportTest, EachRequestForMissingReadResponsesIsWatchedOnItsOwn) {
  constexpr uint64_t kRtt = 1'000'000;
  start_selective_after_one_rtt(kRtt);
  ASSERT_EQ(drain().size(), 1u);
  ASSERT_EQ(post(*a, WrOpcode::kRdmaRead, 0, 8 * kMtu, 0, 2), kOk);  // PSNs +1 … +8
  deliver(*ta, *b, *tb);
  auto g = take(*tb);
  ASSERT_EQ(g.size(), 8u);
  for (int i : {0, 1, 3}) tb->sent.push_back(g[i]);  // +3 lost: asked for at once
  deliver(*tb, *a, *ta);
  ASSERT_EQ(ta->sent.size(), 1u);
  ta->sent.clear();  // that request is lost
  const uint64_t check = completer::resend_check_ns(*a);
  ta->advance(check / 2);
  for (int i : {4, 6, 7}) tb->sent.push_back(g[i]);  // +6 lost: asked for now
  deliver(*tb, *a, *ta);
  ASSERT_EQ(ta->sent.size(), 1u);
  EXPECT_EQ(parse(ta->sent[0]).hdr.bth.psn, wire::psn_add(kSqPsn, 6));
  deliver(*ta, *b, *tb);
  deliver(*tb, *a, *ta);  // +6 answered
  ta->advance(check / 2 + 1000);
  run_requester_timers();
  ASSERT_EQ(ta->sent.size(), 1u) << "+3 again, one check after its own request";
  const wire::Packet again = parse(ta->sent[0]);
  EXPECT_EQ(again.hdr.bth.psn, wire::psn_add(kSqPsn, 3));
  EXPECT_EQ(again.hdr.reth.dma_length, kMtu);
  settle();
  expect_completed({2});
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 8 * kMtu), 0);
  EXPECT_EQ(ta->counters_.retransmit_timeouts.load(), 0u);
  EXPECT_EQ(ta->counters_.tail_loss_probes.load(), 0u);
}

// A READ request lost, the later ones deferred by the responder behind it (it executes no
// READ beyond a gap) and NAKed; the requester resends them, and the resend of the first is
// lost too. Nothing else would reveal it: 1.5 SRTT later it goes once more (the resend check,
// as for a SEND/WRITE resend) — no probe, no retransmit timeout.
TEST_F(TransportTest, AResentReadRequestLostAgainIsSentOnceMore) {
  constexpr uint64_t kRtt = 1'000'000;
  start_selective_after_one_rtt(kRtt);
  ASSERT_EQ(drain().size(), 1u);
  for (uint64_t i = 0; i < 3; ++i)  // PSNs +1, +2, +3: one response each
    ASSERT_EQ(post(*a, WrOpcode::kRdmaRead, i * kMtu, kMtu, i * kMtu, 10 + i), kOk);
  lose(*ta, {1});
  deliver(*ta, *b, *tb);
  EXPECT_TRUE(b->resp.ooo) << "the responder saw the gap";
  deliver(*tb, *a, *ta);  // its selective NAKs: the requester resends
  ASSERT_FALSE(ta->sent.empty());
  EXPECT_EQ(parse(ta->sent[0]).hdr.bth.psn, wire::psn_add(kSqPsn, 1));
  lose(*ta, {1});  // the first resend is lost again
  deliver(*ta, *b, *tb);
  deliver(*tb, *a, *ta);
  EXPECT_TRUE(drain().empty());
  ta->sent.clear();
  ta->advance(completer::resend_check_ns(*a) + 1000);
  run_requester_timers();
  ASSERT_FALSE(ta->sent.empty());
  EXPECT_EQ(parse(ta->sent[0]).hdr.bth.psn, wire::psn_add(kSqPsn, 1)) << "the oldest, again";
  settle();
  expect_completed({10, 11, 12});
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 3 * kMtu), 0);
  EXPECT_EQ(ta->counters_.retransmit_timeouts.load(), 0u);
  EXPECT_EQ(ta->counters_.tail_loss_probes.load(), 0u);
}

class TailLossTest : public TransportTest {
 protected:
  static constexpr uint64_t kRtt = 10'000'000;  // 10 ms; the retransmit timeout is 67 ms
  void SetUp() override {
    TransportTest::SetUp();
    ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, kMtu, 0, 1), kOk);
    ta->advance(kRtt);
    settle();
    ASSERT_EQ(drain().size(), 1u);
    ASSERT_EQ(a->req.window.srtt_ns(), kRtt);
    ASSERT_EQ(completer::probe_timeout_ns(*a), 2 * kRtt);
    ASSERT_LT(2 * kRtt, a->retransmit_timeout_ns());
  }
  // Moves the requester's clock `ns` on and fires its due timers.
  void wait(uint64_t ns) {
    ta->advance(ns);
    run_requester_timers();
  }
};

// A go-back-N responder (no selective NAK seen): the probe is the oldest unacknowledged PSN,
// which any IBTA responder answers — here a duplicate, ACKed with its expected PSN - 1 — and
// the ACK that stops short of what was sent before the probe starts go-back-N from there.
TEST_F(TailLossTest, LostTailPacketsCostAProbeAndOneRoundTripNotATimeout) {
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, kMtu, 8 * kMtu, kMtu, 2), kOk);
  lose(*ta, {7, 8});  // the message's last two packets (PSN +1 was the first message)
  deliver(*ta, *b, *tb);
  EXPECT_TRUE(tb->sent.empty()) << "the lost last packet asked for the ACK: none comes";
  wait(2 * kRtt - 1000);
  EXPECT_TRUE(ta->sent.empty()) << "no probe before 2 RTT";
  wait(2000);
  ASSERT_EQ(ta->sent.size(), 1u);
  wire::Packet p = parse(ta->sent[0]);
  EXPECT_EQ(p.hdr.bth.psn, wire::psn_add(kSqPsn, 1)) << "the oldest unacknowledged PSN";
  EXPECT_TRUE(p.hdr.bth.ack_req);
  EXPECT_EQ(ta->counters_.tail_loss_probes.load(), 1u);
  EXPECT_EQ(a->req.recovery, Recovery::kProbe);
  deliver(*ta, *b, *tb);  // a duplicate: ACKed up to +6, what the responder has
  ASSERT_EQ(tb->sent.size(), 1u);
  const wire::Packet ack = parse(tb->sent[0]);
  EXPECT_EQ(wire::aeth_kind(ack.hdr.aeth.syndrome), wire::AckKind::kAck) << "an ACK, not a NAK";
  EXPECT_EQ(ack.hdr.bth.psn, wire::psn_add(kSqPsn, 6));
  deliver(*tb, *a, *ta);  // stops short of +8: go back to +7
  EXPECT_EQ(a->req.recovery, Recovery::kGoBackN);
  EXPECT_EQ(ta->counters_.partial_ack_rewinds.load(), 1u);
  ASSERT_EQ(ta->sent.size(), 2u);
  EXPECT_EQ(parse(ta->sent[0]).hdr.bth.psn, wire::psn_add(kSqPsn, 7));
  settle();
  auto c = drain();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].wr_id, 2u);
  EXPECT_EQ(c[0].status, WcStatus::kSuccess);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 9 * kMtu), 0);
  EXPECT_EQ(ta->counters_.retransmit_timeouts.load(), 0u);
  EXPECT_EQ(a->req.recovery, Recovery::kNone);
}

// The same responder's one sequence NAK for a gap is lost: it drops everything after the gap
// in silence, the last PSN again included (not below the highest it saw since the NAK). The
// probe of the oldest PSN still draws an ACK, and the go-back-N it starts repairs the gap in
// one round trip instead of the retransmit timeout (seen once in ~40 loaded runs of
// WanBulkWrite's go-back-N cases before).
TEST_F(TailLossTest, ALostSequenceNakCostsAProbeAndOneRoundTripNotATimeout) {
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, kMtu, 8 * kMtu, kMtu, 2), kOk);
  lose(*ta, {3});
  deliver(*ta, *b, *tb);
  ASSERT_EQ(tb->sent.size(), 1u);
  EXPECT_EQ(parse(tb->sent[0]).hdr.aeth.syndrome, wire::aeth_nak(wire::NakCode::kPsnSequenceError));
  tb->sent.clear();  // the NAK is lost
  wait(2 * kRtt + 1000);
  ASSERT_EQ(ta->sent.size(), 1u);
  EXPECT_EQ(parse(ta->sent[0]).hdr.bth.psn, wire::psn_add(kSqPsn, 1));
  deliver(*ta, *b, *tb);
  ASSERT_EQ(tb->sent.size(), 1u) << "the probe drew no answer";
  EXPECT_EQ(parse(tb->sent[0]).hdr.bth.psn, wire::psn_add(kSqPsn, 2)) << "ACK up to the gap";
  settle();
  expect_completed({2});
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 9 * kMtu), 0);
  EXPECT_EQ(ta->counters_.retransmit_timeouts.load(), 0u);
  EXPECT_EQ(ta->counters_.tail_loss_probes.load(), 1u);
  EXPECT_EQ(ta->counters_.partial_ack_rewinds.load(), 1u);
}

// The head itself lost with its NAK: the probe fills the gap, the ACK for it alone stops
// short, and go-back-N sends the rest again.
TEST_F(TailLossTest, TheProbeFillsALostHeadAndTheRestFollows) {
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, kMtu, 4 * kMtu, kMtu, 2), kOk);
  lose(*ta, {1});
  deliver(*ta, *b, *tb);
  tb->sent.clear();  // its NAK is lost
  wait(2 * kRtt + 1000);
  ASSERT_EQ(ta->sent.size(), 1u);
  EXPECT_EQ(parse(ta->sent[0]).hdr.bth.psn, wire::psn_add(kSqPsn, 1));
  deliver(*ta, *b, *tb);
  ASSERT_EQ(tb->sent.size(), 1u);
  EXPECT_EQ(parse(tb->sent[0]).hdr.bth.psn, wire::psn_add(kSqPsn, 1)) << "taken in order";
  settle();
  expect_completed({2});
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 5 * kMtu), 0);
  EXPECT_EQ(ta->counters_.retransmit_timeouts.load(), 0u);
}

// A responder that has sent selective NAKs keeps what arrives beyond a gap and answers every
// request asking for an ACK, so there the probe is the last PSN, as RACK-TLP sends it: its
// selective ACK names every hole at once.
TEST_F(TailLossTest, ToASelectiveResponderTheProbeIsTheLastPsn) {
  ta->selective = tb->selective = true;
  a->comp.peer_selective = true;  // as after its first selective NAK
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, kMtu, 8 * kMtu, kMtu, 2), kOk);
  lose(*ta, {7, 8});
  deliver(*ta, *b, *tb);
  wait(2 * kRtt + 1000);
  // The resend check sent the head at 1.5 SRTT (its selective NAK may have been lost; the
  // responder has it: a duplicate), the probe at 2 SRTT.
  ASSERT_EQ(ta->sent.size(), 2u);
  EXPECT_EQ(parse(ta->sent[0]).hdr.bth.psn, wire::psn_add(kSqPsn, 1));
  EXPECT_EQ(parse(ta->sent[1]).hdr.bth.psn, wire::psn_add(kSqPsn, 8)) << "the probe: the last";
  EXPECT_EQ(ta->counters_.tail_loss_probes.load(), 1u);
  settle();
  expect_completed({2});
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 9 * kMtu), 0);
  EXPECT_EQ(ta->counters_.retransmit_timeouts.load(), 0u);
}

TEST_F(TailLossTest, ALostAckIsAnsweredByTheProbesDuplicate) {
  ASSERT_EQ(post(*a, WrOpcode::kSend, 0, 3 * kMtu, 0, 2), kOk);
  post_recv(*b, 3 * kMtu);
  deliver(*ta, *b, *tb);
  ASSERT_EQ(drain().size(), 1u);  // the receive completed...
  tb->sent.clear();               // ...and its ACK was lost
  wait(2 * kRtt + 1000);
  ASSERT_EQ(ta->sent.size(), 1u);
  EXPECT_EQ(parse(ta->sent[0]).hdr.bth.psn, wire::psn_add(kSqPsn, 1)) << "the oldest";
  settle();  // a duplicate with AckReq: re-acknowledged, not received twice
  auto c = drain();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].wr_id, 2u);
  EXPECT_EQ(c[0].opcode, WcOpcode::kSend);
  EXPECT_EQ(ta->counters_.retransmit_timeouts.load(), 0u);
  EXPECT_EQ(ta->counters_.tail_loss_probes.load(), 1u);
  EXPECT_EQ(ta->counters_.partial_ack_rewinds.load(), 0u) << "the ACK covered everything";
}

TEST_F(TailLossTest, LostLastReadResponsesAreRequestedAgainAfterTheProbe) {
  constexpr uint32_t kLen = 8 * kMtu;
  ASSERT_EQ(post(*a, WrOpcode::kRdmaRead, 0, kLen, 0, 2), kOk);
  deliver(*ta, *b, *tb);
  lose(*tb, {7, 8});  // the last two READ responses
  deliver(*tb, *a, *ta);
  EXPECT_TRUE(ta->sent.empty());
  wait(2 * kRtt + 1000);
  ASSERT_EQ(ta->sent.size(), 1u);
  wire::Packet rr = parse(ta->sent[0]);
  EXPECT_EQ(rr.hdr.bth.psn, wire::psn_add(kSqPsn, 7)) << "a READ for the missing responses";
  EXPECT_EQ(rr.hdr.reth.va, reinterpret_cast<uintptr_t>(src.data()) + 6 * kMtu);
  settle();
  auto c = drain();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].opcode, WcOpcode::kRdmaRead);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), kLen), 0);
  EXPECT_EQ(ta->counters_.retransmit_timeouts.load(), 0u);
}

// Selective mode, a READ at the oldest unanswered PSN: the probe asks for what that READ's
// chunk misses, not everything from it (go-back-N re-requested every response still on the
// path). Here READ 2's request was lost as well: a second probe, after the first one's
// answer moved the head, asks for READ 2 (executed as new), still without a timeout.
TEST_F(TailLossTest, WithSelectiveModeTheProbeAsksForTheHeadReadsMissingResponsesAlone) {
  ta->selective = tb->selective = true;
  ASSERT_EQ(post(*a, WrOpcode::kRdmaRead, 0, 4 * kMtu, 0, 2), kOk);                // +1 … +4
  ASSERT_EQ(post(*a, WrOpcode::kRdmaRead, 4 * kMtu, 4 * kMtu, 4 * kMtu, 3), kOk);  // +5 … +8
  lose(*ta, {5});  // READ 2's request
  deliver(*ta, *b, *tb);
  lose(*tb, {3, 4});  // READ 1's last two responses
  deliver(*tb, *a, *ta);
  EXPECT_TRUE(ta->sent.empty()) << "nothing beyond the gap came";
  wait(completer::probe_timeout_ns(*a) + 1000);
  ASSERT_EQ(ta->sent.size(), 1u);
  const wire::Packet rr = parse(ta->sent[0]);
  EXPECT_EQ(rr.hdr.bth.psn, wire::psn_add(kSqPsn, 3));
  EXPECT_EQ(rr.hdr.reth.dma_length, 2 * kMtu) << "READ 1's missing responses, not READ 2";
  EXPECT_EQ(a->req.recovery, Recovery::kProbe);
  settle();
  expect_completed({2});
  wait(completer::probe_timeout_ns(*a) + 1000);
  ASSERT_EQ(ta->sent.size(), 1u);
  const wire::Packet r2 = parse(ta->sent[0]);
  EXPECT_EQ(r2.hdr.bth.psn, wire::psn_add(kSqPsn, 5));
  EXPECT_EQ(r2.hdr.reth.dma_length, 4 * kMtu);
  settle();
  expect_completed({3});
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 8 * kMtu), 0);
  EXPECT_EQ(ta->counters_.tail_loss_probes.load(), 2u);
  EXPECT_EQ(ta->counters_.retransmit_timeouts.load(), 0u);
}

// A standing queue can double the round trip: the probe then comes at half the retransmit
// timeout, not with it (2 SRTT reached the timeout itself at 1 Gbit/s × 20 ms with a full
// one-BDP queue, and the probe recovered nothing before it).
TEST_F(TailLossTest, TheProbeComesAtHalfTheRetransmitTimeoutAtTheLatest) {
  const uint64_t rto = a->retransmit_timeout_ns();
  for (int i = 0; i < 64; ++i) a->req.window.on_rtt_sample(rto * 3 / 4);
  ASSERT_GT(2 * a->req.window.srtt_ns(), rto);
  EXPECT_EQ(completer::probe_timeout_ns(*a), rto / 2);
}

TEST_F(TailLossTest, OneProbePerStallThenTheRetransmitTimerRecovers) {
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, kMtu, 4 * kMtu, kMtu, 2), kOk);
  ta->sent.clear();  // all four lost
  wait(2 * kRtt + 1000);
  ASSERT_EQ(ta->sent.size(), 1u);
  ta->sent.clear();  // the probe too
  wait(2 * kRtt + 1000);
  EXPECT_TRUE(ta->sent.empty()) << "no second probe without an ACK";
  wait(a->retransmit_timeout_ns());
  ASSERT_FALSE(ta->sent.empty());
  EXPECT_EQ(ta->counters_.retransmit_timeouts.load(), 1u);
  settle();
  ASSERT_EQ(drain().size(), 1u);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 5 * kMtu), 0);
}

// ---- Windows for long fat pipes (issue 23 item 3) --------------------------------------

// The window beyond 2^16 PSNs: path MTU 256, so that 2^17 packets in flight are 32 MiB; dst
// holds one 1 MiB region per WRITE, so that every placement is checked where it landed.
class LongWindowTest : public TransportTest {
 protected:
  static constexpr uint32_t kPkt = 256;              // path MTU, bytes
  static constexpr uint32_t kMsg = 1 << 20;          // one WRITE: all of src
  static constexpr uint32_t kMsgPsns = kMsg / kPkt;  // 4,096
  LongWindowTest() { path_mtu = 1; }
  void SetUp() override {
    TransportTest::SetUp();
    mr_dst.reset();
    dst.assign(size_t{40} << 20, 0);
    mr_dst = std::make_unique<MemoryRegion>(*pd, dst.data(), dst.size(),
                                            reinterpret_cast<uintptr_t>(dst.data()), kAll);
  }
  // The requester's window grown to `psns`, as acknowledged PSNs in slow start grow it.
  void grow_window(uint32_t psns) {
    a->req.window.on_acked(psns - a->req.window.psns());
    ASSERT_EQ(a->req.window.psns(), psns);
  }
  // WRITEs `first` … `first + n - 1` of all of src, WRITE i to dst's region i + 1.
  void post_writes(int first, int n) {
    for (int i = first; i < first + n; ++i)
      ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, kMsg, uint64_t(i + 1) * kMsg, uint64_t(i)), kOk);
  }
  // Completions until the CQ is empty.
  std::vector<Cqe> drain_all() {
    std::vector<Cqe> all;
    for (auto c = drain(); !c.empty(); c = drain()) all.insert(all.end(), c.begin(), c.end());
    return all;
  }
  // Every WRITE `first` … `first + n - 1` completed in order, and its region holds src.
  void expect_written(const std::vector<Cqe>& c, int first, int n) {
    ASSERT_EQ(c.size(), size_t(n));
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(c[i].status, WcStatus::kSuccess);
      EXPECT_EQ(c[i].wr_id, uint64_t(first + i)) << "completions in order";
      EXPECT_EQ(std::memcmp(dst.data() + uint64_t(first + i + 1) * kMsg, src.data(), kMsg), 0)
          << "WRITE " << first + i;
    }
  }
  // A second later (ReceivedPsns::kKeepSpanNs) WRITE `id` arrives in order: the idle
  // responder's tracking goes back to its first span, 4.5 KiB.
  void idle_for_a_second(int id) {
    ASSERT_TRUE(b->resp.ooo);
    tb->advance(ReceivedPsns::kKeepSpanNs);
    ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, kPkt, uint64_t(id + 1) * kMsg, uint64_t(id)), kOk);
    settle();
    ASSERT_EQ(drain_all().size(), 1u);
    EXPECT_EQ(b->resp.ooo->span(), ReceivedPsns::kMinSpanPsns);
    EXPECT_EQ(b->resp.ooo->memory_bytes(), size_t{ReceivedPsns::kMinSpanPsns} * 9 / 2);
  }
  static uint32_t offset(const std::vector<uint8_t>& b) {
    return uint32_t(wire::psn_diff(parse(b).hdr.bth.psn, kSqPsn));
  }
};

// A window of 2^17 PSNs (twice the old ceiling) goes out whole, its PSNs across the 24-bit
// wrap (the first is 0xfffff0), and the ACKs slide it: each acknowledged PSN lets the next
// ones go, and all 34 WRITEs (139,264 PSNs) arrive where they belong.
TEST_F(LongWindowTest, AWindowOf2To17PsnsGoesOutAcrossThePsnWrapAndAcksSlideIt) {
  constexpr uint32_t kWindow = 1u << 17;
  grow_window(kWindow);
  post_writes(0, 34);
  ASSERT_EQ(ta->sent.size(), kWindow) << "the whole window in flight";
  EXPECT_EQ(parse(ta->sent.front()).hdr.bth.psn, kSqPsn);
  EXPECT_EQ(parse(ta->sent.back()).hdr.bth.psn, wire::psn_add(kSqPsn, kWindow - 1));
  EXPECT_LT(parse(ta->sent.back()).hdr.bth.psn, kSqPsn) << "the PSNs wrapped";
  deliver(*ta, *b, *tb);
  EXPECT_EQ(b->resp.epsn, wire::psn_add(kSqPsn, kWindow));
  deliver(*tb, *a, *ta);  // the ACKs: the window slides (and grows: slow start)
  EXPECT_EQ(a->comp.psn, wire::psn_add(kSqPsn, kWindow));
  EXPECT_EQ(ta->sent.size(), 34 * kMsgPsns - kWindow) << "the rest, as the ACKs opened room";
  EXPECT_GT(a->req.window.psns(), kWindow);
  settle();
  expect_written(drain_all(), 0, 34);
  EXPECT_EQ(ta->counters_.retransmitted_pkts.load(), 0u);
}

// Selective recovery inside a window of 2^17 PSNs: +10 and +100,000 are lost. The responder
// places everything else out of order — up to 131,061 PSNs beyond its expected PSN, its
// tracking grown to 2^17 PSNs (576 KiB) — and reports just those two; only they are sent
// again; a second after the gap closed the tracking goes back to its first 1,024 PSNs.
TEST_F(LongWindowTest, ALoss100000PsnsIntoTheWindowIsPlacedAroundAndNakedSelectively) {
  constexpr uint32_t kWindow = 1u << 17;
  ta->selective = tb->selective = true;
  grow_window(kWindow);
  post_writes(0, 33);
  ASSERT_EQ(ta->sent.size(), kWindow);
  lose(*ta, {10, 100000});
  deliver(*ta, *b, *tb);
  const std::vector<std::pair<uint32_t, uint32_t>> naks = selective_naks(*tb);
  const std::vector<std::pair<uint32_t, uint32_t>> want{{10, 10}, {100000, 100000}};
  EXPECT_EQ(naks, want);
  EXPECT_EQ(tb->counters_.ooo_placed.load(), kWindow - 12);
  EXPECT_EQ(tb->counters_.ooo_beyond_span.load(), 0u);
  ASSERT_TRUE(b->resp.ooo);
  EXPECT_EQ(b->resp.ooo->span(), 1u << 17) << "grown to the distance seen, 131,061 PSNs";
  EXPECT_EQ(b->resp.ooo->memory_bytes(), (size_t{1} << 17) * 9 / 2);
  EXPECT_EQ(b->resp.epsn, wire::psn_add(kSqPsn, 10));
  deliver(*tb, *a, *ta);
  std::vector<uint32_t> resent;
  for (const auto& bytes : ta->sent)
    if (offset(bytes) < kWindow) resent.push_back(offset(bytes));
  EXPECT_EQ(resent, (std::vector<uint32_t>{10, 100000})) << "only the two lost PSNs again";
  settle();
  expect_written(drain_all(), 0, 33);
  EXPECT_EQ(ta->counters_.retransmitted_pkts.load(), 2u);
  // The ACK of +0 … +9 let 20 more PSNs go before the NAKs halved the window: +131,091 is
  // 131,081 beyond +10, so the ring doubled once more; it is kept a while (losses recur).
  EXPECT_EQ(b->resp.ooo->span(), 1u << 18);
  idle_for_a_second(33);
}

// The responder's tracking capped at 2^12 PSNs (Transport::ooo_max_psns) under a window of
// 2^13: with +5 lost, it grows to 2^12 PSNs (18 KiB) and no further; the 4,095 packets
// beyond are dropped and counted, and recovered afterwards (the resend check, go-back-N
// from where the responder stands) without a retransmit timeout.
TEST_F(LongWindowTest, TrackingGrowsWithTheGapUpToItsCapAndPacketsBeyondAreDroppedThenRecovered) {
  constexpr uint32_t kCap = 1u << 12;
  tb->ooo_max = kCap;
  start_selective_after_one_rtt(100'000);  // a 1 KiB WRITE: PSNs +0 … +3
  ASSERT_EQ(drain().size(), 1u);
  grow_window(2 * kCap);
  post_writes(0, 2);  // PSNs +4 … +8,195
  ASSERT_EQ(ta->sent.size(), 2 * kCap);
  lose(*ta, {5});
  deliver(*ta, *b, *tb);
  ASSERT_TRUE(b->resp.ooo);
  EXPECT_EQ(b->resp.ooo->span(), kCap);
  EXPECT_EQ(b->resp.ooo->memory_bytes(), size_t{kCap} * 9 / 2);
  EXPECT_EQ(tb->counters_.ooo_placed.load(), kCap - 1);       // +6 … +4,100
  EXPECT_EQ(tb->counters_.ooo_beyond_span.load(), kCap - 1);  // +4,101 … +8,195
  std::vector<Cqe> c;
  for (int i = 0; i < 100 && c.size() < 2; ++i) {
    settle();
    for (const Cqe& e : drain_all()) c.push_back(e);
    ta->advance(1'000'000);
    tb->advance(1'000'000);
    run_requester_timers();
  }
  expect_written(c, 0, 2);
  EXPECT_EQ(ta->counters_.retransmit_timeouts.load(), 0u);
  EXPECT_EQ(a->attr.state, QpState::kRts);
  idle_for_a_second(2);
}

// The ring keeps every state of every PSN when it grows, across the PSN wrap; it refuses a
// distance at or beyond its cap, and shrinks back when idle.
TEST(ReceivedPsnsTest, GrowsOnDemandKeepingEveryStateAcrossThePsnWrapUpToItsCap) {
  constexpr uint64_t kT = 5'000'000'000;  // ns
  ReceivedPsns o(1u << 14);
  const uint32_t e = 0xffff00;  // the expected PSN; e + 256 wraps to 0
  const auto at = [&](uint32_t d) { return wire::psn_add(e, d); };
  o.sync(e);
  o.next = e;
  EXPECT_EQ(o.span(), ReceivedPsns::kMinSpanPsns);
  EXPECT_EQ(o.memory_bytes(), size_t{ReceivedPsns::kMinSpanPsns} * 9 / 2);
  ASSERT_TRUE(o.reach(e, 1000, kT));
  EXPECT_EQ(o.span(), ReceivedPsns::kMinSpanPsns) << "within the first span";
  o.mark_placed(at(300), true, 0x12345678);
  o.mark_placed(at(301), false, 0x9abcdef0);
  o.mark_placed(at(1000), false, 0x55);
  o.mark_placed(at(301), false, 0x9abcdef0);  // again: counted once
  EXPECT_EQ(o.placed_count(), 3u);
  o.mark_contested(at(1000));
  EXPECT_EQ(o.placed_count(), 2u) << "a contested PSN is no longer placed";
  o.mark_reported_range(at(1), at(299));
  ASSERT_TRUE(o.reach(e, 5000, kT));  // grows to 8,192: 1,000 and 5,000 now differ mod span
  EXPECT_EQ(o.span(), 8192u);
  EXPECT_EQ(o.placed_count(), 2u) << "kept across the growth";
  o.mark_placed(at(5000), true, 0x77);
  EXPECT_EQ(o.placed_count(), 3u);
  EXPECT_TRUE(o.placed(at(300)) && o.ends_message(at(300)));
  EXPECT_EQ(o.digest(at(300)), 0x12345678u);
  EXPECT_TRUE(o.placed(at(301)) && !o.ends_message(at(301)));
  EXPECT_EQ(o.digest(at(301)), 0x9abcdef0u);
  EXPECT_TRUE(o.contested(at(1000)) && !o.placed(at(1000)));
  EXPECT_FALSE(o.reported(e));
  EXPECT_TRUE(o.reported(at(1)) && o.reported(at(255)) && o.reported(at(256)) &&
              o.reported(at(299)));
  EXPECT_FALSE(o.placed(at(300 + 1024))) << "no state copied to a PSN a span further";
  EXPECT_FALSE(o.contested(at(1000 - 1024)));
  EXPECT_EQ(o.first_marked(at(302), at(6000)), at(5000));
  EXPECT_FALSE(o.reach(e, 1u << 14, kT)) << "the cap";
  ASSERT_TRUE(o.reach(e, (1u << 14) - 1, kT));
  EXPECT_EQ(o.span(), 1u << 14);
  EXPECT_EQ(o.memory_bytes(), (size_t{1} << 14) * 9 / 2);
  EXPECT_EQ(o.digest(at(5000)), 0x77u);
  EXPECT_TRUE(o.placed(at(301)) && o.contested(at(1000)) && o.reported(at(299)));
  o.mark_placed(at(7000), false, 0x1);
  o.unplace(at(7000));
  o.unplace(at(7000));
  EXPECT_EQ(o.placed_count(), 3u);
  EXPECT_EQ(o.clear_range(e, at(6000)), 3u);
  EXPECT_EQ(o.placed_count(), 0u);
  EXPECT_EQ(o.first_marked(e, at(6000)), at(6000));
  o.shrink_when_idle(kT + ReceivedPsns::kKeepSpanNs - 1);
  EXPECT_EQ(o.span(), 1u << 14) << "kept while recently needed";
  o.shrink_when_idle(kT + ReceivedPsns::kKeepSpanNs);
  EXPECT_EQ(o.span(), ReceivedPsns::kMinSpanPsns);
  EXPECT_EQ(o.memory_bytes(), size_t{ReceivedPsns::kMinSpanPsns} * 9 / 2);
}

// The runs a selective ACK lists: the PSNs not placed from the expected one up to the highest
// received, oldest first, at most as many as asked, across the PSN wrap.
TEST(ReceivedPsnsTest, MissingRunsAreTheUnplacedPsnsBelowNextOldestFirst) {
  ReceivedPsns o;
  const uint32_t e = 0xffffc0;  // e + 64 wraps to 0
  const auto at = [&](uint32_t d) { return wire::psn_add(e, d); };
  o.sync(e);
  o.next = e;
  std::vector<std::pair<uint32_t, uint32_t>> runs;
  const auto list = [&](uint32_t max) {
    runs.clear();
    o.missing_runs(e, max, [&](uint32_t f, uint32_t l) { runs.emplace_back(f, l); });
  };
  list(16);
  EXPECT_TRUE(runs.empty()) << "nothing beyond the expected PSN";
  for (uint32_t d : {1, 2, 70, 71, 72, 200}) o.mark_placed(at(d), false, 0);
  o.next = at(201);
  list(16);
  using R = std::vector<std::pair<uint32_t, uint32_t>>;
  EXPECT_EQ(runs, (R{{at(0), at(0)}, {at(3), at(69)}, {at(73), at(199)}}));
  EXPECT_EQ(o.first_unplaced(at(1), o.next), at(3));
  EXPECT_EQ(o.first_unplaced(at(200), o.next), o.next);
  list(2);
  EXPECT_EQ(runs, (R{{at(0), at(0)}, {at(3), at(69)}}));
}

// Staged requests: a copy of the payload each, found by PSN across the wrap, capped in bytes,
// and forgotten with their PSN's state (consumed, contested, unplaced, a range forgotten).
TEST(ReceivedPsnsTest, StagedRequestsAreCopiedCappedAndForgottenWithTheirPsn) {
  constexpr size_t kCap = 64 * 4096;
  ReceivedPsns o(ReceivedPsns::kMaxSpanPsns, kCap);
  const uint32_t e = 0xfffffe;  // e + 2 wraps to 0
  const auto at = [&](uint32_t d) { return wire::psn_add(e, d); };
  o.sync(e);
  std::vector<uint8_t> bytes(4096, 0x5a);
  wire::Packet pkt;
  pkt.info = wire::opcode_info(uint8_t(Opcode::kSendOnly));
  pkt.payload = bytes;
  for (uint32_t d = 1; d <= 5; ++d) {
    pkt.hdr.bth.psn = at(d);
    ASSERT_TRUE(o.stage(at(d), pkt));
  }
  bytes.assign(bytes.size(), 0);  // the copy is the staged one's own
  EXPECT_EQ(o.staged_bytes(), 5u * 4096);
  EXPECT_TRUE(o.staged(at(3)));
  EXPECT_FALSE(o.staged(at(6)));
  std::optional<StagedRequest> r = o.take_staged(at(3));
  ASSERT_TRUE(r.has_value());
  const wire::Packet p = r->packet();
  EXPECT_EQ(p.hdr.bth.psn, at(3));
  ASSERT_EQ(p.payload.size(), 4096u);
  EXPECT_EQ(p.payload[4095], 0x5a);
  EXPECT_FALSE(o.staged(at(3)));
  EXPECT_EQ(o.staged_bytes(), 4u * 4096);
  o.clear(at(1));
  o.mark_contested(at(2));
  o.unplace(at(4));
  EXPECT_EQ(o.staged_bytes(), 4096u);
  o.clear_range(at(5), at(6));
  EXPECT_EQ(o.staged_bytes(), 0u);
  // The cap: payload bytes beyond kMaxStagedBytes are refused, nothing kept.
  uint32_t kept = 0;
  const uint32_t fits = uint32_t(kCap / bytes.size());
  for (uint32_t d = 1; d <= fits + 1; ++d) kept += o.stage(at(d), pkt) ? 1 : 0;
  EXPECT_EQ(kept, fits);
  EXPECT_FALSE(o.staged(at(fits + 1)));
  EXPECT_EQ(o.staged_bytes(), kCap);
}

// The ACKs of one flight of the window `w` holds now, one per 32 PSNs, from `start_ns` on,
// `ns_per_psn` apart (the bottleneck's spacing, or less where they came back bunched).
void ack_flight(CongestionWindow& w, uint64_t start_ns, double ns_per_psn) {
  const uint32_t flight = w.psns();
  uint64_t t = start_ns;
  for (uint32_t acked = 0; acked < flight; acked += 32) {
    const uint32_t n = std::min<uint32_t>(32, flight - acked);
    w.on_delivered(n, t);
    w.on_acked(n);
    t += uint64_t(n * ns_per_psn);
  }
}

// The path of the train tests below: 1 Gbit/s of 4 KiB packets over a 20 ms round trip.
namespace gig_path {
constexpr double kPsnsPerNs = 1e9 / 8 / 4096 / 1e9;
constexpr uint64_t kRtt = 20'000'000;
constexpr uint32_t kBdp = uint32_t(kPsnsPerNs * kRtt);  // 610
}  // namespace gig_path

// Only the first measured train's flight left as a burst into an idle path: a later train
// whose ACKs were bunched on the way back (a busy receiver, a late emulator) raises the
// window no further than the first train's rate allows, and the requester's pacer in slow
// start follows that rate (train_rate). At 1 Gbit/s × 20 ms the second round's 4× raise from
// such a train overflowed a one-BDP queue by 1,500–1,900 packets.
TEST(CongestionWindowTest, ALaterTrainBunchedOnTheWayBackRaisesTheWindowNoFurther) {
  using namespace gig_path;
  CongestionWindow w;
  w.on_rtt_sample(kRtt);
  uint64_t now = 1'000'000'000;
  const auto round = [&](double ns_per_psn) {
    ack_flight(w, now, ns_per_psn);
    now += kRtt;
  };
  round(1 / kPsnsPerNs);  // spaced by the bottleneck
  EXPECT_NEAR(w.train_rate(), kPsnsPerNs, kPsnsPerNs / 20);
  EXPECT_LE(w.psns(), kBdp + 32);
  round(1 / kPsnsPerNs / 50);  // bunched: 50× the link's rate
  EXPECT_NEAR(w.train_rate(), kPsnsPerNs, kPsnsPerNs / 20);
  EXPECT_LE(w.psns(), kBdp * 3 / 2 + 32) << "raised by a bunched train";
  EXPECT_LE(w.threshold(), kBdp * 3 / 2 + 32) << "slow start goes on past 1.5 BDPs";
}

// An ACK of a lone packet sent before the sender went idle (kv's zero-length path probe) is
// not the origin of the ACK train of the flight sent after the gap: timed from it, that
// train spread over the idle gap and read a 1 Gbit/s path at a fraction of its rate (kv-demo
// over 10 Gbit/s × 50 ms: 80 Mbit/s, slow start over at 196 PSNs, the hand-off 1.8 s).
TEST(CongestionWindowTest, AnAckOfAPacketSentBeforeAnIdleGapStartsNoTrain) {
  using namespace gig_path;
  for (const bool told : {true, false}) {
    CongestionWindow w;
    w.on_rtt_sample(kRtt);
    ASSERT_EQ(w.idle_gap_ns(), kRtt / CongestionWindow::kIdleGapDivisor);
    uint64_t now = 1'000'000'000;
    w.on_delivered(1, now, /*train_origin=*/!told);  // the probe's ACK, sent before the gap
    now += kRtt / 2;  // the flight left half a round trip after the probe
    ack_flight(w, now, 1 / kPsnsPerNs);
    if (told) {
      EXPECT_NEAR(w.train_rate(), kPsnsPerNs, kPsnsPerNs / 20);
      EXPECT_GE(w.psns(), 4 * CongestionWindow::kInitialPsns) << "the train's ×4";
    } else {
      EXPECT_LT(w.train_rate(), kPsnsPerNs / 2) << "timed from the probe's ACK: the gap";
    }
  }
}

// A train ends at a pause in its ACKs: an ACK a pause longer than idle_gap_ns() and 8 mean
// spacings after the flight's is for PSNs sent after a pause of the sender's own (kv: 2 PSNs
// that a late ACK let out 24 ms after the flight), and counted it would stretch the train
// over the pause — the first train's estimate, and so slow start's exit at 1.5 BDPs of it,
// would fall to a third of the path.
TEST(CongestionWindowTest, AnAckAfterAPauseInTheTrainEndsItWithWhatItMeasured) {
  using namespace gig_path;
  CongestionWindow w;
  w.on_rtt_sample(kRtt);
  const uint64_t now = 1'000'000'000;
  ack_flight(w, now, 1 / kPsnsPerNs);  // 128 PSNs in 4.2 ms, an ACK per 32
  const double rate = w.train_rate();
  ASSERT_NEAR(rate, kPsnsPerNs, kPsnsPerNs / 20);
  // Within the round (20 ms), 14 ms after the flight's last ACK: more than idle_gap_ns()
  // (2.5 ms) and 8 mean spacings (the flight's ACKs came 1 ms apart).
  const uint64_t straggler = now + kRtt * 9 / 10;
  ASSERT_GT(straggler - now - uint64_t(128 / kPsnsPerNs), w.idle_gap_ns());
  w.on_delivered(2, straggler);
  w.on_acked(2);
  EXPECT_EQ(w.train_rate(), rate) << "the train was stretched over the pause";
  w.on_delivered(32, straggler + 1'000'000);  // nor does it count what follows
  w.on_acked(32);
  EXPECT_EQ(w.train_rate(), rate);
}

// The first train's ACKs came back compressed (at twice the link's rate: a busy receiver, a
// late emulator), so the jump at its end puts two BDPs in flight; the next train, spaced by
// the bottleneck, takes it back to 1.5 BDPs of what it showed and ends slow start there —
// within the one-BDP queue's room, where unchecked the window would have gone on to 3 BDPs
// (slow start's exit at 1.5 of the first train's BDPs) and overflowed it.
TEST(CongestionWindowTest, AJumpTheNextTrainDisprovesIsTakenBack) {
  using namespace gig_path;
  CongestionWindow w;
  w.on_rtt_sample(kRtt);
  uint64_t now = 1'000'000'000;
  ack_flight(w, now, 1 / kPsnsPerNs / 2);  // compressed: twice the link's rate
  now += kRtt;
  EXPECT_NEAR(w.train_rate(), 2 * kPsnsPerNs, kPsnsPerNs / 10);
  w.on_delivered(32, now);  // the next train's first ACK: the jump
  w.on_acked(32);
  EXPECT_GE(w.psns(), 2 * kBdp - 8) << "no jump to the first train's estimate";
  ack_flight(w, now + uint64_t(32 / kPsnsPerNs), 1 / kPsnsPerNs);  // spaced by the bottleneck
  EXPECT_NEAR(w.train_rate(), kPsnsPerNs, kPsnsPerNs / 10);
  EXPECT_LE(w.threshold(), kBdp * 3 / 2 + 2) << "the overestimated jump stands";
  EXPECT_GE(w.threshold(), kBdp * 3 / 2 - 8);
  // What the flight's remaining ACKs add is congestion avoidance's: the round trip shows no
  // queue, so 1/8 of the window per window acknowledged (on_acked).
  EXPECT_GE(w.psns(), w.threshold()) << "slow start goes on";
  EXPECT_LE(w.psns(), w.threshold() + w.threshold() / 8 + 1);
}

// QPs of one device starting towards one peer at once: their first flights reach the
// bottleneck one after the other, so each train shows the whole link, and each jumping to a
// whole BDP put two in flight (kv's 2 QPs over 100 Gbit/s × 50 ms overflowed the one-BDP
// queue at start-up). Sharing the jump (PathShare), the first takes the BDP, the second half
// of one, a third none; once the claims lapse (2 RTTs), a new QP jumps on the whole rate.
TEST(CongestionWindowTest, QpsStartingTowardsOnePeerShareOneJump) {
  using namespace gig_path;
  constexpr uint32_t kMtu = 4096;
  const auto start = [&](bool shared) {
    PathShare share;
    std::vector<CongestionWindow> w(3);
    uint64_t now = 1'000'000'000;
    for (CongestionWindow& x : w) {
      if (shared) x.set_path_share(&share, kMtu);
      x.on_rtt_sample(kRtt);
      ack_flight(x, now, 1 / kPsnsPerNs);  // each flight's train after the one before
      now += uint64_t(x.psns() / kPsnsPerNs);
      EXPECT_NEAR(x.train_rate(), kPsnsPerNs, kPsnsPerNs / 20) << "each saw the whole link";
    }
    now = 1'000'000'000 + kRtt;
    uint32_t sum = 0;
    for (CongestionWindow& x : w) {
      x.on_delivered(32, now);  // the next train's first ACK: the jump
      x.on_acked(32);
      sum += x.psns();
      now += 1'000;
    }
    return std::pair{sum, w[0].psns()};
  };
  const auto [alone_sum, alone_first] = start(false);
  EXPECT_GE(alone_sum, 3 * kBdp) << "unshared, each jumps to the whole BDP";
  const auto [sum, first] = start(true);
  EXPECT_GE(first, kBdp) << "the first QP's jump";
  EXPECT_LE(sum, kBdp * 3 / 2 + 3 * 5 * CongestionWindow::kInitialPsns)
      << "the jumps together past 1.5 BDPs (+ what the trains raised)";
  EXPECT_GE(sum, kBdp * 3 / 2) << "the second QP took no share";

  PathShare share;
  const double r = kPsnsPerNs * kMtu;
  EXPECT_DOUBLE_EQ(share.take(r, 0, kRtt), r);
  EXPECT_DOUBLE_EQ(share.take(r, 1, kRtt), r / 2) << "a fair share";
  EXPECT_DOUBLE_EQ(share.take(r, 2, kRtt), 0) << "past 1.5 × the rate";
  EXPECT_DOUBLE_EQ(share.claimed(kRtt + 1), 1.5 * r);
  EXPECT_DOUBLE_EQ(share.claimed(kRtt + 2), 0) << "the claims outlived their hold";
  EXPECT_DOUBLE_EQ(share.take(r, kRtt + 2, kRtt), r);
}

// QPs of one device towards one peer on a long path keep one window between them (RFC 3124's
// Congestion Manager): together at most the largest of their windows in flight, each at
// least an even share of it and as much more as the others leave; a QP quiet for its hold
// gives its share back. kv's 2 QPs on 100 Gbit/s × 50 ms each kept their own window in
// flight, 2.6 BDPs together into a path and queue of 2, and overflowed the queue.
TEST(CongestionWindowTest, QpsTowardsOnePeerShareOneWindowInFlight) {
  constexpr uint64_t kHold = 100'000'000;
  PathShare share;
  auto f = share.flight_cap(1, 200'000, 0, 0.002, 0, kHold);
  EXPECT_EQ(f.cap, 200'000u) << "alone: its own window";
  f = share.flight_cap(2, 150'000, 0, 0.001, 1'000, kHold);
  EXPECT_EQ(f.even, 100'000u) << "the largest window over 2 QPs";
  EXPECT_EQ(f.cap, 200'000u) << "QP 1 has nothing in flight: QP 2 may use the whole window";
  f = share.flight_cap(1, 200'000, 150'000, 0.002, 2'000, kHold);
  EXPECT_EQ(f.cap, 200'000u) << "QP 2 holds nothing (as it last said): QP 1 may use it all";
  f = share.flight_cap(2, 150'000, 130'000, 0.001, 3'000, kHold);
  EXPECT_EQ(f.cap, 100'000u) << "QP 1 holds 150,000: QP 2 gets its even share only";
  EXPECT_DOUBLE_EQ(share.path_rate(), 0.003);
  f = share.flight_cap(2, 150'000, 130'000, 0.001, 3'000 + kHold + 1, kHold);
  EXPECT_EQ(f.cap, 150'000u) << "QP 1 quiet past its hold: QP 2 alone again";
  EXPECT_DOUBLE_EQ(share.path_rate(), 0.001);
  PathShare small;
  small.flight_cap(1, 100, 100, 0, 0, kHold);
  f = small.flight_cap(2, 100, 0, 0, 1, kHold);
  EXPECT_EQ(f.cap, PathShare::kMinFlightPsns) << "never shut out";

  // Through the window: on a long path a QP's flight is its share, and a QP in congestion
  // avoidance below its even share is raised to it.
  PathShare path;
  CongestionWindow a, b;
  for (CongestionWindow* w : {&a, &b}) {
    w->set_path_share(&path, 4096);
    w->on_rtt_sample(50'000'000);
  }
  for (int i = 0; i < 10; ++i) a.on_acked(a.psns());  // slow start to 131,072
  a.on_rtt_sample(70'000'000);                        // a queue: the loss is congestion
  ASSERT_TRUE(a.on_sequence_nak(1, 1));               // → 65,536, congestion avoidance
  ASSERT_EQ(a.psns(), 65'536u);
  b.on_rtt_sample(70'000'000);
  ASSERT_TRUE(b.on_sequence_nak(1, 1));  // 128 → 64, congestion avoidance
  a.share_flight(1, 0, 1'000);
  EXPECT_EQ(a.flight_psns(), 65'536u);
  b.share_flight(2, 0, 2'000);
  EXPECT_EQ(b.psns(), 32'768u) << "raised to its even share of the QPs' window";
  a.share_flight(1, 65'000, 3'000);
  b.share_flight(2, 32'768, 4'000);
  a.share_flight(1, 65'000, 5'000);
  EXPECT_EQ(a.flight_psns(), 32'768u) << "QP 1 keeps its share while QP 2 uses its own";
  CongestionWindow near;  // a short path shares nothing
  near.set_path_share(&path, 4096);
  near.on_rtt_sample(200'000);
  near.share_flight(3, 0, 6'000);
  EXPECT_EQ(near.flight_psns(), near.psns());
}

// Slow start on a long path: the first round's ACK train (ACKs spaced by the bottleneck)
// lets the window quadruple while it comes back, and once it is over the window jumps to one
// BDP of its rate; 10 Gbit/s × 50 ms at MTU 4096 is 15,259 PSNs, reached in the second round
// trip instead of the seventh. A short path, ACKs that arrive bunched, and a loss keep plain
// slow start.
TEST(CongestionWindowTest, OnALongPathTheFirstAckTrainOpensTheWindowToTheMeasuredBdp) {
  constexpr double kPsnsPerNs = 10e9 / 8 / 4096 / 1e9;  // 10 Gbit/s of 4 KiB packets
  constexpr uint64_t kRtt = 50'000'000;
  constexpr uint32_t kBdp = uint32_t(kPsnsPerNs * kRtt);  // 15,258
  // Round trips until the window holds `target` PSNs: each round the window leaves as a
  // burst and its ACKs (one per 32 PSNs) come back spaced by the bottleneck.
  uint64_t now = 1'000'000'000;  // one clock for every call: it never goes back
  const auto rounds_to = [&](CongestionWindow& w, uint64_t rtt, uint32_t target) {
    int rounds = 0;
    w.on_rtt_sample(rtt);
    while (w.psns() < target && rounds < 30) {
      ack_flight(w, now, 1 / kPsnsPerNs);
      now += rtt;
      ++rounds;
    }
    return rounds;
  };
  CongestionWindow w;
  const int first = rounds_to(w, kRtt, CongestionWindow::kInitialPsns + 1);
  EXPECT_EQ(first, 1);
  EXPECT_GE(w.psns(), 4 * CongestionWindow::kInitialPsns) << "×4 by the train";
  EXPECT_LT(w.psns(), 5 * CongestionWindow::kInitialPsns) << "+ what was ACKed after it";
  EXPECT_EQ(first + rounds_to(w, kRtt, kBdp), 2) << "plain doubling: 7 round trips";
  EXPECT_LE(w.psns(), 2 * kBdp);
  // Slow start ends at 1.5 BDPs as the trains measured them (HyStart's exit), with no loss;
  // then, the round trip showing no queue, 12.5 % per round trip: 1.5 → 3 BDPs in about
  // six round trips, not slow start's one or two.
  const int rounds = rounds_to(w, kRtt, 3 * kBdp);
  EXPECT_GE(w.threshold(), kBdp * 3 / 2 - 1) << "slow start ended early";
  EXPECT_LE(w.threshold(), kBdp * 8 / 5) << "slow start ended late";
  EXPECT_GE(rounds, 6);
  EXPECT_LE(rounds, 8);

  CongestionWindow shorter;  // a data-centre or same-host round trip: plain slow start
  EXPECT_EQ(rounds_to(shorter, 200'000, kBdp), 7);

  // A host-local path (a peer on this host) whose round trip a loaded host stretched to
  // 50 ms: plain slow start all the way, no jump, no exit at 1.5 "BDPs" of that queue.
  CongestionWindow local;
  local.set_host_local(true);
  local.on_rtt_sample(kRtt);
  EXPECT_FALSE(local.long_path());
  EXPECT_EQ(rounds_to(local, kRtt, kBdp), 7) << "the trains raised a host-local window";
  EXPECT_EQ(rounds_to(local, kRtt, 3 * kBdp), 2) << "slow start ended on a host-local path";
  EXPECT_GT(local.threshold(), 3 * kBdp);
  EXPECT_TRUE(local.queue_building()) << "a host-local loss is always taken for congestion";

  CongestionWindow bunched;  // ACKs that arrive together say nothing of the path's rate
  bunched.on_rtt_sample(kRtt);
  for (int i = 0; i < 4; ++i) {
    bunched.on_delivered(32, 1'000'000'000);
    bunched.on_acked(32);
  }
  EXPECT_EQ(bunched.psns(), 2 * CongestionWindow::kInitialPsns);

  CongestionWindow lossy;  // a congestion loss ends the trains: the window halves, stays halved
  lossy.on_rtt_sample(kRtt);
  lossy.on_rtt_sample(2 * kRtt);  // a queue: the loss is congestion
  lossy.on_delivered(32, 1'000'000'000);
  lossy.on_sequence_nak(1'000'000'000);
  for (int i = 1; i < 4; ++i) lossy.on_delivered(32, 1'000'000'000 + i * uint64_t(32 / kPsnsPerNs));
  EXPECT_EQ(lossy.psns(), CongestionWindow::kInitialPsns / 2);
}

// The same through the transport units: a requester that measured a 50 ms round trip sends
// 16 MiB in 1 KiB packets through a 1 Gbit/s bottleneck (8.192 µs per PSN; the ACKs, one
// per 32 PSNs, come back so spaced). Its window holds the BDP, 6,103 PSNs, after the second
// round trip (128 → ~580 → 6,103+) where plain doubling needs six. (The warm-up WRITE, one
// PSN, did not grow the window: it never filled it, CongestionWindow::set_validation.)
TEST_F(TransportTest, OnALongPathAckTrainsOpenTheWindowToTheBdpInTwoRoundTrips) {
  constexpr uint64_t kRtt = 50'000'000, kPerPsn = 8'192;
  constexpr uint32_t kBdp = kRtt / kPerPsn;  // 6,103
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, kMtu, 0, 1), kOk);
  ta->advance(kRtt);
  settle();
  ASSERT_EQ(drain().size(), 1u);
  ASSERT_EQ(a->req.window.min_rtt_ns(), kRtt);
  for (int i = 0; i < 16; ++i)
    ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, 1 << 20, 0, uint64_t(i + 2)), kOk);
  ASSERT_EQ(ta->sent.size(), CongestionWindow::kInitialPsns);
  uint32_t acked = kSqPsn;  // the warm-up's PSN
  std::vector<uint32_t> windows;
  while (a->req.window.psns() < kBdp && windows.size() < 10) {
    ta->advance(kRtt);  // a round trip: the flight reaches the responder, the ACKs return
    ack_spaced(acked, kPerPsn);
    windows.push_back(a->req.window.psns());
  }
  EXPECT_EQ(windows.size(), 2u) << "plain doubling: 128 → 256 → … → 8,192 in six";
  ASSERT_FALSE(windows.empty());
  EXPECT_GE(windows[0], 4 * CongestionWindow::kInitialPsns) << "×4 by the train";
  EXPECT_LT(windows[0], 5 * CongestionWindow::kInitialPsns) << "+ what was ACKed after it";
  EXPECT_LE(windows.back(), 2 * kBdp);
  // The rest, out of slow start: paced (requester.cpp pacing_rate), so the clock moves on.
  size_t done = 0;
  for (int i = 0; i < 10'000 && done < 16; ++i) {
    settle();
    for (auto c = drain(); !c.empty(); c = drain()) done += c.size();
    ta->advance(1'000'000);
    run_requester_timers();
  }
  EXPECT_EQ(done, 16u);
}

// The same through the transport units: a lone zero-length WRITE (kv's path probe) leaves
// half a round trip before a flight of 1 MiB WRITEs; its ACK arrives half a round trip before
// the flight's. The requester marks the flight (it left after an idle gap), so the probe's
// ACK starts no train and the flight's train, timed from its own first ACK, measures the
// 1 Gbit/s bottleneck: ×4 in the first round trip, as on a path never idle.
TEST_F(TransportTest, TheFlightAfterAnIdleGapIsTimedFromItsOwnFirstAck) {
  constexpr uint64_t kRtt = 50'000'000, kPerPsn = 8'192;  // 1 Gbit/s of 1 KiB packets
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, kMtu, 0, 1), kOk);
  ta->advance(kRtt);
  settle();
  ASSERT_EQ(drain().size(), 1u);
  ASSERT_EQ(a->req.window.min_rtt_ns(), kRtt);
  ta->advance(kRtt);
  ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, 0, 0, 2), kOk);  // the probe
  const uint32_t probe = a->req.psn - 1;
  ta->advance(kRtt / 2);
  deliver(*ta, *b, *tb);  // the probe reaches the responder; its ACK is on the way back
  std::deque<std::vector<uint8_t>> probe_ack = std::move(tb->sent);
  tb->sent.clear();
  ASSERT_EQ(probe_ack.size(), 1u);
  for (int i = 0; i < 16; ++i)
    ASSERT_EQ(post(*a, WrOpcode::kRdmaWrite, 0, 1 << 20, 0, uint64_t(i + 3)), kOk);
  ASSERT_EQ(a->req.flight_psn, probe + 1);
  // The window, 128 (the warm-up never filled it: CongestionWindow::set_validation), less
  // the probe's PSN.
  ASSERT_EQ(ta->sent.size(), CongestionWindow::kInitialPsns - 1);
  ta->advance(kRtt / 2);
  tb->sent = std::move(probe_ack);
  deliver(*tb, *a, *ta);  // the probe's ACK, half a round trip before the flight's
  EXPECT_EQ(drain().size(), 1u);
  EXPECT_EQ(a->req.flight_psn, probe + 1) << "the probe's ACK covers nothing of the flight";
  ta->advance(kRtt / 2);
  uint32_t acked = probe;
  ack_spaced(acked, kPerPsn);
  EXPECT_EQ(a->req.flight_psn, kNoPsn);
  EXPECT_NEAR(a->req.window.train_rate(), 1.0 / kPerPsn, 0.05 / kPerPsn);
  EXPECT_GE(a->req.window.psns(), 4 * CongestionWindow::kInitialPsns) << "×4 by the train";
}

}  // namespace
}  // namespace softrdma::engine
