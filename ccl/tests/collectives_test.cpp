// Correctness of every collective against a locally computed reference, over
// LoopbackTransport with one thread per rank.
//
// Matrix (CollectiveTest): collective × ranks {1, 2, 3, 4, 8} × algorithm {ring, rd,
// rabenseifner, auto};
// inside each case every data type × every op (where the collective reduces) × in place /
// out of place × count {0, 1, 1001} runs as consecutive calls on the same communicators,
// which also checks that consecutive operations never cross-match. The ring configuration
// uses 256-byte chunks and depth 3 so that 1001 elements make multi-chunk segments; auto
// uses 1 KiB chunks, a 2 KiB small_bytes and a 4 KiB medium_bytes threshold so all three of
// its AllReduce choices occur (1001 elements of 1–2 / 4 / 8 bytes).
// LargeTest: ≥ 16M elements for a few collectives and types (memory bounded: 2–4 ranks,
// int8/float32).
//
// Tolerances (test_util.h reference()): integer results and float max/min exact; float
// sum/avg/prod within (n+1)·ε of the sum of input magnitudes (prod: of |result|), ε = 1e-3
// (float16), 8e-3 (bfloat16), 1e-6 (float32), 1e-14 (float64) — each reduction hop rounds
// once in the wire type.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "ccl/tests/test_util.h"

