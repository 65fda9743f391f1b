// Single-process verbs API tests: device discovery and queries, argument validation with
// the errno values the kernel verbs stack returns (ib_modify_qp_is_ok, ib_uverbs, rxe),
// completion channels and solicited events, flush on ERR, query_qp, and traffic between two
// QPs of one device.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "base/ipv4_text.h"
#include "verbs/tests/harness.h"

namespace softrdma::verbs_test {
namespace {

constexpr int kAttrInit = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
constexpr int kAttrRtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                         IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
constexpr int kAttrRts = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                         IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;

class Api : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(open_device(d)); }
  void TearDown() override { close_device(d); }

  ibv_qp_attr init_attr() const {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = kPort;
    a.qp_access_flags = kAllAccess;
    return a;
  }
  ibv_qp_attr rtr_attr(uint32_t dest_qpn) const {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = dest_qpn;
    a.rq_psn = 1;
    a.max_dest_rd_atomic = 4;
    a.min_rnr_timer = 1;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = d.gid;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = kPort;
    return a;
  }
  ibv_qp_attr rts_attr() const {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = 1;
    a.max_rd_atomic = 4;
    return a;
  }

  Device d;
};

// ---- discovery and queries ----------------------------------------------------------------

TEST(Discovery, DeviceListHasSrdma0) {
  int n = -1;
  ibv_device** list = ibv_get_device_list(&n);
  ASSERT_NE(nullptr, list) << strerror(errno);
  ASSERT_GE(n, 1);
  EXPECT_EQ(nullptr, list[n]) << "the list is NULL-terminated";
  bool found = false;
  for (int i = 0; i < n; ++i) {
    if (strcmp(ibv_get_device_name(list[i]), kDeviceName) != 0) continue;
    found = true;
    EXPECT_EQ(IBV_NODE_CA, list[i]->node_type);
    EXPECT_EQ(IBV_TRANSPORT_IB, list[i]->transport_type) << "RoCE reports transport IB";
  }
  EXPECT_TRUE(found);
  ibv_free_device_list(list);
}

TEST_F(Api, QueryDevice) {
  const ibv_device_attr& a = d.attr;
  EXPECT_EQ(1, a.phys_port_cnt);
  EXPECT_GE(a.max_qp, 64);
  EXPECT_GE(a.max_qp_wr, 1024);
  EXPECT_GE(a.max_sge, 8);
  EXPECT_GE(a.max_cq, 64);
  EXPECT_GE(a.max_cqe, 2048);
  EXPECT_GE(a.max_pd, 1);
  EXPECT_GE(a.max_mr, 1);
  EXPECT_GE(a.max_mr_size, (64ull << 20) + 3);
  EXPECT_GE(a.max_qp_rd_atom, 16);
  EXPECT_GE(a.max_qp_init_rd_atom, 16);
  EXPECT_NE(IBV_ATOMIC_NONE, a.atomic_cap);
}

TEST_F(Api, QueryPort) {
  const ibv_port_attr& p = d.port;
  EXPECT_EQ(IBV_PORT_ACTIVE, p.state);
  EXPECT_EQ(IBV_LINK_LAYER_ETHERNET, p.link_layer);
  EXPECT_EQ(IBV_MTU_4096, p.active_mtu) << "loopback MTU 65536 fits 4096-byte RoCE packets";
  EXPECT_GE(p.max_mtu, IBV_MTU_4096);
  EXPECT_GE(p.gid_tbl_len, 1);
  EXPECT_GE(p.pkey_tbl_len, 1u);
  EXPECT_GE(p.max_msg_sz, (64u << 20) + 3);
  ibv_port_attr other{};
  EXPECT_NE(0, ibv_query_port(d.ctx, 2, &other)) << "there is only port 1";
}

TEST_F(Api, GidIsIpv4MappedLoopback) {
  EXPECT_EQ(127u, d.ipv4 >> 24) << d.addr;
  ibv_gid_entry e{};
  ASSERT_EQ(0, ibv_query_gid_ex(d.ctx, kPort, 0, &e, 0));
  EXPECT_EQ(IBV_GID_TYPE_ROCE_V2, e.gid_type);
  EXPECT_EQ(0u, e.gid_index);
  EXPECT_EQ(uint32_t(kPort), e.port_num);
  EXPECT_EQ(0, memcmp(e.gid.raw, d.gid.raw, 16));
  ibv_gid g{};
  EXPECT_NE(0, ibv_query_gid(d.ctx, kPort, d.port.gid_tbl_len, &g)) << "index past the table";
}

// The GID table has more entries than GIDs, as a RoCE port's (rxe: 1024): index 0 holds
// ::ffff:<addr>, the others are empty and read as the kernel and rdma-core 44 give them —
// ibv_query_gid_ex ENODATA (pyverbs test_query_gid_ex_bad_flow), ibv_query_gid the zero GID
// and success, ibv_query_gid_type 0 (IB / RoCE v1) and success; EINVAL past the table.
TEST_F(Api, EmptyGidTableEntries) {
  ASSERT_GT(d.port.gid_tbl_len, 1);
  const uint32_t last = uint32_t(d.port.gid_tbl_len) - 1;
  ibv_gid_entry e{};
  for (uint32_t i : {1u, last}) {
    EXPECT_EQ(ENODATA, ibv_query_gid_ex(d.ctx, kPort, i, &e, 0)) << i;
    ibv_gid g;
    std::memset(&g, 0xab, sizeof g);
    ASSERT_EQ(0, ibv_query_gid(d.ctx, kPort, int(i), &g)) << i;
    EXPECT_TRUE(AllBytesAre(g.raw, 16, 0)) << i;
  }
  EXPECT_EQ(EINVAL, ibv_query_gid_ex(d.ctx, kPort, last + 1, &e, 0)) << "past the table";
  // ibv_query_gid_table returns the populated entries only, however long the table.
  std::vector<ibv_gid_entry> table(d.port.gid_tbl_len);
  ASSERT_EQ(1, ibv_query_gid_table(d.ctx, table.data(), table.size(), 0));
  EXPECT_EQ(0u, table[0].gid_index);
}

