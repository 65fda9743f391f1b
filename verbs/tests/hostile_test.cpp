// Hostile packets (issue #14, "one forged packet must not kill a connection"). RoCEv2 has no
// authentication: anyone who can reach UDP port 4791 can send a packet with a valid ICRC.
// These tests play that attacker while a long RC transfer runs between two softrdma
// processes:
//
//   role 0 (requester A) — rounds of a 64 KiB RDMA WRITE, a READ back of it, a 32-64 KiB
//                          READ of a pattern region, a 4 KiB SEND and a FETCH & ADD, each
//                          round verified, until the attacker is done (plus two rounds);
//   role 1 (responder B) — posts receives, checks every SEND in order, and at the end its
//                          memory: the written slots, the pattern region, the FETCH & ADD
//                          word (exactly one add per round), a sentinel word nothing legit
//                          touches, and the guard pages around its MR;
//   role 2 (attacker C)  — learns QPNs, initial PSNs and the rkey over the harness's setup
//                          pipes (QPNs and PSN ranges can be probed; the issue grants this),
//                          and sends forged packets with valid ICRCs.
//
// "From the peer's address": the peer's device holds <peer ip>:4791, so the attacker binds
// <peer ip>:<ephemeral port> instead. The engine accepts a packet for a QP when its source
// IP is the QP's peer (Device::handle_datagram checks the address, not the port), and the
// ICRC covers the UDP source port, so the forged tuple carries that port.
//
// The single-process tests at the end use rawpkt's FakePeer as the connected peer, to see
// exactly which packets the device sends: one sequence NAK per gap, one go-back-N for
// repeated sequence NAKs, and NAKs for an already-acknowledged PSN dropped as stale.
#include <arpa/inet.h>
#include <endian.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "verbs/tests/harness.h"
#include "verbs/tests/rawpkt.h"

