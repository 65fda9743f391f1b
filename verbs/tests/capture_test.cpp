// Packet capture (SOFTRDMA_PCAP): a SEND, a WRITE with immediate, a READ, both atomics and an
// RDMA ATOMIC WRITE (opcode 0x1D) between two processes are captured by the requester's device;
// tshark must decode the file as RoCEv2 with the expected opcodes, PSNs and ICRCs, and a capture of
// the same traffic by tcpdump on loopback must decode to the same packets.
#include <gtest/gtest.h>
#include <pcap/pcap.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "verbs/tests/harness.h"
#include "wire/icrc.h"
#include "wire/roce.h"

namespace softrdma::verbs_test {
namespace {

// Each test its own pair of addresses: ctest runs them in parallel, and tcpdump filters on
// the requester's.
constexpr char kRequester[] = "127.0.12.1";
constexpr char kResponder[] = "127.0.12.2";
constexpr char kRequester2[] = "127.0.12.3";
constexpr char kResponder2[] = "127.0.12.4";

/// One decoded packet: what tshark printed for it.
struct Decoded {
  std::string src, dst;
  unsigned opcode = 0, qpn = 0, psn = 0;
  uint32_t icrc = 0;
  bool operator<(const Decoded& o) const {
    return std::tie(src, opcode, psn, qpn, icrc, dst) <
           std::tie(o.src, o.opcode, o.psn, o.qpn, o.icrc, o.dst);
  }
  bool operator==(const Decoded& o) const {
    return std::tie(src, dst, opcode, qpn, psn, icrc) ==
           std::tie(o.src, o.dst, o.opcode, o.qpn, o.psn, o.icrc);
  }
  friend void PrintTo(const Decoded& d, std::ostream* os) {
    *os << d.src << ">" << d.dst << " op=0x" << std::hex << d.opcode << " qpn=0x" << d.qpn
        << " psn=0x" << d.psn << " icrc=0x" << d.icrc << std::dec;
  }
};

/// tshark's view of every RoCEv2 packet in `file`.
std::vector<Decoded> decode(const std::string& file) {
  std::vector<Decoded> out;
  const std::string text = command_output(
      "tshark -r '" + file +
      "' -Y infiniband -T fields -E separator=, -e ip.src -e ip.dst -e infiniband.bth.opcode "
      "-e infiniband.bth.destqp -e infiniband.bth.psn -e infiniband.invariant.crc 2>/dev/null");
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream f(line);
    Decoded d;
    std::string opcode, qpn, psn, icrc;
    std::getline(f, d.src, ',');
    std::getline(f, d.dst, ',');
    std::getline(f, opcode, ',');
    std::getline(f, qpn, ',');
    std::getline(f, psn, ',');
    std::getline(f, icrc, ',');
    d.opcode = unsigned(std::stoul(opcode, nullptr, 0));
    d.qpn = unsigned(std::stoul(qpn, nullptr, 0));
    d.psn = unsigned(std::stoul(psn, nullptr, 0));
    // Wireshark 4.0 does not know RDMA ATOMIC WRITE (0x1D, IBTA rel. 1.5): it decodes the
    // BTH and shows the rest as unknown data, with no ICRC field (checked from the frame).
    d.icrc = icrc.empty() ? 0 : uint32_t(std::stoul(icrc, nullptr, 0));
    out.push_back(d);
  }
  return out;
}

/// The ICRC each frame of `file` must carry, computed here from the frame's own IPv4/UDP
/// headers and payload (wire/icrc.h), as tshark displays it (the little-endian wire bytes
/// read as a big-endian number). With `carried`, also the last 4 bytes each frame carries,
/// read the same way.
std::vector<uint32_t> expected_icrcs(const std::string& file,
                                     std::vector<uint32_t>* carried = nullptr) {
  std::vector<uint32_t> out;
  char err[PCAP_ERRBUF_SIZE];
  pcap_t* p = pcap_open_offline(file.c_str(), err);
  if (!p) return out;
  pcap_pkthdr* h;
  const u_char* data;
  while (pcap_next_ex(p, &h, &data) == 1) {
    const uint8_t* ip = data + 14;
    const uint8_t* udp = ip + 20;
    wire::Ipv4UdpTuple t;
    t.src_ip = uint32_t(ip[12]) << 24 | uint32_t(ip[13]) << 16 | uint32_t(ip[14]) << 8 | ip[15];
    t.dst_ip = uint32_t(ip[16]) << 24 | uint32_t(ip[17]) << 16 | uint32_t(ip[18]) << 8 | ip[19];
    t.ip_id = uint16_t(ip[4] << 8 | ip[5]);
    t.dont_fragment = ip[6] & 0x40;
    t.src_port = uint16_t(udp[0] << 8 | udp[1]);
    t.dst_port = uint16_t(udp[2] << 8 | udp[3]);
    const size_t len = size_t(udp[4] << 8 | udp[5]) - 8;
    const uint32_t icrc = wire::icrc_compute(t, std::span<const uint8_t>(udp + 8, len - 4));
    out.push_back(__builtin_bswap32(icrc));
    if (carried) {
      const uint8_t* c = udp + 8 + len - 4;
      carried->push_back(uint32_t(c[0]) << 24 | uint32_t(c[1]) << 16 | uint32_t(c[2]) << 8 | c[3]);
    }
  }
  pcap_close(p);
  return out;
}

// Frames in the pcap file `path` (0 when it cannot be read; a frame still being written at
// the end is not counted).
size_t frames_in(const std::string& path) {
  char err[PCAP_ERRBUF_SIZE];
  pcap_t* p = pcap_open_offline(path.c_str(), err);
  if (!p) return 0;
  size_t n = 0;
  pcap_pkthdr* h;
  const u_char* data;
  while (pcap_next_ex(p, &h, &data) == 1) ++n;
  pcap_close(p);
  return n;
}

using Env = std::vector<std::pair<std::string, std::string>>;

// Runs the exchange with `path_env` added to both roles' environment, checks what the
// requester's capture decodes to, and returns it in *out. With `compare_tcpdump`, tcpdump on
// loopback records the same traffic and must decode to the same packets.
void exchange_and_check(const Env& path_env, bool compare_tcpdump, std::vector<Decoded>* out,
                        const char* requester = kRequester, const char* responder = kResponder) {
  if (!have_tool("tshark"))
    FAIL() << "tshark is missing: install Debian's tshark (scripts/deps.sh)";
  static int run = 0;
  const auto dir = std::filesystem::temp_directory_path() /
                   ("softrdma-capture-" + std::to_string(::getpid()) + "-" + std::to_string(++run));
  std::filesystem::create_directories(dir);
  const std::string ours = (dir / "requester.pcap").string();
  const std::string theirs = (dir / "tcpdump.pcap").string();

  // tcpdump needs CAP_NET_RAW; CI runs as root. Without it that half is skipped, loudly.
  pid_t tcpdump = -1;
  const bool can_tcpdump = compare_tcpdump && have_tool("tcpdump") && ::geteuid() == 0;
  if (can_tcpdump) {
    tcpdump = ::fork();
    if (tcpdump == 0) {
      // --immediate-mode: deliver each packet at once, not in 1 s kernel blocks that a
      // SIGINT would cut short.
      ::execlp("tcpdump", "tcpdump", "--immediate-mode", "-i", "lo", "-U", "-n", "-w",
               theirs.c_str(), "udp", "port", "4791", "and", "host", requester,
               static_cast<char*>(nullptr));
      ::_exit(127);
    }
    // Wait until the capture file exists (tcpdump writes its header once it listens).
    for (int i = 0; i < 200 && !std::filesystem::exists(theirs); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }

  ConnOptions conn;
  conn.path_mtu = IBV_MTU_1024;
  Spec spec;
  spec.conn = conn;
  spec.links = {{0, 1}};
  spec.roles.resize(2);
  spec.roles[0].env = {{"SOFTRDMA_ADDR", requester}, {"SOFTRDMA_PCAP", ours}};
  spec.roles[1].env = {{"SOFTRDMA_ADDR", responder}};
  for (auto& role : spec.roles) role.env.insert(role.env.end(), path_env.begin(), path_env.end());
  spec.roles[0].fn = [](Role& r) {
    auto& l = r.link();
    fill_pattern(r.buf(), 8192, 7);
    r.barrier();
    ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_SEND, 1, r.buf(), 100, r.lkey()));
    ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_RDMA_WRITE_WITH_IMM, 2, r.buf(), 3000, r.lkey(),
                           l.remote.addr + 4096, l.remote.rkey, htonl(0x1234)));
    ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_RDMA_READ, 3, r.buf() + 8192, 2000, r.lkey(),
                           l.remote.addr + 16384, l.remote.rkey));
    for (uint64_t id : {1u, 2u, 3u}) EXPECT_EQ(IBV_WC_SUCCESS, poll_one(l.ep.scq).status) << id;
    ASSERT_EQ(0, SendWr(IBV_WR_ATOMIC_CMP_AND_SWP, 4)
                     .add_sge(r.buf() + 12288, 8, r.lkey())
                     .atomic(l.remote.addr + 32768, l.remote.rkey, 0, 5)
                     .post(l.ep.qp));
    EXPECT_EQ(IBV_WC_SUCCESS, poll_one(l.ep.scq).status);
    ASSERT_EQ(0, SendWr(IBV_WR_ATOMIC_FETCH_AND_ADD, 5)
                     .add_sge(r.buf() + 12296, 8, r.lkey())
                     .atomic(l.remote.addr + 32768, l.remote.rkey, 3)
                     .post(l.ep.qp));
    EXPECT_EQ(IBV_WC_SUCCESS, poll_one(l.ep.scq).status);
    ASSERT_EQ(0, SendWr(IBV_WR_ATOMIC_WRITE, 6)
                     .add_sge(r.buf() + 12304, 8, r.lkey())
                     .remote(l.remote.addr + 32776, l.remote.rkey)
                     .post(l.ep.qp));
    EXPECT_EQ(IBV_WC_SUCCESS, poll_one(l.ep.scq).status);
    r.barrier();
  };
  spec.roles[1].fn = [](Role& r) {
    auto& l = r.link();
    std::memset(r.buf() + 32768, 0, 8);
    ASSERT_EQ(0, post_recv(l.ep.qp, 10, r.buf(), 4096, r.lkey()));
    ASSERT_EQ(0, post_recv(l.ep.qp, 11, r.buf(), 4096, r.lkey()));
    r.barrier();
    for (int i = 0; i < 2; ++i) EXPECT_EQ(IBV_WC_SUCCESS, poll_one(l.ep.rcq).status);
    r.barrier();
  };
  run_roles(spec);

  if (tcpdump > 0) {
    // SIGINT ends tcpdump's loop, and what it has not read from the socket by then is lost:
    // wait until it has written as many frames as the device recorded (a fixed 300 ms
    // assumed tcpdump had a free core; at most 20 s, then the comparison below tells).
    const size_t recorded = frames_in(ours);
    for (int i = 0; i < 1000 && frames_in(theirs) < recorded; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ::kill(tcpdump, SIGINT);
    int status = 0;
    ::waitpid(tcpdump, &status, 0);
  }

  const std::vector<Decoded> got = decode(ours);
  ASSERT_FALSE(got.empty()) << "tshark decoded no RoCEv2 packet in " << ours;

  // Requests, in order, with consecutive PSNs (the READ of 2000 B at MTU 1024 uses two).
  std::vector<Decoded> req;
  for (const auto& d : got)
    if (d.src == requester && d.opcode != 0x11) req.push_back(d);
  const std::vector<unsigned> want_ops = {0x04, 0x06, 0x07, 0x09, 0x0c, 0x13, 0x14, 0x1d};
  ASSERT_EQ(req.size(), want_ops.size());
  const std::vector<unsigned> psn_step = {1, 1, 1, 1, 2, 1, 1};
  for (size_t i = 0; i < req.size(); ++i) {
    EXPECT_EQ(req[i].opcode, want_ops[i]) << "request " << i;
    EXPECT_EQ(req[i].qpn, req[0].qpn);
    if (i) {
      EXPECT_EQ(req[i].psn, (req[i - 1].psn + psn_step[i - 1]) & 0xffffff) << i;
    }
  }
  // Responses: ACK(s), two read responses with the READ's PSNs, two atomic ACKs.
  std::vector<Decoded> resp;
  for (const auto& d : got)
    if (d.src == responder) resp.push_back(d);
  auto has = [&](unsigned op, unsigned psn) {
    return std::any_of(resp.begin(), resp.end(),
                       [&](const Decoded& d) { return d.opcode == op && d.psn == psn; });
  };
  EXPECT_TRUE(has(0x0d, req[4].psn)) << "READ response first";
  EXPECT_TRUE(has(0x0f, (req[4].psn + 1) & 0xffffff)) << "READ response last";
  EXPECT_TRUE(has(0x12, req[5].psn)) << "atomic ACK of COMPARE & SWAP";
  EXPECT_TRUE(has(0x12, req[6].psn)) << "atomic ACK of FETCH & ADD";
  EXPECT_TRUE(has(0x11, req[3].psn)) << "ACK of the WRITE with immediate";
  EXPECT_TRUE(has(0x11, req[7].psn)) << "ACK of the ATOMIC WRITE";

  // Every ICRC tshark shows is the one the frame's bytes call for; where it shows none (only
  // ATOMIC WRITE, unknown to Wireshark 4.0), the frame's last 4 bytes are.
  std::vector<uint32_t> carried;
  const std::vector<uint32_t> icrc = expected_icrcs(ours, &carried);
  ASSERT_EQ(icrc.size(), got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].opcode == 0x1d) {
      EXPECT_EQ(carried[i], icrc[i]) << "frame " << i << " (ATOMIC WRITE)";
      if (got[i].icrc) {
        EXPECT_EQ(got[i].icrc, icrc[i]) << "frame " << i;  // a tshark that knows 0x1D
      }
    } else {
      EXPECT_EQ(got[i].icrc, icrc[i]) << "frame " << i;
    }
  }
  if (out) *out = got;

  if (!compare_tcpdump) {
    std::filesystem::remove_all(dir);
    return;
  }
  if (!can_tcpdump) {
    std::filesystem::remove_all(dir);
    GTEST_SKIP() << "tcpdump comparison needs root (CAP_NET_RAW); the capture itself passed";
  }
  std::vector<Decoded> seen = decode(theirs);
  std::vector<Decoded> mine = got;
  std::sort(seen.begin(), seen.end());
  std::sort(mine.begin(), mine.end());
  EXPECT_EQ(seen, mine) << "tcpdump -i lo saw other packets than the device recorded ("
                        << seen.size() << " vs " << mine.size() << ")";
  std::filesystem::remove_all(dir);
}

