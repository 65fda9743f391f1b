// Error paths between two processes:
//  - remote access violations (bad rkey, out of bounds, MR without the right) give
//    IBV_WC_REM_ACCESS_ERR at the requester, leave target memory untouched, put the QP in
//    ERR, and flush every later WR (send and receive) with IBV_WC_WR_FLUSH_ERR;
//  - SEND (or RDMA WRITE with immediate data) with no receive posted: RNR retried until a
//    receive appears (rnr_retry 7), or IBV_WC_RNR_RETRY_EXC_ERR when rnr_retry is exhausted;
//  - a peer killed after connecting: IBV_WC_RETRY_EXC_ERR at the first retransmit timeout.
#include <arpa/inet.h>
#include <signal.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "verbs/tests/harness.h"

namespace softrdma::verbs_test {
namespace {

template <class D>
double ms(D d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

// ---- remote access errors --------------------------------------------------------------

enum class Access {
  kWriteBadRkey,
  kWriteBeyondEnd,
  kWriteBeforeStart,
  kWriteVaWraps,
  kWriteNoRemoteWrite,
  kReadBadRkey,
  kReadBeyondEnd,
  kReadNoRemoteRead,
  kAtomicBadRkey,
  kAtomicNoRemoteAtomic,
};

const char* name_of(Access a) {
  switch (a) {
    case Access::kWriteBadRkey:
      return "WriteBadRkey";
    case Access::kWriteBeyondEnd:
      return "WriteBeyondEnd";
    case Access::kWriteBeforeStart:
      return "WriteBeforeStart";
    case Access::kWriteVaWraps:
      return "WriteVaWraps";
    case Access::kWriteNoRemoteWrite:
      return "WriteToMrWithoutRemoteWrite";
    case Access::kReadBadRkey:
      return "ReadBadRkey";
    case Access::kReadBeyondEnd:
      return "ReadBeyondEnd";
    case Access::kReadNoRemoteRead:
      return "ReadFromMrWithoutRemoteRead";
    case Access::kAtomicBadRkey:
      return "AtomicBadRkey";
    case Access::kAtomicNoRemoteAtomic:
      return "AtomicOnMrWithoutRemoteAtomic";
  }
  return "?";
}

// Rights of the target's probe MR for each case.
int probe_access(Access a) {
  switch (a) {
    case Access::kWriteNoRemoteWrite:
      return IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    case Access::kReadNoRemoteRead:
      return IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
    case Access::kAtomicNoRemoteAtomic:
      return IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    default:
      return kAllAccess;
  }
}

struct ProbeMr {
  uint64_t addr;
  uint64_t len;
  uint32_t rkey;
};

class RemoteAccessError : public ::testing::TestWithParam<Access> {};

// The target registers one page in the middle of three (all three filled with kGuard) as
// the probe MR; the requester posts the violating WR and, right behind it, a valid WRITE
// into the target's main buffer, which must not be executed either: the responder does not
// advance past a NAKed PSN (and rxe moves to ERR on this class of error).
TEST_P(RemoteAccessError, FailsFlushesAndLeavesTargetUntouched) {
  const Access c = GetParam();
  static constexpr uint32_t kLen = 100;
  run_pair(
      ConnOptions{},
      [c](Role& r) {  // requester
        auto& l = r.link();
        const auto probe = r.recv_value<ProbeMr>(1);
        const Counters before = r.counters();
        uint8_t* local = r.buf();
        memset(local, kGuard, 8192);
        fill_pattern(local + 4096, kLen, 1);
        ASSERT_EQ(0, post_recv(l.ep.qp, 900, local + 6000, 64, r.lkey()));

        uint32_t bad_rkey = probe.rkey ^ 0x00a5a500u;
        if (bad_rkey == l.remote.rkey) bad_rkey ^= 0x01000000u;
        const uint8_t* src = local + 4096;
        int rc = -1;
        switch (c) {
          case Access::kWriteBadRkey:
            rc = post_send(l.ep.qp, IBV_WR_RDMA_WRITE, 1, src, kLen, r.lkey(), probe.addr + 16,
                           bad_rkey);
            break;
          case Access::kWriteBeyondEnd:
            rc = post_send(l.ep.qp, IBV_WR_RDMA_WRITE, 1, src, kLen, r.lkey(),
                           probe.addr + probe.len - 10, probe.rkey);
            break;
          case Access::kWriteBeforeStart:
            rc = post_send(l.ep.qp, IBV_WR_RDMA_WRITE, 1, src, kLen, r.lkey(), probe.addr - 16,
                           probe.rkey);
            break;
          case Access::kWriteVaWraps:
            rc = post_send(l.ep.qp, IBV_WR_RDMA_WRITE, 1, src, kLen, r.lkey(), UINT64_MAX - 10,
                           probe.rkey);
            break;
          case Access::kWriteNoRemoteWrite:
            rc = post_send(l.ep.qp, IBV_WR_RDMA_WRITE, 1, src, kLen, r.lkey(), probe.addr + 16,
                           probe.rkey);
            break;
          case Access::kReadBadRkey:
            rc = post_send(l.ep.qp, IBV_WR_RDMA_READ, 1, local, kLen, r.lkey(), probe.addr + 16,
                           bad_rkey);
            break;
          case Access::kReadBeyondEnd:
            rc = post_send(l.ep.qp, IBV_WR_RDMA_READ, 1, local, kLen, r.lkey(),
                           probe.addr + probe.len - 10, probe.rkey);
            break;
          case Access::kReadNoRemoteRead:
            rc = post_send(l.ep.qp, IBV_WR_RDMA_READ, 1, local, kLen, r.lkey(), probe.addr + 16,
                           probe.rkey);
            break;
          case Access::kAtomicBadRkey:
          case Access::kAtomicNoRemoteAtomic: {
            SendWr w(IBV_WR_ATOMIC_FETCH_AND_ADD, 1);
            w.add_sge(local, 8, r.lkey())
                .atomic(probe.addr + 16, c == Access::kAtomicBadRkey ? bad_rkey : probe.rkey, 1);
            rc = w.post(l.ep.qp);
            break;
          }
        }
        ASSERT_EQ(0, rc);
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_RDMA_WRITE, 2, src, 64, r.lkey(), l.remote.addr,
                               l.remote.rkey));

        ibv_wc wc = poll_one(l.ep.scq);
        EXPECT_EQ(1u, wc.wr_id);
        EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, wc.status) << describe(wc);
        wc = poll_one(l.ep.scq);
        EXPECT_EQ(2u, wc.wr_id);
        EXPECT_EQ(IBV_WC_WR_FLUSH_ERR, wc.status) << describe(wc);
        EXPECT_EQ(IBV_QPS_ERR, qp_state(l.ep.qp));

        // A WR posted to a QP in ERR is accepted and flushed; so is the posted receive.
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_SEND, 3, src, 8, r.lkey()));
        wc = poll_one(l.ep.scq);
        EXPECT_EQ(3u, wc.wr_id);
        EXPECT_EQ(IBV_WC_WR_FLUSH_ERR, wc.status) << describe(wc);
        wc = poll_one(l.ep.rcq);
        EXPECT_EQ(900u, wc.wr_id);
        EXPECT_EQ(IBV_WC_WR_FLUSH_ERR, wc.status) << describe(wc);
        EXPECT_TRUE(no_completion(l.ep.scq, 20ms));