namespace softrdma::verbs_test {
namespace {

using namespace raw;

// AETH syndromes (IBTA vol 1, 9.7.5.1 table 43).
constexpr uint8_t kRnrNak = 0x20 | 1;  // RNR NAK, timer code 1 (0.01 ms)
constexpr uint8_t kNakSeq = 0x60;
constexpr uint8_t kNakInvalidRequest = 0x61;
constexpr uint8_t kNakRemoteAccess = 0x62;
constexpr uint8_t kNakRemoteOperational = 0x63;

// ---- the workload ----------------------------------------------------------------------

constexpr uint32_t kMtu = 1024;
constexpr uint64_t kSlot = 64 << 10;  // WRITE size; the target has kSlots slots
constexpr int kSlots = 16;
constexpr uint64_t kWriteRegion = 0;
constexpr uint64_t kReadRegion = kSlots * kSlot;  // 1 MiB of pattern kReadSeed
constexpr uint64_t kReadSpan = 1 << 20;
constexpr uint64_t kRecvRegion = kReadRegion + kReadSpan;
constexpr int kRecvDepth = 16;
constexpr uint32_t kSendLen = 4096;
constexpr uint64_t kAtomicRegion = kRecvRegion + kRecvDepth * 8192;
constexpr uint64_t kCounterOff = kAtomicRegion;        // FETCH & ADD +1 per round
constexpr uint64_t kSentinelOff = kAtomicRegion + 64;  // never touched by the legit side
constexpr uint64_t kSentinel = 0x5e47196e0badf00dull;
constexpr size_t kTargetSize = kAtomicRegion + 4096;
constexpr uint64_t kReadSeed = 4242;

constexpr int kMinRounds = 20;  // ≥ 3.5 MiB moved
constexpr int kMaxRounds = 2000;
constexpr int kRoundsAfterAttack = 2;

// Requester buffer layout.
constexpr uint64_t kSrc = 0;
constexpr uint64_t kReadBack = kSlot;
constexpr uint64_t kReadDst = 2 * kSlot;
constexpr uint64_t kSendBuf = 3 * kSlot;
constexpr uint64_t kFaddRes = 3 * kSlot + kSendLen;
constexpr size_t kRequesterSize = 4 * kSlot;

uint64_t write_seed(int round) {
  return 1000 + round;
}
uint64_t read_off(int round) {
  return uint64_t(round) * 7919u * 8 % (kReadSpan - kSlot);
}
uint32_t read_len(int round) {
  return 32768 + uint32_t(round) * 4099u % 32768;
}
uint32_t psns(uint64_t bytes) {
  return bytes == 0 ? 1 : static_cast<uint32_t>((bytes + kMtu - 1) / kMtu);
}
// PSNs one round uses: WRITE, READ back, READ, SEND, FETCH & ADD (in that order).
uint32_t round_psns(int round) {
  return psns(kSlot) + psns(kSlot) + psns(read_len(round)) + psns(kSendLen) + 1;
}

struct SendHeader {
  uint32_t seq;
  uint32_t last;
  uint32_t rounds;
};

/// State shared by the three roles (MAP_SHARED, inherited over fork).
struct Shared {
  std::atomic<uint32_t> rounds_done{0};
  std::atomic<uint32_t> psns_done{0};     ///< PSNs A has completions for (so B executed them)
  std::atomic<uint32_t> fadd_psns[64]{};  ///< PSNs of executed FETCH & ADDs (ring)
  std::atomic<uint32_t> fadds{0};
  std::atomic<uint32_t> attack_started{0};
  std::atomic<uint32_t> attack_done{0};
  std::atomic<uint32_t> requester_failed{0};
  /// Lockstep (an attack that must never hit the expected PSN itself): before each round
  /// the requester sets `idle_round` to round + 1 — nothing is outstanding then, so the
  /// responder's expected PSN is exactly done_psn() — and waits until the attacker has set
  /// `attacker_round` to it (its burst is sent and received) or is done.
  std::atomic<uint32_t> lockstep{0};
  std::atomic<uint32_t> idle_round{0};
  std::atomic<uint32_t> attacker_round{0};
};

/// What the attacker learns about one endpoint.
struct Learned {
  uint32_t qpn = 0;
  uint32_t init_psn = 0;  ///< the endpoint's first send PSN
};

enum class Outcome {
  kSurvives,        ///< every round completes and verifies, both QPs stay RTS
  kRequesterFails,  ///< the requester's QP goes to ERR with IBV_WC_REM_ACCESS_ERR
};

struct Ctx {
  Shared* sh;
  Outcome outcome;
};

void requester(Role& r, const Ctx& c) {
  Link& l = r.link(1);
  r.send_value(2, Learned{l.ep.qpn, l.ep.psn});
  const Counters before = r.counters();
  r.barrier();
  uint8_t* b = r.buf();
  const uint64_t rb = l.remote.addr;
  const uint32_t rkey = l.remote.rkey;
  const auto start = Clock::now();
  uint32_t psn_done = 0;
  int attack_seen_at = -1;
  bool failed = false;
  int round = 0;
  for (; round < kMaxRounds; ++round) {
    if (attack_seen_at < 0 && c.sh->attack_done.load()) attack_seen_at = round;
    const bool last = round == kMaxRounds - 1 ||
                      (attack_seen_at >= 0 && round >= attack_seen_at + kRoundsAfterAttack &&
                       round >= kMinRounds - 1);
    ASSERT_LT(Clock::now() - start, 60s) << "transfer still running after 60 s, round " << round;
    if (c.sh->lockstep.load() && round > 0 && !c.sh->attack_done.load()) {
      c.sh->idle_round.store(uint32_t(round) + 1);
      const auto until = Clock::now() + 20s;
      while (c.sh->attacker_round.load() <= uint32_t(round) && !c.sh->attack_done.load()) {
        ASSERT_LT(Clock::now(), until) << "the attacker never let round " << round << " go";
        std::this_thread::sleep_for(100us);
      }
    }
    const uint64_t slot = kWriteRegion + (round % kSlots) * kSlot;
    fill_pattern(b + kSrc, kSlot, write_seed(round));
    memset(b + kReadBack, kGuard, kSlot);
    memset(b + kReadDst, kGuard, kSlot);
    SendHeader h{uint32_t(round), last ? 1u : 0u, uint32_t(round + 1)};
    fill_pattern(b + kSendBuf, kSendLen, 5000 + round);
    memcpy(b + kSendBuf, &h, sizeof h);
    auto* res = reinterpret_cast<uint64_t*>(b + kFaddRes);
    *res = ~0ull;
    const uint64_t id = uint64_t(round) * 8;
    ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_RDMA_WRITE, id + 0, b + kSrc, kSlot, r.lkey(), rb + slot,
                           rkey));
    ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_RDMA_READ, id + 1, b + kReadBack, kSlot, r.lkey(),
                           rb + slot, rkey));
    ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_RDMA_READ, id + 2, b + kReadDst, read_len(round),
                           r.lkey(), rb + kReadRegion + read_off(round), rkey));
    ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_SEND, id + 3, b + kSendBuf, kSendLen, r.lkey()));
    SendWr f(IBV_WR_ATOMIC_FETCH_AND_ADD, id + 4);
    f.add_sge(res, 8, r.lkey()).atomic(rb + kCounterOff, rkey, 1);
    ASSERT_EQ(0, f.post(l.ep.qp));
    for (int k = 0; k < 5; ++k) {
      ibv_wc wc{};
      ASSERT_TRUE(try_poll_one(l.ep.scq, wc, 20s))
          << "round " << round << " WR " << k
          << ": no completion in 20 s\n  requester counters:" << Growth{before, r.counters()}.str();
      if (c.outcome == Outcome::kRequesterFails && wc.status != IBV_WC_SUCCESS) {
        // The first error is the WQE the forged NAK named (or an earlier one it
        // acknowledged past); everything after it is flushed.
        EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, wc.status) << describe(wc);
        for (int j = k + 1; j < 5; ++j) {
          ibv_wc fl{};
          ASSERT_TRUE(try_poll_one(l.ep.scq, fl, 5s)) << "no flush completion";
          EXPECT_EQ(IBV_WC_WR_FLUSH_ERR, fl.status) << describe(fl);
        }
        failed = true;
        break;
      }
      ASSERT_EQ(IBV_WC_SUCCESS, wc.status)
          << "round " << round << ": " << describe(wc)
          << "\n  requester counters:" << Growth{before, r.counters()}.str();
      ASSERT_EQ(id + k, wc.wr_id);
    }
    if (failed) break;
    ASSERT_TRUE(HasPattern(b + kReadBack, kSlot, write_seed(round)))
        << "READ back, round " << round;
    ASSERT_TRUE(HasPattern(b + kReadDst, read_len(round), kReadSeed, read_off(round)))
        << "READ, round " << round;
    ASSERT_TRUE(AllBytesAre(b + kReadDst + read_len(round), kSlot - read_len(round), kGuard));
    ASSERT_EQ(uint64_t(round), *res) << "FETCH & ADD result, round " << round;
    const uint32_t fadd_psn = psn_add(l.ep.psn, psn_done + round_psns(round) - 1);
    psn_done += round_psns(round);
    c.sh->fadd_psns[c.sh->fadds.load() % 64].store(fadd_psn);
    c.sh->fadds.fetch_add(1);
    c.sh->psns_done.store(psn_done);
    c.sh->rounds_done.store(round + 1);
    if (last) break;
  }
  const Counters after = r.counters();
  printf("[ requester] %d rounds, %.1f MiB moved in %.2f s;%s\n", round + (failed ? 0 : 1),
         (round + 1) * (2.0 * kSlot + 48 * 1024 + kSendLen) / (1 << 20),
         std::chrono::duration<double>(Clock::now() - start).count(),
         Growth{before, after}.str().c_str());
  EXPECT_TRUE(AllBytesAre(r.buffer().guard_before(), Buffer::page_size(), kGuard));
  EXPECT_TRUE(AllBytesAre(r.buffer().guard_after(), Buffer::page_size(), kGuard));
  if (c.outcome == Outcome::kSurvives) {
    EXPECT_EQ(IBV_QPS_RTS, qp_state(l.ep.qp));
    EXPECT_GE(c.sh->attack_done.load(), 1u) << "the transfer ended before the attack did";
  } else {
    ASSERT_TRUE(failed) << "the forged NAK never failed the requester";
    EXPECT_EQ(IBV_QPS_ERR, qp_state(l.ep.qp));
    c.sh->requester_failed.store(1);
  }
}

