// ShmPort: same-host shared-memory packet path. Every test uses its own name prefix (pid +
// counter) under /dev/shm and loopback addresses 127.0.x.y; every loop is bounded in count
// and in time; fork()ed children only call async-signal-safe-ish code and _exit().
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "net/shm_port.h"

using namespace softrdma::net;
using namespace std::chrono_literals;

namespace {

constexpr uint32_t ip_of(uint32_t c, uint32_t d) {
  return 127u << 24 | c << 8 | d;
}

uint8_t pattern_byte(uint32_t seed, size_t i) {
  return static_cast<uint8_t>(seed * 131u + i * 7u + (i >> 8));
}

std::vector<uint8_t> make_packet(uint32_t seed, size_t len) {
  std::vector<uint8_t> v(len);
  for (size_t i = 0; i < len; ++i) v[i] = pattern_byte(seed, i);
  return v;
}

ShmSendResult send_bytes(ShmPort& p, uint32_t dst, const std::vector<uint8_t>& v) {
  // Split into up to three pieces to exercise the gather.
  size_t a = v.size() / 3, b = v.size() / 2;
  iovec iov[3] = {{const_cast<uint8_t*>(v.data()), a},
                  {const_cast<uint8_t*>(v.data()) + a, b - a},
                  {const_cast<uint8_t*>(v.data()) + b, v.size() - b}};
  return p.send(dst, iov, 3);
}

struct Received {
  uint32_t src;
  std::vector<uint8_t> bytes;
};

size_t drain(ShmPort& p, std::vector<Received>& out, size_t budget = 1000) {
  return p.poll(
      [&](uint32_t src, std::span<const uint8_t> b) {
        out.push_back({src, std::vector<uint8_t>(b.begin(), b.end())});
      },
      budget);
}

// Waits (bounded) until `fn()` is true; returns its last value.
template <class F>
bool eventually(F&& fn, std::chrono::milliseconds limit = 3000ms) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  for (int i = 0; i < 100000; ++i) {
    if (fn()) return true;
    if (std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(1ms);
  }
  return fn();
}

// Reads one byte from `fd` within `ms`; false on timeout/EOF.
bool wait_byte(int fd, int ms = 5000) {
  pollfd pf{fd, POLLIN, 0};
  if (::poll(&pf, 1, ms) != 1) return false;
  char c;
  return ::read(fd, &c, 1) == 1;
}

void put_byte(int fd) {
  char c = 1;
  (void)!::write(fd, &c, 1);
}

int wait_child(pid_t pid) {
  int status = 0;
  for (int i = 0; i < 5000; ++i) {
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(1ms);
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return -1;
}

// Forks a process that opens a ShmPort on `ip`, runs `then` on it (its result is the exit
// status; none: 0) and dies without close(), as a crash would: its mailbox file stays, its
// owner pid is dead. Returns the child's exit status as wait_child does (1: open failed,
// -1: no fork).
int die_after_open(const ShmConfig& cfg, uint32_t ip,
                   const std::function<int(ShmPort&)>& then = {}) {
  const pid_t child = ::fork();
  if (child < 0) return -1;
  if (child == 0) {
    ShmPort p;
    if (p.open(ip, cfg) != 0) _exit(1);
    _exit(then ? then(p) : 0);
  }
  return wait_child(child);
}

// Opens `a` on a_ip and a receiver process on b_ip; `a` sends it one `len`-byte packet,
// then the receiver closes its port (graceful) or exits without close() (a crash) and is
// reaped. Fatal failure if a step fails.
void receiver_leaves_after_one_packet(const ShmConfig& cfg, ShmPort& a, uint32_t a_ip,
                                      uint32_t b_ip, bool graceful, size_t len) {
  int ready[2], go[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(go), 0);
  struct Pipes {
    int* fds[2];
    ~Pipes() {
      for (int* p : fds) ::close(p[0]), ::close(p[1]);
    }
  } pipes{{ready, go}};
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ShmPort b;
    if (b.open(b_ip, cfg) != 0) _exit(1);
    put_byte(ready[1]);
    wait_byte(go[0]);
    if (graceful) b.close();
    _exit(0);
  }
  const bool ready_seen = wait_byte(ready[0]);
  if (!ready_seen) put_byte(go[1]);  // let it go (wait_child kills it after 5 s anyway)
  ASSERT_TRUE(ready_seen) << "the receiver process did not open " << b_ip;
  ASSERT_EQ(a.open(a_ip, cfg), 0);
  EXPECT_EQ(send_bytes(a, b_ip, make_packet(1, len)), ShmSendResult::kSent);
  put_byte(go[1]);
  ASSERT_EQ(wait_child(child), 0);
}

class ShmPortTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static int counter = 0;
    cfg.name_prefix = "srtest-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + "-";
    cfg.ring_count = 8;
    cfg.ring_bytes = 64u << 10;
    cfg.peer_retry_ns = 5'000'000;
    cfg.liveness_check_ns = 5'000'000;
  }
  void TearDown() override {
    // Children that died without close() leave their files behind: remove ours.
    if (DIR* d = ::opendir(cfg.dir.c_str())) {
      while (dirent* e = ::readdir(d)) {
        std::string n = e->d_name;
        if (n.rfind(cfg.name_prefix, 0) == 0) ::unlink((cfg.dir + "/" + n).c_str());
      }
      ::closedir(d);
    }
  }
  ShmConfig cfg;
};

