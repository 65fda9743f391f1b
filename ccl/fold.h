// The non-power-of-two fold shared by the recursive algorithms (internal to ccl/): with p the
// largest power of two ≤ n and rem = n − p, among the first 2·rem ranks each even rank hands
// its data to the next odd rank, which stands for both in a power-of-two exchange among p
// "new" ranks (Thakur, Rabenseifner, Gropp 2005, "Optimization of Collective Communication
// Operations in MPICH", IJHPCA 19(1), §4.4; MPICH's recursive doubling and
// reduce_scatter_allgather AllReduce).
#pragma once

#include <cstddef>
#include <cstdint>

#include "ccl/ccl.h"
#include "ccl/context.h"

namespace softrdma::ccl::detail {

/// Tag phases (Context::tag) of the fold into and out of the power-of-two group, the same in
/// every algorithm that folds; an algorithm numbers its own phases from kFirstOwnPhase.
inline constexpr uint8_t kFoldPhase = 0;
inline constexpr uint8_t kUnfoldPhase = 1;
inline constexpr uint8_t kFirstOwnPhase = 2;

/// Where rank `rank` of `n` stands in the fold.
struct FoldShape {
  int pof2;     ///< largest power of two ≤ n
  int rem;      ///< n − pof2: ranks folded away
  int newrank;  ///< rank among the pof2 (−1: folded away, an even rank < 2·rem)
  /// The real rank standing for new rank `nr`.
  int real_rank(int nr) const { return nr < rem ? nr * 2 + 1 : nr + rem; }
  /// `rank` holds a partner's data too (an odd rank < 2·rem) or gave its own away.
  bool folded(int rank) const { return rank < 2 * rem; }
};
FoldShape fold_shape(int n, int rank);

/// AllReduce fold-in of `count` elements (`bytes` bytes) in `acc`, through the scratch
/// `tmp` (≥ bytes): even ranks < 2·rem send acc to rank + 1, which reduces it into its own.
/// Tags: ctx.tag(phase, 0). Returns the rank's shape.
FoldShape all_reduce_fold_in(Context& ctx, const Region& acc, const Region& tmp, size_t bytes,
                             size_t count, DataType type, RedOp op, uint8_t phase);
/// AllReduce fold-out: the odd ranks < 2·rem send the result in `acc` back to rank − 1.
void all_reduce_fold_out(Context& ctx, const FoldShape& f, const Region& acc, size_t bytes,
                         uint8_t phase);

}  // namespace softrdma::ccl::detail