        EXPECT_TRUE(AllBytesAre(local, 4096, kGuard)) << "no READ/atomic data may land locally";
        EXPECT_GE(r.counters()["rcvd_nak"], before["rcvd_nak"] + 1);
        r.send_value(1, uint32_t{1});
      },
      [c](Role& r) {  // target
        const size_t page = Buffer::page_size();
        Buffer region(3 * page);
        memset(region.data(), kGuard, 3 * page);
        memset(r.buf(), kGuard, 65536);
        ibv_mr* mr = ibv_reg_mr(r.dev().pd, region.data() + page, page, probe_access(c));
        ASSERT_NE(nullptr, mr) << strerror(errno);
        const Counters before = r.counters();
        r.send_value(0, ProbeMr{reinterpret_cast<uintptr_t>(region.data() + page), page, mr->rkey});
        r.recv_value<uint32_t>(0);
        EXPECT_TRUE(AllBytesAre(region.guard_before(), page, kGuard));
        EXPECT_TRUE(AllBytesAre(region.data(), 3 * page, kGuard)) << "probe MR and its neighbours";
        EXPECT_TRUE(AllBytesAre(r.buf(), 65536, kGuard)) << "the WRITE behind the bad one ran";
        EXPECT_GE(r.counters()["send_nak"], before["send_nak"] + 1);
        EXPECT_EQ(0, ibv_dereg_mr(mr));
      });
}

