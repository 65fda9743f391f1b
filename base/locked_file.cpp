// See locked_file.h.
#include "base/locked_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace softrdma::base {

int open_locked_file(const std::string& path) {
  for (int tries = 0;; ++tries) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return -errno;
    if (::flock(fd, LOCK_EX) != 0) {
      const int e = errno;
      ::close(fd);
      return -e;
    }
    struct stat opened {
    }, named{};
    if (tries < 16 && ::fstat(fd, &opened) == 0 &&
        (::stat(path.c_str(), &named) != 0 || named.st_ino != opened.st_ino)) {
      ::close(fd);  // unlinked meanwhile by the file's last user
      continue;
    }
    return fd;
  }
}

}  // namespace softrdma::base
