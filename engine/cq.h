// Completion queues and completion channels (IBTA vol 1, 11.4.2; verbs ibv_create_cq,
// ibv_req_notify_cq, ibv_get_cq_event).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <system_error>
#include <vector>

#include "engine/object_registry.h"
#include "engine/queue_memory.h"
#include "engine/types.h"

namespace softrdma::engine {

/// A completion channel: a pipe whose read end is the fd applications poll/epoll on. Each
/// completion event writes one pointer-sized record (the CQ's event handle) to it.
class CompletionChannel {
 public:
  CompletionChannel();
  ~CompletionChannel();
  CompletionChannel(const CompletionChannel&) = delete;
  CompletionChannel& operator=(const CompletionChannel&) = delete;

  /// True if the pipe was created.
  bool ok() const { return read_fd_ >= 0; }
  /// The fd readable when an event is queued (ibv_comp_channel::fd).
  int fd() const { return read_fd_; }
  /// Queues an event for the CQ whose event handle is `handle`.
  void notify(void* handle);
  /// CQs attached; destroy is refused (EBUSY) while > 0.
  std::atomic<int> users{0};

 private:
  int read_fd_ = -1;
  int write_fd_ = -1;
};

/// When a CQE entered its CQ (ibv_wc_read_completion_ts / _wallclock_ns).
struct CompletionTime {
  uint64_t monotonic_ns = 0;  // clock::now_ns() (CLOCK_MONOTONIC / SOFTRDMA_TDF)
  uint64_t realtime_ns = 0;   // clock::realtime_ns() (wall clock, dilated alike)
};

/// A completion queue: a bounded FIFO of CQEs, produced by the engine under the device
/// lock, consumed by poll() from application threads.
class CompletionQueue {
 public:
  /// `capacity` CQEs (already validated against DeviceLimits::kMaxCqe). `channel` may be
  /// null; `event_handle` is what an event on the channel reports (the ibv_cq*).
  /// `memory` holds the ring (null: the heap; sized with queue_bytes(capacity,
  /// sizeof(Cqe))); a ring resized by resize() is allocated from it too.
  CompletionQueue(ObjectRegistry& dev, uint32_t capacity, CompletionChannel* channel,
                  void* event_handle, QueueMemory memory = nullptr);
  ~CompletionQueue();

  uint32_t capacity() const { return static_cast<uint32_t>(ring_.size()); }

  /// Appends a CQE; `solicited` marks a receive completion of a message sent with the
  /// solicited event bit. Fires the channel if the CQ is armed accordingly. Returns false
  /// (and latches the overrun flag) if the CQ is full.
  bool push(const Cqe& cqe, bool solicited);

  /// Moves up to `n` CQEs into `out`; returns how many. When the CQ is empty, drives the
  /// device's progress once on the caller's thread (busy-polling callers get packets
  /// processed without waiting for the progress thread). Returns -1 after an overrun.
  int poll(int n, Cqe* out);
  /// As poll(n, out), and `times[i]` gets the time CQE i was pushed (zeros unless
  /// record_completion_times() was called before the first push).
  int poll(int n, Cqe* out, CompletionTime* times);

  /// Stamps every CQE pushed from now on with the (dilated) monotonic and wall clocks (two
  /// clock reads per completion, so only CQs created with a timestamp wc_flag pay them).
  /// Call before the CQ is used.
  void record_completion_times();

  /// Removes every CQE of QP `qpn` not polled yet (the QP went back to RESET: its stale
  /// completions, e.g. the flushed receives of its ERR state, must not reach the reused
  /// QP's poller — mlx5's and mlx4's modify to RESET clean the CQs the same way).
  void purge_qp(uint32_t qpn);

  /// Changes the capacity to `capacity` CQEs, keeping the CQEs not polled yet in order
  /// (ibv_resize_cq; rxe_cq_resize_queue). std::errc::invalid_argument, nothing changed,
  /// for 0, more than DeviceLimits::kMaxCqe, or fewer than the CQEs it holds now (as
  /// rxe_cq_chk_attr). An overrun CQ stays overrun.
  std::errc resize(uint32_t capacity);

  /// Arms the CQ: the next completion (or next solicited receive completion when
  /// `solicited_only`) fires one event on the channel. Returns 0.
  int request_notify(bool solicited_only);

  /// QPs that use this CQ; destroy is refused (EBUSY) while > 0.
  std::atomic<int> users{0};

  /// Called once, when the CQ first overruns (IBTA 11.4.2.1; rxe raises IB_EVENT_CQ_ERR
  /// then), from the thread that pushed, with the CQ's lock held: it must not block or
  /// touch this CQ. Set before the CQ is used.
  std::function<void()> on_overrun;

 private:
  int pop_locked(int n, Cqe* out, CompletionTime* times);

  ObjectRegistry& dev_;
  CompletionChannel* channel_;
  void* event_handle_;
  std::mutex mu_;
  QueueMemory memory_;  // before ring_ and times_: it outlives them
  std::pmr::vector<Cqe> ring_;
  std::pmr::vector<CompletionTime> times_;  // parallel to ring_ when completion times are recorded
  size_t head_ = 0;                         // next to poll
  size_t count_ = 0;
  enum class Arm : uint8_t { kNone, kSolicited, kAll } arm_ = Arm::kNone;
  bool overrun_ = false;
};

}  // namespace softrdma::engine
