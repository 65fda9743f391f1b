// Time per message with many connected RC QPs open: a plain verbs program (Debian's
// <infiniband/verbs.h>, linked against the system libibverbs; run it under `softrdma run`,
// which puts softrdma's drop-in libibverbs.so.1 first).
//
//   qp_scale N [N...]
//
// For each N: one device context (the first device), one PD, one send CQ and one receive CQ,
// 2N RC QPs (max_send_wr = max_recv_wr = 4), QP i connected to QP i+N, all on the device's
// own GID index 0 (the device sends to its own address). Exchange phase, timed: in each
// round every pair exchanges one 32-byte SEND (post a receive on QP i+N, post the send on
// QP i), pairs in turn, at most kWindow messages in flight; R = ceil(kMinMessages / N) rounds
// (one round from N = kMinMessages up), so that small N are timed over enough messages too
// while consecutive messages still go to N different QP pairs. Timed until every send and
// receive has completed. Setup (QP creation and connection) and teardown are not timed.
// Prints one line per N:
//
//   qp_scale pairs N qps 2N rounds R setup_s S us_per_msg U
//
// Each N is bounded: more than kLimitS seconds (setup + exchange + teardown) aborts with an
// error and exit status 1.
#include <infiniband/verbs.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr double kLimitS = 120;
constexpr unsigned kWindow = 64;  // messages in flight (at most N)
constexpr unsigned kMinMessages = 20000;
constexpr unsigned kMsgBytes = 32;
constexpr unsigned kSlotBytes = 64;

// Real time: this measures the machine (the verbs library it is linked against), undilated.
double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

[[noreturn]] void fail(const char* what, int err) {
  std::fprintf(stderr, "qp_scale: %s: %s\n", what, std::strerror(err));
  std::exit(1);
}

double g_deadline = 0;

void check_deadline(const char* phase) {
  if (now_s() > g_deadline) {
    std::fprintf(stderr, "qp_scale: %s: over %.0f s, aborting\n", phase, kLimitS);
    std::exit(1);
  }
}

