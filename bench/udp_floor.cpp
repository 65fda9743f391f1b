// The floor any design that crosses the kernel's UDP stack can reach on this machine,
// measured between two processes on two loopback addresses (as softrdma's devices are):
//
//   udp_floor pingpong SIZE ITERS   busy-poll ping-pong (MSG_DONTWAIT spin on both sides);
//                                   prints the median half round trip, µs
//   udp_floor stream SEGMENT SECONDS  one-way stream with UDP GSO (64 KiB sends cut into
//                                   SEGMENT-byte datagrams) and GRO on the receiver;
//                                   prints the receive rate over SECONDS, GB/s (1e9 B/s)
//   udp_floor stream-nogso SEGMENT SECONDS   the same with one datagram per send
//   udp_floor rate SIZE SECONDS     datagram rate: one sender blasting SIZE-byte datagrams in
//                                   sendmmsg batches of 64, one receiver draining them with
//                                   recvmmsg (busy-poll); prints the receive rate, Mpps
//   udp_floor memcpy BLOCK SECONDS  memcpy of BLOCK-byte blocks from a 64 MiB source to a
//                                   64 MiB destination, both cycled in BLOCK steps (a working
//                                   set far beyond the caches); prints GB/s copied — the limit
//                                   a design that copies each payload once approaches
//
// Addresses: 127.0.20.1 (server) and 127.0.20.2 (client), ephemeral UDP port. Output is one
// machine-readable line "floor <what> <value>" for bench/run_bench.sh (memcpy uses no socket).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

namespace {

// Real time: the kernel's UDP floor of this machine, undilated.
double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

[[noreturn]] void die(const char* what) {
  std::perror(what);
  std::exit(1);
}

int bound_socket(const char* ip, uint16_t port, int buf) {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) die("socket");
  setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buf, sizeof buf);
  setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buf, sizeof buf);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, ip, &a.sin_addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) die("bind");
  return fd;
}

sockaddr_in addr_of(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return a;
}

void connect_to(int fd, const sockaddr_in& a) {
  if (connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) die("connect");
}

ssize_t spin_recv(int fd, void* buf, size_t n) {
  for (;;) {
    ssize_t r = recv(fd, buf, n, MSG_DONTWAIT);
    if (r >= 0) return r;
    if (errno != EAGAIN && errno != EINTR) die("recv");
  }
}

int pingpong(size_t size, int iters) {
  int srv = bound_socket("127.0.20.1", 0, 1 << 20);
  int cli = bound_socket("127.0.20.2", 0, 1 << 20);
  connect_to(srv, addr_of(cli));
  connect_to(cli, addr_of(srv));
  std::vector<char> buf(std::max<size_t>(size, 1));
  pid_t child = fork();
  if (child == 0) {  // echo server
    for (int i = 0; i < iters + 100; ++i) {
      ssize_t n = spin_recv(srv, buf.data(), buf.size());
      if (send(srv, buf.data(), size_t(n), 0) < 0) die("send");
    }
    _exit(0);
  }
  std::vector<double> half;
  half.reserve(size_t(iters));
  for (int i = 0; i < iters + 100; ++i) {
    double t0 = now_s();
    if (send(cli, buf.data(), size, 0) < 0) die("send");
    spin_recv(cli, buf.data(), buf.size());
    if (i >= 100) half.push_back((now_s() - t0) * 1e6 / 2);  // first 100: warm-up
  }
  waitpid(child, nullptr, 0);
  std::nth_element(half.begin(), half.begin() + half.size() / 2, half.end());
  std::printf("floor udp_pingpong_%zuB_half_rtt_us %.2f\n", size, half[half.size() / 2]);
  return 0;
}

// Adds up what `receive()` returns (bytes or datagrams; < 0 with errno EAGAIN when nothing
// is there) over `seconds` from the first arrival on (the first arrival only starts the
// clock), then kills and reaps `sender`. Returns the amount per second.
template <class Receive>
double receive_rate(pid_t sender, double seconds, const char* what, Receive&& receive) {
  uint64_t got = 0;
  double t0 = 0, t = 0;
  for (;;) {
    const ssize_t n = receive();
    t = now_s();
    if (n > 0) {
      if (t0 == 0)
        t0 = t;
      else
        got += uint64_t(n);
    }
    if (t0 != 0 && t - t0 >= seconds) break;
    if (n < 0 && errno != EAGAIN && errno != EINTR) die(what);
  }
  kill(sender, SIGKILL);
  waitpid(sender, nullptr, 0);
  return double(got) / (t - t0);
}

