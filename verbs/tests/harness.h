// Test harness for the verbs-level tests: plain libibverbs only (no engine internals),
// except for reading the published counters through engine/counters.h.
//
// Two layers:
//  - single-process helpers: open srdma0, create RC QPs with their CQs, move them through
//    RESET→INIT→RTR→RTS, post and poll with bounded waits, deterministic data patterns;
//  - a fork-based N-process runner (run_roles): the gtest process forks every role first
//    (opening a device starts a progress thread, so nothing ibv_* may run before fork),
//    each child opens its own device, creates its QPs, exchanges {GID, QPN, PSN, buffer,
//    rkey, size, pid} with its peers over socketpairs, connects, and runs the role's
//    function. The parent only supervises: it runs barriers over per-child control
//    sockets and kills every child still running at the deadline, so no test can hang.
//
// Children report with gtest assertions like any test body: failures print from the
// child, a fatal failure ends the child at once (exit status 1), and the parent fails the
// test when a child exits non-zero or by a signal.
#pragma once

#include <infiniband/verbs.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "verbs/device_name.h"

namespace softrdma::verbs_test {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;
using namespace std::chrono_literals;

using softrdma::verbs::kDeviceName;
inline constexpr uint8_t kPort = 1;
inline constexpr int kAllAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                  IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
/// Default bound for one completion.
inline constexpr milliseconds kPollTimeout = 10s;

/// Records a fatal gtest failure at the caller's file and line without returning from the
/// caller (usable in functions that return a value). In a forked role this ends the
/// process. (__builtin_FILE/LINE rather than std::source_location: clang 14 with
/// libstdc++ 12 has no source_location.)
void fail_fatal(const std::string& msg, const char* file = __builtin_FILE(),
                int line = __builtin_LINE());

// ---- data patterns ---------------------------------------------------------------------

/// Byte `index` of the deterministic pattern `seed` (a pseudo-random stream).
uint8_t pattern_byte(uint64_t seed, uint64_t index);
/// Writes pattern bytes [start, start + n) of `seed` to p.
void fill_pattern(void* p, size_t n, uint64_t seed, uint64_t start = 0);
/// Index of the first byte of p[0, n) that differs from the pattern, or SIZE_MAX.
size_t pattern_mismatch(const void* p, size_t n, uint64_t seed, uint64_t start = 0);
/// gtest predicate: p[0, n) holds pattern bytes [start, start + n) of `seed`.
::testing::AssertionResult HasPattern(const void* p, size_t n, uint64_t seed, uint64_t start = 0);
/// gtest predicate: every byte of p[0, n) equals v.
::testing::AssertionResult AllBytesAre(const void* p, size_t n, uint8_t v);
/// gtest predicate: a[0, n) == b[0, n), reporting the first difference.
::testing::AssertionResult SameBytes(const void* a, const void* b, size_t n);
/// gtest predicate over a `size`-byte region: [off, off + len) holds pattern bytes
/// [start, start + len) of `seed` and every byte around it is kGuard (each part that fails
/// is reported).
::testing::AssertionResult PatternBetweenGuards(const void* region, size_t size, size_t off,
                                                size_t len, uint64_t seed, uint64_t start = 0);

/// Guard byte written around regions a test expects to stay untouched.
inline constexpr uint8_t kGuard = 0xEE;

// ---- memory ---------------------------------------------------------------------------

/// Page-aligned anonymous mapping with one inaccessible-by-convention guard page on each
/// side (mapped, filled with kGuard, not registered), so tests can check that nothing was
/// written just outside a region.
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t size);
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  uint64_t addr() const { return reinterpret_cast<uintptr_t>(data_); }
  /// The guard pages: [data() - page, data()) and [data() + size(), … + page).
  uint8_t* guard_before() const;
  uint8_t* guard_after() const;
  static size_t page_size();

 private:
  uint8_t* base_ = nullptr;
  size_t mapped_ = 0;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// ---- device and QPs -------------------------------------------------------------------

/// An open srdma0 with a PD.
struct Device {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_device_attr attr{};
  ibv_port_attr port{};
  ibv_gid gid{};
  uint32_t ipv4 = 0;  ///< host order, from GID index 0 (::ffff:a.b.c.d)
  std::string addr;   ///< dotted quad
};

/// Opens srdma0, queries it, allocates a PD. Records a failure and returns false on error.
bool open_device(Device& d);
void close_device(Device& d);

