#include "ccl/loopback_transport.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "base/clock.h"

namespace softrdma::ccl {

namespace detail {

using Clock = clock::Steady;  // virtual under time dilation (base/clock.h)

struct LoopbackRequest {
  enum class Status : uint8_t { kPending, kDone, kFailed };
  int src = 0;
  int dst = 0;
  uint64_t tag = 0;
  char* data = nullptr;
  size_t bytes = 0;
  bool is_send = false;
  Status status = Status::kPending;
  std::string error;  // without the "<op>: rank <r>: " prefix
  int error_peer = -1;
  int owner() const { return is_send ? src : dst; }
  int peer() const { return is_send ? dst : src; }
};

// Everything shared by the ranks of one fabric, guarded by `mu`.
struct LoopbackState {
  using Key = std::tuple<int, int, uint64_t>;  // (src, dst, tag)
  using Pending = std::map<Key, std::shared_ptr<LoopbackRequest>>;

  LoopbackState(int size, std::chrono::milliseconds t)
      : n(size),
        timeout(t),
        dead(static_cast<size_t>(size), 0),
        closed(static_cast<size_t>(size), 0),
        taken(static_cast<size_t>(size), 0),
        activity(static_cast<size_t>(size), Clock::now()),
        registrations(static_cast<size_t>(size), 0),
        live(static_cast<size_t>(size), 0),
        transfers(static_cast<size_t>(size) * static_cast<size_t>(size), 0),
        barrier_in(static_cast<size_t>(size), 0) {
    for (int i = 0; i < size; ++i) cv.push_back(std::make_unique<std::condition_variable>());
  }

  std::mutex mu;
  int n;
  std::chrono::milliseconds timeout;
  std::vector<std::unique_ptr<std::condition_variable>> cv;  // one per rank
  std::vector<uint8_t> dead;
  std::vector<uint8_t> closed;
  std::vector<uint8_t> taken;
  std::vector<Clock::time_point> activity;  // last transport call of each rank
  std::vector<uint64_t> registrations;
  std::vector<uint64_t> live;
  std::vector<uint64_t> transfers;  // [src·n + dst]
  uint64_t path_bytes = 0;          // what every transport's path_bytes() says
  Pending sends;
  Pending recvs;
  uint64_t barrier_gen = 0;
  int barrier_count = 0;
  std::vector<uint8_t> barrier_in;
  Clock::time_point barrier_last = Clock::now();

  static std::string describe(int rank) { return "rank " + std::to_string(rank) + " (loopback)"; }

  bool gone(int rank) const {
    return dead[static_cast<size_t>(rank)] != 0 || closed[static_cast<size_t>(rank)] != 0;
  }
  std::string gone_reason(int rank) const {
    return "peer " + describe(rank) +
           (dead[static_cast<size_t>(rank)] != 0 ? ": killed" : ": closed its transport");
  }

  static void fail(LoopbackRequest& r, std::string why, int peer) {
    r.status = LoopbackRequest::Status::kFailed;
    r.error = std::move(why);
    r.error_peer = peer;
  }

  // Fails and unlinks the pending requests `pred` selects. Caller notifies.
  template <class Pred, class Why>
  void fail_pending(Pred pred, Why why) {
    for (Pending* m : {&sends, &recvs}) {
      for (auto it = m->begin(); it != m->end();) {
        LoopbackRequest& r = *it->second;
        if (pred(r)) {
          auto [msg, peer] = why(r);
          fail(r, std::move(msg), peer);
          it = m->erase(it);
        } else {
          ++it;
        }
      }
    }
  }

  // After `rank` died or closed: everything pending that involves it fails.
  void fail_involving(int rank) {
    const std::string reason = gone_reason(rank);
    fail_pending([&](const LoopbackRequest& r) { return r.src == rank || r.dst == rank; },
                 [&](const LoopbackRequest& r) {
                   return r.owner() == rank ? std::make_pair(std::string("this rank is gone"), rank)
                                            : std::make_pair(reason, rank);
                 });
  }

  // After a failed wait of `rank`: its other pending transfers are withdrawn, so no late
  // match writes into buffers the failed operation's caller may release.
  void withdraw(int rank) {
    fail_pending([&](const LoopbackRequest& r) { return r.owner() == rank; },
                 [&](const LoopbackRequest& r) {
                   return std::make_pair(std::string("withdrawn after an earlier failure"),
                                         r.peer());
                 });
  }

