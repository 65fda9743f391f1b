// The two packet paths between processes on one host, forced per test with
// SOFTRDMA_TRANSPORT:
//  - udp (UDP GSO sends, GRO receives on): SEND, WRITE and READ at MTU 256 / 1024 / 4096 of
//    sizes that leave a short last packet; the data sender's sent_gso_batches and the data
//    receiver's rcvd_gro_batches must grow (so a silently disabled offload fails the test),
//    and no ICRC error or malformed packet may appear;
//  - shm (the same-host shared-memory rings): the same transfers; every packet crosses the
//    rings (sent_pkts = sent_shm_pkts + shm_drops, no GSO, no GRO);
//  - injected loss (SOFTRDMA_NETEM, applied on transmit in both processes) over each path:
//    every message exactly once, in order;
//  - a shm peer killed mid-stream: the requester's WRs end with IBV_WC_RETRY_EXC_ERR (then
//    flushes) within a bound; a new process takes over the dead peer's address (replacing
//    its stale mailbox), a fresh QP to it works over shm again, nothing lost; no mailbox
//    file is left behind;
//  - a 64 MiB burst of WRITEs into a receiver whose application does not poll for a while
//    (its ring fills; shm_drops may grow): completes, data intact.
//
// Every role has a fixed address in 127.0.37.0/24 (no other test file uses that subnet),
// four per test, so a test can check the mailbox files of exactly its addresses.
#include <arpa/inet.h>
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "net/shm_port.h"
#include "net/udp_port.h"
#include "verbs/tests/harness.h"
#include "verbs/tests/traffic.h"

