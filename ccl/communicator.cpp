// Communicator: every entry point fills one CollectiveCall (collective_call.h), validated by
// check_call() and run by Impl::call() — sequence numbers and tags, the one-rank copy,
// algorithm selection and dispatch, error wrapping — with the registration cache and
// scratch; inside a group, call() defers it and group_end() issues the group (group.h).
// The algorithms themselves live one per file (algorithms.h).
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
#include <deque>
#include <stdexcept>
#include <string>
#include <vector>

#include "ccl/algorithms.h"
#include "ccl/ccl.h"
#include "ccl/collective_call.h"
#include "ccl/context.h"
#include "ccl/group.h"
#include "ccl/reduce.h"

namespace softrdma::ccl {

using detail::Collective;
using detail::Context;

namespace {

constexpr uint64_t kSeqMask = 0x7fffffffu;
constexpr uint64_t kPointToPoint = uint64_t{1} << 63;
constexpr size_t kRegistrationCacheEntries = 64;

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
  detail::Group group;
  // Site number of every rank (ranks with equal Config::site share one, numbered by first
  // appearance); empty until exchanged at the first AllReduce that needs it.
  std::vector<int> sites;
  int site_count = 0;
  // The names as exchanged: one slot of kSiteSlot bytes per rank, NUL-padded. A member, so
  // its registration stays valid in the cache for the communicator's life.
  std::vector<char> site_names;
  static constexpr size_t kSiteSlot = Config::kMaxSiteName + 1;
  // After a failure in the middle of an operation the ranks disagree about what was
  // transferred; like an NCCL communicator in error, this one refuses further work.
  bool failed = false;
  std::string failure;
  int failure_peer = -1;

