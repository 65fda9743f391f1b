// Rabenseifner's AllReduce: a reduce-scatter by recursive halving followed by an allgather
// by recursive doubling (Thakur, Rabenseifner, Gropp 2005, "Optimization of Collective
// Communication Operations in MPICH", IJHPCA 19(1), §4.4; MPICH's
// MPIR_Allreduce_intra_reduce_scatter_allgather). Non-power-of-two rank counts fold first,
// exactly as the recursive-doubling AllReduce does (allreduce_recursive_doubling.cpp):
//   1. with p the largest power of two ≤ n and rem = n − p, among the first 2·rem ranks each
//      even rank sends its vector to the next odd rank, which reduces it and stands for both;
//   2. the p remaining ranks (new rank: r/2 for those odd ranks, r − rem for ranks ≥ 2·rem)
//      cut the vector into p near-equal blocks. Reduce-scatter: for mask = p/2, p/4, …, 1
//      each rank keeps the half of its current block range on its side of the mask bit
//      (lower half when newrank & mask == 0), sends the other half to newrank ^ mask and
//      reduces the half it receives into the half it keeps. After log2(p) steps new rank k
//      holds the fully reduced block k. Allgather: the same exchanges in reverse order
//      (mask = 1, 2, …, p/2), each rank sending the range it holds and receiving its
//      partner's adjacent range;
//   3. the odd ranks send the result back to their even partners.
// Each rank sends and receives about 2·(p−1)/p of the vector in 2·log2(p) messages: the
// ring's bandwidth with the latency term of recursive doubling — the medium-size choice.
#include <cstring>

#include "ccl/algorithms.h"
#include "ccl/fold.h"
#include "ccl/reduce.h"

namespace softrdma::ccl::detail {

namespace {
// Tag phases of this algorithm besides the fold's: its reduce-scatter (recursive halving)
// and its allgather (recursive doubling).
constexpr uint8_t kReduceScatterPhase = kFirstOwnPhase;
constexpr uint8_t kAllGatherPhase = kFirstOwnPhase + 1;

// Elements [first, first + elems) covered by blocks [lo, hi) of `count` cut into p blocks.
struct Span {
  size_t first;
  size_t elems;
};
Span blocks(size_t count, int p, int lo, int hi) {
  const Segment a = segment(count, p, lo);
  const Segment b = segment(count, p, hi - 1);
  return {a.offset, b.offset + b.elems - a.offset};
}
}  // namespace

void all_reduce_rabenseifner(Context& ctx, const void* send, void* recv, size_t count,
                             DataType type, RedOp op) {
  const int n = ctx.size();
  const int r = ctx.rank();
  const size_t esize = type_size(type);
  const size_t bytes = count * esize;
  const Region acc = ctx.user(recv, bytes);
  if (send != recv) std::memcpy(recv, send, bytes);

  // The fold receives a whole vector, a halving step at most the first half of the blocks
  // (segment() makes earlier blocks the larger ones).
  const FoldShape shape = fold_shape(n, r);
  const int pof2 = shape.pof2;
  const size_t half = blocks(count, pof2, 0, pof2 / 2).elems * esize;
  const Region tmp = ctx.scratch(shape.folded(r) ? bytes : half);
  const FoldShape f = all_reduce_fold_in(ctx, acc, tmp, bytes, count, type, op, kFoldPhase);
  const int newrank = f.newrank;

  if (newrank >= 0) {
    // Reduce-scatter by recursive halving: [lo, hi) is the block range this rank reduces.
    int lo = 0, hi = pof2, round = 0;
    for (int mask = pof2 / 2; mask >= 1; mask /= 2, ++round) {
      const int partner = f.real_rank(newrank ^ mask);
      const int mid = lo + (hi - lo) / 2;
      const bool lower = (newrank & mask) == 0;
      const Span keep = lower ? blocks(count, pof2, lo, mid) : blocks(count, pof2, mid, hi);
      const Span give = lower ? blocks(count, pof2, mid, hi) : blocks(count, pof2, lo, mid);
      const RequestId rq =
          ctx.recv(partner, tmp, keep.elems * esize, ctx.tag(kReduceScatterPhase, round));
      const RequestId sq = ctx.send(partner, acc.at(give.first * esize), give.elems * esize,
                                    ctx.tag(kReduceScatterPhase, round));
      ctx.wait(rq);
      ctx.wait(sq);
      reduce_into(acc.ptr + keep.first * esize, tmp.ptr, keep.elems, type, op);
      if (lower)
        hi = mid;
      else
        lo = mid;
    }
    // lo == newrank: this rank's block is fully reduced.
    if (op == RedOp::kAvg) {
      const Span own = blocks(count, pof2, lo, lo + 1);
      scale_avg(acc.ptr + own.first * esize, own.elems, type, n);
    }
    // Allgather by recursive doubling: the ranges double back up to the whole vector.
    round = 0;
    for (int mask = 1; mask < pof2; mask *= 2, ++round) {
      const int partner = f.real_rank(newrank ^ mask);
      const int width = hi - lo;
      const bool lower = (newrank & mask) == 0;
      const int plo = lower ? hi : lo - width;
      const Span mine = blocks(count, pof2, lo, hi);
      const Span theirs = blocks(count, pof2, plo, plo + width);
      const RequestId rq = ctx.recv(partner, acc.at(theirs.first * esize), theirs.elems * esize,
                                    ctx.tag(kAllGatherPhase, round));
      const RequestId sq = ctx.send(partner, acc.at(mine.first * esize), mine.elems * esize,
                                    ctx.tag(kAllGatherPhase, round));
      ctx.wait(rq);
      ctx.wait(sq);
      if (lower)
        hi += width;
      else
        lo -= width;
    }
  }

  all_reduce_fold_out(ctx, f, acc, bytes, kUnfoldPhase);
}

}  // namespace softrdma::ccl::detail