namespace softrdma::verbs_test {
namespace {

template <class D>
double ms(D d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

enum class Transport { kUdp, kShm };

const char* name_of(Transport t) {
  return t == Transport::kUdp ? "udp" : "shm";
}

// ---- addresses, environment, leftovers -------------------------------------------------

// Test slots: each test owns 127.0.37.(4·slot + 1 … 4·slot + 4).
constexpr int kTransferSlot = 0;  // + 3 · transport + MTU index: slots 0…5
constexpr int kLossSlot = 6;      // + transport: 6, 7
constexpr int kRestartSlot = 8;
constexpr int kBurstSlot = 9;

std::string addr_of(int slot, int role) {
  return "127.0.37." + std::to_string(slot * 4 + role + 1);
}

using Env = std::vector<std::pair<std::string, std::string>>;

Env env_for(Transport t, int slot, int role, const char* netem = nullptr) {
  Env e = {{"SOFTRDMA_ADDR", addr_of(slot, role)},
           {"SOFTRDMA_TRANSPORT", name_of(t)},
           {"SOFTRDMA_GSO", "1"}};
  if (netem) e.emplace_back("SOFTRDMA_NETEM", netem);
  return e;
}

bool pid_exists(long pid) {
  return pid > 0 && (kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}

// The same-host mailbox file of address `a` in this network namespace (net/shm_port.h).
std::string mailbox_of(const std::string& a) {
  uint32_t ip = 0;
  softrdma::net::ipv4_from_string(a, ip);
  return softrdma::net::shm_mailbox_path(softrdma::net::ShmConfig{}, ip);
}

// No shared-memory mailbox of the slot's addresses is left in /dev/shm, and counter files
// of its addresses left by killed roles (softrdma.<addr>.<pid>, pid gone) are removed.
void expect_clean_dev_shm(int slot) {
  for (int role = 0; role < 4; ++role) {
    const std::string a = addr_of(slot, role);
    const std::string mailbox = mailbox_of(a);
    struct stat st {};
    EXPECT_NE(0, stat(mailbox.c_str(), &st)) << mailbox << " left behind";
    DIR* d = opendir("/dev/shm");
    if (!d) continue;
    const std::string prefix = "softrdma." + a + ".";
    std::vector<std::string> stale;
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n.compare(0, prefix.size(), prefix) != 0) continue;
      if (!pid_exists(std::atol(n.c_str() + prefix.size()))) stale.push_back("/dev/shm/" + n);
    }
    closedir(d);
    for (const auto& p : stale) unlink(p.c_str());
  }
}

// clang-format off
const std::vector<std::string> kPathCounters = {
    "sent_pkts", "rcvd_pkts", "sent_gso_batches", "rcvd_gro_batches", "sent_shm_pkts",
    "rcvd_shm_pkts", "shm_drops", "rcvd_icrc_err", "rcvd_malformed", "rcvd_icrc_id_recovered",
    "retransmitted_pkts", "retransmit_timeouts", "rcvd_seq_err", "rcvd_rnr_err", "send_rnr_err",
    "out_of_seq_request", "duplicate_request", "sent_placed_msgs", "rcvd_placed_pkts"};
// clang-format on

// ---- a. / b.: SEND, WRITE, READ over one path ------------------------------------------

enum class Op { kSend, kWrite, kRead };
constexpr Op kOps[] = {Op::kSend, Op::kWrite, Op::kRead};

const char* name_of(Op op) {
  return op == Op::kSend ? "SEND" : op == Op::kWrite ? "WRITE" : "READ";
}

constexpr uint32_t kSrcOff = 3;
constexpr uint32_t kDstOff = 5;
constexpr uint64_t kLargest = (1u << 20) + 5;
constexpr size_t kXferBuf = kLargest + 16384;

std::vector<uint64_t> sizes_for(uint32_t mtu) {
  return {3ull * mtu + 1, 64ull * mtu + 17, kLargest};
}

uint64_t seed_of(int op, int k) {
  return 1000 + op * 10 + k;
}

using XferParam = std::tuple<Transport, ibv_mtu>;

class PathTransfers : public ::testing::TestWithParam<XferParam> {};

// One transfer of PathTransfers: op, its index k among the sizes, its size and seed.
struct Transfer {
  Op op;
  size_t k;
  uint64_t size;
  uint64_t seed;
};

// Runs `step` for every transfer (each op over every size, in order) and snapshots the
// role's counters around each op's transfers into per_op. Returns at a fatal failure.
void each_transfer(Role& r, const std::vector<uint64_t>& sizes, Growth (&per_op)[3],
                   const std::function<void(const Transfer&)>& step) {
  for (int o = 0; o < 3; ++o) {
    per_op[o].before = r.counters();
    for (size_t k = 0; k < sizes.size(); ++k) {
      SCOPED_TRACE(std::string(name_of(kOps[o])) + " of " + std::to_string(sizes[k]) + " B");
      step(Transfer{kOps[o], k, sizes[k], seed_of(o, static_cast<int>(k))});
      if (::testing::Test::HasFatalFailure()) return;
    }
    per_op[o].after = r.counters();
  }
}

// The end of a PathTransfers role: once both devices are quiescent, the packets of each op
// took the path under test. The requester's SEND and WRITE data leave and its READ
// responses arrive; the target's go the other way.
void expect_path_taken(Role& r, const char* who, Transport t, uint32_t mtu, const Counters& start,
                       const Growth (&per_op)[3], bool requester) {
  r.barrier();
  std::this_thread::sleep_for(30ms);  // both devices quiescent
  const Growth all{start, r.counters()};
  printf("[ %s] %s MTU %u:%s\n", who, name_of(t), mtu, all.str(kPathCounters).c_str());
  EXPECT_EQ(0u, all["rcvd_icrc_err"]);
  EXPECT_EQ(0u, all["rcvd_malformed"]);
  const std::string data_batches = requester ? "sent_gso_batches" : "rcvd_gro_batches";
  const std::string resp_batches = requester ? "rcvd_gro_batches" : "sent_gso_batches";
  const std::string data_shm = requester ? "sent_shm_pkts" : "rcvd_shm_pkts";
  const std::string resp_shm = requester ? "rcvd_shm_pkts" : "sent_shm_pkts";
  if (t == Transport::kUdp) {
    const std::string data_how = requester ? "left without GSO" : "arrived without GRO";
    const std::string resp_how = requester ? "arrived without GRO" : "left without GSO";
    EXPECT_GT(per_op[0][data_batches], 0u) << "SEND data " << data_how;
    EXPECT_GT(per_op[1][data_batches], 0u) << "WRITE data " << data_how;
    EXPECT_GT(per_op[2][resp_batches], 0u) << "READ responses " << resp_how;
    EXPECT_EQ(0u, all["sent_shm_pkts"]);
    EXPECT_EQ(0u, all["rcvd_shm_pkts"]);
    EXPECT_EQ(0u, all["sent_placed_msgs"] + all["rcvd_placed_pkts"]) << "placed over UDP";
  } else {
    // WRITE payloads cross once, placed by the requester (SOFTRDMA_SHM_PLACE, on by default);
    // SENDs and READ responses never are.
    const std::string placed = requester ? "sent_placed_msgs" : "rcvd_placed_pkts";
    EXPECT_GT(per_op[1][placed], 0u) << "no WRITE placed directly";
    EXPECT_EQ(0u, per_op[0][placed] + per_op[2][placed]) << "a SEND or READ placed";
    for (int o = 0; o < 2; ++o) {
      EXPECT_GT(per_op[o][data_shm], 0u) << name_of(kOps[o]) << " data not over shm";
    }
    EXPECT_GT(per_op[2][resp_shm], 0u) << "READ responses not over shm";
    EXPECT_EQ(0u, all["sent_gso_batches"]);
    EXPECT_EQ(0u, all["rcvd_gro_batches"]);
    EXPECT_EQ(all["sent_pkts"], all["sent_shm_pkts"] + all["shm_drops"])
        << "packets left by UDP under SOFTRDMA_TRANSPORT=shm";
    EXPECT_LE(all["rcvd_pkts"], all["rcvd_shm_pkts"]) << "packets arrived by UDP";
  }
}

TEST_P(PathTransfers, SendWriteReadDataAndCounters) {
  const auto [transport, mtu_enum] = GetParam();
  const uint32_t mtu = mtu_bytes(mtu_enum);
  const int mtu_index = mtu_enum == IBV_MTU_256 ? 0 : mtu_enum == IBV_MTU_1024 ? 1 : 2;
  const int slot = kTransferSlot + 3 * (transport == Transport::kShm) + mtu_index;
  const std::vector<uint64_t> sizes = sizes_for(mtu);

  Spec s;
  s.conn.path_mtu = mtu_enum;
  s.roles.resize(2);
  s.links = {{0, 1}};
  s.deadline = 60s;
  for (int i = 0; i < 2; ++i) {
    s.roles[i].buf_size = kXferBuf;
    s.roles[i].env = env_for(transport, slot, i);
  }

  // Role 0 requests; role 1 is the target. Per op, each role snapshots its own counters.
  s.roles[0].fn = [&](Role& r) {
    auto& l = r.link();
    const Counters start = r.counters();
    Growth per_op[3];
    each_transfer(r, sizes, per_op, [&](const Transfer& x) {
      const auto len = static_cast<uint32_t>(x.size);
      if (x.op == Op::kRead)
        memset(r.buf(), kGuard, kXferBuf);
      else
        fill_pattern(r.buf() + kSrcOff, x.size, x.seed);
      r.barrier();  // the target is ready
      if (x.op == Op::kSend) {
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_SEND, x.k, r.buf() + kSrcOff, len, r.lkey()));
      } else if (x.op == Op::kWrite) {
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_RDMA_WRITE, x.k, r.buf() + kSrcOff, len, r.lkey(),
                               l.remote.addr + kDstOff, l.remote.rkey));
      } else {
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_RDMA_READ, x.k, r.buf() + kDstOff, len, r.lkey(),
                               l.remote.addr + kSrcOff, l.remote.rkey));
      }
      const ibv_wc wc = poll_one(l.ep.scq, 20s);
      ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << describe(wc);
      EXPECT_EQ(uint64_t(x.k), wc.wr_id);
      if (x.op == Op::kRead) {
        EXPECT_EQ(x.size, wc.byte_len);
        EXPECT_TRUE(PatternBetweenGuards(r.buf(), kXferBuf, kDstOff, x.size, x.seed));
      }
      r.send_value(1, uint32_t{1});
      r.barrier();  // the target checked
    });
    ASSERT_FALSE(HasFatalFailure());
    expect_path_taken(r, "requester", transport, mtu, start, per_op, true);
  };

  s.roles[1].fn = [&](Role& r) {
    auto& l = r.link();
    const Counters start = r.counters();
    Growth per_op[3];
    each_transfer(r, sizes, per_op, [&](const Transfer& x) {
      if (x.op == Op::kRead)
        fill_pattern(r.buf() + kSrcOff, x.size, x.seed);
      else
        memset(r.buf(), kGuard, kXferBuf);
      if (x.op == Op::kSend) {
        ASSERT_EQ(0, post_recv(l.ep.qp, 100 + x.k, r.buf() + kDstOff,
                               static_cast<uint32_t>(x.size + 64), r.lkey()));
      }
      r.barrier();
      if (x.op == Op::kSend) {
        const ibv_wc wc = poll_one(l.ep.rcq, 20s);
        ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << describe(wc);
        EXPECT_EQ(100 + x.k, wc.wr_id);
        EXPECT_EQ(x.size, wc.byte_len);
      }
      r.recv_value<uint32_t>(0, 30s);
      if (x.op != Op::kRead) {
        EXPECT_TRUE(PatternBetweenGuards(r.buf(), kXferBuf, kDstOff, x.size, x.seed));
      }
      r.barrier();
    });
    ASSERT_FALSE(HasFatalFailure());
    EXPECT_TRUE(no_completion(l.ep.rcq, 5ms));
    expect_path_taken(r, "target   ", transport, mtu, start, per_op, false);
  };
  run_roles(s);
  expect_clean_dev_shm(slot);
}

