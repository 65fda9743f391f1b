// The bootstrap root (rendezvous server): BootstrapRoot of bootstrap.h. One thread serves one
// communicator: it accepts connections, takes one HELLO per rank, answers each exchange
// round once every rank sent its DATA, and exits when every rank said BYE — or, on the
// first fatal error (a rank missing at the deadline, out of step, gone mid-round), sends
// that error to every rank still connected and exits. Frames: bootstrap_wire.h.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "ccl/bootstrap.h"
#include "ccl/bootstrap_wire.h"

namespace softrdma::ccl {

using namespace bootstrap_wire;  // NOLINT(google-build-using-namespace): the protocol's names
using std::chrono::milliseconds;

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

  void serve();
  void finish() {
    std::lock_guard<std::mutex> g(mu);
    finished = true;
    cv.notify_all();
  }
};

namespace {

// "rank 3" / "ranks 1, 4, 5" (the first eight, then a count).
std::string ranks_text(const std::vector<int>& r) {
  std::string s = r.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < r.size(); ++i) {
    if (i == 8) return s + ", ... (" + std::to_string(r.size()) + " in all)";
    s += (i ? ", " : "") + std::to_string(r[i]);
  }
  return s;
}

// One serving of the root: its connections, the exchange round, and the first fatal error.
// run() is the loop; each of its steps is a method below.
class RootSession {
 public:
  RootSession(int listen_fd, uint64_t magic, const std::string& name, milliseconds timeout)
      : listen_fd_(listen_fd), magic_(magic), name_(name), timeout_(timeout) {}

  // Serves until every rank said goodbye or a fatal error; then tells the ranks still
  // connected and closes their connections (not the listening socket).
  void run() {
    for (;;) {
      if (nranks_ > 0) {
        if (all_ranks([](const Conn& c) { return c.bye; })) break;
        if (all_ranks([](const Conn& c) { return c.has_data; })) {
          if (!answer_round()) break;
          continue;
        }
      }
      std::vector<pollfd> pf = wait_for_activity();
      if (deadline_ != Clock::time_point::max() && Clock::now() >= deadline_) {
        fatal_ = deadline_error();
        break;
      }
      if (pf[0].revents & POLLIN) accept_connection();
      for (size_t i = 0; i < conns_.size() && fatal_.empty(); ++i) {
        const Conn& c = conns_[i];
        if (c.fd < 0 || i + 1 >= pf.size() || !(pf[i + 1].revents & (POLLIN | POLLHUP | POLLERR)))
          continue;
        read_connection(i);
      }
      if (fatal_.empty() && nranks_ > 0) check_rank_left_mid_round();
      if (!fatal_.empty()) break;
    }
    shut_down();
  }

 private:
  struct Conn {
    int fd = -1;
    FrameReader in;
    int rank = -1;  // after a valid HELLO
    bool has_data = false;
    std::string data;
    bool bye = false;
  };

  std::string prefix() const { return "bootstrap root " + name_ + ": "; }

  // True when every rank has connected and satisfies `pred`.
  template <class Pred>
  bool all_ranks(Pred pred) const {
    for (int r = 0; r < nranks_; ++r) {
      const int i = by_rank_[r];
      if (i < 0 || !pred(conns_[i])) return false;
    }
    return true;
  }

  // Every rank sent its DATA: send each the gathered reply and start the next round.
  // False (with fatal_ set) when a rank cannot be written to.
  bool answer_round() {
    std::string reply;
    for (int r = 0; r < nranks_; ++r) {
      const Conn& c = conns_[by_rank_[r]];
      put_u32(reply, static_cast<uint32_t>(c.data.size()));
      reply += c.data;
    }
    const std::string f = frame(kData, reply);
    for (int r = 0; r < nranks_; ++r) {
      Conn& c = conns_[by_rank_[r]];
      c.has_data = false;
      c.data.clear();
      if (!send_all(c.fd, f, Clock::now() + timeout_)) {
        fatal_ = prefix() + "cannot send to rank " + std::to_string(r);
        return false;
      }
    }
    ++round_;
    deadline_ = Clock::now() + timeout_;
    return true;
  }

  // Polls the listening socket and every open connection, at most 1 s or until the
  // deadline. Entry 0 is the listening socket, entry i + 1 connection i.
  std::vector<pollfd> wait_for_activity() {
    std::vector<pollfd> pf;
    pf.push_back({listen_fd_, POLLIN, 0});
    for (const Conn& c : conns_)
      pf.push_back({c.fd, static_cast<short>(c.fd >= 0 ? POLLIN : 0), 0});
    const int wait_ms =
        deadline_ == Clock::time_point::max() ? 1000 : std::min(1000, remaining_ms(deadline_));
    ::poll(pf.data(), pf.size(), clock::to_real_timeout_ms(wait_ms));
    return pf;
  }

  // The deadline passed: name the ranks that never connected, or those that did not send
  // this round's DATA.
  std::string deadline_error() const {
    std::vector<int> absent, idle;
    int connected = 0;
    for (int r = 0; r < nranks_; ++r) {
      const int i = by_rank_[r];
      if (i < 0) {
        absent.push_back(r);
      } else {
        ++connected;
        if (!conns_[i].has_data && !conns_[i].bye) idle.push_back(r);
      }
    }
    if (!absent.empty())
      return prefix() + "did not hear from " + ranks_text(absent) + " within " + ms_text(timeout_) +
             " (" + std::to_string(connected) + " of " + std::to_string(nranks_) +
             " ranks connected)";
    return prefix() + ranks_text(idle) + " connected but did not reach exchange round " +
           std::to_string(round_ + 1) + " within " + ms_text(timeout_);
  }

