// ProcessGroupSoftrdma (process_group.h): argument checks and the mapping of each c10d
// operation onto ccl, run on one worker thread per group.
//
// Tags of the transfers the backend posts on the Transport itself (ccl's Communicator uses
// bit 63 = 0 for its collectives and bit 63 = 1 only for its own Send/Recv, which this
// backend never calls):
//   bits 63..62 = 10: gather / scatter / uneven alltoall; bits 32..61 count these
//                     operations (every rank calls them in the same order)
//   bits 63..62 = 11: send / recv; bits 40..61 the torch tag, bits 0..39 the number of
//                     earlier sends (at the sender) / recvs (at the receiver) between this
//                     pair with that tag, so they match in call order.
#include "pytorch/process_group.h"

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <dlfcn.h>

#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "base/clock.h"
#include "base/params.h"
#include "ccl/bootstrap.h"
#include "ccl/ccl.h"
#include "ccl/verbs_transport.h"
#include "pytorch/store_bootstrap.h"

namespace softrdma::pytorch {
namespace {

using ccl::DataType;
using ccl::RedOp;
using Clock = softrdma::clock::Steady;  // virtual under time dilation (base/clock.h)
using c10d::OpType;

constexpr uint64_t kCollectiveTransfer = uint64_t{2} << 62;
constexpr uint64_t kPointToPoint = uint64_t{3} << 62;
constexpr int kMaxTag = 1 << 22;
constexpr uint64_t kP2pSeqMask = (uint64_t{1} << 40) - 1;
// How long the destructor lets pending sends/recvs finish before failing them.
constexpr auto kStopGrace = std::chrono::seconds(2);
// Longest pause of the worker between polls of pending sends/recvs while idle.
constexpr auto kMaxPollPause = std::chrono::microseconds(500);

/// Raises the c10::Error (RuntimeError in Python) of a call this backend refuses.
[[noreturn]] void refuse(const char* op, const std::string& why) {
  C10_THROW_ERROR(Error, c10::str("softrdma backend: ", op, ": ", why));
}

/// CPU, strided (dense) and, when `contiguous`, contiguous.
void check_tensor(const at::Tensor& t, const char* op, bool contiguous = true) {
  if (!t.defined()) refuse(op, "undefined tensor");
  if (!t.device().is_cpu())
    refuse(op, "tensor on " + t.device().str() + ": only CPU tensors are supported");
  if (t.layout() != at::kStrided) refuse(op, "only dense (strided) tensors are supported");
  if (contiguous && !t.is_contiguous())
    refuse(op, "tensor must be contiguous (call .contiguous() first)");
}

const at::Tensor& single(const std::vector<at::Tensor>& v, const char* op) {
  if (v.size() != 1)
    refuse(op, "expects exactly one tensor per call, got " + std::to_string(v.size()));
  check_tensor(v[0], op);
  return v[0];
}

/// Every tensor of `v` has the dtype and element count of `like`.
void check_same(const std::vector<at::Tensor>& v, const at::Tensor& like, const char* op,
                bool contiguous) {
  for (const at::Tensor& t : v) {
    check_tensor(t, op, contiguous);
    if (t.scalar_type() != like.scalar_type())
      refuse(op, std::string("dtype mismatch: ") + c10::toString(t.scalar_type()) + " vs " +
                     c10::toString(like.scalar_type()));
    if (t.numel() != like.numel())
      refuse(op, "size mismatch: " + std::to_string(t.numel()) + " vs " +
                     std::to_string(like.numel()) + " elements");
  }
}

void check_rank(int r, int size, const char* what, const char* op) {
  if (r < 0 || r >= size)
    refuse(op, std::string(what) + " " + std::to_string(r) + " out of range [0, " +
                   std::to_string(size) + ")");
}

/// ccl's element type for a reduction of `t`'s dtype.
DataType reduction_type(const at::Tensor& t, const char* op) {
  switch (t.scalar_type()) {
    case at::kChar:
      return DataType::kInt8;
    case at::kByte:
      return DataType::kUint8;
    case at::kInt:
      return DataType::kInt32;
    case at::kLong:
      return DataType::kInt64;
    case at::kHalf:
      return DataType::kFloat16;
    case at::kBFloat16:
      return DataType::kBfloat16;
    case at::kFloat:
      return DataType::kFloat32;
    case at::kDouble:
      return DataType::kFloat64;
    default:
      refuse(op, std::string("dtype ") + c10::toString(t.scalar_type()) +
                     " cannot be reduced (supported: int8, uint8, int32, int64, float16, "
                     "bfloat16, float32, float64)");
  }
}

/// ccl's operator for torch's ReduceOp.
RedOp reduction_op(const c10d::ReduceOp& op, const char* name) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return RedOp::kSum;
    case c10d::ReduceOp::PRODUCT:
      return RedOp::kProd;
    case c10d::ReduceOp::MIN:
      return RedOp::kMin;
    case c10d::ReduceOp::MAX:
      return RedOp::kMax;
    case c10d::ReduceOp::AVG:
      return RedOp::kAvg;
    default:
      break;
  }
  static const char* const kNames[] = {"SUM",  "AVG", "PRODUCT", "MIN",        "MAX",
                                       "BAND", "BOR", "BXOR",    "PREMUL_SUM", "UNUSED"};
  const unsigned i = op.op_;
  refuse(name, std::string("ReduceOp.") + (i < std::size(kNames) ? kNames[i] : "?") +
                   " is not supported (supported: SUM, PRODUCT, MIN, MAX, AVG)");
}

