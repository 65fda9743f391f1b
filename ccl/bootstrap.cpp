// TCP bootstrap: a root that all-gathers one blob per rank per round, and the launchers'
// environments. See bootstrap.h.
//
// Wire protocol (TCP, every frame = u32 type + u32 length, network byte order, then
// `length` bytes):
//   client → root  HELLO {u64 magic, u32 nranks, u32 rank}   once, first
//   client → root  DATA  {bytes}                             one per all_gather round
//   root → client  DATA  {n × (u32 length, bytes)}           when every rank sent its DATA
//   client → root  BYE   {}                                  done; the root exits after all
//   root → client  ERROR {text}                              the job failed; the root exits
#include "ccl/bootstrap.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "ccl/verbs_transport.h"

namespace softrdma::ccl {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

enum Frame : uint32_t { kHello = 1, kData = 2, kBye = 3, kError = 4 };
constexpr uint32_t kMaxFrame = 64u << 20;

std::string ms_text(milliseconds t) {
  return std::to_string(t.count()) + " ms";
}

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1000000000));
}

void put_u32(std::string& s, uint32_t v) {
  v = htonl(v);
  s.append(reinterpret_cast<const char*>(&v), 4);
}
uint32_t get_u32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return ntohl(v);
}
void put_u64(std::string& s, uint64_t v) {
  put_u32(s, static_cast<uint32_t>(v >> 32));
  put_u32(s, static_cast<uint32_t>(v));
}
uint64_t get_u64(const char* p) {
  return (static_cast<uint64_t>(get_u32(p)) << 32) | get_u32(p + 4);
}

std::string frame(uint32_t type, const std::string& payload) {
  std::string s;
  put_u32(s, type);
  put_u32(s, static_cast<uint32_t>(payload.size()));
  return s + payload;
}

// Writes all of `data` before `deadline`. Returns false on error or timeout.
bool write_all(int fd, const std::string& data, Clock::time_point deadline) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int left = remaining_ms(deadline);
      if (left == 0) return false;
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, left);
      continue;
    }
    return false;
  }
  return true;
}

// Accumulates bytes and splits frames.
struct FrameReader {
  std::string buf;
  // Returns true and fills type/payload when a whole frame is buffered.
  bool next(uint32_t& type, std::string& payload, bool& malformed) {
    malformed = false;
    if (buf.size() < 8) return false;
    const uint32_t len = get_u32(buf.data() + 4);
    if (len > kMaxFrame) {
      malformed = true;
      return false;
    }
    if (buf.size() < 8 + static_cast<size_t>(len)) return false;
    type = get_u32(buf.data());
    payload.assign(buf, 8, len);
    buf.erase(0, 8 + static_cast<size_t>(len));
    return true;
  }
  // Reads what is available; returns false on EOF or error.
  bool fill(int fd) {
    char tmp[65536];
    for (;;) {
      ssize_t n = ::recv(fd, tmp, sizeof tmp, MSG_DONTWAIT);
      if (n > 0) {
        buf.append(tmp, static_cast<size_t>(n));
        if (static_cast<size_t>(n) < sizeof tmp) return true;
        continue;
      }
      if (n == 0) return false;
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
  }
};

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

long parse_long(const char* name, const char* v, long lo, long hi) {
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v, &end, 10);
  if (errno || end == v || *end || x < lo || x > hi)
    throw BootstrapError(std::string(name) + ": expected an integer in [" + std::to_string(lo) +
                         ", " + std::to_string(hi) + "], got '" + v + "'");
  return x;
}

// "host:port" → host, port (the last ':' splits).
void parse_host_port(const char* name, const std::string& s, std::string& host, uint16_t& port) {
  auto c = s.rfind(':');
  if (c == std::string::npos || c == 0 || c + 1 == s.size())
    throw BootstrapError(std::string(name) + ": expected host:port, got '" + s + "'");
  host = s.substr(0, c);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  port = static_cast<uint16_t>(parse_long(name, s.c_str() + c + 1, 1, 65535));
}

