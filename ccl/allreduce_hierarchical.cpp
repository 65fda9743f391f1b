// Hierarchical AllReduce for ranks spread over sites (data centres): only one rank per site
// — its leader — talks across the wide area. Three phases, each a pipeline of its own tag:
//   1. inside each site, a chain members[1] → … → members[k−1] → leader reduces to the
//      leader (members in rank order, the leader the lowest);
//   2. the L leaders run the ring AllReduce among themselves (2(L−1) steps, each leader
//      sending 2(L−1)/L of the buffer), optionally on the buffer rounded to 16 bits;
//   3. inside each site, a chain leader → members[1] → … → members[k−1] broadcasts.
// The shape is Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE (local reduce, cross-node AllReduce,
// local broadcast) and NCCL's intra-node chain + inter-node tree. No deadlock: each phase is
// a pipeline of its own (pipeline.h argues each one), a rank takes part in them in the order
// 1, 2, 3, and phase k of a rank depends only on phase k of its peers or on its own phase
// k−1, so every rank finishes phase k once every rank has finished phase k−1.
//
// Compression (WanCompression): the leaders round their site sums to float16 / bfloat16 and
// the ring reduces in that type (reduce.h: widened to float32, combined, rounded per hop), so
// the result carries about (L + 1) roundings of relative error u (float16 2^-11, bfloat16
// 2^-8) of the sum of the site sums' magnitudes — docs/wide-area.md gives the bound the
// tests check.
#include <cstring>
#include <vector>

#include "ccl/algorithms.h"
#include "ccl/reduce.h"

namespace softrdma::ccl::detail {
namespace {

constexpr uint8_t kPhaseSiteReduce = 0;
constexpr uint8_t kPhaseLeaders = 1;
constexpr uint8_t kPhaseSiteBroadcast = 2;

void narrow(const float* in, uint16_t* out, size_t count, WanCompression c) {
  if (c == WanCompression::kFloat16)
    for (size_t i = 0; i < count; ++i) out[i] = float_to_half(in[i]);
  else
    for (size_t i = 0; i < count; ++i) out[i] = float_to_bfloat16(in[i]);
}

void widen(const uint16_t* in, float* out, size_t count, WanCompression c) {
  if (c == WanCompression::kFloat16)
    for (size_t i = 0; i < count; ++i) out[i] = half_to_float(in[i]);
  else
    for (size_t i = 0; i < count; ++i) out[i] = bfloat16_to_float(in[i]);
}

}  // namespace

void all_reduce_hierarchical(Context& ctx, std::span<const int> sites, WanCompression compress,
                             const void* send, void* recv, size_t count, DataType type, RedOp op) {
  const int n = ctx.size();
  const int r = ctx.rank();
  const size_t bytes = count * type_size(type);
  const Region out = ctx.user(recv, bytes);
  const Region in = send == recv ? out : ctx.user(send, bytes);
  const RedOp step_op = op == RedOp::kAvg ? RedOp::kSum : op;

  // This rank's site in rank order, and the leaders (each site's lowest rank) in rank order.
  std::vector<int> members;
  std::vector<int> leaders;
  std::vector<bool> site_seen;
  for (int q = 0; q < n; ++q) {
    const auto s = static_cast<size_t>(sites[static_cast<size_t>(q)]);
    if (s >= site_seen.size()) site_seen.resize(s + 1, false);
    if (!site_seen[s]) leaders.push_back(q);
    site_seen[s] = true;
    if (sites[static_cast<size_t>(q)] == sites[static_cast<size_t>(r)]) members.push_back(q);
  }
  const bool leader = members.front() == r;

  if (members.size() > 1) {
    std::vector<int> chain(members.begin() + 1, members.end());
    chain.push_back(members.front());
    reduce_chain_among(ctx, chain, in, out, count, type, step_op, kPhaseSiteReduce);
  } else if (send != recv) {
    std::memcpy(recv, send, bytes);
  }

  if (leader && leaders.size() > 1) {
    if (compress != WanCompression::kNone && type == DataType::kFloat32) {
      const DataType wire =
          compress == WanCompression::kFloat16 ? DataType::kFloat16 : DataType::kBfloat16;
      const Region c = ctx.scratch_reserve(count * sizeof(uint16_t));
      auto* half = reinterpret_cast<uint16_t*>(c.ptr);
      narrow(static_cast<const float*>(recv), half, count, compress);
      all_reduce_ring_among(ctx, leaders, c, c, count, wire, step_op, kPhaseLeaders);
      widen(half, static_cast<float*>(recv), count, compress);
    } else {
      all_reduce_ring_among(ctx, leaders, out, out, count, type, step_op, kPhaseLeaders);
    }
  }
  if (leader && op == RedOp::kAvg) scale_avg(recv, count, type, n);

  if (members.size() > 1)
    broadcast_chain_among(ctx, members, out, out, count, type, kPhaseSiteBroadcast);
}

}  // namespace softrdma::ccl::detail