/// Copies the tensors of `v` one after the other into `dst` (flat, large enough).
at::Tensor pack(const std::vector<at::Tensor>& v, at::Tensor dst) {
  int64_t off = 0;
  for (const at::Tensor& t : v) {
    dst.narrow(0, off, t.numel()).view(t.sizes()).copy_(t);
    off += t.numel();
  }
  return dst;
}

int64_t total_numel(const std::vector<at::Tensor>& v) {
  int64_t n = 0;
  for (const at::Tensor& t : v) n += t.numel();
  return n;
}

/// Copies consecutive runs of `from` into the tensors of `to`.
void unpack(const at::Tensor& from, std::vector<at::Tensor>& to) {
  int64_t off = 0;
  for (at::Tensor& t : to) {
    t.copy_(from.narrow(0, off, t.numel()).view(t.sizes()));
    off += t.numel();
  }
}

/// The message of an exception, without c10::Error's C++ backtrace.
std::string message_of(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

/// An asynchronous operation of this backend: completed by the worker thread.
class Work final : public c10d::Work {
 public:
  Work(int rank, OpType type, const char* title, std::vector<at::Tensor> outputs)
      : c10d::Work(rank, type, title),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {}

  std::vector<at::Tensor> result() override { return outputs_; }
  /// Completed with the output tensors, or with the operation's error.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  /// Marks the future (running its callbacks, e.g. DDP's) and then the Work complete.
  void complete(std::exception_ptr error) {
    if (error)
      future_->setError(error);
    else
      future_->markCompleted(c10::IValue(outputs_));
    finish(error);
  }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

/// Registered buffers and the transfers posted on them for one operation.
struct Transfers {
  std::vector<std::unique_ptr<ccl::Buffer>> buffers;
  std::vector<ccl::RequestId> requests;
  std::vector<bool> done;
  const char* op = "";
};

}  // namespace

std::string verbs_library_path() {
  Dl_info info{};
  void* sym = ::dlsym(RTLD_DEFAULT, "ibv_get_device_name");
  if (!sym || !::dladdr(sym, &info) || !info.dli_fname) return "";
  std::error_code ec;
  auto p = std::filesystem::canonical(info.dli_fname, ec);
  return ec ? std::string(info.dli_fname) : p.string();
}

std::string softrdma_library_dir() {
  return SOFTRDMA_DROPIN_DIR;
}

bool verbs_library_is_softrdma() {
  const std::string p = verbs_library_path();
  std::error_code ec;
  auto dir = std::filesystem::canonical(softrdma_library_dir(), ec);
  return !p.empty() && !ec && std::filesystem::path(p).parent_path() == dir;
}

struct ProcessGroupSoftrdma::Impl {
  struct Job {
    c10::intrusive_ptr<Work> work;
    std::function<void()> run;             // a blocking operation, or
    std::function<void(Transfers&)> post;  // posts transfers polled by the worker
  };
  struct Pending {
    c10::intrusive_ptr<Work> work;
    Transfers transfers;
  };

  Impl(int r, int n) : rank(r), size(n) {}
  ~Impl() { stop(); }

  int rank;
  int size;
  std::string address;
  std::string device;
  std::unique_ptr<ccl::Communicator> comm;

  std::mutex mu;
  std::condition_variable cv;
  std::deque<Job> queue;  // guarded by mu
  bool stopping = false;  // guarded by mu
  std::thread worker;

  // Worker thread only.
  std::deque<Pending> pending;
  std::vector<uint8_t> scratch_bytes[2];
  uint64_t collective_transfers = 0;
  std::map<std::pair<int, int>, uint64_t> send_seq;  // (peer, tag) → sends posted
  std::map<std::pair<int, int>, uint64_t> recv_seq;  // (peer, tag) → recvs posted

  c10::intrusive_ptr<c10d::Work> enqueue(OpType type, const char* title,
                                         std::vector<at::Tensor> outputs, std::function<void()> run,
                                         std::function<void(Transfers&)> post = nullptr) {
    auto work = c10::make_intrusive<Work>(rank, type, title, std::move(outputs));
    {
      std::lock_guard<std::mutex> lock(mu);
      TORCH_CHECK(!stopping, "softrdma backend: ", title, ": process group is shutting down");
      queue.push_back(Job{work, std::move(run), std::move(post)});
    }
    cv.notify_one();
    return work;
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    cv.notify_one();
    if (worker.joinable()) worker.join();
    comm.reset();
  }

  // The error a Work completes with: the operation's own message, prefixed "softrdma: ".
  static std::exception_ptr wrap(const std::exception& e) {
    return std::make_exception_ptr(std::runtime_error("softrdma: " + message_of(e)));
  }

  void execute(Job& job) {
    try {
      if (job.post) {
        Pending p{job.work, {}};
        job.post(p.transfers);
        pending.push_back(std::move(p));
        return;
      }
      job.run();
    } catch (const std::exception& e) {
      job.work->complete(wrap(e));
      return;
    }
    job.work->complete(nullptr);
  }

  // Tests the pending transfers once; completes the operations whose transfers all ended.
  // Returns whether any request completed.
  bool poll_pending() {
    bool progressed = false;
    for (auto it = pending.begin(); it != pending.end();) {
      Transfers& x = it->transfers;
      bool all = true;
      try {
        for (size_t i = 0; i < x.requests.size(); ++i) {
          if (x.done[i]) continue;
          if (comm->transport().test(x.requests[i], x.op)) {
            x.done[i] = true;
            progressed = true;
          } else {
            all = false;
          }
        }
      } catch (const std::exception& e) {
        it->work->complete(wrap(e));
        it = pending.erase(it);
        progressed = true;
        continue;
      }
      if (all) {
        it->work->complete(nullptr);
        it = pending.erase(it);
      } else {
        ++it;
      }
    }
    return progressed;
  }

  void fail_pending(const char* why) {
    for (Pending& p : pending)
      p.work->complete(std::make_exception_ptr(
          std::runtime_error(std::string("softrdma: ") + p.transfers.op + ": rank " +
                             std::to_string(rank) + ": " + why)));
    pending.clear();
  }

  // Runs queued jobs in order; between them, and while idle, polls pending sends/recvs with
  // a pause that doubles up to kMaxPollPause while nothing completes (a new job ends it).
  void run_worker() {
    std::chrono::microseconds pause{0};
    std::optional<Clock::time_point> stop_deadline;
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      if (queue.empty()) {
        if (stopping && !stop_deadline) stop_deadline = Clock::now() + kStopGrace;
        if (pending.empty()) {
          if (stopping) break;
          cv.wait(lock, [&] { return stopping || !queue.empty(); });
          continue;
        }
        if (stop_deadline && Clock::now() > *stop_deadline) {
          lock.unlock();
          fail_pending("process group destroyed while the transfer was pending");
          lock.lock();
          continue;
        }
        if (pause.count() > 0)
          softrdma::clock::wait_for(cv, lock, pause, [&] { return !queue.empty(); });
      }
      std::optional<Job> job;
      if (!queue.empty()) {
        job = std::move(queue.front());
        queue.pop_front();
      }
      lock.unlock();
      if (job) execute(*job);
      const bool progressed = !pending.empty() && poll_pending();
      lock.lock();
      pause = job || progressed ? std::chrono::microseconds(0)
                                : std::min(pause * 2 + std::chrono::microseconds(1), kMaxPollPause);
    }
  }

  // send (is_send) or recv of tensors[0] to / from `peer`: checked here, posted by the
  // worker with the next tag of (peer, tag) in this direction, polled until complete.
  c10::intrusive_ptr<c10d::Work> point_to_point(bool is_send, std::vector<at::Tensor>& tensors,
                                                int peer, int tag) {
    const char* op = is_send ? "send" : "recv";
    const at::Tensor t = single(tensors, op);
    check_rank(peer, size, is_send ? "destination rank" : "source rank", op);
    if (peer == rank) refuse(op, std::string(op) + " to or from this rank itself");
    if (tag < 0 || tag >= kMaxTag) refuse(op, "tag must lie in [0, 2^22)");
    return enqueue(
        is_send ? OpType::SEND : OpType::RECV, is_send ? "softrdma:send" : "softrdma:recv", {t},
        nullptr, [this, is_send, t, peer, tag](Transfers& x) {
          x.op = is_send ? "Send" : "Recv";
          const uint64_t seq = (is_send ? send_seq : recv_seq)[{peer, tag}]++;
          post(x, is_send, peer, t, kPointToPoint | (uint64_t(tag) << 40) | (seq & kP2pSeqMask));
        });
  }

  // gather (to_root): rank r's mine[0] lands in lists[0][r] at the root; scatter: the
  // root's lists[0][r] lands in rank r's mine[0]. One transfer per non-root rank.
  c10::intrusive_ptr<c10d::Work> rooted(bool to_root, std::vector<at::Tensor>& mine,
                                        std::vector<std::vector<at::Tensor>>& lists,
                                        int64_t root_rank) {
    const char* op = to_root ? "gather" : "scatter";
    const at::Tensor t = single(mine, op);
    check_rank(static_cast<int>(root_rank), size, "root", op);
    const int root = static_cast<int>(root_rank);
    std::vector<at::Tensor> list;
    if (rank == root) {
      if (lists.size() != 1 || lists[0].size() != static_cast<size_t>(size))
        refuse(op, "the root expects one list of world_size tensors");
      check_same(lists[0], t, op, true);
      list = lists[0];
    } else if (!lists.empty() && !lists[0].empty()) {
      refuse(op, "only the root takes a list of tensors");
    }
    return enqueue(to_root ? OpType::GATHER : OpType::SCATTER,
                   to_root ? "softrdma:gather" : "softrdma:scatter", to_root ? list : mine,
                   [this, to_root, t, list, root] {
                     Transfers x;
                     x.op = to_root ? "Gather" : "Scatter";
                     const uint64_t tag = next_collective_tag();
                     if (rank != root) {
                       post(x, to_root, root, t, tag);
                     } else {
                       for (int r = 0; r < size; ++r)
                         if (r != root) post(x, !to_root, r, list[static_cast<size_t>(r)], tag);
                       (to_root ? list[static_cast<size_t>(root)] : t)
                           .copy_(to_root ? t : list[static_cast<size_t>(root)]);
                     }
                     wait_all(x);
                   });
  }

  // A flat tensor of `numel` elements of `dtype` in packing buffer `slot` (0 or 1; worker
  // thread only, valid until the next call for that slot). The buffers only grow, so the
  // list forms of the collectives neither page-fault a fresh buffer nor register a new one
  // (ccl's registration cache hits) on every call.
  at::Tensor scratch(int64_t numel, at::ScalarType dtype, int slot = 0) {
    std::vector<uint8_t>& b = scratch_bytes[slot];
    const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
    if (b.size() < bytes) b.resize(std::max(bytes, 2 * b.size()));
    return at::from_blob(b.data(), {numel}, at::TensorOptions().dtype(dtype));
  }

  // ---- transfers on the Transport ---------------------------------------------------------

  void post(Transfers& x, bool is_send, int peer, const at::Tensor& t, uint64_t tag) {
    ccl::Transport& tr = comm->transport();
    const size_t bytes = t.nbytes();
    x.buffers.push_back(tr.register_buffer(t.data_ptr(), bytes));
    ccl::Buffer& b = *x.buffers.back();
    x.requests.push_back(is_send ? tr.send(peer, b, 0, bytes, tag)
                                 : tr.recv(peer, b, 0, bytes, tag));
    x.done.push_back(false);
  }

  // Waits for every transfer of `x` (blocking operations built on transfers).
  void wait_all(Transfers& x) {
    for (size_t i = 0; i < x.requests.size(); ++i)
      if (!x.done[i]) comm->transport().wait(x.requests[i], x.op);
  }

  uint64_t next_collective_tag() {
    return kCollectiveTransfer | ((collective_transfers++ & 0x3fffffffu) << 32);
  }

  // Each rank sends send[r] to rank r and receives recv[r] from it (alltoallv); its own
  // block is copied.
  void exchange(const char* op, const std::vector<at::Tensor>& send,
                std::vector<at::Tensor>& recv) {
    Transfers x;
    x.op = op;
    const uint64_t tag = next_collective_tag();
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      post(x, false, r, recv[static_cast<size_t>(r)], tag);
    }
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      post(x, true, r, send[static_cast<size_t>(r)], tag);
    }
    recv[static_cast<size_t>(rank)].copy_(send[static_cast<size_t>(rank)]);
    wait_all(x);
  }
};