std::string ranks_text(const std::vector<int>& r) {
  std::string s = r.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < r.size(); ++i) {
    if (i == 8) return s + ", ... (" + std::to_string(r.size()) + " in all)";
    s += (i ? ", " : "") + std::to_string(r[i]);
  }
  return s;
}

// The address make_unique_id() advertises.
std::string pick_host() {
  if (const char* h = env("SOFTRDMA_CCL_HOST")) return h;
  const char* want = env("SOFTRDMA_CCL_SOCKET_IFNAME");
  std::string found;
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) == 0) {
    for (ifaddrs* i = ifs; i && found.empty(); i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
      if (want ? std::strcmp(i->ifa_name, want) != 0 : (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
      if (!want && std::strncmp(i->ifa_name, "docker", 6) == 0) continue;
      char buf[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof buf);
      found = buf;
    }
    freeifaddrs(ifs);
  }
  if (found.empty() && want)
    throw BootstrapError(std::string("SOFTRDMA_CCL_SOCKET_IFNAME: no up IPv4 interface '") + want +
                         "'");
  return found.empty() ? "127.0.0.1" : found;
}

}  // namespace

std::chrono::milliseconds bootstrap_timeout() {
  const char* v = env("SOFTRDMA_CCL_BOOTSTRAP_TIMEOUT_MS");
  if (!v) return milliseconds(30000);
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v, &end, 10);
  if (errno || end == v || *end || x < 1 || x > 86400000)
    throw std::invalid_argument(
        std::string("SOFTRDMA_CCL_BOOTSTRAP_TIMEOUT_MS: expected milliseconds in [1, 86400000], "
                    "got '") +
        v + "'");
  return milliseconds(x);
}

// ---- root ---------------------------------------------------------------------------------

struct BootstrapRoot::State {
  int listen_fd = -1;
  uint16_t port = 0;
  uint64_t magic = 0;
  std::string name;  // "host:port" for messages
  milliseconds timeout{30000};
  std::thread thread;
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;

  struct Conn {
    int fd = -1;
    FrameReader in;
    int rank = -1;  // after a valid HELLO
    bool has_data = false;
    std::string data;
    bool bye = false;
  };

  void serve();
  void finish() {
    std::lock_guard<std::mutex> g(mu);
    finished = true;
    cv.notify_all();
  }
};

