// SharedPorts: the rdma_cm port table of one address across processes (a forked child stands
// for the other process). Each test uses its own directory.
#include "cm/shared_ports.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace softrdma::cm {
namespace {

constexpr uint32_t kIp = 0x7f005121;  // 127.0.81.33
constexpr uint16_t kTcp = 0x0106;

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/softrdma-cmports-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::system(("rm -rf " + path).c_str()); }
};

TEST(SharedPorts, APortAnotherProcessHoldsIsTakenUntilItExits) {
  TempDir d;
  int to_parent[2], to_child[2];
  ASSERT_EQ(::pipe(to_parent), 0);
  ASSERT_EQ(::pipe(to_child), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // holds and listens on TCP 7174, then exits when told
    SharedPorts p;
    char c = p.open(kIp, d.path) == 0 && p.claim(kTcp, 7174) == 0 ? 'y' : 'n';
    p.set_listening(kTcp, 7174, true);
    (void)!::write(to_parent[1], &c, 1);
    (void)!::read(to_child[0], &c, 1);
    _exit(0);  // without releasing: a process that dies
  }
  char c = 0;
  ASSERT_EQ(::read(to_parent[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  SharedPorts p;
  ASSERT_EQ(p.open(kIp, d.path), 0);
  EXPECT_EQ(p.claim(kTcp, 7174), EADDRINUSE);
  EXPECT_TRUE(p.taken_elsewhere(kTcp, 7174));
  EXPECT_TRUE(p.listened_elsewhere(kTcp, 7174));
  EXPECT_FALSE(p.taken_elsewhere(0x0111, 7174));  // another port space
  EXPECT_EQ(p.claim(kTcp, 7175), 0);
  EXPECT_EQ(p.claim(kTcp, 7175), 0);  // ours already
  EXPECT_FALSE(p.listened_elsewhere(kTcp, 7175));
  EXPECT_TRUE(SharedPorts::remove_stale(d.path).empty());  // both processes live
  ASSERT_EQ(::write(to_child[1], "x", 1), 1);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_FALSE(p.taken_elsewhere(kTcp, 7174));  // a dead process's entry counts as free
  EXPECT_EQ(p.claim(kTcp, 7174), 0);
  for (int fd : {to_parent[0], to_parent[1], to_child[0], to_child[1]}) ::close(fd);
}

TEST(SharedPorts, TheLastProcessRemovesTheTableAndCleanRemovesStaleOnes) {
  TempDir d;
  const std::string file = SharedPorts::table_path(kIp, d.path);
  struct stat st {};
  {
    SharedPorts p;
    ASSERT_EQ(p.open(kIp, d.path), 0);
    ASSERT_EQ(p.claim(kTcp, 7174), 0);
    EXPECT_EQ(::stat(file.c_str(), &st), 0);
  }
  EXPECT_NE(::stat(file.c_str(), &st), 0) << "left behind by its last process";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {             // leaves a table with its port behind
    auto* p = new SharedPorts;  // never destroyed
    _exit(p->open(kIp, d.path) == 0 && p->claim(kTcp, 7174) == 0 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(::stat(file.c_str(), &st), 0);
  const auto removed = SharedPorts::remove_stale(d.path);
  ASSERT_EQ(removed.size(), 1u);
  EXPECT_EQ(removed[0], file);
  EXPECT_NE(::stat(file.c_str(), &st), 0);
}

}  // namespace
}  // namespace softrdma::cm