TEST_F(ShmPortTest, RoundTripOddSizesWithWrapAround) {
  const uint32_t a_ip = ip_of(1, 1), b_ip = ip_of(1, 2);
  ShmPort a, b;
  ASSERT_EQ(a.open(a_ip, cfg), 0);
  ASSERT_EQ(b.open(b_ip, cfg), 0);
  EXPECT_NE(a.epoch(), b.epoch());
  struct stat st;
  EXPECT_EQ(::stat(shm_mailbox_path(cfg, b_ip).c_str(), &st), 0);

  std::vector<Received> at_a, at_b;
  size_t total_bytes = 0;
  const int kPackets = 1500;  // ~3 MiB each way through a 64 KiB ring: ~50 wraps
  for (int i = 0; i < kPackets; ++i) {
    size_t len = 1 + (static_cast<size_t>(i) * 397u) % 4200u;
    if (i < 3) len = static_cast<size_t>(i) + 1;  // 1, 2, 3 bytes
    if (i == 3) len = 4200;
    ASSERT_EQ(send_bytes(a, b_ip, make_packet(i, len)), ShmSendResult::kSent) << i;
    ASSERT_EQ(send_bytes(b, a_ip, make_packet(i + 100000, len)), ShmSendResult::kSent) << i;
    total_bytes += len;
    if (i % 7 == 6 || i == kPackets - 1) {
      drain(b, at_b);
      drain(a, at_a);
    }
  }
  ASSERT_EQ(at_b.size(), static_cast<size_t>(kPackets));
  ASSERT_EQ(at_a.size(), static_cast<size_t>(kPackets));
  for (int i = 0; i < kPackets; ++i) {
    size_t len = 1 + (static_cast<size_t>(i) * 397u) % 4200u;
    if (i < 3) len = static_cast<size_t>(i) + 1;
    if (i == 3) len = 4200;
    EXPECT_EQ(at_b[i].src, a_ip);
    EXPECT_EQ(at_a[i].src, b_ip);
    ASSERT_EQ(at_b[i].bytes, make_packet(i, len)) << i;
    ASSERT_EQ(at_a[i].bytes, make_packet(i + 100000, len)) << i;
  }
  EXPECT_GT(total_bytes, 20 * cfg.ring_bytes);
  EXPECT_EQ(a.stats().packets_out, static_cast<uint64_t>(kPackets));
  EXPECT_EQ(b.stats().packets_in, static_cast<uint64_t>(kPackets));
  EXPECT_EQ(b.stats().bytes_in, total_bytes);
  EXPECT_EQ(a.stats().rings_claimed, 1u);
  EXPECT_EQ(b.stats().broken_rings, 0u);
  EXPECT_EQ(a.stats().full_drops, 0u);

  b.close();
  EXPECT_NE(::stat(shm_mailbox_path(cfg, b_ip).c_str(), &st), 0);  // unlinked
}

// A record sent CE-marked is delivered with the mark (a poll callback that takes it);
// the others without, and two-argument callbacks still work.
TEST_F(ShmPortTest, CeMarkTravelsWithTheRecord) {
  const uint32_t a_ip = ip_of(1, 1), b_ip = ip_of(1, 2);
  ShmPort a, b;
  ASSERT_EQ(a.open(a_ip, cfg), 0);
  ASSERT_EQ(b.open(b_ip, cfg), 0);
  const std::vector<uint8_t> pkt = make_packet(7, 100);
  iovec v{const_cast<uint8_t*>(pkt.data()), pkt.size()};
  ASSERT_EQ(a.send(b_ip, &v, 1, false), ShmSendResult::kSent);
  ASSERT_EQ(a.send(b_ip, &v, 1, true), ShmSendResult::kSent);
  ASSERT_EQ(a.send(b_ip, &v, 1), ShmSendResult::kSent);
  std::vector<bool> marks;
  b.poll(
      [&](uint32_t src, std::span<const uint8_t> bytes, bool ce) {
        EXPECT_EQ(src, a_ip);
        EXPECT_EQ(std::vector<uint8_t>(bytes.begin(), bytes.end()), pkt);
        marks.push_back(ce);
      },
      16);
  EXPECT_EQ(marks, (std::vector<bool>{false, true, false}));
  EXPECT_EQ(b.stats().broken_rings, 0u);
}