void responder(Role& r, const Ctx& c) {
  Link& l = r.link(0);
  r.send_value(2, Learned{l.ep.qpn, l.ep.psn});
  uint8_t* b = r.buf();
  fill_pattern(b + kReadRegion, kReadSpan, kReadSeed);
  memset(b + kWriteRegion, 0, kSlots * kSlot);
  __atomic_store_n(reinterpret_cast<uint64_t*>(b + kCounterOff), 0, __ATOMIC_RELEASE);
  __atomic_store_n(reinterpret_cast<uint64_t*>(b + kSentinelOff), kSentinel, __ATOMIC_RELEASE);
  for (int k = 0; k < kRecvDepth; ++k)
    ASSERT_EQ(0, post_recv(l.ep.qp, k, b + kRecvRegion + k * 8192, 8192, r.lkey()));
  const Counters before = r.counters();
  r.barrier();
  const auto start = Clock::now();
  uint32_t seq = 0, rounds = 0;
  for (;;) {
    ASSERT_LT(Clock::now() - start, 90s) << "SEND " << seq << " never arrived";
    ibv_wc wc{};
    if (!try_poll_one(l.ep.rcq, wc, 100ms)) {
      if (c.sh->requester_failed.load()) break;
      continue;
    }
    ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << describe(wc);
    ASSERT_EQ(IBV_WC_RECV, wc.opcode);
    ASSERT_EQ(kSendLen, wc.byte_len);
    ASSERT_EQ(uint64_t(seq % kRecvDepth), wc.wr_id);
    uint8_t* p = b + kRecvRegion + wc.wr_id * 8192;
    SendHeader h;
    memcpy(&h, p, sizeof h);
    ASSERT_EQ(seq, h.seq) << "SEND delivered out of order, twice or not at all";
    ASSERT_TRUE(HasPattern(p + sizeof h, kSendLen - sizeof h, 5000 + seq, sizeof h));
    ASSERT_EQ(0, post_recv(l.ep.qp, wc.wr_id, p, 8192, r.lkey()));
    ++seq;
    if (h.last) {
      rounds = h.rounds;
      break;
    }
  }
  ibv_wc extra{};
  EXPECT_TRUE(no_completion(l.ep.rcq, 50ms, &extra)) << "extra delivery: " << describe(extra);
  EXPECT_EQ(IBV_QPS_RTS, qp_state(l.ep.qp)) << "a forged packet moved the responder's QP";
  EXPECT_EQ(kSentinel,
            __atomic_load_n(reinterpret_cast<uint64_t*>(b + kSentinelOff), __ATOMIC_ACQUIRE))
      << "a forged atomic was executed";
  if (c.outcome == Outcome::kSurvives) {
    EXPECT_EQ(uint64_t(rounds),
              __atomic_load_n(reinterpret_cast<uint64_t*>(b + kCounterOff), __ATOMIC_ACQUIRE))
        << "FETCH & ADD executed twice or not at all";
    for (int s = 0; s < kSlots && s < int(rounds); ++s) {
      const int last_round = int(rounds) - 1 - ((int(rounds) - 1 - s) % kSlots);
      EXPECT_TRUE(HasPattern(b + kWriteRegion + s * kSlot, kSlot, write_seed(last_round)))
          << "write slot " << s << " (round " << last_round << ")";
    }
  }
  EXPECT_TRUE(HasPattern(b + kReadRegion, kReadSpan, kReadSeed)) << "READ region written";
  EXPECT_TRUE(AllBytesAre(r.buffer().guard_before(), Buffer::page_size(), kGuard))
      << "written below the MR";
  EXPECT_TRUE(AllBytesAre(r.buffer().guard_after(), Buffer::page_size(), kGuard))
      << "written above the MR";
  printf("[ responder] %u SENDs;%s\n", seq, Growth{before, r.counters()}.str().c_str());
}

// ---- the attacker ----------------------------------------------------------------------

/// A UDP socket bound to <ip>:<ephemeral port>: sends as `ip` while the device there holds
/// port 4791.
class Forger {
 public:
  ~Forger() {
    if (fd_ >= 0) close(fd_);
  }
  bool open(uint32_t ip) {
    fd_ = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return false;
    const int pmtu = IP_PMTUDISC_DO;  // DF: IPv4 id 0, as the ICRC below assumes
    setsockopt(fd_, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(ip);
    a.sin_port = 0;
    socklen_t al = sizeof a;
    if (bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &al) != 0)
      return false;
    ip_ = ip;
    port_ = ntohs(a.sin_port);
    return port_ != kRocePort;
  }
  Tuple tuple_to(uint32_t dst) const { return Tuple{ip_, dst, port_, kRocePort, 0, true}; }
  bool send_to(uint32_t dst, const std::vector<uint8_t>& p) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(kRocePort);
    a.sin_addr.s_addr = htonl(dst);
    return sendto(fd_, p.data(), p.size(), 0, reinterpret_cast<sockaddr*>(&a), sizeof a) ==
           ssize_t(p.size());
  }

 private:
  int fd_ = -1;
  uint32_t ip_ = 0;
  uint16_t port_ = 0;
};

/// Sends packets to one endpoint as `from` (a Forger or a FakePeer), paced so the
/// target's socket buffer never overflows (every packet sent must reach the engine).
struct Sender {
  std::function<Tuple(uint32_t)> tuple;
  std::function<bool(uint32_t, const std::vector<uint8_t>&)> send;
  uint32_t dst_ip = 0;
  uint32_t qpn = 0;
  uint64_t sent = 0;

  Tuple t() const { return tuple(dst_ip); }
  void go(const std::vector<uint8_t>& p) {
    ASSERT_TRUE(send(dst_ip, p)) << "sendto: " << strerror(errno);
    if (++sent % 16 == 0) std::this_thread::sleep_for(300us);
  }
  Bth bth(uint8_t op, uint32_t psn, bool ack_req = false) const {
    Bth b;
    b.opcode = op;
    b.dest_qpn = qpn;
    b.psn = psn & 0xffffff;
    b.ack_req = ack_req;
    return b;
  }
  void read(uint32_t psn, uint64_t va, uint32_t rkey, uint32_t len) {
    go(PacketBuilder(bth(kReadRequest, psn, true)).reth(va, rkey, len).finish(t()));
  }
  void write_only(uint32_t psn, uint64_t va, uint32_t rkey, uint32_t n, bool ack_req) {
    std::vector<uint8_t> junk(n, 0xa5);
    go(PacketBuilder(bth(kWriteOnly, psn, ack_req))
           .reth(va, rkey, n)
           .payload(junk.data(), n)
           .finish(t()));
  }
  void write_first(uint32_t psn, uint64_t va, uint32_t rkey) {
    std::vector<uint8_t> junk(kMtu, 0x5a);
    go(PacketBuilder(bth(kWriteFirst, psn))
           .reth(va, rkey, 4 * kMtu)
           .payload(junk.data(), kMtu)
           .finish(t()));
  }
  void send_only(uint32_t psn, uint32_t n, bool ack_req) {
    std::vector<uint8_t> junk(n, 0x3c);
    go(PacketBuilder(bth(kSendOnly, psn, ack_req)).payload(junk.data(), n).finish(t()));
  }
  void atomic(uint8_t op, uint32_t psn, uint64_t va, uint32_t rkey, uint64_t swap_add,
              uint64_t compare) {
    go(PacketBuilder(bth(op, psn, true)).atomic_eth(va, rkey, swap_add, compare).finish(t()));
  }
  void ack(uint32_t psn, uint8_t syndrome, uint32_t msn) {
    go(PacketBuilder(bth(kAcknowledge, psn)).aeth(syndrome, msn).finish(t()));
  }
  void read_response(uint32_t psn, uint32_t n) {
    std::vector<uint8_t> junk(n, 0x77);
    go(PacketBuilder(bth(kReadResponseOnly, psn))
           .aeth(kSyndromeAck, psn)
           .payload(junk.data(), n)
           .finish(t()));
  }
  void atomic_ack(uint32_t psn, uint64_t orig) {
    go(PacketBuilder(bth(kAtomicAcknowledge, psn))
           .aeth(kSyndromeAck, psn)
           .atomic_ack(orig)
           .finish(t()));
  }
};

// A Sender to (dst_ip, qpn) forging packets from `from_ip`, over a Forger it owns. A
// Forger that cannot bind `from_ip` is a fatal failure.
Sender forged_from(uint32_t from_ip, uint32_t dst_ip, uint32_t qpn, const char* from_name) {
  auto f = std::make_shared<Forger>();
  if (!f->open(from_ip)) fail_fatal(std::string("cannot bind the ") + from_name + "'s address");
  Sender s;
  s.tuple = [f](uint32_t d) { return f->tuple_to(d); };
  s.send = [f](uint32_t d, const std::vector<uint8_t>& p) { return f->send_to(d, p); };
  s.dst_ip = dst_ip;
  s.qpn = qpn;
  return s;
}