  void notify_all() {
    for (auto& c : cv) c->notify_all();
  }
};

}  // namespace detail

namespace {

using detail::Clock;
using detail::LoopbackRequest;
using detail::LoopbackState;

class LoopbackBuffer : public Buffer {
 public:
  LoopbackBuffer(void* data, size_t bytes, std::shared_ptr<LoopbackState> s, int rank)
      : data_(data), bytes_(bytes), s_(std::move(s)), rank_(rank) {}
  ~LoopbackBuffer() override {
    std::lock_guard lk(s_->mu);
    --s_->live[static_cast<size_t>(rank_)];
  }
  void* data() const override { return data_; }
  size_t size() const override { return bytes_; }

 private:
  void* data_;
  size_t bytes_;
  std::shared_ptr<LoopbackState> s_;
  int rank_;
};

class LoopbackTransport : public Transport {
 public:
  LoopbackTransport(std::shared_ptr<LoopbackState> s, int rank) : s_(std::move(s)), rank_(rank) {}

  ~LoopbackTransport() override {
    std::lock_guard lk(s_->mu);
    s_->closed[idx(rank_)] = 1;
    s_->fail_involving(rank_);
    s_->notify_all();
  }

  int rank() const override { return rank_; }
  int size() const override { return s_->n; }
  std::string peer_description(int peer) const override { return LoopbackState::describe(peer); }
  std::chrono::milliseconds timeout() const override {
    std::lock_guard lk(s_->mu);
    return s_->timeout;
  }

  uint64_t path_bytes(int /*peer*/) const override {
    std::lock_guard lk(s_->mu);
    return s_->path_bytes;
  }

  std::unique_ptr<Buffer> register_buffer(void* data, size_t bytes) override {
    if (data == nullptr && bytes != 0)
      throw std::invalid_argument("LoopbackTransport: register_buffer of a null pointer");
    std::lock_guard lk(s_->mu);
    check_alive();
    touch();
    ++s_->registrations[idx(rank_)];
    ++s_->live[idx(rank_)];
    return std::make_unique<LoopbackBuffer>(data, bytes, s_, rank_);
  }

  RequestId send(int peer, const Buffer& buf, size_t offset, size_t bytes, uint64_t tag) override {
    return post(true, peer, buf, offset, bytes, tag);
  }
  RequestId recv(int peer, Buffer& buf, size_t offset, size_t bytes, uint64_t tag) override {
    return post(false, peer, buf, offset, bytes, tag);
  }

  void wait(RequestId id, const char* op) override {
    auto it = find(id);
    const std::shared_ptr<LoopbackRequest> req = it->second;
    std::unique_lock lk(s_->mu);
    touch();
    const Clock::time_point start = Clock::now();
    for (;;) {
      if (finished(it, *req, op)) return;
      const int peer = req->peer();
      const Clock::time_point deadline = std::max(start, s_->activity[idx(peer)]) + s_->timeout;
      if (Clock::now() >= deadline) {
        const std::string why = "peer " + LoopbackState::describe(peer) + ": no progress within " +
                                std::to_string(s_->timeout.count()) + " ms";
        s_->withdraw(rank_);  // includes req
        reqs_.erase(it);
        throw PeerError(prefix(op) + why, peer);
      }
      clock::wait_until(*s_->cv[idx(rank_)], lk, deadline);
    }
  }

  bool test(RequestId id, const char* op) override {
    auto it = find(id);
    const std::shared_ptr<LoopbackRequest> req = it->second;
    std::unique_lock lk(s_->mu);
    touch();
    return finished(it, *req, op);
  }

  void barrier(const char* op) override {
    std::unique_lock lk(s_->mu);
    check_alive();
    touch();
    const uint64_t gen = s_->barrier_gen;
    const Clock::time_point start = Clock::now();
    s_->barrier_in[idx(rank_)] = 1;
    s_->barrier_last = start;
    if (++s_->barrier_count == s_->n) {
      s_->barrier_count = 0;
      std::fill(s_->barrier_in.begin(), s_->barrier_in.end(), 0);
      ++s_->barrier_gen;
      s_->notify_all();
      return;
    }
    for (;;) {
      if (s_->barrier_gen != gen) return;
      int missing = -1;
      for (int p = 0; p < s_->n; ++p) {
        if (s_->barrier_in[idx(p)] != 0) continue;
        if (missing < 0) missing = p;
        if (s_->gone(p)) {
          leave_barrier();
          throw PeerError(prefix(op) + s_->gone_reason(p), p);
        }
      }
      const Clock::time_point deadline = std::max(start, s_->barrier_last) + s_->timeout;
      if (Clock::now() >= deadline) {
        leave_barrier();
        throw PeerError(prefix(op) + "peer " + LoopbackState::describe(missing) +
                            ": did not reach the barrier within " +
                            std::to_string(s_->timeout.count()) + " ms",
                        missing);
      }
      clock::wait_until(*s_->cv[idx(rank_)], lk, deadline);
    }
  }