INSTANTIATE_TEST_SUITE_P(Cases, RemoteAccessError,
                         ::testing::Values(Access::kWriteBadRkey, Access::kWriteBeyondEnd,
                                           Access::kWriteBeforeStart, Access::kWriteVaWraps,
                                           Access::kWriteNoRemoteWrite, Access::kReadBadRkey,
                                           Access::kReadBeyondEnd, Access::kReadNoRemoteRead,
                                           Access::kAtomicBadRkey, Access::kAtomicNoRemoteAtomic),
                         [](const ::testing::TestParamInfo<Access>& i) {
                           return std::string(name_of(i.param));
                         });

// ---- receiver not ready (RNR) ----------------------------------------------------------

// rnr_retry = 7 retries forever: the SEND (three packets) completes once the receiver,
// 50 ms late, posts its receive. min_rnr_timer 12 = 0.64 ms between tries. That it did not
// complete before the receive existed is checked against the receiver's own clock reading
// (CLOCK_MONOTONIC, one clock for both processes) taken before it posted: a bound measured
// from the sender's leaving the barrier failed on a loaded machine (39.8 ms against 40),
// where the two processes leave it milliseconds apart.
TEST(Rnr, SendSucceedsOnceReceiveIsPosted) {
  ConnOptions o;
  o.rnr_retry = 7;
  o.min_rnr_timer = 12;
  static constexpr uint32_t kLen = 2500;
  run_pair(
      o,
      [](Role& r) {
        auto& l = r.link();
        fill_pattern(r.buf(), kLen, 3);
        const Counters before = r.counters();
        r.barrier();
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_SEND, 1, r.buf(), kLen, r.lkey()));
        const ibv_wc wc = poll_one(l.ep.scq, 10s);
        const Clock::time_point done = Clock::now();
        EXPECT_EQ(IBV_WC_SUCCESS, wc.status) << describe(wc);
        const Clock::time_point posted{Clock::duration{r.recv_value<Clock::rep>(1)}};
        EXPECT_GE(done, posted) << "completed " << ms(posted - done)
                                << " ms before the receive was posted";
        r.barrier();
        EXPECT_GE(r.counters()["rcvd_rnr_err"], before["rcvd_rnr_err"] + 1);
        // The QP is healthy afterwards.
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_SEND, 2, r.buf(), 10, r.lkey()));
        EXPECT_EQ(IBV_WC_SUCCESS, poll_one(l.ep.scq).status);
      },
      [](Role& r) {
        auto& l = r.link();
        const Counters before = r.counters();
        r.barrier();
        std::this_thread::sleep_for(50ms);
        const Clock::time_point posted = Clock::now();
        ASSERT_EQ(0, post_recv(l.ep.qp, 1, r.buf(), 4096, r.lkey()));
        ASSERT_EQ(0, post_recv(l.ep.qp, 2, r.buf() + 4096, 4096, r.lkey()));
        r.send_value(0, posted.time_since_epoch().count());
        const ibv_wc wc = poll_one(l.ep.rcq, 10s);
        ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << describe(wc);
        EXPECT_EQ(kLen, wc.byte_len);
        EXPECT_TRUE(HasPattern(r.buf(), kLen, 3));
        r.barrier();
        EXPECT_GE(r.counters()["send_rnr_err"], before["send_rnr_err"] + 1);
        EXPECT_EQ(IBV_WC_SUCCESS, poll_one(l.ep.rcq).status);
      });
}

// The same for an RDMA WRITE with immediate data (three packets) followed by a plain WRITE:
// the WRITE's last packet takes a receive WQE. Refused with RNR, it is resent and completes
// once the receive is posted, its data, immediate and the WRITE behind it all intact.
TEST(Rnr, WriteWithImmSucceedsOnceReceiveIsPosted) {
  ConnOptions o;
  o.rnr_retry = 7;
  o.min_rnr_timer = 12;
  static constexpr uint32_t kLen = 3 * 4096;
  static constexpr uint32_t kImm = 0x1234abcd;
  run_pair(
      o,
      [](Role& r) {
        auto& l = r.link();
        fill_pattern(r.buf(), 2 * kLen, 5);
        const Counters before = r.counters();
        r.barrier();
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_RDMA_WRITE_WITH_IMM, 1, r.buf(), kLen, r.lkey(),
                               l.remote.addr, l.remote.rkey, htonl(kImm)));
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_RDMA_WRITE, 2, r.buf() + kLen, kLen, r.lkey(),
                               l.remote.addr + kLen, l.remote.rkey));
        const std::vector<ibv_wc> wcs = poll_n(l.ep.scq, 2, 10s);
        for (const ibv_wc& wc : wcs) EXPECT_EQ(IBV_WC_SUCCESS, wc.status) << describe(wc);
        r.barrier();
        EXPECT_GE(r.counters()["rcvd_rnr_err"], before["rcvd_rnr_err"] + 1);
      },
      [](Role& r) {
        auto& l = r.link();
        const Counters before = r.counters();
        r.barrier();
        std::this_thread::sleep_for(50ms);
        ASSERT_EQ(0, post_recv(l.ep.qp, 1, nullptr, 0, r.lkey()));
        const ibv_wc wc = poll_one(l.ep.rcq, 10s);
        ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << describe(wc);
        EXPECT_EQ(IBV_WC_RECV_RDMA_WITH_IMM, wc.opcode);
        EXPECT_EQ(kLen, wc.byte_len);
        EXPECT_TRUE(CarriesImm(wc, htonl(kImm)));
        r.barrier();  // the requester saw both WRITEs complete
        EXPECT_TRUE(HasPattern(r.buf(), 2 * kLen, 5));
        EXPECT_GE(r.counters()["send_rnr_err"], before["send_rnr_err"] + 1);
      });
}

