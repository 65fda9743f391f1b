// Dissemination barrier (Hensgen, Finkel, Manber 1988): in round k rank r sends an empty
// message to r+2^k and waits for one from r−2^k. After ⌈log2 n⌉ rounds every rank has heard,
// directly or through others, from every rank — so none leaves before all arrived.
#include "ccl/algorithms.h"

namespace softrdma::ccl::detail {

void barrier_dissemination(Context& ctx) {
  const int n = ctx.size();
  const int r = ctx.rank();
  const Region token = ctx.scratch(1);
  uint8_t round = 0;
  for (int dist = 1; dist < n; dist <<= 1, ++round) {
    const RequestId rq = ctx.recv(mod(r - dist, n), token, 0, ctx.tag(round, 0));
    const RequestId sq = ctx.send(mod(r + dist, n), token, 0, ctx.tag(round, 0));
    ctx.wait(rq);
    ctx.wait(sq);
  }
}

}  // namespace softrdma::ccl::detail
