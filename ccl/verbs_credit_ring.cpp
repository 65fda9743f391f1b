// VerbsTransport posting: the control ring's receives, control sends with their credits,
// the pieces of a send's RDMA WRITE, and the per-peer outbound queue that holds what the
// send queue or the credits do not allow yet (verbs_control.h explains the credits).
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
  if (int e = ibv_post_recv(peers[p].qp, &wr, &bad)) {
    if (!failed && !peers[p].dead && !peers[p].closed)
      peer_failed(p, "ibv_post_recv failed: " + errno_text(e));
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
  if (int e = ibv_post_send(P.qp, &wr, &bad)) {
    P.free_slots.push_back(slot);
    P.credit.untake_owed(m.credits);
    peer_failed(P.rank, "ibv_post_send failed: " + errno_text(e));
    return false;
  }
  --P.sq_free;
  if (credited) P.credit.spend();
  return true;
}

bool VerbsTransport::Impl::post_write_piece(Peer& P, Outbound& o, Request& r) {
  const uint64_t remaining = r.bytes - o.offset;
  const bool last = remaining <= max_piece;
  const uint64_t len = last ? remaining : max_piece;
  ibv_sge sge{reinterpret_cast<uint64_t>(r.addr + o.offset), static_cast<uint32_t>(len), r.lkey};
  ibv_send_wr wr{};
  wr.wr_id = make_wr_id(Kind::kWrite, P.rank, o.req);
  wr.sg_list = len ? &sge : nullptr;
  wr.num_sge = len ? 1 : 0;
  wr.opcode = last ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  if (last) wr.imm_data = htonl(o.adv.id);
  wr.wr.rdma.remote_addr = o.adv.addr + o.offset;
  wr.wr.rdma.rkey = o.adv.rkey;
  ibv_send_wr* bad = nullptr;
  if (int e = ibv_post_send(P.qp, &wr, &bad)) {
    peer_failed(P.rank, "ibv_post_send(RDMA WRITE) failed: " + errno_text(e));
    return false;
  }
  --P.sq_free;
  ++r.pieces_left;
  if (last) {
    P.credit.spend();
    r.all_posted = true;
  } else {
    o.offset += len;
  }
  return last;
}

void VerbsTransport::Impl::flush(Peer& P) {
  if (!P.qp || P.dead || failed) return;
  while (!P.outq.empty()) {
    Outbound& o = P.outq.front();
    if (o.is_eager) {
      if (P.sq_free < 1 || !P.credit.can_spend()) break;
      auto it = reqs.find(o.req);
      if (it != reqs.end()) post_eager(P, it->second);
      P.outq.pop_front();
    } else if (o.is_write) {
      auto it = reqs.find(o.req);
      if (it == reqs.end()) {  // cannot happen: sends are not erased before completion
        P.outq.pop_front();
        continue;
      }
      bool finished = false;
      while (P.sq_free > 0 && !P.dead) {
        const bool last = it->second.bytes - o.offset <= max_piece;
        if (last && !P.credit.can_spend()) break;
        if (post_write_piece(P, o, it->second)) {
          finished = true;
          break;
        }
      }
      if (!finished) break;
      P.outq.pop_front();
    } else {
      if (P.sq_free < 1 || !P.credit.can_spend()) break;
      post_ctl(P, o.msg, true);
      P.outq.pop_front();
    }
  }
  if (P.credit.return_due() && P.sq_free > 0 && !P.dead) {
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
  Outbound o;
  o.is_write = true;
  o.req = id;
  o.adv = adv;
  P.outq.push_back(o);
  flush(P);
}

}  // namespace softrdma::ccl