void BootstrapRoot::State::serve() {
  std::vector<Conn> conns;
  int nranks = -1;
  std::vector<int> by_rank;  // rank → index in conns, -1 before its HELLO
  int round = 0;
  Clock::time_point deadline = Clock::time_point::max();
  std::string fatal;

  auto send_to = [&](Conn& c, uint32_t type, const std::string& payload) {
    if (c.fd >= 0) write_all(c.fd, frame(type, payload), Clock::now() + timeout);
  };
  auto drop = [&](size_t i) {
    if (conns[i].fd >= 0) ::close(conns[i].fd);
    conns[i].fd = -1;
  };

  for (;;) {
    // Round complete?
    if (nranks > 0) {
      bool all_data = true, all_bye = true;
      for (int r = 0; r < nranks; ++r) {
        const int i = by_rank[r];
        all_data = all_data && i >= 0 && conns[i].has_data;
        all_bye = all_bye && i >= 0 && conns[i].bye;
      }
      if (all_bye) break;
      if (all_data) {
        std::string reply;
        for (int r = 0; r < nranks; ++r) {
          Conn& c = conns[by_rank[r]];
          put_u32(reply, static_cast<uint32_t>(c.data.size()));
          reply += c.data;
        }
        const std::string f = frame(kData, reply);
        for (int r = 0; r < nranks; ++r) {
          Conn& c = conns[by_rank[r]];
          c.has_data = false;
          c.data.clear();
          if (!write_all(c.fd, f, Clock::now() + timeout)) {
            fatal = "bootstrap root " + name + ": cannot send to rank " + std::to_string(r);
            break;
          }
        }
        if (!fatal.empty()) break;
        ++round;
        deadline = Clock::now() + timeout;
        continue;
      }
    }

    std::vector<pollfd> pf;
    pf.push_back({listen_fd, POLLIN, 0});
    for (const Conn& c : conns) pf.push_back({c.fd, static_cast<short>(c.fd >= 0 ? POLLIN : 0), 0});
    int wait_ms =
        deadline == Clock::time_point::max() ? 1000 : std::min(1000, remaining_ms(deadline));
    ::poll(pf.data(), pf.size(), wait_ms);

    if (deadline != Clock::time_point::max() && Clock::now() >= deadline) {
      std::vector<int> absent, idle;
      int connected = 0;
      for (int r = 0; r < nranks; ++r) {
        const int i = by_rank[r];
        if (i < 0) {
          absent.push_back(r);
        } else {
          ++connected;
          if (!conns[i].has_data && !conns[i].bye) idle.push_back(r);
        }
      }
      if (!absent.empty())
        fatal = "bootstrap root " + name + ": did not hear from " + ranks_text(absent) +
                " within " + ms_text(timeout) + " (" + std::to_string(connected) + " of " +
                std::to_string(nranks) + " ranks connected)";
      else
        fatal = "bootstrap root " + name + ": " + ranks_text(idle) +
                " connected but did not reach exchange round " + std::to_string(round + 1) +
                " within " + ms_text(timeout);
      break;
    }

    if (pf[0].revents & POLLIN) {
      int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        Conn c;
        c.fd = fd;
        conns.push_back(std::move(c));
      }
    }
    for (size_t i = 0; i < conns.size() && fatal.empty(); ++i) {
      Conn& c = conns[i];
      if (c.fd < 0 || i + 1 >= pf.size() || !(pf[i + 1].revents & (POLLIN | POLLHUP | POLLERR)))
        continue;
      const bool open = c.in.fill(c.fd);
      uint32_t type = 0;
      std::string payload;
      bool malformed = false;
      while (fatal.empty() && c.fd >= 0 && c.in.next(type, payload, malformed)) {
        if (c.rank < 0) {
          // Must be a valid HELLO of this job.
          if (type != kHello || payload.size() != 16) {
            drop(i);
            break;
          }
          const uint64_t magic_in = get_u64(payload.data());
          const int n = static_cast<int>(get_u32(payload.data() + 8));
          const int r = static_cast<int>(get_u32(payload.data() + 12));
          std::string why;
          if (magic_in != magic)
            why = "job token mismatch (a rank of another job, or a stale id?)";
          else if (n <= 0 || (nranks > 0 && n != nranks))
            why = "rank " + std::to_string(r) + " says the job has " + std::to_string(n) +
                  " ranks, others said " + std::to_string(nranks);
          else if (r < 0 || r >= n)
            why = "rank " + std::to_string(r) + " out of range [0, " + std::to_string(n) + ")";
          else if (nranks > 0 && by_rank[r] >= 0)
            why = "rank " + std::to_string(r) + " connected twice";
          if (!why.empty()) {
            send_to(c, kError, "bootstrap root " + name + ": refused: " + why);
            drop(i);
            break;
          }
          if (nranks < 0) {
            nranks = n;
            by_rank.assign(n, -1);
            deadline = Clock::now() + timeout;
          }
          c.rank = r;
          by_rank[r] = static_cast<int>(i);
        } else if (type == kData && !c.has_data && !c.bye) {
          c.has_data = true;
          c.data = std::move(payload);
        } else if (type == kBye && !c.has_data) {
          c.bye = true;
        } else {
          fatal = "bootstrap root " + name + ": rank " + std::to_string(c.rank) +
                  " is out of step with the others (round " + std::to_string(round + 1) + ")";
        }
      }
      if (!fatal.empty()) break;
      if (malformed) {
        if (c.rank >= 0)
          fatal =
              "bootstrap root " + name + ": malformed message from rank " + std::to_string(c.rank);
        else
          drop(i);
      } else if (!open && c.fd >= 0) {
        if (c.rank >= 0 && !c.bye)
          fatal = "bootstrap root " + name + ": rank " + std::to_string(c.rank) +
                  " disconnected during the exchange (did it exit?)";
        drop(i);
      }
    }
    if (fatal.empty() && nranks > 0) {
      // A rank that says goodbye while others wait in a round failed on its side.
      std::vector<int> left, waiting;
      for (int r = 0; r < nranks; ++r) {
        const int i = by_rank[r];
        if (i >= 0 && conns[i].bye) left.push_back(r);
        if (i >= 0 && conns[i].has_data) waiting.push_back(r);
      }
      if (!left.empty() && !waiting.empty())
        fatal = "bootstrap root " + name + ": " + ranks_text(left) +
                " left during exchange round " + std::to_string(round + 1) + " while " +
                ranks_text(waiting) + " waited (see the error of the rank that left)";
    }
    if (!fatal.empty()) break;
  }

  if (!fatal.empty())
    for (Conn& c : conns)
      if (c.fd >= 0 && !c.bye) send_to(c, kError, fatal);
  for (size_t i = 0; i < conns.size(); ++i) drop(i);
  ::close(listen_fd);
  listen_fd = -1;
  finish();
}

