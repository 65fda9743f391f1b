// VerbsTransport posting: the control ring's receives and the data channels' receives,
// control sends with their credits, the stripes and pieces of a send's RDMA WRITE, and the
// per-peer outbound queue that holds what the send queues or the credits do not allow yet
// (verbs_control.h explains the credits and the channels).
#include <arpa/inet.h>
#include <cstring>

#include <string>

#include "ccl/verbs_transport_impl.h"

namespace softrdma::ccl {

using namespace verbs;  // NOLINT(google-build-using-namespace): the transport's own types

void VerbsTransport::Impl::post_recv(int p, uint32_t slot) {
  ibv_sge sge{reinterpret_cast<uint64_t>(ring_slot(p, slot)), static_cast<uint32_t>(slot_bytes),
              ring_mr->lkey};
  ibv_recv_wr wr{};
  wr.wr_id = make_wr_id(Kind::kRecv, p, slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  if (int e = ibv_post_recv(peers[p].ch[0].qp, &wr, &bad)) {
    if (!failed && !peers[p].dead && !peers[p].closed)
      peer_failed(p, "ibv_post_recv failed: " + errno_text(e));
  }
}

void VerbsTransport::Impl::post_data_recv(int p, int c) {
  ibv_recv_wr wr{};
  wr.wr_id = make_wr_id(Kind::kRecv, p, 0, c);
  wr.num_sge = 0;  // a stripe's immediate only: its data lands by RDMA WRITE
  ibv_recv_wr* bad = nullptr;
  if (int e = ibv_post_recv(peers[p].ch[c].qp, &wr, &bad)) {
    if (!failed && !peers[p].dead && !peers[p].closed)
      peer_failed(p, "ibv_post_recv(channel " + std::to_string(c) + ") failed: " + errno_text(e));
  }
}

bool VerbsTransport::Impl::post_ctl(Peer& P, CtlMsg m, bool credited, const char* payload,
                                    size_t bytes) {
  uint32_t slot = P.free_slots.back();
  P.free_slots.pop_back();
  m.credits = P.credit.take_owed();
  char* buf = send_slot(P.rank, slot);
  std::memcpy(buf, &m, sizeof m);
  if (bytes) std::memcpy(buf + kCtlBytes, payload, bytes);
  ibv_sge sge{reinterpret_cast<uint64_t>(buf), static_cast<uint32_t>(kCtlBytes + bytes),
              slots_mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = make_wr_id(Kind::kCtl, P.rank, slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  if (int e = ibv_post_send(P.ch[0].qp, &wr, &bad)) {
    P.free_slots.push_back(slot);
    P.credit.untake_owed(m.credits);
    peer_failed(P.rank, "ibv_post_send failed: " + errno_text(e));
    return false;
  }
  --P.ch[0].sq_free;
  if (credited) P.credit.spend();
  return true;
}

bool VerbsTransport::Impl::post_write_piece(Peer& P, Outbound& o, Request& r) {
  const uint32_t stripes = o.adv.stripes;
  const StripeRange range = stripe_range(r.bytes, stripes, o.stripe);
  const uint64_t remaining = range.end - o.offset;
  const bool stripe_last = remaining <= max_piece;
  const uint64_t len = stripe_last ? remaining : max_piece;
  Channel& C = P.ch[o.stripe];
  ibv_sge sge{reinterpret_cast<uint64_t>(r.addr + o.offset), static_cast<uint32_t>(len), r.lkey};
  ibv_send_wr wr{};
  wr.wr_id = make_wr_id(Kind::kWrite, P.rank, o.req, static_cast<int>(o.stripe));
  wr.sg_list = len ? &sge : nullptr;
  wr.num_sge = len ? 1 : 0;
  wr.opcode = stripe_last ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  if (stripe_last) wr.imm_data = htonl(o.adv.id);
  wr.wr.rdma.remote_addr = o.adv.addr + o.offset;
  wr.wr.rdma.rkey = o.adv.rkey;
  ibv_send_wr* bad = nullptr;
  if (int e = ibv_post_send(C.qp, &wr, &bad)) {
    peer_failed(P.rank, "ibv_post_send(RDMA WRITE, channel " + std::to_string(o.stripe) +
                            ") failed: " + errno_text(e));
    return false;
  }
  --C.sq_free;
  ++r.pieces_left;
  o.offset += len;
  if (!stripe_last) return false;
  if (++o.stripe < stripes) {
    o.offset = stripe_range(r.bytes, stripes, o.stripe).begin;
    return false;
  }
  r.all_posted = true;
  return true;
}

bool VerbsTransport::Impl::post_write(Peer& P, Outbound& o) {
  auto it = reqs.find(o.req);
  if (it == reqs.end()) return true;  // cannot happen: sends are not erased before completion
  // One credit per transfer, spent before its first immediate: the receiver returns it once
  // every stripe arrived (verbs_control.h).
  if (!o.credited) {
    if (!P.credit.can_spend()) return false;
    P.credit.spend();
    o.credited = true;
  }
  while (!P.dead && !failed) {
    if (P.ch[o.stripe].sq_free < 1) return false;
    if (post_write_piece(P, o, it->second)) return true;
  }
  return false;
}

void VerbsTransport::Impl::flush(Peer& P) {
  if (!P.connected() || P.dead || failed) return;
  int& ctl_free = P.ch[0].sq_free;
  while (!P.outq.empty()) {
    Outbound& o = P.outq.front();
    if (o.is_eager) {
      if (ctl_free < 1 || !P.credit.can_spend()) break;
      auto it = reqs.find(o.req);
      if (it != reqs.end()) post_eager(P, it->second);
      P.outq.pop_front();
    } else if (o.is_write) {
      if (!post_write(P, o)) break;
      P.outq.pop_front();
    } else {
      if (ctl_free < 1 || !P.credit.can_spend()) break;
      post_ctl(P, o.msg, true);
      P.outq.pop_front();
    }
  }
  if (P.credit.return_due() && ctl_free > 0 && !P.dead) {
    CtlMsg m{};
    m.type = static_cast<uint32_t>(Ctl::kCredit);
    post_ctl(P, m, false);
  }
}

void VerbsTransport::Impl::enqueue_ctl(Peer& P, const CtlMsg& m) {
  Outbound o;
  o.msg = m;
  P.outq.push_back(o);
  flush(P);
}

void VerbsTransport::Impl::post_eager(Peer& P, Request& r) {
  CtlMsg m{};
  m.type = static_cast<uint32_t>(Ctl::kEager);
  m.tag = r.tag;
  m.length = r.bytes;
  if (!post_ctl(P, m, true, r.addr, r.bytes)) return;
  // The payload is in the send slot: the user's buffer is free again (MPI's eager send).
  r.done = true;
  --P.pending;
}

void VerbsTransport::Impl::start_write(Peer& P, RequestId id, const Advert& adv) {
  Request& r = reqs.at(id);
  if (adv.length != r.bytes) {
    local_failure(P.rank,
                  "send of " + std::to_string(r.bytes) + " bytes (tag " + std::to_string(r.tag) +
                      ") matched a recv of " + std::to_string(adv.length) + " bytes",
                  true);
    return;
  }
  if (adv.stripes < 1 || adv.stripes > P.ch.size()) {
    peer_failed(P.rank, "protocol error: advert for " + std::to_string(adv.stripes) +
                            " stripes over " + std::to_string(P.ch.size()) + " channel(s)");
    return;
  }
  Outbound o;
  o.is_write = true;
  o.req = id;
  o.adv = adv;
  P.outq.push_back(o);
  flush(P);
}

}  // namespace softrdma::ccl