/// What the attacker role knows, and its view of the targets.
struct Attack {
  Role& r;
  Shared* sh;
  Learned a, b;  ///< requester A (role 0), responder B (role 1)
  std::mt19937_64 rng{0x14};

  uint32_t a_ip() const { return r.peer_info(0).ipv4; }
  uint32_t b_ip() const { return r.peer_info(1).ipv4; }
  uint64_t b_addr() const { return r.peer_info(1).addr; }
  uint64_t b_size() const { return r.peer_info(1).size; }
  uint32_t b_rkey() const { return r.peer_info(1).rkey; }
  /// B's expected PSN is past every PSN A has a completion for.
  uint32_t done_psn() const { return psn_add(a.init_psn, sh->psns_done.load()); }
  uint32_t rand_below(uint64_t n) { return static_cast<uint32_t>(rng() % n); }
  /// A PSN certainly behind B's expected one: in what A has completed, or far before it.
  uint32_t behind_psn() {
    const uint32_t done = sh->psns_done.load();
    if (done > 1 && rng() % 2) return psn_add(a.init_psn, rand_below(done));
    return psn_add(a.init_psn, 0x1000000 - 1 - rand_below(1 << 22));
  }
  /// Forged requests to B from A's address.
  Sender requests_as_requester() const { return forged_from(a_ip(), b_ip(), b.qpn, "requester"); }
  /// Forged responses to A from B's address.
  Sender responses_as_responder() const { return forged_from(b_ip(), a_ip(), a.qpn, "responder"); }
  /// Waits until the named counters of role `peer` (0: A, 1: B) grew by `delta` over
  /// `before`; returns the growth seen last.
  uint64_t wait_growth(int peer, const std::vector<std::string>& names, const Counters& before,
                       uint64_t delta) const {
    return wait_counter_growth(r.peer_info(peer).addr_str(), r.peer_info(peer).pid, names, before,
                               delta, 10s);
  }
  /// A PSN far ahead of B's expected one and of anything A may have sent: beyond the largest
  /// window (2^22 PSNs, engine::CongestionWindow::kMaxPsns), which B's out-of-order tracking
  /// spans at most, and still ahead (under 2^23). Inside the window a forged WRITE with a
  /// valid rkey is placed — the residual risk docs/architecture.md states.
  uint32_t ahead_psn() {
    return psn_add(done_psn(), (1u << 22) + 8192 + rand_below((1u << 22) - 16384));
  }
  uint32_t guessed_rkey() {
    switch (rng() % 3) {
      case 0:
        return b_rkey();
      case 1:
        return b_rkey() ^ (1u + rand_below(255));  // same index, other random bits
      default:
        return static_cast<uint32_t>(rng());
    }
  }
  /// Interesting addresses: B's pattern region, the sentinel, just outside the MR, random.
  uint64_t target_va() {
    switch (rng() % 5) {
      case 0:
        return b_addr() + kReadRegion + rand_below(kReadSpan);
      case 1:
        return b_addr() + kSentinelOff;
      case 2:
        return b_addr() - 64;
      case 3:
        return b_addr() + b_size() - 8;
      default:
        return rng();
    }
  }
};

using AttackFn = std::function<void(Attack&)>;

void attacker(Role& r, const Ctx& c, const AttackFn& fn) {
  Attack at{r, c.sh};
  at.a = r.recv_value<Learned>(0);
  at.b = r.recv_value<Learned>(1);
  r.barrier();
  // Attack a running transfer: wait for its first round.
  const auto until = Clock::now() + 30s;
  while (c.sh->rounds_done.load() < 1 && !c.sh->requester_failed.load()) {
    ASSERT_LT(Clock::now(), until) << "the transfer never started";
    std::this_thread::sleep_for(1ms);
  }
  c.sh->attack_started.store(1);
  fn(at);
  c.sh->attack_done.store(1);
}

void run_hostile(Outcome outcome, AttackFn attack, bool lockstep = false) {
  void* m =
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(MAP_FAILED, m);
  Shared* sh = new (m) Shared();
  sh->lockstep.store(lockstep ? 1 : 0);
  const Ctx c{sh, outcome};
  Spec s;
  s.conn.path_mtu = IBV_MTU_1024;
  s.conn.timeout = 14;  // ~67 ms
  s.conn.retry_cnt = 7;
  s.conn.max_send_wr = 64;
  s.conn.max_recv_wr = kRecvDepth;
  s.roles.resize(3);
  s.links = {{0, 1}};
  s.roles[0].buf_size = kRequesterSize;
  s.roles[1].buf_size = kTargetSize;
  s.roles[2].buf_size = 4096;
  s.roles[0].fn = [c](Role& r) { requester(r, c); };
  s.roles[1].fn = [c](Role& r) { responder(r, c); };
  s.roles[2].fn = [c, attack](Role& r) { attacker(r, c, attack); };
  s.deadline = 150s;
  run_roles(s);
  sh->~Shared();
  munmap(m, sizeof(Shared));
}

// ---- transfer tests ----------------------------------------------------------------------

// 1,000 READ requests forged from the requester's address with PSNs behind the expected one
// (some in the range the transfer really used, some far behind), random addresses, real and
// guessed rkeys, lengths up to 2 GiB: none matches a READ the responder executed, so none is
// served, none errors a QP; each is counted as duplicate_dropped.
TEST(HostilePackets, ForgedReadsBehindTheExpectedPsnAreDroppedAndTheTransferCompletes) {
  run_hostile(Outcome::kSurvives, [](Attack& at) {
    Sender s = at.requests_as_requester();
    const Counters before = at.r.peer_counters(1);
    constexpr int kReads = 1000;
    for (int i = 0; i < kReads; ++i) {
      uint32_t len;
      switch (i % 4) {
        case 0:
          len = 0x80000000u;  // 2 GiB
          break;
        case 1:
          len = 1 + at.rand_below(0x80000000u);
          break;
        case 2:
          len = 1 + at.rand_below(64 << 10);
          break;
        default:
          len = static_cast<uint32_t>(kSlot);
      }
      s.read(at.behind_psn(), at.target_va(), at.guessed_rkey(), len);
    }
    const uint64_t dropped = at.wait_growth(1, {"duplicate_dropped"}, before, kReads);
    EXPECT_GE(dropped, uint64_t(kReads)) << "forged READs not all dropped as duplicates";
    const Counters after = at.r.peer_counters(1);
    printf("[ attacker ] %d forged READs; responder:%s\n", kReads,
           Growth{before, after}.str().c_str());
  });
}