TEST_F(ShmPortTest, PollBudgetAndEmptyPoll) {
  const uint32_t a_ip = ip_of(1, 3), b_ip = ip_of(1, 4);
  ShmPort a, b;
  ASSERT_EQ(a.open(a_ip, cfg), 0);
  ASSERT_EQ(b.open(b_ip, cfg), 0);
  std::vector<Received> got;
  EXPECT_EQ(drain(b, got), 0u);
  for (int i = 0; i < 5; ++i)
    ASSERT_EQ(send_bytes(a, b_ip, make_packet(i, 64)), ShmSendResult::kSent);
  EXPECT_EQ(drain(b, got, 2), 2u);
  EXPECT_EQ(drain(b, got, 0), 0u);
  EXPECT_EQ(drain(b, got), 3u);
  EXPECT_EQ(drain(b, got), 0u);
  ASSERT_EQ(got.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(got[i].bytes, make_packet(i, 64));
  // Zero-length packet and an oversized one.
  EXPECT_EQ(a.send(b_ip, nullptr, 0), ShmSendResult::kSent);
  EXPECT_EQ(send_bytes(a, b_ip, make_packet(0, cfg.max_packet_bytes + 1)), ShmSendResult::kNoPeer);
  got.clear();
  EXPECT_EQ(drain(b, got), 1u);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(got[0].bytes.empty());
}

TEST_F(ShmPortTest, FullRingDropsThenRecoversAfterDrain) {
  const uint32_t a_ip = ip_of(1, 5), b_ip = ip_of(1, 6);
  cfg.backlog_bytes = 0;  // no backlog: a full ring drops
  ShmPort a, b;
  ASSERT_EQ(a.open(a_ip, cfg), 0);
  ASSERT_EQ(b.open(b_ip, cfg), 0);
  int sent = 0;
  ShmSendResult r = ShmSendResult::kSent;
  for (int i = 0; i < 1000; ++i) {
    r = send_bytes(a, b_ip, make_packet(i, 4000));
    if (r != ShmSendResult::kSent) break;
    ++sent;
  }
  EXPECT_EQ(r, ShmSendResult::kFull);
  EXPECT_GT(sent, 5);
  EXPECT_LE(sent * 4000, static_cast<int>(cfg.ring_bytes));
  EXPECT_EQ(a.stats().full_drops, 1u);
  EXPECT_EQ(send_bytes(a, b_ip, make_packet(9999, 4000)), ShmSendResult::kFull);

  std::vector<Received> got;
  EXPECT_EQ(drain(b, got), static_cast<size_t>(sent));
  for (int i = 0; i < sent; ++i) ASSERT_EQ(got[i].bytes, make_packet(i, 4000));
  EXPECT_EQ(send_bytes(a, b_ip, make_packet(4242, 4000)), ShmSendResult::kSent);
  got.clear();
  EXPECT_EQ(drain(b, got), 1u);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].bytes, make_packet(4242, 4000));
}

// A full ring with a backlog: nothing is dropped, later packets queue behind earlier ones,
// drain_backlog() writes them in order as the receiver frees room; beyond backlog_bytes a
// packet is dropped (kFull); a receiver that goes away takes the backlog with it.
TEST_F(ShmPortTest, FullRingBacklogKeepsOrderAndBounds) {
  const uint32_t a_ip = ip_of(1, 15), b_ip = ip_of(1, 16);
  cfg.backlog_bytes = 40'000;  // ten 4000-byte packets
  ShmPort a, b;
  ASSERT_EQ(a.open(a_ip, cfg), 0);
  ASSERT_EQ(b.open(b_ip, cfg), 0);
  EXPECT_FALSE(a.backlogged(b_ip));
  int accepted = 0, in_ring = 0;
  ShmSendResult r = ShmSendResult::kSent;
  for (int i = 0; i < 1000; ++i) {
    r = send_bytes(a, b_ip, make_packet(i, 4000));
    if (r == ShmSendResult::kFull) break;
    in_ring += r == ShmSendResult::kSent;
    ++accepted;
  }
  EXPECT_EQ(r, ShmSendResult::kFull);
  EXPECT_EQ(accepted - in_ring, 10);  // the backlog's worth
  EXPECT_EQ(a.stats().backlogged, 10u);
  EXPECT_EQ(a.stats().full_drops, 1u);
  EXPECT_TRUE(a.backlogged(b_ip));
  EXPECT_FALSE(a.backlogged(a_ip));
  EXPECT_TRUE(a.any_backlog());

  std::vector<Received> got;
  for (int round = 0; round < 100 && static_cast<int>(got.size()) < accepted; ++round) {
    drain(b, got);
    a.drain_backlog();
  }
  ASSERT_EQ(static_cast<int>(got.size()), accepted);
  for (int i = 0; i < accepted; ++i) ASSERT_EQ(got[i].bytes, make_packet(i, 4000)) << i;
  EXPECT_FALSE(a.any_backlog());
  EXPECT_EQ(send_bytes(a, b_ip, make_packet(4242, 4000)), ShmSendResult::kSent);
  got.clear();
  EXPECT_EQ(drain(b, got), 1u);

  // Fill ring and backlog again; then the receiver closes: the backlog is lost, not kept.
  for (int i = 0; i < 1000; ++i)
    if (send_bytes(a, b_ip, make_packet(i, 4000)) == ShmSendResult::kFull) break;
  EXPECT_TRUE(a.any_backlog());
  b.close();
  EXPECT_EQ(a.drain_backlog(), 0u);
  EXPECT_FALSE(a.any_backlog());
  EXPECT_EQ(a.stats().backlog_lost, 10u);
}

TEST_F(ShmPortTest, NoPeerUntilMailboxAppears) {
  const uint32_t a_ip = ip_of(1, 7), late_ip = ip_of(1, 99);
  ShmPort a;
  ShmPort unopened;
  auto pkt = make_packet(1, 100);
  EXPECT_EQ(send_bytes(unopened, late_ip, pkt), ShmSendResult::kNoPeer);
  ASSERT_EQ(a.open(a_ip, cfg), 0);
  EXPECT_EQ(send_bytes(a, late_ip, pkt), ShmSendResult::kNoPeer);
  EXPECT_EQ(send_bytes(a, late_ip, pkt), ShmSendResult::kNoPeer);  // cached failure
  EXPECT_EQ(a.stats().no_peer, 2u);

  ShmPort late;
  ASSERT_EQ(late.open(late_ip, cfg), 0);
  EXPECT_TRUE(eventually([&] { return send_bytes(a, late_ip, pkt) == ShmSendResult::kSent; }));
  std::vector<Received> got;
  EXPECT_EQ(drain(late, got), 1u);
  EXPECT_EQ(a.stats().peers_found, 1u);
}

