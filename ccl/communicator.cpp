// Communicator: argument validation (ccl.h), algorithm selection, operation sequence
// numbers and tags, the registration cache and scratch, and error wrapping. The algorithms
// themselves live one per file (algorithms.h).
//
// Tags (64 bits, unique per ordered pair of ranks among transfers in flight):
//   bit 63       0 for collectives, 1 for Send/Recv
//   bits 32..62  sequence number: of the collective (every rank counts the collectives it
//                called; they are called in the same order everywhere), or of the Send/Recv
//                between this ordered pair of ranks
//   bits 24..31  phase within the algorithm
//   bits 0..23   transfer index within the phase (mod 2^24; at most 2·depth of them are in
//                flight per pair at a time)
// so consecutive operations never match each other's transfers.
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "ccl/algorithms.h"
#include "ccl/ccl.h"
#include "ccl/context.h"
#include "ccl/reduce.h"

namespace softrdma::ccl {

using detail::Context;

namespace {

constexpr uint64_t kSeqMask = 0x7fffffffu;
constexpr uint64_t kPointToPoint = uint64_t{1} << 63;
constexpr size_t kRegistrationCacheEntries = 64;

bool valid(DataType t) {
  return static_cast<unsigned>(t) <= static_cast<unsigned>(DataType::kFloat64);
}
bool valid(RedOp op) {
  return static_cast<unsigned>(op) <= static_cast<unsigned>(RedOp::kAvg);
}

bool overlap(const void* a, size_t an, const void* b, size_t bn) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return x < y + bn && y < x + an;
}

}  // namespace

struct Communicator::Impl {
  Impl(std::unique_ptr<Transport> transport, const Config& c)
      : t(std::move(transport)),
        config(c),
        rank(t->rank()),
        size(t->size()),
        cache(*t, kRegistrationCacheEntries),
        scratch(*t),
        send_seq(static_cast<size_t>(size), 0),
        recv_seq(static_cast<size_t>(size), 0) {}

  // Declared first: destroyed last, after every Buffer registered with it.
  std::unique_ptr<Transport> t;
  Config config;
  int rank;
  int size;
  detail::RegistrationCache cache;
  detail::ScratchArena scratch;
  uint64_t seq = 0;
  std::vector<uint64_t> send_seq;
  std::vector<uint64_t> recv_seq;
  // After a failure in the middle of an operation the ranks disagree about what was
  // transferred; like an NCCL communicator in error, this one refuses further work.
  bool failed = false;
  std::string failure;
  int failure_peer = -1;

  std::string prefix(const char* op) const {
    return std::string(op) + ": rank " + std::to_string(rank) + ": ";
  }
  [[noreturn]] void invalid(const char* op, const std::string& what) const {
    throw std::invalid_argument(prefix(op) + what);
  }
  void require(bool ok, const char* op, const char* what) const {
    if (!ok) invalid(op, what);
  }
  // Validates type (and op) and returns count·n·type_size bytes, refusing overflow.
  size_t bytes(const char* op, size_t count, DataType type, size_t n = 1) const {
    if (!valid(type))
      invalid(op, "unknown DataType value " + std::to_string(static_cast<int>(type)));
    const size_t ts = type_size(type);
    if (count != 0 && (n > SIZE_MAX / count || count * n > SIZE_MAX / ts))
      invalid(op,
              "count " + std::to_string(count) + " of " + type_name(type) + " overflows size_t");
    return count * n * ts;
  }
  void check_op(const char* op, RedOp r) const {
    if (!valid(r)) invalid(op, "unknown RedOp value " + std::to_string(static_cast<int>(r)));
  }
  void check_rank(const char* op, int r, const char* what) const {
    if (r < 0 || r >= size)
      invalid(op, std::string(what) + " " + std::to_string(r) + " out of range [0, " +
                      std::to_string(size) + ")");
  }

  Context collective(const char* op) {
    const uint64_t s = seq++ & kSeqMask;
    return Context(*t, config, cache, scratch, op, s << 32);
  }
  Context point_to_point(const char* op, uint64_t& counter) {
    const uint64_t s = counter++ & kSeqMask;
    return Context(*t, config, cache, scratch, op, kPointToPoint | (s << 32));
  }

  // Runs the communicating part of `op`; a failure leaves this communicator unusable and
  // a PeerError is reworded to start with "<op>: rank <r>: " (transports that already name
  // the operation are left as they are), keeping peer().
  template <class F>
  void run(const char* op, F&& body) {
    if (failed)
      throw PeerError(prefix(op) + "communicator unusable after an earlier failure: " + failure,
                      failure_peer);
    try {
      body();
    } catch (const PeerError& e) {
      std::string msg = e.what();
      const std::string full = prefix(op);
      const std::string local = "rank " + std::to_string(rank) + ": ";
      if (msg.rfind(full, 0) != 0)
        msg = (msg.rfind(local, 0) == 0 ? std::string(op) + ": " : full) + msg;
      failed = true;
      failure = msg;
      failure_peer = e.peer();
      throw PeerError(msg, e.peer());
    } catch (const std::exception& e) {
      failed = true;
      failure = prefix(op) + e.what();
      failure_peer = -1;
      throw;
    }
  }