int stream(size_t seg, double seconds, bool gso) {
  int srv = bound_socket("127.0.20.1", 0, 8 << 20);
  int cli = bound_socket("127.0.20.2", 0, 8 << 20);
  connect_to(cli, addr_of(srv));
  if (gso) {
    int on = 1;
    setsockopt(srv, IPPROTO_UDP, UDP_GRO, &on, sizeof on);
  }
  pid_t child = fork();
  if (child == 0) {  // sender: runs until killed
    const size_t burst = gso ? (65000 / seg) * seg : seg;
    std::vector<char> buf(burst, 'x');
    if (gso) {
      int s = int(seg);
      setsockopt(cli, IPPROTO_UDP, UDP_SEGMENT, &s, sizeof s);
    }
    for (;;) (void)send(cli, buf.data(), burst, 0);
  }
  std::vector<char> buf(1 << 20);
  // Bytes that arrive within the window; the receiver's drops are the floor's own.
  const double bytes_per_s = receive_rate(
      child, seconds, "recv", [&] { return recv(srv, buf.data(), buf.size(), MSG_DONTWAIT); });
  std::printf("floor udp_stream_%s_%zuB_GBps %.3f\n", gso ? "gso" : "nogso", seg,
              bytes_per_s / 1e9);
  return 0;
}

int rate(size_t size, double seconds) {
  int srv = bound_socket("127.0.20.1", 0, 8 << 20);
  int cli = bound_socket("127.0.20.2", 0, 8 << 20);
  connect_to(cli, addr_of(srv));
  constexpr unsigned kBatch = 64;
  std::vector<char> buf(std::max<size_t>(size, 1) * kBatch, 'x');
  std::vector<iovec> iov(kBatch);
  std::vector<mmsghdr> msgs(kBatch);
  for (unsigned i = 0; i < kBatch; ++i) {
    iov[i] = {buf.data() + i * std::max<size_t>(size, 1), std::max<size_t>(size, 1)};
    msgs[i] = {};
    msgs[i].msg_hdr.msg_iov = &iov[i];
    msgs[i].msg_hdr.msg_iovlen = 1;
  }
  pid_t child = fork();
  if (child == 0) {  // sender: runs until killed
    for (;;) (void)sendmmsg(cli, msgs.data(), kBatch, 0);
  }
  const double datagrams_per_s = receive_rate(child, seconds, "recvmmsg", [&] {
    return ssize_t(recvmmsg(srv, msgs.data(), kBatch, MSG_DONTWAIT, nullptr));
  });
  std::printf("floor udp_rate_%zuB_Mpps %.3f\n", size, datagrams_per_s / 1e6);
  return 0;
}

int copy_rate(size_t block, double seconds) {
  const size_t set = size_t(64) << 20;
  if (block == 0 || block > set) {
    std::fprintf(stderr, "memcpy: BLOCK must be 1..%zu\n", set);
    return 2;
  }
  std::vector<char> src(set, 's'), dst(set, 'd');  // filled: every page is faulted in
  const size_t steps = set / block;
  uint64_t copies = 0;
  size_t i = 0;
  double t0 = now_s(), t = t0;
  while (t - t0 < seconds) {
    for (int k = 0; k < 64; ++k) {
      char* d = dst.data() + i * block;
      std::memcpy(d, src.data() + i * block, block);
      asm volatile("" : : "r"(d) : "memory");  // the copy is observed: never elided
      i = i + 1 == steps ? 0 : i + 1;
    }
    copies += 64;
    t = now_s();
  }
  std::printf("floor memcpy_%zuB_GBps %.3f\n", block,
              double(copies) * double(block) / (t - t0) / 1e9);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "pingpong")
    return pingpong(std::strtoul(argv[2], nullptr, 0), std::atoi(argv[3]));
  if (argc == 4 && (std::string(argv[1]) == "stream" || std::string(argv[1]) == "stream-nogso"))
    return stream(std::strtoul(argv[2], nullptr, 0), std::strtod(argv[3], nullptr),
                  std::string(argv[1]) == "stream");
  if (argc == 4 && std::string(argv[1]) == "rate")
    return rate(std::strtoul(argv[2], nullptr, 0), std::strtod(argv[3], nullptr));
  if (argc == 4 && std::string(argv[1]) == "memcpy")
    return copy_rate(std::strtoul(argv[2], nullptr, 0), std::strtod(argv[3], nullptr));
  std::fprintf(stderr,
               "usage: udp_floor pingpong SIZE ITERS | stream SEGMENT SECONDS | stream-nogso "
               "SEGMENT SECONDS | rate SIZE SECONDS | memcpy BLOCK SECONDS\n");
  return 2;
}
