// Pairwise-exchange AllToAll: in step k (1 ≤ k < n) rank r sends its block for r+k and
// receives the block of r−k, with up to depth steps in flight. Step k of rank r only
// waits for transfers that its partners post by their own step k, so no ordering of
// partners can deadlock.
#include <cstring>
#include <vector>

#include "ccl/algorithms.h"

namespace softrdma::ccl::detail {

void all_to_all_pairwise(Context& ctx, const void* send, void* recv, size_t count, DataType type) {
  const int n = ctx.size();
  const int r = ctx.rank();
  const size_t bytes = count * type_size(type);
  const size_t total = static_cast<size_t>(n) * bytes;
  const Region out = ctx.user(recv, total);
  Region in;
  if (send == recv) {
    in = ctx.scratch(total);
    std::memcpy(in.ptr, send, total);
  } else {
    in = ctx.user(send, total);
    std::memcpy(out.ptr + static_cast<size_t>(r) * bytes, in.ptr + static_cast<size_t>(r) * bytes,
                bytes);
  }

  const int depth = ctx.config().depth;
  std::vector<RequestId> sends(static_cast<size_t>(n)), recvs(static_cast<size_t>(n));
  int posted = 1;
  for (int k = 1; k < n; ++k) {
    for (; posted < n && posted < k + depth; ++posted) {
      const int from = mod(r - posted, n);
      const int to = mod(r + posted, n);
      recvs[static_cast<size_t>(posted)] =
          ctx.recv(from, out.at(static_cast<size_t>(from) * bytes), bytes, ctx.tag(0, 0));
      sends[static_cast<size_t>(posted)] =
          ctx.send(to, in.at(static_cast<size_t>(to) * bytes), bytes, ctx.tag(0, 0));
    }
    ctx.wait(recvs[static_cast<size_t>(k)]);
    ctx.wait(sends[static_cast<size_t>(k)]);
  }
}

}  // namespace softrdma::ccl::detail