// pyverbs test_device.py: test_query_gid_table_bad_flow wants -EINVAL for a buffer too
// small (the kernel's rdma_query_gid_table), test_phys_port_cnt_ex phys_port_cnt_ex equal to
// phys_port_cnt below 256 ports.
TEST_F(Api, GidTableAndExtendedDeviceQueryErrnos) {
  ibv_gid_entry table[2]{};
  EXPECT_EQ(-EINVAL, ibv_query_gid_table(d.ctx, table, 0, 0)) << "no room for the one entry";
  EXPECT_EQ(-EINVAL, ibv_query_gid_table(d.ctx, table, 2, 1)) << "unknown flags";
  ASSERT_EQ(1, ibv_query_gid_table(d.ctx, table, 2, 0));
  EXPECT_EQ(0, memcmp(table[0].gid.raw, d.gid.raw, 16));
  ibv_gid_entry e{};
  EXPECT_EQ(EINVAL, ibv_query_gid_ex(d.ctx, kPort, 0, &e, 1)) << "unknown flags";
  EXPECT_EQ(EINVAL, ibv_query_gid_ex(d.ctx, kPort + 1, 0, &e, 0)) << "no such port";

  ibv_device_attr_ex ex{};
  ASSERT_EQ(0, ibv_query_device_ex(d.ctx, nullptr, &ex));
  EXPECT_EQ(1u, ex.orig_attr.phys_port_cnt);
  EXPECT_EQ(uint32_t{ex.orig_attr.phys_port_cnt}, ex.phys_port_cnt_ex);
  // RDMA ATOMIC WRITE: bit 40 of the 64-bit capabilities (the kernel's
  // IB_UVERBS_DEVICE_ATOMIC_WRITE, as rxe sets it); the low 32 bits are device_cap_flags.
  EXPECT_NE(0u, ex.device_cap_flags_ex & (1ull << 40));
  EXPECT_EQ(uint64_t{ex.orig_attr.device_cap_flags}, ex.device_cap_flags_ex & 0xffffffffull);
  ibv_query_device_ex_input in{};
  in.comp_mask = 1;
  EXPECT_EQ(EINVAL, ibv_query_device_ex(d.ctx, &in, &ex)) << "unknown input comp_mask";
}

TEST_F(Api, QueryPkey) {
  __be16 pkey = 0;
  ASSERT_EQ(0, ibv_query_pkey(d.ctx, kPort, 0, &pkey));
  EXPECT_EQ(htons(0xffff), pkey);
}

// Binds a UDP socket to the first 127.0.2.x:4791 that is free; -1 if none.
int bind_free_127_0_2(uint32_t* ip) {
  for (uint32_t x = 1; x < 255; ++x) {
    const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(4791);
    *ip = (127u << 24) | (2u << 8) | x;
    a.sin_addr.s_addr = htonl(*ip);
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
    close(fd);
  }
  return -1;
}

// Sets an environment variable for one scope.
struct ScopedEnv {
  ScopedEnv(const char* k, const std::string& v) : key(k) { setenv(k, v.c_str(), 1); }
  ~ScopedEnv() { unsetenv(key); }
  const char* key;
};

// SOFTRDMA_ADDR picks the address (read at ibv_open_device); a taken address fails the open.
TEST(Discovery, AddressFromEnvironment) {
  uint32_t ip = 0;
  const int holder = bind_free_127_0_2(&ip);
  ASSERT_GE(holder, 0);
  ScopedEnv env("SOFTRDMA_ADDR", base::ipv4_text(ip));
  {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    ibv_context* ctx = nullptr;
    for (int i = 0; list && i < n; ++i)
      if (strcmp(ibv_get_device_name(list[i]), kDeviceName) == 0) ctx = ibv_open_device(list[i]);
    EXPECT_EQ(nullptr, ctx) << "opened " << base::ipv4_text(ip)
                            << " although its port 4791 is taken";
    if (ctx) ibv_close_device(ctx);
    if (list) ibv_free_device_list(list);
  }
  close(holder);
  Device d;
  ASSERT_TRUE(open_device(d));
  EXPECT_EQ(ip, d.ipv4) << d.addr;
  EXPECT_EQ(0, memcmp(gid_from_ipv4(ip).raw, d.gid.raw, 16));
  close_device(d);
}

// A malformed packet-path setting refuses to open the device (with a log line naming the
// variable) rather than silently taking another path.
TEST(Discovery, MalformedPathSettingsRefuseToOpen) {
  for (const auto& [var, value] : std::vector<std::pair<const char*, const char*>>{
           {"SOFTRDMA_TRANSPORT", "tcp"},
           {"SOFTRDMA_GSO", "maybe"},
           {"SOFTRDMA_SPIN_US", "-5"},
           {"SOFTRDMA_WAN", "delay=10ms,loss=150%"},
           {"SOFTRDMA_WAN", "site a 127.0.0.1\nlink a b delay=1ms"}}) {
    ScopedEnv env(var, value);
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    ibv_context* ctx = nullptr;
    for (int i = 0; list && i < n; ++i)
      if (strcmp(ibv_get_device_name(list[i]), kDeviceName) == 0) ctx = ibv_open_device(list[i]);
    EXPECT_EQ(nullptr, ctx) << var << "=" << value << " was accepted";
    if (ctx) ibv_close_device(ctx);
    if (list) ibv_free_device_list(list);
  }
  for (const char* path : {"udp", "shm", "auto"}) {
    ScopedEnv env("SOFTRDMA_TRANSPORT", path);
    Device d;
    ASSERT_TRUE(open_device(d)) << path;
    close_device(d);
  }
}

// ---- memory regions, PDs, CQs --------------------------------------------------------

TEST_F(Api, RegMrRemoteRightsNeedLocalWrite) {
  Buffer b(8192);
  errno = 0;
  EXPECT_EQ(nullptr, ibv_reg_mr(d.pd, b.data(), b.size(), int{IBV_ACCESS_REMOTE_WRITE}));
  EXPECT_EQ(EINVAL, errno);
  errno = 0;
  EXPECT_EQ(nullptr, ibv_reg_mr(d.pd, b.data(), b.size(), int{IBV_ACCESS_REMOTE_ATOMIC}));
  EXPECT_EQ(EINVAL, errno);
  ibv_mr* mr = ibv_reg_mr(d.pd, b.data(), b.size(), int{IBV_ACCESS_REMOTE_READ});
  ASSERT_NE(nullptr, mr) << "REMOTE_READ alone is allowed: " << strerror(errno);
  EXPECT_EQ(b.data(), mr->addr);
  EXPECT_EQ(b.size(), mr->length);
  EXPECT_EQ(d.pd, mr->pd);
  EXPECT_EQ(d.ctx, mr->context);
  ibv_mr* mr2 = ibv_reg_mr(d.pd, b.data(), b.size(), kAllAccess);
  ASSERT_NE(nullptr, mr2);
  EXPECT_NE(mr->rkey, mr2->rkey) << "two registrations, two keys";
  EXPECT_EQ(0, ibv_dereg_mr(mr2));
  EXPECT_EQ(0, ibv_dereg_mr(mr));
}

