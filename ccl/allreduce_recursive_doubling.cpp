// Recursive-doubling AllReduce for any number of ranks (Thakur, Rabenseifner, Gropp 2005,
// "Optimization of Collective Communication Operations in MPICH", IJHPCA 19(1), §4.4 — the
// same folding MPICH's MPIR_Allreduce_intra_recursive_doubling does):
//   1. with p the largest power of two ≤ n and rem = n − p, among the first 2·rem ranks each
//      even rank sends its vector to the next odd rank, which reduces it and stands for both;
//   2. the p remaining ranks (new rank: r/2 for those odd ranks, r − rem for ranks ≥ 2·rem)
//      exchange full vectors with new rank ^ 2^k for k = 0..log2(p)−1, reducing each time;
//   3. the odd ranks send the result back to their even partners.
// Every rank of step 2 computes the same bits: each exchange reduces a op b on one side and
// b op a on the other, and every op is commutative bit for bit.
#include <cstring>

#include "ccl/algorithms.h"
#include "ccl/fold.h"
#include "ccl/reduce.h"

namespace softrdma::ccl::detail {

namespace {
// Tag phase of this algorithm's exchange (the fold has its own, ccl/fold.h).
constexpr uint8_t kExchangePhase = kFirstOwnPhase;
}  // namespace

void all_reduce_recursive_doubling(Context& ctx, const void* send, void* recv, size_t count,
                                   DataType type, RedOp op) {
  const int n = ctx.size();
  const size_t bytes = count * type_size(type);
  const Region acc = ctx.user(recv, bytes);
  if (send != recv) std::memcpy(recv, send, bytes);
  const Region tmp = ctx.scratch(bytes);

  const FoldShape f = all_reduce_fold_in(ctx, acc, tmp, bytes, count, type, op, kFoldPhase);
  const int pof2 = f.pof2;
  const int newrank = f.newrank;

  if (newrank >= 0) {
    int round = 0;
    for (int mask = 1; mask < pof2; mask <<= 1, ++round) {
      const int pn = newrank ^ mask;
      const int partner = f.real_rank(pn);
      const RequestId rq = ctx.recv(partner, tmp, bytes, ctx.tag(kExchangePhase, round));
      const RequestId sq = ctx.send(partner, acc, bytes, ctx.tag(kExchangePhase, round));
      ctx.wait(rq);
      ctx.wait(sq);
      reduce_into(acc.ptr, tmp.ptr, count, type, op);
    }
    if (op == RedOp::kAvg) scale_avg(acc.ptr, count, type, n);
  }

  all_reduce_fold_out(ctx, f, acc, bytes, kUnfoldPhase);
}

}  // namespace softrdma::ccl::detail
