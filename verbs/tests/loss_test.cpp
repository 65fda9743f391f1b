// Injected packet loss (SOFTRDMA_NETEM in both processes, so requests, ACKs, NAKs and read
// responses are all lost) must not lose, duplicate or reorder anything:
//   2000 SENDs of 8 B … 3 KiB (up to 4 packets at MTU 1024), sequence number in the payload;
//   300 WRITEs with immediate (the immediate is the sequence number);
//   300 READs of 1 B … 7 KiB;
//   200 FETCH & ADD +1 (a replayed atomic executed twice would show in the final value).
// Every message is delivered exactly once, in order, byte for byte, and the counters show
// that recovery actually happened.
#include <arpa/inet.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "verbs/tests/harness.h"

namespace softrdma::verbs_test {
namespace {

constexpr int kSends = 2000;
constexpr int kWrites = 300;
constexpr int kReads = 300;
constexpr int kAtomics = 200;

constexpr int kSendWindow = 64;
constexpr uint32_t kSlot = 8192;
constexpr int kRecvDepth = 256;
constexpr uint32_t kRecvSize = 4096;

// Target buffer layout.
constexpr uint64_t kWriteBase = 1 << 20;  // kWrites regions of kWriteStride
constexpr uint64_t kWriteStride = 6144;
constexpr uint64_t kReadBase = 4 << 20;  // 1 MiB of pattern kReadSeed
constexpr uint64_t kReadSpan = 1 << 20;
constexpr uint64_t kAtomicOff = 6 << 20;
constexpr uint64_t kReadSeed = 77;

uint32_t send_len(int i) {
  return 8 + static_cast<uint32_t>(i * 7919u % 3100u);
}
uint32_t write_len(int j) {
  return 1 + static_cast<uint32_t>(j * 4099u % 6000u);
}
uint32_t read_len(int j) {
  return 1 + static_cast<uint32_t>(j * 5003u % 7000u);
}
uint64_t read_off(int j) {
  return static_cast<uint64_t>(j) * 3331u % (kReadSpan - 8192);
}
uint64_t write_seed(int j) {
  return 100000 + j;
}

struct LossCase {
  const char* name;
  const char* netem;  // "" = no emulation
};

void PrintTo(const LossCase& c, std::ostream* os) {
  *os << "SOFTRDMA_NETEM=\"" << c.netem << "\"";
}

class InjectedLoss : public ::testing::TestWithParam<LossCase> {};

// Prints how much every counter of this role's device grew since `before`.
std::string counter_growth(Role& r, const Counters& before) {
  const Counters now = r.counters();
  std::string s;
  for (const auto& [name, v] : now.values) {
    if (v != before[name]) s += " " + name + "=+" + std::to_string(v - before[name]);
  }
  return s;
}

void requester(Role& r, bool lossy) {
  auto& l = r.link();
  const Counters before = r.counters();
  r.barrier();  // receives posted, read region filled

  // SENDs, kSendWindow in flight; each slot is rewritten only after its message completed.
  {
    int posted = 0, done = 0;
    while (done < kSends) {
      while (posted < kSends && posted - done < kSendWindow) {
        uint8_t* p = r.buf() + (posted % kSendWindow) * kSlot;
        const uint32_t len = send_len(posted);
        fill_pattern(p, len, posted);
        const uint32_t seq = static_cast<uint32_t>(posted);
        memcpy(p, &seq, 4);
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_SEND, posted, p, len, r.lkey()));
        ++posted;
      }
      const ibv_wc wc = poll_one(l.ep.scq, 30s);
      ASSERT_EQ(IBV_WC_SUCCESS, wc.status)
          << "SEND " << done << ": " << describe(wc)
          << "\n  requester counters:" << counter_growth(r, before);
      ASSERT_EQ(uint64_t(done), wc.wr_id);
      ++done;
    }
  }
  // WRITEs with immediate into distinct target regions.
  {
    int posted = 0, done = 0;
    while (done < kWrites) {
      while (posted < kWrites && posted - done < kSendWindow) {
        uint8_t* p = r.buf() + (posted % kSendWindow) * kSlot;
        fill_pattern(p, write_len(posted), write_seed(posted));
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_RDMA_WRITE_WITH_IMM, posted, p, write_len(posted),
                               r.lkey(), l.remote.addr + kWriteBase + posted * kWriteStride,
                               l.remote.rkey, htonl(static_cast<uint32_t>(posted))));
        ++posted;
      }
      const ibv_wc wc = poll_one(l.ep.scq, 30s);
      ASSERT_EQ(IBV_WC_SUCCESS, wc.status)
          << "WRITE " << done << ": " << describe(wc)
          << "\n  requester counters:" << counter_growth(r, before);
      ASSERT_EQ(uint64_t(done), wc.wr_id);
      ++done;
    }
  }
  // READs, twice the initiator depth in flight (the requester must queue the rest).
  {
    constexpr int kReadWindow = 32;
    int posted = 0, done = 0;
    while (done < kReads) {
      while (posted < kReads && posted - done < kReadWindow) {
        uint8_t* p = r.buf() + (posted % kReadWindow) * kSlot;
        memset(p, kGuard, kSlot);
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_RDMA_READ, posted, p, read_len(posted), r.lkey(),
                               l.remote.addr + kReadBase + read_off(posted), l.remote.rkey));
        ++posted;
      }
      const ibv_wc wc = poll_one(l.ep.scq, 30s);
      ASSERT_EQ(IBV_WC_SUCCESS, wc.status)
          << "READ " << done << ": " << describe(wc)
          << "\n  requester counters:" << counter_growth(r, before);
      ASSERT_EQ(uint64_t(done), wc.wr_id);
      const uint8_t* p = r.buf() + (done % kReadWindow) * kSlot;
      ASSERT_TRUE(HasPattern(p, read_len(done), kReadSeed, read_off(done))) << "READ " << done;
      ASSERT_TRUE(AllBytesAre(p + read_len(done), kSlot - read_len(done), kGuard))
          << "READ " << done;
      ++done;
    }
  }
  // FETCH & ADD: results in posting order must be 0, 1, 2, …
  {
    auto* res = reinterpret_cast<uint64_t*>(r.buf() + kSendWindow * kSlot);
    int posted = 0, done = 0;
    while (done < kAtomics) {
      while (posted < kAtomics && posted - done < 16) {
        SendWr w(IBV_WR_ATOMIC_FETCH_AND_ADD, posted);
        w.add_sge(&res[posted], 8, r.lkey()).atomic(l.remote.addr + kAtomicOff, l.remote.rkey, 1);
        ASSERT_EQ(0, w.post(l.ep.qp));
        ++posted;
      }
      const ibv_wc wc = poll_one(l.ep.scq, 30s);
      ASSERT_EQ(IBV_WC_SUCCESS, wc.status)
          << "FETCH & ADD " << done << ": " << describe(wc)
          << "\n  requester counters:" << counter_growth(r, before);
      ASSERT_EQ(uint64_t(done), wc.wr_id);
      EXPECT_EQ(uint64_t(done), res[done]) << "FETCH & ADD " << done;
      ++done;
    }
  }
  EXPECT_TRUE(no_completion(l.ep.scq, 50ms));
  r.send_value(1, uint32_t{1});

  const Counters after = r.counters();
  auto grew = [&](const char* n) { return after[n] - before[n]; };
  printf(
      "[ requester] sent_pkts=%lu retransmitted_pkts=%lu retransmit_timeouts=%lu "
      "rcvd_seq_err=%lu emulated_drops=%lu\n",
      (unsigned long)grew("sent_pkts"), (unsigned long)grew("retransmitted_pkts"),
      (unsigned long)grew("retransmit_timeouts"), (unsigned long)grew("rcvd_seq_err"),
      (unsigned long)grew("emulated_drops"));
  if (lossy) {
    EXPECT_GT(grew("emulated_drops"), 0u);
    EXPECT_GT(grew("retransmitted_pkts"), 0u) << "losses were recovered without retransmission?";
  } else {
    EXPECT_EQ(0u, grew("emulated_drops"));
  }
}

