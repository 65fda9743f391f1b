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
#include "ccl/reduce.h"

namespace softrdma::ccl::detail {

namespace {
// Tag phases of this algorithm.
constexpr uint8_t kFold = 0;
constexpr uint8_t kExchange = 1;
constexpr uint8_t kUnfold = 2;
}  // namespace

void all_reduce_recursive_doubling(Context& ctx, const void* send, void* recv, size_t count,
                                   DataType type, RedOp op) {
  const int n = ctx.size();
  const int r = ctx.rank();
  const size_t bytes = count * type_size(type);
  const Region acc = ctx.user(recv, bytes);
  if (send != recv) std::memcpy(recv, send, bytes);
  const Region tmp = ctx.scratch(bytes);

  int pof2 = 1;
  while (pof2 * 2 <= n) pof2 *= 2;
  const int rem = n - pof2;

  int newrank;
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      ctx.wait(ctx.send(r + 1, acc, bytes, ctx.tag(kFold, 0)));
      newrank = -1;
    } else {
      ctx.wait(ctx.recv(r - 1, tmp, bytes, ctx.tag(kFold, 0)));
      reduce_into(acc.ptr, tmp.ptr, count, type, op);
      newrank = r / 2;
    }
  } else {
    newrank = r - rem;
  }

  if (newrank >= 0) {
    int round = 0;
    for (int mask = 1; mask < pof2; mask <<= 1, ++round) {
      const int pn = newrank ^ mask;
      const int partner = pn < rem ? pn * 2 + 1 : pn + rem;
      const RequestId rq = ctx.recv(partner, tmp, bytes, ctx.tag(kExchange, round));
      const RequestId sq = ctx.send(partner, acc, bytes, ctx.tag(kExchange, round));
      ctx.wait(rq);
      ctx.wait(sq);
      reduce_into(acc.ptr, tmp.ptr, count, type, op);
    }
    if (op == RedOp::kAvg) scale_avg(acc.ptr, count, type, n);
  }

  if (r < 2 * rem) {
    if (r % 2 == 1)
      ctx.wait(ctx.send(r - 1, acc, bytes, ctx.tag(kUnfold, 0)));
    else
      ctx.wait(ctx.recv(r + 1, acc, bytes, ctx.tag(kUnfold, 0)));
  }
}

}  // namespace softrdma::ccl::detail