INSTANTIATE_TEST_SUITE_P(Paths, PathTransfers,
                         ::testing::Combine(::testing::Values(Transport::kUdp, Transport::kShm),
                                            ::testing::Values(IBV_MTU_256, IBV_MTU_1024,
                                                              IBV_MTU_4096)),
                         [](const ::testing::TestParamInfo<XferParam>& i) {
                           const Transport t = std::get<0>(i.param);
                           return std::string(t == Transport::kUdp ? "UdpGso" : "Shm") + "_Mtu" +
                                  std::to_string(mtu_bytes(std::get<1>(i.param)));
                         });

// ---- c.: loss on either path -----------------------------------------------------------

const OrderedTraffic kLossTraffic{.sends = 600,
                                  .writes = 100,
                                  .reads = 100,
                                  .write_seed0 = 5000,
                                  .read_base = 2 << 20,
                                  .read_seed = 91};
constexpr char kNetem[] = "loss=5%,seed=7";

class PathLoss : public ::testing::TestWithParam<Transport> {};

TEST_P(PathLoss, EveryMessageOnceInOrder) {
  const Transport transport = GetParam();
  const int slot = kLossSlot + (transport == Transport::kShm);
  Spec s;
  s.conn.path_mtu = IBV_MTU_1024;
  s.conn.timeout = 12;  // 16.8 ms
  s.conn.retry_cnt = 7;
  s.conn.max_send_wr = 512;
  s.conn.max_recv_wr = kLossTraffic.recv_depth;
  s.roles.resize(2);
  s.links = {{0, 1}};
  s.roles[0].buf_size = kLossTraffic.window * kLossTraffic.slot;
  s.roles[1].buf_size = kLossTraffic.read_base + kLossTraffic.read_span;
  for (int i = 0; i < 2; ++i) s.roles[i].env = env_for(transport, slot, i, kNetem);
  s.deadline = 120s;

  s.roles[0].fn = [&](Role& r) {
    auto& l = r.link();
    const Counters start = r.counters();
    r.barrier();
    kLossTraffic.request(r);
    ASSERT_FALSE(HasFatalFailure());
    EXPECT_TRUE(no_completion(l.ep.scq, 20ms));
    r.send_value(1, uint32_t{1});
    const Growth g{start, r.counters()};
    printf("[ requester] %s %s:%s emulated_drops=+%lu\n", name_of(transport), kNetem,
           g.str(kPathCounters).c_str(), (unsigned long)g["emulated_drops"]);
    EXPECT_GT(g["emulated_drops"], 0u);
    EXPECT_GT(g["retransmitted_pkts"], 0u);
    EXPECT_EQ(0u, g["rcvd_icrc_err"]);
    if (transport == Transport::kShm) {
      EXPECT_GT(g["sent_shm_pkts"], 0u);
      EXPECT_EQ(0u, g["sent_gso_batches"]);
    } else {
      EXPECT_EQ(0u, g["sent_shm_pkts"]);
    }
  };

  s.roles[1].fn = [&](Role& r) {
    auto& l = r.link();
    const Counters start = r.counters();
    kLossTraffic.prepare_target(r);
    ASSERT_FALSE(HasFatalFailure());
    r.barrier();
    kLossTraffic.receive_all(r);
    ASSERT_FALSE(HasFatalFailure());
    r.recv_value<uint32_t>(0, 90s);
    ibv_wc extra{};
    EXPECT_TRUE(no_completion(l.ep.rcq, 20ms, &extra)) << "extra delivery: " << describe(extra);
    EXPECT_TRUE(HasPattern(r.buf() + kLossTraffic.read_base, kLossTraffic.read_span,
                           kLossTraffic.read_seed));
    const Growth g{start, r.counters()};
    printf("[ responder] %s %s:%s emulated_drops=+%lu\n", name_of(transport), kNetem,
           g.str(kPathCounters).c_str(), (unsigned long)g["emulated_drops"]);
    EXPECT_GT(g["emulated_drops"], 0u);
    EXPECT_EQ(0u, g["rcvd_icrc_err"]);
    if (transport == Transport::kShm) {
      EXPECT_GT(g["rcvd_shm_pkts"], 0u);
      EXPECT_EQ(0u, g["rcvd_gro_batches"]);
    } else {
      EXPECT_EQ(0u, g["rcvd_shm_pkts"]);
    }
  };
  run_roles(s);
  expect_clean_dev_shm(slot);
}

