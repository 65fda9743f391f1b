// Transfers over an emulated wide-area link (SOFTRDMA_WAN in both processes, so requests,
// ACKs, NAKs and READ responses all cross it): 10 ms one way (20 ms round trip) with jitter,
// with and without loss, on the UDP path and on the same-host path. Every SEND, WRITE with
// immediate and READ arrives exactly once, in order, byte for byte (the OrderedTraffic of
// the loss tests), the round trip shows in the elapsed time, and the counters show that the
// emulator held (and, with loss, dropped) packets.
#include <cstdio>
#include <string>

#include "verbs/tests/harness.h"
#include "verbs/tests/traffic.h"

namespace softrdma::verbs_test {
namespace {

const OrderedTraffic kWanTraffic{.sends = 300,
                                 .writes = 100,
                                 .reads = 100,
                                 .write_seed0 = 300000,
                                 .read_base = 4 << 20,
                                 .read_seed = 91};

struct WanCase {
  const char* name;
  const char* transport;  // SOFTRDMA_TRANSPORT
  const char* wan;        // SOFTRDMA_WAN (seed added per role)
  bool lossy;
};

void PrintTo(const WanCase& c, std::ostream* os) {
  *os << "SOFTRDMA_TRANSPORT=" << c.transport << " SOFTRDMA_WAN=\"" << c.wan << "\"";
}

class WanLink : public ::testing::TestWithParam<WanCase> {};

TEST_P(WanLink, EverythingArrivesOnceInOrderAfterTheRoundTrip) {
  const WanCase c = GetParam();
  Spec s;
  s.conn.path_mtu = IBV_MTU_1024;
  s.conn.timeout = 15;  // 134 ms: above the 20 ms round trip, so no spurious retransmission
  s.conn.retry_cnt = 7;
  s.conn.rnr_retry = 7;
  s.conn.max_send_wr = 512;
  s.conn.max_recv_wr = kWanTraffic.recv_depth;
  s.roles.resize(2);
  s.links = {{0, 1}};
  s.roles[0].buf_size = kWanTraffic.window * kWanTraffic.slot;
  s.roles[1].buf_size = (4 << 20) + (1 << 20);
  for (size_t i = 0; i < s.roles.size(); ++i)
    s.roles[i].env = {{"SOFTRDMA_TRANSPORT", c.transport},
                      {"SOFTRDMA_WAN", std::string(c.wan) + ",seed=" + std::to_string(7 + i)}};
  s.roles[0].fn = [c](Role& r) {
    const Counters before = r.counters();
    auto context = [&] { return "\n  requester counters:" + Growth{before, r.counters()}.str(); };
    r.barrier();
    const auto t0 = Clock::now();
    kWanTraffic.request(r, context);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    const double elapsed = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    r.send_value(1, uint32_t{1});
    const Growth g{before, r.counters()};
    printf("[ requester] %.0f ms;%s\n", elapsed,
           g.str({"sent_pkts", "wan_shaped", "wan_held", "wan_dropped_loss", "retransmitted_pkts",
                  "retransmit_timeouts", "sent_shm_pkts"})
               .c_str());
    // Every READ waits for its response, so at least one whole round trip passed.
    EXPECT_GE(elapsed, 20.0) << "the 20 ms round trip did not show";
    EXPECT_GT(g["wan_shaped"], 0u);
    EXPECT_GT(g["wan_held"], 0u) << "nothing was delayed";
    if (std::string(c.transport) == "shm") {
      EXPECT_GT(g["sent_shm_pkts"], 0u);
    }
    if (c.lossy) {
      EXPECT_GT(g["wan_dropped_loss"], 0u);
      EXPECT_GT(g["retransmitted_pkts"], 0u) << "losses recovered without retransmission?";
    } else {
      EXPECT_EQ(0u, g["wan_dropped_loss"]);
    }
  };
  s.roles[1].fn = [](Role& r) {
    const Counters before = r.counters();
    kWanTraffic.prepare_target(r);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    r.barrier();
    kWanTraffic.receive_all(r, [&] {
      return "\n  responder counters:" + Growth{before, r.counters()}.str();
    });
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    r.recv_value<uint32_t>(0, 120s);
    EXPECT_TRUE(
        HasPattern(r.buf() + kWanTraffic.read_base, kWanTraffic.read_span, kWanTraffic.read_seed));
    EXPECT_GT((Growth{before, r.counters()}["wan_held"]), 0u) << "ACKs were not delayed";
  };
  s.deadline = 120s;
  run_roles(s);
}

INSTANTIATE_TEST_SUITE_P(
    Emulated, WanLink,
    ::testing::Values(WanCase{"Udp20msRtt", "udp", "delay=10ms,jitter=1ms", false},
                      WanCase{"Shm20msRtt", "shm", "delay=10ms,jitter=1ms", false},
                      WanCase{"Udp20msRttLoss2Percent", "udp", "delay=10ms,loss=2%", true},
                      WanCase{"Shm20msRttLoss2Percent", "shm", "delay=10ms,loss=2%", true}),
    [](const ::testing::TestParamInfo<WanCase>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace softrdma::verbs_test