TEST_F(ShmPortTest, SecondOpenOfLiveAddressFails) {
  const uint32_t ip = ip_of(1, 8);
  ShmPort p1, p2;
  ASSERT_EQ(p1.open(ip, cfg), 0);
  EXPECT_EQ(p1.open(ip_of(1, 9), cfg), EINVAL);  // already open
  EXPECT_EQ(p2.open(ip, cfg), EADDRINUSE);
  EXPECT_FALSE(p2.is_open());
  p1.close();
  EXPECT_EQ(p2.open(ip, cfg), 0);

  ShmConfig bad = cfg;
  bad.ring_bytes = 100000;  // not a power of two
  ShmPort p3;
  EXPECT_EQ(p3.open(ip_of(1, 10), bad), EINVAL);
  bad = cfg;
  bad.ring_count = 65;
  EXPECT_EQ(p3.open(ip_of(1, 10), bad), EINVAL);
}

TEST_F(ShmPortTest, StaleSegmentOfDeadOwnerIsReplaced) {
  const uint32_t a_ip = ip_of(2, 1), b_ip = ip_of(2, 2);
  const std::string path = shm_mailbox_path(cfg, b_ip);
  ASSERT_EQ(die_after_open(cfg, b_ip), 0);
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);  // left behind, owner pid now dead

  ShmPort a, b;
  ASSERT_EQ(a.open(a_ip, cfg), 0);
  EXPECT_EQ(send_bytes(a, b_ip, make_packet(1, 10)), ShmSendResult::kNoPeer);  // owner dead
  ASSERT_EQ(b.open(b_ip, cfg), 0);
  EXPECT_TRUE(
      eventually([&] { return send_bytes(a, b_ip, make_packet(2, 10)) == ShmSendResult::kSent; }));
  std::vector<Received> got;
  EXPECT_EQ(drain(b, got), 1u);
  b.close();

  // A garbage file at the path is replaced too.
  int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "garbage", 7), 7);
  ::close(fd);
  ShmPort b2;
  EXPECT_EQ(b2.open(b_ip, cfg), 0);
}

// `softrdma stat --clean`: the mailbox a killed device left is removed, a live one is not.
TEST_F(ShmPortTest, RemoveStaleMailboxesSparesLiveOwners) {
  const uint32_t dead_ip = ip_of(2, 3), live_ip = ip_of(2, 4);
  ASSERT_EQ(die_after_open(cfg, dead_ip), 0);
  ShmPort live;
  ASSERT_EQ(live.open(live_ip, cfg), 0);
  struct stat st;
  ASSERT_EQ(::stat(shm_mailbox_path(cfg, dead_ip).c_str(), &st), 0);
  const std::vector<std::string> removed = shm_remove_stale_mailboxes(cfg);
  ASSERT_EQ(removed.size(), 1u);
  EXPECT_EQ(removed[0], shm_mailbox_path(cfg, dead_ip));
  EXPECT_NE(::stat(shm_mailbox_path(cfg, dead_ip).c_str(), &st), 0);
  EXPECT_EQ(::stat(shm_mailbox_path(cfg, live_ip).c_str(), &st), 0);
}

// Receiver child goes away (closed or crashed): the sender sees kNoPeer within bounded time.
void receiver_goes_away(const ShmConfig& cfg, uint32_t a_ip, uint32_t b_ip, bool graceful) {
  ShmPort a;
  ASSERT_NO_FATAL_FAILURE(receiver_leaves_after_one_packet(cfg, a, a_ip, b_ip, graceful, 1000));
  int sends = 0;
  EXPECT_TRUE(eventually([&] {
    ++sends;
    return send_bytes(a, b_ip, make_packet(2, 1000)) == ShmSendResult::kNoPeer;
  }));
  if (graceful) {
    EXPECT_EQ(sends, 1);  // the closed flag is seen on the very next send
  }
  EXPECT_EQ(a.stats().peers_lost, 1u);
  EXPECT_EQ(send_bytes(a, b_ip, make_packet(3, 1000)), ShmSendResult::kNoPeer);
}

TEST_F(ShmPortTest, ReceiverClosesSenderSeesNoPeer) {
  receiver_goes_away(cfg, ip_of(3, 1), ip_of(3, 2), true);
}

TEST_F(ShmPortTest, ReceiverCrashesSenderSeesNoPeer) {
  receiver_goes_away(cfg, ip_of(3, 3), ip_of(3, 4), false);
}

TEST_F(ShmPortTest, ReceiverRestartOnSameAddressIsFoundAgain) {
  const uint32_t a_ip = ip_of(4, 1), b_ip = ip_of(4, 2);
  ShmPort a;
  ASSERT_NO_FATAL_FAILURE(receiver_leaves_after_one_packet(cfg, a, a_ip, b_ip, false, 500));

  // New incarnation on the same address (this process), new epoch.
  ShmPort b;
  ASSERT_EQ(b.open(b_ip, cfg), 0);
  std::vector<Received> got;
  EXPECT_TRUE(eventually([&] {
    send_bytes(a, b_ip, make_packet(7, 500));
    return drain(b, got) > 0;
  }));
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got[0].bytes, make_packet(7, 500));  // nothing from the old incarnation
  EXPECT_EQ(a.stats().peers_found, 2u);
  EXPECT_GE(a.stats().peers_lost, 1u);

  // And an in-process close + reopen: the closed flag sends the sender to the new file.
  uint64_t old_epoch = b.epoch();
  b.close();
  ASSERT_EQ(b.open(b_ip, cfg), 0);
  EXPECT_NE(b.epoch(), old_epoch);
  got.clear();
  EXPECT_TRUE(eventually([&] {
    send_bytes(a, b_ip, make_packet(8, 300));
    return drain(b, got) > 0;
  }));
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got[0].bytes, make_packet(8, 300));
}