// WRITE / SEND / FETCH & ADD / COMPARE & SWAP requests forged from the requester's address,
// behind and far ahead of the expected PSN, real and guessed rkeys, aimed at the pattern
// region, a sentinel word, and just outside the MR; plus FETCH & ADDs with exactly the
// PSNs of atomics the responder executed (true duplicates, answered from the saved result).
// Nothing is executed: the transfer completes, the legit FETCH & ADD word counts exactly
// one per round, the sentinel, the pattern region and the guard pages are unchanged.
TEST(HostilePackets, ForgedWritesSendsAndAtomicsOutsideTheWindowAreNeverExecuted) {
  run_hostile(Outcome::kSurvives, [](Attack& at) {
    Sender s = at.requests_as_requester();
    const Counters before = at.r.peer_counters(1);
    int replays = 0;
    for (int i = 0; i < 800; ++i) {
      const bool ahead = i % 4 == 3;  // 1 in 4 far ahead: each may draw a sequence NAK
      const uint32_t psn = ahead ? at.ahead_psn() : at.behind_psn();
      switch (i % 6) {
        case 0:
          s.write_only(psn, at.target_va(), at.guessed_rkey(), 8 + at.rand_below(512), i % 2);
          break;
        case 1:
          s.write_first(psn, at.target_va(), at.guessed_rkey());
          break;
        case 2:
          s.send_only(psn, 1 + at.rand_below(kSendLen), i % 2);
          break;
        case 3:
          s.atomic(kFetchAdd, psn, at.b_addr() + kSentinelOff, at.guessed_rkey(), 1, 0);
          break;
        case 4:
          s.atomic(kCompareSwap, psn, at.b_addr() + kSentinelOff, at.guessed_rkey(), 0, kSentinel);
          break;
        default: {
          // A true duplicate of an executed FETCH & ADD, with a different add value.
          const uint32_t n = at.sh->fadds.load();
          if (n == 0) break;
          const uint32_t k = n - 1 - at.rand_below(std::min<uint32_t>(n, 16));
          s.atomic(kFetchAdd, at.sh->fadd_psns[k % 64].load(), at.b_addr() + kCounterOff,
                   at.b_rkey(), 1000, 0);
          ++replays;
        }
      }
    }
    const uint64_t seen =
        at.wait_growth(1, {"duplicate_request", "out_of_seq_request"}, before, s.sent);
    EXPECT_GE(seen, s.sent) << "forged requests not all seen as duplicate / out of sequence";
    printf("[ attacker ] %lu forged requests (%d replays of executed atomics); responder:%s\n",
           (unsigned long)s.sent, replays, Growth{before, at.r.peer_counters(1)}.str().c_str());
  });
}

// ACKs, NAKs (PSN sequence, RNR, remote access, invalid request, remote operational), READ
// responses and atomic ACKs forged from the responder's address with PSNs the requester
// never sent (far ahead) or long acknowledged (far behind): all dropped as
// rcvd_stale_response, the transfer completes.
TEST(HostilePackets, ForgedAcksAndNaksWithStaleOrUnsentPsnsAreIgnored) {
  run_hostile(Outcome::kSurvives, [](Attack& at) {
    Sender s = at.responses_as_responder();
    const Counters before = at.r.peer_counters(0);
    const uint8_t syndromes[] = {
        kSyndromeAck,         kNakSeq, kRnrNak, kNakRemoteAccess, kNakInvalidRequest,
        kNakRemoteOperational};
    for (int i = 0; i < 900; ++i) {
      const uint32_t psn =
          i % 2 ? at.ahead_psn() : psn_add(at.a.init_psn, 0x1000000 - 2 - at.rand_below(1 << 22));
      switch (i % 8) {
        case 6:
          s.read_response(psn, 1 + at.rand_below(kMtu));
          break;
        case 7:
          s.atomic_ack(psn, at.rng());
          break;
        default:
          s.ack(psn, syndromes[i % 6], at.rand_below(1 << 24));
      }
    }
    const uint64_t stale = at.wait_growth(0, {"rcvd_stale_response"}, before, s.sent);
    EXPECT_GE(stale, s.sent) << "forged responses not all dropped as stale";
    printf("[ attacker ] %lu forged responses; requester:%s\n", (unsigned long)s.sent,
           Growth{before, at.r.peer_counters(0)}.str().c_str());
  });
}

// Sequence NAKs, RNR NAKs and positive ACKs forged from the responder's address with PSNs
// swept across the requester's outstanding window. These are indistinguishable from the
// responder's own; on this lossless link they cost go-back-N retransmissions and RNR
// back-offs, and the transfer completes with every byte verified. (A forged positive ACK
// inside the window also completes WRITE/SEND WQEs before the responder has executed them;
// on a lossy link a packet lost then is never resent — data loss reported as success,
// which no RoCE endpoint can prevent without authentication. Not asserted here.)
TEST(HostilePackets, ForgedSequenceNaksRnrNaksAndAcksInsideTheWindowCostOnlyRetransmissions) {
  run_hostile(Outcome::kSurvives, [](Attack& at) {
    Sender s = at.responses_as_responder();
    const Counters before = at.r.peer_counters(0);
    const uint8_t syndromes[] = {kNakSeq, kRnrNak, kSyndromeAck};
    for (int i = 0; i < 1500; ++i)
      s.ack(psn_add(at.done_psn(), at.rand_below(256)), syndromes[i % 3], at.rand_below(1 << 24));
    printf("[ attacker ] %lu forged in-window ACK/NAKs; requester:%s\n", (unsigned long)s.sent,
           Growth{before, at.r.peer_counters(0)}.str().c_str());
  });
}

// RoCE has no authentication, and a NAK "remote access error" for a PSN the requester has
// outstanding is, by the spec, fatal to its QP (IBTA 9.7.5.2.4: class C/D errors move it
// to ERR). An attacker who can send from the responder's address and guess the PSN window
// (24 bits; a sweep of a few hundred PSNs past the acknowledged ones suffices) therefore
// CAN kill the connection — unavoidable without authentication. What must hold: no crash,
// no hang; the requester gets IBV_WC_REM_ACCESS_ERR for the WQE that PSN belongs to
// promptly, its other WQEs are flushed, and the responder's QP is unaffected.
TEST(HostilePackets, AForgedRemoteAccessNakForAnOutstandingPsnFailsTheRequesterPromptly) {
  run_hostile(Outcome::kRequesterFails, [](Attack& at) {
    Sender s = at.responses_as_responder();
    const auto start = Clock::now();
    while (!at.sh->requester_failed.load()) {
      ASSERT_LT(Clock::now() - start, 20s) << "the requester neither failed nor finished";
      const uint32_t base = at.done_psn();
      for (uint32_t k = 0; k < 384 && !at.sh->requester_failed.load(); ++k)
        s.ack(psn_add(base, k), kNakRemoteAccess, 0);
    }
    printf("[ attacker ] the requester failed %.0f ms after %lu forged NAKs\n",
           std::chrono::duration<double, std::milli>(Clock::now() - start).count(),
           (unsigned long)s.sent);
  });
}

