// Pipelined ring AllGather: in step s (0 ≤ s < n−1) rank r sends block r−s to r+1 and
// receives block r−s−1 from r−1 straight into the output; from step 1 on it forwards, chunk
// by chunk, the block it received in the step before.
#include <cstring>

#include "ccl/algorithms.h"
#include "ccl/pipeline.h"

namespace softrdma::ccl::detail {

void all_gather_ring(Context& ctx, const void* send, void* recv, size_t count, DataType type) {
  const int n = ctx.size();
  const int r = ctx.rank();
  const size_t bytes = count * type_size(type);
  const Region out = ctx.user(recv, static_cast<size_t>(n) * bytes);
  const Region own = out.at(static_cast<size_t>(r) * bytes);
  const bool in_place = send == own.ptr;
  const Region in = in_place ? own : ctx.user(send, bytes);

  Pipeline p;
  p.send_peer = mod(r + 1, n);
  p.recv_peer = mod(r - 1, n);
  p.type = type;
  for (int s = 0; s < n - 1; ++s) {
    PipelineSend snd;
    snd.elems = count;
    snd.src = s == 0 ? in : out.at(static_cast<size_t>(mod(r - s, n)) * bytes);
    snd.after_recv = s - 1;
    p.sends.push_back(snd);
    PipelineRecv rcv;
    rcv.elems = count;
    rcv.dst = out.at(static_cast<size_t>(mod(r - s - 1, n)) * bytes);
    p.recvs.push_back(rcv);
  }
  run_pipeline(ctx, p);
  // Nothing reads or writes the own block during the pipeline (out of place, step 0 sends
  // from `send`), so the local copy waits until the network part is done.
  if (!in_place) std::memcpy(own.ptr, send, bytes);
}

}  // namespace softrdma::ccl::detail
