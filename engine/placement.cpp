#include "engine/placement.h"

#include <algorithm>
#include <cstring>

#include "engine/log.h"
#include "engine/memory.h"
#include "engine/mw.h"
#include "net/fault_guard.h"

namespace softrdma::engine::placement {

namespace {
uint8_t* checked_remote(QueuePair& qp, Transport& t, uint32_t rkey, uint64_t va, uint64_t len,
                        uint32_t need) {
  if (!(qp.attr.access_flags & need)) return nullptr;
  if (MemoryRegion* mr = t.find_mr(rkey)) {
    if (&mr->pd() != &qp.responder_pd() || !(mr->access() & need)) return nullptr;
    return mr->translate(va, len);
  }
  const MemoryWindow* mw = t.find_mw(rkey);
  return mw ? mw->translate(qp.responder_pd(), qp.qpn(), va, len, need) : nullptr;
}
}  // namespace

uint8_t* check_remote(QueuePair& qp, Transport& t, uint32_t rkey, uint64_t va, uint64_t len,
                      uint32_t need) {
  uint8_t* p = checked_remote(qp, t, rkey, va, len, need);
  if (!p)
    log().debug("qp {:#x}: remote access refused: R_Key {:#x} va {:#x} length {} access {:#x}",
                qp.qpn(), rkey, va, len, need);
  return p;
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
    if (!net::guarded_copy(p, data.data() + done, take)) {
      bump(t.counters().local_access_faults);  // the receive buffer was unmapped
      return Outcome::kProtection;
    }
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
    uint32_t flags = imm ? uint32_t{kWcWithImm} : 0u;
    uint32_t imm_or_rkey = imm ? pkt.hdr.imm_be : 0;
    if (m & wire::kHasIeth) {
      // SEND with invalidate: the R_Key it names is invalidated before the receive
      // completes (IBTA 10.6.7.2.2); only a bound type 2 window can be (rxe_invalidate_rkey).
      MemoryWindow* mw = t.find_mw(pkt.hdr.ieth_rkey);
      if (!mw || mw->invalidate() != kOk) {
        log().debug("qp {:#x}: SEND with invalidate names R_Key {:#x}, which cannot be", qp.qpn(),
                    pkt.hdr.ieth_rkey);
        return Outcome::kInvalidate;
      }
      flags |= kWcWithInv;
      imm_or_rkey = pkt.hdr.ieth_rkey;
    }
    qp.complete_recv(WcStatus::kSuccess, WcOpcode::kRecv,
                     static_cast<uint32_t>(qp.resp.recv_offset), imm_or_rkey, flags,
                     pkt.hdr.bth.solicited);
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
      // A placed WRITE passed these checks at its sender, against the table this device
      // published, under a pin that deregistration waits for (net/shm_placement.h): its bytes
      // are in place. The region may be gone by now — the application saw the bytes and
      // deregistered before this thread read the headers, which a NIC (checking and placing
      // in one step) never shows — so the message is executed as placed; only a part of it
      // that must still be copied (a resend of a packet the ring dropped) finds no memory.
      if (!p && !pkt.hdr.bth.placed) return Outcome::kAccess;
      if (!p) bump(t.counters().placed_after_dereg);
    }
    qp.resp.write_ptr = qp.resp.write_base = p;
    qp.resp.write_left = qp.resp.write_length = r.dma_length;
    qp.resp.write_first_psn = psn;
    qp.resp.write_rkey = r.rkey;
    qp.resp.write_va = r.va;
    qp.resp.in_write = (m & wire::kIsFirst) != 0;
    if (qp.resp.in_write && qp.resp.ooo) {
      qp.resp.ooo->sync(qp.resp.epsn);
      qp.resp.ooo->add_write({psn, p, r.dma_length, message_psns(qp, r.dma_length), r.rkey, r.va});
    }
  } else if (!pkt.hdr.bth.placed && !pkt.payload.empty() && qp.resp.write_ptr &&
             pkt.payload.size() <= qp.resp.write_left) {
    // A MIDDLE or LAST packet: its range, checked again (the region may be gone since the
    // FIRST; IBTA 10.6.3.1: an R_Key is checked for every access it grants).
    const uint64_t done = qp.resp.write_length - qp.resp.write_left;
    if (!check_remote(qp, t, qp.resp.write_rkey, qp.resp.write_va + done, pkt.payload.size(),
                      kRemoteWrite))
      return Outcome::kAccess;
  }
  const size_t n = pkt.payload.size();
  if (n > qp.resp.write_left || (ends && n != qp.resp.write_left)) return Outcome::kInvalid;
  // A placed packet's bytes are there already (the same-host sender wrote them after the
  // checks this one repeats; Device::check_placed).
  if (n && !pkt.hdr.bth.placed &&
      (!qp.resp.write_ptr || !net::guarded_copy(qp.resp.write_ptr, pkt.payload.data(), n))) {
    // The MR's memory was unmapped (or protected) since registration: to the requester
    // this is an R_Key violation (IBTA 9.7.5.2.4), never a crash of this process.
    bump(t.counters().resp_access_faults);
    log().debug("qp {:#x}: WRITE psn {:#x} hit unmapped memory", qp.qpn(), psn);
    return Outcome::kAccess;
  }
  if (qp.resp.write_ptr) qp.resp.write_ptr += n;
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
