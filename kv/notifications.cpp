// kv::Engine's notifications: short messages to a peer, sent on QP 0 of its set into the
// peer's receive slots (detail::kNotifySlots of detail::kSlotBytes), and the inbox of those
// received (the progress thread fills it).
#include <string>
#include <vector>

#include "kv/engine_impl.h"

namespace softrdma::kv {

using detail::Peer;

void Engine::notify(std::string_view peer, std::string_view message) {
  Impl& I = *impl_;
  if (message.size() > kMaxNotifyBytes)
    throw std::invalid_argument("kv::Engine::notify ('" + I.name + "'): at most " +
                                std::to_string(kMaxNotifyBytes) + " bytes, got " +
                                std::to_string(message.size()));
  std::unique_lock lk(I.mu);
  Peer& p = I.ensure_connected(lk, std::string(peer), nullptr);
  p.pending_notify.emplace_back(message);
  detail::DueCallbacks due;
  I.post_notify(p, due);
  const bool broken = p.state == detail::PeerState::kBroken;
  const std::string error =
      "kv engine '" + I.name + "': notify to peer " + p.desc + ": " + p.broken_reason;
  lk.unlock();
  for (auto& [cb, args] : due) cb(args.first, args.second);
  if (broken) throw KvError(error, std::string(peer));
}

std::vector<Notification> Engine::get_notifications() {
  std::lock_guard lk(impl_->mu);
  std::vector<Notification> out(std::make_move_iterator(impl_->inbox.begin()),
                                std::make_move_iterator(impl_->inbox.end()));
  impl_->inbox.clear();
  return out;
}

std::optional<Notification> Engine::wait_notification(std::chrono::milliseconds timeout) {
  std::unique_lock lk(impl_->mu);
  if (!clock::wait_for(impl_->cv, lk, timeout, [&] { return !impl_->inbox.empty(); }))
    return std::nullopt;
  Notification n = std::move(impl_->inbox.front());
  impl_->inbox.pop_front();
  return n;
}

}  // namespace softrdma::kv