 private:
  using Map = std::unordered_map<RequestId, std::shared_ptr<LoopbackRequest>>;

  static size_t idx(int rank) { return static_cast<size_t>(rank); }
  std::string prefix(const char* op) const {
    return std::string(op) + ": rank " + std::to_string(rank_) + ": ";
  }
  // Caller holds the lock.
  void touch() { s_->activity[idx(rank_)] = Clock::now(); }
  void check_alive() const {
    if (s_->dead[idx(rank_)] != 0)
      throw PeerError("rank " + std::to_string(rank_) + ": this rank was killed", rank_);
  }
  void leave_barrier() {
    s_->barrier_in[idx(rank_)] = 0;
    --s_->barrier_count;
  }

  Map::iterator find(RequestId id) {
    auto it = reqs_.find(id);
    if (it == reqs_.end())
      throw std::invalid_argument("LoopbackTransport: unknown or already completed request " +
                                  std::to_string(id));
    return it;
  }

  // Caller holds the lock. True (and forgets the request) once it completed; throws its
  // PeerError once it failed.
  bool finished(Map::iterator it, LoopbackRequest& req, const char* op) {
    if (req.status == LoopbackRequest::Status::kPending) {
      if (s_->dead[idx(rank_)] != 0) {
        s_->fail_involving(rank_);
      } else if (s_->gone(req.peer())) {
        s_->fail_involving(req.peer());
        s_->notify_all();
      }
    }
    switch (req.status) {
      case LoopbackRequest::Status::kPending:
        return false;
      case LoopbackRequest::Status::kDone:
        reqs_.erase(it);
        return true;
      case LoopbackRequest::Status::kFailed:
        break;
    }
    const std::string msg = prefix(op) + req.error;
    const int peer = req.error_peer;
    s_->withdraw(rank_);
    reqs_.erase(it);
    throw PeerError(msg, peer);
  }

  RequestId post(bool is_send, int peer, const Buffer& buf, size_t offset, size_t bytes,
                 uint64_t tag) {
    const char* what = is_send ? "send" : "recv";
    if (peer < 0 || peer >= s_->n)
      throw std::invalid_argument(std::string("LoopbackTransport: ") + what + " to rank " +
                                  std::to_string(peer) + " of " + std::to_string(s_->n));
    if (dynamic_cast<const LoopbackBuffer*>(&buf) == nullptr)
      throw std::invalid_argument("LoopbackTransport: buffer not registered with this transport");
    if (offset > buf.size() || bytes > buf.size() - offset)
      throw std::invalid_argument(std::string("LoopbackTransport: ") + what + " of " +
                                  std::to_string(bytes) + " bytes at offset " +
                                  std::to_string(offset) + " outside a buffer of " +
                                  std::to_string(buf.size()));
    auto req = std::make_shared<LoopbackRequest>();
    req->src = is_send ? rank_ : peer;
    req->dst = is_send ? peer : rank_;
    req->tag = tag;
    req->data = static_cast<char*>(buf.data()) + offset;
    req->bytes = bytes;
    req->is_send = is_send;

    std::lock_guard lk(s_->mu);
    check_alive();
    touch();
    if (s_->gone(peer)) {
      LoopbackState::fail(*req, s_->gone_reason(peer), peer);
    } else {
      const LoopbackState::Key key{req->src, req->dst, tag};
      LoopbackState::Pending& mine = is_send ? s_->sends : s_->recvs;
      LoopbackState::Pending& other = is_send ? s_->recvs : s_->sends;
      if (mine.count(key) != 0)
        throw std::invalid_argument(std::string("LoopbackTransport: ") + what + " tag " +
                                    std::to_string(tag) + (is_send ? " to" : " from") + " rank " +
                                    std::to_string(peer) + " is still in flight");
      auto match = other.find(key);
      if (match == other.end()) {
        mine.emplace(key, req);
      } else {
        complete(is_send ? *req : *match->second, is_send ? *match->second : *req);
        other.erase(match);
      }
    }
    const RequestId id = next_id_++;
    reqs_.emplace(id, std::move(req));
    return id;
  }