  void accept_connection() {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    Conn c;
    c.fd = fd;
    conns_.push_back(std::move(c));
  }

  // Reads what connection i sent and acts on each whole frame; then handles a malformed
  // stream or a closed connection.
  void read_connection(size_t i) {
    Conn& c = conns_[i];
    const bool open = c.in.fill(c.fd);
    uint32_t type = 0;
    std::string payload;
    bool malformed = false;
    while (fatal_.empty() && c.fd >= 0 && c.in.next(type, payload, malformed)) {
      if (c.rank < 0) {
        if (!on_hello(i, type, payload)) break;
      } else {
        on_frame(c, type, payload);
      }
    }
    if (!fatal_.empty()) return;
    if (malformed) {
      if (c.rank >= 0)
        fatal_ = prefix() + "malformed message from rank " + std::to_string(c.rank);
      else
        drop(i);
    } else if (!open && c.fd >= 0) {
      if (c.rank >= 0 && !c.bye)
        fatal_ = prefix() + "rank " + std::to_string(c.rank) +
                 " disconnected during the exchange (did it exit?)";
      drop(i);
    }
  }

  // The first frame of connection i must be a valid HELLO of this job; the first valid one
  // fixes the job's size. False when the connection was refused (and dropped).
  bool on_hello(size_t i, uint32_t type, const std::string& payload) {
    Conn& c = conns_[i];
    if (type != kHello || payload.size() != 16) {
      drop(i);
      return false;
    }
    const uint64_t magic_in = get_u64(payload.data());
    const int n = static_cast<int>(get_u32(payload.data() + 8));
    const int r = static_cast<int>(get_u32(payload.data() + 12));
    std::string why;
    if (magic_in != magic_)
      why = "job token mismatch (a rank of another job, or a stale id?)";
    else if (n <= 0 || (nranks_ > 0 && n != nranks_))
      why = "rank " + std::to_string(r) + " says the job has " + std::to_string(n) +
            " ranks, others said " + std::to_string(nranks_);
    else if (r < 0 || r >= n)
      why = "rank " + std::to_string(r) + " out of range [0, " + std::to_string(n) + ")";
    else if (nranks_ > 0 && by_rank_[r] >= 0)
      why = "rank " + std::to_string(r) + " connected twice";
    if (!why.empty()) {
      send_to(c, kError, prefix() + "refused: " + why);
      drop(i);
      return false;
    }
    if (nranks_ < 0) {
      nranks_ = n;
      by_rank_.assign(n, -1);
      deadline_ = Clock::now() + timeout_;
    }
    c.rank = r;
    by_rank_[r] = static_cast<int>(i);
    return true;
  }

  // A frame from a rank after its HELLO: this round's DATA, or BYE between rounds.
  void on_frame(Conn& c, uint32_t type, std::string& payload) {
    if (type == kData && !c.has_data && !c.bye) {
      c.has_data = true;
      c.data = std::move(payload);
    } else if (type == kBye && !c.has_data) {
      c.bye = true;
    } else {
      fatal_ = prefix() + "rank " + std::to_string(c.rank) +
               " is out of step with the others (round " + std::to_string(round_ + 1) + ")";
    }
  }

  // A rank that says goodbye while others wait in a round failed on its side.
  void check_rank_left_mid_round() {
    std::vector<int> left, waiting;
    for (int r = 0; r < nranks_; ++r) {
      const int i = by_rank_[r];
      if (i >= 0 && conns_[i].bye) left.push_back(r);
      if (i >= 0 && conns_[i].has_data) waiting.push_back(r);
    }
    if (!left.empty() && !waiting.empty())
      fatal_ = prefix() + ranks_text(left) + " left during exchange round " +
               std::to_string(round_ + 1) + " while " + ranks_text(waiting) +
               " waited (see the error of the rank that left)";
  }

  // Tells every rank still connected the fatal error (if any) and closes every connection.
  void shut_down() {
    if (!fatal_.empty())
      for (Conn& c : conns_)
        if (c.fd >= 0 && !c.bye) send_to(c, kError, fatal_);
    for (size_t i = 0; i < conns_.size(); ++i) drop(i);
  }

  void send_to(Conn& c, uint32_t type, const std::string& payload) {
    if (c.fd >= 0) send_all(c.fd, frame(type, payload), Clock::now() + timeout_);
  }
  void drop(size_t i) {
    if (conns_[i].fd >= 0) ::close(conns_[i].fd);
    conns_[i].fd = -1;
  }

  const int listen_fd_;
  const uint64_t magic_;
  const std::string name_;
  const milliseconds timeout_;
  std::vector<Conn> conns_;
  int nranks_ = -1;
  std::vector<int> by_rank_;  // rank → index in conns_, -1 before its HELLO
  int round_ = 0;
  Clock::time_point deadline_ = Clock::time_point::max();
  std::string fatal_;
};

}  // namespace

void BootstrapRoot::State::serve() {
  RootSession(listen_fd, magic, name, timeout).run();
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
    clock::wait_for(state_->cv, g, state_->timeout + milliseconds(1000),
                    [&] { return state_->finished; });
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

}  // namespace softrdma::ccl