void responder(Role& r, bool lossy) {
  auto& l = r.link();
  const Counters before = r.counters();
  fill_pattern(r.buf() + kReadBase, kReadSpan, kReadSeed);
  *reinterpret_cast<uint64_t*>(r.buf() + kAtomicOff) = 0;
  for (int k = 0; k < kRecvDepth; ++k)
    ASSERT_EQ(0, post_recv(l.ep.qp, k, r.buf() + k * kRecvSize, kRecvSize, r.lkey()));
  r.barrier();

  for (int m = 0; m < kSends + kWrites; ++m) {
    ibv_wc wc{};
    ASSERT_TRUE(try_poll_one(l.ep.rcq, wc, 30s))
        << "message " << m << " never arrived\n  responder counters:" << counter_growth(r, before);
    ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << "message " << m << ": " << describe(wc);
    ASSERT_LT(wc.wr_id, uint64_t(kRecvDepth));
    ASSERT_EQ(uint64_t(m % kRecvDepth), wc.wr_id) << "receives complete in posting order";
    uint8_t* p = r.buf() + wc.wr_id * kRecvSize;
    if (m < kSends) {
      ASSERT_EQ(IBV_WC_RECV, wc.opcode) << "message " << m;
      ASSERT_EQ(send_len(m), wc.byte_len) << "message " << m;
      uint32_t seq = 0;
      memcpy(&seq, p, 4);
      ASSERT_EQ(uint32_t(m), seq) << "SEND delivered out of order or twice";
      ASSERT_TRUE(HasPattern(p + 4, send_len(m) - 4, m, 4)) << "SEND " << m;
    } else {
      const int j = m - kSends;
      ASSERT_EQ(IBV_WC_RECV_RDMA_WITH_IMM, wc.opcode) << "message " << m;
      ASSERT_EQ(htonl(uint32_t(j)), wc.imm_data) << "WRITE with immediate out of order or twice";
      EXPECT_EQ(write_len(j), wc.byte_len);
      ASSERT_TRUE(HasPattern(r.buf() + kWriteBase + j * kWriteStride, write_len(j), write_seed(j)))
          << "WRITE " << j;
    }
    ASSERT_EQ(0, post_recv(l.ep.qp, wc.wr_id, p, kRecvSize, r.lkey()));
  }
  ibv_wc extra{};
  EXPECT_TRUE(no_completion(l.ep.rcq, 200ms, &extra)) << "extra delivery: " << describe(extra);
  r.recv_value<uint32_t>(0, 120s);
  EXPECT_EQ(uint64_t(kAtomics),
            __atomic_load_n(reinterpret_cast<uint64_t*>(r.buf() + kAtomicOff), __ATOMIC_ACQUIRE))
      << "an atomic was executed twice or not at all";
  EXPECT_TRUE(HasPattern(r.buf() + kReadBase, kReadSpan, kReadSeed));

  const Counters after = r.counters();
  auto grew = [&](const char* n) { return after[n] - before[n]; };
  printf(
      "[ responder] sent_pkts=%lu duplicate_request=%lu out_of_seq_request=%lu "
      "emulated_drops=%lu\n",
      (unsigned long)grew("sent_pkts"), (unsigned long)grew("duplicate_request"),
      (unsigned long)grew("out_of_seq_request"), (unsigned long)grew("emulated_drops"));
  if (lossy) {
    EXPECT_GT(grew("emulated_drops"), 0u);
  } else {
    EXPECT_EQ(0u, grew("emulated_drops"));
  }
}