// Everything above (and in-window guesses the peer's address would make fatal: requests at
// PSNs around the expected one with a bad rkey, remote-access NAKs over the requester's
// outstanding window) sent from an address that is not the QP's peer (127.0.3.x): all
// dropped and counted as rcvd_addr_err on both sides; the transfer is unaffected.
TEST(HostilePackets, ForgedPacketsFromANonPeerAddressAreAllDroppedAsAddressErrors) {
  run_hostile(Outcome::kSurvives, [](Attack& at) {
    FakePeer stranger;
    ASSERT_TRUE(stranger.open()) << "no free 127.0.3.x:4791";
    auto via = [&stranger](uint32_t dst, uint32_t qpn) {
      Sender s;
      s.tuple = [&stranger](uint32_t d) { return stranger.tuple_to(d); };
      s.send = [&stranger](uint32_t d, const std::vector<uint8_t>& p) {
        return stranger.send_to(d, p);
      };
      s.dst_ip = dst;
      s.qpn = qpn;
      return s;
    };
    Sender to_b = via(at.b_ip(), at.b.qpn);
    Sender to_a = via(at.a_ip(), at.a.qpn);
    const Counters a0 = at.r.peer_counters(0), b0 = at.r.peer_counters(1);
    for (int i = 0; i < 600; ++i) {
      // At or just past B's expected PSN: from the peer, a bad rkey here would be fatal.
      const uint32_t near = psn_add(at.done_psn(), at.rand_below(256));
      const uint32_t psn = i % 3 == 0 ? near : i % 3 == 1 ? at.behind_psn() : at.ahead_psn();
      switch (i % 5) {
        case 0:
          to_b.read(psn, at.target_va(), at.guessed_rkey(), 1 + at.rand_below(1 << 20));
          break;
        case 1:
          to_b.write_only(psn, at.target_va(), at.guessed_rkey(), 64, true);
          break;
        case 2:
          to_b.send_only(psn, 64, true);
          break;
        case 3:
          to_b.atomic(kFetchAdd, psn, at.b_addr() + kSentinelOff, at.b_rkey(), 1, 0);
          break;
        default:
          to_b.atomic(kCompareSwap, psn, at.b_addr() + kSentinelOff, at.b_rkey(), 0, kSentinel);
      }
      // Remote-access NAKs and ACKs across the requester's outstanding window.
      to_a.ack(psn_add(at.done_psn(), at.rand_below(256)), i % 2 ? kNakRemoteAccess : kSyndromeAck,
               0);
    }
    EXPECT_GE(at.wait_growth(1, {"rcvd_addr_err"}, b0, to_b.sent), to_b.sent);
    EXPECT_GE(at.wait_growth(0, {"rcvd_addr_err"}, a0, to_a.sent), to_a.sent);
    printf("[ attacker ] %lu requests to the responder, %lu responses to the requester\n",
           (unsigned long)to_b.sent, (unsigned long)to_a.sent);
  });
}

// Issue 21: forged out-of-order WRITEs with the selective-retransmission bit set. Before
// every round, while nothing is outstanding (so the responder's expected PSN is exactly
// done_psn() and no forged packet can be the expected one), the attacker sends a burst of
// WRITEs from the requester's address at PSNs 1…kAhead past it — the PSNs the next rounds
// will use: zero-length WRITE ONLYs (no rkey needed to be "placed"), WRITEs with a garbage
// rkey, middle and last packets of no verified message, and a WRITE FIRST with the real
// rkey whose DMA length (8 bytes, at the MR's end) is shorter than its payload — and SEND
// ONLY/FIRST/LAST packets of junk (kept beyond a gap to execute in order: staged, no rkey
// needed). A forged packet may cost a retransmission; it must never be placed or executed in
// a PSN's stead (the genuine packet then dropped as a duplicate while the requester
// completes successfully; a receive consumed by junk) nor write past the MR: every round
// verifies, the responder's SENDs arrive once each in order, the guard pages are intact,
// both QPs stay RTS.
TEST(HostilePackets, ForgedOutOfOrderSelectiveRequestsNeverTakeAGenuinePacketsPlace) {
  run_hostile(
      Outcome::kSurvives,
      [](Attack& at) {
        Sender s = at.requests_as_requester();
        const Counters before = at.r.peer_counters(1);
        constexpr int kBursts = 40;
        constexpr int kPerBurst = 60;
        constexpr uint32_t kAhead = 200;  // a round uses ~180 PSNs
        std::vector<uint8_t> junk(kMtu, 0xe7);
        uint32_t seen = 0;
        for (int burst = 0; burst < kBursts; ++burst) {
          const auto until = Clock::now() + 20s;
          uint32_t idle;
          while ((idle = at.sh->idle_round.load()) <= seen) {
            ASSERT_LT(Clock::now(), until) << "the requester never went idle";
            std::this_thread::sleep_for(100us);
          }
          seen = idle;
          const uint32_t epsn = at.done_psn();  // exact: nothing is outstanding
          const Counters b0 = at.r.peer_counters(1);
          const uint64_t sent0 = s.sent;
          for (int i = 0; i < kPerBurst; ++i) {
            Bth b = s.bth(kWriteOnly, psn_add(epsn, 1 + at.rand_below(kAhead)));
            b.selective = true;
            b.resend = at.rng() % 2;
            PacketBuilder pb(b);
            switch (i % 10) {
              case 0:  // zero length, garbage rkey and address
                pb.reth(at.rng(), static_cast<uint32_t>(at.rng()), 0);
                break;
              case 1:  // zero length, the real rkey
                pb.reth(at.b_addr(), at.b_rkey(), 0);
                break;
              case 2:  // 64 bytes, a guessed rkey
                pb.reth(at.target_va(), at.b_rkey() ^ (1u + at.rand_below(255)), 64)
                    .payload(junk.data(), 64);
                break;
              case 3:  // FIRST, real rkey, DMA length 8 at the MR's end, 1 MTU of payload
                b.opcode = kWriteFirst;
                pb = PacketBuilder(b);
                pb.reth(at.b_addr() + at.b_size() - 8, at.b_rkey(), 8).payload(junk.data(), kMtu);
                break;
              case 4:  // MIDDLE of whatever message holds that PSN
                b.opcode = kWriteMiddle;
                pb = PacketBuilder(b);
                pb.payload(junk.data(), kMtu);
                break;
              case 5:  // LAST
                b.opcode = kWriteLast;
                pb = PacketBuilder(b);
                pb.payload(junk.data(), 1 + at.rand_below(kMtu));
                break;
              case 7:  // SEND ONLY of junk
                b.opcode = kSendOnly;
                pb = PacketBuilder(b);
                pb.payload(junk.data(), 1 + at.rand_below(kMtu));
                break;
              case 8:  // SEND FIRST of junk
                b.opcode = kSendFirst;
                pb = PacketBuilder(b);
                pb.payload(junk.data(), kMtu);
                break;
              case 9:  // SEND LAST of junk
                b.opcode = kSendLast;
                pb = PacketBuilder(b);
                pb.payload(junk.data(), 1 + at.rand_below(kMtu));
                break;
              default:  // FIRST, garbage rkey
                b.opcode = kWriteFirst;
                pb = PacketBuilder(b);
                pb.reth(at.target_va(), static_cast<uint32_t>(at.rng()), 4 * kMtu)
                    .payload(junk.data(), kMtu);
            }
            s.go(pb.finish(s.t()));
          }
          // Every forged packet is handled before the next round starts.
          at.wait_growth(1, {"rcvd_pkts"}, b0, s.sent - sent0);
          at.sh->attacker_round.store(idle);
        }
        printf("[ attacker ] %lu forged out-of-order WRITEs and SENDs in %d bursts; responder:%s\n",
               (unsigned long)s.sent, kBursts, Growth{before, at.r.peer_counters(1)}.str().c_str());
      },
      /*lockstep=*/true);
}

