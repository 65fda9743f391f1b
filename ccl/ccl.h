// softrdma collectives: NCCL-style AllReduce, Broadcast, Reduce, AllGather,
// ReduceScatter, AllToAll, Barrier and Send/Recv over a Transport (ccl/transport.h).
// Written against plain verbs only (through VerbsTransport), so the same code runs over
// softrdma or over RDMA NICs with the system libibverbs.
//
// Semantics follow NCCL (docs.nvidia.com/deeplearning/nccl, "Collective Operations"):
// counts are in elements; for AllGather `count` is the per-rank contribution and `recv`
// holds size()·count elements; for ReduceScatter `count` is the per-rank result and `send`
// holds size()·count elements; for AllToAll `count` elements go to each rank. In-place is
// send == recv (for AllGather: send == recv + rank·count; for ReduceScatter: recv == send +
// rank·count), as in NCCL. Calls are blocking and collective: every rank calls the same
// operations in the same order with matching arguments. Between group_start() and
// group_end() calls are deferred and issued together (NCCL "Group Calls"; ccl/group.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "ccl/transport.h"

namespace softrdma::ccl {

/// Element types (NCCL's ncclDataType_t names). float16 / bfloat16 reduce in float32.
enum class DataType : uint8_t {
  kInt8,
  kUint8,
  kInt32,
  kUint32,
  kInt64,
  kUint64,
  kFloat16,
  kBfloat16,
  kFloat32,
  kFloat64
};
/// Reduction operators (ncclRedOp_t). kAvg divides the sum by size() (integers truncate).
enum class RedOp : uint8_t { kSum, kProd, kMax, kMin, kAvg };

/// Bytes per element.
size_t type_size(DataType t);
/// "int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "bfloat16", "float",
/// "double" — the spellings nccl-tests prints.
const char* type_name(DataType t);
/// "sum", "prod", "max", "min", "avg".
const char* op_name(RedOp op);
/// Parses the names above (nccl-tests `-d` / `-o` values; also "float16", "bf16",
/// "float32", "float64"). Returns false for an unknown name.
bool parse_type(const std::string& s, DataType& out);
bool parse_op(const std::string& s, RedOp& out);

/// Algorithm choice (NCCL_ALGO-like; environment
/// SOFTRDMA_CCL_ALGO=ring|rd|rabenseifner|hierarchical|auto).
enum class Algorithm : uint8_t {
  kAuto,               ///< by message size and rank count
  kRing,               ///< pipelined ring (bandwidth)
  kRecursiveDoubling,  ///< recursive doubling / halving-doubling (latency), any rank count
  /// AllReduce as reduce-scatter (recursive halving) + allgather (recursive doubling), any
  /// rank count (Thakur, Rabenseifner, Gropp 2005); collectives without such a variant take
  /// their kAuto choice.
  kRabenseifner,
  /// AllReduce by site (Config::site): reduce inside each site to its leader, AllReduce
  /// among the leaders, broadcast inside each site (the two-level AllReduce of Horovod's
  /// HOROVOD_HIERARCHICAL_ALLREDUCE and NCCL's tree across nodes); other collectives take
  /// their kAuto choice.
  kHierarchical,
};

/// Compression of the wide-area hop of the hierarchical AllReduce (environment
/// SOFTRDMA_CCL_WAN_COMPRESS=none|fp16|bf16): float32 data is rounded to this type (nearest,
/// ties to even) for the leaders' AllReduce and widened back; other types are sent as they
/// are.
enum class WanCompression : uint8_t { kNone, kFloat16, kBfloat16 };

/// Tunables (environment SOFTRDMA_CCL_CHUNK_BYTES, SOFTRDMA_CCL_DEPTH,
/// SOFTRDMA_CCL_DEPTH_FROM_PATH, SOFTRDMA_CCL_ALGO,
/// SOFTRDMA_CCL_SITE, SOFTRDMA_CCL_WAN_COMPRESS, SOFTRDMA_CCL_TIMEOUT_MS override the
/// defaults).
struct Config {
  /// The bounds every Config must respect (validated by the Communicator; the environment
  /// parser refuses values outside them). A chunk is at least one byte (the algorithms round
  /// it up to one element) and at most 1 GiB, so a single RDMA WRITE stays well under the
  /// 2 GiB message limit; depth is the number of chunks in flight per peer, bounded by what a
  /// QP's send queue sensibly holds (VerbsTransport lets 2 × kMaxDepth requests per peer
  /// proceed without back-pressure).
  static constexpr size_t kMaxChunkBytes = size_t{1} << 30;
  static constexpr int kMaxDepth = 256;