INSTANTIATE_TEST_SUITE_P(Netem, PathLoss, ::testing::Values(Transport::kUdp, Transport::kShm),
                         [](const ::testing::TestParamInfo<Transport>& i) {
                           return std::string(i.param == Transport::kUdp ? "Udp" : "Shm");
                         });

// ---- d.: a shm peer dies, a new process takes over its address --------------------------

// The QP timeout while B lives: the engine's default, 14 (4.096 µs · 2^14 ≈ 67 ms; 8 tries
// ≈ 537 ms). B's death is noticed at the first timeout whatever these are (the engine finds
// its process gone), so they only bound how long a live B may go unscheduled: at 10 (4.2 ms)
// and 3 retries, a loaded clean-clone run under ASan failed A's QP 40.7 ms into the stream
// with B alive and its 10 messages not yet taken (2026-11-30).
constexpr uint8_t kKillTimeout = 14;
constexpr uint8_t kKillRetries = 7;
constexpr uint32_t kStreamLen = 4096;
constexpr int kRestartMsgs = 300;
constexpr uint32_t kRestartMaxLen = 9000;  // up to 9 packets at MTU 1024
constexpr uint64_t kRestartWrite = 1 << 20;
// Where the WRITE lands in B''s buffer: past its 64 × 16 KiB receive buffers, odd.
constexpr uint64_t kRestartWriteAt = (1 << 20) + 7;
constexpr uint64_t kRestartWriteSeed = 4242;