TEST_P(InjectedLoss, EveryMessageExactlyOnceInOrder) {
  const LossCase c = GetParam();
  const bool lossy = c.netem[0] != '\0';
  Spec s;
  s.conn.path_mtu = IBV_MTU_1024;
  s.conn.timeout = 12;  // 16.8 ms: tail losses recover quickly, a descheduled peer is no failure
  s.conn.retry_cnt = 7;
  s.conn.rnr_retry = 7;
  s.conn.max_send_wr = 512;
  s.conn.max_recv_wr = kRecvDepth;
  s.roles.resize(2);
  s.links = {{0, 1}};
  s.roles[0].buf_size = kSendWindow * kSlot + kAtomics * 8;
  s.roles[1].buf_size = kAtomicOff + 4096;
  s.roles[0].fn = [lossy](Role& r) { requester(r, lossy); };
  s.roles[1].fn = [lossy](Role& r) { responder(r, lossy); };
  if (lossy) {
    for (auto& role : s.roles) role.env = {{"SOFTRDMA_NETEM", c.netem}};
  }
  s.deadline = 180s;
  run_roles(s);
}

INSTANTIATE_TEST_SUITE_P(Netem, InjectedLoss,
                         ::testing::Values(LossCase{"NoLoss", ""}, LossCase{"Every7", "every=7"},
                                           LossCase{"Random10Percent", "loss=10%,seed=42"},
                                           LossCase{"Mixed", "loss=5%,every=13,seed=7"}),
                         [](const ::testing::TestParamInfo<LossCase>& i) {
                           return std::string(i.param.name);
                         });

}  // namespace
}  // namespace softrdma::verbs_test