  /// The algorithm for a collective of `bytes` (`count` elements per rank's block);
  /// `rabenseifner`: the collective has a Rabenseifner variant (AllReduce).
  Algorithm pick(size_t bytes, size_t count, bool rabenseifner = false) const {
    if (config.algorithm != Algorithm::kAuto &&
        (config.algorithm != Algorithm::kRabenseifner || rabenseifner))
      return config.algorithm;
    // A ring moves data in ~2n messages per rank: below small_bytes, or when some ranks
    // would own no element, the log2(n)-message algorithms win. Between small_bytes and
    // medium_bytes Rabenseifner moves the ring's bytes in 2·log2(n) messages.
    if (bytes <= config.small_bytes || count < static_cast<size_t>(size))
      return Algorithm::kRecursiveDoubling;
    if (rabenseifner && bytes <= config.medium_bytes) return Algorithm::kRabenseifner;
    return Algorithm::kRing;
  }
};

Communicator::Communicator(std::unique_ptr<Transport> transport, Config config) {
  if (!transport) throw std::invalid_argument("Communicator: null transport");
  detail::validate_config(config);
  if (transport->size() < 1 || transport->rank() < 0 || transport->rank() >= transport->size())
    throw std::invalid_argument("Communicator: transport reports rank " +
                                std::to_string(transport->rank()) + " of size " +
                                std::to_string(transport->size()));
  impl_ = std::make_unique<Impl>(std::move(transport), config);
}

Communicator::~Communicator() = default;

int Communicator::rank() const {
  return impl_->rank;
}
int Communicator::size() const {
  return impl_->size;
}
Transport& Communicator::transport() {
  return *impl_->t;
}

void Communicator::all_reduce(const void* send, void* recv, size_t count, DataType type, RedOp op) {
  static constexpr const char* kOp = "AllReduce";
  Impl& m = *impl_;
  const size_t bytes = m.bytes(kOp, count, type);
  m.check_op(kOp, op);
  if (count != 0) {
    m.require(send != nullptr && recv != nullptr, kOp, "null buffer");
    m.require(send == recv || !overlap(send, bytes, recv, bytes), kOp,
              "send and recv buffers overlap without being the same (in place)");
  }
  m.run(kOp, [&] {
    Context ctx = m.collective(kOp);
    if (count == 0) return;
    if (m.size == 1) {
      if (send != recv) std::memcpy(recv, send, bytes);
      return;
    }
    switch (m.pick(bytes, count, /*rabenseifner=*/true)) {
      case Algorithm::kRing:
        detail::all_reduce_ring(ctx, send, recv, count, type, op);
        break;
      case Algorithm::kRabenseifner:
        detail::all_reduce_rabenseifner(ctx, send, recv, count, type, op);
        break;
      default:
        detail::all_reduce_recursive_doubling(ctx, send, recv, count, type, op);
        break;
    }
  });
}

void Communicator::broadcast(const void* send, void* recv, size_t count, DataType type, int root) {
  static constexpr const char* kOp = "Broadcast";
  Impl& m = *impl_;
  const size_t bytes = m.bytes(kOp, count, type);
  m.check_rank(kOp, root, "root");
  if (count != 0) {
    m.require(recv != nullptr, kOp, "null recv buffer");
    if (m.rank == root) {
      m.require(send != nullptr, kOp, "null send buffer on the root");
      m.require(send == recv || !overlap(send, bytes, recv, bytes), kOp,
                "send and recv buffers overlap without being the same (in place)");
    }
  }
  m.run(kOp, [&] {
    Context ctx = m.collective(kOp);
    if (count == 0) return;
    if (m.size == 1) {
      if (send != recv) std::memcpy(recv, send, bytes);
      return;
    }
    if (m.pick(bytes, count) == Algorithm::kRing)
      detail::broadcast_chain(ctx, send, recv, count, type, root);
    else
      detail::broadcast_binomial(ctx, send, recv, count, type, root);
  });
}

void Communicator::reduce(const void* send, void* recv, size_t count, DataType type, RedOp op,
                          int root) {
  static constexpr const char* kOp = "Reduce";
  Impl& m = *impl_;
  const size_t bytes = m.bytes(kOp, count, type);
  m.check_op(kOp, op);
  m.check_rank(kOp, root, "root");
  if (count != 0) {
    m.require(send != nullptr, kOp, "null send buffer");
    if (m.rank == root) {
      m.require(recv != nullptr, kOp, "null recv buffer on the root");
      m.require(send == recv || !overlap(send, bytes, recv, bytes), kOp,
                "send and recv buffers overlap without being the same (in place)");
    }
  }
  m.run(kOp, [&] {
    Context ctx = m.collective(kOp);
    if (count == 0) return;
    if (m.size == 1) {
      if (send != recv) std::memcpy(recv, send, bytes);
      return;
    }
    if (m.pick(bytes, count) == Algorithm::kRing)
      detail::reduce_chain(ctx, send, recv, count, type, op, root);
    else
      detail::reduce_binomial(ctx, send, recv, count, type, op, root);
  });
}

