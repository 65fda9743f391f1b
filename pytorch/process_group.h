// ProcessGroupSoftrdma: a torch.distributed backend (c10d::ProcessGroup of PyTorch 1.13)
// over softrdma's collectives (ccl/ccl.h), registered from Python as backend "softrdma"
// (pytorch/softrdma_torch/__init__.py; torch.distributed.Backend.register_backend).
//
// Shape
//  - Rendezvous: the c10d::Store torch hands to the backend (env://: the TCPStore on
//    MASTER_ADDR:MASTER_PORT that torchrun sets up, prefixed per group by torch) carries
//    ccl's bootstrap exchange (StoreBootstrap, store_bootstrap.h): every rank publishes its
//    VerbsTransport connection details under its own key and reads the others'. No TCP port
//    of ccl's own bootstrap root is used.
//  - One worker thread per process group owns the ccl Communicator (not thread-safe: one
//    thread per rank) and runs the operations in the order torch called them, as Gloo's
//    backend does; every call returns at once with an asynchronous Work (wait, isCompleted,
//    exception, getFuture — DDP's communication hooks need the future).
//  - Collectives map one to one onto ccl (all_reduce, broadcast, reduce, all_gather,
//    reduce_scatter, all_to_all, barrier); list forms (allgather, reduce_scatter, alltoall)
//    pack into one contiguous buffer; gather, scatter, uneven alltoall_base and send/recv
//    are transfers posted on the communicator's Transport, which the worker polls between
//    operations so an isend/irecv never blocks the operations queued after it.
//  - Types: reductions take ccl's types (int8, uint8, int32, int64, float16, bfloat16,
//    float32, float64; float16/bfloat16 reduce in float32); operations that only move data
//    (broadcast, all_gather, alltoall, gather, scatter, send/recv) take any dtype as bytes.
//    ReduceOp SUM, PRODUCT, MIN, MAX, AVG; BAND, BOR, BXOR and PREMUL_SUM are refused.
//  - Errors: invalid or unsupported calls raise at the call (c10::Error → RuntimeError in
//    Python); a dead or stalled peer fails the Work with ccl's PeerError text, which names
//    the operation, this rank and the peer rank ("softrdma: AllReduce: rank 0: peer rank 1
//    (127.0.0.3): …"); the group then refuses further work, as an NCCL communicator in error.
//
// Tensors: CPU, dense, contiguous; one tensor per call (the single-device API).
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace softrdma::pytorch {

/// Canonical path of the libibverbs.so.1 this process loaded ("" when none is loaded).
std::string verbs_library_path();
/// Where softrdma's drop-in libibverbs.so.1 was built (build/lib).
std::string softrdma_library_dir();
/// Whether verbs_library_path() is softrdma's drop-in (the process started with
/// LD_LIBRARY_PATH=build/lib, e.g. by `softrdma run`), not the system library.
bool verbs_library_is_softrdma();

/// The backend's process group (see the file comment).
class ProcessGroupSoftrdma final : public c10d::ProcessGroup {
 public:
  /// Connects rank `rank` of `size` through `store` (collective: every rank of the group
  /// constructs one). `timeout` bounds how long an operation waits without progress from a
  /// peer (ccl's stall timeout) unless SOFTRDMA_CCL_TIMEOUT_MS is set. Throws
  /// std::runtime_error naming what failed (no verbs device — with the libibverbs in use —,
  /// the store rendezvous, a peer that never connected).
  ProcessGroupSoftrdma(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout);
  /// Runs what is still queued, gives pending send/recv up to 2 s, then closes the
  /// communicator (goodbye to the peers).
  ~ProcessGroupSoftrdma() override;

  const std::string getBackendName() const override { return "softrdma"; }
  /// This rank's verbs device address as peers see it ("127.0.0.2").
  std::string local_address() const;
  /// The verbs device in use ("srdma0").
  std::string device_name() const;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  /// Tensors of one dtype, reduced as one flat buffer.
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  /// The result lands on the root only; other ranks' tensors are left as they were.
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  /// output.numel() == size · input.numel() (all_gather_into_tensor).
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  /// input.numel() == size · output.numel() (reduce_scatter_tensor).
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  /// Empty split sizes: equal blocks (ccl AllToAll); otherwise rows of dim 0 per rank.
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  /// Sends and recvs between a pair of ranks match in call order per tag; tags in
  /// [0, 2^22).
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank,
                                      int tag) override;
  /// Not supported (ccl matches receives by peer): raises.
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  /// The worker, the communicator and the queue (process_group.cpp).
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace softrdma::pytorch