// A receiver that crashed and was restarted on the same address gets the sender's very
// next packet: replacing the dead owner's mailbox marks it closed, so a sender that still
// maps it does not keep writing into it until its next liveness check (made long here).
TEST_F(ShmPortTest, RestartedReceiverGetsTheVeryNextSend) {
  cfg.liveness_check_ns = 60'000'000'000;
  const uint32_t a_ip = ip_of(4, 3), b_ip = ip_of(4, 4);
  ShmPort a;
  ASSERT_NO_FATAL_FAILURE(receiver_leaves_after_one_packet(cfg, a, a_ip, b_ip, false, 500));

  ShmPort b;
  ASSERT_EQ(b.open(b_ip, cfg), 0);
  EXPECT_EQ(send_bytes(a, b_ip, make_packet(9, 400)), ShmSendResult::kSent);
  std::vector<Received> got;
  EXPECT_EQ(drain(b, got), 1u) << "the packet went into the dead owner's mailbox";
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].bytes, make_packet(9, 400));
  EXPECT_EQ(got[0].src, a_ip);
  EXPECT_EQ(a.stats().peers_lost, 1u);
  EXPECT_EQ(a.stats().peers_found, 2u);
}

TEST_F(ShmPortTest, DeadProducerRingIsReleased) {
  cfg.ring_count = 1;  // one ring: a new producer can only get the dead one's
  const uint32_t a_ip = ip_of(5, 1), b_ip = ip_of(5, 2), c_ip = ip_of(5, 3);
  ShmPort b;
  ASSERT_EQ(b.open(b_ip, cfg), 0);
  ASSERT_EQ(die_after_open(cfg, c_ip,
                           [&](ShmPort& c) {
                             const auto r = send_bytes(c, b_ip, make_packet(1, 100));
                             return r == ShmSendResult::kSent ? 0 : 2;
                           }),
            0);

  ShmPort a;
  ASSERT_EQ(a.open(a_ip, cfg), 0);
  EXPECT_EQ(send_bytes(a, b_ip, make_packet(2, 100)), ShmSendResult::kNoPeer);  // no free ring
  std::vector<Received> got;
  EXPECT_TRUE(eventually([&] {
    drain(b, got);
    return send_bytes(a, b_ip, make_packet(3, 100)) == ShmSendResult::kSent;
  }));
  EXPECT_GE(b.stats().rings_freed, 1u);
  // What the producer wrote before it died still arrived (as a dead sender's datagrams do).
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].src, c_ip);
  EXPECT_EQ(got[0].bytes, make_packet(1, 100));
  got.clear();
  EXPECT_EQ(drain(b, got), 1u);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].src, a_ip);
  EXPECT_EQ(got[0].bytes, make_packet(3, 100));
}

TEST_F(ShmPortTest, ClosedProducerRingIsDrainedThenReleased) {
  cfg.ring_count = 1;
  const uint32_t a_ip = ip_of(5, 4), b_ip = ip_of(5, 5), c_ip = ip_of(5, 6);
  ShmPort a, b, c;
  ASSERT_EQ(b.open(b_ip, cfg), 0);
  ASSERT_EQ(c.open(c_ip, cfg), 0);
  ASSERT_EQ(a.open(a_ip, cfg), 0);
  ASSERT_EQ(send_bytes(c, b_ip, make_packet(1, 100)), ShmSendResult::kSent);
  c.close();
  std::vector<Received> got;
  EXPECT_EQ(drain(b, got), 1u);  // a closed producer's last packets are still delivered
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].src, c_ip);
  EXPECT_TRUE(eventually([&] {
    drain(b, got);
    return send_bytes(a, b_ip, make_packet(2, 100)) == ShmSendResult::kSent;
  }));
  got.clear();
  EXPECT_EQ(drain(b, got), 1u);
}

// A producer process streams while this process consumes: real cross-process SPSC traffic,
// in order and intact, through the sender's backlog (a small one, so kFull happens too and
// is retried after drain_backlog(), bounded); no timing is measured.
TEST_F(ShmPortTest, CrossProcessStreamIsInOrderAndIntact) {
  const uint32_t b_ip = ip_of(5, 7), c_ip = ip_of(5, 8);
  const uint32_t kPackets = 20000;
  ShmPort b;
  ASSERT_EQ(b.open(b_ip, cfg), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ShmPort c;
    ShmConfig small = cfg;
    small.backlog_bytes = 32u << 10;
    if (c.open(c_ip, small) != 0) _exit(1);
    auto deadline = std::chrono::steady_clock::now() + 20s;
    for (uint32_t i = 0; i < kPackets;) {
      size_t len = 4 + (i * 613u) % 4200u;
      auto pkt = make_packet(i, len);
      std::memcpy(pkt.data(), &i, 4);
      ShmSendResult r = send_bytes(c, b_ip, pkt);
      if (r == ShmSendResult::kSent || r == ShmSendResult::kQueued) {
        ++i;
      } else if (r == ShmSendResult::kNoPeer || std::chrono::steady_clock::now() > deadline) {
        _exit(2);
      } else {
        c.drain_backlog();
      }
    }
    while (c.drain_backlog() != 0)
      if (std::chrono::steady_clock::now() > deadline) _exit(3);
    c.close();
    _exit(0);
  }
  uint32_t next = 0;
  bool ok = true;
  auto deadline = std::chrono::steady_clock::now() + 30s;
  while (next < kPackets && ok && std::chrono::steady_clock::now() < deadline) {
    b.poll(
        [&](uint32_t src, std::span<const uint8_t> bytes) {
          uint32_t seq = ~0u;
          if (bytes.size() >= 4) std::memcpy(&seq, bytes.data(), 4);
          size_t len = 4 + (next * 613u) % 4200u;
          if (src != c_ip || seq != next || bytes.size() != len) {
            ok = false;
            return;
          }
          for (size_t i = 4; i < len; ++i)
            if (bytes[i] != pattern_byte(next, i)) ok = false;
          ++next;
        },
        64);
  }
  EXPECT_TRUE(ok) << "at packet " << next;
  EXPECT_EQ(next, kPackets);
  EXPECT_EQ(wait_child(child), 0);
  EXPECT_EQ(b.stats().broken_rings, 0u);
}