ProcessGroupSoftrdma::ProcessGroupSoftrdma(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int size, std::chrono::milliseconds timeout)
    : c10d::ProcessGroup(rank, size), impl_(std::make_unique<Impl>(rank, size)) {
  ccl::VerbsOptions opt = ccl::VerbsOptions::from_environment();
  if (!params::raw(params::kCclTimeoutMs) && timeout.count() > 0) opt.timeout = timeout;
  StoreBootstrap boot(store, rank, size);
  std::unique_ptr<ccl::VerbsTransport> transport;
  try {
    transport = ccl::VerbsTransport::connect(boot, opt);
  } catch (const std::exception& e) {
    std::string hint;
    if (!verbs_library_is_softrdma())
      hint = " [this process uses " +
             (verbs_library_path().empty() ? std::string("no libibverbs") : verbs_library_path()) +
             ", not softrdma's drop-in in " + softrdma_library_dir() +
             ": start it with `softrdma run -- ...` or LD_LIBRARY_PATH=" + softrdma_library_dir() +
             "]";
    throw std::runtime_error("softrdma backend: rank " + std::to_string(rank) + " of " +
                             std::to_string(size) + ": " + message_of(e) + hint);
  }
  impl_->address = transport->local_address();
  impl_->device = transport->device_name();
  impl_->comm = std::make_unique<ccl::Communicator>(std::move(transport));
  impl_->worker = std::thread([impl = impl_.get()] { impl->run_worker(); });
  init();
}

