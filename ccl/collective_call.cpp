// Validation of a collective call (collective_call.h): one check for every collective,
// driven by the traits table.
#include "ccl/collective_call.h"

#include <cstdint>
#include <iterator>
#include <stdexcept>
#include <string>

namespace softrdma::ccl::detail {
namespace {

using L = BufferLayout;

// Indexed by Collective: {name, reduces, rooted, point_to_point, moves_data, blocks_per_rank,
// layout}.
constexpr CollectiveTraits kCollectives[] = {
    {"AllReduce", true, false, false, true, false, L::kEqual},
    {"Broadcast", false, true, false, true, false, L::kEqual},
    {"Reduce", true, true, false, true, false, L::kEqual},
    {"AllGather", false, false, false, true, true, L::kGather},
    {"ReduceScatter", true, false, false, true, true, L::kScatter},
    {"AllToAll", false, false, false, true, true, L::kEqual},
    {"Send", false, false, true, true, false, L::kSingle},
    {"Recv", false, false, true, true, false, L::kSingle},
    {"Barrier", false, false, false, false, false, L::kSingle},
};
static_assert(std::size(kCollectives) == static_cast<size_t>(Collective::kBarrier) + 1);

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

// Throws the invalid_argument of `call` on rank `rank`.
class Refusal {
 public:
  Refusal(const CollectiveCall& call, int rank) : call_(call), rank_(rank) {}
  [[noreturn]] void operator()(const std::string& what) const {
    throw std::invalid_argument(std::string(call_.name()) + ": rank " + std::to_string(rank_) +
                                ": " + what);
  }
  void unless(bool ok, const char* what) const {
    if (!ok) (*this)(what);
  }

 private:
  const CollectiveCall& call_;
  int rank_;
};

// The buffers this rank needs non-null when count > 0, checked in this order; a rooted
// collective needs one of them on the root only.
void check_buffers(const CollectiveCall& c, const CollectiveTraits& t, bool is_root,
                   const Refusal& refuse) {
  if (t.point_to_point) {
    refuse.unless((c.op == Collective::kSend ? c.send : c.recv) != nullptr, "null buffer");
  } else if (c.op == Collective::kBroadcast) {
    refuse.unless(c.recv != nullptr, "null recv buffer");
    if (is_root) refuse.unless(c.send != nullptr, "null send buffer on the root");
  } else if (c.op == Collective::kReduce) {
    refuse.unless(c.send != nullptr, "null send buffer");
    if (is_root) refuse.unless(c.recv != nullptr, "null recv buffer on the root");
  } else {
    refuse.unless(c.send != nullptr && c.recv != nullptr, "null buffer");
  }
}

// Buffers may overlap only in the collective's in-place layout.
void check_overlap(const CollectiveCall& c, const CollectiveTraits& t, int rank,
                   const Refusal& refuse) {
  const size_t own = static_cast<size_t>(rank) * c.block_bytes;
  switch (t.layout) {
    case L::kEqual:
      refuse.unless(c.send == c.recv || !overlap(c.send, c.total_bytes, c.recv, c.total_bytes),
                    "send and recv buffers overlap without being the same (in place)");
      break;
    case L::kGather:
      refuse.unless(c.send == static_cast<const char*>(c.recv) + own ||
                        !overlap(c.send, c.block_bytes, c.recv, c.total_bytes),
                    "send buffer overlaps recv without being recv + rank·count (in place)");
      break;
    case L::kScatter:
      refuse.unless(c.recv == static_cast<const char*>(c.send) + own ||
                        !overlap(c.send, c.total_bytes, c.recv, c.block_bytes),
                    "recv buffer overlaps send without being send + rank·count (in place)");
      break;
    case L::kSingle:
      break;
  }
}

}  // namespace

const CollectiveTraits& traits(Collective c) {
  return kCollectives[static_cast<size_t>(c)];
}

void check_call(CollectiveCall& c, int rank, int size) {
  const CollectiveTraits& t = traits(c.op);
  const Refusal refuse(c, rank);
  if (!t.moves_data) return;

  // Type, then count·blocks·type_size without overflow.
  if (!valid(c.type)) refuse("unknown DataType value " + std::to_string(static_cast<int>(c.type)));
  const size_t ts = type_size(c.type);
  const size_t blocks = t.blocks_per_rank ? static_cast<size_t>(size) : 1;
  if (c.count != 0 && (blocks > SIZE_MAX / c.count || c.count * blocks > SIZE_MAX / ts))
    refuse("count " + std::to_string(c.count) + " of " + type_name(c.type) + " overflows size_t");
  c.block_bytes = c.count * ts;
  c.total_bytes = c.block_bytes * blocks;

  if (t.reduces && !valid(c.red))
    refuse("unknown RedOp value " + std::to_string(static_cast<int>(c.red)));
  if (t.rooted || t.point_to_point) {
    const char* what = t.rooted ? "root" : "peer";
    if (c.root < 0 || c.root >= size)
      refuse(std::string(what) + " " + std::to_string(c.root) + " out of range [0, " +
             std::to_string(size) + ")");
  }
  if (c.op == Collective::kSend && !c.grouped)
    refuse.unless(
        c.root != rank,
        "peer is this rank (a blocking send to itself never completes; inside a group it may)");
  if (c.op == Collective::kRecv && !c.grouped)
    refuse.unless(
        c.root != rank,
        "peer is this rank (a blocking recv from itself never completes; inside a group it may)");
  if (c.count == 0) return;

  const bool is_root = c.root == rank;
  check_buffers(c, t, is_root, refuse);
  // A rooted collective's non-root ranks use one buffer only.
  if (!t.rooted || is_root) check_overlap(c, t, rank, refuse);
}

}  // namespace softrdma::ccl::detail