TEST_F(ShmPortTest, DoorbellOnlyForSleepingReceiver) {
  cfg.doorbell_threshold_ns = 5000;
  const uint32_t a_ip = ip_of(6, 1), b_ip = ip_of(6, 2);
  ShmPort a, b;
  ASSERT_EQ(a.open(a_ip, cfg), 0);
  ASSERT_EQ(b.open(b_ip, cfg), 0);
  ASSERT_GE(b.doorbell_fd(), 0);
  pollfd pf{b.doorbell_fd(), POLLIN, 0};
  auto pkt = make_packet(1, 200);

  // Sleeping receiver: rung.
  b.note_sleeping();
  uint64_t now = shm_monotonic_ns();
  ASSERT_EQ(send_bytes(a, b_ip, pkt), ShmSendResult::kSent);
  a.ring_doorbells(now);
  EXPECT_EQ(::poll(&pf, 1, 2000), 1);
  EXPECT_EQ(a.stats().doorbells, 1u);
  b.drain_doorbell();
  EXPECT_EQ(::poll(&pf, 1, 0), 0);

  // Nothing written since: no doorbell.
  a.ring_doorbells(now + 1'000'000'000);
  EXPECT_EQ(::poll(&pf, 1, 20), 0);

  // Receiver polled just now: not rung.
  b.note_polling(now);
  ASSERT_EQ(send_bytes(a, b_ip, pkt), ShmSendResult::kSent);
  a.ring_doorbells(now + 1000);
  EXPECT_EQ(::poll(&pf, 1, 20), 0);
  EXPECT_EQ(a.stats().doorbells, 1u);

  // Receiver's last poll is stale: rung.
  ASSERT_EQ(send_bytes(a, b_ip, pkt), ShmSendResult::kSent);
  a.ring_doorbells(now + 1'000'000);
  EXPECT_EQ(::poll(&pf, 1, 2000), 1);
  b.drain_doorbell();
  std::vector<Received> got;
  EXPECT_EQ(drain(b, got), 3u);
}

// A receiver that publishes a longer threshold (its poller is descheduled, not stopped) is
// rung only once its clock is older than that; publishing 0 restores the sender's default.
TEST_F(ShmPortTest, ReceiverPublishedDoorbellThreshold) {
  cfg.doorbell_threshold_ns = 5000;
  const uint32_t a_ip = ip_of(6, 3), b_ip = ip_of(6, 4);
  ShmPort a, b;
  ASSERT_EQ(a.open(a_ip, cfg), 0);
  ASSERT_EQ(b.open(b_ip, cfg), 0);
  pollfd pf{b.doorbell_fd(), POLLIN, 0};
  auto pkt = make_packet(1, 200);
  const uint64_t now = shm_monotonic_ns();

  b.set_doorbell_threshold(200'000);
  b.note_polling(now);
  ASSERT_EQ(send_bytes(a, b_ip, pkt), ShmSendResult::kSent);
  a.ring_doorbells(now + 100'000);  // stale for the default, fresh for 200 µs: not rung
  EXPECT_EQ(::poll(&pf, 1, 20), 0);
  ASSERT_EQ(send_bytes(a, b_ip, pkt), ShmSendResult::kSent);
  a.ring_doorbells(now + 300'000);  // older than 200 µs: rung
  EXPECT_EQ(::poll(&pf, 1, 2000), 1);
  b.drain_doorbell();

  // A sleeping receiver is rung whatever its threshold.
  b.note_sleeping();
  ASSERT_EQ(send_bytes(a, b_ip, pkt), ShmSendResult::kSent);
  a.ring_doorbells(now + 300'001);
  EXPECT_EQ(::poll(&pf, 1, 2000), 1);
  b.drain_doorbell();

  b.set_doorbell_threshold(0);  // back to the sender's 5 µs
  b.note_polling(now);
  ASSERT_EQ(send_bytes(a, b_ip, pkt), ShmSendResult::kSent);
  a.ring_doorbells(now + 100'000);
  EXPECT_EQ(::poll(&pf, 1, 2000), 1);
  b.drain_doorbell();
  EXPECT_EQ(a.stats().doorbells, 3u);
  std::vector<Received> got;
  EXPECT_EQ(drain(b, got), 4u);
}

// Issue 21: a mailbox belongs to its network namespace (ShmConfig::netns, here set by hand):
// a sender of another namespace, even one naming the same address, does not find it — not by
// its name, nor (a file put under its name) by the namespace its header records.
TEST_F(ShmPortTest, MailboxesAreScopedToTheirNetworkNamespace) {
  const uint32_t a_ip = ip_of(6, 11), b_ip = ip_of(6, 12), c_ip = ip_of(6, 13);
  ShmConfig here = cfg, there = cfg;
  here.netns = 1111;
  there.netns = 2222;
  ShmPort a, b, c;
  ASSERT_EQ(a.open(a_ip, here), 0);
  ASSERT_EQ(b.open(b_ip, here), 0);
  ASSERT_EQ(c.open(c_ip, there), 0);
  EXPECT_EQ(shm_mailbox_path(here, b_ip),
            cfg.dir + "/" + cfg.name_prefix + "shm-ns1111-127.0.6.12");
  ShmConfig unscoped = cfg;
  unscoped.netns = 0;
  EXPECT_EQ(shm_mailbox_path(unscoped, b_ip), cfg.dir + "/" + cfg.name_prefix + "shm-127.0.6.12");

  const auto pkt = make_packet(3, 300);
  EXPECT_EQ(send_bytes(c, b_ip, pkt), ShmSendResult::kNoPeer);
  EXPECT_EQ(send_bytes(a, b_ip, pkt), ShmSendResult::kSent);
  // b's mailbox under the other namespace's name: its header still says 1111.
  ASSERT_EQ(::link(shm_mailbox_path(here, b_ip).c_str(), shm_mailbox_path(there, b_ip).c_str()), 0);
  std::this_thread::sleep_for(std::chrono::nanoseconds(cfg.peer_retry_ns) + 1ms);
  EXPECT_EQ(send_bytes(c, b_ip, pkt), ShmSendResult::kNoPeer);
  EXPECT_EQ(c.stats().peers_found, 0u);
  std::vector<Received> got;
  ASSERT_EQ(drain(b, got), 1u);
  EXPECT_EQ(got[0].src, a_ip);
}

// A doorbell refused (ECONNREFUSED: its owner is gone, or in another network namespace) is
// not ignored: the peer is dropped and counted, and send() says kNoPeer (UDP) from then on.
TEST_F(ShmPortTest, RefusedDoorbellDropsThePeer) {
  cfg.liveness_check_ns = 60'000'000'000;  // the refusal, not the pid check, must find it
  const uint32_t a_ip = ip_of(6, 21), b_ip = ip_of(6, 22);
  int ready[2], go[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(go), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the receiver: opens, then dies without close() (its bell goes with it)
    ShmPort b;
    if (b.open(b_ip, cfg) != 0) _exit(1);
    put_byte(ready[1]);
    wait_byte(go[0]);
    _exit(0);
  }
  ShmPort a;
  ASSERT_EQ(a.open(a_ip, cfg), 0);
  ASSERT_TRUE(wait_byte(ready[0]));
  const auto pkt = make_packet(4, 100);
  ASSERT_EQ(send_bytes(a, b_ip, pkt), ShmSendResult::kSent);
  EXPECT_EQ(a.ring_doorbells(shm_monotonic_ns()), 0u);  // sleeping receiver (never polled)
  EXPECT_EQ(a.stats().doorbells, 1u);
  put_byte(go[1]);
  EXPECT_EQ(wait_child(child), 0);
  // The mailbox still looks open and the pid check is a minute away: the write succeeds,
  // the doorbell is refused.
  ASSERT_EQ(send_bytes(a, b_ip, pkt), ShmSendResult::kSent);
  EXPECT_EQ(a.ring_doorbells(shm_monotonic_ns()), 1u);
  EXPECT_EQ(a.stats().doorbell_failures, 1u);
  EXPECT_EQ(send_bytes(a, b_ip, pkt), ShmSendResult::kNoPeer);
  // Looked up again later: the mailbox is there, its doorbell is not.
  std::this_thread::sleep_for(std::chrono::nanoseconds(cfg.peer_retry_ns) + 1ms);
  EXPECT_EQ(send_bytes(a, b_ip, pkt), ShmSendResult::kNoPeer);
  for (int* p : {ready, go}) ::close(p[0]), ::close(p[1]);
}

// The real thing (needs CAP_SYS_ADMIN for unshare(CLONE_NEWNET), else skipped): ports opened
// by a thread in a new network namespace — one of them on an address also open here — and
// ports here never write to each other, each sender reaching only its own namespace's owner
// of the address. With unscoped names (netns 0, as without /proc) the doorbell check alone
// keeps a sender here off the other namespace's mailbox.
TEST_F(ShmPortTest, AnotherNetworkNamespaceWithTheSameAddressStaysSeparate) {
  const uint32_t a_ip = ip_of(6, 31), b_ip = ip_of(6, 32), c_ip = ip_of(6, 33);
  const uint32_t d_ip = ip_of(6, 34), e_ip = ip_of(6, 35);
  ShmConfig unscoped = cfg;
  unscoped.netns = 0;
  ShmPort a, b;       // here
  ShmPort b2, c, d2;  // there: b2 on b's address, d2 unscoped
  ASSERT_EQ(a.open(a_ip, cfg), 0);
  ASSERT_EQ(b.open(b_ip, cfg), 0);
  int unshare_err = 0, b2_err = -1, c_err = -1, d2_err = -1;
  std::thread([&] {
    if (::unshare(CLONE_NEWNET) != 0) {
      unshare_err = errno;
      return;
    }
    b2_err = b2.open(b_ip, cfg);
    c_err = c.open(c_ip, cfg);
    d2_err = d2.open(d_ip, unscoped);
  }).join();
  if (unshare_err != 0)
    GTEST_SKIP() << "unshare(CLONE_NEWNET): " << std::strerror(unshare_err)
                 << " (needs CAP_SYS_ADMIN)";
  ASSERT_EQ(b2_err, 0);
  ASSERT_EQ(c_err, 0);
  ASSERT_EQ(d2_err, 0);

  EXPECT_EQ(send_bytes(a, b_ip, make_packet(1, 500)), ShmSendResult::kSent);
  EXPECT_EQ(send_bytes(c, b_ip, make_packet(2, 700)), ShmSendResult::kSent);
  EXPECT_EQ(send_bytes(c, a_ip, make_packet(3, 100)), ShmSendResult::kNoPeer);
  EXPECT_EQ(send_bytes(a, c_ip, make_packet(4, 100)), ShmSendResult::kNoPeer);
  std::vector<Received> at_b, at_b2;
  ASSERT_EQ(drain(b, at_b), 1u);
  ASSERT_EQ(drain(b2, at_b2), 1u);
  EXPECT_EQ(at_b[0].src, a_ip);
  EXPECT_EQ(at_b[0].bytes, make_packet(1, 500));
  EXPECT_EQ(at_b2[0].src, c_ip);
  EXPECT_EQ(at_b2[0].bytes, make_packet(2, 700));

  ShmPort e;
  ASSERT_EQ(e.open(e_ip, unscoped), 0);
  EXPECT_EQ(send_bytes(e, d_ip, make_packet(5, 100)), ShmSendResult::kNoPeer);
  EXPECT_EQ(e.stats().unreachable_peers, 1u);
  EXPECT_EQ(e.stats().peers_found, 0u);
}

// Finds `needle` in the mailbox file of `ip` and returns a writable mapping of it plus the
// offset (layout-agnostic corruption).
struct FileMap {
  uint8_t* base = nullptr;
  size_t bytes = 0;
  ~FileMap() {
    if (base) ::munmap(base, bytes);
  }
};

size_t find_in_mailbox(const std::string& path, const std::vector<uint8_t>& needle, FileMap& m) {
  int fd = ::open(path.c_str(), O_RDWR);
  if (fd < 0) return 0;
  struct stat st;
  ::fstat(fd, &st);
  m.bytes = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, m.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return 0;
  m.base = static_cast<uint8_t*>(p);
  void* hit = ::memmem(m.base, m.bytes, needle.data(), needle.size());
  return hit ? static_cast<size_t>(static_cast<uint8_t*>(hit) - m.base) : 0;
}

TEST_F(ShmPortTest, CorruptedRecordHeaderIsCountedNotFatal) {
  const uint32_t a_ip = ip_of(7, 1), b_ip = ip_of(7, 2);
  ShmPort a, b;
  ASSERT_EQ(a.open(a_ip, cfg), 0);
  ASSERT_EQ(b.open(b_ip, cfg), 0);
  auto marker = make_packet(0xC0FFEE, 96);
  ASSERT_EQ(send_bytes(a, b_ip, marker), ShmSendResult::kSent);
  FileMap m;
  size_t off = find_in_mailbox(shm_mailbox_path(cfg, b_ip), marker, m);
  ASSERT_GE(off, 8u);
  uint32_t huge = 0x7FFFFFFF;
  std::memcpy(m.base + off - 8, &huge, 4);  // record length beyond the ring

  std::vector<Received> got;
  EXPECT_EQ(drain(b, got), 0u);
  EXPECT_EQ(b.stats().broken_rings, 1u);
  EXPECT_EQ(drain(b, got), 0u);
  EXPECT_EQ(b.stats().broken_rings, 1u);

  // The producer notices its ring was quarantined and takes another one.
  auto pkt = make_packet(5, 300);
  ASSERT_EQ(send_bytes(a, b_ip, pkt), ShmSendResult::kSent);
  EXPECT_EQ(a.stats().rings_claimed, 2u);
  EXPECT_EQ(drain(b, got), 1u);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].bytes, pkt);
  // The quarantined ring, now acknowledged by its producer, goes back to the pool.
  EXPECT_TRUE(eventually([&] {
    drain(b, got);
    return b.stats().rings_freed >= 1;
  }));
}

TEST_F(ShmPortTest, ScribbledRingDataNeverCrashesReceiver) {
  const uint32_t a_ip = ip_of(7, 3), b_ip = ip_of(7, 4);
  for (int variant = 0; variant < 3; ++variant) {
    ShmPort a, b;
    ASSERT_EQ(a.open(a_ip, cfg), 0);
    ASSERT_EQ(b.open(b_ip, cfg), 0);
    auto marker = make_packet(0xBEEF + variant, 128);
    ASSERT_EQ(send_bytes(a, b_ip, marker), ShmSendResult::kSent);
    for (int i = 0; i < 20; ++i)
      ASSERT_EQ(send_bytes(a, b_ip, make_packet(i, 1500)), ShmSendResult::kSent);
    FileMap m;
    size_t off = find_in_mailbox(shm_mailbox_path(cfg, b_ip), marker, m);
    ASSERT_GE(off, 8u);
    size_t from = off - 8, to = std::min(m.bytes, from + 40000);
    uint32_t x = 12345u + variant;
    for (size_t i = from; i < to; ++i) {
      x = x * 1103515245u + 12345u;
      m.base[i] = variant == 0 ? 0xFF : variant == 1 ? static_cast<uint8_t>(x >> 16) : 0;
    }
    std::vector<Received> got;
    size_t n = 0;
    for (int i = 0; i < 10; ++i) n += drain(b, got);
    EXPECT_LE(n, cfg.ring_bytes / 64);
    // The sender keeps working (same or new ring) and nothing hangs.
    for (int i = 0; i < 10; ++i) send_bytes(a, b_ip, make_packet(i, 100));
    for (int i = 0; i < 10; ++i) drain(b, got);
  }
}

}  // namespace
