// VerbsTransport requests and matching: a recv advertises its buffer and the number of
// stripes it wants, a send waits for the advert of its tag (FIFO per tag) and writes into
// it; each stripe's immediate names the transfer id, and the last one completes the recv;
// transfers to self are matched here with memmove.
#include <cstring>
#include <stdexcept>
#include <string>

#include "ccl/verbs_transport_impl.h"

namespace softrdma::ccl {

using namespace verbs;  // NOLINT(google-build-using-namespace): the transport's own types

namespace {

// Takes the oldest entry of `tag` from a per-tag FIFO table (dropping the tag's queue when
// it empties); false when there is none.
template <class T>
bool take_oldest(std::unordered_map<uint64_t, std::deque<T>>& fifo, uint64_t tag, T& out) {
  auto it = fifo.find(tag);
  if (it == fifo.end() || it->second.empty()) return false;
  out = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) fifo.erase(it);
  return true;
}

}  // namespace

const VerbsBuffer& VerbsTransport::Impl::check_buffer(const Buffer& buf, size_t offset,
                                                      size_t bytes, const char* what) const {
  auto* vb = dynamic_cast<const VerbsBuffer*>(&buf);
  if (!vb || vb->owner() != this)
    throw std::invalid_argument(std::string(what) +
                                ": buffer was not registered with this transport");
  if (offset > vb->size() || bytes > vb->size() - offset)
    throw std::invalid_argument(std::string(what) + ": range [" + std::to_string(offset) + ", +" +
                                std::to_string(bytes) + ") outside the buffer of " +
                                std::to_string(vb->size()) + " bytes");
  return *vb;
}

void VerbsTransport::Impl::check_peer(int peer, const char* what) const {
  if (peer < 0 || peer >= size)
    throw std::invalid_argument(std::string(what) + ": peer " + std::to_string(peer) +
                                " out of range [0, " + std::to_string(size) + ")");
}

RequestId VerbsTransport::Impl::new_request(bool is_send, int peer, const VerbsBuffer& vb,
                                            size_t offset, size_t bytes, uint64_t tag) {
  RequestId id = next_req++;
  Request r;
  r.is_send = is_send;
  r.peer = peer;
  r.tag = tag;
  r.addr = static_cast<char*>(vb.data()) + (vb.data() ? offset : 0);
  r.bytes = bytes;
  r.lkey = vb.lkey();
  r.rkey = vb.rkey();
  r.posted = Clock::now();
  reqs.emplace(id, r);
  return id;
}

// Self transfers: complete a matched pair with memcpy.
void VerbsTransport::Impl::match_self(uint64_t tag) {
  auto s = self_sends.find(tag);
  auto r = self_recvs.find(tag);
  while (s != self_sends.end() && r != self_recvs.end() && !s->second.empty() &&
         !r->second.empty()) {
    Request& rs = reqs.at(s->second.front());
    Request& rr = reqs.at(r->second.front());
    if (rs.bytes != rr.bytes)
      throw std::invalid_argument("send to self of " + std::to_string(rs.bytes) +
                                  " bytes matched a recv of " + std::to_string(rr.bytes) +
                                  " bytes (tag " + std::to_string(tag) + ")");
    if (rs.bytes) std::memmove(rr.addr, rs.addr, rs.bytes);
    rs.done = rr.done = true;
    s->second.pop_front();
    r->second.pop_front();
  }
  if (s != self_sends.end() && s->second.empty()) self_sends.erase(s);
  if (r != self_recvs.end() && r->second.empty()) self_recvs.erase(r);
}

Peer* VerbsTransport::Impl::begin_request(bool is_send, int peer, const Buffer& buf, size_t offset,
                                          size_t bytes, uint64_t tag, RequestId& id) {
  const char* what = is_send ? "send" : "recv";
  check_peer(peer, what);
  const VerbsBuffer& vb = check_buffer(buf, offset, bytes, what);
  if (peer != rank) wait_for_room(peers[peer], true);
  id = new_request(is_send, peer, vb, offset, bytes, tag);
  if (peer == rank) {
    (is_send ? self_sends : self_recvs)[tag].push_back(id);
    match_self(tag);
    return nullptr;
  }
  Peer& P = peers[peer];
  ++P.pending;
  return failed ? nullptr : &P;  // after a failure, wait()/test() report it
}

RequestId VerbsTransport::Impl::send(int peer, const Buffer& buf, size_t offset, size_t bytes,
                                     uint64_t tag) {
  RequestId id = 0;
  Peer* to = begin_request(true, peer, buf, offset, bytes, tag, id);
  if (!to) return id;
  Peer& P = *to;
  if (bytes <= P.eager_max) {
    auto a = P.adverts.find(tag);
    if (a != P.adverts.end() && !a->second.empty()) {
      // The receiver advertised, so it wants more than the eager limit.
      size_mismatch(P, tag, bytes, a->second.front().length);
      return id;
    }
    Outbound o;
    o.is_eager = true;
    o.req = id;
    P.outq.push_back(o);
    flush(P);  // posts it now when the send queue and the credits allow
    return id;
  }
  Advert adv{};
  if (take_oldest(P.adverts, tag, adv))
    start_write(P, id, adv);
  else
    P.sends_waiting[tag].push_back(id);
  return id;
}