BootstrapRoot::BootstrapRoot(std::shared_ptr<State> s) : state_(std::move(s)) {}

std::unique_ptr<BootstrapRoot> BootstrapRoot::start(uint16_t port, uint64_t magic,
                                                    const std::string& advertised_host,
                                                    std::chrono::milliseconds timeout) {
  auto s = std::make_shared<State>();
  s->magic = magic;
  s->timeout = timeout;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) throw BootstrapError("bootstrap root: socket: " + std::string(strerror(errno)));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(port);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 1024) != 0) {
    int e = errno;
    ::close(fd);
    throw BootstrapError("bootstrap root: cannot listen on TCP port " + std::to_string(port) +
                         ": " + strerror(e) +
                         (e == EADDRINUSE ? " (another job there? set SOFTRDMA_CCL_MASTER or "
                                            "another MASTER_PORT)"
                                          : ""));
  }
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  s->listen_fd = fd;
  s->port = ntohs(a.sin_port);
  s->name = advertised_host + ":" + std::to_string(s->port);
  s->thread = std::thread([s] { s->serve(); });
  return std::unique_ptr<BootstrapRoot>(new BootstrapRoot(s));
}

BootstrapRoot::~BootstrapRoot() {
  if (!state_ || !state_->thread.joinable()) return;
  {
    std::unique_lock<std::mutex> g(state_->mu);
    state_->cv.wait_for(g, state_->timeout + milliseconds(1000), [&] { return state_->finished; });
  }
  // The thread owns a reference to the state: detaching is safe if it is still running.
  if (state_->finished)
    state_->thread.join();
  else
    state_->thread.detach();
}

uint16_t BootstrapRoot::port() const {
  return state_->port;
}

void BootstrapRoot::detach() {
  if (state_ && state_->thread.joinable()) state_->thread.detach();
}

// ---- client -------------------------------------------------------------------------------

std::unique_ptr<TcpBootstrap> TcpBootstrap::connect(const std::string& host, uint16_t port,
                                                    uint64_t magic, int rank, int nranks,
                                                    std::chrono::milliseconds timeout) {
  if (nranks < 1 || rank < 0 || rank >= nranks)
    throw std::invalid_argument("bootstrap: rank " + std::to_string(rank) + " of " +
                                std::to_string(nranks) + " ranks");
  const std::string root = host + ":" + std::to_string(port);
  const std::string me = "rank " + std::to_string(rank);
  const auto deadline = Clock::now() + timeout;
  std::string last_error = "no attempt";
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    int g = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (g != 0) {
      last_error = std::string("cannot resolve '") + host + "': " + gai_strerror(g);
    } else {
      for (addrinfo* ai = res; ai; ai = ai->ai_next) {
        int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
          last_error = strerror(errno);
          continue;
        }
        int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
          pollfd p{fd, POLLOUT, 0};
          ::poll(&p, 1, std::max(1, std::min(1000, remaining_ms(deadline))));
          int err = ETIMEDOUT;
          socklen_t el = sizeof err;
          if (p.revents) getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
          rc = err ? -1 : 0;
          errno = err;
        }
        if (rc == 0) {
          freeaddrinfo(res);
          int one = 1;
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          std::string hello;
          put_u64(hello, magic);
          put_u32(hello, static_cast<uint32_t>(nranks));
          put_u32(hello, static_cast<uint32_t>(rank));
          if (!write_all(fd, frame(kHello, hello), deadline)) {
            ::close(fd);
            throw BootstrapError(me + ": cannot send to the bootstrap root " + root);
          }
          return std::unique_ptr<TcpBootstrap>(new TcpBootstrap(fd, root, rank, nranks, timeout));
        }
        last_error = strerror(errno);
        ::close(fd);
      }
      freeaddrinfo(res);
    }
    if (Clock::now() >= deadline)
      throw BootstrapError(me + ": cannot reach the bootstrap root " + root + " within " +
                           ms_text(timeout) + ": " + last_error);
    std::this_thread::sleep_for(milliseconds(std::min(100, remaining_ms(deadline) + 1)));
  }
}

