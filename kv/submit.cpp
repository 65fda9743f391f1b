// kv::Engine's batches: allocation, submission (submit_transfer: check the batch, check every
// transfer, connect the target peers, cut the transfers into slices and queue them on the
// peers' QPs, then post) and completion (status, wait, callbacks). The progress thread
// (progress.cpp) posts the queued slices and finishes them.
#include <algorithm>
#include <string>
#include <vector>

#include "kv/engine_impl.h"
#include "kv/slicing.h"

namespace softrdma::kv {

using detail::Batch;
using detail::Peer;
using detail::Region;
using detail::Slice;

// ---- submit_transfer's steps -------------------------------------------------------------

Engine::Impl::Batch& Engine::Impl::batch_for_submit(BatchId batch, size_t transfers,
                                                    std::string_view notify,
                                                    const std::string& who) {
  if (notify.size() > Engine::kMaxNotifyBytes)
    throw std::invalid_argument(who + ": a notification carries at most " +
                                std::to_string(Engine::kMaxNotifyBytes) + " bytes");
  auto bit = batches.find(batch);
  if (bit == batches.end()) throw std::invalid_argument(who + ": unknown batch");
  Batch& b = *bit->second;
  if (b.transfers + transfers > b.capacity)
    throw std::invalid_argument(who + ": " + std::to_string(b.transfers + transfers) +
                                " transfers exceed the batch's capacity of " +
                                std::to_string(b.capacity));
  if (!b.notify.empty() && b.slices_left > 0)
    throw std::invalid_argument(who + ": the batch's notification is still pending");
  return b;
}

std::vector<Engine::Impl::CheckedTransfer> Engine::Impl::check_transfers(
    std::span<const TransferRequest> requests, std::string_view notify, const std::string& who,
    std::vector<std::string>& peer_names) const {
  std::vector<Engine::Impl::CheckedTransfer> checked;
  for (size_t i = 0; i < requests.size(); ++i) {
    const TransferRequest& r = requests[i];
    const std::string at = who + ": transfer " + std::to_string(i);
    auto sit = open_segments.find(r.target);
    if (sit == open_segments.end())
      throw std::invalid_argument(at + ": unknown segment handle " + std::to_string(r.target));
    const OpenSegment& seg = sit->second;
    if (r.length == 0) throw std::invalid_argument(at + ": zero length");
    if (r.offset > seg.seg.length || r.length > seg.seg.length - r.offset)
      throw std::invalid_argument(at + ": [" + std::to_string(r.offset) + ", +" +
                                  std::to_string(r.length) + ") is outside segment '" +
                                  seg.seg.name + "' of peer '" + seg.peer + "' (" +
                                  std::to_string(seg.seg.length) + " bytes)");
    if (r.opcode != Opcode::kRead && r.opcode != Opcode::kWrite)
      throw std::invalid_argument(at + ": opcode is neither READ nor WRITE");
    const uint64_t a = reinterpret_cast<uint64_t>(r.local);
    auto rit = regions.upper_bound(a);
    Region* region = nullptr;
    if (rit != regions.begin()) {
      Region* cand = std::prev(rit)->second.get();
      if (a >= cand->seg.addr && r.length <= cand->seg.addr + cand->seg.length - a) region = cand;
    }
    if (!region)
      throw std::invalid_argument(at + ": local memory [" + std::to_string(a) + ", +" +
                                  std::to_string(r.length) +
                                  ") is not inside one registered segment (register_memory)");
    checked.push_back({&r, region, seg});
    if (std::find(peer_names.begin(), peer_names.end(), seg.peer) == peer_names.end())
      peer_names.push_back(seg.peer);
  }
  if (!notify.empty() && peer_names.size() > 1)
    throw std::invalid_argument(who + ": a batch with a notification must target one peer");
  if (!notify.empty() && peer_names.empty())
    throw std::invalid_argument(who + ": a notification needs at least one transfer (use notify)");
  return checked;
}

void Engine::Impl::connect_targets(std::unique_lock<std::mutex>& lk, BatchId batch,
                                   const std::vector<Engine::Impl::CheckedTransfer>& checked,
                                   const std::vector<std::string>& peer_names,
                                   const std::string& who) {
  for (const std::string& p : peer_names) ensure_connected(lk, p, nullptr);
  for (const std::string& p : peer_names) {
    const Peer& peer = *peers.find(p)->second;
    if (peer.state != detail::PeerState::kConnected)
      throw KvError(who + ": peer " + peer.desc + ": " + peer.broken_reason, p);
  }
  // The peer's QPs must land on devices its segment record has keys for (a peer that came
  // back with fewer devices than its record announced).
  for (const Engine::Impl::CheckedTransfer& c : checked)
    for (const detail::Qp* q : peers.find(c.seg.peer)->second->qps)
      if (q->remote_dev >= c.seg.rkeys.size())
        throw KvError(who + ": segment '" + c.seg.seg.name + "' of peer '" + c.seg.peer +
                          "' has no key for its device " + std::to_string(q->remote_dev) +
                          " (open the segment again)",
                      c.seg.peer);
  if (batches.find(batch) == batches.end())
    throw std::invalid_argument(who + ": batch freed meanwhile");
}

std::vector<detail::Qp*> Engine::Impl::enqueue_slices(
    Batch& b, const std::vector<Engine::Impl::CheckedTransfer>& checked) {
  std::vector<detail::Qp*> touched;
  for (const Engine::Impl::CheckedTransfer& c : checked) {
    Peer& p = *peers.find(c.seg.peer)->second;
    const TransferRequest& r = *c.req;
    for (uint64_t off = 0; off < r.length;) {
      const uint64_t len = next_slice_length(r.length - off, opt.slice_bytes, context.max_msg);
      Slice& s = b.slices.emplace_back();
      s.batch = &b;
      s.region = c.region;
      s.qp = p.qps[p.stripe++ % p.qps.size()];  // QP i is on local device i % devices
      s.local = reinterpret_cast<uint64_t>(r.local) + off;
      s.remote = c.seg.seg.addr + r.offset + off;
      s.lkey = c.region->mrs[s.qp->dev]->lkey;
      s.rkey = c.seg.rkeys[s.qp->remote_dev];
      s.length = static_cast<uint32_t>(len);
      s.opcode = r.opcode;
      s.qp->queue.push_back(&s);
      ++c.region->inflight;
      ++b.slices_left;
      if (std::find(touched.begin(), touched.end(), s.qp) == touched.end()) touched.push_back(s.qp);
      off += len;
    }
    ++b.transfers;
    b.bytes_total += r.length;
  }
  return touched;
}

// ---- the API ------------------------------------------------------------------------------

BatchId Engine::allocate_batch(size_t capacity) {
  if (capacity == 0)
    throw std::invalid_argument("kv::Engine::allocate_batch ('" + impl_->name +
                                "'): capacity must be at least 1");
  std::lock_guard lk(impl_->mu);
  auto b = std::make_unique<Batch>();
  b->id = impl_->next_batch++;
  b->capacity = capacity;
  const BatchId id = b->id;
  impl_->batches[id] = std::move(b);
  return id;
}

void Engine::submit_transfer(BatchId batch, std::span<const TransferRequest> requests,
                             std::string_view notify) {
  Impl& I = *impl_;
  const std::string who =
      "kv::Engine::submit_transfer ('" + I.name + "', batch " + std::to_string(batch) + ")";
  std::unique_lock lk(I.mu);
  I.batch_for_submit(batch, requests.size(), notify, who);
  // Validate everything before anything is posted.
  std::vector<std::string> peer_names;
  const auto checked = I.check_transfers(requests, notify, who, peer_names);
  // Connect (may release mu for the handshake): the batch is looked up again afterwards.
  I.connect_targets(lk, batch, checked, peer_names, who);
  Batch& b = *I.batches.at(batch);
  const std::vector<detail::Qp*> touched = I.enqueue_slices(b, checked);
  b.notify = std::string(notify);
  b.notify_peer = notify.empty() ? std::string() : peer_names.front();
  detail::DueCallbacks due;
  for (detail::Qp* q : touched) I.pump(*q, due);
  lk.unlock();
  for (auto& [cb, args] : due) cb(args.first, args.second);
}

BatchStatus Engine::get_status(BatchId batch) const {
  std::lock_guard lk(impl_->mu);
  auto it = impl_->batches.find(batch);
  if (it == impl_->batches.end())
    throw std::invalid_argument("kv::Engine::get_status ('" + impl_->name + "'): unknown batch " +
                                std::to_string(batch));
  return impl_->status_of(*it->second);
}

void Engine::on_complete(BatchId batch, BatchCallback callback) {
  std::unique_lock lk(impl_->mu);
  auto it = impl_->batches.find(batch);
  if (it == impl_->batches.end())
    throw std::invalid_argument("kv::Engine::on_complete ('" + impl_->name + "'): unknown batch " +
                                std::to_string(batch));
  const BatchStatus s = impl_->status_of(*it->second);
  if (s.state != BatchState::kPending) {
    lk.unlock();
    callback(batch, s);
    return;
  }
  it->second->callback = std::move(callback);
}

BatchStatus Engine::wait(BatchId batch, std::chrono::milliseconds timeout) {
  std::unique_lock lk(impl_->mu);
  const auto until = Clock::now() + timeout;
  for (;;) {
    auto it = impl_->batches.find(batch);
    if (it == impl_->batches.end())
      throw std::invalid_argument("kv::Engine::wait ('" + impl_->name + "'): unknown batch " +
                                  std::to_string(batch));
    BatchStatus s = impl_->status_of(*it->second);
    if (s.state != BatchState::kPending || it->second->transfers == 0) return s;
    if (clock::wait_until(impl_->cv, lk, until) == std::cv_status::timeout)
      return impl_->status_of(*impl_->batches.at(batch));
  }
}

void Engine::free_batch(BatchId batch) {
  std::lock_guard lk(impl_->mu);
  auto it = impl_->batches.find(batch);
  if (it == impl_->batches.end())
    throw std::invalid_argument("kv::Engine::free_batch ('" + impl_->name + "'): unknown batch " +
                                std::to_string(batch));
  if (it->second->slices_left > 0)
    throw std::invalid_argument("kv::Engine::free_batch ('" + impl_->name + "'): batch " +
                                std::to_string(batch) + " still has " +
                                std::to_string(it->second->slices_left) + " slice(s) in flight");
  impl_->batches.erase(it);
}

}  // namespace softrdma::kv