RequestId VerbsTransport::Impl::recv(int peer, Buffer& buf, size_t offset, size_t bytes,
                                     uint64_t tag) {
  RequestId id = 0;
  Peer* from = begin_request(false, peer, buf, offset, bytes, tag, id);
  if (!from) return id;
  Peer& P = *from;
  if (bytes <= P.eager_max) {
    std::vector<char> data;
    if (take_oldest(P.unexpected, tag, data)) {
      P.credit.reposted();  // the slot it came in was reposted long ago: return its credit
      if (data.size() != bytes) {
        size_mismatch(P, tag, data.size(), bytes);
        return id;
      }
      Request& r = reqs.at(id);
      if (bytes) std::memcpy(r.addr, data.data(), bytes);
      r.done = true;
      --P.pending;
    } else {
      P.eager_recvs[tag].push_back(id);
    }
    return id;
  }
  // An eager transfer of this tag that arrived before this recv was posted: the sender sent
  // at most the eager limit, this recv wants more (on_eager covers the other order).
  if (std::vector<char> data; take_oldest(P.unexpected, tag, data)) {
    P.credit.reposted();
    size_mismatch(P, tag, data.size(), bytes);
    return id;
  }
  const uint32_t tid = P.next_id++;
  P.recvs[tid] = id;
  CtlMsg m{};
  m.type = static_cast<uint32_t>(Ctl::kAdvert);
  m.tag = tag;
  Request& r = reqs.at(id);
  m.addr = reinterpret_cast<uint64_t>(r.addr);
  m.length = bytes;
  m.rkey = r.rkey;
  m.id = tid;
  m.stripes = stripe_count(bytes, static_cast<uint32_t>(P.ch.size()), opt.channel_min_bytes);
  r.stripes_left = m.stripes;
  enqueue_ctl(P, m);
  return id;
}

Request& VerbsTransport::Impl::find(RequestId id, const char* what) {
  auto it = reqs.find(id);
  if (it == reqs.end())
    throw std::invalid_argument(std::string(what) + ": unknown or completed request " +
                                std::to_string(id));
  return it->second;
}

void VerbsTransport::Impl::on_advert(Peer& P, const Advert& a, uint64_t tag) {
  RequestId id = 0;
  if (take_oldest(P.sends_waiting, tag, id))
    start_write(P, id, a);
  else
    P.adverts[tag].push_back(a);
}

void VerbsTransport::Impl::size_mismatch(Peer& P, uint64_t tag, size_t sent, size_t wanted) {
  local_failure(P.rank,
                "send of " + std::to_string(sent) + " bytes (tag " + std::to_string(tag) +
                    ") matched a recv of " + std::to_string(wanted) + " bytes",
                true);
}

void VerbsTransport::Impl::on_eager(Peer& P, uint64_t tag, const char* data, size_t bytes) {
  RequestId id = 0;
  if (take_oldest(P.eager_recvs, tag, id)) {
    P.credit.reposted();
    auto r = reqs.find(id);
    if (r == reqs.end()) return;
    if (r->second.bytes != bytes) {
      size_mismatch(P, tag, bytes, r->second.bytes);
      return;
    }
    if (bytes) std::memcpy(r->second.addr, data, bytes);
    r->second.done = true;
    --P.pending;
    return;
  }
  // A rendezvous recv of this tag waits: it wants more than the eager limit.
  for (const auto& [tid, rid] : P.recvs) {
    auto r = reqs.find(rid);
    if (r != reqs.end() && r->second.tag == tag) {
      P.credit.reposted();
      size_mismatch(P, tag, bytes, r->second.bytes);
      return;
    }
  }
  P.unexpected[tag].emplace_back(data, data + bytes);  // credit returned when taken
}

void VerbsTransport::Impl::on_data(Peer& P, uint32_t id) {
  auto it = P.recvs.find(id);
  if (it == P.recvs.end()) {
    peer_failed(P.rank, "protocol error: data for unknown transfer " + std::to_string(id));
    return;
  }
  auto r = reqs.find(it->second);
  if (r == reqs.end()) {  // cannot happen: recvs are not erased before completion
    P.credit.reposted();
    P.recvs.erase(it);
    return;
  }
  if (r->second.stripes_left > 1) {
    --r->second.stripes_left;
    return;
  }
  // The last stripe: the transfer's one credit goes back (its slots were reposted as each
  // immediate arrived).
  P.credit.reposted();
  r->second.stripes_left = 0;
  r->second.done = true;
  --P.pending;
  P.recvs.erase(it);
}

}  // namespace softrdma::ccl