class RnrExhausted : public ::testing::TestWithParam<int> {};

// rnr_retry = N: the requester gives up after N retries (N+1 RNR NAKs) with
// IBV_WC_RNR_RETRY_EXC_ERR, quickly (min_rnr_timer 1 = 10 µs); the message is never
// delivered afterwards, even once a receive is posted.
TEST_P(RnrExhausted, FailsWithRnrRetryExceeded) {
  const int n = GetParam();
  ConnOptions o;
  o.rnr_retry = static_cast<uint8_t>(n);
  o.min_rnr_timer = 1;
  run_pair(
      o,
      [n](Role& r) {
        auto& l = r.link();
        const Counters before = r.counters();
        r.barrier();
        const auto t0 = Clock::now();
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_SEND, 1, r.buf(), 100, r.lkey()));
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_SEND, 2, r.buf(), 100, r.lkey()));
        ibv_wc wc = poll_one(l.ep.scq, 10s);
        const auto elapsed = Clock::now() - t0;
        EXPECT_EQ(1u, wc.wr_id);
        EXPECT_EQ(IBV_WC_RNR_RETRY_EXC_ERR, wc.status) << describe(wc);
        EXPECT_LE(ms(elapsed), 2000.0);
        wc = poll_one(l.ep.scq);
        EXPECT_EQ(2u, wc.wr_id);
        EXPECT_EQ(IBV_WC_WR_FLUSH_ERR, wc.status) << describe(wc);
        const Counters after = r.counters();
        EXPECT_GE(after["rcvd_rnr_err"], before["rcvd_rnr_err"] + n + 1);
        EXPECT_GE(after["retry_rnr_exceeded_err"], before["retry_rnr_exceeded_err"] + 1);
        r.send_value(1, uint32_t{1});
      },
      [n](Role& r) {
        auto& l = r.link();
        const Counters before = r.counters();
        r.barrier();
        r.recv_value<uint32_t>(0);
        EXPECT_GE(r.counters()["send_rnr_err"], before["send_rnr_err"] + n + 1);
        ASSERT_EQ(0, post_recv(l.ep.qp, 1, r.buf(), 4096, r.lkey()));
        ibv_wc wc{};
        EXPECT_TRUE(no_completion(l.ep.rcq, 100ms, &wc))
            << "a message reported failed was delivered: " << describe(wc);
      });
}

INSTANTIATE_TEST_SUITE_P(RnrRetry, RnrExhausted, ::testing::Values(1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "RnrRetry" + std::to_string(i.param);
                         });

// ---- killed peer -----------------------------------------------------------------------

constexpr uint8_t kKillTimeout = 10;  // 4.096 µs · 2^10 ≈ 4.2 ms
constexpr uint8_t kKillRetries = 3;

ConnOptions kill_options() {
  ConnOptions o;
  o.timeout = kKillTimeout;
  o.retry_cnt = kKillRetries;
  return o;
}