void Communicator::all_gather(const void* send, void* recv, size_t count, DataType type) {
  static constexpr const char* kOp = "AllGather";
  Impl& m = *impl_;
  const size_t total = m.bytes(kOp, count, type, static_cast<size_t>(m.size));
  const size_t bytes = count * type_size(type);
  if (count != 0) {
    m.require(send != nullptr && recv != nullptr, kOp, "null buffer");
    const void* own = static_cast<const char*>(recv) + static_cast<size_t>(m.rank) * bytes;
    m.require(send == own || !overlap(send, bytes, recv, total), kOp,
              "send buffer overlaps recv without being recv + rank·count (in place)");
  }
  m.run(kOp, [&] {
    Context ctx = m.collective(kOp);
    if (count == 0) return;
    if (m.size == 1) {
      if (send != recv) std::memcpy(recv, send, bytes);
      return;
    }
    if (m.pick(total, count) == Algorithm::kRing)
      detail::all_gather_ring(ctx, send, recv, count, type);
    else
      detail::all_gather_bruck(ctx, send, recv, count, type);
  });
}

void Communicator::reduce_scatter(const void* send, void* recv, size_t count, DataType type,
                                  RedOp op) {
  static constexpr const char* kOp = "ReduceScatter";
  Impl& m = *impl_;
  const size_t total = m.bytes(kOp, count, type, static_cast<size_t>(m.size));
  const size_t bytes = count * type_size(type);
  m.check_op(kOp, op);
  if (count != 0) {
    m.require(send != nullptr && recv != nullptr, kOp, "null buffer");
    const void* own = static_cast<const char*>(send) + static_cast<size_t>(m.rank) * bytes;
    m.require(recv == own || !overlap(send, total, recv, bytes), kOp,
              "recv buffer overlaps send without being send + rank·count (in place)");
  }
  m.run(kOp, [&] {
    Context ctx = m.collective(kOp);
    if (count == 0) return;
    if (m.size == 1) {
      if (send != recv) std::memcpy(recv, send, bytes);
      return;
    }
    if (m.pick(total, count) == Algorithm::kRing)
      detail::reduce_scatter_ring(ctx, send, recv, count, type, op);
    else
      detail::reduce_scatter_recursive_halving(ctx, send, recv, count, type, op);
  });
}

void Communicator::all_to_all(const void* send, void* recv, size_t count, DataType type) {
  static constexpr const char* kOp = "AllToAll";
  Impl& m = *impl_;
  const size_t total = m.bytes(kOp, count, type, static_cast<size_t>(m.size));
  if (count != 0) {
    m.require(send != nullptr && recv != nullptr, kOp, "null buffer");
    m.require(send == recv || !overlap(send, total, recv, total), kOp,
              "send and recv buffers overlap without being the same (in place)");
  }
  m.run(kOp, [&] {
    Context ctx = m.collective(kOp);
    if (count == 0) return;
    if (m.size == 1) {
      if (send != recv) std::memcpy(recv, send, total);
      return;
    }
    detail::all_to_all_pairwise(ctx, send, recv, count, type);
  });
}

void Communicator::send(const void* buf, size_t count, DataType type, int peer) {
  static constexpr const char* kOp = "Send";
  Impl& m = *impl_;
  m.bytes(kOp, count, type);
  m.check_rank(kOp, peer, "peer");
  m.require(peer != m.rank, kOp, "peer is this rank (a blocking send to itself never completes)");
  if (count != 0) m.require(buf != nullptr, kOp, "null buffer");
  if (count == 0) return;  // matched by the peer's recv of 0 elements, which also does nothing
  m.run(kOp, [&] {
    Context ctx = m.point_to_point(kOp, m.send_seq[static_cast<size_t>(peer)]);
    detail::send_direct(ctx, buf, count, type, peer);
  });
}

void Communicator::recv(void* buf, size_t count, DataType type, int peer) {
  static constexpr const char* kOp = "Recv";
  Impl& m = *impl_;
  m.bytes(kOp, count, type);
  m.check_rank(kOp, peer, "peer");
  m.require(peer != m.rank, kOp, "peer is this rank (a blocking recv from itself never completes)");
  if (count != 0) m.require(buf != nullptr, kOp, "null buffer");
  if (count == 0) return;
  m.run(kOp, [&] {
    Context ctx = m.point_to_point(kOp, m.recv_seq[static_cast<size_t>(peer)]);
    detail::recv_direct(ctx, buf, count, type, peer);
  });
}

void Communicator::barrier() {
  static constexpr const char* kOp = "Barrier";
  Impl& m = *impl_;
  m.run(kOp, [&] {
    Context ctx = m.collective(kOp);
    if (m.size > 1) detail::barrier_dissemination(ctx);
  });
}

}  // namespace softrdma::ccl