  std::string prefix(const char* op) const {
    return std::string(op) + ": rank " + std::to_string(rank) + ": ";
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

  // Whether this AllReduce needs every rank's site first: the first AllReduce of every
  // communicator exchanges them, whatever this rank's settings — the exchange is collective,
  // so making it depend on SOFTRDMA_CCL_SITE would leave a rank that sets it waiting for
  // ranks that do not (one 64-byte-per-rank AllGather, once; not for 0 elements, which no
  // rank communicates for).
  bool needs_sites(const detail::CollectiveCall& c) const {
    return c.op == Collective::kAllReduce && c.count > 0 && size > 1 && sites.empty();
  }

  // AllGather (Bruck) of the fixed-size site names, in a collective of its own.
  void exchange_sites() {
    site_names.assign(static_cast<size_t>(size) * kSiteSlot, '\0');
    char* own = site_names.data() + static_cast<size_t>(rank) * kSiteSlot;
    std::memcpy(own, config.site.data(), config.site.size());
    Context ctx = collective("AllReduce");
    detail::all_gather_bruck(ctx, own, site_names.data(), kSiteSlot, DataType::kUint8);
    std::vector<std::string> names;
    sites.assign(static_cast<size_t>(size), 0);
    for (size_t q = 0; q < sites.size(); ++q) {
      const std::string name(site_names.data() + q * kSiteSlot);
      size_t id = 0;
      while (id < names.size() && names[id] != name) ++id;
      if (id == names.size()) names.push_back(name);
      sites[q] = static_cast<int>(id);
    }
    site_count = static_cast<int>(names.size());
  }

  /// The algorithm family for `c` (docs/collectives.md has the decision table): the ring
  /// (or chain) for large transfers, the log2(n)-message algorithms (recursive doubling,
  /// binomial trees, Bruck, recursive halving) below small_bytes or when some ranks would
  /// own no element, and for AllReduce with more than 2 ranks Rabenseifner in between (up to
  /// medium_bytes; with 2 ranks it moves what the ring moves, unpipelined, and measured 1.1–2×
  /// slower — bench/ccl_tune.sh, docs/collectives.md). Sizes are per rank's buffer, except
  /// AllGather / ReduceScatter: the whole n-block buffer.
  /// A forced SOFTRDMA_CCL_ALGO applies where the collective has that algorithm;
  /// rabenseifner elsewhere means auto.
  /// AllReduce runs hierarchically when forced, and under auto when the ranks span several
  /// sites and some site holds more than one rank (one rank per site gains nothing over the
  /// flat algorithms), whatever the size: the wide-area round trips dominate at every size.
  Algorithm pick(const detail::CollectiveCall& c) const {
    const bool has_rabenseifner = c.op == Collective::kAllReduce;
    if (has_rabenseifner && !sites.empty() &&
        (config.algorithm == Algorithm::kHierarchical ||
         (config.algorithm == Algorithm::kAuto && site_count > 1 && site_count < size)))
      return Algorithm::kHierarchical;
    if (config.algorithm != Algorithm::kAuto && config.algorithm != Algorithm::kHierarchical &&
        (config.algorithm != Algorithm::kRabenseifner || has_rabenseifner))
      return config.algorithm;
    const bool whole = c.op == Collective::kAllGather || c.op == Collective::kReduceScatter;
    const size_t bytes = whole ? c.total_bytes : c.block_bytes;
    if (bytes <= config.small_bytes || c.count < static_cast<size_t>(size))
      return Algorithm::kRecursiveDoubling;
    if (has_rabenseifner && size > 2 && bytes <= config.medium_bytes)
      return Algorithm::kRabenseifner;
    return Algorithm::kRing;
  }

  // Validates `c`, then runs it, or inside a group records it (an invalid call ends the
  // group: nothing of it was issued yet).
  void call(detail::CollectiveCall c) {
    if (!group.active()) {
      detail::check_call(c, rank, size);
      issue(c);
      return;
    }
    c.grouped = true;
    try {
      detail::check_call(c, rank, size);
    } catch (...) {
      group.abandon();
      throw;
    }
    group.defer(c);
  }

  // Runs a validated call: every collective takes the next sequence number (even with
  // count 0, so the ranks stay in step); a single rank copies send to recv; Send/Recv of 0
  // elements do nothing (the peer's matching call does nothing either).
  void issue(const detail::CollectiveCall& c) {
    const detail::CollectiveTraits& t = detail::traits(c.op);
    const char* op = t.name;
    if (t.point_to_point) {
      if (c.count == 0) return;
      auto& counters = c.op == Collective::kSend ? send_seq : recv_seq;
      run(op, [&] {
        Context ctx = point_to_point(op, counters[static_cast<size_t>(c.root)]);
        dispatch(ctx, c);
      });
      return;
    }
    run(op, [&] {
      if (needs_sites(c)) exchange_sites();
      Context ctx = collective(op);
      if (!t.moves_data) {
        if (size > 1) dispatch(ctx, c);
        return;
      }
      if (c.count == 0) return;
      if (size == 1) {
        if (c.send != c.recv) std::memcpy(c.recv, c.send, c.block_bytes);
        return;
      }
      dispatch(ctx, c);
    });
  }

  // Issues the calls of an outermost group (group.h): the collectives in call order, then
  // every Send/Recv at once, each with the sequence number of its pair taken in call order,
  // as if issued one by one.
  void issue_group(const std::vector<detail::CollectiveCall>& calls) {
    std::deque<detail::GroupedTransfer> transfers;
    for (const detail::CollectiveCall& c : calls) {
      if (!detail::traits(c.op).point_to_point) {
        issue(c);
      } else if (c.count != 0) {
        auto& counters = c.op == Collective::kSend ? send_seq : recv_seq;
        transfers.push_back({c, point_to_point("GroupEnd", counters[static_cast<size_t>(c.root)])});
      }
    }
    if (!transfers.empty())
      run("GroupEnd", [&] { detail::run_grouped_transfers(transfers, config); });
  }

  // The algorithm that runs `c` (size() >= 2, count >= 1 except for Barrier).
  void dispatch(Context& ctx, const detail::CollectiveCall& c) const {
    const Algorithm algo = pick(c);
    const bool ring = algo == Algorithm::kRing;
    switch (c.op) {
      case Collective::kAllReduce:
        if (algo == Algorithm::kHierarchical) {
          detail::all_reduce_hierarchical(ctx, sites, config.wan_compress, c.send, c.recv, c.count,
                                          c.type, c.red);
          return;
        }
        (ring ? detail::all_reduce_ring
         : algo == Algorithm::kRabenseifner
             ? detail::all_reduce_rabenseifner
             : detail::all_reduce_recursive_doubling)(ctx, c.send, c.recv, c.count, c.type, c.red);
        return;
      case Collective::kBroadcast:
        (ring ? detail::broadcast_chain : detail::broadcast_binomial)(ctx, c.send, c.recv, c.count,
                                                                      c.type, c.root);
        return;
      case Collective::kReduce:
        (ring ? detail::reduce_chain : detail::reduce_binomial)(ctx, c.send, c.recv, c.count,
                                                                c.type, c.red, c.root);
        return;
      case Collective::kAllGather:
        (ring ? detail::all_gather_ring : detail::all_gather_bruck)(ctx, c.send, c.recv, c.count,
                                                                    c.type);
        return;
      case Collective::kReduceScatter:
        (ring ? detail::reduce_scatter_ring : detail::reduce_scatter_recursive_halving)(
            ctx, c.send, c.recv, c.count, c.type, c.red);
        return;
      case Collective::kAllToAll:
        detail::all_to_all_pairwise(ctx, c.send, c.recv, c.count, c.type);
        return;
      case Collective::kSend:
        detail::send_direct(ctx, c.send, c.count, c.type, c.root);
        return;
      case Collective::kRecv:
        detail::recv_direct(ctx, c.recv, c.count, c.type, c.root);
        return;
      case Collective::kBarrier:
        detail::barrier_dissemination(ctx);
        return;
    }
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
  impl_->call({Collective::kAllReduce, send, recv, count, type, op, -1});
}

void Communicator::broadcast(const void* send, void* recv, size_t count, DataType type, int root) {
  impl_->call({Collective::kBroadcast, send, recv, count, type, RedOp::kSum, root});
}

void Communicator::reduce(const void* send, void* recv, size_t count, DataType type, RedOp op,
                          int root) {
  impl_->call({Collective::kReduce, send, recv, count, type, op, root});
}

void Communicator::all_gather(const void* send, void* recv, size_t count, DataType type) {
  impl_->call({Collective::kAllGather, send, recv, count, type, RedOp::kSum, -1});
}

void Communicator::reduce_scatter(const void* send, void* recv, size_t count, DataType type,
                                  RedOp op) {
  impl_->call({Collective::kReduceScatter, send, recv, count, type, op, -1});
}

void Communicator::all_to_all(const void* send, void* recv, size_t count, DataType type) {
  impl_->call({Collective::kAllToAll, send, recv, count, type, RedOp::kSum, -1});
}

void Communicator::send(const void* buf, size_t count, DataType type, int peer) {
  impl_->call({Collective::kSend, buf, nullptr, count, type, RedOp::kSum, peer});
}

void Communicator::recv(void* buf, size_t count, DataType type, int peer) {
  impl_->call({Collective::kRecv, nullptr, buf, count, type, RedOp::kSum, peer});
}

void Communicator::barrier() {
  impl_->call({Collective::kBarrier});
}

void Communicator::group_start() {
  impl_->group.start();
}

void Communicator::group_end() {
  std::vector<detail::CollectiveCall> calls;
  if (impl_->group.end(impl_->rank, calls)) impl_->issue_group(calls);
}

}  // namespace softrdma::ccl