/// Connection parameters (the same defaults as the brief: max_rd_atomic 16, all access).
struct ConnOptions {
  ibv_mtu path_mtu = IBV_MTU_1024;
  uint8_t timeout = 14;  ///< local ACK timeout: 4.096 µs · 2^timeout (14 ≈ 67 ms)
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;      ///< 7 = infinite
  uint8_t min_rnr_timer = 1;  ///< IBTA table 45 code (1 = 0.01 ms)
  uint8_t max_rd_atomic = 16;
  uint8_t max_dest_rd_atomic = 16;
  int qp_access = kAllAccess;
  uint32_t max_send_wr = 256;
  uint32_t max_recv_wr = 256;
  uint32_t max_send_sge = 8;
  uint32_t max_recv_sge = 8;
  uint32_t max_inline_data = 0;
  int cq_depth = 2048;
  /// Initial send PSN of every QP; negative: a pseudo-random 24-bit value per QP.
  int64_t psn = -1;
  /// Non-zero: QPs are created by ibv_create_qp_ex with these IBV_QP_EX_WITH_* ops, so
  /// ibv_qp_to_qp_ex gives their ibv_wr_* API.
  uint64_t send_ops_flags = 0;
  /// Non-null: create_endpoint's QP receives from this SRQ (no receive queue of its own).
  ibv_srq* srq = nullptr;
};

/// One RC QP with its own send and receive CQs.
struct Endpoint {
  ibv_qp* qp = nullptr;
  ibv_cq* scq = nullptr;
  ibv_cq* rcq = nullptr;
  uint32_t qpn = 0;
  uint32_t psn = 0;  ///< initial send PSN (the peer's rq_psn)
  ibv_qp_cap cap{};  ///< capabilities as returned by ibv_create_qp
};

/// Creates CQs and an RC QP (left in RESET). `channel` (optional) is attached to both CQs.
bool create_endpoint(Device& d, const ConnOptions& o, Endpoint& e,
                     ibv_comp_channel* channel = nullptr);
void destroy_endpoint(Endpoint& e);

/// Single transitions; return ibv_modify_qp's result (0 or an errno value).
int modify_to_init(ibv_qp* qp, const ConnOptions& o);
int modify_to_rtr(ibv_qp* qp, const ConnOptions& o, const ibv_gid& dgid, uint32_t dest_qpn,
                  uint32_t rq_psn);
int modify_to_rts(ibv_qp* qp, const ConnOptions& o, uint32_t sq_psn);
/// RESET→INIT→RTR→RTS towards (dgid, dest_qpn) whose first PSN is rq_psn; sends from e.psn.
bool connect_endpoint(Endpoint& e, const ConnOptions& o, const ibv_gid& dgid, uint32_t dest_qpn,
                      uint32_t rq_psn);
/// Two QPs on one device connected to each other.
bool connect_pair(Device& d, const ConnOptions& o, Endpoint& a, Endpoint& b);

/// ibv_query_qp state, or -1.
int qp_state(ibv_qp* qp);

/// IPv4-mapped GID of a host-order address.
ibv_gid gid_from_ipv4(uint32_t ipv4);

/// IBV MTU enum in bytes.
uint32_t mtu_bytes(ibv_mtu m);

// ---- posting ------------------------------------------------------------------------

/// A send WR with up to 16 SGEs, built fluently and posted with ibv_post_send.
struct SendWr {
  ibv_send_wr wr{};
  ibv_sge sge[16]{};

  SendWr(ibv_wr_opcode op, uint64_t wr_id, unsigned flags = IBV_SEND_SIGNALED);
  SendWr& add_sge(const void* addr, uint32_t length, uint32_t lkey);
  SendWr& remote(uint64_t raddr, uint32_t rkey);
  SendWr& imm(uint32_t imm_be);
  SendWr& atomic(uint64_t raddr, uint32_t rkey, uint64_t compare_add, uint64_t swap = 0);
  /// ibv_post_send; returns its result.
  int post(ibv_qp* qp);
};

/// Posts one send WR with at most one SGE (none when len == 0); returns ibv_post_send's result.
int post_send(ibv_qp* qp, ibv_wr_opcode op, uint64_t wr_id, const void* addr, uint32_t len,
              uint32_t lkey, uint64_t raddr = 0, uint32_t rkey = 0, uint32_t imm_be = 0,
              unsigned flags = IBV_SEND_SIGNALED);
