// Pipelined ring AllReduce. Rank r sends to r+1 and receives from r−1. In step s
// (0 ≤ s < 2n−2) it sends segment r−s and receives segment r−s−1 (mod n): in the first n−1
// steps (reduce-scatter) the received chunk is reduced into the output, so after them rank
// r holds the full result of segment r+1; in the last n−1 steps (all-gather) received
// chunks are final and only copied. What a rank sends in step s ≥ 1 is what it received in
// step s−1, chunk by chunk, which is what lets chunks of consecutive steps overlap.
//
// The ring may be any subset of the communicator's ranks in any order (all_reduce_ring_among):
// "rank r" above is then position r in that list.
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "ccl/algorithms.h"
#include "ccl/pipeline.h"

namespace softrdma::ccl::detail {

void all_reduce_ring(Context& ctx, const void* send, void* recv, size_t count, DataType type,
                     RedOp op) {
  const size_t ts = type_size(type);
  const Region out = ctx.user(recv, count * ts);
  const Region in = send == recv ? out : ctx.user(send, count * ts);
  std::vector<int> ranks(static_cast<size_t>(ctx.size()));
  std::iota(ranks.begin(), ranks.end(), 0);
  all_reduce_ring_among(ctx, ranks, in, out, count, type, op, 0);
}

int position_among(const Context& ctx, std::span<const int> ranks) {
  for (size_t i = 0; i < ranks.size(); ++i)
    if (ranks[i] == ctx.rank()) return static_cast<int>(i);
  throw std::logic_error(std::string(ctx.op()) + ": rank " + std::to_string(ctx.rank()) +
                         " is not in the group it runs a step of");
}

void all_reduce_ring_among(Context& ctx, std::span<const int> ranks, const Region& in,
                           const Region& out, size_t count, DataType type, RedOp op,
                           uint8_t phase) {
  const int n = static_cast<int>(ranks.size());
  const int r = position_among(ctx, ranks);
  const size_t ts = type_size(type);
  const bool in_place = in.ptr == out.ptr;

  Pipeline p;
  p.send_peer = ranks[static_cast<size_t>(mod(r + 1, n))];
  p.recv_peer = ranks[static_cast<size_t>(mod(r - 1, n))];
  p.phase = phase;
  p.type = type;
  p.op = op;
  for (int s = 0; s < 2 * n - 2; ++s) {
    const Segment ss = segment(count, n, mod(r - s, n));
    const Segment rs = segment(count, n, mod(r - s - 1, n));
    PipelineSend snd;
    snd.elems = ss.elems;
    snd.src = (s == 0 ? in : out).at(ss.offset * ts);
    snd.after_recv = s - 1;
    p.sends.push_back(snd);

    PipelineRecv rcv;
    rcv.elems = rs.elems;
    rcv.dst = out.at(rs.offset * ts);
    if (s < n - 1) {
      rcv.mode = RecvMode::kReduce;
      rcv.base = in.ptr + rs.offset * ts;
      rcv.scale = op == RedOp::kAvg && s == n - 2;
    } else {
      // All-gather: this overwrites the output segment that send step s−n+1 read (step 0
      // reads the output only in place).
      rcv.mode = RecvMode::kDirect;
      const int reader = s - n + 1;
      if (reader > 0 || in_place) rcv.after_send = reader;
    }
    p.recvs.push_back(rcv);
  }
  run_pipeline(ctx, p);
}

}  // namespace softrdma::ccl::detail
