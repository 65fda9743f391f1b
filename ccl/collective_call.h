// One descriptor per collective call (internal to ccl/), the model being NCCL's ncclInfo +
// ArgsCheck: every Communicator entry point fills a CollectiveCall, check_call() validates
// it in one place (what differs between collectives is data, kCollectives below), and the
// Communicator runs and dispatches it from one place (communicator.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "ccl/ccl.h"

namespace softrdma::ccl::detail {

/// The operations a Communicator runs.
enum class Collective : uint8_t {
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kSend,
  kRecv,
  kBarrier,
};

/// How the send and recv buffers of a collective relate, for the in-place and overlap rule.
enum class BufferLayout : uint8_t {
  kEqual,    ///< both hold the same byte count; in place: send == recv
  kGather,   ///< recv holds size() blocks, send one; in place: send == recv + rank·block
  kScatter,  ///< send holds size() blocks, recv one; in place: recv == send + rank·block
  kSingle,   ///< one buffer (Send: `send`, Recv: `recv`); none (Barrier)
};

/// What distinguishes one collective from another for validation and running.
struct CollectiveTraits {
  const char* name;      ///< "AllReduce", for error messages (NCCL's opName)
  bool reduces;          ///< takes a RedOp
  bool rooted;           ///< `root` names the root rank
  bool point_to_point;   ///< `root` names the peer; sequence numbered per ordered pair
  bool moves_data;       ///< false: Barrier (no buffers, no count)
  bool blocks_per_rank;  ///< the larger buffer holds size() blocks of `count` elements
  BufferLayout layout;
};

/// The traits of `c` (a table indexed by Collective).
const CollectiveTraits& traits(Collective c);

/// One call, as the caller made it, plus what check_call() derives from it.
struct CollectiveCall {
  Collective op = Collective::kBarrier;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  ///< elements of `type` per block
  DataType type = DataType::kInt8;
  RedOp red = RedOp::kSum;  ///< reducing collectives only
  int root = -1;            ///< Broadcast/Reduce: the root; Send/Recv: the peer
  /// Made inside a group (group.h): a Send/Recv to this rank is allowed there, since the
  /// group posts its matching Recv/Send before waiting for either.
  bool grouped = false;

  /// Set by check_call(): count · type_size bytes (one block) and the larger buffer's bytes
  /// (size() blocks for kGather / kScatter / AllToAll, else one).
  size_t block_bytes = 0;
  size_t total_bytes = 0;

  const char* name() const { return traits(op).name; }
};

/// Validates `call` as made by rank `rank` of `size` and fills its byte counts. Throws
/// std::invalid_argument starting "<name>: rank <rank>: " for: an unknown DataType or
/// RedOp value, count·blocks overflowing size_t, a root or peer out of [0, size), a
/// Send/Recv to this rank outside a group, a null buffer this rank needs while count > 0, and
/// buffers that overlap other than in the collective's in-place layout.
void check_call(CollectiveCall& call, int rank, int size);

}  // namespace softrdma::ccl::detail
