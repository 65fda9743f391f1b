// QPs on rdma_cm_ids: rdma_create_qp(_ex) / rdma_destroy_qp / rdma_create_srq(_ex) /
// rdma_destroy_srq (librdmacm's helpers over plain verbs: CQs and channels created for the
// ID when the application gives none, one XRC domain per device), and rdma_init_qp_attr, the
// attributes that move a QP to INIT, RTR and RTS for the ID's connection (Linux
// ib_cm_init_qp_attr: IBTA 12.8 for what the REQ/REP exchange decides; an XRC initiator has
// no receive side, an XRC target no send side — the masks of IBTA table 91 per type).

#include <algorithm>
#include <cstring>

#include <rdma/rdma_verbs.h>

#include "cm/cm_device.h"
#include "cm/cma.h"

using namespace softrdma::cm;

namespace softrdma::cm {
namespace {

bool is_ud(const IdPriv* id) {
  return id->id.qp_type == IBV_QPT_UD;
}

/// True while the ID has a connection whose REQ/REP fixed the QP's peer (RTR is possible).
bool connection_known(const IdPriv* id) {
  if (!id->comm_id || !id->dev) return false;
  std::optional<CmState> s = id->dev->cm().state(id->comm_id);
  if (!s) return false;
  return connecting_with_peer_known(*s) || *s == CmState::kEstablished;
}

void destroy_cqs(rdma_cm_id* id) {
  if (id->qp_type == IBV_QPT_XRC_RECV && id->srq) return;
  if (id->recv_cq) {
    ibv_destroy_cq(id->recv_cq);
    if (id->send_cq && id->send_cq != id->recv_cq) ibv_destroy_cq(id->send_cq);
  } else if (id->send_cq) {
    ibv_destroy_cq(id->send_cq);
  }
  id->recv_cq = id->send_cq = nullptr;
  if (id->recv_cq_channel) {
    ibv_destroy_comp_channel(id->recv_cq_channel);
    if (id->send_cq_channel && id->send_cq_channel != id->recv_cq_channel)
      ibv_destroy_comp_channel(id->send_cq_channel);
  } else if (id->send_cq_channel) {
    ibv_destroy_comp_channel(id->send_cq_channel);
  }
  id->recv_cq_channel = id->send_cq_channel = nullptr;
}

/// librdmacm's ucma_create_cqs: a CQ (on its own completion channel) for each queue the
/// application left without one, sized like the queue.
int create_cqs(rdma_cm_id* id, uint32_t send_size, uint32_t recv_size) {
  if (recv_size) {
    if (!(id->recv_cq_channel = ibv_create_comp_channel(id->verbs))) goto err;
    if (!(id->recv_cq = ibv_create_cq(id->verbs, int(recv_size), id, id->recv_cq_channel, 0)))
      goto err;
  }
  if (send_size) {
    if (!(id->send_cq_channel = ibv_create_comp_channel(id->verbs))) goto err;
    if (!(id->send_cq = ibv_create_cq(id->verbs, int(send_size), id, id->send_cq_channel, 0)))
      goto err;
  }
  return 0;
err:
  destroy_cqs(id);
  return -1;
}

int modify(ibv_qp* qp, ibv_qp_attr& attr, int mask) {
  if (int e = ibv_modify_qp(qp, &attr, mask)) return fail_errno(e);
  return 0;
}

}  // namespace

int init_qp_attr_locked(IdPriv* id, ibv_qp_attr* attr, int* mask) {
  if (!id->dev) return fail_errno(EINVAL);
  const ibv_qp_state state = attr->qp_state;
  *attr = ibv_qp_attr{};
  attr->qp_state = state;
  switch (state) {
    case IBV_QPS_INIT:
      attr->pkey_index = 0;
      attr->port_num = 1;
      if (is_ud(id)) {
        attr->qkey = id->qkey;
        *mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
      } else {
        // Before a connection nothing remote is allowed; once REQ/REP set the responder
        // resources, RDMA READ and atomics are too (Linux cm_init_qp_init_attr).
        if (connection_known(id)) {
          attr->qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
          if (id->responder_resources)
            attr->qp_access_flags |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
        }
        *mask = IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
      }
      return 0;
    case IBV_QPS_RTR:
      if (is_ud(id)) {
        *mask = IBV_QP_STATE;
        return 0;
      }
      if (!connection_known(id)) return fail_errno(EINVAL);
      attr->ah_attr = peer_ah_attr(id);
      attr->path_mtu = ibv_mtu(id->path_mtu ? id->path_mtu : id->dev->active_mtu());
      attr->dest_qp_num = id->remote_qpn;
      attr->rq_psn = id->remote_psn;
      *mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
      if (id->id.qp_type != IBV_QPT_XRC_SEND) {  // a receiving side (RC, XRC target)
        attr->max_dest_rd_atomic = id->responder_resources;
        attr->min_rnr_timer = 0;  // Linux cm_init_qp_rtr_attr: 655.36 ms
        *mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
      }
      return 0;
    case IBV_QPS_RTS:
      if (is_ud(id)) {
        attr->sq_psn = 0;
        *mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
        return 0;
      }
      if (!connection_known(id)) return fail_errno(EINVAL);
      attr->sq_psn = id->seq_num;
      attr->timeout = id->local_ack_timeout;
      *mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT;
      if (id->id.qp_type != IBV_QPT_XRC_RECV) {  // a sending side (RC, XRC initiator)
        attr->retry_cnt = id->retry_count;
        attr->rnr_retry = id->rnr_retry_count;
        attr->max_rd_atomic = id->initiator_depth;
        *mask |= IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
      }
      return 0;
    default:
      return fail_errno(EINVAL);
  }
}

int modify_qp_rtr_rts_locked(IdPriv* id, uint8_t resp_res, uint8_t init_depth) {
  ibv_qp* qp = id->id.qp;
  if (!qp) return 0;
  ibv_qp_attr attr{};
  int mask = 0;
  attr.qp_state = IBV_QPS_INIT;  // again: the access flags now follow the connection
  if (init_qp_attr_locked(id, &attr, &mask) || modify(qp, attr, mask)) return -1;
  attr.qp_state = IBV_QPS_RTR;
  if (init_qp_attr_locked(id, &attr, &mask)) return -1;
  if (resp_res != RDMA_MAX_RESP_RES) attr.max_dest_rd_atomic = resp_res;
  if (modify(qp, attr, mask)) return -1;
  attr.qp_state = IBV_QPS_RTS;
  if (init_qp_attr_locked(id, &attr, &mask)) return -1;
  if (init_depth != RDMA_MAX_INIT_DEPTH) attr.max_rd_atomic = init_depth;
  return modify(qp, attr, mask);
}

int modify_qp_err_locked(IdPriv* id) {
  if (!id->id.qp) return 0;
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  return modify(id->id.qp, attr, IBV_QP_STATE);
}

}  // namespace softrdma::cm

