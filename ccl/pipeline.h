// The chunked pipeline every ring and chain algorithm runs on (internal to ccl/).
//
// A rank streams a list of send steps to one peer and a list of recv steps from another
// (the ring's right and left neighbours; a chain's next and previous rank). Each step moves
// one segment of elements, cut into chunks of Config::chunk_bytes; a step of zero elements
// still moves one empty chunk, so every step has at least one transfer. Transfer t of the
// send list pairs with transfer t of the receiver's recv list (tag = Context::tag(phase, t)),
// so the two lists of a link must be cut identically — they are, as both are built from the
// same segment sizes.
//
// Dependencies are per chunk: send step s chunk j may wait for recv step `after_recv` chunk
// j to be processed (forwarding), a recv may wait for a send chunk to complete before its
// buffer is overwritten (`after_send`), and received chunks that need reducing land in
// scratch slots first. At most Config::depth sends and depth recvs are outstanding per peer.
//
// Schedule (why it cannot deadlock under rendezvous semantics): at "time" t a rank first
// posts whatever is ready among transfers t .. t+depth-1 without blocking, then makes sure
// recv t and (if its data is there) send t are posted — blocking only on sends with index
// < t — then waits for recv t, processes it, posts send t if it waited for that chunk, and
// reaps completed sends. By induction on t every rank posts recv t and send t at time t at
// the latest, provided every send depends on a recv of lower index (a ring: the forwarded
// chunk arrived at least one step, hence one index, earlier) or on the same index along an
// acyclic chain (broadcast/reduce chains). run_pipeline checks this.
#pragma once

#include <cstdint>
#include <vector>

#include "ccl/context.h"

namespace softrdma::ccl::detail {

/// How a received chunk is used.
enum class RecvMode : uint8_t {
  kDirect,         ///< lands in `dst` as is
  kReduce,         ///< lands in a scratch slot; dst = base op slot (dst may equal base)
  kReduceForward,  ///< lands in a scratch slot; slot = slot op base; a send forwards the slot
};

/// One send step: `elems` elements from `src` (or from a scratch slot, see from_slot).
struct PipelineSend {
  size_t elems = 0;
  Region src;
  /// Recv step whose chunk j must be processed before chunk j of this step is sent; -1: none.
  int after_recv = -1;
  /// Send the slot that chunk j of recv step `after_recv` (a kReduceForward step) reduced in.
  bool from_slot = false;
};

/// One recv step of `elems` elements.
struct PipelineRecv {
  size_t elems = 0;
  RecvMode mode = RecvMode::kDirect;
  /// kDirect: destination; kReduce: output.
  Region dst;
  /// kReduce / kReduceForward: the local operand (may equal dst.ptr for kReduce).
  const char* base = nullptr;
  /// Send step whose chunk j must have completed before chunk j is received (it reads the
  /// memory this step overwrites); -1: none.
  int after_send = -1;
  /// kReduce: divide the result by size() (the end of kAvg).
  bool scale = false;
};

/// The whole stream of one rank for one phase of an operation.
struct Pipeline {
  int send_peer = -1;  ///< rank the sends go to (-1 when `sends` is empty)
  int recv_peer = -1;  ///< rank the recvs come from (-1 when `recvs` is empty)
  uint8_t phase = 0;   ///< tag phase (Context::tag)
  DataType type = DataType::kInt8;
  RedOp op = RedOp::kSum;
  std::vector<PipelineSend> sends;
  std::vector<PipelineRecv> recvs;
};

/// Runs `p` to completion (all sends completed, all recvs processed). Errors: PeerError from
/// the transport; std::logic_error for a pipeline whose dependencies break the schedule.
void run_pipeline(Context& ctx, const Pipeline& p);

}  // namespace softrdma::ccl::detail
