#include "engine/placement.h"

#include <algorithm>
#include <cstring>

#include "engine/memory.h"

namespace softrdma::engine::placement {

uint8_t* check_remote(QueuePair& qp, Transport& t, uint32_t rkey, uint64_t va, uint64_t len,
                      uint32_t need) {
  if (!(qp.attr.access_flags & need)) return nullptr;
  MemoryRegion* mr = t.find_mr(rkey);
  if (!mr || &mr->pd() != &qp.responder_pd() || !(mr->access() & need)) return nullptr;
  return mr->translate(va, len);
}

uint32_t message_psns(const QueuePair& qp, uint64_t dma_length) {
  return dma_length == 0 ? 1u : static_cast<uint32_t>((dma_length + qp.mtu - 1) / qp.mtu);
}

Outcome scatter(QueuePair& qp, Transport& t, uint64_t offset, std::span<const uint8_t> data) {
  const RecvWqe& r = *qp.resp.wqe;
  if (offset + data.size() > r.length) return Outcome::kLength;
  ProtectionDomain& pd = qp.responder_pd();
  size_t done = 0;
  for (const Sge& s : r.sges) {
    if (done == data.size()) break;
    if (offset >= s.length) {
      offset -= s.length;
      continue;
    }
    const size_t take = std::min<size_t>(s.length - offset, data.size() - done);
    MemoryRegion* mr = t.find_mr(s.lkey);
    if (!mr || &mr->pd() != &pd || !(mr->access() & kLocalWrite)) return Outcome::kProtection;
    uint8_t* p = mr->translate(s.addr + offset, take);
    if (!p) return Outcome::kProtection;
    std::memcpy(p, data.data() + done, take);
    done += take;
    offset = 0;
  }
  return Outcome::kDone;
}

Outcome send(QueuePair& qp, const wire::Packet& pkt, Transport& t) {
  const uint32_t m = pkt.info->mask;
  if (m & (wire::kIsFirst | wire::kIsOnly)) {
    if (!qp.take_recv_wqe()) return Outcome::kNoRecvWqe;
    qp.resp.recv_offset = 0;
    qp.resp.in_send = (m & wire::kIsFirst) != 0;
  }
  if (const Outcome o = scatter(qp, t, qp.resp.recv_offset, pkt.payload); o != Outcome::kDone)
    return o;
  qp.resp.recv_offset += pkt.payload.size();
  if (m & wire::kConsumesRecvWqe) {
    const bool imm = m & wire::kHasImmDt;
    qp.complete_recv(WcStatus::kSuccess, WcOpcode::kRecv,
                     static_cast<uint32_t>(qp.resp.recv_offset), imm ? pkt.hdr.imm_be : 0,
                     imm ? uint32_t{kWcWithImm} : 0u, pkt.hdr.bth.solicited);
    qp.resp.in_send = false;
    qp.resp.msn = wire::psn_add(qp.resp.msn, 1);
  }
  return Outcome::kDone;
}

Outcome write(QueuePair& qp, const wire::Packet& pkt, Transport& t) {
  const uint32_t m = pkt.info->mask;
  const uint32_t psn = pkt.hdr.bth.psn;
  const bool ends = m & (wire::kIsLast | wire::kIsOnly);
  const bool consumes_wqe = m & wire::kConsumesRecvWqe;  // WRITE with immediate, last/only
  // Take the receive WQE before touching memory, so a retried (RNR) packet is applied
  // exactly once.
  if (consumes_wqe && !qp.take_recv_wqe()) return Outcome::kNoRecvWqe;
  if (m & wire::kHasReth) {
    const wire::Reth& r = pkt.hdr.reth;
    uint8_t* p = nullptr;
    if (r.dma_length) {
      p = check_remote(qp, t, r.rkey, r.va, r.dma_length, kRemoteWrite);
      if (!p) return Outcome::kAccess;
    }
    qp.resp.write_ptr = qp.resp.write_base = p;
    qp.resp.write_left = qp.resp.write_length = r.dma_length;
    qp.resp.write_first_psn = psn;
    qp.resp.in_write = (m & wire::kIsFirst) != 0;
    if (qp.resp.in_write && qp.resp.ooo) {
      qp.resp.ooo->sync(qp.resp.epsn);
      qp.resp.ooo->add_write({psn, p, r.dma_length, message_psns(qp, r.dma_length)});
    }
  }
  const size_t n = pkt.payload.size();
  if (n > qp.resp.write_left || (ends && n != qp.resp.write_left)) return Outcome::kInvalid;
  if (n) std::memcpy(qp.resp.write_ptr, pkt.payload.data(), n);
  qp.resp.write_ptr += n;
  qp.resp.write_left -= n;
  if (ends) {
    qp.resp.in_write = false;
    if (consumes_wqe)
      qp.complete_recv(WcStatus::kSuccess, WcOpcode::kRecvRdmaWithImm,
                       static_cast<uint32_t>(qp.resp.write_length), pkt.hdr.imm_be, kWcWithImm,
                       pkt.hdr.bth.solicited);
    qp.resp.msn = wire::psn_add(qp.resp.msn, 1);
  }
  return Outcome::kDone;
}

}  // namespace softrdma::engine::placement
