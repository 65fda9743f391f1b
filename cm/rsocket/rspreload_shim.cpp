// libsoftrdma_rspreload_shim.so: what Debian's librspreload (rdma-core 44) lacks for programs
// built against a current glibc, preloaded in front of it by `softrdma run --rsockets`:
//  - accept4(2): librspreload intercepts accept() only, so a server calling accept4 (Python's
//    socket.accept, Perl, Node) reaches the kernel with librspreload's placeholder descriptor
//    (/dev/null) and fails with ENOTSOCK. Here accept4 = accept() (librspreload's, found with
//    RTLD_NEXT) then fcntl(2) for SOCK_NONBLOCK / SOCK_CLOEXEC (librspreload's fcntl, which
//    reaches rfcntl for an rsocket).
//  - ioctl(FIONBIO): Python's settimeout() and others switch blocking mode with it; here it
//    becomes fcntl(F_SETFL, O_NONBLOCK), the path librspreload intercepts. Every other ioctl
//    goes to the next definition unchanged.
// For an ordinary descriptor both give what the kernel calls would have.
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdarg>

namespace {

template <typename F>
F next(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

int set_nonblocking(int fd, bool on) {
  const int fl = fcntl(fd, F_GETFL);
  if (fl < 0) return -1;
  return fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
}

}  // namespace

extern "C" {

/// accept4(2) over accept(2) and fcntl(2): flags SOCK_NONBLOCK and SOCK_CLOEXEC; EINVAL for
/// others, as the kernel.
__attribute__((visibility("default"))) int accept4(int fd, sockaddr* addr, socklen_t* len,
                                                   int flags) {
  if (flags & ~(SOCK_NONBLOCK | SOCK_CLOEXEC)) {
    errno = EINVAL;
    return -1;
  }
  static auto real_accept = next<int (*)(int, sockaddr*, socklen_t*)>("accept");
  if (!real_accept) {
    errno = ENOSYS;
    return -1;
  }
  const int nfd = real_accept(fd, addr, len);
  if (nfd < 0) return nfd;
  if ((flags & SOCK_NONBLOCK) && set_nonblocking(nfd, true) < 0) return -1;
  if (flags & SOCK_CLOEXEC) fcntl(nfd, F_SETFD, FD_CLOEXEC);
  return nfd;
}

/// ioctl(2): FIONBIO as fcntl(F_SETFL, O_NONBLOCK); other requests passed on unchanged.
__attribute__((visibility("default"))) int ioctl(int fd, unsigned long request, ...) {
  va_list ap;
  va_start(ap, request);
  void* arg = va_arg(ap, void*);
  va_end(ap);
  if (request == FIONBIO) {
    if (!arg) {
      errno = EFAULT;
      return -1;
    }
    return set_nonblocking(fd, *static_cast<int*>(arg) != 0) < 0 ? -1 : 0;
  }
  static auto real_ioctl = next<int (*)(int, unsigned long, void*)>("ioctl");
  if (!real_ioctl) {
    errno = ENOSYS;
    return -1;
  }
  return real_ioctl(fd, request, arg);
}

}  // extern "C"
