// base::open_locked_file: creates the file 0600 and holds its flock; errors are -errno.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "base/locked_file.h"

namespace softrdma::base {
namespace {

TEST(LockedFile, CreatesTheFileAndHoldsItsLock) {
  const std::string path = testing::TempDir() + "locked_file_" + std::to_string(getpid());
  const int fd = open_locked_file(path);
  ASSERT_GE(fd, 0) << -fd;
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // Another open file description of the same file cannot take the lock meanwhile.
  const int other = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(other, 0);
  EXPECT_NE(::flock(other, LOCK_EX | LOCK_NB), 0);
  EXPECT_EQ(errno, EWOULDBLOCK);
  ::close(fd);
  EXPECT_EQ(::flock(other, LOCK_EX | LOCK_NB), 0);
  ::close(other);
  ::unlink(path.c_str());
}

TEST(LockedFile, ErrorsAreNegativeErrno) {
  EXPECT_EQ(open_locked_file("/nonexistent-dir-softrdma/x"), -ENOENT);
}

}  // namespace
}  // namespace softrdma::base
