// exit() from one thread while another is still inside libibverbs.
//
// A program may call exit() while another of its threads is in a verbs call: rping (rdma-core
// 44, Debian 12) does it on every failed connect — its CM thread calls exit() on the REJECTED
// event while its CQ thread wakes from ibv_get_cq_event on the receive WQE the REJECTED
// flushed and its main thread destroys the QP, the CQ and the PD. exit() runs the static
// destructors of every library; one that frees state a verbs call still reads (a set of live
// CQs, the map of open devices) turns that into a crash in the exiting process — an
// AddressSanitizer report, or a SEGV. libibverbs' process-wide state is therefore never
// destroyed (verbs/objects.h, "Process-wide state"), as the kernel's is not there.
//
// Each child process here opens srdma0, starts a thread that cycles through the calls whose
// state is process-wide (open/close a context, create/destroy CQs and QPs, a flushed receive
// WQE read back with ibv_get_cq_event, register/deregister an MR) and, once the thread has
// gone round at least once, calls exit(0) from its main thread while that thread goes on.
// The child must end with status 0 and print no sanitizer report (its stderr goes to a file the
// parent reads: under AddressSanitizer a report from the looping thread can race the exiting
// thread's _exit and leave the status 0).
//
// Its own executable: the children fork before this process makes any verbs call.

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "verbs/tests/harness.h"

namespace softrdma::verbs_test {
namespace {

/// One round of calls that read or write libibverbs' process-wide state. Returns false when a
/// call failed (the child then stops the loop; exit() is what is tested, not this).
bool one_round(const Device& d, ibv_comp_channel* ch, void* buf, size_t len) {
  // A second context on the same device: the map of open devices.
  ibv_device** list = ibv_get_device_list(nullptr);
  if (!list || !list[0]) return false;
  ibv_context* other = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (!other) return false;
  ibv_close_device(other);

  // A CQ on the channel (the set of live CQs) and a QP on it (the set of objects events name).
  ibv_cq* cq = ibv_create_cq(d.ctx, 4, nullptr, ch, 0);
  if (!cq) return false;
  bool ok = ibv_req_notify_cq(cq, 0) == 0;
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 1;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  ibv_qp* qp = ok ? ibv_create_qp(d.pd, &ia) : nullptr;
  ibv_mr* mr = qp ? ibv_reg_mr(d.pd, buf, len, IBV_ACCESS_LOCAL_WRITE) : nullptr;
  if (mr && modify_to_init(qp, ConnOptions{}) == 0 &&
      post_recv(qp, 1, buf, uint32_t(len), mr->lkey) == 0) {
    // To ERROR: the receive WQE is flushed, its completion raises the CQ's event.
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0) {
      pollfd p{ch->fd, POLLIN, 0};
      ibv_cq* ev_cq = nullptr;
      void* ev_ctx = nullptr;
      if (::poll(&p, 1, 2000) == 1 && ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0)
        ibv_ack_cq_events(ev_cq, 1);
      ibv_wc wc{};
      (void)ibv_poll_cq(cq, 1, &wc);
    }
  }
  if (mr) ibv_dereg_mr(mr);
  if (qp) ibv_destroy_qp(qp);
  ibv_destroy_cq(cq);
  return ok && qp && mr;
}

/// The child's body: never returns.
[[noreturn]] void child() {
  Device d;
  if (!open_device(d)) std::_Exit(2);
  ibv_comp_channel* ch = ibv_create_comp_channel(d.ctx);
  if (!ch) std::_Exit(3);
  static uint8_t buf[4096];
  static std::atomic<int> rounds{0};
  // Detached: exit() does not join it; it runs until the process ends (bounded anyway).
  std::thread([&d, ch] {
    const auto until = Clock::now() + 20s;
    while (Clock::now() < until && one_round(d, ch, buf, sizeof buf)) rounds.fetch_add(1);
    std::_Exit(4);  // the loop failed or ran 20 s: exit() never ended the process
  }).detach();
  const auto until = Clock::now() + 10s;
  while (rounds.load() < 1 && Clock::now() < until) std::this_thread::sleep_for(1ms);
  if (rounds.load() < 1) std::_Exit(5);
  std::exit(0);  // static destructors run while the thread is still in its round
}

TEST(ExitRace, ExitWhileAnotherThreadIsInVerbsCallsEndsCleanly) {
  constexpr int kChildren = 12;
  for (int i = 0; i < kChildren; ++i) {
    char path[] = "/tmp/softrdma-exit-race-XXXXXX";
    const int err_fd = ::mkstemp(path);
    ASSERT_GE(err_fd, 0);
    ::unlink(path);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::dup2(err_fd, STDERR_FILENO);
      child();
    }
    int status = 0;
    const auto deadline = Clock::now() + 60s;
    pid_t r = 0;
    while ((r = ::waitpid(pid, &status, WNOHANG)) == 0 && Clock::now() < deadline)
      std::this_thread::sleep_for(5ms);
    if (r == 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      FAIL() << "child " << i << " did not end within 60 s of its exit()";
    }
    std::string err(1 << 16, '\0');
    const ssize_t n = ::pread(err_fd, err.data(), err.size(), 0);
    ::close(err_fd);
    err.resize(n > 0 ? size_t(n) : 0);
    ASSERT_EQ(err.find("Sanitizer"), std::string::npos) << "child " << i << ":\n" << err;
    ASSERT_EQ(err.find("runtime error"), std::string::npos) << "child " << i << ":\n" << err;
    ASSERT_TRUE(WIFEXITED(status))
        << "child " << i << " ended by signal " << WTERMSIG(status) << "\n"
        << err;
    ASSERT_EQ(WEXITSTATUS(status), 0) << "child " << i
                                      << " (2-3: could not open the device, 4: the calls "
                                         "failed, 5: the thread never went round)";
  }
}

}  // namespace
}  // namespace softrdma::verbs_test
