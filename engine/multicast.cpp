// UD multicast of one device: the groups its QPs are attached to (ibv_attach_mcast), the
// socket that receives each group, and the delivery of a group's datagram to every attached
// QP. IBTA vol 1, 10.5.2.3 (multicast: destination QPN 0xFFFFFF, a copy to each attached QP)
// and annex A17.4.6 (RoCEv2: the group is the IP multicast address of the GID); Linux rxe
// (rxe_mcast.c attach/detach, rxe_recv.c rxe_rcv_mcast_pkt) for the behaviour verbs users see.
//
// On the host's network the device joins the IPv4 group on the interface of its own address
// (IGMP on a real interface; on 127.0.0.0/8 the loopback, where the kernel loops the
// datagrams back to every member socket). A sender needs nothing special: a UD send to a
// multicast GID goes by UDP to the group's address (never the same-host rings, which are
// point to point) and the kernel copies it to every device on the host that joined.
#include <sys/epoll.h>

#include <algorithm>
#include <cstring>

#include "engine/device.h"
#include "engine/log.h"
#include "engine/qp.h"

namespace softrdma::engine {

Status Device::attach_mcast(uint32_t qpn, uint32_t group, bool& added) {
  added = false;
  if (!IN_MULTICAST(group)) return std::errc::invalid_argument;
  std::lock_guard lk(mu_);
  if (!qps_.count(qpn)) return std::errc::invalid_argument;
  auto it = mcast_.find(group);
  if (it == mcast_.end()) {
    if (mcast_.size() >= DeviceLimits::kMaxMcastGrp) return std::errc::not_enough_memory;
    auto g = std::make_unique<McastGroup>();
    if (int e = g->port.join_group(group, wire::kRoceV2Port, ip(), socket_buffer_bytes_); e != 0) {
      log().warn("cannot join multicast group {} on {}'s interface: {}", net::ipv4_to_string(group),
                 net::ipv4_to_string(ip()), std::strerror(e));
      return static_cast<Status>(e);
    }
    g->port.enable_header_info();  // TTL and TOS for the GRH placed in receive buffers
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = g->port.fd();  // any descriptor the progress thread does not know: a group
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, g->port.fd(), &ev);
    log().debug("joined multicast group {}", net::ipv4_to_string(group));
    it = mcast_.emplace(group, std::move(g)).first;
  }
  std::vector<uint32_t>& qpns = it->second->qpns;
  if (std::find(qpns.begin(), qpns.end(), qpn) != qpns.end()) return kOk;
  if (qpns.size() >= DeviceLimits::kMaxMcastQpAttach) return std::errc::not_enough_memory;
  qpns.push_back(qpn);
  added = true;
  return kOk;
}

Status Device::detach_mcast(uint32_t qpn, uint32_t group) {
  std::lock_guard lk(mu_);
  auto it = mcast_.find(group);
  if (it == mcast_.end()) return std::errc::invalid_argument;
  std::vector<uint32_t>& qpns = it->second->qpns;
  auto q = std::find(qpns.begin(), qpns.end(), qpn);
  if (q == qpns.end()) return std::errc::invalid_argument;
  qpns.erase(q);
  leave_if_unused_locked(it);
  return kOk;
}

void Device::detach_all_mcast_locked(uint32_t qpn) {
  for (auto it = mcast_.begin(); it != mcast_.end();) {
    std::erase(it->second->qpns, qpn);
    it = leave_if_unused_locked(it);
  }
}

Device::McastGroups::iterator Device::leave_if_unused_locked(McastGroups::iterator it) {
  if (!it->second->qpns.empty()) return std::next(it);
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, it->second->port.fd(), nullptr);
  log().debug("left multicast group {}", net::ipv4_to_string(it->first));
  return mcast_.erase(it);  // closing the socket leaves the group
}

size_t Device::receive_mcast_locked() {
  size_t total = 0;
  // Groups change only under the device lock, which this round holds, and handling a
  // datagram runs no application code: the table can be walked as it is.
  for (auto& [group, g] : mcast_) {
    for (;;) {
      const size_t n = g->port.recv_batch(rx_slots_);
      if (n == 0) break;
      bump(counters_->mcast_rcvd_pkts, n);
      for (size_t i = 0; i < n; ++i) {
        const net::RxDatagram& d = rx_slots_[i];
        // One datagram per buffer: the group sockets have no GRO. dst_ip is the group.
        handle_packet(d, d.data, d.length, 0, /*from_shm=*/false);
      }
      total += n;
      if (n < rx_slots_.size()) break;
    }
  }
  if (total) last_rx_ns_.store(now_ns(), std::memory_order_relaxed);
  return total;
}

void Device::deliver_mcast(const net::RxDatagram& d, const wire::Packet& pkt, uint16_t ip_id,
                           size_t length) {
  // Only a datagram to the multicast QPN is a multicast one (IBTA 10.5.2.3); a group's
  // datagram to any other QPN has no QP to go to.
  auto it = mcast_.find(d.dst_ip);
  if (pkt.hdr.bth.dest_qpn != wire::kMulticastQpn || it == mcast_.end()) {
    count_drop(RxCheck::kUnknownQpn);
    return;
  }
  bump_locked(counters_->rcvd_pkts);
  bump_locked(counters_->rcvd_bytes, length);
  const RxMeta meta{d.src_ip, d.dst_ip, d.tos, d.ttl, ip_id, static_cast<uint16_t>(length)};
  // Each attached QP gets its copy, through the checks a unicast datagram to it would pass
  // (rxe_rcv_mcast_pkt: check_type_state and check_keys per QP).
  for (uint32_t qpn : it->second->qpns) {  // detaching needs the lock this round holds
    auto q = qps_.find(qpn);
    if (q == qps_.end()) continue;
    QueuePair& qp = *q->second;
    RxCheck check = check_type_state(pkt, qp);
    if (check == RxCheck::kAccept) check = check_keys(qp, pkt);
    if (check != RxCheck::kAccept) {
      count_drop(check);
      continue;
    }
    bump(counters_->mcast_delivered);
    holding_completions_ = true;
    qp.type_info().on_request(qp, pkt, meta, *this);
    holding_completions_ = false;
  }
}

}  // namespace softrdma::engine
