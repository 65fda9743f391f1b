// QP1, the GSI, and the address slot, for softrdma's RDMA-CM: private hooks of
// verbs/softrdma_private.h.
#include "verbs/ops.h"
#include "verbs/softrdma_private.h"

using namespace softrdma;
using namespace softrdma::verbs;

extern "C" {

ibv_qp* softrdma_create_qp1(ibv_pd* pd, ibv_qp_init_attr* attr) {
  if (!pd || !attr || attr->qp_type != IBV_QPT_UD || attr->srq) return fail<ibv_qp>(EINVAL);
  ibv_qp_init_attr_ex a{};
  a.qp_context = attr->qp_context;
  a.send_cq = attr->send_cq;
  a.recv_cq = attr->recv_cq;
  a.cap = attr->cap;
  a.qp_type = IBV_QPT_UD;
  a.sq_sig_all = attr->sq_sig_all;
  a.comp_mask = IBV_QP_INIT_ATTR_PD;
  a.pd = pd;
  return create_qp(pd->context, &a, /*qpn=*/1);
}

int softrdma_address_slot(ibv_context* ctx) {
  if (!ctx) {
    errno = EINVAL;
    return -1;
  }
  return static_cast<int>(to_ctx(ctx)->dev->share_slot());
}

}  // extern "C"
