// What softrdma's librdmacm does not implement, answered the way librdmacm answers a call the
// kernel refuses (-1 and errno), with one log line saying what is missing: rsockets (rsocket,
// rbind, … riowrite): ENOSYS. They are a socket library over the CM and verbs (librdmacm's
// rsocket.c), not part of the CM itself; programs using them fail cleanly at rsocket().
#include <rdma/rsocket.h>

#include <cerrno>
#include <cstdio>

#include "cm/cma.h"
#include "cm/log.h"

using namespace softrdma::cm;

namespace {

int no_rsockets(const char* what) {
  static bool said = false;
  if (!said) {
    said = true;
    log().warn("{}: not supported by softrdma's librdmacm (no rsockets)", what);
  }
  errno = ENOSYS;
  return -1;
}

}  // namespace

extern "C" {

int rsocket(int, int, int) {
  return no_rsockets("rsocket");
}
int rbind(int, const sockaddr*, socklen_t) {
  return no_rsockets("rbind");
}
int rlisten(int, int) {
  return no_rsockets("rlisten");
}
int raccept(int, sockaddr*, socklen_t*) {
  return no_rsockets("raccept");
}
int rconnect(int, const sockaddr*, socklen_t) {
  return no_rsockets("rconnect");
}
int rshutdown(int, int) {
  return no_rsockets("rshutdown");
}
int rclose(int) {
  return no_rsockets("rclose");
}
ssize_t rrecv(int, void*, size_t, int) {
  return no_rsockets("rrecv");
}
ssize_t rrecvfrom(int, void*, size_t, int, sockaddr*, socklen_t*) {
  return no_rsockets("rrecvfrom");
}
ssize_t rrecvmsg(int, msghdr*, int) {
  return no_rsockets("rrecvmsg");
}
ssize_t rsend(int, const void*, size_t, int) {
  return no_rsockets("rsend");
}
ssize_t rsendto(int, const void*, size_t, int, const sockaddr*, socklen_t) {
  return no_rsockets("rsendto");
}
ssize_t rsendmsg(int, const msghdr*, int) {
  return no_rsockets("rsendmsg");
}
ssize_t rread(int, void*, size_t) {
  return no_rsockets("rread");
}
ssize_t rreadv(int, const iovec*, int) {
  return no_rsockets("rreadv");
}
ssize_t rwrite(int, const void*, size_t) {
  return no_rsockets("rwrite");
}
ssize_t rwritev(int, const iovec*, int) {
  return no_rsockets("rwritev");
}
int rpoll(pollfd*, nfds_t, int) {
  return no_rsockets("rpoll");
}
int rselect(int, fd_set*, fd_set*, fd_set*, timeval*) {
  return no_rsockets("rselect");
}
int rgetpeername(int, sockaddr*, socklen_t*) {
  return no_rsockets("rgetpeername");
}
int rgetsockname(int, sockaddr*, socklen_t*) {
  return no_rsockets("rgetsockname");
}
int rsetsockopt(int, int, int, const void*, socklen_t) {
  return no_rsockets("rsetsockopt");
}
int rgetsockopt(int, int, int, void*, socklen_t*) {
  return no_rsockets("rgetsockopt");
}
int rfcntl(int, int, ...) {
  return no_rsockets("rfcntl");
}
off_t riomap(int, void*, size_t, int, int, off_t) {
  return no_rsockets("riomap");
}
int riounmap(int, void*, size_t) {
  return no_rsockets("riounmap");
}
size_t riowrite(int, const void*, size_t, off_t, int) {
  no_rsockets("riowrite");
  return 0;
}

}  // extern "C"
