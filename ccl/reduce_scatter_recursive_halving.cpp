// Recursive-halving ReduceScatter for any rank count (Thakur, Rabenseifner, Gropp 2005,
// "Optimization of Collective Communication Operations in MPICH", IJHPCA 19(1), §4.2; the
// non-power-of-two fold as in their AllReduce, §4.4):
//   1. with p the largest power of two ≤ n and rem = n − p, among the first 2·rem ranks each
//      even rank sends its whole input to the next odd rank, which reduces it and stands for
//      both; new rank j stands for the real ranks {2j, 2j+1} (j < rem) or {j + rem};
//   2. the p remaining ranks own contiguous groups of blocks (group j = the blocks of the
//      real ranks j stands for). For mask = p/2, p/4, …, 1 each rank keeps the half of its
//      current group range on its side of the mask bit, sends the other half to
//      newrank ^ mask and reduces the half it receives into the half it keeps;
//   3. new rank j now holds its group fully reduced: it keeps its own block and sends the
//      folded even partner its block.
// log2(p) + 2 messages per rank; the input is reduced in a scratch copy, so the user's send
// buffer is never written (as with the ring), also in place. The small-message ReduceScatter.
#include <cstring>

#include "ccl/algorithms.h"
#include "ccl/fold.h"
#include "ccl/reduce.h"

namespace softrdma::ccl::detail {

namespace {
// Tag phase of this algorithm's halving rounds (the fold has its own, ccl/fold.h).
constexpr uint8_t kHalvingPhase = kFirstOwnPhase;
}  // namespace

void reduce_scatter_recursive_halving(Context& ctx, const void* send, void* recv, size_t count,
                                      DataType type, RedOp op) {
  const int n = ctx.size();
  const int r = ctx.rank();
  const size_t bytes = count * type_size(type);
  const size_t total = static_cast<size_t>(n) * bytes;

  const FoldShape f = fold_shape(n, r);
  const int pof2 = f.pof2;
  const int rem = f.rem;

  if (f.newrank < 0) {  // folded out: hand the input over, get the block back
    const Region in = ctx.user(send, total);
    ctx.wait(ctx.send(r + 1, in, total, ctx.tag(kFoldPhase, 0)));
    ctx.wait(ctx.recv(r + 1, ctx.user(recv, bytes), bytes, ctx.tag(kUnfoldPhase, 0)));
    return;
  }
  // acc: the working copy of the whole input; tmp: what a partner sends (≤ total).
  const Region work = ctx.scratch(2 * total);
  const Region acc = work;
  const Region tmp = work.at(total);
  std::memcpy(acc.ptr, send, total);
  if (f.folded(r)) {
    ctx.wait(ctx.recv(r - 1, tmp, total, ctx.tag(kFoldPhase, 0)));
    reduce_into(acc.ptr, tmp.ptr, static_cast<size_t>(n) * count, type, op);
  }
  const int newrank = f.newrank;
  // First block of group j (j = p: one past the last block).
  auto group = [rem](int j) { return static_cast<size_t>(j < rem ? 2 * j : j + rem); };

  int lo = 0, hi = pof2, round = 0;
  for (int mask = pof2 / 2; mask >= 1; mask /= 2, ++round) {
    const int partner = f.real_rank(newrank ^ mask);
    const int mid = lo + (hi - lo) / 2;
    const bool lower = (newrank & mask) == 0;
    const size_t keep_at = group(lower ? lo : mid) * bytes;
    const size_t keep = (group(lower ? mid : hi)) * bytes - keep_at;
    const size_t give_at = group(lower ? mid : lo) * bytes;
    const size_t give = (group(lower ? hi : mid)) * bytes - give_at;
    const RequestId rq = ctx.recv(partner, tmp, keep, ctx.tag(kHalvingPhase, round));
    const RequestId sq = ctx.send(partner, acc.at(give_at), give, ctx.tag(kHalvingPhase, round));
    ctx.wait(rq);
    ctx.wait(sq);
    reduce_into(acc.ptr + keep_at, tmp.ptr, keep / type_size(type), type, op);
    if (lower)
      hi = mid;
    else
      lo = mid;
  }
  // Group lo == newrank is reduced: the blocks of r (and of r − 1 when r was folded into).
  if (op == RedOp::kAvg) {
    const size_t first = group(lo);
    scale_avg(acc.ptr + first * bytes, (group(lo + 1) - first) * count, type, n);
  }
  if (f.folded(r))
    ctx.wait(ctx.send(r - 1, acc.at(static_cast<size_t>(r - 1) * bytes), bytes,
                      ctx.tag(kUnfoldPhase, 0)));
  std::memcpy(recv, acc.ptr + static_cast<size_t>(r) * bytes, bytes);
}

}  // namespace softrdma::ccl::detail