// ---- single-process tests against a fake peer -------------------------------------------

constexpr uint32_t kFakeQpn = 0x00beef;
constexpr uint32_t kPeerFirstPsn = 0x7ffff0;
constexpr uint32_t kDeviceFirstPsn = 0x123456;

/// srdma0 with one RC QP connected to a FakePeer on 127.0.3.x.
struct FakeRig : FakePeerQp {
  Role& r;
  uint32_t expect_psn = kPeerFirstPsn;  // next PSN the device's responder expects
  uint32_t dev_psn = kDeviceFirstPsn;   // next PSN the device's requester uses
  uint32_t msn = 0;

  explicit FakeRig(Role& role)
      : FakePeerQp(role.dev(), kFakeQpn, kPeerFirstPsn, kDeviceFirstPsn), r(role) {}

  uint32_t dev_ip() const { return r.dev().ipv4; }
  std::vector<uint8_t> send_only(uint32_t psn, uint32_t n = 32) const {
    Bth b;
    b.opcode = kSendOnly;
    b.dest_qpn = ep.qpn;
    b.psn = psn;
    b.ack_req = true;
    std::vector<uint8_t> data(n, 0x42);
    return PacketBuilder(b).payload(data.data(), n).finish(peer.tuple_to(dev_ip()));
  }
  std::vector<uint8_t> ack(uint32_t psn, uint8_t syndrome) {
    Bth a;
    a.opcode = kAcknowledge;
    a.dest_qpn = ep.qpn;
    a.psn = psn;
    return PacketBuilder(a).aeth(syndrome, ++msn).finish(peer.tuple_to(dev_ip()));
  }
  /// Next packet from the device (BTH parsed), or false.
  bool next(ParsedBth& b, std::vector<uint8_t>& pkt, milliseconds timeout) {
    if (!peer.recv_from(dev_ip(), pkt, timeout)) return false;
    return parse_bth(pkt, b);
  }
  /// The device SENDs one message; the fake peer checks its PSN and ACKs it.
  void device_send(uint64_t wr_id) {
    uint8_t* src = r.buf();
    fill_pattern(src, 100, wr_id);
    ASSERT_EQ(0, post_send(ep.qp, IBV_WR_SEND, wr_id, src, 100, r.lkey()));
    ParsedBth b;
    std::vector<uint8_t> pkt;
    ASSERT_TRUE(next(b, pkt, 3s)) << "the device sent nothing";
    ASSERT_EQ(kSendOnly, b.opcode);
    ASSERT_EQ(dev_psn, b.psn) << "the device's SEND is not at the next PSN";
    ASSERT_TRUE(peer.send_to(dev_ip(), ack(dev_psn, kSyndromeAck)));
    const ibv_wc wc = poll_one(ep.scq, 5s);
    ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << describe(wc);
    ASSERT_EQ(wr_id, wc.wr_id);
    dev_psn = psn_add(dev_psn, 1);
  }
};

void in_one_process(std::function<void(Role&)> fn) {
  run_in_one_process(std::move(fn), 60s);
}

// IBTA 9.7.5.2.2: one sequence NAK per gap. 20 copies of one far-ahead PSN (what a forger
// replaying a packet sends) draw exactly one NAK, carrying the expected PSN. Once the gap
// closes (the expected PSN arrives), a new gap draws one new NAK.
TEST(HostilePackets, TwentyCopiesOfOneFarAheadPsnDrawOneSequenceNak) {
  in_one_process([](Role& r) {
    FakeRig g(r);
    for (int gap = 0; gap < 2; ++gap) {
      const uint32_t far = psn_add(g.expect_psn, 100000 + gap);
      const auto pkt = g.send_only(far);
      const Counters before = r.counters();
      for (int k = 0; k < 20; ++k) ASSERT_TRUE(g.peer.send_to(g.dev_ip(), pkt));
      EXPECT_GE(wait_counter_growth(r.dev().addr, getpid(), {"out_of_seq_request"}, before, 20, 5s),
                20u);
      int naks = 0;
      ParsedBth b;
      std::vector<uint8_t> got;
      for (int k = 0; k < 25 && g.next(b, got, 200ms); ++k) {
        ASSERT_EQ(kAcknowledge, b.opcode) << "unexpected packet from the device";
        ASSERT_GE(got.size(), 16u);
        EXPECT_EQ(kNakSeq, got[12]) << "syndrome 0x" << std::hex << int(got[12]);
        EXPECT_EQ(g.expect_psn, b.psn) << "a sequence NAK carries the expected PSN";
        ++naks;
      }
      EXPECT_EQ(1, naks) << "gap " << gap << ": 20 copies of one out-of-sequence PSN";
      const Counters after = r.counters();
      EXPECT_EQ(1u, after["send_nak"] - before["send_nak"]);
      // Close the gap: the expected PSN is delivered and ACKed.
      ASSERT_EQ(0, post_recv(g.ep.qp, gap, r.buf() + 4096, 4096, r.lkey()));
      ASSERT_TRUE(g.peer.send_to(g.dev_ip(), g.send_only(g.expect_psn)));
      const ibv_wc wc = poll_one(g.ep.rcq, 5s);
      ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << describe(wc);
      ASSERT_TRUE(g.next(b, got, 3s)) << "no ACK for the expected PSN";
      EXPECT_EQ(kAcknowledge, b.opcode);
      EXPECT_TRUE(got.size() >= 16 && syndrome_is_ack(got[12]));
      EXPECT_EQ(g.expect_psn, b.psn);
      g.expect_psn = psn_add(g.expect_psn, 1);
    }
    EXPECT_EQ(IBV_QPS_RTS, qp_state(g.ep.qp));
  });
}