void to_init(ibv_qp* qp) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  if (int e = ibv_modify_qp(qp, &a,
                            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    fail("modify_qp INIT", e);
}

void to_rtr_rts(ibv_qp* qp, uint32_t peer, const ibv_gid& gid) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = peer;
  a.rq_psn = 0;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = gid;
  a.ah_attr.grh.sgid_index = 0;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = 1;
  if (int e = ibv_modify_qp(qp, &a,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    fail("modify_qp RTR", e);
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.sq_psn = 0;
  a.max_rd_atomic = 1;
  if (int e = ibv_modify_qp(qp, &a,
                            IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
    fail("modify_qp RTS", e);
}

// Polls both CQs once; returns the completions seen (send + receive). Any error: exit.
unsigned drain(ibv_cq* scq, ibv_cq* rcq, uint64_t& sends, uint64_t& recvs) {
  ibv_wc wc[kWindow];
  unsigned seen = 0;
  for (ibv_cq* cq : {scq, rcq}) {
    int n = ibv_poll_cq(cq, int(kWindow), wc);
    if (n < 0) fail("poll_cq", EIO);
    for (int k = 0; k < n; ++k) {
      if (wc[k].status != IBV_WC_SUCCESS) {
        std::fprintf(stderr, "qp_scale: completion error: %s (qp %u)\n",
                     ibv_wc_status_str(wc[k].status), wc[k].qp_num);
        std::exit(1);
      }
      (cq == scq ? sends : recvs)++;
    }
    seen += unsigned(n);
  }
  return seen;
}

void run(ibv_context* ctx, unsigned pairs) {
  const double t_start = now_s();
  g_deadline = t_start + kLimitS;
  ibv_gid gid;
  if (int e = ibv_query_gid(ctx, 1, 0, &gid)) fail("query_gid", e);
  ibv_pd* pd = ibv_alloc_pd(ctx);
  if (!pd) fail("alloc_pd", errno);
  std::vector<char> buf(size_t(2) * pairs * kSlotBytes, 'x');
  ibv_mr* mr = ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  if (!mr) fail("reg_mr", errno);
  // At most kWindow sends and kWindow receives are outstanding: CQs of 2·kWindow never fill.
  ibv_cq* scq = ibv_create_cq(ctx, int(2 * kWindow), nullptr, nullptr, 0);
  ibv_cq* rcq = ibv_create_cq(ctx, int(2 * kWindow), nullptr, nullptr, 0);
  if (!scq || !rcq) fail("create_cq", errno);

  std::vector<ibv_qp*> qps(size_t(2) * pairs);
  for (auto& qp : qps) {
    ibv_qp_init_attr ia{};
    ia.send_cq = scq;
    ia.recv_cq = rcq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = 4;
    ia.cap.max_recv_wr = 4;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    qp = ibv_create_qp(pd, &ia);
    if (!qp) fail("create_qp", errno);
    to_init(qp);
    check_deadline("setup");
  }
  for (unsigned i = 0; i < pairs; ++i) {
    to_rtr_rts(qps[i], qps[i + pairs]->qp_num, gid);
    to_rtr_rts(qps[i + pairs], qps[i]->qp_num, gid);
    check_deadline("setup");
  }
  const double setup_s = now_s() - t_start;

  // Exchange: message m is SEND i = m mod pairs on QP i into a receive posted on QP i+pairs.
  // A window of at most `pairs` keeps each QP's queues (4 deep) from overflowing.
  const unsigned rounds = (kMinMessages + pairs - 1) / pairs;
  const uint64_t total = uint64_t(rounds) * pairs;
  const unsigned window = std::min(kWindow, pairs);
  uint64_t posted = 0, sends = 0, recvs = 0;
  const double t0 = now_s();
  while (sends < total || recvs < total) {
    while (posted < total && posted - std::min(sends, recvs) < window) {
      const unsigned i = unsigned(posted % pairs);
      ibv_sge rs{reinterpret_cast<uintptr_t>(buf.data()) + (uint64_t(i) + pairs) * kSlotBytes,
                 kSlotBytes, mr->lkey};
      ibv_recv_wr rwr{};
      rwr.wr_id = i;
      rwr.sg_list = &rs;
      rwr.num_sge = 1;
      ibv_recv_wr* rbad = nullptr;
      if (int e = ibv_post_recv(qps[i + pairs], &rwr, &rbad)) fail("post_recv", e);
      ibv_sge ss{reinterpret_cast<uintptr_t>(buf.data()) + uint64_t(i) * kSlotBytes, kMsgBytes,
                 mr->lkey};
      ibv_send_wr swr{};
      swr.wr_id = i;
      swr.sg_list = &ss;
      swr.num_sge = 1;
      swr.opcode = IBV_WR_SEND;
      swr.send_flags = IBV_SEND_SIGNALED;
      ibv_send_wr* sbad = nullptr;
      if (int e = ibv_post_send(qps[i], &swr, &sbad)) fail("post_send", e);
      ++posted;
    }
    if (drain(scq, rcq, sends, recvs) == 0) check_deadline("exchange");
  }
  const double us_per_msg = (now_s() - t0) * 1e6 / double(total);

  for (ibv_qp* qp : qps)
    if (int e = ibv_destroy_qp(qp)) fail("destroy_qp", e);
  ibv_destroy_cq(scq);
  ibv_destroy_cq(rcq);
  ibv_dereg_mr(mr);
  ibv_dealloc_pd(pd);
  std::printf("qp_scale pairs %u qps %u rounds %u setup_s %.2f us_per_msg %.3f\n", pairs, 2 * pairs,
              rounds, setup_s, us_per_msg);
  std::fflush(stdout);
  check_deadline("teardown");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: qp_scale N [N...]   (N connected RC QP pairs on one device)\n");
    return 2;
  }
  std::vector<unsigned> ns;
  for (int a = 1; a < argc; ++a) {
    char* end = nullptr;
    unsigned long n = std::strtoul(argv[a], &end, 10);
    if (!end || *end || n == 0 || n > 32768) {
      std::fprintf(stderr, "qp_scale: N must be 1..32768, got '%s'\n", argv[a]);
      return 2;
    }
    ns.push_back(unsigned(n));
  }
  // Backstop for a call that never returns: the in-loop checks cover the rest.
  std::signal(SIGALRM, [](int) {
    static const char msg[] = "qp_scale: time limit exceeded, aborting\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(1);
  });
  int ndev = 0;
  ibv_device** devs = ibv_get_device_list(&ndev);
  if (!devs || ndev == 0) fail("no verbs device", errno ? errno : ENODEV);
  ibv_context* ctx = ibv_open_device(devs[0]);
  if (!ctx) fail("open_device", errno);
  ibv_device_attr da;
  if (int e = ibv_query_device(ctx, &da)) fail("query_device", e);
  for (unsigned n : ns) {
    if (2 * n > unsigned(da.max_qp)) {
      std::fprintf(stderr, "qp_scale: %u pairs need %u QPs, device max_qp is %d\n", n, 2 * n,
                   da.max_qp);
      return 1;
    }
    alarm(unsigned(kLimitS) + 30);
    run(ctx, n);
    alarm(0);
  }
  ibv_close_device(ctx);
  ibv_free_device_list(devs);
  return 0;
}
