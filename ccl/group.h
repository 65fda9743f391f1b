// Group calls (internal to ccl/): the deferred calls of Communicator::group_start() /
// group_end() and the engine that runs a group's Send/Recv concurrently. Semantics are
// NCCL's ncclGroupStart / ncclGroupEnd (NCCL docs, "Group Calls"); ccl.h states them for
// users.
//
// Running the point-to-point part (run_grouped_transfers). Every transfer is cut into chunks
// exactly as a blocking Send/Recv's pipeline cuts it (Config::chunk_bytes, chunk j carries
// tag(phase 0, j) of the transfer's own sequence number), so a grouped send matches an
// ungrouped recv and vice versa. The transfers of one (peer, direction) form a stream: their
// chunks in call order. At most Config::depth chunks of a stream are in flight — the floor,
// not raised by the path (Config::depth_from_path), as the argument below counts generations
// of the same depth on both sides of a stream; every chunk
// of every stream's first window is posted (recvs first) before anything is waited for,
// then the rank waits for its posted chunks oldest first and, as each completes, posts the
// next chunk of the same stream.
//
// Why that cannot deadlock (given a transport in which a transfer completes once both of its
// sides are posted and some rank drives progress — ccl/transport.h): call chunk i of a stream
// "generation" ⌊i / depth⌋. Generation g + 1 of a stream is posted only when its generation g
// chunk was waited for, and waits go oldest first, so every rank waits through its chunks in
// non-decreasing generation. Take a blocked rank whose awaited chunk has the lowest
// generation g among all blocked ranks. Its peer has either finished (then it posted all its
// chunks) or waits on generation ≥ g, so it has waited for all its generation g − 1 chunks
// and has therefore posted all of its generation g ones — including the awaited chunk's
// match (same stream index: both sides cut the same transfers in the same order). So that
// chunk completes. The same holds with ungrouped blocking calls on the peer's side: the
// pipeline posts a stream's chunks in order with depth in flight too.
#pragma once

#include <cstddef>
#include <deque>
#include <vector>

#include "ccl/collective_call.h"
#include "ccl/context.h"

namespace softrdma::ccl::detail {

/// The nesting depth and the deferred calls of one communicator's group.
class Group {
 public:
  /// True between the outermost group_start() and its group_end().
  bool active() const { return depth_ > 0; }
  /// Opens a (possibly nested) group.
  void start() { ++depth_; }
  /// Closes the innermost group. Returns true, with the group's calls (in call order) moved
  /// into `calls`, when it was the outermost one; false for an inner end. Throws
  /// std::invalid_argument "GroupEnd: rank <rank>: group_end without group_start" when no
  /// group is open.
  bool end(int rank, std::vector<CollectiveCall>& calls);
  /// Records a validated call made inside the group.
  void defer(const CollectiveCall& call) { calls_.push_back(call); }
  /// Ends every open group and drops its calls (after an error inside the group).
  void abandon() {
    depth_ = 0;
    calls_.clear();
  }

 private:
  int depth_ = 0;
  std::vector<CollectiveCall> calls_;
};

/// One Send or Recv of a group (count ≥ 1): the validated call and the Context that holds
/// its sequence-numbered tags and pins its buffer until the group is done.
struct GroupedTransfer {
  CollectiveCall call;
  Context ctx;
};

/// Runs `transfers` concurrently as described in the file comment: returns when every send
/// completed and every recv's data landed. Errors: PeerError from the transport (the
/// transfers' Context names the operation); std::invalid_argument from the transport for a
/// size mismatch it detects.
void run_grouped_transfers(std::deque<GroupedTransfer>& transfers, const Config& config);

}  // namespace softrdma::ccl::detail