TcpBootstrap::~TcpBootstrap() {
  if (fd_ >= 0) {
    write_all(fd_, frame(kBye, ""), Clock::now() + milliseconds(1000));
    ::close(fd_);
  }
}

std::vector<std::string> TcpBootstrap::all_gather(const std::string& mine) {
  const std::string me = "rank " + std::to_string(rank_);
  if (!write_all(fd_, frame(kData, mine), Clock::now() + timeout_))
    throw BootstrapError(me + ": cannot send to the bootstrap root " + root_ + " (did it exit?)");
  // The root reports missing ranks after its own timeout: wait a little longer than it.
  const auto deadline = Clock::now() + timeout_ + milliseconds(5000);
  FrameReader in;
  for (;;) {
    uint32_t type = 0;
    std::string payload;
    bool malformed = false;
    if (in.next(type, payload, malformed)) {
      if (type == kError) throw BootstrapError(payload);
      if (type != kData) throw BootstrapError(me + ": unexpected message from " + root_);
      std::vector<std::string> out;
      size_t off = 0;
      for (int r = 0; r < size_; ++r) {
        if (payload.size() - off < 4) throw BootstrapError(me + ": truncated reply from " + root_);
        const uint32_t len = get_u32(payload.data() + off);
        off += 4;
        if (payload.size() - off < len)
          throw BootstrapError(me + ": truncated reply from " + root_);
        out.emplace_back(payload, off, len);
        off += len;
      }
      return out;
    }
    if (malformed) throw BootstrapError(me + ": malformed reply from " + root_);
    const int left = remaining_ms(deadline);
    if (left == 0)
      throw BootstrapError(me + ": no answer from the bootstrap root " + root_ + " within " +
                           ms_text(timeout_ + milliseconds(5000)) +
                           " (waiting for the other ranks)");
    pollfd p{fd_, POLLIN, 0};
    ::poll(&p, 1, std::min(left, 1000));
    if (p.revents && !in.fill(fd_) && in.buf.size() < 8)
      throw BootstrapError(me + ": the bootstrap root " + root_ + " closed the connection");
  }
}

// ---- unique id ----------------------------------------------------------------------------

std::string UniqueId::to_string() const {
  return std::string(bytes.data(), strnlen(bytes.data(), bytes.size()));
}

UniqueId UniqueId::from_string(const std::string& s) {
  auto c2 = s.rfind(':');
  auto c1 = c2 == std::string::npos || c2 == 0 ? std::string::npos : s.rfind(':', c2 - 1);
  if (c1 == std::string::npos || c1 == 0 || s.size() >= 128 || s.size() - c2 - 1 != 16)
    throw std::invalid_argument("UniqueId: expected host:port:token (16 hex digits), got '" + s +
                                "'");
  const std::string port = s.substr(c1 + 1, c2 - c1 - 1);
  const std::string token = s.substr(c2 + 1);
  char* end = nullptr;
  long p = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end || p < 1 || p > 65535 ||
      token.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
    throw std::invalid_argument("UniqueId: malformed port or token in '" + s + "'");
  UniqueId id;
  std::memcpy(id.bytes.data(), s.data(), s.size());
  return id;
}