  Algorithm algorithm = Algorithm::kAuto;
  size_t chunk_bytes = 512 * 1024;  ///< pipeline chunk of the ring, bytes
  int depth = 4;                    ///< chunks in flight per peer (the floor, see below)
  /// Raise the depth towards `peer` to cover the path's bandwidth-delay product:
  /// ⌈Transport::path_bytes(peer) ÷ chunk_bytes⌉ chunks, at least `depth`, at most kMaxDepth
  /// (and never more chunks than the transfer has). The ring keeps a window of chunks in
  /// flight per peer, so its rate is at most depth × chunk_bytes ÷ RTT: the default 4 ×
  /// 512 KiB holds a 100 Gbit/s port busy for an RTT of 170 µs, a 10 Gbit/s × 50 ms path at
  /// 3 % of its rate. false: `depth` on every path (SOFTRDMA_CCL_DEPTH_FROM_PATH=0).
  bool depth_from_path = true;
  size_t small_bytes = 64 * 1024;  ///< auto: at or below this, the latency algorithm
  /// auto, AllReduce with more than 2 ranks: above small_bytes and at or below this,
  /// Rabenseifner; above (and with 2 ranks), the ring.
  size_t medium_bytes = 1024 * 1024;
  /// The longest site name (bytes), so that names travel in fixed 64-byte slots.
  static constexpr size_t kMaxSiteName = 63;
  /// This rank's site (data centre), "" = unnamed. When it is set, or the algorithm is
  /// kHierarchical, the ranks exchange their sites at the first AllReduce (every rank must
  /// then have it set, or the algorithm forced: the exchange is a collective); ranks with
  /// the same name form one site, unnamed ranks one more.
  std::string site;
  /// Rounding of the leaders' AllReduce in the hierarchical AllReduce (float32 only).
  WanCompression wan_compress = WanCompression::kNone;
  /// Reads the SOFTRDMA_CCL_* variables over the defaults; throws std::invalid_argument on
  /// malformed values.
  static Config from_environment();
};

/// A group of ranks that run collectives together. Not thread-safe: one thread per rank.
class Communicator {
 public:
  /// Takes over a connected transport.
  Communicator(std::unique_ptr<Transport> transport, Config config = Config::from_environment());
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int size() const;
  Transport& transport();

  // All collectives throw std::invalid_argument for invalid arguments (null buffers with
  // count > 0, count·size overflowing size_t, root out of range, type/op combinations
  // that make no sense) and PeerError (naming the operation, this rank and the peer) when
  // a peer dies or stalls.
  void all_reduce(const void* send, void* recv, size_t count, DataType type, RedOp op);
  void broadcast(const void* send, void* recv, size_t count, DataType type, int root);
  void reduce(const void* send, void* recv, size_t count, DataType type, RedOp op, int root);
  void all_gather(const void* send, void* recv, size_t count, DataType type);
  void reduce_scatter(const void* send, void* recv, size_t count, DataType type, RedOp op);
  void all_to_all(const void* send, void* recv, size_t count, DataType type);
  /// Point-to-point (ncclSend / ncclRecv): `count` elements of `type` to / from `peer`.
  /// Outside a group they block until the transfer completed; inside one, they are issued
  /// at the outermost group_end(). Sends and recvs between an ordered pair of ranks match in
  /// call order, grouped or not. Send and recv to this rank are allowed inside a group only
  /// (outside one they could never complete: std::invalid_argument).
  void send(const void* buf, size_t count, DataType type, int peer);
  void recv(void* buf, size_t count, DataType type, int peer);
  void barrier();

  /// Group calls (ncclGroupStart / ncclGroupEnd; NCCL docs, "Group Calls"). Calls made
  /// between group_start() and the matching group_end() are validated when made
  /// (std::invalid_argument as outside a group) but issued only at the outermost
  /// group_end(); groups nest, inner ends issue nothing. At group_end() the group's
  /// collectives run first, in call order, then all its Send/Recv are posted together and
  /// progress concurrently, chunked with Config::depth chunks in flight per peer and
  /// direction — so any set of sends and recvs that matches across ranks completes in
  /// whatever order each rank called them (a ring {send to next, recv from prev}, an
  /// all-to-all), where ungrouped blocking calls would deadlock. Buffers must stay valid
  /// and unmodified (send) / untouched (recv) until group_end() returns.
  ///
  /// Errors end the group (no half-open group is left behind): an invalid argument inside
  /// a group throws at that call, discards the calls made so far in the group and leaves
  /// the communicator usable (nothing was issued); group_end() without group_start() throws
  /// std::invalid_argument; a PeerError at group_end() ("GroupEnd: rank r: peer rank p …")
  /// leaves the communicator failed, as any other operation's.
  void group_start();
  void group_end();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace softrdma::ccl