extern "C" {

int rdma_init_qp_attr(rdma_cm_id* id, ibv_qp_attr* qp_attr, int* qp_attr_mask) {
  if (!id || !qp_attr || !qp_attr_mask) return fail_errno(EINVAL);
  std::lock_guard lk(g_mu);
  return init_qp_attr_locked(priv(id), qp_attr, qp_attr_mask);
}

int rdma_create_qp_ex(rdma_cm_id* id, ibv_qp_init_attr_ex* attr) {
  if (!id || !attr || id->qp || !id->verbs) return fail_errno(EINVAL);
  if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd) {
    attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
    attr->pd = id->pd;
  } else if (id->verbs != attr->pd->context) {
    return fail_errno(EINVAL);
  }
  if ((id->recv_cq && attr->recv_cq && id->recv_cq != attr->recv_cq) ||
      (id->send_cq && attr->send_cq && id->send_cq != attr->send_cq))
    return fail_errno(EINVAL);
  if (id->qp_type == IBV_QPT_XRC_RECV &&
      (!(attr->comp_mask & IBV_QP_INIT_ATTR_XRCD) || !attr->xrcd)) {
    if (!priv(id)->dev || !(attr->xrcd = priv(id)->dev->xrcd())) return -1;
    attr->comp_mask |= IBV_QP_INIT_ATTR_XRCD;
  }
  if (create_cqs(id, attr->send_cq || id->send_cq ? 0 : attr->cap.max_send_wr,
                 attr->recv_cq || id->recv_cq ? 0 : attr->cap.max_recv_wr))
    return -1;
  if (!attr->send_cq) attr->send_cq = id->send_cq;
  if (!attr->recv_cq) attr->recv_cq = id->recv_cq;
  if (id->srq && !attr->srq) attr->srq = id->srq;
  ibv_qp* qp = ibv_create_qp_ex(id->verbs, attr);
  if (!qp) {
    int e = errno;
    destroy_cqs(id);
    return fail_errno(e);
  }
  std::lock_guard lk(g_mu);
  IdPriv* p = priv(id);
  // The new QP goes to INIT (UD: on to RTS at once, it needs no peer).
  ibv_qp_attr qa{};
  int mask = 0;
  qa.qp_state = IBV_QPS_INIT;
  int rc = init_qp_attr_locked(p, &qa, &mask);
  if (!rc) rc = modify(qp, qa, mask);
  if (!rc && is_ud(p)) {
    qa = ibv_qp_attr{};
    qa.qp_state = IBV_QPS_RTR;
    rc = modify(qp, qa, IBV_QP_STATE);
    if (!rc) {
      qa.qp_state = IBV_QPS_RTS;
      qa.sq_psn = 0;
      rc = modify(qp, qa, IBV_QP_STATE | IBV_QP_SQ_PSN);
    }
  }
  if (rc) {
    int e = errno;
    ibv_destroy_qp(qp);
    destroy_cqs(id);
    return fail_errno(e);
  }
  id->pd = qp->pd ? qp->pd : attr->pd;  // an XRC target QP has no PD of its own
  id->qp = qp;
  return 0;
}

