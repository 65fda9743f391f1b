// net/peer_liveness.h: what /proc says of a peer process.
#include "net/peer_liveness.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace softrdma::net {
namespace {

// A child whose main thread sleeps while another thread spins (a device's progress thread
// busy while the application blocks in ibv_get_cq_event) is runnable, not sleeping: the
// process's own stat line shows the main thread alone. Its CPU time moves. Once it is killed
// and reaped it is gone.
TEST(PeerLiveness, AProcessWithARunnableThreadIsRunnableWhileItsMainThreadSleeps) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::thread([] {
      std::atomic<uint64_t> spins{0};
      for (;;) spins.fetch_add(1, std::memory_order_relaxed);
    }).detach();
    ::pause();  // the main thread sleeps ('S')
    ::_exit(0);
  }
  ProcessSample s;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  do {  // until the thread has started and, on a loaded machine, been seen runnable
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    s = sample_process(uint32_t(child));
  } while (s.state != ProcessState::kRunnable && std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(s.state, ProcessState::kRunnable) << to_string(s.state);
  const uint64_t ticks = s.cpu_ticks;
  for (int i = 0; i < 500 && sample_process(uint32_t(child)).cpu_ticks == ticks; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_GT(sample_process(uint32_t(child)).cpu_ticks, ticks) << "the spinning thread's CPU time";
  ::kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_EQ(sample_process(uint32_t(child)).state, ProcessState::kGone);
}

// A process all of whose threads sleep is sleeping.
TEST(PeerLiveness, AProcessWhoseThreadsAllSleepIsSleeping) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  ProcessSample s;
  for (int i = 0; i < 500; ++i) {  // until it has reached pause()
    s = sample_process(uint32_t(child));
    if (s.state == ProcessState::kSleeping) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(s.state, ProcessState::kSleeping) << to_string(s.state);
  ::kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
}

}  // namespace
}  // namespace softrdma::net