ProcessGroupSoftrdma::~ProcessGroupSoftrdma() {
  impl_->stop();
}

std::string ProcessGroupSoftrdma::local_address() const {
  return impl_->address;
}

std::string ProcessGroupSoftrdma::device_name() const {
  return impl_->device;
}

// ---- collectives ------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupSoftrdma::allreduce(std::vector<at::Tensor>& tensors,
                                                               const c10d::AllreduceOptions& opts) {
  constexpr const char* kOp = "all_reduce";
  const at::Tensor t = single(tensors, kOp);
  const DataType type = reduction_type(t, kOp);
  const RedOp op = reduction_op(opts.reduceOp, kOp);
  ccl::Communicator& c = *impl_->comm;
  return impl_->enqueue(OpType::ALLREDUCE, "softrdma:all_reduce", {t}, [&c, t, type, op] {
    c.all_reduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), type, op);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSoftrdma::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  constexpr const char* kOp = "all_reduce_coalesced";
  if (tensors.empty()) refuse(kOp, "no tensors");
  check_tensor(tensors[0], kOp);
  for (const at::Tensor& t : tensors) {
    check_tensor(t, kOp);
    if (t.scalar_type() != tensors[0].scalar_type()) refuse(kOp, "tensors of different dtypes");
  }
  const DataType type = reduction_type(tensors[0], kOp);
  const RedOp op = reduction_op(opts.reduceOp, kOp);
  Impl* impl = impl_.get();
  return impl_->enqueue(OpType::ALLREDUCE_COALESCED, "softrdma:all_reduce_coalesced", tensors,
                        [impl, tensors, type, op]() mutable {
                          at::Tensor buf = pack(tensors, impl->scratch(total_numel(tensors),
                                                                       tensors[0].scalar_type()));
                          impl->comm->all_reduce(buf.data_ptr(), buf.data_ptr(),
                                                 static_cast<size_t>(buf.numel()), type, op);
                          unpack(buf, tensors);
                        });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSoftrdma::broadcast(std::vector<at::Tensor>& tensors,
                                                               const c10d::BroadcastOptions& opts) {
  constexpr const char* kOp = "broadcast";
  const at::Tensor t = single(tensors, kOp);
  if (opts.rootTensor != 0) refuse(kOp, "rootTensor must be 0 (one tensor per rank)");
  check_rank(static_cast<int>(opts.rootRank), getSize(), "root", kOp);
  const int root = static_cast<int>(opts.rootRank);
  ccl::Communicator& c = *impl_->comm;
  return impl_->enqueue(OpType::BROADCAST, "softrdma:broadcast", {t}, [&c, t, root] {
    c.broadcast(t.data_ptr(), t.data_ptr(), t.nbytes(), DataType::kUint8, root);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSoftrdma::reduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::ReduceOptions& opts) {
  constexpr const char* kOp = "reduce";
  const at::Tensor t = single(tensors, kOp);
  if (opts.rootTensor != 0) refuse(kOp, "rootTensor must be 0 (one tensor per rank)");
  check_rank(static_cast<int>(opts.rootRank), getSize(), "root", kOp);
  const DataType type = reduction_type(t, kOp);
  const RedOp op = reduction_op(opts.reduceOp, kOp);
  const int root = static_cast<int>(opts.rootRank);
  const bool is_root = root == getRank();
  ccl::Communicator& c = *impl_->comm;
  return impl_->enqueue(OpType::REDUCE, "softrdma:reduce", {t}, [&c, t, type, op, root, is_root] {
    c.reduce(t.data_ptr(), is_root ? t.data_ptr() : nullptr, static_cast<size_t>(t.numel()), type,
             op, root);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSoftrdma::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
  constexpr const char* kOp = "all_gather";
  const at::Tensor in = single(inputs, kOp);
  if (outputs.size() != 1 || outputs[0].size() != static_cast<size_t>(getSize()))
    refuse(kOp,
           "expects one list of world_size (" + std::to_string(getSize()) + ") output tensors");
  check_same(outputs[0], in, kOp, false);
  std::vector<at::Tensor> out = outputs[0];
  const int n = getSize();
  Impl* impl = impl_.get();
  return impl_->enqueue(
      OpType::ALLGATHER, "softrdma:all_gather", out, [impl, in, out, n]() mutable {
        at::Tensor buf = impl->scratch(n * in.numel(), in.scalar_type());
        impl->comm->all_gather(in.data_ptr(), buf.data_ptr(), in.nbytes(), DataType::kUint8);
        unpack(buf, out);
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSoftrdma::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions&) {
  constexpr const char* kOp = "all_gather_into_tensor";
  check_tensor(input, kOp);
  check_tensor(output, kOp);
  if (output.scalar_type() != input.scalar_type()) refuse(kOp, "output and input dtypes differ");
  if (output.numel() != input.numel() * getSize())
    refuse(kOp, "output has " + std::to_string(output.numel()) +
                    " elements, expected world_size x input = " +
                    std::to_string(input.numel() * getSize()));
  ccl::Communicator& c = *impl_->comm;
  const at::Tensor in = input;
  const at::Tensor out = output;
  return impl_->enqueue(
      OpType::_ALLGATHER_BASE, "softrdma:all_gather_into_tensor", {out}, [&c, in, out] {
        c.all_gather(in.data_ptr(), out.data_ptr(), in.nbytes(), DataType::kUint8);
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSoftrdma::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
  constexpr const char* kOp = "all_gather_coalesced";
  if (inputs.empty()) refuse(kOp, "no input tensors");
  if (outputs.size() != static_cast<size_t>(getSize()))
    refuse(kOp, "expects world_size (" + std::to_string(getSize()) + ") output lists");
  for (const at::Tensor& t : inputs) {
    check_tensor(t, kOp);
    if (t.scalar_type() != inputs[0].scalar_type()) refuse(kOp, "inputs of different dtypes");
  }
  std::vector<at::Tensor> out;  // rank-major: rank r's copy of every input
  for (const auto& list : outputs) {
    if (list.size() != inputs.size())
      refuse(kOp, "each output list must have one tensor per input tensor");
    for (size_t i = 0; i < list.size(); ++i) {
      check_same({list[i]}, inputs[i], kOp, false);
      out.push_back(list[i]);
    }
  }
  Impl* impl = impl_.get();
  const int n = getSize();
  return impl_->enqueue(OpType::ALLGATHER_COALESCED, "softrdma:all_gather_coalesced", out,
                        [impl, inputs, out, n]() mutable {
                          const at::ScalarType dt = inputs[0].scalar_type();
                          const int64_t count = total_numel(inputs);
                          at::Tensor in = pack(inputs, impl->scratch(count, dt, 0));
                          at::Tensor buf = impl->scratch(n * count, dt, 1);
                          impl->comm->all_gather(in.data_ptr(), buf.data_ptr(), in.nbytes(),
                                                 DataType::kUint8);
                          unpack(buf, out);
                        });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSoftrdma::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  return impl_->rooted(true, inputs, outputs, opts.rootRank);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSoftrdma::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  return impl_->rooted(false, outputs, inputs, opts.rootRank);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSoftrdma::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  constexpr const char* kOp = "reduce_scatter";
  const at::Tensor out = single(outputs, kOp);
  if (inputs.size() != 1 || inputs[0].size() != static_cast<size_t>(getSize()))
    refuse(kOp, "expects one list of world_size (" + std::to_string(getSize()) + ") input tensors");
  check_same(inputs[0], out, kOp, false);
  const DataType type = reduction_type(out, kOp);
  const RedOp op = reduction_op(opts.reduceOp, kOp);
  std::vector<at::Tensor> in = inputs[0];
  Impl* impl = impl_.get();
  return impl_->enqueue(
      OpType::REDUCE_SCATTER, "softrdma:reduce_scatter", {out}, [impl, in, out, type, op] {
        at::Tensor buf = pack(in, impl->scratch(total_numel(in), out.scalar_type()));
        impl->comm->reduce_scatter(buf.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()),
                                   type, op);
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSoftrdma::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  constexpr const char* kOp = "reduce_scatter_tensor";
  check_tensor(input, kOp);
  check_tensor(output, kOp);
  if (output.scalar_type() != input.scalar_type()) refuse(kOp, "output and input dtypes differ");
  if (input.numel() != output.numel() * getSize())
    refuse(kOp, "input has " + std::to_string(input.numel()) +
                    " elements, expected world_size x output = " +
                    std::to_string(output.numel() * getSize()));
  const DataType type = reduction_type(output, kOp);
  const RedOp op = reduction_op(opts.reduceOp, kOp);
  ccl::Communicator& c = *impl_->comm;
  const at::Tensor in = input;
  const at::Tensor out = output;
  return impl_->enqueue(OpType::_REDUCE_SCATTER_BASE, "softrdma:reduce_scatter_tensor", {out},
                        [&c, in, out, type, op] {
                          c.reduce_scatter(in.data_ptr(), out.data_ptr(),
                                           static_cast<size_t>(out.numel()), type, op);
                        });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSoftrdma::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions&) {
  constexpr const char* kOp = "all_to_all_single";
  check_tensor(input, kOp);
  check_tensor(output, kOp);
  if (output.scalar_type() != input.scalar_type()) refuse(kOp, "output and input dtypes differ");
  const int n = getSize();
  const at::Tensor in = input;
  const at::Tensor out = output;
  ccl::Communicator& c = *impl_->comm;
  if (output_split_sizes.empty() && input_split_sizes.empty()) {
    if (in.numel() != out.numel() || in.numel() % n != 0)
      refuse(kOp, "equal splits need input and output of one size divisible by world_size");
    if (in.dim() > 0 && in.size(0) % n != 0)
      refuse(kOp, "dim 0 (" + std::to_string(in.size(0)) + ") not divisible by world_size");
    return impl_->enqueue(
        OpType::ALLTOALL_BASE, "softrdma:all_to_all_single", {out}, [&c, in, out, n] {
          c.all_to_all(in.data_ptr(), out.data_ptr(), in.nbytes() / n, DataType::kUint8);
        });
  }
  // Uneven splits (rows of dim 0 per rank): one transfer per pair of ranks.
  auto splits = [&](std::vector<int64_t> s, const at::Tensor& t, const char* which) {
    if (t.dim() == 0) refuse(kOp, std::string(which) + " must have at least one dimension");
    if (s.empty()) {
      if (t.size(0) % n != 0) refuse(kOp, std::string(which) + " dim 0 not divisible");
      s.assign(static_cast<size_t>(n), t.size(0) / n);
    }
    if (s.size() != static_cast<size_t>(n))
      refuse(kOp, std::string(which) + " split sizes: expected world_size entries");
    int64_t sum = 0;
    for (int64_t v : s) {
      if (v < 0) refuse(kOp, std::string(which) + " split sizes must not be negative");
      sum += v;
    }
    if (sum != t.size(0))
      refuse(kOp, std::string(which) + " split sizes sum to " + std::to_string(sum) +
                      ", dim 0 is " + std::to_string(t.size(0)));
    std::vector<at::Tensor> parts;
    int64_t off = 0;
    for (int64_t v : s) {
      parts.push_back(t.narrow(0, off, v));
      off += v;
    }
    return parts;
  };
  std::vector<at::Tensor> send = splits(input_split_sizes, in, "input");
  std::vector<at::Tensor> recv = splits(output_split_sizes, out, "output");
  if (in.numel() > 0 && out.numel() > 0 && in.numel() / in.size(0) != out.numel() / out.size(0))
    refuse(kOp, "input and output rows differ in size");
  Impl* impl = impl_.get();
  return impl_->enqueue(OpType::ALLTOALL_BASE, "softrdma:all_to_all_single", {out},
                        [impl, send, recv]() mutable { impl->exchange("AllToAllv", send, recv); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSoftrdma::alltoall(std::vector<at::Tensor>& outputs,
                                                              std::vector<at::Tensor>& inputs,
                                                              const c10d::AllToAllOptions&) {
  constexpr const char* kOp = "all_to_all";
  const size_t n = static_cast<size_t>(getSize());
  if (outputs.size() != n || inputs.size() != n)
    refuse(kOp, "expects world_size (" + std::to_string(n) + ") input and output tensors");
  bool equal = true;
  for (size_t r = 0; r < n; ++r) {
    check_tensor(inputs[r], kOp);
    check_tensor(outputs[r], kOp);
    if (inputs[r].scalar_type() != inputs[0].scalar_type() ||
        outputs[r].scalar_type() != inputs[0].scalar_type())
      refuse(kOp, "tensors of different dtypes");
    equal =
        equal && inputs[r].numel() == inputs[0].numel() && outputs[r].numel() == inputs[0].numel();
  }
  std::vector<at::Tensor> in = inputs;
  std::vector<at::Tensor> out = outputs;
  if (equal) {
    Impl* impl = impl_.get();
    return impl_->enqueue(OpType::ALLTOALL, "softrdma:all_to_all", out, [impl, in, out]() mutable {
      const at::ScalarType dt = in[0].scalar_type();
      at::Tensor send = pack(in, impl->scratch(total_numel(in), dt, 0));
      at::Tensor recv = impl->scratch(send.numel(), dt, 1);
      impl->comm->all_to_all(send.data_ptr(), recv.data_ptr(), in[0].nbytes(), DataType::kUint8);
      unpack(recv, out);
    });
  }
  Impl* impl = impl_.get();
  return impl_->enqueue(OpType::ALLTOALL, "softrdma:all_to_all", out,
                        [impl, in, out]() mutable { impl->exchange("AllToAllv", in, out); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSoftrdma::barrier(const c10d::BarrierOptions&) {
  ccl::Communicator& c = *impl_->comm;
  return impl_->enqueue(OpType::BARRIER, "softrdma:barrier", {}, [&c] { c.barrier(); });
}

// ---- point to point ---------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupSoftrdma::send(std::vector<at::Tensor>& tensors,
                                                          int dst_rank, int tag) {
  return impl_->point_to_point(true, tensors, dst_rank, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSoftrdma::recv(std::vector<at::Tensor>& tensors,
                                                          int src_rank, int tag) {
  return impl_->point_to_point(false, tensors, src_rank, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSoftrdma::recvAnysource(std::vector<at::Tensor>&, int) {
  refuse("recv", "receiving from any source is not supported: name the source rank");
}

}  // namespace softrdma::pytorch