/// Posts one receive with at most one SGE (none when len == 0).
int post_recv(ibv_qp* qp, uint64_t wr_id, void* addr, uint32_t len, uint32_t lkey);
/// Posts one receive with the given SGEs.
int post_recv_sges(ibv_qp* qp, uint64_t wr_id, std::vector<ibv_sge> sges);

// ---- polling ------------------------------------------------------------------------

/// Polls until one completion arrives or `timeout` passes. Spins briefly, then sleeps a
/// little between polls so that several processes share two cores.
bool try_poll_one(ibv_cq* cq, ibv_wc& wc, milliseconds timeout = kPollTimeout);
/// Like try_poll_one, but a timeout is a fatal failure (the returned wc then has
/// status IBV_WC_GENERAL_ERR and wr_id UINT64_MAX).
ibv_wc poll_one(ibv_cq* cq, milliseconds timeout = kPollTimeout,
                const char* file = __builtin_FILE(), int line = __builtin_LINE());
/// Polls `n` completions within `timeout` in total (fatal failure on timeout).
std::vector<ibv_wc> poll_n(ibv_cq* cq, size_t n, milliseconds timeout = kPollTimeout,
                           const char* file = __builtin_FILE(), int line = __builtin_LINE());
/// Polls one completion and checks that it is a success of WR `wr_id` with `opcode`: a
/// timeout or any other status, wr_id or opcode is a fatal failure. Returns it for further
/// checks (after a timeout: status IBV_WC_GENERAL_ERR, wr_id UINT64_MAX).
ibv_wc poll_success(ibv_cq* cq, uint64_t wr_id, ibv_wc_opcode opcode,
                    milliseconds timeout = kPollTimeout, const char* file = __builtin_FILE(),
                    int line = __builtin_LINE());
/// gtest predicate: `wc` has IBV_WC_WITH_IMM set and carries `imm_be` (network order, as
/// posted).
::testing::AssertionResult CarriesImm(const ibv_wc& wc, uint32_t imm_be);
/// True when no completion arrives within `window`; otherwise stores it in *got.
bool no_completion(ibv_cq* cq, milliseconds window, ibv_wc* got = nullptr);

/// "wr_id=… status=… (name) opcode=… byte_len=… …" for failure messages.
std::string describe(const ibv_wc& wc);

// ---- counters -----------------------------------------------------------------------

/// A snapshot of one device's published counters.
struct Counters {
  std::map<std::string, uint64_t> values;
  bool valid = false;
  uint64_t operator[](const std::string& name) const;
};
/// How much counters grew between two snapshots.
struct Growth {
  Counters before, after;
  uint64_t operator[](const std::string& name) const { return after[name] - before[name]; }
  /// " name=+N" for every counter that grew.
  std::string str() const;
  /// " name=+N" for each of `names`, grown or not.
  std::string str(const std::vector<std::string>& names) const;
};
/// Counters of the device bound to `addr` owned by `pid`. Records a failure if none.
Counters read_counters(const std::string& addr, int pid);
/// Waits until the sum of `names` in the counters of (addr, pid) has grown by at least
/// `delta` over `base`; returns the growth seen last.
uint64_t wait_counter_growth(const std::string& addr, int pid,
                             const std::vector<std::string>& names, const Counters& base,
                             uint64_t delta, milliseconds timeout = 3s);

// ---- multi-process runner ------------------------------------------------------------

/// What one role's peer sent during setup.
struct PeerInfo {
  ibv_gid gid{};
  uint32_t ipv4 = 0;
  uint32_t qpn = 0;   ///< the peer's QP on this link (0 when there is no link)
  uint32_t psn = 0;   ///< the peer's initial send PSN
  uint64_t addr = 0;  ///< the peer's buffer
  uint64_t size = 0;
  uint32_t rkey = 0;
  int32_t pid = 0;
  std::string addr_str() const;
};

/// A QP connected to a peer role.
struct Link {
  int peer = -1;
  Endpoint ep;
  PeerInfo remote;
};

class Role;

