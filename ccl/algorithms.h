// The collective algorithms (internal to ccl/), one file each, written against Context
// alone. The Communicator validates arguments and handles size() == 1 and count == 0
// before calling them, so every algorithm may assume size() >= 2, count >= 1, non-null
// buffers, and either the NCCL in-place layout or non-overlapping buffers. Buffers are
// byte pointers; `count` is in elements of `type`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "ccl/ccl.h"
#include "ccl/context.h"

namespace softrdma::ccl::detail {

/// Pipelined ring AllReduce (allreduce_ring.cpp): n−1 reduce-scatter steps, then n−1
/// all-gather steps, over n near-equal segments cut into Config::chunk_bytes chunks, depth
/// chunks in flight per neighbour. Each rank sends and receives 2(n−1)/n of the buffer:
/// bandwidth-optimal. kAvg divides each segment once, by its owner, before the all-gather.
void all_reduce_ring(Context& ctx, const void* send, void* recv, size_t count, DataType type,
                     RedOp op);

/// The ring AllReduce above among a subset of ranks: `ranks` lists the ring in order (this
/// rank once among them, at least 2 entries), `in` / `out` are registered regions of `count`
/// elements (in.ptr == out.ptr: in place), transfers use tag `phase`. kAvg divides by
/// ctx.size(), so it is meant for the whole communicator. Errors: PeerError;
/// std::logic_error when this rank is not in `ranks`.
void all_reduce_ring_among(Context& ctx, std::span<const int> ranks, const Region& in,
                           const Region& out, size_t count, DataType type, RedOp op, uint8_t phase);

/// Hierarchical AllReduce (allreduce_hierarchical.cpp): `sites[r]` is rank r's site number.
/// Inside each site a pipelined chain reduces to the site's leader (its lowest rank); the
/// leaders run the ring AllReduce among themselves — on the buffer rounded to float16 /
/// bfloat16 when `compress` says so and the type is float32 —, then each leader broadcasts
/// down a chain inside its site (Horovod's hierarchical allreduce; NCCL's two-level tree).
/// Only the leaders' ring crosses sites: 2(L−1) steps for L sites instead of the flat ring's
/// 2(n−1), and each leader sends 2(L−1)/L of the buffer there. kAvg sums and divides once,
/// by ctx.size(), on the leaders.
void all_reduce_hierarchical(Context& ctx, std::span<const int> sites, WanCompression compress,
                             const void* send, void* recv, size_t count, DataType type, RedOp op);

/// Recursive-doubling AllReduce for any rank count (allreduce_recursive_doubling.cpp):
/// the extra ranks of a non-power-of-two group fold their data into a partner first,
/// log2(p) full-buffer exchanges run among the remaining p = 2^k ranks, and the partners
/// send the result back (Thakur, Rabenseifner, Gropp 2005, "Optimization of Collective
/// Communication Operations in MPICH", section 4.4). ⌈log2 n⌉ + 2 message latencies at most:
/// the small-message algorithm.
void all_reduce_recursive_doubling(Context& ctx, const void* send, void* recv, size_t count,
                                   DataType type, RedOp op);

/// Rabenseifner's AllReduce (allreduce_rabenseifner.cpp): reduce-scatter by recursive
/// halving, then allgather by recursive doubling, after the same non-power-of-two fold as
/// recursive doubling (Thakur, Rabenseifner, Gropp 2005, §4.4). 2·log2(p) messages carrying
/// 2(p−1)/p of the buffer per rank: the medium-size algorithm.
void all_reduce_rabenseifner(Context& ctx, const void* send, void* recv, size_t count,
                             DataType type, RedOp op);

/// Position of this rank in `ranks`; std::logic_error naming ctx.op() when it is absent.
int position_among(const Context& ctx, std::span<const int> ranks);

/// Pipelined chain Broadcast root → root+1 → … → root−1 (broadcast.cpp): every link
/// carries the buffer once, chunked, so time ≈ size/bandwidth + (n−2)·chunk latency.
void broadcast_chain(Context& ctx, const void* send, void* recv, size_t count, DataType type,
                     int root);
/// The chain Broadcast along `chain` (chain[0] the root, this rank once among them): the root
/// sends `src`, the others receive into `out` and forward from there; tag `phase`.
void broadcast_chain_among(Context& ctx, std::span<const int> chain, const Region& src,
                           const Region& out, size_t count, DataType type, uint8_t phase);
/// Binomial-tree Broadcast (broadcast.cpp): ⌈log2 n⌉ rounds of whole-buffer messages.
void broadcast_binomial(Context& ctx, const void* send, void* recv, size_t count, DataType type,
                        int root);

/// Pipelined chain Reduce root+1 → root+2 → … → root (reduce_root.cpp): each rank
/// reduces the incoming chunk with its own and forwards it.
void reduce_chain(Context& ctx, const void* send, void* recv, size_t count, DataType type, RedOp op,
                  int root);
/// The chain Reduce along `chain` (its last entry the root, this rank once among them): the
/// first rank sends `in`, the others reduce the incoming chunk with `in` and forward it, the
/// root reduces into `out` (out may be `in`); tag `phase`. kAvg divides by ctx.size().
void reduce_chain_among(Context& ctx, std::span<const int> chain, const Region& in,
                        const Region& out, size_t count, DataType type, RedOp op, uint8_t phase);
/// Binomial-tree Reduce (reduce_root.cpp): ⌈log2 n⌉ rounds of whole-buffer messages.
void reduce_binomial(Context& ctx, const void* send, void* recv, size_t count, DataType type,
                     RedOp op, int root);

/// Pipelined ring AllGather (allgather_ring.cpp): n−1 steps, each forwarding the block
/// received in the previous one.
void all_gather_ring(Context& ctx, const void* send, void* recv, size_t count, DataType type);

/// Bruck's AllGather (allgather_bruck.cpp; Bruck et al. 1997): ⌈log2 n⌉ steps for any rank
/// count, through a scratch array of n blocks rotated into the output at the end. The
/// small-message AllGather.
void all_gather_bruck(Context& ctx, const void* send, void* recv, size_t count, DataType type);

/// Pipelined ring ReduceScatter (reduce_scatter_ring.cpp): n−1 steps; partial results are
/// reduced into scratch slots and forwarded from there (the user's send buffer is never
/// written, also in place), the last step reduces into the caller's block.
void reduce_scatter_ring(Context& ctx, const void* send, void* recv, size_t count, DataType type,
                         RedOp op);

/// Recursive-halving ReduceScatter (reduce_scatter_recursive_halving.cpp; Thakur et al.
/// 2005, §4.2) with the non-power-of-two fold: log2(p) + 2 messages, the input reduced in
/// scratch (2·n·count elements) so the send buffer is never written. The small-message
/// ReduceScatter.
void reduce_scatter_recursive_halving(Context& ctx, const void* send, void* recv, size_t count,
                                      DataType type, RedOp op);

/// Pairwise-exchange AllToAll (alltoall_pairwise.cpp): in step k = 1..n−1 rank r sends
/// block r+k and receives block r−k, depth steps in flight. In place, the send buffer is
/// first copied to scratch (a block may be received before it has been sent).
void all_to_all_pairwise(Context& ctx, const void* send, void* recv, size_t count, DataType type);

/// Dissemination barrier (barrier.cpp; Hensgen, Finkel, Manber 1988): ⌈log2 n⌉ rounds of
/// empty messages to rank r+2^k.
void barrier_dissemination(Context& ctx);

/// Point-to-point send / recv of `count` elements, chunked and pipelined like the ring
/// (sendrecv.cpp). Blocks until the peer has received everything.
void send_direct(Context& ctx, const void* buf, size_t count, DataType type, int peer);
void recv_direct(Context& ctx, void* buf, size_t count, DataType type, int peer);

}  // namespace softrdma::ccl::detail
