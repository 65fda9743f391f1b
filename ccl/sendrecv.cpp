// Point-to-point Send/Recv: one pipeline step to or from one peer, so large messages move
// as chunks with depth in flight, like every other collective.
#include "ccl/algorithms.h"
#include "ccl/pipeline.h"

namespace softrdma::ccl::detail {

void send_direct(Context& ctx, const void* buf, size_t count, DataType type, int peer) {
  Pipeline p;
  p.send_peer = peer;
  p.type = type;
  PipelineSend snd;
  snd.elems = count;
  snd.src = ctx.user(buf, count * type_size(type));
  p.sends.push_back(snd);
  run_pipeline(ctx, p);
}

void recv_direct(Context& ctx, void* buf, size_t count, DataType type, int peer) {
  Pipeline p;
  p.recv_peer = peer;
  p.type = type;
  PipelineRecv rcv;
  rcv.elems = count;
  rcv.dst = ctx.user(buf, count * type_size(type));
  p.recvs.push_back(rcv);
  run_pipeline(ctx, p);
}

}  // namespace softrdma::ccl::detail