// Real verbs pin the pages (ib_umem_get) and fail with EFAULT on a range that is not
// mapped; softrdma checks the mapping at registration.
TEST_F(Api, RegMrOfUnmappedRangeIsEfault) {
  errno = 0;
  EXPECT_EQ(nullptr, ibv_reg_mr(d.pd, reinterpret_cast<void*>(0x10), 4096, kAllAccess));
  EXPECT_EQ(EFAULT, errno);
  const long page = sysconf(_SC_PAGESIZE);
  // Three pages with a hole in the middle: the range is refused, each mapped part is not.
  auto* p = static_cast<char*>(
      mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(MAP_FAILED, p);
  ASSERT_EQ(0, munmap(p + page, page));
  errno = 0;
  EXPECT_EQ(nullptr, ibv_reg_mr(d.pd, p + 100, 2 * page, kAllAccess));
  EXPECT_EQ(EFAULT, errno);
  ibv_mr* head = ibv_reg_mr(d.pd, p + 100, page - 100, kAllAccess);
  ASSERT_NE(nullptr, head) << strerror(errno);
  ibv_mr* tail = ibv_reg_mr(d.pd, p + 2 * page, page, kAllAccess);
  ASSERT_NE(nullptr, tail) << strerror(errno);
  EXPECT_EQ(0, ibv_dereg_mr(head));
  EXPECT_EQ(0, ibv_dereg_mr(tail));
  munmap(p, page);
  munmap(p + 2 * page, page);
  errno = 0;
  EXPECT_EQ(nullptr,
            ibv_reg_mr(d.pd, reinterpret_cast<void*>(~uintptr_t{0} - 10), 4096, kAllAccess));
  EXPECT_EQ(EINVAL, errno) << "a range that wraps the address space";
}

TEST_F(Api, DeallocPdInUseIsEbusy) {
  ibv_pd* pd = ibv_alloc_pd(d.ctx);
  ASSERT_NE(nullptr, pd);
  Buffer b(4096);
  ibv_mr* mr = ibv_reg_mr(pd, b.data(), b.size(), int{IBV_ACCESS_LOCAL_WRITE});
  ASSERT_NE(nullptr, mr);
  EXPECT_EQ(EBUSY, ibv_dealloc_pd(pd));
  EXPECT_EQ(0, ibv_dereg_mr(mr));
  EXPECT_EQ(0, ibv_dealloc_pd(pd));
}

TEST_F(Api, CqLimits) {
  errno = 0;
  EXPECT_EQ(nullptr, ibv_create_cq(d.ctx, d.attr.max_cqe + 1, nullptr, nullptr, 0));
  EXPECT_EQ(EINVAL, errno);
  ibv_cq* cq = ibv_create_cq(d.ctx, 100, nullptr, nullptr, 0);
  ASSERT_NE(nullptr, cq);
  EXPECT_GE(cq->cqe, 100);
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap = {16, 16, 1, 1, 0};
  ibv_qp* qp = ibv_create_qp(d.pd, &ia);
  ASSERT_NE(nullptr, qp);
  EXPECT_EQ(EBUSY, ibv_destroy_cq(cq)) << "the CQ is in use by a QP";
  EXPECT_EQ(0, ibv_destroy_qp(qp));
  EXPECT_EQ(0, ibv_destroy_cq(cq));
}

// ibv_modify_qp reads only what its mask names: ibv_xsrq_pingpong leaves cur_qp_state (an enum)
// as the stack had it, and reading it regardless is undefined (the asan preset's UBSan stops
// on "load of value …, which is not a valid value for type 'ibv_qp_state'").
TEST_F(Api, ModifyQpReadsOnlyTheFieldsItsMaskNames) {
  Endpoint e;
  ASSERT_TRUE(create_endpoint(d, ConnOptions{}, e));
  ibv_qp_attr a;
  std::memset(&a, 0xA5, sizeof a);  // every field the mask leaves out holds junk
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = kPort;
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE;
  EXPECT_EQ(0, ibv_modify_qp(e.qp, &a,
                             IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
  EXPECT_EQ(IBV_QPS_INIT, qp_state(e.qp));
  destroy_endpoint(e);
}

// Objects beyond the counts ibv_query_device reports are refused with ENOMEM, as the
// kernel verbs stack does (rxe_pool: "pool full"), and a freed slot can be taken again.
TEST_F(Api, ObjectCountsStopAtQueryDeviceLimits) {
  // The fixture already holds one PD.
  std::vector<ibv_pd*> pds{d.pd};
  for (int i = 1; i < d.attr.max_pd; ++i) {
    pds.push_back(ibv_alloc_pd(d.ctx));
    ASSERT_NE(nullptr, pds.back()) << "PD " << i << " of max_pd " << d.attr.max_pd;
  }
  errno = 0;
  EXPECT_EQ(nullptr, ibv_alloc_pd(d.ctx));
  EXPECT_EQ(ENOMEM, errno);
  EXPECT_EQ(0, ibv_dealloc_pd(pds.back()));
  pds.back() = ibv_alloc_pd(d.ctx);
  EXPECT_NE(nullptr, pds.back()) << "a freed PD slot is reusable";
  for (size_t i = 1; i < pds.size(); ++i) EXPECT_EQ(0, ibv_dealloc_pd(pds[i]));

  std::vector<ibv_cq*> cqs;
  for (int i = 0; i < d.attr.max_cq; ++i) {
    cqs.push_back(ibv_create_cq(d.ctx, 1, nullptr, nullptr, 0));
    ASSERT_NE(nullptr, cqs.back()) << "CQ " << i << " of max_cq " << d.attr.max_cq;
  }
  errno = 0;
  EXPECT_EQ(nullptr, ibv_create_cq(d.ctx, 1, nullptr, nullptr, 0));
  EXPECT_EQ(ENOMEM, errno);

  // QPs share one CQ: keep one, free the rest.
  for (size_t i = 1; i < cqs.size(); ++i) EXPECT_EQ(0, ibv_destroy_cq(cqs[i]));
  std::vector<ibv_qp*> qps;
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cqs[0];
  ia.qp_type = IBV_QPT_RC;
  ia.cap = {1, 1, 1, 1, 0};
  for (int i = 0; i < d.attr.max_qp; ++i) {
    qps.push_back(ibv_create_qp(d.pd, &ia));
    ASSERT_NE(nullptr, qps.back()) << "QP " << i << " of max_qp " << d.attr.max_qp;
  }
  errno = 0;
  EXPECT_EQ(nullptr, ibv_create_qp(d.pd, &ia));
  EXPECT_EQ(ENOMEM, errno);
  for (ibv_qp* qp : qps) EXPECT_EQ(0, ibv_destroy_qp(qp));
  EXPECT_EQ(0, ibv_destroy_cq(cqs[0]));

  Buffer b(64);
  std::vector<ibv_mr*> mrs;
  mrs.reserve(static_cast<size_t>(d.attr.max_mr));
  for (int i = 0; i < d.attr.max_mr; ++i) {
    mrs.push_back(ibv_reg_mr(d.pd, b.data(), b.size(), int{IBV_ACCESS_LOCAL_WRITE}));
    ASSERT_NE(nullptr, mrs.back()) << "MR " << i << " of max_mr " << d.attr.max_mr;
  }
  errno = 0;
  EXPECT_EQ(nullptr, ibv_reg_mr(d.pd, b.data(), b.size(), int{IBV_ACCESS_LOCAL_WRITE}));
  EXPECT_EQ(ENOMEM, errno);
  for (ibv_mr* mr : mrs) EXPECT_EQ(0, ibv_dereg_mr(mr));
}

// ---- QP creation ----------------------------------------------------------------------

TEST_F(Api, CreateRcQp) {
  Endpoint e;
  ConnOptions o;
  o.max_inline_data = 64;
  ASSERT_TRUE(create_endpoint(d, o, e));
  EXPECT_NE(0u, e.qpn);
  EXPECT_EQ(IBV_QPT_RC, e.qp->qp_type);
  EXPECT_EQ(d.pd, e.qp->pd);
  EXPECT_EQ(IBV_QPS_RESET, qp_state(e.qp));
  Endpoint e2;
  ASSERT_TRUE(create_endpoint(d, o, e2));
  EXPECT_NE(e.qpn, e2.qpn);
  destroy_endpoint(e2);
  destroy_endpoint(e);
}

// RC, UC, UD and the XRC types are implemented; raw packet and driver QPs are not: as rxe
// (rxe_qp_chk_init), EOPNOTSUPP.
TEST_F(Api, RawPacketAndDriverQpsAreNotSupported) {
  ibv_cq* cq = ibv_create_cq(d.ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(nullptr, cq);
  for (ibv_qp_type t : {IBV_QPT_RAW_PACKET, IBV_QPT_DRIVER}) {
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = t;
    ia.cap = {16, 16, 1, 1, 0};
    errno = 0;
    ibv_qp* qp = ibv_create_qp(d.pd, &ia);
    EXPECT_EQ(nullptr, qp) << "QP type " << t;
    EXPECT_EQ(EOPNOTSUPP, errno) << "QP type " << t;
    if (qp) ibv_destroy_qp(qp);
  }
  EXPECT_EQ(0, ibv_destroy_cq(cq));
}

TEST_F(Api, QpCapsBeyondDeviceLimitsAreEinval) {
  ibv_cq* cq = ibv_create_cq(d.ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(nullptr, cq);
  auto try_caps = [&](ibv_qp_cap cap, const char* what) {
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap = cap;
    errno = 0;
    ibv_qp* qp = ibv_create_qp(d.pd, &ia);
    EXPECT_EQ(nullptr, qp) << what;
    EXPECT_EQ(EINVAL, errno) << what;
    if (qp) ibv_destroy_qp(qp);
  };
  const auto wr = static_cast<uint32_t>(d.attr.max_qp_wr);
  const auto sge = static_cast<uint32_t>(d.attr.max_sge);
  try_caps({wr + 1, 16, 1, 1, 0}, "max_send_wr > max_qp_wr");
  try_caps({16, wr + 1, 1, 1, 0}, "max_recv_wr > max_qp_wr");
  try_caps({16, 16, sge + 1, 1, 0}, "max_send_sge > max_sge");
  try_caps({16, 16, 1, sge + 1, 0}, "max_recv_sge > max_sge");
  EXPECT_EQ(0, ibv_destroy_cq(cq));
}

// ---- modify_qp validation (ib_modify_qp_is_ok semantics: EINVAL) ---------------------

TEST_F(Api, InvalidTransitionsAreEinval) {
  Endpoint e, peer;
  ASSERT_TRUE(create_endpoint(d, ConnOptions{}, e));
  ASSERT_TRUE(create_endpoint(d, ConnOptions{}, peer));
  ibv_qp_attr a = rtr_attr(peer.qpn);
  EXPECT_EQ(EINVAL, ibv_modify_qp(e.qp, &a, kAttrRtr)) << "RESET->RTR";
  a = rts_attr();
  EXPECT_EQ(EINVAL, ibv_modify_qp(e.qp, &a, kAttrRts)) << "RESET->RTS";
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_SQD;
  EXPECT_EQ(EINVAL, ibv_modify_qp(e.qp, &a, IBV_QP_STATE)) << "RESET->SQD";
  EXPECT_EQ(IBV_QPS_RESET, qp_state(e.qp)) << "a failed modify changes nothing";

  a = init_attr();
  ASSERT_EQ(0, ibv_modify_qp(e.qp, &a, kAttrInit));
  a = rts_attr();
  EXPECT_EQ(EINVAL, ibv_modify_qp(e.qp, &a, kAttrRts)) << "INIT->RTS";
  EXPECT_EQ(IBV_QPS_INIT, qp_state(e.qp));
  a = rtr_attr(peer.qpn);
  ASSERT_EQ(0, ibv_modify_qp(e.qp, &a, kAttrRtr));
  a = init_attr();
  EXPECT_EQ(EINVAL, ibv_modify_qp(e.qp, &a, kAttrInit)) << "RTR->INIT";
  EXPECT_EQ(IBV_QPS_RTR, qp_state(e.qp));
  destroy_endpoint(peer);
  destroy_endpoint(e);
}

TEST_F(Api, MissingRequiredAttributesAreEinval) {
  Endpoint e, peer;
  ASSERT_TRUE(create_endpoint(d, ConnOptions{}, e));
  ASSERT_TRUE(create_endpoint(d, ConnOptions{}, peer));
  for (int drop : {IBV_QP_PKEY_INDEX, IBV_QP_PORT, IBV_QP_ACCESS_FLAGS}) {
    ibv_qp_attr a = init_attr();
    EXPECT_EQ(EINVAL, ibv_modify_qp(e.qp, &a, kAttrInit & ~drop))
        << "RESET->INIT without 0x" << std::hex << drop;
  }
  EXPECT_EQ(IBV_QPS_RESET, qp_state(e.qp));
  ibv_qp_attr a = init_attr();
  ASSERT_EQ(0, ibv_modify_qp(e.qp, &a, kAttrInit));
  for (int drop : {IBV_QP_AV, IBV_QP_PATH_MTU, IBV_QP_DEST_QPN, IBV_QP_RQ_PSN,
                   IBV_QP_MAX_DEST_RD_ATOMIC, IBV_QP_MIN_RNR_TIMER}) {
    a = rtr_attr(peer.qpn);
    EXPECT_EQ(EINVAL, ibv_modify_qp(e.qp, &a, kAttrRtr & ~drop))
        << "INIT->RTR without 0x" << std::hex << drop;
  }
  a = rtr_attr(peer.qpn);
  EXPECT_EQ(EINVAL, ibv_modify_qp(e.qp, &a, kAttrRtr | IBV_QP_SQ_PSN))
      << "INIT->RTR with an attribute not allowed in that transition";
  EXPECT_EQ(IBV_QPS_INIT, qp_state(e.qp));
  a = rtr_attr(peer.qpn);
  ASSERT_EQ(0, ibv_modify_qp(e.qp, &a, kAttrRtr));
  for (int drop : {IBV_QP_TIMEOUT, IBV_QP_RETRY_CNT, IBV_QP_RNR_RETRY, IBV_QP_SQ_PSN,
                   IBV_QP_MAX_QP_RD_ATOMIC}) {
    a = rts_attr();
    EXPECT_EQ(EINVAL, ibv_modify_qp(e.qp, &a, kAttrRts & ~drop))
        << "RTR->RTS without 0x" << std::hex << drop;
  }
  EXPECT_EQ(IBV_QPS_RTR, qp_state(e.qp));
  a = rts_attr();
  EXPECT_EQ(0, ibv_modify_qp(e.qp, &a, kAttrRts));
  EXPECT_EQ(IBV_QPS_RTS, qp_state(e.qp));
  destroy_endpoint(peer);
  destroy_endpoint(e);
}

TEST_F(Api, AttributeRangesAreEinval) {
  Endpoint e, peer;
  ASSERT_TRUE(create_endpoint(d, ConnOptions{}, e));
  ASSERT_TRUE(create_endpoint(d, ConnOptions{}, peer));
  ibv_qp_attr a = init_attr();
  a.port_num = 2;
  EXPECT_EQ(EINVAL, ibv_modify_qp(e.qp, &a, kAttrInit)) << "port 2";
  a = init_attr();
  a.pkey_index = static_cast<uint16_t>(d.port.pkey_tbl_len);
  EXPECT_EQ(EINVAL, ibv_modify_qp(e.qp, &a, kAttrInit)) << "pkey_index past the table";
  a = init_attr();
  ASSERT_EQ(0, ibv_modify_qp(e.qp, &a, kAttrInit));

  for (int mtu : {0, 6, 7}) {  // 0..7 is the range of ibv_mtu values in C++
    a = rtr_attr(peer.qpn);
    a.path_mtu = static_cast<ibv_mtu>(mtu);
    EXPECT_EQ(EINVAL, ibv_modify_qp(e.qp, &a, kAttrRtr)) << "path_mtu " << mtu;
  }
  a = rtr_attr(peer.qpn);
  a.max_dest_rd_atomic = static_cast<uint8_t>(std::min(255, d.attr.max_qp_rd_atom + 1));
  if (d.attr.max_qp_rd_atom < 255) {
    EXPECT_EQ(EINVAL, ibv_modify_qp(e.qp, &a, kAttrRtr)) << "max_dest_rd_atomic > max_qp_rd_atom";
  }
  a = rtr_attr(peer.qpn);
  a.ah_attr.grh.sgid_index = static_cast<uint8_t>(d.port.gid_tbl_len);
  EXPECT_EQ(EINVAL, ibv_modify_qp(e.qp, &a, kAttrRtr)) << "sgid_index past the GID table";
  a = rtr_attr(peer.qpn);
  a.ah_attr.port_num = 2;
  EXPECT_EQ(EINVAL, ibv_modify_qp(e.qp, &a, kAttrRtr)) << "AV on port 2";
  EXPECT_EQ(IBV_QPS_INIT, qp_state(e.qp));
  a = rtr_attr(peer.qpn);
  ASSERT_EQ(0, ibv_modify_qp(e.qp, &a, kAttrRtr));

  a = rts_attr();
  a.max_rd_atomic = static_cast<uint8_t>(std::min(255, d.attr.max_qp_init_rd_atom + 1));
  if (d.attr.max_qp_init_rd_atom < 255) {
    EXPECT_EQ(EINVAL, ibv_modify_qp(e.qp, &a, kAttrRts)) << "max_rd_atomic > max_qp_init_rd_atom";
  }
  EXPECT_EQ(IBV_QPS_RTR, qp_state(e.qp));
  destroy_endpoint(peer);
  destroy_endpoint(e);
}

TEST_F(Api, QueryQpReturnsWhatWasSet) {
  Endpoint a, b;
  ConnOptions o;
  o.path_mtu = IBV_MTU_2048;
  o.timeout = 17;
  o.retry_cnt = 5;
  o.rnr_retry = 6;
  o.min_rnr_timer = 9;
  o.max_rd_atomic = 4;
  o.max_dest_rd_atomic = 8;
  o.qp_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
  o.max_send_wr = 100;
  o.max_recv_wr = 50;
  o.max_send_sge = 3;
  o.max_recv_sge = 2;
  o.psn = 0x123456;
  ASSERT_TRUE(create_endpoint(d, o, a));
  ASSERT_TRUE(create_endpoint(d, o, b));
  ASSERT_TRUE(connect_endpoint(a, o, d.gid, b.qpn, 0x654321));

  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(0, ibv_query_qp(a.qp, &q, kAttrInit | kAttrRtr | kAttrRts | IBV_QP_CAP, &qi));
  EXPECT_EQ(IBV_QPS_RTS, q.qp_state);
  EXPECT_EQ(IBV_MTU_2048, q.path_mtu);
  EXPECT_EQ(b.qpn, q.dest_qp_num);
  EXPECT_EQ(0x654321u, q.rq_psn);
  EXPECT_EQ(0x123456u, q.sq_psn);
  EXPECT_EQ(17, q.timeout);
  EXPECT_EQ(5, q.retry_cnt);
  EXPECT_EQ(6, q.rnr_retry);
  EXPECT_EQ(9, q.min_rnr_timer);
  EXPECT_EQ(4, q.max_rd_atomic);
  EXPECT_EQ(8, q.max_dest_rd_atomic);
  EXPECT_EQ(unsigned(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ), q.qp_access_flags);
  EXPECT_EQ(kPort, q.port_num);
  EXPECT_EQ(0, q.pkey_index);
  EXPECT_EQ(1, q.ah_attr.is_global);
  EXPECT_EQ(0, memcmp(d.gid.raw, q.ah_attr.grh.dgid.raw, 16));
  EXPECT_EQ(0, q.ah_attr.grh.sgid_index);
  EXPECT_EQ(64, q.ah_attr.grh.hop_limit);
  EXPECT_EQ(kPort, q.ah_attr.port_num);
  EXPECT_EQ(IBV_QPT_RC, qi.qp_type);
  EXPECT_EQ(a.scq, qi.send_cq);
  EXPECT_EQ(a.rcq, qi.recv_cq);
  EXPECT_GE(qi.cap.max_send_wr, 100u);
  EXPECT_GE(qi.cap.max_recv_wr, 50u);
  EXPECT_GE(qi.cap.max_send_sge, 3u);
  EXPECT_GE(qi.cap.max_recv_sge, 2u);
  EXPECT_GE(q.cap.max_send_wr, 100u);
  destroy_endpoint(b);
  destroy_endpoint(a);
}

// ---- posting validation ------------------------------------------------------------------

TEST_F(Api, PostSendBeforeRtsIsEinval) {
  Endpoint e, peer;
  ASSERT_TRUE(create_endpoint(d, ConnOptions{}, e));
  ASSERT_TRUE(create_endpoint(d, ConnOptions{}, peer));
  Buffer b(4096);
  ibv_mr* mr = ibv_reg_mr(d.pd, b.data(), b.size(), int{IBV_ACCESS_LOCAL_WRITE});
  ASSERT_NE(nullptr, mr);
  ibv_sge sge{b.addr(), 8, mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = 1;
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  auto post_in = [&](const char* state) {
    ibv_send_wr* bad = nullptr;
    EXPECT_EQ(EINVAL, ibv_post_send(e.qp, &wr, &bad)) << state;
    EXPECT_EQ(&wr, bad) << state;
  };
  post_in("RESET");
  ConnOptions o;
  ASSERT_EQ(0, modify_to_init(e.qp, o));
  post_in("INIT");
  // Receives may be posted from INIT on.
  EXPECT_EQ(0, post_recv(e.qp, 5, b.data() + 1024, 64, mr->lkey));
  ASSERT_EQ(0, modify_to_rtr(e.qp, o, d.gid, peer.qpn, 0));
  post_in("RTR");
  EXPECT_TRUE(no_completion(e.scq, 10ms));
  destroy_endpoint(peer);
  destroy_endpoint(e);
  EXPECT_EQ(0, ibv_dereg_mr(mr));
}

// Too many SGEs: EINVAL with bad_wr at the offending WR; the WRs before it are posted.
TEST_F(Api, TooManySgesIsEinval) {
  Endpoint a, b;
  ConnOptions o;
  o.max_send_sge = 2;
  o.max_recv_sge = 2;
  ASSERT_TRUE(connect_pair(d, o, a, b));
  Buffer buf(65536);
  ibv_mr* mr = ibv_reg_mr(d.pd, buf.data(), buf.size(), kAllAccess);
  ASSERT_NE(nullptr, mr);
  std::vector<ibv_sge> sges;
  for (uint32_t i = 0; i <= std::max(a.cap.max_send_sge, b.cap.max_recv_sge); ++i)
    sges.push_back(ibv_sge{buf.addr() + i * 16, 8, mr->lkey});

  ibv_recv_wr rwr{};
  rwr.wr_id = 9;
  rwr.sg_list = sges.data();
  rwr.num_sge = static_cast<int>(b.cap.max_recv_sge) + 1;
  ibv_recv_wr* rbad = nullptr;
  EXPECT_EQ(EINVAL, ibv_post_recv(b.qp, &rwr, &rbad));
  EXPECT_EQ(&rwr, rbad);
  ASSERT_EQ(0, post_recv(b.qp, 10, buf.data() + 32768, 1024, mr->lkey));

  ibv_send_wr w1{}, w2{};
  w1.wr_id = 1;
  w1.opcode = IBV_WR_SEND;
  w1.sg_list = sges.data();
  w1.num_sge = 1;
  w1.send_flags = IBV_SEND_SIGNALED;
  w1.next = &w2;
  w2 = w1;
  w2.wr_id = 2;
  w2.next = nullptr;
  w2.num_sge = static_cast<int>(a.cap.max_send_sge) + 1;
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(EINVAL, ibv_post_send(a.qp, &w1, &bad));
  EXPECT_EQ(&w2, bad) << "bad_wr points at the first WR not posted";
  ibv_wc wc = poll_one(a.scq);
  EXPECT_EQ(1u, wc.wr_id) << "the WR before the bad one was posted";
  EXPECT_EQ(IBV_WC_SUCCESS, wc.status) << describe(wc);
  EXPECT_TRUE(no_completion(a.scq, 20ms));
  wc = poll_one(b.rcq);
  EXPECT_EQ(10u, wc.wr_id);
  EXPECT_EQ(8u, wc.byte_len);
  destroy_endpoint(a);
  destroy_endpoint(b);
  EXPECT_EQ(0, ibv_dereg_mr(mr));
}

// A QP whose peer never answers (nothing listens at its address): the send and receive
// queues accept exactly their capacity, then ENOMEM.
TEST_F(Api, FullQueuesAreEnomem) {
  Endpoint e;
  ConnOptions o;
  o.max_send_wr = 32;
  o.max_recv_wr = 32;
  o.timeout = 31;  // no retransmission during the test
  ASSERT_TRUE(create_endpoint(d, o, e));
  // 127.0.3.254: FakePeer range of the raw tests; nothing is bound there in this process.
  ASSERT_TRUE(connect_endpoint(e, o, gid_from_ipv4((127u << 24) | (3u << 8) | 254), 0x1234, 0));
  Buffer buf(4096);
  ibv_mr* mr = ibv_reg_mr(d.pd, buf.data(), buf.size(), int{IBV_ACCESS_LOCAL_WRITE});
  ASSERT_NE(nullptr, mr);
  uint32_t n = 0;
  for (; n < e.cap.max_send_wr; ++n)
    ASSERT_EQ(0, post_send(e.qp, IBV_WR_SEND, n, buf.data(), 8, mr->lkey)) << "WR " << n;
  EXPECT_EQ(ENOMEM, post_send(e.qp, IBV_WR_SEND, n, buf.data(), 8, mr->lkey));
  for (n = 0; n < e.cap.max_recv_wr; ++n)
    ASSERT_EQ(0, post_recv(e.qp, n, buf.data(), 8, mr->lkey)) << "receive " << n;
  EXPECT_EQ(ENOMEM, post_recv(e.qp, n, buf.data(), 8, mr->lkey));
  destroy_endpoint(e);
  EXPECT_EQ(0, ibv_dereg_mr(mr));
}

// ---- completion channel and events --------------------------------------------------------

bool readable(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

// Two QPs on one device connected to each other, all four CQs on one completion channel,
// and a registered 64 KiB buffer.
struct ChannelPair {
  ibv_comp_channel* ch = nullptr;
  Endpoint a, b;
  Buffer buf{65536};
  ibv_mr* mr = nullptr;

  // Fatal failure if a step fails.
  void open(Device& d) {
    ch = ibv_create_comp_channel(d.ctx);
    ASSERT_NE(nullptr, ch);
    ASSERT_TRUE(create_endpoint(d, ConnOptions{}, a, ch));
    ASSERT_TRUE(create_endpoint(d, ConnOptions{}, b, ch));
    ASSERT_TRUE(connect_endpoint(a, ConnOptions{}, d.gid, b.qpn, b.psn));
    ASSERT_TRUE(connect_endpoint(b, ConnOptions{}, d.gid, a.qpn, a.psn));
    mr = ibv_reg_mr(d.pd, buf.data(), buf.size(), kAllAccess);
    ASSERT_NE(nullptr, mr);
  }
  // Destroys everything, checking that each call succeeds.
  void close() {
    destroy_endpoint(a);
    destroy_endpoint(b);
    if (mr) {
      EXPECT_EQ(0, ibv_dereg_mr(mr));
    }
    if (ch) {
      EXPECT_EQ(0, ibv_destroy_comp_channel(ch));
    }
    mr = nullptr;
    ch = nullptr;
  }
  ~ChannelPair() { close(); }
};

TEST_F(Api, CompletionChannelSignalsArmedCq) {
  ChannelPair p;
  ASSERT_NO_FATAL_FAILURE(p.open(d));

  ASSERT_EQ(0, ibv_req_notify_cq(p.b.rcq, 0));
  EXPECT_FALSE(readable(p.ch->fd, 50)) << "no completion yet";
  ASSERT_EQ(0, post_recv(p.b.qp, 1, p.buf.data(), 1024, p.mr->lkey));
  ASSERT_EQ(0, post_send(p.a.qp, IBV_WR_SEND, 2, p.buf.data() + 4096, 100, p.mr->lkey, 0, 0, 0, 0));
  ASSERT_TRUE(readable(p.ch->fd, 5000)) << "armed CQ got a completion but the channel is silent";
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = reinterpret_cast<void*>(1);
  ASSERT_EQ(0, ibv_get_cq_event(p.ch, &ev_cq, &ev_ctx));
  EXPECT_EQ(p.b.rcq, ev_cq);
  EXPECT_EQ(p.b.rcq->cq_context, ev_ctx);
  ibv_ack_cq_events(ev_cq, 1);
  ibv_wc wc = poll_one(p.b.rcq);
  EXPECT_EQ(1u, wc.wr_id);
  EXPECT_EQ(IBV_WC_SUCCESS, wc.status);

  // Not re-armed: the next completion raises no event. a.scq was never armed either.
  ASSERT_EQ(0, post_recv(p.b.qp, 3, p.buf.data(), 1024, p.mr->lkey));
  ASSERT_EQ(0, post_send(p.a.qp, IBV_WR_SEND, 4, p.buf.data() + 4096, 100, p.mr->lkey));
  EXPECT_EQ(4u, poll_one(p.a.scq).wr_id);
  EXPECT_EQ(3u, poll_one(p.b.rcq).wr_id);
  EXPECT_FALSE(readable(p.ch->fd, 50)) << "event on a CQ that was not armed";
  const int fl = fcntl(p.ch->fd, F_GETFL);
  ASSERT_EQ(0, fcntl(p.ch->fd, F_SETFL, fl | O_NONBLOCK));
  errno = 0;
  EXPECT_EQ(-1, ibv_get_cq_event(p.ch, &ev_cq, &ev_ctx));
  EXPECT_EQ(EAGAIN, errno);

  p.close();
}

// A signal interrupts a blocking ibv_get_cq_event / ibv_get_async_event: -1 with errno EINTR,
// as rdma-core's single read() of the channel. qperf ends its timed loops that way (SIGALRM
// while blocked in ibv_get_cq_event); retrying the read left it blocked for good and its
// rc_lat ended in "failed to receive results: timed out".
TEST_F(Api, ASignalInterruptsBlockingEventReadsWithEintr) {
  ChannelPair p;
  ASSERT_NO_FATAL_FAILURE(p.open(d));
  struct sigaction sa {
  }, old{};
  sa.sa_handler = [](int) {};
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART
  ASSERT_EQ(0, sigaction(SIGALRM, &sa, &old));
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  ASSERT_EQ(0, ibv_req_notify_cq(p.b.rcq, 0));  // armed, nothing will complete
  ualarm(100'000, 0);
  errno = 0;
  EXPECT_EQ(-1, ibv_get_cq_event(p.ch, &ev_cq, &ev_ctx));
  EXPECT_EQ(EINTR, errno);
  ibv_async_event ae{};
  ualarm(100'000, 0);
  errno = 0;
  EXPECT_EQ(-1, ibv_get_async_event(d.ctx, &ae));
  EXPECT_EQ(EINTR, errno);
  ualarm(0, 0);
  ASSERT_EQ(0, sigaction(SIGALRM, &old, nullptr));
  p.close();
}

// ibv_resize_cq keeps the completions not polled yet, in order, and refuses (EINVAL, as
// rxe_cq_chk_attr) 0, more than max_cqe, or fewer entries than the CQ holds.
TEST_F(Api, ResizeCqKeepsUnpolledCompletionsInOrder) {
  ChannelPair p;
  ASSERT_NO_FATAL_FAILURE(p.open(d));
  for (int i = 0; i < 3; ++i)
    ASSERT_EQ(0, post_recv(p.b.qp, i, p.buf.data() + i * 1024, 1024, p.mr->lkey));
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(0, post_send(p.a.qp, IBV_WR_SEND, 10 + i, p.buf.data() + 8192, 10, p.mr->lkey));
    // Acknowledged, so the receive completion is in b.rcq, not polled.
    EXPECT_EQ(IBV_WC_SUCCESS, poll_one(p.a.scq).status);
  }
  EXPECT_EQ(EINVAL, ibv_resize_cq(p.b.rcq, 0));
  EXPECT_EQ(EINVAL, ibv_resize_cq(p.b.rcq, d.attr.max_cqe + 1));
  EXPECT_EQ(EINVAL, ibv_resize_cq(p.b.rcq, 2)) << "3 completions do not fit in 2 entries";
  ASSERT_EQ(0, ibv_resize_cq(p.b.rcq, 3));
  EXPECT_EQ(3, p.b.rcq->cqe);
  ASSERT_EQ(0, ibv_resize_cq(p.b.rcq, 1000));
  EXPECT_EQ(1000, p.b.rcq->cqe);
  for (uint64_t i = 0; i < 3; ++i) EXPECT_EQ(i, poll_one(p.b.rcq).wr_id);
  // Empty now: it may shrink to one entry and still works.
  ASSERT_EQ(0, ibv_resize_cq(p.b.rcq, 1));
  ASSERT_EQ(0, post_recv(p.b.qp, 7, p.buf.data(), 1024, p.mr->lkey));
  ASSERT_EQ(0, post_send(p.a.qp, IBV_WR_SEND, 20, p.buf.data() + 8192, 10, p.mr->lkey));
  EXPECT_EQ(IBV_WC_SUCCESS, poll_one(p.a.scq).status);
  EXPECT_EQ(7u, poll_one(p.b.rcq).wr_id);
  p.close();
}

TEST_F(Api, SolicitedOnlyArming) {
  ChannelPair p;
  ASSERT_NO_FATAL_FAILURE(p.open(d));
  for (int i = 0; i < 3; ++i)
    ASSERT_EQ(0, post_recv(p.b.qp, i, p.buf.data() + i * 1024, 1024, p.mr->lkey));

  ASSERT_EQ(0, ibv_req_notify_cq(p.b.rcq, 1));
  ASSERT_EQ(0, post_send(p.a.qp, IBV_WR_SEND, 10, p.buf.data() + 8192, 10, p.mr->lkey));
  EXPECT_EQ(IBV_WC_SUCCESS, poll_one(p.a.scq).status);
  EXPECT_EQ(0u, poll_one(p.b.rcq).wr_id);
  EXPECT_FALSE(readable(p.ch->fd, 50)) << "unsolicited completion fired a solicited-only arm";

  ASSERT_EQ(0, post_send(p.a.qp, IBV_WR_SEND, 11, p.buf.data() + 8192, 10, p.mr->lkey, 0, 0, 0,
                         IBV_SEND_SIGNALED | IBV_SEND_SOLICITED));
  ASSERT_TRUE(readable(p.ch->fd, 5000)) << "solicited completion raised no event";
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  ASSERT_EQ(0, ibv_get_cq_event(p.ch, &ev_cq, &ev_ctx));
  EXPECT_EQ(p.b.rcq, ev_cq);
  ibv_ack_cq_events(ev_cq, 1);
  EXPECT_EQ(1u, poll_one(p.b.rcq).wr_id);
  EXPECT_EQ(IBV_WC_SUCCESS, poll_one(p.a.scq).status);

  p.close();
}

// ---- ERR state, flush, reuse -------------------------------------------------------------

TEST_F(Api, ErrStateFlushesAndQpIsReusableAfterReset) {
  Endpoint a, b;
  ConnOptions o;
  ASSERT_TRUE(connect_pair(d, o, a, b));
  Buffer buf(65536);
  ibv_mr* mr = ibv_reg_mr(d.pd, buf.data(), buf.size(), kAllAccess);
  ASSERT_NE(nullptr, mr);
  for (uint64_t i = 1; i <= 3; ++i) ASSERT_EQ(0, post_recv(b.qp, i, buf.data(), 1024, mr->lkey));

  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(0, ibv_modify_qp(b.qp, &attr, IBV_QP_STATE));
  EXPECT_EQ(IBV_QPS_ERR, qp_state(b.qp));
  for (uint64_t i = 1; i <= 3; ++i) {
    const ibv_wc wc = poll_one(b.rcq);
    EXPECT_EQ(i, wc.wr_id);
    EXPECT_EQ(IBV_WC_WR_FLUSH_ERR, wc.status) << describe(wc);
    EXPECT_EQ(b.qpn, wc.qp_num);
  }
  // Work posted in ERR is accepted and flushed.
  ASSERT_EQ(0, post_recv(b.qp, 4, buf.data(), 1024, mr->lkey));
  EXPECT_EQ(IBV_WC_WR_FLUSH_ERR, poll_one(b.rcq).status);
  ASSERT_EQ(0, post_send(b.qp, IBV_WR_SEND, 5, buf.data(), 10, mr->lkey));
  ibv_wc wc = poll_one(b.scq);
  EXPECT_EQ(5u, wc.wr_id);
  EXPECT_EQ(IBV_WC_WR_FLUSH_ERR, wc.status);
  EXPECT_TRUE(no_completion(b.rcq, 10ms));

  // Both back to RESET and reconnected with fresh PSNs: traffic flows again.
  attr.qp_state = IBV_QPS_RESET;
  ASSERT_EQ(0, ibv_modify_qp(a.qp, &attr, IBV_QP_STATE));
  ASSERT_EQ(0, ibv_modify_qp(b.qp, &attr, IBV_QP_STATE));
  EXPECT_EQ(IBV_QPS_RESET, qp_state(b.qp));
  a.psn = 0x1000;
  b.psn = 0x2000;
  ASSERT_TRUE(connect_endpoint(a, o, d.gid, b.qpn, b.psn));
  ASSERT_TRUE(connect_endpoint(b, o, d.gid, a.qpn, a.psn));
  fill_pattern(buf.data() + 8192, 3000, 9);
  ASSERT_EQ(0, post_recv(b.qp, 6, buf.data() + 16384, 4096, mr->lkey));
  ASSERT_EQ(0, post_send(a.qp, IBV_WR_SEND, 7, buf.data() + 8192, 3000, mr->lkey));
  EXPECT_EQ(IBV_WC_SUCCESS, poll_one(a.scq).status);
  wc = poll_one(b.rcq);
  EXPECT_EQ(IBV_WC_SUCCESS, wc.status) << describe(wc);
  EXPECT_EQ(6u, wc.wr_id) << "receives flushed before the reset must not come back";
  EXPECT_TRUE(HasPattern(buf.data() + 16384, 3000, 9));
  destroy_endpoint(a);
  destroy_endpoint(b);
  EXPECT_EQ(0, ibv_dereg_mr(mr));
}

// ---- two QPs of one device ------------------------------------------------------------------

TEST_F(Api, LoopbackInOneProcess) {
  Endpoint a, b;
  ASSERT_TRUE(connect_pair(d, ConnOptions{}, a, b));
  Buffer ba(1 << 20), bb(1 << 20);
  ibv_mr* ma = ibv_reg_mr(d.pd, ba.data(), ba.size(), kAllAccess);
  ibv_mr* mb = ibv_reg_mr(d.pd, bb.data(), bb.size(), kAllAccess);
  ASSERT_NE(nullptr, ma);
  ASSERT_NE(nullptr, mb);
  memset(bb.data(), kGuard, bb.size());

  // SEND
  fill_pattern(ba.data(), 5000, 1);
  ASSERT_EQ(0, post_recv(b.qp, 1, bb.data(), 8192, mb->lkey));
  ASSERT_EQ(0, post_send(a.qp, IBV_WR_SEND, 1, ba.data(), 5000, ma->lkey));
  EXPECT_EQ(IBV_WC_SUCCESS, poll_one(a.scq).status);
  ibv_wc wc = poll_one(b.rcq);
  ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << describe(wc);
  EXPECT_EQ(5000u, wc.byte_len);
  EXPECT_TRUE(HasPattern(bb.data(), 5000, 1));
  EXPECT_TRUE(AllBytesAre(bb.data() + 5000, 8192 - 5000, kGuard));

  // WRITE 100 KiB
  fill_pattern(ba.data(), 100000, 2);
  ASSERT_EQ(0, post_send(a.qp, IBV_WR_RDMA_WRITE, 2, ba.data(), 100000, ma->lkey, bb.addr() + 10001,
                         mb->rkey));
  wc = poll_one(a.scq);
  ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << describe(wc);
  EXPECT_TRUE(HasPattern(bb.data() + 10001, 100000, 2));
  EXPECT_TRUE(AllBytesAre(bb.data() + 110001, 1000, kGuard));

  // READ it back from b's side into b's buffer? No: a READs from b.
  memset(ba.data() + 500000, kGuard, 120000);
  ASSERT_EQ(0, post_send(a.qp, IBV_WR_RDMA_READ, 3, ba.data() + 500003, 100000, ma->lkey,
                         bb.addr() + 10001, mb->rkey));
  wc = poll_one(a.scq);
  ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << describe(wc);
  EXPECT_EQ(100000u, wc.byte_len);
  EXPECT_TRUE(HasPattern(ba.data() + 500003, 100000, 2));
  EXPECT_TRUE(AllBytesAre(ba.data() + 600003, 1000, kGuard));

  // Atomics on b's memory, and a WRITE with immediate in the other direction.
  auto* word = reinterpret_cast<uint64_t*>(bb.data() + 200000);
  *word = 7;
  auto* res = reinterpret_cast<uint64_t*>(ba.data() + 700000);
  SendWr faa(IBV_WR_ATOMIC_FETCH_AND_ADD, 4);
  faa.add_sge(res, 8, ma->lkey).atomic(bb.addr() + 200000, mb->rkey, 3);
  ASSERT_EQ(0, faa.post(a.qp));
  EXPECT_EQ(IBV_WC_SUCCESS, poll_one(a.scq).status);
  EXPECT_EQ(7u, *res);
  SendWr cas(IBV_WR_ATOMIC_CMP_AND_SWP, 5);
  cas.add_sge(res, 8, ma->lkey).atomic(bb.addr() + 200000, mb->rkey, 10, 99);
  ASSERT_EQ(0, cas.post(a.qp));
  EXPECT_EQ(IBV_WC_SUCCESS, poll_one(a.scq).status);
  EXPECT_EQ(10u, *res);
  EXPECT_EQ(99u, __atomic_load_n(word, __ATOMIC_ACQUIRE));

  ASSERT_EQ(0, post_recv(a.qp, 6, nullptr, 0, 0));
  fill_pattern(bb.data() + 300000, 777, 3);
  ASSERT_EQ(0, post_send(b.qp, IBV_WR_RDMA_WRITE_WITH_IMM, 6, bb.data() + 300000, 777, mb->lkey,
                         ba.addr() + 800000, ma->rkey, htonl(66)));
  EXPECT_EQ(IBV_WC_SUCCESS, poll_one(b.scq).status);
  wc = poll_one(a.rcq);
  ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << describe(wc);
  EXPECT_EQ(IBV_WC_RECV_RDMA_WITH_IMM, wc.opcode);
  EXPECT_EQ(htonl(66), wc.imm_data);
  EXPECT_TRUE(HasPattern(ba.data() + 800000, 777, 3));

  destroy_endpoint(a);
  destroy_endpoint(b);
  EXPECT_EQ(0, ibv_dereg_mr(ma));
  EXPECT_EQ(0, ibv_dereg_mr(mb));
}

}  // namespace
}  // namespace softrdma::verbs_test
