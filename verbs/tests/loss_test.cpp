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
#include "verbs/tests/traffic.h"

namespace softrdma::verbs_test {
namespace {

constexpr int kAtomics = 200;
constexpr uint64_t kAtomicOff = 6 << 20;

const OrderedTraffic kTraffic{.sends = 2000,
                              .writes = 300,
                              .reads = 300,
                              .write_seed0 = 100000,
                              .read_base = 4 << 20,  // 1 MiB of pattern 77
                              .read_seed = 77};

struct LossCase {
  const char* name;
  const char* netem;  // "" = no emulation
};

void PrintTo(const LossCase& c, std::ostream* os) {
  *os << "SOFTRDMA_NETEM=\"" << c.netem << "\"";
}

class InjectedLoss : public ::testing::TestWithParam<LossCase> {};

void requester(Role& r, bool lossy) {
  auto& l = r.link();
  const Counters before = r.counters();
  auto counters = [&] { return "\n  requester counters:" + Growth{before, r.counters()}.str(); };
  r.barrier();  // receives posted, read region filled

  kTraffic.request(r, counters);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  // FETCH & ADD: results in posting order must be 0, 1, 2, …
  auto* res = reinterpret_cast<uint64_t*>(r.buf() + kTraffic.window * kTraffic.slot);
  run_window(
      l.ep.scq, "FETCH & ADD", kAtomics, 16, kTraffic.timeout,
      [&](int i) {
        SendWr w(IBV_WR_ATOMIC_FETCH_AND_ADD, i);
        w.add_sge(&res[i], 8, r.lkey()).atomic(l.remote.addr + kAtomicOff, l.remote.rkey, 1);
        ASSERT_EQ(0, w.post(l.ep.qp));
      },
      [&](int i) { EXPECT_EQ(uint64_t(i), res[i]) << "FETCH & ADD " << i; }, counters);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  EXPECT_TRUE(no_completion(l.ep.scq, 50ms));
  r.send_value(1, uint32_t{1});

  const Growth g{before, r.counters()};
  printf(
      "[ requester] sent_pkts=%lu retransmitted_pkts=%lu retransmit_timeouts=%lu "
      "rcvd_seq_err=%lu emulated_drops=%lu\n",
      (unsigned long)g["sent_pkts"], (unsigned long)g["retransmitted_pkts"],
      (unsigned long)g["retransmit_timeouts"], (unsigned long)g["rcvd_seq_err"],
      (unsigned long)g["emulated_drops"]);
  if (lossy) {
    EXPECT_GT(g["emulated_drops"], 0u);
    EXPECT_GT(g["retransmitted_pkts"], 0u) << "losses were recovered without retransmission?";
  } else {
    EXPECT_EQ(0u, g["emulated_drops"]);
  }
}

void responder(Role& r, bool lossy) {
  auto& l = r.link();
  const Counters before = r.counters();
  *reinterpret_cast<uint64_t*>(r.buf() + kAtomicOff) = 0;
  kTraffic.prepare_target(r);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  r.barrier();

  kTraffic.receive_all(r, [&] {
    return "\n  responder counters:" + Growth{before, r.counters()}.str();
  });
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  ibv_wc extra{};
  EXPECT_TRUE(no_completion(l.ep.rcq, 200ms, &extra)) << "extra delivery: " << describe(extra);
  r.recv_value<uint32_t>(0, 120s);
  EXPECT_EQ(uint64_t(kAtomics),
            __atomic_load_n(reinterpret_cast<uint64_t*>(r.buf() + kAtomicOff), __ATOMIC_ACQUIRE))
      << "an atomic was executed twice or not at all";
  EXPECT_TRUE(HasPattern(r.buf() + kTraffic.read_base, kTraffic.read_span, kTraffic.read_seed));

  const Growth g{before, r.counters()};
  printf(
      "[ responder] sent_pkts=%lu duplicate_request=%lu out_of_seq_request=%lu "
      "emulated_drops=%lu\n",
      (unsigned long)g["sent_pkts"], (unsigned long)g["duplicate_request"],
      (unsigned long)g["out_of_seq_request"], (unsigned long)g["emulated_drops"]);
  if (lossy) {
    EXPECT_GT(g["emulated_drops"], 0u);
  } else {
    EXPECT_EQ(0u, g["emulated_drops"]);
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
  s.conn.max_recv_wr = kTraffic.recv_depth;
  s.roles.resize(2);
  s.links = {{0, 1}};
  s.roles[0].buf_size = kTraffic.window * kTraffic.slot + kAtomics * 8;
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