uint32_t restart_len(int i) {
  return 4 + static_cast<uint32_t>(i * 6151u % (kRestartMaxLen - 4));
}

// What A and B' exchange to connect their fresh QPs.
struct Hello {
  ibv_gid gid;
  uint32_t qpn, psn, rkey, pad;
  uint64_t addr;
};

TEST(ShmPeer, KilledMidStreamThenRestartedOnSameAddress) {
  const int slot = kRestartSlot;
  // Phase 2 runs under the usual timers: a descheduled process is no failure there.
  ConnOptions fresh;
  fresh.path_mtu = IBV_MTU_1024;

  Spec s;
  s.conn.path_mtu = IBV_MTU_1024;
  s.conn.timeout = kKillTimeout;
  s.conn.retry_cnt = kKillRetries;
  s.roles.resize(3);
  s.links = {{0, 1}};
  s.roles[0].env = env_for(Transport::kShm, slot, 0);
  s.roles[0].buf_size = 2 << 20;
  s.roles[1].env = env_for(Transport::kShm, slot, 1);
  s.roles[1].may_be_killed = true;
  // B' opens its device on B's address only after B is dead.
  s.roles[2].env = env_for(Transport::kShm, slot, 1);
  s.roles[2].open_device = false;
  s.deadline = 60s;

  s.roles[1].fn = [](Role& r) {  // B: receives 10 messages, then SIGKILL
    auto& l = r.link();
    for (int i = 0; i < 64; ++i)
      ASSERT_EQ(0, post_recv(l.ep.qp, i, r.buf() + i * kStreamLen, kStreamLen, r.lkey()));
    r.barrier();
    const Counters c0 = r.counters();
    for (int i = 0; i < 10; ++i) ASSERT_EQ(IBV_WC_SUCCESS, poll_one(l.ep.rcq).status);
    const Growth g{c0, r.counters()};
    printf("[ B        ] before its death:%s\n", g.str(kPathCounters).c_str());
    r.die();
  };

  s.roles[0].fn = [&](Role& r) {  // A
    auto& l = r.link();
    const Counters c0 = r.counters();
    r.barrier();
    // Phase 1: a stream of SENDs into B until B's death fails the QP.
    int posted = 0, completed = 0;
    bool errored = false;
    std::vector<ibv_wc_status> st;
    auto last_success = Clock::now();
    auto error_at = last_success;
    while (completed < posted || (!errored && posted < 100000)) {
      while (!errored && posted - completed < 16) {
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_SEND, posted, r.buf(), kStreamLen, r.lkey()));
        ++posted;
      }
      const ibv_wc wc = poll_one(l.ep.scq, 10s);
      ASSERT_EQ(uint64_t(completed), wc.wr_id) << describe(wc);
      st.push_back(wc.status);
      ++completed;
      if (wc.status == IBV_WC_SUCCESS) last_success = Clock::now();
      if (!errored && wc.status != IBV_WC_SUCCESS) error_at = Clock::now();
      errored |= wc.status != IBV_WC_SUCCESS;
    }
    ASSERT_TRUE(errored);
    size_t i = 0;
    while (i < st.size() && st[i] == IBV_WC_SUCCESS) ++i;
    // B's application saw 10 CQEs before it died, and a receive CQE is released only once
    // the ACK covering it is in A's mailbox, which A drains even after B's death: at least
    // 10 successes, and no more than B had receives for.
    EXPECT_GE(i, 10u) << "B's application saw 10 messages arrive before it died";
    EXPECT_LE(i, 64u) << "more SENDs succeeded than B had receives posted";
    ASSERT_LT(i, st.size());
    EXPECT_EQ(IBV_WC_RETRY_EXC_ERR, st[i]) << ibv_wc_status_str(st[i]);
    for (++i; i < st.size(); ++i)
      EXPECT_EQ(IBV_WC_WR_FLUSH_ERR, st[i])
          << "completion " << i << ": " << ibv_wc_status_str(st[i]);
    printf(
        "[ A        ] %zu SENDs completed before B died; RETRY_EXC_ERR %.1f ms after the last "
        "success\n",
        std::count(st.begin(), st.end(), IBV_WC_SUCCESS), ms(error_at - last_success));
    EXPECT_LE(ms(error_at - last_success), 3000.0) << "the dead peer was noticed too late";
    EXPECT_EQ(IBV_QPS_ERR, qp_state(l.ep.qp));
    const Counters c1 = r.counters();
    printf("[ A        ] to B:%s\n", Growth{c0, c1}.str(kPathCounters).c_str());
    EXPECT_GT(c1["sent_shm_pkts"], c0["sent_shm_pkts"]);
    EXPECT_GE(c1["retry_exceeded_err"], c0["retry_exceeded_err"] + 1);
    ASSERT_TRUE(r.wait_peer_exit(1, 10s)) << "B did not die";

    // Phase 2: a fresh QP to B' on B's address.
    r.send_value(2, uint32_t{1});  // go
    Endpoint ep;
    ASSERT_TRUE(create_endpoint(r.dev(), fresh, ep));
    const Hello mine{r.dev().gid, ep.qpn, ep.psn, r.mr()->rkey, 0, r.buffer().addr()};
    r.send_value(2, mine);
    const Hello theirs = r.recv_value<Hello>(2, 30s);
    ASSERT_TRUE(connect_endpoint(ep, fresh, theirs.gid, theirs.qpn, theirs.psn));
    r.recv_value<uint32_t>(2, 30s);  // B' is connected, its receives are posted
    const Counters c2 = r.counters();
    constexpr int kWindow = 32;
    run_window(ep.scq, "SEND to B'", kRestartMsgs, kWindow, 20s, [&](int i) {
      uint8_t* p = r.buf() + (i % kWindow) * 16384;
      fill_sequenced(p, restart_len(i), static_cast<uint32_t>(i), 7000 + i);
      ASSERT_EQ(0, post_send(ep.qp, IBV_WR_SEND, i, p, restart_len(i), r.lkey()));
    });
    ASSERT_FALSE(HasFatalFailure());
    // And one WRITE of 1 MiB + 5 into B', above its receive buffers: B' may still be
    // checking the last SENDs (their completions here say they arrived, not that B' has
    // looked at them).
    fill_pattern(r.buf() + 3, kRestartWrite + 5, kRestartWriteSeed);
    ASSERT_EQ(0, post_send(ep.qp, IBV_WR_RDMA_WRITE_WITH_IMM, 9999, r.buf() + 3,
                           static_cast<uint32_t>(kRestartWrite + 5), r.lkey(),
                           theirs.addr + kRestartWriteAt, theirs.rkey, htonl(9999)));
    const ibv_wc wc = poll_one(ep.scq, 20s);
    ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << "WRITE to B': " << describe(wc);
    r.send_value(2, uint32_t{2});
    const Counters c3 = r.counters();
    const Growth g{c2, c3};
    printf("[ A        ] to B':%s\n", g.str(kPathCounters).c_str());
    EXPECT_GT(g["sent_shm_pkts"], 0u) << "B' is not reached over shared memory";
    EXPECT_EQ(0u, g["sent_gso_batches"]);
    // B' has checked everything; every packet A put into a ring for B' reached B' (none
    // went into the dead B's mailbox, which A may still have mapped).
    const uint64_t b_rcvd = r.recv_value<uint64_t>(2, 30s);
    EXPECT_EQ(g["sent_shm_pkts"], b_rcvd)
        << "packets for B' written where B' never read them (the dead B's stale mailbox?)";
    destroy_endpoint(ep);
  };

  s.roles[2].fn = [&](Role& r) {  // B'
    r.barrier();
    r.recv_value<uint32_t>(0, 40s);  // B is dead
    // The mailbox of a dead owner is replaced only once the owner is reaped (a zombie pid
    // counts as alive, net/shm_port.cpp pid_alive): wait for the supervisor's waitpid.
    const int dead = r.peer_info(1).pid;
    const auto until = Clock::now() + 5s;
    while (pid_exists(dead) && Clock::now() < until) std::this_thread::sleep_for(1ms);
    ASSERT_FALSE(pid_exists(dead)) << "B (pid " << dead << ") was not reaped";
    struct stat stale {};
    EXPECT_EQ(0, stat(mailbox_of(addr_of(slot, 1)).c_str(), &stale))
        << "B's stale mailbox is not there to be replaced";

    Device dev;
    ASSERT_TRUE(open_device(dev)) << "B' cannot open B's address";
    ASSERT_EQ(addr_of(slot, 1), dev.addr);
    Buffer buf(3 << 20);  // receive buffers, then the WRITE at kRestartWriteAt
    ibv_mr* mr = ibv_reg_mr(dev.pd, buf.data(), buf.size(), kAllAccess);
    ASSERT_NE(nullptr, mr);
    Endpoint ep;
    ASSERT_TRUE(create_endpoint(dev, fresh, ep));
    const Hello theirs = r.recv_value<Hello>(0, 30s);
    const Hello mine{dev.gid, ep.qpn, ep.psn, mr->rkey, 0, buf.addr()};
    r.send_value(0, mine);
    ASSERT_TRUE(connect_endpoint(ep, fresh, theirs.gid, theirs.qpn, theirs.psn));
    const Counters c0 = read_counters(dev.addr, getpid());
    constexpr int kDepth = 64;
    for (int k = 0; k < kDepth; ++k)
      ASSERT_EQ(0, post_recv(ep.qp, k, buf.data() + k * 16384, 16384, mr->lkey));
    r.send_value(0, uint32_t{1});
    for (int m = 0; m < kRestartMsgs; ++m) {
      const ibv_wc wc = poll_one(ep.rcq, 20s);
      ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << "message " << m << ": " << describe(wc);
      ASSERT_EQ(uint64_t(m % kDepth), wc.wr_id);
      ASSERT_EQ(restart_len(m), wc.byte_len) << "message " << m;
      uint8_t* p = buf.data() + wc.wr_id * 16384;
      ASSERT_TRUE(IsSequenced(p, restart_len(m), static_cast<uint32_t>(m), 7000 + m))
          << "message " << m << ": SEND lost, duplicated or reordered";
      if (m + kDepth < kRestartMsgs) {
        ASSERT_EQ(0, post_recv(ep.qp, wc.wr_id, p, 16384, mr->lkey));
      }
    }
    ASSERT_EQ(0, post_recv(ep.qp, 5555, nullptr, 0, mr->lkey));
    const ibv_wc wc = poll_one(ep.rcq, 20s);
    ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << describe(wc);
    EXPECT_EQ(IBV_WC_RECV_RDMA_WITH_IMM, wc.opcode);
    EXPECT_EQ(htonl(9999), wc.imm_data);
    r.recv_value<uint32_t>(0, 30s);
    EXPECT_TRUE(HasPattern(buf.data() + kRestartWriteAt, kRestartWrite + 5, kRestartWriteSeed));
    EXPECT_TRUE(no_completion(ep.rcq, 10ms));
    const Growth g{c0, read_counters(dev.addr, getpid())};
    printf("[ B'       ]%s\n", g.str(kPathCounters).c_str());
    EXPECT_GT(g["rcvd_shm_pkts"], 0u);
    EXPECT_EQ(0u, g["rcvd_gro_batches"]);
    EXPECT_EQ(0u, g["rcvd_icrc_err"]);
    r.send_value(0, uint64_t{g["rcvd_shm_pkts"]});
    r.barrier();  // A is done with its QP before B' tears down
    destroy_endpoint(ep);
    EXPECT_EQ(0, ibv_dereg_mr(mr));
    close_device(dev);
  };
  // A's final barrier (the harness's) pairs with B''s explicit one above.
  run_roles(s);
  expect_clean_dev_shm(slot);
}

