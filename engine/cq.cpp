#include "engine/cq.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "engine/transport.h"

namespace softrdma::engine {

void Transport::deliver_recv_completion(CompletionQueue& cq, const Cqe& cqe, bool solicited) {
  cq.push(cqe, solicited);
}

CompletionChannel::CompletionChannel() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) == 0) {
    read_fd_ = fds[0];
    write_fd_ = fds[1];
    // The writer (engine, under the device lock) must never block; one record per armed
    // CQ is all that can be outstanding, far below the pipe's capacity.
    ::fcntl(write_fd_, F_SETFL, O_NONBLOCK);
  }
}

CompletionChannel::~CompletionChannel() {
  if (read_fd_ >= 0) ::close(read_fd_);
  if (write_fd_ >= 0) ::close(write_fd_);
}

void CompletionChannel::notify(void* handle) {
  ssize_t r = ::write(write_fd_, &handle, sizeof handle);
  (void)r;  // a full pipe means the application stopped reading events; nothing to do
}

CompletionQueue::CompletionQueue(ObjectRegistry& dev, uint32_t capacity, CompletionChannel* channel,
                                 void* event_handle, QueueMemory memory)
    : dev_(dev),
      channel_(channel),
      event_handle_(event_handle),
      memory_(std::move(memory)),
      ring_(capacity, resource_of(memory_)),
      times_(resource_of(memory_)) {
  if (channel_) channel_->users++;
}

CompletionQueue::~CompletionQueue() {
  if (channel_) channel_->users--;
}

bool CompletionQueue::push(const Cqe& cqe, bool solicited) {
  std::lock_guard lk(mu_);
  if (count_ == ring_.size()) {
    if (!overrun_ && on_overrun) on_overrun();
    overrun_ = true;  // IBTA 11.4.2.1: CQ overrun is an error of the CQ
    return false;
  }
  const size_t slot = (head_ + count_) % ring_.size();
  ring_[slot] = cqe;
  if (!times_.empty()) {
    times_[slot] = {clock::now_ns(), clock::realtime_ns()};
  }
  ++count_;
  if (arm_ == Arm::kAll ||
      (arm_ == Arm::kSolicited && (solicited || cqe.status != WcStatus::kSuccess))) {
    arm_ = Arm::kNone;
    if (channel_) channel_->notify(event_handle_);
  }
  return true;
}

void CompletionQueue::record_completion_times() {
  std::lock_guard lk(mu_);
  times_.assign(ring_.size(), CompletionTime{});
}

int CompletionQueue::pop_locked(int n, Cqe* out, CompletionTime* times) {
  int k = 0;
  while (k < n && count_ > 0) {
    if (times) times[k] = times_.empty() ? CompletionTime{} : times_[head_];
    out[k++] = ring_[head_];
    head_ = (head_ + 1) % ring_.size();
    --count_;
  }
  return k;
}

int CompletionQueue::poll(int n, Cqe* out) {
  return poll(n, out, nullptr);
}

int CompletionQueue::poll(int n, Cqe* out, CompletionTime* times) {
  if (n <= 0) return 0;
  {
    std::lock_guard lk(mu_);
    if (overrun_) return -1;
    if (count_ > 0) return pop_locked(n, out, times);
  }
  dev_.try_progress();
  std::lock_guard lk(mu_);
  if (overrun_) return -1;
  return pop_locked(n, out, times);
}

void CompletionQueue::purge_qp(uint32_t qpn) {
  std::lock_guard lk(mu_);
  size_t kept = 0;
  for (size_t i = 0; i < count_; ++i) {
    const size_t from = (head_ + i) % ring_.size();
    if (ring_[from].qp_num == qpn) continue;
    const size_t to = (head_ + kept) % ring_.size();
    ring_[to] = ring_[from];
    if (!times_.empty()) times_[to] = times_[from];
    ++kept;
  }
  count_ = kept;
}

std::errc CompletionQueue::resize(uint32_t capacity) {
  std::lock_guard lk(mu_);
  if (capacity == 0 || capacity > DeviceLimits::kMaxCqe || capacity < count_)
    return std::errc::invalid_argument;
  std::pmr::vector<Cqe> ring(capacity, resource_of(memory_));
  std::pmr::vector<CompletionTime> times(times_.empty() ? 0 : capacity, resource_of(memory_));
  for (size_t i = 0; i < count_; ++i) {
    const size_t from = (head_ + i) % ring_.size();
    ring[i] = ring_[from];
    if (!times_.empty()) times[i] = times_[from];
  }
  ring_.swap(ring);
  times_.swap(times);
  head_ = 0;
  return std::errc{};
}

int CompletionQueue::request_notify(bool solicited_only) {
  std::lock_guard lk(mu_);
  // Arming for all completions overrides a solicited-only arm, never the reverse.
  if (solicited_only) {
    if (arm_ == Arm::kNone) arm_ = Arm::kSolicited;
  } else {
    arm_ = Arm::kAll;
  }
  return 0;
}

}  // namespace softrdma::engine
