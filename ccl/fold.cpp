// The non-power-of-two fold; see fold.h.
#include "ccl/fold.h"

#include "ccl/reduce.h"

namespace softrdma::ccl::detail {

FoldShape fold_shape(int n, int rank) {
  FoldShape f{1, 0, -1};
  while (f.pof2 * 2 <= n) f.pof2 *= 2;
  f.rem = n - f.pof2;
  if (rank >= 2 * f.rem)
    f.newrank = rank - f.rem;
  else if (rank % 2 == 1)
    f.newrank = rank / 2;
  return f;
}

FoldShape all_reduce_fold_in(Context& ctx, const Region& acc, const Region& tmp, size_t bytes,
                             size_t count, DataType type, RedOp op, uint8_t phase) {
  const int r = ctx.rank();
  const FoldShape f = fold_shape(ctx.size(), r);
  if (f.folded(r)) {
    if (r % 2 == 0) {
      ctx.wait(ctx.send(r + 1, acc, bytes, ctx.tag(phase, 0)));
    } else {
      ctx.wait(ctx.recv(r - 1, tmp, bytes, ctx.tag(phase, 0)));
      reduce_into(acc.ptr, tmp.ptr, count, type, op);
    }
  }
  return f;
}

void all_reduce_fold_out(Context& ctx, const FoldShape& f, const Region& acc, size_t bytes,
                         uint8_t phase) {
  const int r = ctx.rank();
  if (!f.folded(r)) return;
  if (r % 2 == 1)
    ctx.wait(ctx.send(r - 1, acc, bytes, ctx.tag(phase, 0)));
  else
    ctx.wait(ctx.recv(r + 1, acc, bytes, ctx.tag(phase, 0)));
}

}  // namespace softrdma::ccl::detail
