// Congestion control through an emulated bottleneck shared by two requesters (one site's
// link to another, with a rate, a queue of two bandwidth-delay products and ECN marking):
// the link's CE marks reach the responder in the IPv4 header, the responder sends RoCEv2
// CNPs, the requesters count them, and with SOFTRDMA_CC=dcqcn they cut their rates and pace
// themselves. How many packets the queue drops in each mode is printed, not asserted: it is
// a measurement, and docs/wide-area.md says what it shows. A requester's capture holds the
// CNPs, which tshark decodes (skipped, saying so, without tshark).
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "verbs/tests/harness.h"

namespace softrdma::verbs_test {
namespace {

constexpr char kRequester0[] = "127.0.13.1";
constexpr char kRequester1[] = "127.0.13.2";
constexpr char kResponder[] = "127.0.13.3";

/// What one run through the bottleneck counted (sums over the two requesters).
struct CcRun {
  uint64_t dropped_queue = 0, ecn_marked = 0, cnp_rcvd = 0, rate_cuts = 0, paced_waits = 0;
  uint64_t ecn_ce_rcvd = 0, cnp_sent = 0;  // the responder's
};

// Two requesters (site a) each WRITE 12 MiB in 1 MiB messages to one responder (site b)
// through a 200 Mbit/s, 10 ms RTT link; `cc` is SOFTRDMA_CC of every role; requester 0
// captures to `pcap` when it is not empty.
CcRun bulk_through_bottleneck(const std::string& cc, const std::string& pcap) {
  constexpr size_t kMessage = 1 << 20, kMessages = 12, kBytes = kMessage * kMessages;
  const std::string dir = "/tmp/softrdma-cc-test-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string topo = dir + "/topology", results = dir + "/results-" + cc;
  std::ofstream(topo) << "site a " << kRequester0 << "-" << kRequester1 << "\n"
                      << "site b " << kResponder << "\n"
                      << "link a <-> b delay=5ms rate=200mbit queue=2bdp ecn=0.25bdp seed=5\n";
  std::filesystem::remove(results);
  Spec s;
  s.conn.path_mtu = IBV_MTU_4096;
  s.conn.timeout = 15;  // 134 ms: above the loaded round trip
  s.conn.retry_cnt = 7;
  s.conn.max_send_wr = 64;
  s.roles.resize(3);
  s.links = {{0, 2}, {1, 2}};
  const char* addrs[] = {kRequester0, kRequester1, kResponder};
  for (size_t i = 0; i < 3; ++i) {
    s.roles[i].buf_size = kBytes;
    s.roles[i].env = {{"SOFTRDMA_ADDR", addrs[i]},
                      {"SOFTRDMA_TRANSPORT", "udp"},
                      {"SOFTRDMA_WAN", topo},
                      {"SOFTRDMA_CC", cc}};
  }
  if (!pcap.empty()) s.roles[0].env.push_back({"SOFTRDMA_PCAP", pcap});
  for (int i = 0; i < 2; ++i)
    s.roles[i].fn = [results](Role& r) {
      std::memset(r.buf(), r.index() + 1, kBytes);
      const Counters before = r.counters();
      r.barrier();
      write_stream(r, kMessage, kMessages);
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
      r.barrier();  // both done: the responder may read its counters
      const Growth g{before, r.counters()};
      printf("[requester %d]%s\n", r.index(),
             g.str({"wan_dropped_queue", "wan_ecn_marked", "cnp_rcvd", "dcqcn_rate_cuts",
                    "paced_waits", "retransmitted_pkts"})
                 .c_str());
      std::ofstream(results, std::ios::app)
          << "requester " << g["wan_dropped_queue"] << " " << g["wan_ecn_marked"] << " "
          << g["cnp_rcvd"] << " " << g["dcqcn_rate_cuts"] << " " << g["paced_waits"] << "\n";
    };
  s.roles[2].fn = [results](Role& r) {
    const Counters before = r.counters();
    r.barrier();
    r.barrier();
    const Growth g{before, r.counters()};
    printf("[responder]%s\n", g.str({"ecn_ce_rcvd", "cnp_sent"}).c_str());
    std::ofstream(results, std::ios::app)
        << "responder " << g["ecn_ce_rcvd"] << " " << g["cnp_sent"] << "\n";
  };
  s.deadline = 120s;
  run_roles(s);
  CcRun run;
  std::ifstream in(results);
  std::string who;
  while (in >> who) {
    uint64_t a = 0, b = 0, c = 0, d = 0, e = 0;
    if (who == "requester") {
      in >> a >> b >> c >> d >> e;
      run.dropped_queue += a;
      run.ecn_marked += b;
      run.cnp_rcvd += c;
      run.rate_cuts += d;
      run.paced_waits += e;
    } else {
      in >> a >> b;
      run.ecn_ce_rcvd += a;
      run.cnp_sent += b;
    }
  }
  std::filesystem::remove_all(dir);
  return run;
}

TEST(Congestion, CeMarksDrawCnpsAndDcqcnCutsRatesAndPaces) {
  const CcRun none = bulk_through_bottleneck("none", "");
  ASSERT_FALSE(::testing::Test::HasFailure());
  const std::string pcap = "/tmp/softrdma-cc-cnp-" + std::to_string(::getpid()) + ".pcap";
  const CcRun dcqcn = bulk_through_bottleneck("dcqcn", pcap);
  ASSERT_FALSE(::testing::Test::HasFailure());
  printf("queue drops: none %llu, dcqcn %llu; CNPs received: none %llu, dcqcn %llu\n",
         (unsigned long long)none.dropped_queue, (unsigned long long)dcqcn.dropped_queue,
         (unsigned long long)none.cnp_rcvd, (unsigned long long)dcqcn.cnp_rcvd);
  // Marks reach the responder as CE and come back as CNPs in both modes (the responder is
  // a notification point whatever the requester does with them).
  for (const CcRun* r : {&none, &dcqcn}) {
    EXPECT_GT(r->ecn_marked, 0u);
    EXPECT_GT(r->ecn_ce_rcvd, 0u);
    EXPECT_GT(r->cnp_sent, 0u);
    EXPECT_GT(r->cnp_rcvd, 0u);
    EXPECT_LE(r->cnp_rcvd, r->cnp_sent);
  }
  EXPECT_EQ(none.rate_cuts, 0u);
  EXPECT_GT(dcqcn.rate_cuts, 0u);
  // Both modes pace on this long path (without DCQCN the window's own pacer, in congestion
  // avoidance: engine/requester.cpp pacing_rate); only DCQCN cuts rates at CNPs.
  EXPECT_GT(dcqcn.paced_waits, 0u) << "DCQCN cut the rates but never held a packet back";
  EXPECT_GT(none.dropped_queue, 0u) << "two slow starts into a 2-BDP queue overflowed nothing?";

  // The CNPs in requester 0's capture decode as RoCEv2 (InfiniBand BTH over UDP 4791) with
  // opcode 0x81, one destination QP (requester 0's), PSN 0, and 16 reserved bytes + ICRC
  // after the BTH (a 74-byte Ethernet frame). Wireshark names opcode 0x80 "CNP" (the
  // InfiniBand congestion-control annex A10); 0x81, the RoCEv2 CNP of annex A17.9.3 that
  // RoCE NICs send, it shows as "Unknown OpCode" up to at least 4.0.
  if (!have_tool("tshark")) {
    std::filesystem::remove(pcap);
    GTEST_SKIP() << "tshark is not installed: the CNP decode check is skipped";
  }
  const std::string text = command_output(
      "tshark -r '" + pcap +
      "' -Y 'infiniband.bth.opcode == 0x81' -T fields -E separator=, "
      "-e infiniband.bth.opcode -e infiniband.bth.destqp -e infiniband.bth.psn -e frame.len "
      "2>/dev/null");
  std::filesystem::remove(pcap);
  std::istringstream lines(text);
  std::string line, qpn;
  size_t cnps = 0;
  while (std::getline(lines, line)) {
    ++cnps;
    std::istringstream f(line);
    std::string op, dqp, psn, len;
    std::getline(f, op, ',');
    std::getline(f, dqp, ',');
    std::getline(f, psn, ',');
    std::getline(f, len, ',');
    EXPECT_EQ(std::stoul(op, nullptr, 0), 0x81u) << line;
    EXPECT_EQ(std::stoul(psn, nullptr, 0), 0u) << line;
    EXPECT_EQ(len, "74") << line;
    if (qpn.empty()) qpn = dqp;
    EXPECT_EQ(dqp, qpn) << "CNPs to requester 0 name its one QP";
  }
  EXPECT_GT(cnps, 0u) << "no CNP in the capture";
}

}  // namespace
}  // namespace softrdma::verbs_test
