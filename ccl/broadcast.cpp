// Broadcast: a pipelined chain for large buffers, a binomial tree for small ones.
#include <cstring>
#include <vector>

#include "ccl/algorithms.h"
#include "ccl/pipeline.h"

namespace softrdma::ccl::detail {

// Chain root → root+1 → … → root−1: position 0 sends, the last position only receives,
// the others receive each chunk into the output and forward it from there.
void broadcast_chain(Context& ctx, const void* send, void* recv, size_t count, DataType type,
                     int root) {
  const int n = ctx.size();
  const size_t bytes = count * type_size(type);
  const Region out = ctx.user(recv, bytes);
  const bool is_root = ctx.rank() == root;
  const Region src = is_root && send != recv ? ctx.user(send, bytes) : out;
  std::vector<int> chain(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) chain[static_cast<size_t>(i)] = mod(root + i, n);
  broadcast_chain_among(ctx, chain, src, out, count, type, 0);
  if (is_root && send != recv) std::memcpy(recv, send, bytes);
}

void broadcast_chain_among(Context& ctx, std::span<const int> chain, const Region& src,
                           const Region& out, size_t count, DataType type, uint8_t phase) {
  const int n = static_cast<int>(chain.size());
  const int pos = position_among(ctx, chain);

  Pipeline p;
  p.type = type;
  p.phase = phase;
  if (pos == 0) {
    p.send_peer = chain[1];
    PipelineSend snd;
    snd.elems = count;
    snd.src = src;
    p.sends.push_back(snd);
  } else {
    p.recv_peer = chain[static_cast<size_t>(pos - 1)];
    PipelineRecv rcv;
    rcv.elems = count;
    rcv.dst = out;
    p.recvs.push_back(rcv);
    if (pos < n - 1) {
      p.send_peer = chain[static_cast<size_t>(pos + 1)];
      PipelineSend snd;
      snd.elems = count;
      snd.src = out;
      snd.after_recv = 0;
      p.sends.push_back(snd);
    }
  }
  run_pipeline(ctx, p);
}

// MPICH's binomial broadcast on ranks relative to the root: a rank receives from the rank
// that differs in its lowest set bit, then sends to rank + 2^k for each 2^k below that bit.
void broadcast_binomial(Context& ctx, const void* send, void* recv, size_t count, DataType type,
                        int root) {
  const int n = ctx.size();
  const int r = ctx.rank();
  const int vr = mod(r - root, n);
  const size_t bytes = count * type_size(type);
  const Region out = ctx.user(recv, bytes);
  const Region src = (vr == 0 && send != recv) ? ctx.user(send, bytes) : out;

  int mask = 1;
  while (mask < n) {
    if (vr & mask) {
      ctx.wait(ctx.recv(mod(vr - mask + root, n), out, bytes, ctx.tag(0, 0)));
      break;
    }
    mask <<= 1;
  }
  std::vector<RequestId> sends;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (vr + mask < n)
      sends.push_back(ctx.send(mod(vr + mask + root, n), src, bytes, ctx.tag(0, 0)));
  }
  for (RequestId id : sends) ctx.wait(id);
  if (vr == 0 && send != recv) std::memcpy(recv, send, bytes);
}

}  // namespace softrdma::ccl::detail