  // Caller holds the lock: the rendezvous of a matching send and recv.
  void complete(LoopbackRequest& s, LoopbackRequest& r) {
    if (s.bytes != r.bytes) {
      const std::string why = "message size mismatch: rank " + std::to_string(s.src) + " sends " +
                              std::to_string(s.bytes) + " bytes, rank " + std::to_string(r.dst) +
                              " receives " + std::to_string(r.bytes) + " (tag " +
                              std::to_string(s.tag) + ")";
      LoopbackState::fail(s, why, r.dst);
      LoopbackState::fail(r, why, s.src);
    } else {
      if (s.bytes != 0) std::memcpy(r.data, s.data, s.bytes);
      s.status = LoopbackRequest::Status::kDone;
      r.status = LoopbackRequest::Status::kDone;
      ++s_->transfers[idx(s.src) * idx(s_->n) + idx(s.dst)];
    }
    s_->cv[idx(s.src)]->notify_all();
    s_->cv[idx(r.dst)]->notify_all();
  }

  std::shared_ptr<LoopbackState> s_;
  int rank_;
  RequestId next_id_ = 1;
  Map reqs_;
};

}  // namespace

LoopbackFabric::LoopbackFabric(int size, std::chrono::milliseconds timeout) {
  if (size < 1) throw std::invalid_argument("LoopbackFabric: size must be at least 1");
  if (timeout.count() <= 0) throw std::invalid_argument("LoopbackFabric: timeout must be positive");
  state_ = std::make_shared<LoopbackState>(size, timeout);
}

LoopbackFabric::~LoopbackFabric() = default;

int LoopbackFabric::size() const {
  return state_->n;
}

std::unique_ptr<Transport> LoopbackFabric::transport(int rank) {
  if (rank < 0 || rank >= state_->n)
    throw std::invalid_argument("LoopbackFabric: rank " + std::to_string(rank) + " out of range");
  std::lock_guard lk(state_->mu);
  if (state_->taken[static_cast<size_t>(rank)] != 0)
    throw std::logic_error("LoopbackFabric: transport of rank " + std::to_string(rank) +
                           " already taken");
  state_->taken[static_cast<size_t>(rank)] = 1;
  state_->activity[static_cast<size_t>(rank)] = Clock::now();
  return std::make_unique<LoopbackTransport>(state_, rank);
}

void LoopbackFabric::kill(int rank) {
  if (rank < 0 || rank >= state_->n)
    throw std::invalid_argument("LoopbackFabric: rank " + std::to_string(rank) + " out of range");
  std::lock_guard lk(state_->mu);
  state_->dead[static_cast<size_t>(rank)] = 1;
  state_->fail_involving(rank);
  state_->notify_all();
}

void LoopbackFabric::set_timeout(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) throw std::invalid_argument("LoopbackFabric: timeout must be positive");
  std::lock_guard lk(state_->mu);
  state_->timeout = timeout;
  state_->notify_all();
}

uint64_t LoopbackFabric::registrations(int rank) const {
  std::lock_guard lk(state_->mu);
  return state_->registrations.at(static_cast<size_t>(rank));
}

uint64_t LoopbackFabric::live_buffers(int rank) const {
  std::lock_guard lk(state_->mu);
  return state_->live.at(static_cast<size_t>(rank));
}

uint64_t LoopbackFabric::transfers(int src, int dst) const {
  std::lock_guard lk(state_->mu);
  return state_->transfers.at(static_cast<size_t>(src) * static_cast<size_t>(state_->n) +
                              static_cast<size_t>(dst));
}

void LoopbackFabric::set_path_bytes(uint64_t bytes) {
  std::lock_guard lk(state_->mu);
  state_->path_bytes = bytes;
}

uint64_t LoopbackFabric::posted_recvs(int src, int dst) const {
  std::lock_guard lk(state_->mu);
  uint64_t n = 0;
  for (const auto& [key, req] : state_->recvs)
    if (std::get<0>(key) == src && std::get<1>(key) == dst) ++n;
  return n;
}

}  // namespace softrdma::ccl