struct RoleSpec {
  std::function<void(Role&)> fn;
  /// Environment set in the child before the device is opened (e.g. SOFTRDMA_NETEM).
  std::vector<std::pair<std::string, std::string>> env;
  /// Registered buffer of this role (with guard pages), `mr_access` rights.
  size_t buf_size = 1 << 20;
  int mr_access = kAllAccess;
  /// Connection options of this role's QPs, if different from Spec::conn.
  std::optional<ConnOptions> conn;
  /// The role may end by SIGKILL (Role::die) without failing the test.
  bool may_be_killed = false;
  /// false: the harness opens no device (nor buffer, MR or QPs; the role may have no
  /// links) and the role's function opens one itself when it is ready — e.g. a process
  /// that must take over an address only after another role gave it up. Its PeerInfo
  /// carries only the pid.
  bool open_device = true;
};

struct Spec {
  std::vector<RoleSpec> roles;
  /// One RC QP pair per entry (a, b), a != b, at most one per pair of roles.
  std::vector<std::pair<int, int>> links;
  ConnOptions conn;
  /// Every child still running then is killed and the test fails.
  seconds deadline{120};
};

/// Runs a multi-process test from a TEST body. Fails the test when any role fails.
void run_roles(const Spec& spec);
/// One role (its own device, no link), run in a child process within `deadline`: for tests
/// whose other side is a raw socket in the same process (rawpkt's FakePeer).
void run_in_one_process(std::function<void(Role&)> fn, seconds deadline);
/// Two roles, one link between them.
void run_pair(const ConnOptions& conn, std::function<void(Role&)> role0,
              std::function<void(Role&)> role1, size_t buf_size = 1 << 20);

/// The view a role's function has of its process.
class Role {
 public:
  int index() const { return index_; }
  int num_roles() const { return num_roles_; }
  Device& dev() { return dev_; }
  const ConnOptions& conn() const { return conn_; }
  uint8_t* buf() { return buf_.data(); }
  size_t buf_size() const { return buf_.size(); }
  Buffer& buffer() { return buf_; }
  ibv_mr* mr() { return mr_; }
  uint32_t lkey() const { return mr_ ? mr_->lkey : 0; }

  /// The link to `peer` (fatal failure if none).
  Link& link(int peer);
  /// The only link of this role.
  Link& link();
  std::vector<Link>& links() { return links_; }
  /// Setup info of `peer` (also for roles without a link to it: no QP fields then).
  const PeerInfo& peer_info(int peer) const { return peers_.at(peer); }

  /// Waits until every role still running has reached a barrier.
  void barrier();

  /// Byte messages to a peer role over the setup socketpair.
  void send_bytes(int peer, const void* p, size_t n);
  bool recv_bytes(int peer, void* p, size_t n, milliseconds timeout = 60s);
  template <class T>
  void send_value(int peer, const T& v) {
    send_bytes(peer, &v, sizeof v);
  }
  template <class T>
  T recv_value(int peer, milliseconds timeout = 60s, const char* file = __builtin_FILE(),
               int line = __builtin_LINE()) {
    T v{};
    if (!recv_bytes(peer, &v, sizeof v, timeout))
      fail_fatal("no message from role " + std::to_string(peer) + " (it exited or timed out)", file,
                 line);
    return v;
  }
  /// Waits until `peer` has exited (its end of the socketpair is closed).
  bool wait_peer_exit(int peer, milliseconds timeout = 30s);
  /// Ends this process with SIGKILL (for RoleSpec::may_be_killed roles).
  [[noreturn]] void die();

  Counters counters() { return read_counters(dev_.addr, getpid_()); }
  Counters peer_counters(int peer) {
    return read_counters(peers_.at(peer).addr_str(), peers_.at(peer).pid);
  }

 private:
  friend struct RoleProcess;
  static int getpid_();

  int index_ = 0;
  int num_roles_ = 0;
  Device dev_;
  ConnOptions conn_;
  Buffer buf_;
  ibv_mr* mr_ = nullptr;
  std::vector<Link> links_;
  std::map<int, PeerInfo> peers_;
  std::map<int, int> peer_fd_;
  int ctl_fd_ = -1;
};

/// Posts `count` RDMA WRITEs of `message` bytes each from r.buf() to the same offsets of
/// the peer's buffer over r.link(), wr_id = index, and waits up to 60 s for each completion
/// (a fatal test failure otherwise). A bulk stream for the wide-area tests.
void write_stream(Role& r, size_t message, size_t count);
/// Whether `tool` is on PATH.
bool have_tool(const char* tool);
/// What `cmd` (run by popen) writes to stdout; empty when it cannot run.
std::string command_output(const std::string& cmd);

}  // namespace softrdma::verbs_test
