// The verbs softrdma does not implement yet (ECE, dmabuf, the
// kernel-ABI copy helpers): each fails cleanly with the errno real
// providers give for an unsupported verb (EOPNOTSUPP), never by crashing.
#include <infiniband/verbs.h>

#include <cerrno>

namespace {

template <class T>
T* unsupported_ptr() {
  errno = EOPNOTSUPP;
  return nullptr;
}

}  // namespace

extern "C" {

// ---- not supported yet: ECE, dmabuf ---------------------------------------

int ibv_query_ece(ibv_qp*, ibv_ece*) {
  return EOPNOTSUPP;
}
int ibv_set_ece(ibv_qp*, ibv_ece*) {
  return EOPNOTSUPP;
}
ibv_mr* ibv_reg_dmabuf_mr(ibv_pd*, uint64_t, size_t, uint64_t, int, int) {
  return unsupported_ptr<ibv_mr>();
}
/// Data of a message lands in order (the responder copies packets in PSN order), but the
/// guarantee is not advertised yet.
int ibv_query_qp_data_in_order(ibv_qp*, ibv_wr_opcode, uint32_t) {
  return 0;
}
int ibv_resolve_eth_l2_from_gid(ibv_context*, ibv_ah_attr*, uint8_t*, uint16_t*) {
  return EOPNOTSUPP;
}

// Kernel-ABI copy helpers of libibverbs 1.0: no kernel ABI exists here.
void ibv_copy_ah_attr_from_kern(void*, void*) {}
void ibv_copy_qp_attr_from_kern(void*, void*) {}
void ibv_copy_path_rec_from_kern(void*, void*) {}
void ibv_copy_path_rec_to_kern(void*, void*) {}

}  // extern "C"