// ---- e.: a burst into a receiver whose application does not poll -------------------------

constexpr uint64_t kBurstBytes = 64ull << 20;
constexpr uint32_t kBurstWr = 256 << 10;  // 256 WRITEs of 256 KiB, all posted at once
constexpr uint64_t kBurstSeed = 515;

TEST(ShmPeer, FullRingBurstCompletes) {
  const int slot = kBurstSlot;
  Spec s;
  s.conn.path_mtu = IBV_MTU_4096;
  s.conn.max_send_wr = 512;
  s.roles.resize(2);
  s.links = {{0, 1}};
  s.roles[0].buf_size = kBurstBytes;
  s.roles[1].buf_size = kBurstBytes;
  for (int i = 0; i < 2; ++i) s.roles[i].env = env_for(Transport::kShm, slot, i);
  s.deadline = 60s;

  s.roles[0].fn = [](Role& r) {
    auto& l = r.link();
    fill_pattern(r.buf(), kBurstBytes, kBurstSeed);
    const Counters c0 = r.counters();
    r.barrier();
    const auto t0 = Clock::now();
    constexpr int n = static_cast<int>(kBurstBytes / kBurstWr);
    for (int i = 0; i < n; ++i) {
      const unsigned flags = i + 1 == n ? IBV_SEND_SIGNALED : 0;
      if (i + 1 == n) {
        ASSERT_EQ(
            0, post_send(l.ep.qp, IBV_WR_RDMA_WRITE_WITH_IMM, i, r.buf() + uint64_t(i) * kBurstWr,
                         kBurstWr, r.lkey(), l.remote.addr + uint64_t(i) * kBurstWr, l.remote.rkey,
                         htonl(0xB0B), flags));
      } else {
        ASSERT_EQ(0, post_send(l.ep.qp, IBV_WR_RDMA_WRITE, i, r.buf() + uint64_t(i) * kBurstWr,
                               kBurstWr, r.lkey(), l.remote.addr + uint64_t(i) * kBurstWr,
                               l.remote.rkey, 0, flags));
      }
    }
    const ibv_wc wc = poll_one(l.ep.scq, 40s);
    ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << describe(wc);
    EXPECT_EQ(uint64_t(n - 1), wc.wr_id);
    const double took = ms(Clock::now() - t0);
    EXPECT_TRUE(no_completion(l.ep.scq, 5ms));
    r.send_value(1, uint32_t{1});
    const Growth g{c0, r.counters()};
    printf("[ writer   ] 64 MiB in %.0f ms:%s\n", took, g.str(kPathCounters).c_str());
    EXPECT_GT(g["sent_shm_pkts"], 0u);
    EXPECT_EQ(0u, g["sent_gso_batches"]);
  };
  s.roles[1].fn = [](Role& r) {
    auto& l = r.link();
    memset(r.buf(), 0, kBurstBytes);
    ASSERT_EQ(0, post_recv(l.ep.qp, 1, nullptr, 0, r.lkey()));
    const Counters c0 = r.counters();
    r.barrier();
    // The application looks away while the burst arrives; only the progress thread runs.
    std::this_thread::sleep_for(50ms);
    const ibv_wc wc = poll_one(l.ep.rcq, 40s);
    ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << describe(wc);
    EXPECT_EQ(IBV_WC_RECV_RDMA_WITH_IMM, wc.opcode);
    EXPECT_EQ(htonl(0xB0B), wc.imm_data);
    r.recv_value<uint32_t>(0, 40s);
    EXPECT_TRUE(HasPattern(r.buf(), kBurstBytes, kBurstSeed));
    const Growth g{c0, r.counters()};
    printf("[ target   ]%s\n", g.str(kPathCounters).c_str());
    EXPECT_GT(g["rcvd_shm_pkts"], 0u);
    EXPECT_EQ(0u, g["rcvd_gro_batches"]);
    EXPECT_EQ(0u, g["rcvd_icrc_err"]);
  };
  run_roles(s);
  expect_clean_dev_shm(slot);
}

}  // namespace
}  // namespace softrdma::verbs_test
