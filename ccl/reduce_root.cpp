// Reduce (to a root): a pipelined chain for large buffers, a binomial tree for small ones.
// Non-root ranks never write the user's buffers (NCCL: recvbuff is only significant on the
// root), so their partial results live in scratch.
#include <cstring>
#include <vector>

#include "ccl/algorithms.h"
#include "ccl/pipeline.h"
#include "ccl/reduce.h"

namespace softrdma::ccl::detail {

// Chain root+1 → root+2 → … → root: the first rank sends its input, each following rank
// reduces the incoming chunk with its own input in a scratch slot and forwards the slot,
// the root reduces the last hop into its output.
void reduce_chain(Context& ctx, const void* send, void* recv, size_t count, DataType type, RedOp op,
                  int root) {
  const int n = ctx.size();
  const size_t bytes = count * type_size(type);
  const Region in = ctx.user(send, bytes);
  const Region out = ctx.rank() != root || recv == send ? in : ctx.user(recv, bytes);
  std::vector<int> chain(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) chain[static_cast<size_t>(i)] = mod(root + 1 + i, n);
  reduce_chain_among(ctx, chain, in, out, count, type, op, 0);
}

void reduce_chain_among(Context& ctx, std::span<const int> chain, const Region& in,
                        const Region& out, size_t count, DataType type, RedOp op, uint8_t phase) {
  const int n = static_cast<int>(chain.size());
  const int pos = position_among(ctx, chain);  // 0: start of the chain; n−1: the root

  Pipeline p;
  p.type = type;
  p.op = op;
  p.phase = phase;
  if (pos == 0) {
    p.send_peer = chain[1];
    PipelineSend snd;
    snd.elems = count;
    snd.src = in;
    p.sends.push_back(snd);
  } else {
    p.recv_peer = chain[static_cast<size_t>(pos - 1)];
    PipelineRecv rcv;
    rcv.elems = count;
    rcv.base = in.ptr;
    if (pos < n - 1) {
      rcv.mode = RecvMode::kReduceForward;
      p.send_peer = chain[static_cast<size_t>(pos + 1)];
      PipelineSend snd;
      snd.elems = count;
      snd.after_recv = 0;
      snd.from_slot = true;
      p.sends.push_back(snd);
    } else {
      rcv.mode = RecvMode::kReduce;
      rcv.dst = out;
      rcv.scale = op == RedOp::kAvg;
    }
    p.recvs.push_back(rcv);
  }
  run_pipeline(ctx, p);
}

// MPICH's binomial reduce on ranks relative to the root: a rank receives from rank + 2^k
// for each 2^k below its lowest set bit (in increasing k), then sends its partial result to
// the rank without that bit. Two scratch slots: the next child's message arrives while the
// previous one is being reduced.
void reduce_binomial(Context& ctx, const void* send, void* recv, size_t count, DataType type,
                     RedOp op, int root) {
  const int n = ctx.size();
  const int r = ctx.rank();
  const int vr = mod(r - root, n);
  const size_t bytes = count * type_size(type);
  const Region in = ctx.user(send, bytes);

  int children[32];
  int nchildren = 0;
  int mask = 1;
  for (; mask < n && (vr & mask) == 0; mask <<= 1) {
    if (vr + mask < n) children[nchildren++] = mod(vr + mask + root, n);
  }

  Region acc = in;  // a leaf sends its input as is
  Region slots;
  if (nchildren > 0) {
    const bool own_acc = vr != 0;  // the root accumulates in its output
    const Region s = ctx.scratch((own_acc ? 3 : 2) * bytes);
    slots = own_acc ? s.at(bytes) : s;
    acc = own_acc ? s : (recv == send ? in : ctx.user(recv, bytes));
  }
  RequestId pending[2] = {0, 0};
  for (int k = 0; k < nchildren && k < 2; ++k)
    pending[k] =
        ctx.recv(children[k], slots.at(static_cast<size_t>(k) * bytes), bytes, ctx.tag(0, 0));
  for (int k = 0; k < nchildren; ++k) {
    const Region slot = slots.at(static_cast<size_t>(k % 2) * bytes);
    ctx.wait(pending[k % 2]);
    if (k == 0)
      reduce_to(acc.ptr, in.ptr, slot.ptr, count, type, op);
    else
      reduce_into(acc.ptr, slot.ptr, count, type, op);
    if (k + 2 < nchildren) pending[k % 2] = ctx.recv(children[k + 2], slot, bytes, ctx.tag(0, 0));
  }
  if (vr == 0) {
    if (nchildren == 0 && recv != send) std::memcpy(recv, send, bytes);  // unreachable for n ≥ 2
    if (op == RedOp::kAvg) scale_avg(recv, count, type, n);
  } else {
    ctx.wait(ctx.send(mod(vr - mask + root, n), acc, bytes, ctx.tag(0, 0)));
  }
}

}  // namespace softrdma::ccl::detail