// The placed mark (wire::Bth::placed: "my payload is in your memory already") is honoured
// only on same-host ring records. Over UDP, from the peer's own address with a valid ICRC, a
// WRITE carrying it is dropped as malformed: it writes nothing, draws no ACK and costs the
// connection nothing (the genuine next request is executed).
TEST(HostilePackets, APlacedMarkOverUdpIsDroppedAsMalformed) {
  in_one_process([](Role& r) {
    FakeRig g(r);
    uint8_t* target = r.buf() + 8192;
    memset(target, kGuard, 256);
    Bth b;
    b.opcode = kWriteOnly;
    b.dest_qpn = g.ep.qpn;
    b.psn = g.expect_psn;
    b.ack_req = true;
    b.placed = true;
    const uint32_t len = htole32(64);
    const auto pkt = PacketBuilder(b)
                         .reth(reinterpret_cast<uintptr_t>(target), r.lkey(), 64)
                         .payload(&len, sizeof len)
                         .finish(g.peer.tuple_to(g.dev_ip()));
    const Counters before = r.counters();
    ASSERT_TRUE(g.peer.send_to(g.dev_ip(), pkt));
    EXPECT_GE(wait_counter_growth(r.dev().addr, getpid(), {"rcvd_malformed"}, before, 1, 5s), 1u);
    ParsedBth got_bth;
    std::vector<uint8_t> got;
    EXPECT_FALSE(g.next(got_bth, got, 100ms)) << "the device answered a forged placed WRITE";
    EXPECT_TRUE(AllBytesAre(target, 256, kGuard));
    EXPECT_EQ(0u, r.counters()["rcvd_placed_pkts"] - before["rcvd_placed_pkts"]);
    // The same PSN, genuine, is executed and ACKed.
    ASSERT_EQ(0, post_recv(g.ep.qp, 7, r.buf() + 4096, 4096, r.lkey()));
    ASSERT_TRUE(g.peer.send_to(g.dev_ip(), g.send_only(g.expect_psn)));
    const ibv_wc wc = poll_one(g.ep.rcq, 5s);
    EXPECT_EQ(IBV_WC_SUCCESS, wc.status) << describe(wc);
    g.expect_psn = psn_add(g.expect_psn, 1);
    EXPECT_EQ(IBV_QPS_RTS, qp_state(g.ep.qp));
  });
}

// A sequence NAK naming the requester's oldest outstanding PSN starts one go-back-N; 19
// more copies of it (forged or duplicated) before any progress start no other and do not
// use up retry_cnt (rxe's started_retry rule) — else retry_cnt + 1 copies, or the genuine
// NAKs a responder sends for forged far-ahead requests, failed the QP with
// IBV_WC_RETRY_EXC_ERR. The requester resends once, then completes when ACKed. The fake
// peer answers slowly, so the requester's tail-loss probe (2 RTT or 10 ms after the last
// transmission with no ACK; to this peer, which sent no selective NAK, the oldest PSN again)
// may go out too, once: it is told apart by the tail_loss_probes counter.
TEST(HostilePackets, RepeatedSequenceNaksForTheOldestPsnCostOneRetransmissionNotTheConnection) {
  in_one_process([](Role& r) {
    FakeRig g(r);
    g.device_send(1);
    uint8_t* src = r.buf() + 8192;
    ASSERT_EQ(0, post_send(g.ep.qp, IBV_WR_SEND, 2, src, 100, r.lkey()));
    ASSERT_EQ(0, post_send(g.ep.qp, IBV_WR_SEND, 3, src, 100, r.lkey()));
    ParsedBth b;
    std::vector<uint8_t> pkt;
    for (uint32_t k = 0; k < 2; ++k) {
      ASSERT_TRUE(g.next(b, pkt, 3s)) << "the device sent nothing";
      ASSERT_EQ(psn_add(g.dev_psn, k), b.psn);
    }
    const Counters before = r.counters();
    for (int k = 0; k < 20; ++k) ASSERT_TRUE(g.peer.send_to(g.dev_ip(), g.ack(g.dev_psn, kNakSeq)));
    EXPECT_GE(wait_counter_growth(r.dev().addr, getpid(), {"rcvd_seq_err"}, before, 20, 5s), 20u);
    // One go-back-N: both SENDs once more, nothing else (but a tail-loss probe of the oldest).
    std::vector<uint32_t> psns;
    for (int k = 0; k < 8 && g.next(b, pkt, psns.size() < 2 ? 3s : 300ms); ++k)
      psns.push_back(b.psn);
    const Counters after = r.counters();
    const uint64_t probes = after["tail_loss_probes"] - before["tail_loss_probes"];
    EXPECT_LE(probes, 1u);
    EXPECT_EQ(int(1 + probes), std::count(psns.begin(), psns.end(), g.dev_psn)) << "one go-back-N";
    EXPECT_EQ(1, std::count(psns.begin(), psns.end(), psn_add(g.dev_psn, 1)));
    EXPECT_EQ(2 + probes, psns.size());
    EXPECT_EQ(2u + probes, after["retransmitted_pkts"] - before["retransmitted_pkts"]);
    EXPECT_EQ(0u, after["retry_exceeded_err"] - before["retry_exceeded_err"]);
    EXPECT_EQ(IBV_QPS_RTS, qp_state(g.ep.qp));
    ASSERT_TRUE(g.peer.send_to(g.dev_ip(), g.ack(psn_add(g.dev_psn, 1), kSyndromeAck)));
    const auto wcs = poll_n(g.ep.scq, 2, 5s);
    for (size_t k = 0; k < wcs.size(); ++k) {
      EXPECT_EQ(IBV_WC_SUCCESS, wcs[k].status) << describe(wcs[k]);
      EXPECT_EQ(2 + k, wcs[k].wr_id);
    }
    g.dev_psn = psn_add(g.dev_psn, 2);
    g.device_send(4);
  });
}

// A NAK or RNR NAK whose PSN the requester has already seen acknowledged (the last ACKed
// PSN, comp.psn − 1) is stale — no responder sends one, a duplicated or forged packet
// does — and must be dropped: it must neither fail the QP nor rewind the requester
// behind what the responder executed (the next message would then reuse an executed PSN,
// be taken for a duplicate and silently lost while completing successfully).
class StaleNak : public ::testing::TestWithParam<uint8_t> {};

TEST_P(StaleNak, ForTheLastAcknowledgedPsnIsIgnoredByAnIdleRequester) {
  const uint8_t syndrome = GetParam();
  in_one_process([syndrome](Role& r) {
    FakeRig g(r);
    g.device_send(1);
    const Counters before = r.counters();
    ASSERT_TRUE(g.peer.send_to(g.dev_ip(), g.ack(psn_add(g.dev_psn, 0xffffff), syndrome)));
    EXPECT_GE(wait_counter_growth(r.dev().addr, getpid(), {"rcvd_stale_response"}, before, 1, 2s),
              1u)
        << "a NAK for an acknowledged PSN was not dropped as stale";
    std::this_thread::sleep_for(20ms);  // an RNR back-off (0.01 ms) would have expired
    EXPECT_EQ(IBV_QPS_RTS, qp_state(g.ep.qp));
    ibv_wc wc{};
    EXPECT_TRUE(no_completion(g.ep.scq, 1ms, &wc)) << describe(wc);
    g.device_send(2);
    g.device_send(3);
  });
}

INSTANTIATE_TEST_SUITE_P(HostilePackets, StaleNak,
                         ::testing::Values(kNakSeq, kRnrNak, kNakRemoteAccess, kNakInvalidRequest),
                         [](const ::testing::TestParamInfo<uint8_t>& i) {
                           switch (i.param) {
                             case kNakSeq:
                               return std::string("SequenceNak");
                             case kRnrNak:
                               return std::string("RnrNak");
                             case kNakRemoteAccess:
                               return std::string("RemoteAccessNak");
                             default:
                               return std::string("InvalidRequestNak");
                           }
                         });

}  // namespace
}  // namespace softrdma::verbs_test
