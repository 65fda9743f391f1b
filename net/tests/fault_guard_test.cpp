// The fault guard: copies from and to memory that is unmapped, protected or beyond the end
// of a file mapping fail instead of crashing; the process goes on, later copies work, and
// faults outside a guard still reach the previous handler.
#include "net/fault_guard.h"

#include <gtest/gtest.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <thread>
#include <vector>

namespace softrdma::net {
namespace {

size_t page() {
  return static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

/// Two pages mapped, the second then unmapped: [p, p+page) is readable, [p+page, …) is not.
uint8_t* map_then_unmap_second_page() {
  void* m = ::mmap(nullptr, 2 * page(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  EXPECT_NE(m, MAP_FAILED);
  auto* p = static_cast<uint8_t*>(m);
  std::memset(p, 0x5a, page());
  EXPECT_EQ(::munmap(p + page(), page()), 0);
  return p;
}

TEST(FaultGuard, CopyFromAndToUnmappedMemoryFailsAndTheProcessGoesOn) {
  install_fault_guard();
  ASSERT_TRUE(fault_guard_installed());
  uint8_t* p = map_then_unmap_second_page();
  std::vector<uint8_t> buf(2 * page(), 0);
  const uint64_t before = guarded_faults();
  EXPECT_TRUE(guarded_copy(buf.data(), p, page()));
  EXPECT_EQ(buf[0], 0x5a);
  EXPECT_FALSE(guarded_copy(buf.data(), p, 2 * page()));   // runs into the hole
  EXPECT_FALSE(guarded_copy(p + page(), buf.data(), 16));  // writes into it
  EXPECT_EQ(guarded_faults() - before, 2u);
  // Later copies work again on this thread and others.
  EXPECT_TRUE(guarded_copy(buf.data() + 1, p, 8));
  std::thread([&] { EXPECT_FALSE(guarded_copy(buf.data(), p + page(), 1)); }).join();
  ::munmap(p, page());
}

TEST(FaultGuard, ProtectedPagesAndTouch) {
  install_fault_guard();
  void* m = ::mmap(nullptr, 3 * page(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* p = static_cast<uint8_t*>(m);
  ASSERT_EQ(::mprotect(p + page(), page(), PROT_READ), 0);
  uint8_t x[8] = {};
  EXPECT_TRUE(guarded_copy(x, p + page(), 8));   // readable
  EXPECT_FALSE(guarded_copy(p + page(), x, 8));  // not writable
  EXPECT_TRUE(guarded_touch(p, 3 * page()));
  ASSERT_EQ(::mprotect(p + 2 * page(), page(), PROT_NONE), 0);
  EXPECT_FALSE(guarded_touch(p, 3 * page()));
  EXPECT_TRUE(guarded_touch(p + 10, page()));  // ends in the readable second page
  EXPECT_TRUE(guarded_touch(p, 0));
  ::munmap(p, 3 * page());
}

TEST(FaultGuard, FileMappingBeyondItsEndIsSigbusAndRecovered) {
  install_fault_guard();
  FILE* f = ::tmpfile();
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(::ftruncate(fileno(f), static_cast<off_t>(page())), 0);
  void* m = ::mmap(nullptr, 2 * page(), PROT_READ | PROT_WRITE, MAP_SHARED, fileno(f), 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* p = static_cast<uint8_t*>(m);
  uint8_t x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_TRUE(guarded_copy(p, x, 8));
  EXPECT_FALSE(guarded_copy(p + page(), x, 8));  // past the file's end: SIGBUS
  ::munmap(p, 2 * page());
  ::fclose(f);
}

TEST(FaultGuard, GuardedCallIsAbandonedAtTheFault) {
  install_fault_guard();
  uint8_t* p = map_then_unmap_second_page();
  struct Arg {
    uint8_t* p;
    int reached = 0;
  } a{p + page()};
  EXPECT_FALSE(guarded_call(
      [](void* v) {
        auto* a = static_cast<Arg*>(v);
        *a->p = 1;
        a->reached = 1;
      },
      &a));
  EXPECT_EQ(a.reached, 0);
  ::munmap(p, page());
}

// A fault outside any guard still reaches the handler installed before the guard's: here a
// test handler that jumps back, standing for the application's own SIGSEGV handler.
sigjmp_buf g_app_env;
void app_handler(int) {
  siglongjmp(g_app_env, 1);
}

TEST(FaultGuardDeathTest, FaultsOutsideAGuardStillCrash) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        install_fault_guard();
        uint8_t* p = map_then_unmap_second_page();
        *reinterpret_cast<volatile uint8_t*>(p + page()) = 1;
      },
      "");
}

TEST(FaultGuardDeathTest, FaultsOutsideAGuardReachTheHandlerInstalledBefore) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        struct sigaction sa {};
        sa.sa_handler = app_handler;
        sa.sa_flags = SA_NODEFER;
        sigaction(SIGSEGV, &sa, nullptr);
        install_fault_guard();  // first install in this child: chains to app_handler
        uint8_t* p = map_then_unmap_second_page();
        if (sigsetjmp(g_app_env, 0) == 0) *reinterpret_cast<volatile uint8_t*>(p + page()) = 1;
        _exit(guarded_copy(p, p + page(), 1) ? 1 : 42);  // the guard still works afterwards
      },
      ::testing::ExitedWithCode(42), "");
}

}  // namespace
}  // namespace softrdma::net