// The target dies right after connecting; a WRITE and a SEND posted afterwards end with
// IBV_WC_RETRY_EXC_ERR (first) and IBV_WC_WR_FLUSH_ERR at the first retransmit timeout
// (4.2 ms), not after retry_cnt more: the requester finds the peer's process gone
// (Transport::peer_liveness) — but not before that timeout could have happened.
TEST(KilledPeer, FailsAtTheFirstRetransmitTimeout) {
  Spec s;
  s.conn = kill_options();
  s.roles.resize(2);
  s.links = {{0, 1}};
  s.roles[1].may_be_killed = true;
  s.roles[1].fn = [](Role& r) { r.die(); };
  s.roles[0].fn = [](Role& r) {
    auto& l = r.link();
    ASSERT_TRUE(r.wait_peer_exit(1, 10s)) << "the peer did not die";
    std::this_thread::sleep_for(20ms);
    const Counters before = r.counters();
    fill_pattern(r.buf(), 65536, 1);
    const auto t0 = Clock::now();
    ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_RDMA_WRITE, 1, r.buf(), 65536, r.lkey(), l.remote.addr,
                           l.remote.rkey));
    ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_SEND, 2, r.buf(), 100, r.lkey()));
    ibv_wc wc = poll_one(l.ep.scq, 10s);
    const auto elapsed = Clock::now() - t0;
    EXPECT_EQ(1u, wc.wr_id);
    EXPECT_EQ(IBV_WC_RETRY_EXC_ERR, wc.status) << describe(wc);
    const auto one_timeout = std::chrono::nanoseconds(4096ll << kKillTimeout);
    EXPECT_LE(ms(elapsed), 2000.0);
    EXPECT_GE(ms(elapsed), ms(one_timeout) / 2) << "gave up before a retransmit timeout";
    wc = poll_one(l.ep.scq);
    EXPECT_EQ(2u, wc.wr_id);
    EXPECT_EQ(IBV_WC_WR_FLUSH_ERR, wc.status) << describe(wc);
    EXPECT_EQ(IBV_QPS_ERR, qp_state(l.ep.qp));
    const Counters after = r.counters();
    EXPECT_GE(after["retry_exceeded_err"], before["retry_exceeded_err"] + 1);
    EXPECT_GE(after["dead_peer_err"], before["dead_peer_err"] + 1);
    EXPECT_GE(after["retransmit_timeouts"], before["retransmit_timeouts"] + 1);
  };
  run_roles(s);
}

// The target dies in the middle of a stream of SENDs: the requester sees successes, then
// exactly one IBV_WC_RETRY_EXC_ERR, then only flushes, one completion per WR, in order.
TEST(KilledPeer, MidStream) {
  static constexpr int kMax = 300;
  static constexpr int kWindow = 16;
  static constexpr uint32_t kLen = 4096;
  Spec s;
  s.conn = kill_options();
  s.roles.resize(2);
  s.links = {{0, 1}};
  s.roles[1].may_be_killed = true;
  s.roles[1].fn = [](Role& r) {
    auto& l = r.link();
    for (int i = 0; i < 64; ++i)
      ASSERT_EQ(0, post_recv(l.ep.qp, i, r.buf() + i * kLen, kLen, r.lkey()));
    r.barrier();
    for (int i = 0; i < 10; ++i) ASSERT_EQ(IBV_WC_SUCCESS, poll_one(l.ep.rcq).status);
    r.die();
  };
  s.roles[0].fn = [](Role& r) {
    auto& l = r.link();
    r.barrier();
    const auto t0 = Clock::now();
    int posted = 0, completed = 0;
    bool errored = false;
    std::vector<ibv_wc_status> st;
    while (completed < posted || (!errored && posted < kMax)) {
      while (!errored && posted < kMax && posted - completed < kWindow) {
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_SEND, posted, r.buf(), kLen, r.lkey()));
        ++posted;
      }
      const ibv_wc wc = poll_one(l.ep.scq, 10s);
      ASSERT_EQ(uint64_t(completed), wc.wr_id) << describe(wc);
      st.push_back(wc.status);
      ++completed;
      errored |= wc.status != IBV_WC_SUCCESS;
    }
    EXPECT_LE(ms(Clock::now() - t0), 10000.0);
    ASSERT_TRUE(errored) << "all " << kMax << " SENDs succeeded although the peer died";
    size_t i = 0;
    while (i < st.size() && st[i] == IBV_WC_SUCCESS) ++i;
    EXPECT_GE(i, 10u) << "the peer received 10 messages before it died";
    ASSERT_LT(i, st.size());
    EXPECT_EQ(IBV_WC_RETRY_EXC_ERR, st[i]) << ibv_wc_status_str(st[i]);
    for (++i; i < st.size(); ++i)
      EXPECT_EQ(IBV_WC_WR_FLUSH_ERR, st[i])
          << "completion " << i << ": " << ibv_wc_status_str(st[i]);
  };
  run_roles(s);
}

}  // namespace
}  // namespace softrdma::verbs_test
