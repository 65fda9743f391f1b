// Pipelined ring AllReduce. Rank r sends to r+1 and receives from r−1. In step s
// (0 ≤ s < 2n−2) it sends segment r−s and receives segment r−s−1 (mod n): in the first n−1
// steps (reduce-scatter) the received chunk is reduced into the output, so after them rank
// r holds the full result of segment r+1; in the last n−1 steps (all-gather) received
// chunks are final and only copied. What a rank sends in step s ≥ 1 is what it received in
// step s−1, chunk by chunk, which is what lets chunks of consecutive steps overlap.
#include "ccl/algorithms.h"
#include "ccl/pipeline.h"

namespace softrdma::ccl::detail {

void all_reduce_ring(Context& ctx, const void* send, void* recv, size_t count, DataType type,
                     RedOp op) {
  const int n = ctx.size();
  const int r = ctx.rank();
  const size_t ts = type_size(type);
  const bool in_place = send == recv;
  const Region out = ctx.user(recv, count * ts);
  const Region in = in_place ? out : ctx.user(send, count * ts);

  Pipeline p;
  p.send_peer = mod(r + 1, n);
  p.recv_peer = mod(r - 1, n);
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