int rdma_create_qp(rdma_cm_id* id, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  if (!id || !qp_init_attr) return fail_errno(EINVAL);
  ibv_qp_init_attr_ex ex{};
  std::memcpy(&ex, qp_init_attr, sizeof *qp_init_attr);
  ex.comp_mask = IBV_QP_INIT_ATTR_PD;
  ex.pd = pd ? pd : id->pd;
  int ret = rdma_create_qp_ex(id, &ex);
  std::memcpy(qp_init_attr, &ex, sizeof *qp_init_attr);
  return ret;
}

void rdma_destroy_qp(rdma_cm_id* id) {
  if (!id) return;
  if (id->qp) ibv_destroy_qp(id->qp);
  id->qp = nullptr;
  destroy_cqs(id);
}

int rdma_create_srq_ex(rdma_cm_id* id, ibv_srq_init_attr_ex* attr) {
  if (!id || !attr || !(attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE)) return fail_errno(EINVAL);
  if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd) {
    attr->pd = id->pd;
    attr->comp_mask |= IBV_SRQ_INIT_ATTR_PD;
  }
  bool made_cqs = false;
  if (attr->srq_type == IBV_SRQT_XRC) {
    if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_XRCD) || !attr->xrcd) {
      if (!priv(id)->dev || !(attr->xrcd = priv(id)->dev->xrcd())) return -1;
    }
    if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_CQ) || !attr->cq) {
      // The ID's receive CQ if it has one already (rdma_get_request made one with an XRC
      // target QP, which receives nothing itself); making another would orphan that one.
      if (!id->recv_cq) {
        if (create_cqs(id, 0, attr->attr.max_wr)) return -1;
        made_cqs = true;
      }
      attr->cq = id->recv_cq;
    }
    attr->comp_mask |= IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
  }
  ibv_srq* srq = ibv_create_srq_ex(id->verbs, attr);
  if (!srq) {
    int e = errno;
    if (made_cqs) destroy_cqs(id);  // only what this call made: a QP may use the ID's CQs
    return fail_errno(e);
  }
  if (!id->pd) id->pd = attr->pd;
  id->srq = srq;
  return 0;
}

int rdma_create_srq(rdma_cm_id* id, ibv_pd* pd, ibv_srq_init_attr* attr) {
  if (!id || !attr) return fail_errno(EINVAL);
  ibv_srq_init_attr_ex ex{};
  std::memcpy(&ex, attr, sizeof *attr);
  ex.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
  ex.srq_type = id->qp_type == IBV_QPT_XRC_RECV ? IBV_SRQT_XRC : IBV_SRQT_BASIC;
  ex.pd = pd;
  int ret = rdma_create_srq_ex(id, &ex);
  std::memcpy(attr, &ex, sizeof *attr);
  return ret;
}

void rdma_destroy_srq(rdma_cm_id* id) {
  if (!id) return;
  if (id->srq) ibv_destroy_srq(id->srq);
  id->srq = nullptr;
  destroy_cqs(id);
}

}  // extern "C"