std::string UniqueId::host() const {
  const std::string s = to_string();
  auto c2 = s.rfind(':');
  auto c1 = s.rfind(':', c2 - 1);
  return s.substr(0, c1);
}

uint16_t UniqueId::port() const {
  const std::string s = to_string();
  auto c2 = s.rfind(':');
  auto c1 = s.rfind(':', c2 - 1);
  return static_cast<uint16_t>(std::stoul(s.substr(c1 + 1, c2 - c1 - 1)));
}

uint64_t UniqueId::token() const {
  const std::string s = to_string();
  return std::stoull(s.substr(s.rfind(':') + 1), nullptr, 16);
}

UniqueId make_unique_id() {
  const std::string host = pick_host();
  std::random_device rd;
  const uint64_t token = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  auto root = BootstrapRoot::start(0, token, host, bootstrap_timeout());
  char buf[128];
  std::snprintf(buf, sizeof buf, "%s:%u:%016llx", host.c_str(), root->port(),
                static_cast<unsigned long long>(token));
  root->detach();
  return UniqueId::from_string(buf);
}

// ---- launchers ----------------------------------------------------------------------------

LaunchInfo launch_info() {
  LaunchInfo info;
  std::string job;  // job identity: token and (mpirun/Slurm) derived port
  bool one_host = true;
  if (env("RANK") && env("WORLD_SIZE")) {
    info.launcher = "torchrun";
    info.size = static_cast<int>(parse_long("WORLD_SIZE", env("WORLD_SIZE"), 1, 1 << 20));
    info.rank = static_cast<int>(parse_long("RANK", env("RANK"), 0, info.size - 1));
    info.local_rank =
        env("LOCAL_RANK")
            ? static_cast<int>(parse_long("LOCAL_RANK", env("LOCAL_RANK"), 0, 1 << 20))
            : -1;
    if (!env("SOFTRDMA_CCL_MASTER")) {
      if (!env("MASTER_ADDR") || !env("MASTER_PORT"))
        throw BootstrapError(
            "torchrun environment: RANK and WORLD_SIZE are set but MASTER_ADDR / MASTER_PORT "
            "are not (or set SOFTRDMA_CCL_MASTER=host:port)");
      info.master_host = env("MASTER_ADDR");
      const long port = parse_long("MASTER_PORT", env("MASTER_PORT"), 1, 65534);
      info.master_port = static_cast<uint16_t>(port + 1);
    }
    job = std::string("torchrun:") +
          (env("TORCHELASTIC_RUN_ID") ? env("TORCHELASTIC_RUN_ID") : "") + ":" +
          (env("MASTER_ADDR") ? env("MASTER_ADDR") : "") + ":" +
          (env("MASTER_PORT") ? env("MASTER_PORT") : "");
  } else if (env("OMPI_COMM_WORLD_SIZE") && (env("OMPI_COMM_WORLD_RANK") || env("PMIX_RANK"))) {
    info.launcher = "mpirun";
    info.size = static_cast<int>(
        parse_long("OMPI_COMM_WORLD_SIZE", env("OMPI_COMM_WORLD_SIZE"), 1, 1 << 20));
    const char* rn = env("OMPI_COMM_WORLD_RANK") ? "OMPI_COMM_WORLD_RANK" : "PMIX_RANK";
    info.rank = static_cast<int>(parse_long(rn, env(rn), 0, info.size - 1));
    info.local_rank =
        env("OMPI_COMM_WORLD_LOCAL_RANK")
            ? static_cast<int>(parse_long("OMPI_COMM_WORLD_LOCAL_RANK",
                                          env("OMPI_COMM_WORLD_LOCAL_RANK"), 0, 1 << 20))
            : -1;
    if (const char* ls = env("OMPI_COMM_WORLD_LOCAL_SIZE"))
      one_host = parse_long("OMPI_COMM_WORLD_LOCAL_SIZE", ls, 1, 1 << 20) == info.size;
    for (const char* k : {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid"})
      if (env(k)) {
        job = std::string("mpirun:") + env(k);
        break;
      }
  } else if (env("SLURM_PROCID") && env("SLURM_NTASKS")) {
    info.launcher = "slurm";
    info.size = static_cast<int>(parse_long("SLURM_NTASKS", env("SLURM_NTASKS"), 1, 1 << 20));
    info.rank = static_cast<int>(parse_long("SLURM_PROCID", env("SLURM_PROCID"), 0, info.size - 1));
    info.local_rank =
        env("SLURM_LOCALID")
            ? static_cast<int>(parse_long("SLURM_LOCALID", env("SLURM_LOCALID"), 0, 1 << 20))
            : -1;
    const char* nn = env("SLURM_NNODES") ? env("SLURM_NNODES") : env("SLURM_JOB_NUM_NODES");
    if (nn) one_host = parse_long("SLURM_NNODES", nn, 1, 1 << 20) == 1;
    if (env("SLURM_JOB_ID"))
      job = std::string("slurm:") + env("SLURM_JOB_ID") + "." +
            (env("SLURM_STEP_ID") ? env("SLURM_STEP_ID") : "");
  } else {
    info.launcher = "none";
    info.rank = 0;
    info.size = 1;
    info.local_rank = 0;
    return info;
  }

  if (const char* m = env("SOFTRDMA_CCL_MASTER")) {
    parse_host_port("SOFTRDMA_CCL_MASTER", m, info.master_host, info.master_port);
  } else if (info.launcher != "torchrun") {
    if (!one_host)
      throw BootstrapError(info.launcher +
                           ": ranks on several hosts: set SOFTRDMA_CCL_MASTER=host:port (rank "
                           "0's host and a free TCP port) for the bootstrap rendezvous");
    if (job.empty())
      throw BootstrapError(info.launcher +
                           ": no job id in the environment (PMIX_NAMESPACE, "
                           "OMPI_MCA_ess_base_jobid, SLURM_JOB_ID): set "
                           "SOFTRDMA_CCL_MASTER=host:port");
    info.master_host = "127.0.0.1";
    info.master_port = static_cast<uint16_t>(10000 + fnv1a(job) % 20000);
  }
  info.magic = fnv1a(job + ":" + std::to_string(info.size));
  return info;
}

std::unique_ptr<Transport> connect_transport(const UniqueId& id, int nranks, int rank) {
  const auto timeout = bootstrap_timeout();
  const VerbsOptions opt = VerbsOptions::from_environment();
  auto boot = TcpBootstrap::connect(id.host(), id.port(), id.token(), rank, nranks, timeout);
  std::unique_ptr<Transport> t = VerbsTransport::connect(*boot, opt);
  boot.reset();  // goodbye to the root
  return t;
}

std::unique_ptr<Communicator> init_rank(const UniqueId& id, int nranks, int rank, Config config) {
  return std::make_unique<Communicator>(connect_transport(id, nranks, rank), config);
}

std::unique_ptr<Transport> connect_transport_from_environment(const LaunchInfo& info) {
  const VerbsOptions opt = VerbsOptions::from_environment();
  if (info.size == 1) {
    SingleRankBootstrap single;
    return VerbsTransport::connect(single, opt);
  }
  const auto timeout = bootstrap_timeout();
  std::unique_ptr<BootstrapRoot> root;
  if (info.rank == 0)
    root = BootstrapRoot::start(info.master_port, info.magic, info.master_host, timeout);
  auto boot = TcpBootstrap::connect(info.master_host, info.master_port, info.magic, info.rank,
                                    info.size, timeout);
  std::unique_ptr<Transport> t = VerbsTransport::connect(*boot, opt);
  boot.reset();
  root.reset();  // rank 0: waits for the root to see every goodbye
  return t;
}

std::unique_ptr<Communicator> init_from_environment(Config config) {
  return std::make_unique<Communicator>(connect_transport_from_environment(launch_info()), config);
}

}  // namespace softrdma::ccl