// On the wire path with GSO off (SOFTRDMA_TRANSPORT=udp SOFTRDMA_GSO=0), every RoCEv2
// packet is its own datagram on lo, so tcpdump sees exactly what the device recorded. (With
// GSO, lo carries each batch unsegmented and tcpdump shows it as one datagram; on the
// same-host path nothing crosses lo at all.)
TEST(Capture, TsharkDecodesEveryOpcodeAndTcpdumpAgrees) {
  exchange_and_check({{"SOFTRDMA_TRANSPORT", "udp"}, {"SOFTRDMA_GSO", "0"}}, true, nullptr);
}

// The same exchange over UDP (GSO on) and over the same-host shared-memory path records the
// same packets: opcodes, PSNs relative to the first request, directions, valid ICRCs.
TEST(Capture, SameHostPathRecordsTheSamePacketsAsUdp) {
  std::vector<Decoded> udp, shm;
  exchange_and_check({{"SOFTRDMA_TRANSPORT", "udp"}}, false, &udp, kRequester2, kResponder2);
  exchange_and_check({{"SOFTRDMA_TRANSPORT", "shm"}}, false, &shm, kRequester2, kResponder2);
  ASSERT_FALSE(udp.empty());
  ASSERT_FALSE(shm.empty());
  // QPNs and initial PSNs are random per run: compare PSNs relative to each direction's
  // first packet; ICRCs were checked against the frames inside exchange_and_check. How many
  // plain ACKs the responder coalesces depends on timing, so those are left out.
  auto normalise = [](std::vector<Decoded> all) {
    std::vector<Decoded> v;
    for (const Decoded& d : all)
      if (d.opcode != 0x11) v.push_back(d);
    std::map<std::string, unsigned> first;
    for (Decoded& d : v) {
      auto [it, fresh] = first.emplace(d.src, d.psn);
      d.psn = (d.psn - it->second) & 0xffffff;
      d.qpn = 0;
      d.icrc = 0;
    }
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(normalise(udp), normalise(shm));
}

}  // namespace
}  // namespace softrdma::verbs_test
