// Bruck's AllGather (Bruck, Ho, Kipnis, Upfal, Weathersby 1997, "Efficient Algorithms for
// All-to-All Communications in Multiport Message-Passing Systems", IEEE TPDS 8(11); the
// "dissemination" allgather of Thakur, Rabenseifner, Gropp 2005, §3): ⌈log2 n⌉ steps for any
// rank count. A scratch array holds, at position i, the block of rank (r + i) mod n. In step
// k (distance d = 2^k) rank r sends its first min(d, n − d) blocks to rank r − d and receives
// as many from rank r + d at position d; then the array is rotated into the output. Each
// rank moves (n − 1) blocks in ⌈log2 n⌉ messages: the small-message AllGather.
#include <algorithm>
#include <cstring>

#include "ccl/algorithms.h"

namespace softrdma::ccl::detail {

namespace {
constexpr uint8_t kStep = 0;  // tag phase
}  // namespace

void all_gather_bruck(Context& ctx, const void* send, void* recv, size_t count, DataType type) {
  const int n = ctx.size();
  const int r = ctx.rank();
  const size_t bytes = count * type_size(type);
  const Region out = ctx.user(recv, static_cast<size_t>(n) * bytes);
  const char* own = out.ptr + static_cast<size_t>(r) * bytes;
  const bool in_place = send == own;
  const Region tmp = ctx.scratch(static_cast<size_t>(n) * bytes);
  std::memcpy(tmp.ptr, send, bytes);

  int step = 0;
  for (int d = 1; d < n; d *= 2, ++step) {
    const size_t blocks = static_cast<size_t>(std::min(d, n - d));
    const RequestId rq = ctx.recv(mod(r + d, n), tmp.at(static_cast<size_t>(d) * bytes),
                                  blocks * bytes, ctx.tag(kStep, step));
    const RequestId sq = ctx.send(mod(r - d, n), tmp, blocks * bytes, ctx.tag(kStep, step));
    ctx.wait(rq);
    ctx.wait(sq);
  }
  for (int i = in_place ? 1 : 0; i < n; ++i)
    std::memcpy(out.ptr + static_cast<size_t>(mod(r + i, n)) * bytes,
                tmp.ptr + static_cast<size_t>(i) * bytes, bytes);
}

}  // namespace softrdma::ccl::detail