namespace softrdma::ccl {
namespace {

using testing::Expected;
using testing::gen;
using testing::gen_stored;
using testing::kAllOps;
using testing::kAllTypes;
using testing::load;
using testing::reference;
using testing::run_ranks;
using testing::store;

enum class Coll {
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kSendRecv,
  kBarrier
};

const char* coll_name(Coll c) {
  switch (c) {
    case Coll::kAllReduce:
      return "AllReduce";
    case Coll::kBroadcast:
      return "Broadcast";
    case Coll::kReduce:
      return "Reduce";
    case Coll::kAllGather:
      return "AllGather";
    case Coll::kReduceScatter:
      return "ReduceScatter";
    case Coll::kAllToAll:
      return "AllToAll";
    case Coll::kSendRecv:
      return "SendRecv";
    case Coll::kBarrier:
      return "Barrier";
  }
  return "?";
}

Config config_for(Algorithm a) {
  Config c;
  c.algorithm = a;
  switch (a) {
    case Algorithm::kRing:
      c.chunk_bytes = 256;
      c.depth = 3;
      break;
    case Algorithm::kRecursiveDoubling:
      c.chunk_bytes = 512;
      c.depth = 2;
      break;
    case Algorithm::kRabenseifner:
    case Algorithm::kHierarchical:
      c.chunk_bytes = 512;
      c.depth = 2;
      break;
    case Algorithm::kAuto:
      c.chunk_bytes = 1024;
      c.depth = 2;
      c.small_bytes = 2048;
      c.medium_bytes = 4096;
      break;
  }
  return c;
}

const char* algo_name(Algorithm a) {
  switch (a) {
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kRecursiveDoubling:
      return "rd";
    case Algorithm::kRabenseifner:
      return "rabenseifner";
    case Algorithm::kHierarchical:
      return "hierarchical";
    case Algorithm::kAuto:
      break;
  }
  return "auto";
}

/// Buffers of one rank, typed as bytes.
struct Bytes {
  std::vector<unsigned char> v;
  Bytes(DataType t, size_t elems) : v(elems * type_size(t) + 1) {}  // never empty
  void* data() { return v.data(); }
};

// Describes the case for failure messages.
std::string where(const char* coll, DataType t, RedOp op, bool in_place, size_t count, int root,
                  int rank) {
  std::ostringstream s;
  s << coll << " " << type_name(t) << " " << op_name(op)
    << (in_place ? " in-place" : " out-of-place") << " count " << count << " root " << root
    << " rank " << rank;
  return s.str();
}

// Throws with a description of the first element that differs from the reference.
void check(const std::string& ctx, DataType t, RedOp op, const void* got, size_t elems,
           const std::function<Expected(size_t)>& expect) {
  for (size_t i = 0; i < elems; ++i) {
    const Expected e = expect(i);
    const double g = load(t, got, i);
    if (!(std::fabs(g - e.value) <= e.tolerance)) {
      std::ostringstream s;
      s << ctx << ": element " << i << " is " << g << ", expected " << e.value << " ± "
        << e.tolerance;
      (void)op;
      throw std::runtime_error(s.str());
    }
  }
}

// Reference of element i of a reduction whose rank q contributes gen(q, src_index).
Expected reduced(DataType t, RedOp op, int n, size_t src_index) {
  double in[8];
  for (int q = 0; q < n; ++q) in[q] = gen_stored(t, op, q, src_index);
  return reference(t, op, in, n);
}

Expected exact(double v) {
  return {v, 0};
}

struct Case {
  Coll coll;
  int ranks;
  Algorithm algo;
};

class CollectiveTest : public ::testing::TestWithParam<Case> {};

void run_all_reduce(Communicator& c, DataType t, RedOp op, bool in_place, size_t count) {
  const int n = c.size();
  const int r = c.rank();
  Bytes send(t, count), recv(t, count);
  for (size_t i = 0; i < count; ++i) store(t, send.data(), i, gen(t, op, r, i));
  testing::fill_sentinel(t, recv.data(), count);
  if (in_place) recv = send;
  void* sp = count == 0 ? nullptr : (in_place ? recv.data() : send.data());
  void* rp = count == 0 ? nullptr : recv.data();
  c.all_reduce(sp, rp, count, t, op);
  const std::string ctx = where("AllReduce", t, op, in_place, count, -1, r);
  check(ctx, t, op, recv.data(), count, [&](size_t i) { return reduced(t, op, n, i); });
  if (!in_place)
    check(ctx + " (send buffer)", t, op, send.data(), count,
          [&](size_t i) { return exact(gen_stored(t, op, r, i)); });
}

void run_broadcast(Communicator& c, DataType t, bool in_place, size_t count, int root) {
  const int r = c.rank();
  Bytes send(t, count), recv(t, count);
  testing::fill_sentinel(t, recv.data(), count);
  Bytes& src = in_place ? recv : send;
  if (r == root)
    for (size_t i = 0; i < count; ++i) store(t, src.data(), i, gen(t, RedOp::kSum, root, i));
  // Out of place, non-root ranks pass no send buffer: NCCL ignores it there.
  const void* sp = count == 0  ? nullptr
                   : in_place  ? recv.data()
                   : r == root ? send.data()
                               : nullptr;
  c.broadcast(sp, count == 0 ? nullptr : recv.data(), count, t, root);
  check(where("Broadcast", t, RedOp::kSum, in_place, count, root, r), t, RedOp::kSum, recv.data(),
        count, [&](size_t i) { return exact(gen_stored(t, RedOp::kSum, root, i)); });
}

void run_reduce(Communicator& c, DataType t, RedOp op, bool in_place, size_t count, int root) {
  const int n = c.size();
  const int r = c.rank();
  Bytes send(t, count), recv(t, count);
  for (size_t i = 0; i < count; ++i) store(t, send.data(), i, gen(t, op, r, i));
  testing::fill_sentinel(t, recv.data(), count);
  const void* sp = count == 0 ? nullptr : send.data();
  // Out of place, non-root ranks pass no recv buffer (only significant on the root).
  void* rp = count == 0 ? nullptr : in_place ? send.data() : r == root ? recv.data() : nullptr;
  c.reduce(sp, rp, count, t, op, root);
  const std::string ctx = where("Reduce", t, op, in_place, count, root, r);
  if (r == root) {
    check(ctx, t, op, rp == nullptr ? send.data() : rp, count,
          [&](size_t i) { return reduced(t, op, n, i); });
  }
  if (!in_place || r != root)
    check(ctx + " (send buffer)", t, op, send.data(), count,
          [&](size_t i) { return exact(gen_stored(t, op, r, i)); });
}

void run_all_gather(Communicator& c, DataType t, bool in_place, size_t count) {
  const int n = c.size();
  const int r = c.rank();
  const size_t total = count * static_cast<size_t>(n);
  Bytes send(t, count), recv(t, total);
  testing::fill_sentinel(t, recv.data(), total);
  const size_t own = static_cast<size_t>(r) * count;
  for (size_t i = 0; i < count; ++i) {
    store(t, send.data(), i, gen(t, RedOp::kSum, r, i));
    if (in_place) store(t, recv.data(), own + i, gen(t, RedOp::kSum, r, i));
  }
  const void* sp = count == 0 ? nullptr
                   : in_place ? static_cast<void*>(recv.v.data() + own * type_size(t))
                              : send.data();
  c.all_gather(sp, count == 0 ? nullptr : recv.data(), count, t);
  check(where("AllGather", t, RedOp::kSum, in_place, count, -1, r), t, RedOp::kSum, recv.data(),
        total, [&](size_t i) {
          return exact(gen_stored(t, RedOp::kSum, static_cast<int>(i / count), i % count));
        });
}

void run_reduce_scatter(Communicator& c, DataType t, RedOp op, bool in_place, size_t count) {
  const int n = c.size();
  const int r = c.rank();
  const size_t total = count * static_cast<size_t>(n);
  Bytes send(t, total), recv(t, count);
  for (size_t i = 0; i < total; ++i) store(t, send.data(), i, gen(t, op, r, i));
  testing::fill_sentinel(t, recv.data(), count);
  const size_t own = static_cast<size_t>(r) * count;
  void* rp = count == 0 ? nullptr
             : in_place ? static_cast<void*>(send.v.data() + own * type_size(t))
                        : recv.data();
  c.reduce_scatter(count == 0 ? nullptr : send.data(), rp, count, t, op);
  const std::string ctx = where("ReduceScatter", t, op, in_place, count, -1, r);
  check(ctx, t, op, in_place ? rp : recv.data(), count,
        [&](size_t i) { return reduced(t, op, n, own + i); });
  // The rest of the send buffer is never written, in place or not.
  check(ctx + " (send buffer)", t, op, send.data(), total, [&](size_t i) {
    if (in_place && i >= own && i < own + count) return reduced(t, op, n, i);
    return exact(gen_stored(t, op, r, i));
  });
}

void run_all_to_all(Communicator& c, DataType t, bool in_place, size_t count) {
  const int n = c.size();
  const int r = c.rank();
  const size_t total = count * static_cast<size_t>(n);
  Bytes send(t, total), recv(t, total);
  // Block q of rank r's input goes to rank q.
  for (size_t i = 0; i < total; ++i) store(t, send.data(), i, gen(t, RedOp::kSum, r, i));
  testing::fill_sentinel(t, recv.data(), total);
  if (in_place) recv = send;
  c.all_to_all(count == 0 ? nullptr
               : in_place ? recv.data()
                          : send.data(),
               count == 0 ? nullptr : recv.data(), count, t);
  check(where("AllToAll", t, RedOp::kSum, in_place, count, -1, r), t, RedOp::kSum, recv.data(),
        total, [&](size_t i) {
          const size_t q = i / count;
          return exact(gen_stored(t, RedOp::kSum, static_cast<int>(q),
                                  static_cast<size_t>(r) * count + i % count));
        });
}

// Rank 0 sends a message to every other rank, which sends it back with its own values;
// then neighbours 2k and 2k+1 exchange (even sends first). Send/Recv block until matched.
void run_send_recv(Communicator& c, DataType t, size_t count) {
  const int n = c.size();
  const int r = c.rank();
  Bytes buf(t, count);
  auto fill = [&](int who) {
    for (size_t i = 0; i < count; ++i) store(t, buf.data(), i, gen(t, RedOp::kSum, who, i));
  };
  auto expect_from = [&](int who, const char* what) {
    check(where(what, t, RedOp::kSum, false, count, who, r), t, RedOp::kSum, buf.data(), count,
          [&](size_t i) { return exact(gen_stored(t, RedOp::kSum, who, i)); });
  };
  void* p = count == 0 ? nullptr : buf.data();
  if (r == 0) {
    for (int q = 1; q < n; ++q) {
      fill(0);
      c.send(p, count, t, q);
      testing::fill_sentinel(t, buf.data(), count);
      c.recv(p, count, t, q);
      expect_from(q, "Recv at rank 0");
    }
  } else {
    testing::fill_sentinel(t, buf.data(), count);
    c.recv(p, count, t, 0);
    expect_from(0, "Recv from rank 0");
    fill(r);
    c.send(p, count, t, 0);
  }
  const int partner = r % 2 == 0 ? r + 1 : r - 1;
  if (partner < n) {
    if (r % 2 == 0) {
      fill(r);
      c.send(p, count, t, partner);
      c.recv(p, count, t, partner);
    } else {
      c.recv(p, count, t, partner);
      expect_from(partner, "Recv from neighbour");
      fill(r);
      c.send(p, count, t, partner);
      return;
    }
    expect_from(partner, "Recv from neighbour");
  }
}

TEST_P(CollectiveTest, MatchesReference) {
  const Case k = GetParam();
  const size_t counts[] = {0, 1, 1001};
  std::atomic<int> arrived{0};
  const std::string err = run_ranks(k.ranks, config_for(k.algo), [&](Communicator& c) {
    int iteration = 0;
    int barriers = 0;
    for (DataType t : kAllTypes) {
      for (RedOp op : kAllOps) {
        const bool reduces =
            k.coll == Coll::kAllReduce || k.coll == Coll::kReduce || k.coll == Coll::kReduceScatter;
        if (!reduces && op != RedOp::kSum) continue;
        for (bool in_place : {false, true}) {
          for (size_t count : counts) {
            const int root = iteration++ % c.size();
            switch (k.coll) {
              case Coll::kAllReduce:
                run_all_reduce(c, t, op, in_place, count);
                break;
              case Coll::kBroadcast:
                run_broadcast(c, t, in_place, count, root);
                break;
              case Coll::kReduce:
                run_reduce(c, t, op, in_place, count, root);
                break;
              case Coll::kAllGather:
                run_all_gather(c, t, in_place, count);
                break;
              case Coll::kReduceScatter:
                run_reduce_scatter(c, t, op, in_place, count);
                break;
              case Coll::kAllToAll:
                run_all_to_all(c, t, in_place, count);
                break;
              case Coll::kSendRecv:
                if (!in_place) run_send_recv(c, t, count);
                break;
              case Coll::kBarrier:
                // Nobody leaves a barrier before everyone entered it.
                arrived.fetch_add(1);
                c.barrier();
                ++barriers;
                if (arrived.load() < c.size() * barriers)
                  throw std::runtime_error("left barrier " + std::to_string(barriers) +
                                           " before all ranks arrived");
                break;
            }
          }
        }
      }
    }
  });
  EXPECT_EQ(err, "");
}

std::vector<Case> all_cases() {
  std::vector<Case> v;
  for (Coll c : {Coll::kAllReduce, Coll::kBroadcast, Coll::kReduce, Coll::kAllGather,
                 Coll::kReduceScatter, Coll::kAllToAll, Coll::kSendRecv, Coll::kBarrier})
    for (int n : {1, 2, 3, 4, 8})
      for (Algorithm a : {Algorithm::kRing, Algorithm::kRecursiveDoubling, Algorithm::kAuto})
        v.push_back({c, n, a});
  // Rabenseifner is an AllReduce algorithm: every folding shape (rem = n − 2^k from 0 to
  // 3); for the other collectives, forcing it falls back to their auto choice (one case).
  for (int n : {1, 2, 3, 4, 5, 6, 7, 8})
    v.push_back({Coll::kAllReduce, n, Algorithm::kRabenseifner});
  for (int n : {5, 6, 7}) v.push_back({Coll::kAllReduce, n, Algorithm::kRecursiveDoubling});
  v.push_back({Coll::kBroadcast, 3, Algorithm::kRabenseifner});
  // Forced hierarchical without sites: every rank in one unnamed site (chain reduce and
  // broadcast only); elsewhere it means auto.
  v.push_back({Coll::kAllReduce, 4, Algorithm::kHierarchical});
  v.push_back({Coll::kReduceScatter, 3, Algorithm::kHierarchical});
  return v;
}

INSTANTIATE_TEST_SUITE_P(All, CollectiveTest, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return std::string(coll_name(i.param.coll)) + "_" +
                                  std::to_string(i.param.ranks) + "ranks_" +
                                  algo_name(i.param.algo);
                         });

// ≥ 16M elements: one of each kind of algorithm at scale, with default chunking. Inputs are
// cheap closed forms so generation and checking stay fast under sanitizers.
constexpr size_t kLarge = size_t{1} << 24;

struct LargeCase {
  Coll coll;
  int ranks;
  Algorithm algo;
  DataType type;
  bool in_place;
};

class LargeTest : public ::testing::TestWithParam<LargeCase> {};

TEST_P(LargeTest, MatchesReference) {
  const LargeCase k = GetParam();
  Config cfg;
  cfg.algorithm = k.algo;
  const DataType t = k.type;
  const std::string err = run_ranks(k.ranks, cfg, [&](Communicator& c) {
    const int n = c.size();
    const int r = c.rank();
    // Values small enough that sums over 4 ranks stay exact in int8 and float32.
    auto value = [](int rank, size_t i) {
      return static_cast<double>((i * 31 + rank * 7) % 16) - 8;
    };
    auto fill = [&](void* p, size_t elems, int rank, size_t first) {
      if (t == DataType::kInt8) {
        auto* q = static_cast<int8_t*>(p);
        for (size_t i = 0; i < elems; ++i) q[i] = static_cast<int8_t>(value(rank, first + i));
      } else {
        auto* q = static_cast<float*>(p);
        for (size_t i = 0; i < elems; ++i) q[i] = static_cast<float>(value(rank, first + i));
      }
    };
    auto verify = [&](const void* p, size_t elems, auto expected, const char* what) {
      for (size_t i = 0; i < elems; ++i) {
        const double g = t == DataType::kInt8 ? static_cast<const int8_t*>(p)[i]
                                              : static_cast<const float*>(p)[i];
        const double e = expected(i);
        if (g != e)
          throw std::runtime_error(std::string(what) + " rank " + std::to_string(r) + ": element " +
                                   std::to_string(i) + " is " + std::to_string(g) + ", expected " +
                                   std::to_string(e));
      }
    };
    auto sum_at = [&](size_t i) {
      double s = 0;
      for (int q = 0; q < n; ++q) s += value(q, i);
      return s;
    };
    const size_t ts = type_size(t);
    switch (k.coll) {
      case Coll::kAllReduce: {
        std::vector<unsigned char> send(kLarge * ts), recv(k.in_place ? 1 : kLarge * ts);
        fill(send.data(), kLarge, r, 0);
        void* out = k.in_place ? send.data() : recv.data();
        c.all_reduce(send.data(), out, kLarge, t, RedOp::kSum);
        verify(out, kLarge, sum_at, "AllReduce");
        break;
      }
      case Coll::kBroadcast: {
        std::vector<unsigned char> buf(kLarge * ts);
        if (r == 1) fill(buf.data(), kLarge, 1, 0);
        c.broadcast(buf.data(), buf.data(), kLarge, t, 1);
        verify(
            buf.data(), kLarge, [&](size_t i) { return value(1, i); }, "Broadcast");
        break;
      }
      case Coll::kReduce: {
        std::vector<unsigned char> send(kLarge * ts), recv(kLarge * ts);
        fill(send.data(), kLarge, r, 0);
        c.reduce(send.data(), recv.data(), kLarge, t, RedOp::kSum, n - 1);
        if (r == n - 1) verify(recv.data(), kLarge, sum_at, "Reduce");
        break;
      }
      case Coll::kAllGather: {
        const size_t count = kLarge / static_cast<size_t>(n);
        std::vector<unsigned char> recv(kLarge * ts);
        fill(recv.data() + static_cast<size_t>(r) * count * ts, count, r, 0);
        c.all_gather(recv.data() + static_cast<size_t>(r) * count * ts, recv.data(), count, t);
        verify(
            recv.data(), count * static_cast<size_t>(n),
            [&](size_t i) { return value(static_cast<int>(i / count), i % count); }, "AllGather");
        break;
      }
      case Coll::kReduceScatter: {
        const size_t count = kLarge / static_cast<size_t>(n);
        std::vector<unsigned char> send(kLarge * ts), recv(count * ts);
        fill(send.data(), kLarge, r, 0);
        c.reduce_scatter(send.data(), recv.data(), count, t, RedOp::kSum);
        verify(
            recv.data(), count,
            [&](size_t i) { return sum_at(static_cast<size_t>(r) * count + i); }, "ReduceScatter");
        break;
      }
      case Coll::kAllToAll: {
        const size_t count = kLarge / static_cast<size_t>(n);
        std::vector<unsigned char> send(kLarge * ts), recv(kLarge * ts);
        fill(send.data(), kLarge, r, 0);
        c.all_to_all(send.data(), recv.data(), count, t);
        verify(
            recv.data(), kLarge,
            [&](size_t i) {
              return value(static_cast<int>(i / count), static_cast<size_t>(r) * count + i % count);
            },
            "AllToAll");
        break;
      }
      case Coll::kSendRecv: {
        std::vector<unsigned char> buf(kLarge * ts);
        if (r == 0) {
          fill(buf.data(), kLarge, 0, 0);
          c.send(buf.data(), kLarge, t, 1);
        } else if (r == 1) {
          c.recv(buf.data(), kLarge, t, 0);
          verify(
              buf.data(), kLarge, [&](size_t i) { return value(0, i); }, "Recv");
        }
        break;
      }
      case Coll::kBarrier:
        break;
    }
  });
  EXPECT_EQ(err, "");
}

INSTANTIATE_TEST_SUITE_P(
    Large, LargeTest,
    ::testing::Values(
        LargeCase{Coll::kAllReduce, 4, Algorithm::kRing, DataType::kFloat32, false},
        LargeCase{Coll::kAllReduce, 3, Algorithm::kAuto, DataType::kInt8, true},
        LargeCase{Coll::kAllReduce, 3, Algorithm::kRecursiveDoubling, DataType::kInt8, false},
        LargeCase{Coll::kAllReduce, 3, Algorithm::kRabenseifner, DataType::kFloat32, true},
        LargeCase{Coll::kBroadcast, 4, Algorithm::kAuto, DataType::kFloat32, true},
        LargeCase{Coll::kReduce, 3, Algorithm::kAuto, DataType::kInt8, false},
        LargeCase{Coll::kAllGather, 2, Algorithm::kAuto, DataType::kInt8, true},
        LargeCase{Coll::kReduceScatter, 2, Algorithm::kAuto, DataType::kInt8, false},
        LargeCase{Coll::kAllToAll, 2, Algorithm::kAuto, DataType::kInt8, false},
        LargeCase{Coll::kSendRecv, 2, Algorithm::kAuto, DataType::kFloat32, false}),
    [](const ::testing::TestParamInfo<LargeCase>& i) {
      return std::string(coll_name(i.param.coll)) + "_" + std::to_string(i.param.ranks) + "ranks_" +
             algo_name(i.param.algo) + "_" + type_name(i.param.type) +
             (i.param.in_place ? "_inplace" : "");
    });

}  // namespace
}  // namespace softrdma::ccl
