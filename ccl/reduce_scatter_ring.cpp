// Pipelined ring ReduceScatter: in step s (0 ≤ s < n−1) rank r sends the partial result of
// block r−s−1 to r+1 and receives that of block r−s−2 from r−1, so the last step delivers
// block r. Step 0 sends the rank's own input; later steps forward the scratch slot in which
// the previous step's chunk was reduced with the local input. The last step reduces into the
// caller's output. Scratch: depth chunks plus one block (a slot is forwarded one block of
// transfers after it was filled).
#include "ccl/algorithms.h"
#include "ccl/pipeline.h"

namespace softrdma::ccl::detail {

void reduce_scatter_ring(Context& ctx, const void* send, void* recv, size_t count, DataType type,
                         RedOp op) {
  const int n = ctx.size();
  const int r = ctx.rank();
  const size_t bytes = count * type_size(type);
  const Region in = ctx.user(send, static_cast<size_t>(n) * bytes);
  const Region own = in.at(static_cast<size_t>(r) * bytes);
  const Region out = recv == own.ptr ? own : ctx.user(recv, bytes);
  auto block = [&](int k) { return static_cast<size_t>(mod(k, n)) * bytes; };

  Pipeline p;
  p.send_peer = mod(r + 1, n);
  p.recv_peer = mod(r - 1, n);
  p.type = type;
  p.op = op;
  for (int s = 0; s < n - 1; ++s) {
    PipelineSend snd;
    snd.elems = count;
    if (s == 0) {
      snd.src = in.at(block(r - 1));
    } else {
      snd.after_recv = s - 1;
      snd.from_slot = true;
    }
    p.sends.push_back(snd);
    PipelineRecv rcv;
    rcv.elems = count;
    rcv.base = in.ptr + block(r - s - 2);
    if (s < n - 2) {
      rcv.mode = RecvMode::kReduceForward;
    } else {
      rcv.mode = RecvMode::kReduce;
      rcv.dst = out;
      rcv.scale = op == RedOp::kAvg;
    }
    p.recvs.push_back(rcv);
  }
  run_pipeline(ctx, p);
}

}  // namespace softrdma::ccl::detail
