#include "verbs/tests/harness.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <thread>

#include "engine/counters.h"

namespace softrdma::verbs_test {

void fail_fatal(const std::string& msg, const char* file, int line) {
  GTEST_MESSAGE_AT_(file, line, msg.c_str(), ::testing::TestPartResult::kFatalFailure);
}

// ---- data patterns ---------------------------------------------------------------------

namespace {

// "0x…" (an AssertionResult streams each piece into a fresh Message, so std::hex set on it
// does not reach the next value).
std::string hex(uint64_t v) {
  char b[24];
  snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

uint64_t mix64(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

uint8_t pattern_byte(uint64_t seed, uint64_t index) {
  return static_cast<uint8_t>(mix64(mix64(seed) + (index >> 3)) >> ((index & 7) * 8));
}

void fill_pattern(void* p, size_t n, uint64_t seed, uint64_t start) {
  auto* b = static_cast<uint8_t*>(p);
  const uint64_t s = mix64(seed);
  size_t i = 0;
  while (i < n) {
    const uint64_t idx = start + i;
    const uint64_t w = mix64(s + (idx >> 3));
    for (unsigned k = idx & 7; k < 8 && i < n; ++k, ++i) b[i] = static_cast<uint8_t>(w >> (k * 8));
  }
}

size_t pattern_mismatch(const void* p, size_t n, uint64_t seed, uint64_t start) {
  const auto* b = static_cast<const uint8_t*>(p);
  const uint64_t s = mix64(seed);
  size_t i = 0;
  while (i < n) {
    const uint64_t idx = start + i;
    const uint64_t w = mix64(s + (idx >> 3));
    for (unsigned k = idx & 7; k < 8 && i < n; ++k, ++i)
      if (b[i] != static_cast<uint8_t>(w >> (k * 8))) return i;
  }
  return SIZE_MAX;
}

::testing::AssertionResult HasPattern(const void* p, size_t n, uint64_t seed, uint64_t start) {
  const size_t i = pattern_mismatch(p, n, seed, start);
  if (i == SIZE_MAX) return ::testing::AssertionSuccess();
  const auto* b = static_cast<const uint8_t*>(p);
  size_t bad = 0;
  for (size_t k = i; k < n; ++k) bad += b[k] != pattern_byte(seed, start + k);
  return ::testing::AssertionFailure()
         << "pattern " << seed << " mismatch in a " << n << "-byte region: first at offset " << i
         << " (got " << hex(b[i]) << ", want " << hex(pattern_byte(seed, start + i)) << "), " << bad
         << " bytes differ in all";
}

::testing::AssertionResult AllBytesAre(const void* p, size_t n, uint8_t v) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) {
    if (b[i] != v) {
      size_t bad = 0;
      for (size_t k = i; k < n; ++k) bad += b[k] != v;
      return ::testing::AssertionFailure()
             << "byte " << i << " of a " << n << "-byte region is " << hex(b[i]) << ", want "
             << hex(v) << "; " << bad << " bytes differ in all";
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult SameBytes(const void* a, const void* b, size_t n) {
  const auto* x = static_cast<const uint8_t*>(a);
  const auto* y = static_cast<const uint8_t*>(b);
  for (size_t i = 0; i < n; ++i) {
    if (x[i] != y[i]) {
      return ::testing::AssertionFailure()
             << "byte " << i << " of " << n << " differs: " << hex(x[i]) << " vs " << hex(y[i]);
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult PatternBetweenGuards(const void* region, size_t size, size_t off,
                                                size_t len, uint64_t seed, uint64_t start) {
  const auto* b = static_cast<const uint8_t*>(region);
  if (off + len > size) {
    return ::testing::AssertionFailure()
           << "[" << off << ", " << off + len << ") is not inside a " << size << "-byte region";
  }
  const auto before = AllBytesAre(b, off, kGuard);
  const auto data = HasPattern(b + off, len, seed, start);
  const auto after = AllBytesAre(b + off + len, size - off - len, kGuard);
  if (before && data && after) return ::testing::AssertionSuccess();
  auto r = ::testing::AssertionFailure();
  if (!before) r << "before byte " << off << ": " << before.message() << "; ";
  if (!data) r << "at [" << off << ", " << off + len << "): " << data.message() << "; ";
  if (!after) r << "from byte " << off + len << ": " << after.message();
  return r;
}

// ---- memory ---------------------------------------------------------------------------

size_t Buffer::page_size() {
  return static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

Buffer::Buffer(size_t size) {
  const size_t page = page_size();
  const size_t body = (std::max<size_t>(size, 1) + page - 1) / page * page;
  mapped_ = body + 2 * page;
  void* m = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) {
    fail_fatal("mmap of " + std::to_string(mapped_) + " bytes failed: " + strerror(errno));
    mapped_ = 0;
    return;
  }
  base_ = static_cast<uint8_t*>(m);
  data_ = base_ + page;
  size_ = size;
  memset(base_, kGuard, page);
  memset(data_ + size_, kGuard, mapped_ - page - size_);
}

Buffer::~Buffer() {
  if (base_) munmap(base_, mapped_);
}

Buffer::Buffer(Buffer&& o) noexcept {
  *this = std::move(o);
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    if (base_) munmap(base_, mapped_);
    base_ = std::exchange(o.base_, nullptr);
    mapped_ = std::exchange(o.mapped_, 0);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

uint8_t* Buffer::guard_before() const {
  return data_ - page_size();
}
uint8_t* Buffer::guard_after() const {
  return data_ + size_;
}

// ---- device and QPs -------------------------------------------------------------------

ibv_gid gid_from_ipv4(uint32_t ipv4) {
  ibv_gid g{};
  g.raw[10] = 0xff;
  g.raw[11] = 0xff;
  const uint32_t be = htonl(ipv4);
  memcpy(&g.raw[12], &be, 4);
  return g;
}

uint32_t mtu_bytes(ibv_mtu m) {
  switch (m) {
    case IBV_MTU_256:
      return 256;
    case IBV_MTU_512:
      return 512;
    case IBV_MTU_1024:
      return 1024;
    case IBV_MTU_2048:
      return 2048;
    case IBV_MTU_4096:
      return 4096;
  }
  return 0;
}

std::string PeerInfo::addr_str() const {
  char s[INET_ADDRSTRLEN] = {};
  const uint32_t be = htonl(ipv4);
  inet_ntop(AF_INET, &be, s, sizeof s);
  return s;
}

bool open_device(Device& d) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list) {
    ADD_FAILURE() << "ibv_get_device_list: " << strerror(errno);
    return false;
  }
  ibv_device* dev = nullptr;
  for (int i = 0; i < n; ++i)
    if (strcmp(ibv_get_device_name(list[i]), kDeviceName) == 0) dev = list[i];
  if (!dev) {
    ibv_free_device_list(list);
    ADD_FAILURE() << "no device " << kDeviceName << " among " << n;
    return false;
  }
  d.ctx = ibv_open_device(dev);
  const int open_errno = errno;
  ibv_free_device_list(list);
  if (!d.ctx) {
    ADD_FAILURE() << "ibv_open_device: " << strerror(open_errno);
    return false;
  }
  if (int rc = ibv_query_device(d.ctx, &d.attr)) {
    ADD_FAILURE() << "ibv_query_device: " << rc;
    return false;
  }
  if (int rc = ibv_query_port(d.ctx, kPort, &d.port)) {
    ADD_FAILURE() << "ibv_query_port: " << rc;
    return false;
  }
  if (int rc = ibv_query_gid(d.ctx, kPort, 0, &d.gid)) {
    ADD_FAILURE() << "ibv_query_gid: " << rc;
    return false;
  }
  static const uint8_t kV4Prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (memcmp(d.gid.raw, kV4Prefix, 12) != 0) {
    ADD_FAILURE() << "GID 0 is not IPv4-mapped";
    return false;
  }
  uint32_t be = 0;
  memcpy(&be, &d.gid.raw[12], 4);
  d.ipv4 = ntohl(be);
  char s[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &be, s, sizeof s);
  d.addr = s;
  d.pd = ibv_alloc_pd(d.ctx);
  if (!d.pd) {
    ADD_FAILURE() << "ibv_alloc_pd: " << strerror(errno);
    return false;
  }
  return true;
}

void close_device(Device& d) {
  if (d.pd) {
    EXPECT_EQ(0, ibv_dealloc_pd(d.pd));
  }
  d.pd = nullptr;
  if (d.ctx) {
    EXPECT_EQ(0, ibv_close_device(d.ctx));
  }
  d.ctx = nullptr;
}

namespace {

uint32_t random_psn() {
  static std::mt19937 rng(static_cast<uint32_t>(getpid()) * 2654435761u ^
                          static_cast<uint32_t>(Clock::now().time_since_epoch().count()));
  return rng() & 0xffffff;
}

}  // namespace

bool create_endpoint(Device& d, const ConnOptions& o, Endpoint& e, ibv_comp_channel* channel) {
  e.scq = ibv_create_cq(d.ctx, o.cq_depth, nullptr, channel, 0);
  e.rcq = ibv_create_cq(d.ctx, o.cq_depth, nullptr, channel, 0);
  if (!e.scq || !e.rcq) {
    ADD_FAILURE() << "ibv_create_cq(" << o.cq_depth << "): " << strerror(errno);
    return false;
  }
  ibv_qp_init_attr ia{};
  ia.send_cq = e.scq;
  ia.recv_cq = e.rcq;
  ia.qp_type = IBV_QPT_RC;
  ia.sq_sig_all = 0;
  ia.cap.max_send_wr = o.max_send_wr;
  ia.cap.max_recv_wr = o.max_recv_wr;
  ia.cap.max_send_sge = o.max_send_sge;
  ia.cap.max_recv_sge = o.max_recv_sge;
  ia.cap.max_inline_data = o.max_inline_data;
  ia.srq = o.srq;
  if (o.send_ops_flags) {
    // The extended post API (ibv_wr_*): ibv_create_qp_ex with the ops the test posts.
    ibv_qp_init_attr_ex ix{};
    ix.send_cq = ia.send_cq;
    ix.recv_cq = ia.recv_cq;
    ix.qp_type = ia.qp_type;
    ix.sq_sig_all = ia.sq_sig_all;
    ix.cap = ia.cap;
    ix.srq = ia.srq;
    ix.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    ix.pd = d.pd;
    ix.send_ops_flags = o.send_ops_flags;
    e.qp = ibv_create_qp_ex(d.ctx, &ix);
    ia.cap = ix.cap;
  } else {
    e.qp = ibv_create_qp(d.pd, &ia);
  }
  if (!e.qp) {
    ADD_FAILURE() << "ibv_create_qp: " << strerror(errno);
    return false;
  }
  e.cap = ia.cap;
  e.qpn = e.qp->qp_num;
  e.psn = o.psn >= 0 ? static_cast<uint32_t>(o.psn) & 0xffffff : random_psn();
  EXPECT_GE(e.cap.max_send_wr, o.max_send_wr);
  EXPECT_GE(e.cap.max_send_sge, o.max_send_sge);
  if (!o.srq) {  // with an SRQ the QP has no receive queue of its own
    EXPECT_GE(e.cap.max_recv_wr, o.max_recv_wr);
    EXPECT_GE(e.cap.max_recv_sge, o.max_recv_sge);
  }
  EXPECT_GE(e.cap.max_inline_data, o.max_inline_data);
  return true;
}

void destroy_endpoint(Endpoint& e) {
  if (e.qp) {
    EXPECT_EQ(0, ibv_destroy_qp(e.qp)) << "ibv_destroy_qp";
  }
  if (e.scq) {
    EXPECT_EQ(0, ibv_destroy_cq(e.scq)) << "ibv_destroy_cq";
  }
  if (e.rcq) {
    EXPECT_EQ(0, ibv_destroy_cq(e.rcq)) << "ibv_destroy_cq";
  }
  e = Endpoint{};
}

int modify_to_init(ibv_qp* qp, const ConnOptions& o) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = kPort;
  a.qp_access_flags = static_cast<unsigned>(o.qp_access);
  return ibv_modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

int modify_to_rtr(ibv_qp* qp, const ConnOptions& o, const ibv_gid& dgid, uint32_t dest_qpn,
                  uint32_t rq_psn) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = o.path_mtu;
  a.dest_qp_num = dest_qpn;
  a.rq_psn = rq_psn;
  a.max_dest_rd_atomic = o.max_dest_rd_atomic;
  a.min_rnr_timer = o.min_rnr_timer;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = dgid;
  a.ah_attr.grh.sgid_index = 0;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = kPort;
  return ibv_modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                           IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

int modify_to_rts(ibv_qp* qp, const ConnOptions& o, uint32_t sq_psn) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = o.timeout;
  a.retry_cnt = o.retry_cnt;
  a.rnr_retry = o.rnr_retry;
  a.sq_psn = sq_psn;
  a.max_rd_atomic = o.max_rd_atomic;
  return ibv_modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                           IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

bool connect_endpoint(Endpoint& e, const ConnOptions& o, const ibv_gid& dgid, uint32_t dest_qpn,
                      uint32_t rq_psn) {
  if (int rc = modify_to_init(e.qp, o)) {
    ADD_FAILURE() << "RESET->INIT: " << strerror(rc);
    return false;
  }
  if (int rc = modify_to_rtr(e.qp, o, dgid, dest_qpn, rq_psn)) {
    ADD_FAILURE() << "INIT->RTR: " << strerror(rc);
    return false;
  }
  if (int rc = modify_to_rts(e.qp, o, e.psn)) {
    ADD_FAILURE() << "RTR->RTS: " << strerror(rc);
    return false;
  }
  return true;
}

bool connect_pair(Device& d, const ConnOptions& o, Endpoint& a, Endpoint& b) {
  if (!create_endpoint(d, o, a) || !create_endpoint(d, o, b)) return false;
  return connect_endpoint(a, o, d.gid, b.qpn, b.psn) && connect_endpoint(b, o, d.gid, a.qpn, a.psn);
}

int qp_state(ibv_qp* qp) {
  ibv_qp_attr a{};
  ibv_qp_init_attr ia{};
  if (ibv_query_qp(qp, &a, IBV_QP_STATE, &ia) != 0) return -1;
  return a.qp_state;
}

// ---- posting ------------------------------------------------------------------------

SendWr::SendWr(ibv_wr_opcode op, uint64_t wr_id, unsigned flags) {
  wr.wr_id = wr_id;
  wr.opcode = op;
  wr.send_flags = flags;
  wr.sg_list = sge;
  wr.num_sge = 0;
}

SendWr& SendWr::add_sge(const void* addr, uint32_t length, uint32_t lkey) {
  if (wr.num_sge >= 16) {
    fail_fatal("SendWr: more than 16 SGEs");
    return *this;
  }
  sge[wr.num_sge++] = ibv_sge{reinterpret_cast<uintptr_t>(addr), length, lkey};
  return *this;
}

SendWr& SendWr::remote(uint64_t raddr, uint32_t rkey) {
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  return *this;
}

SendWr& SendWr::imm(uint32_t imm_be) {
  wr.imm_data = imm_be;
  return *this;
}

SendWr& SendWr::atomic(uint64_t raddr, uint32_t rkey, uint64_t compare_add, uint64_t swap) {
  wr.wr.atomic.remote_addr = raddr;
  wr.wr.atomic.rkey = rkey;
  wr.wr.atomic.compare_add = compare_add;
  wr.wr.atomic.swap = swap;
  return *this;
}

int SendWr::post(ibv_qp* qp) {
  wr.sg_list = sge;  // the object may have been copied
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(qp, &wr, &bad);
}

int post_send(ibv_qp* qp, ibv_wr_opcode op, uint64_t wr_id, const void* addr, uint32_t len,
              uint32_t lkey, uint64_t raddr, uint32_t rkey, uint32_t imm_be, unsigned flags) {
  SendWr w(op, wr_id, flags);
  if (len > 0) w.add_sge(addr, len, lkey);
  w.remote(raddr, rkey);
  w.imm(imm_be);
  return w.post(qp);
}

int post_recv(ibv_qp* qp, uint64_t wr_id, void* addr, uint32_t len, uint32_t lkey) {
  std::vector<ibv_sge> sges;
  if (len > 0) sges.push_back(ibv_sge{reinterpret_cast<uintptr_t>(addr), len, lkey});
  return post_recv_sges(qp, wr_id, std::move(sges));
}

int post_recv_sges(ibv_qp* qp, uint64_t wr_id, std::vector<ibv_sge> sges) {
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = sges.empty() ? nullptr : sges.data();
  wr.num_sge = static_cast<int>(sges.size());
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(qp, &wr, &bad);
}

// ---- polling ------------------------------------------------------------------------

bool try_poll_one(ibv_cq* cq, ibv_wc& wc, milliseconds timeout) {
  const auto start = Clock::now();
  const auto end = start + timeout;
  for (;;) {
    const int n = ibv_poll_cq(cq, 1, &wc);
    if (n == 1) return true;
    if (n < 0) {
      ADD_FAILURE() << "ibv_poll_cq returned " << n;
      return false;
    }
    const auto now = Clock::now();
    if (now >= end) return false;
    // Spin for a moment for latency, then let the other processes' threads run.
    if (now - start > 200us) std::this_thread::sleep_for(20us);
  }
}

ibv_wc poll_one(ibv_cq* cq, milliseconds timeout, const char* file, int line) {
  ibv_wc wc{};
  if (!try_poll_one(cq, wc, timeout)) {
    wc = ibv_wc{};
    wc.status = IBV_WC_GENERAL_ERR;
    wc.wr_id = UINT64_MAX;
    fail_fatal("no completion within " + std::to_string(timeout.count()) + " ms", file, line);
  }
  return wc;
}

std::vector<ibv_wc> poll_n(ibv_cq* cq, size_t n, milliseconds timeout, const char* file, int line) {
  std::vector<ibv_wc> out;
  out.reserve(n);
  const auto end = Clock::now() + timeout;
  while (out.size() < n) {
    const auto left = std::chrono::duration_cast<milliseconds>(end - Clock::now());
    ibv_wc wc{};
    if (left.count() <= 0 || !try_poll_one(cq, wc, left)) {
      fail_fatal("only " + std::to_string(out.size()) + " of " + std::to_string(n) +
                     " completions within " + std::to_string(timeout.count()) + " ms",
                 file, line);
      return out;
    }
    out.push_back(wc);
  }
  return out;
}

ibv_wc poll_success(ibv_cq* cq, uint64_t wr_id, ibv_wc_opcode opcode, milliseconds timeout,
                    const char* file, int line) {
  ibv_wc wc{};
  if (!try_poll_one(cq, wc, timeout)) {
    wc = ibv_wc{};
    wc.status = IBV_WC_GENERAL_ERR;
    wc.wr_id = UINT64_MAX;
    fail_fatal("no completion of wr_id " + std::to_string(wr_id) + " within " +
                   std::to_string(timeout.count()) + " ms",
               file, line);
  } else if (wc.status != IBV_WC_SUCCESS || wc.wr_id != wr_id || wc.opcode != opcode) {
    fail_fatal("want a success of wr_id " + std::to_string(wr_id) + " opcode " +
                   std::to_string(opcode) + ", got " + describe(wc),
               file, line);
  }
  return wc;
}

::testing::AssertionResult CarriesImm(const ibv_wc& wc, uint32_t imm_be) {
  if (!(wc.wc_flags & IBV_WC_WITH_IMM))
    return ::testing::AssertionFailure() << "no IBV_WC_WITH_IMM: " << describe(wc);
  if (wc.imm_data != imm_be) {
    return ::testing::AssertionFailure()
           << "imm " << hex(ntohl(wc.imm_data)) << ", want " << hex(ntohl(imm_be));
  }
  return ::testing::AssertionSuccess();
}

bool no_completion(ibv_cq* cq, milliseconds window, ibv_wc* got) {
  ibv_wc wc{};
  if (try_poll_one(cq, wc, window)) {
    if (got) *got = wc;
    return false;
  }
  return true;
}

std::string describe(const ibv_wc& wc) {
  std::ostringstream s;
  s << "wr_id=" << wc.wr_id << " status=" << wc.status << " (" << ibv_wc_status_str(wc.status)
    << ") opcode=" << wc.opcode << " byte_len=" << wc.byte_len << " qp_num=" << wc.qp_num
    << " wc_flags=0x" << std::hex << wc.wc_flags << " imm=0x" << ntohl(wc.imm_data) << std::dec
    << " vendor_err=" << wc.vendor_err;
  return s.str();
}

// ---- counters -----------------------------------------------------------------------

uint64_t Counters::operator[](const std::string& name) const {
  auto it = values.find(name);
  return it == values.end() ? 0 : it->second;
}

std::string Growth::str() const {
  std::string s;
  for (const auto& [name, v] : after.values)
    if (v != before[name]) s += " " + name + "=+" + std::to_string(v - before[name]);
  return s;
}

std::string Growth::str(const std::vector<std::string>& names) const {
  std::string s;
  for (const auto& n : names) s += " " + n + "=+" + std::to_string((*this)[n]);
  return s;
}

Counters read_counters(const std::string& addr, int pid) {
  Counters c;
  engine::DeviceStats st;
  if (!engine::read_device_stats(addr, st, pid)) {
    ADD_FAILURE() << "no published counters for " << addr << " pid " << pid;
    return c;
  }
  for (const auto& v : st.counters) c.values[v.name] = v.value;
  c.valid = true;
  return c;
}

uint64_t wait_counter_growth(const std::string& addr, int pid,
                             const std::vector<std::string>& names, const Counters& base,
                             uint64_t delta, milliseconds timeout) {
  const auto end = Clock::now() + timeout;
  uint64_t grown = 0;
  for (;;) {
    engine::DeviceStats st;
    if (engine::read_device_stats(addr, st, pid)) {
      grown = 0;
      for (const auto& n : names) grown += st.get(n) - base[n];
      if (grown >= delta) return grown;
    }
    if (Clock::now() >= end) return grown;
    std::this_thread::sleep_for(2ms);
  }
}

// ---- multi-process runner ------------------------------------------------------------

namespace {

// In a forked role, a fatal failure ends the process at once (the default printer, which
// runs first, has already printed it): the role's remaining steps would only wait on
// peers that are waiting on it.
class ExitOnFatalFailure : public ::testing::EmptyTestEventListener {
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.fatally_failed()) {
      fflush(stdout);
      fflush(stderr);
      _exit(1);
    }
  }
};

bool write_all(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    const ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    b += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Reads exactly n bytes; false on EOF, error or timeout.
bool read_all(int fd, void* p, size_t n, milliseconds timeout) {
  auto* b = static_cast<uint8_t*>(p);
  const auto end = Clock::now() + timeout;
  while (n > 0) {
    const auto left = std::chrono::duration_cast<milliseconds>(end - Clock::now()).count();
    if (left <= 0) return false;
    pollfd pfd{fd, POLLIN, 0};
    const int pr = poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (pr < 0 && errno == EINTR) continue;
    if (pr < 0) return false;
    if (pr == 0) continue;
    const ssize_t r = recv(fd, b, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    b += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return std::string("killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  return "status " + std::to_string(status);
}

}  // namespace

int Role::getpid_() {
  return static_cast<int>(::getpid());
}

Link& Role::link(int peer) {
  for (auto& l : links_)
    if (l.peer == peer) return l;
  fail_fatal("role " + std::to_string(index_) + " has no link to role " + std::to_string(peer));
  std::abort();  // not reached in a forked role
}

Link& Role::link() {
  if (links_.size() != 1) {
    fail_fatal("role " + std::to_string(index_) + " has " + std::to_string(links_.size()) +
               " links, not one");
    std::abort();
  }
  return links_[0];
}

void Role::barrier() {
  const char b = 'B';
  char g = 0;
  if (!write_all(ctl_fd_, &b, 1) || !read_all(ctl_fd_, &g, 1, std::chrono::hours(1)) || g != 'G') {
    // The supervisor is gone: nothing sensible is left to do.
    fflush(stdout);
    _exit(3);
  }
}

void Role::send_bytes(int peer, const void* p, size_t n) {
  auto it = peer_fd_.find(peer);
  if (it == peer_fd_.end() || !write_all(it->second, p, n))
    fail_fatal("cannot send to role " + std::to_string(peer));
}

bool Role::recv_bytes(int peer, void* p, size_t n, milliseconds timeout) {
  auto it = peer_fd_.find(peer);
  if (it == peer_fd_.end()) return false;
  return read_all(it->second, p, n, timeout);
}

bool Role::wait_peer_exit(int peer, milliseconds timeout) {
  auto it = peer_fd_.find(peer);
  if (it == peer_fd_.end()) return false;
  const auto end = Clock::now() + timeout;
  char sink[256];
  while (Clock::now() < end) {
    pollfd pfd{it->second, POLLIN, 0};
    if (poll(&pfd, 1, 20) <= 0) continue;
    const ssize_t r = recv(it->second, sink, sizeof sink, 0);
    if (r == 0) return true;
    if (r < 0 && errno != EINTR && errno != EAGAIN) return true;
  }
  return false;
}

void Role::die() {
  fflush(stdout);
  fflush(stderr);
  raise(SIGKILL);
  _exit(9);
}

struct RoleProcess {
  [[noreturn]] static void main(const Spec& spec, int index, int ctl_fd,
                                const std::map<int, int>& peer_fds) {
    signal(SIGPIPE, SIG_IGN);
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test process
    ::testing::UnitTest::GetInstance()->listeners().Append(new ExitOnFatalFailure);
    const RoleSpec& rs = spec.roles[index];
    // Each role picks its own free address; emulation only where a test asks for it.
    unsetenv("SOFTRDMA_ADDR");
    unsetenv("SOFTRDMA_NETEM");
    for (const auto& [k, v] : rs.env) setenv(k.c_str(), v.c_str(), 1);
    {
      SCOPED_TRACE("role " + std::to_string(index) + " (pid " + std::to_string(getpid()) + ")");
      Role r;
      r.index_ = index;
      r.num_roles_ = static_cast<int>(spec.roles.size());
      r.conn_ = rs.conn.value_or(spec.conn);
      r.ctl_fd_ = ctl_fd;
      r.peer_fd_ = peer_fds;
      setup(spec, r);
      {
        SCOPED_TRACE("device " + r.dev_.addr);
        if (rs.fn) rs.fn(r);
      }
      r.barrier();  // nobody tears down while a peer may still be using its QP
      for (auto& l : r.links_) destroy_endpoint(l.ep);
      if (r.mr_) {
        EXPECT_EQ(0, ibv_dereg_mr(r.mr_));
      }
      r.mr_ = nullptr;
      if (r.dev_.ctx) close_device(r.dev_);
    }
    fflush(stdout);
    fflush(stderr);
    _exit(::testing::Test::HasFailure() ? 1 : 0);
  }

  static void setup(const Spec& spec, Role& r) {
    const RoleSpec& rs = spec.roles[r.index_];
    if (rs.open_device) {
      if (!open_device(r.dev_)) fail_fatal("cannot open " + std::string(kDeviceName));
      r.buf_ = Buffer(std::max<size_t>(rs.buf_size, 4096));
      r.mr_ = ibv_reg_mr(r.dev_.pd, r.buf_.data(), r.buf_.size(), rs.mr_access);
      if (!r.mr_) fail_fatal(std::string("ibv_reg_mr: ") + strerror(errno));
    }

    for (const auto& [a, b] : spec.links) {
      if (a != r.index_ && b != r.index_) continue;
      if (!rs.open_device || !spec.roles[a == r.index_ ? b : a].open_device)
        fail_fatal("a link to or from a role without a device");
      Link l;
      l.peer = a == r.index_ ? b : a;
      if (!create_endpoint(r.dev_, r.conn_, l.ep)) fail_fatal("cannot create a QP");
      r.links_.push_back(l);
    }
    // Every role tells every other role about itself, then reads what they sent.
    for (int j = 0; j < r.num_roles_; ++j) {
      if (j == r.index_) continue;
      PeerInfo mine;
      mine.gid = r.dev_.gid;
      mine.ipv4 = r.dev_.ipv4;
      mine.addr = r.buf_.addr();
      mine.size = r.buf_.size();
      mine.rkey = r.mr_ ? r.mr_->rkey : 0;
      mine.pid = getpid();
      for (auto& l : r.links_) {
        if (l.peer == j) {
          mine.qpn = l.ep.qpn;
          mine.psn = l.ep.psn;
        }
      }
      r.send_bytes(j, &mine, sizeof mine);
    }
    for (int j = 0; j < r.num_roles_; ++j) {
      if (j == r.index_) continue;
      PeerInfo theirs;
      if (!r.recv_bytes(j, &theirs, sizeof theirs, 60s))
        fail_fatal("no setup info from role " + std::to_string(j));
      r.peers_[j] = theirs;
    }
    for (auto& l : r.links_) {
      l.remote = r.peers_[l.peer];
      if (!connect_endpoint(l.ep, r.conn_, l.remote.gid, l.remote.qpn, l.remote.psn))
        fail_fatal("cannot connect to role " + std::to_string(l.peer));
    }
    r.barrier();  // every QP is in RTS before any role sends
  }
};

void run_roles(const Spec& spec) {
  const int n = static_cast<int>(spec.roles.size());
  ASSERT_GT(n, 0);
  for (const auto& [a, b] : spec.links) {
    ASSERT_TRUE(a >= 0 && a < n && b >= 0 && b < n && a != b) << "bad link " << a << "-" << b;
  }
  std::vector<std::array<int, 2>> ctl(n);
  std::map<std::pair<int, int>, std::array<int, 2>> pair;  // i < j: [0] is i's end
  std::vector<int> all_fds;
  auto close_all = [&] {
    for (int fd : all_fds) close(fd);
  };
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_STREAM, 0, ctl[i].data())) << strerror(errno);
    all_fds.insert(all_fds.end(), {ctl[i][0], ctl[i][1]});
  }
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) {
      std::array<int, 2> sp{};
      ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_STREAM, 0, sp.data())) << strerror(errno);
      pair[{i, j}] = sp;
      all_fds.insert(all_fds.end(), {sp[0], sp[1]});
    }
  }

  fflush(stdout);
  fflush(stderr);
  std::vector<pid_t> pids(n, -1);
  for (int i = 0; i < n; ++i) {
    const pid_t pid = fork();
    if (pid < 0) {
      ADD_FAILURE() << "fork: " << strerror(errno);
      for (int k = 0; k < i; ++k) kill(pids[k], SIGKILL);
      for (int k = 0; k < i; ++k) waitpid(pids[k], nullptr, 0);
      close_all();
      return;
    }
    if (pid == 0) {
      std::map<int, int> mine;
      std::vector<int> keep{ctl[i][1]};
      for (const auto& [ij, sp] : pair) {
        if (ij.first == i) mine[ij.second] = sp[0];
        if (ij.second == i) mine[ij.first] = sp[1];
      }
      for (const auto& [peer, fd] : mine) keep.push_back(fd);
      for (int fd : all_fds)
        if (std::find(keep.begin(), keep.end(), fd) == keep.end()) close(fd);
      RoleProcess::main(spec, i, ctl[i][1], mine);
    }
    pids[i] = pid;
  }
  // The parent keeps only its ends of the control sockets.
  for (int fd : all_fds) {
    bool parent_end = false;
    for (int i = 0; i < n; ++i) parent_end |= fd == ctl[i][0];
    if (!parent_end) close(fd);
  }

  struct Child {
    int fd;
    bool connected = true;
    bool at_barrier = false;
    bool exited = false;
    bool stopped = false;  // killed by the supervisor after another role failed
    int status = 0;
  };
  auto role_ok = [&](int i, int st) {
    return (WIFEXITED(st) && WEXITSTATUS(st) == 0) ||
           (spec.roles[i].may_be_killed && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  };
  std::vector<Child> kids;
  for (int i = 0; i < n; ++i) kids.push_back(Child{ctl[i][0]});
  const auto deadline = Clock::now() + spec.deadline;
  // Once a role has failed, its peers are usually stuck waiting for it (a poll_one bound,
  // a barrier): give them a moment to report what they saw, then stop them.
  std::optional<Clock::time_point> stop_at;
  bool timed_out = false;
  int running = n;
  while (running > 0) {
    std::vector<pollfd> pfds;
    std::vector<int> who;
    for (int i = 0; i < n; ++i) {
      if (kids[i].connected) {
        pfds.push_back(pollfd{kids[i].fd, POLLIN, 0});
        who.push_back(i);
      }
    }
    poll(pfds.data(), pfds.size(), 20);
    for (size_t k = 0; k < pfds.size(); ++k) {
      if (!(pfds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Child& c = kids[who[k]];
      char buf[64];
      const ssize_t r = recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
      if (r > 0) {
        for (ssize_t q = 0; q < r; ++q)
          if (buf[q] == 'B') c.at_barrier = true;
      } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
        c.connected = false;
        c.at_barrier = false;
        close(c.fd);
      }
    }
    // Barrier: released when every child still connected has arrived.
    bool all = true, any = false;
    for (auto& c : kids) {
      if (!c.connected) continue;
      any = true;
      all &= c.at_barrier;
    }
    if (any && all) {
      for (auto& c : kids) {
        if (!c.connected) continue;
        c.at_barrier = false;
        const char g = 'G';
        if (!write_all(c.fd, &g, 1)) {
          c.connected = false;
          close(c.fd);
        }
      }
    }
    for (int i = 0; i < n; ++i) {
      if (kids[i].exited) continue;
      if (waitpid(pids[i], &kids[i].status, WNOHANG) == pids[i]) {
        kids[i].exited = true;
        --running;
        if (!role_ok(i, kids[i].status) && !stop_at) stop_at = Clock::now() + 1s;
      }
    }
    if (running > 0 && stop_at && Clock::now() > *stop_at) {
      for (int i = 0; i < n; ++i) {
        if (kids[i].exited) continue;
        kill(pids[i], SIGKILL);
        waitpid(pids[i], &kids[i].status, 0);
        kids[i].exited = kids[i].stopped = true;
        --running;
      }
    }
    if (running > 0 && Clock::now() > deadline) {
      timed_out = true;
      for (int i = 0; i < n; ++i) {
        if (kids[i].exited) continue;
        ADD_FAILURE() << "role " << i << " (pid " << pids[i] << ") still running after "
                      << spec.deadline.count() << " s"
                      << (kids[i].at_barrier ? " (waiting at a barrier for the others)" : "")
                      << ": killed";
        kill(pids[i], SIGKILL);
        waitpid(pids[i], &kids[i].status, 0);
        kids[i].exited = true;
        --running;
      }
    }
  }
  for (auto& c : kids)
    if (c.connected) close(c.fd);
  if (timed_out) return;
  for (int i = 0; i < n; ++i) {
    const int st = kids[i].status;
    if (kids[i].stopped) {
      printf("[ harness  ] role %d (pid %d) stopped after another role failed\n", i, pids[i]);
      continue;
    }
    if (role_ok(i, st)) continue;
    ADD_FAILURE() << "role " << i << " (pid " << pids[i] << ") " << describe_status(st)
                  << (WIFEXITED(st) && WEXITSTATUS(st) == 1 ? " (its failures are printed above)"
                                                            : "");
  }
}

void run_pair(const ConnOptions& conn, std::function<void(Role&)> role0,
              std::function<void(Role&)> role1, size_t buf_size) {
  Spec s;
  s.conn = conn;
  s.roles.resize(2);
  s.roles[0].fn = std::move(role0);
  s.roles[1].fn = std::move(role1);
  s.roles[0].buf_size = s.roles[1].buf_size = buf_size;
  s.links = {{0, 1}};
  run_roles(s);
}

void run_in_one_process(std::function<void(Role&)> fn, seconds deadline) {
  Spec s;
  s.roles.resize(1);
  s.roles[0].fn = std::move(fn);
  s.deadline = deadline;
  run_roles(s);
}

void write_stream(Role& r, size_t message, size_t count) {
  Link& l = r.link();
  for (size_t m = 0; m < count; ++m)
    ASSERT_EQ(SendWr(IBV_WR_RDMA_WRITE, m)
                  .add_sge(r.buf() + m * message, static_cast<uint32_t>(message), r.lkey())
                  .remote(l.remote.addr + m * message, l.remote.rkey)
                  .post(l.ep.qp),
              0);
  for (size_t m = 0; m < count; ++m) poll_success(l.ep.scq, m, IBV_WC_RDMA_WRITE, 60s);
}

bool have_tool(const char* tool) {
  return std::system((std::string("command -v ") + tool + " >/dev/null 2>&1").c_str()) == 0;
}

std::string command_output(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

}  // namespace softrdma::verbs_test
