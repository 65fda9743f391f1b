// IBVERBS_PRIVATE_34: the interface rdma-core offers its providers (libmlx5, libefa, …).
// perftest links libmlx5 and libefa, whose load-time constructors register their drivers
// and whose code references these symbols, so the drop-in must define them all. No
// vendor provider drives a device here: registration is accepted and ignored, and each
// kernel command (ibv_cmd_*) fails with EOPNOTSUPP, as a kernel without that verb would.
// Parameter lists are irrelevant at the C ABI for these failure paths; providers only
// reach them for vendor devices, which softrdma never lists.
#include <cerrno>
#include <cstdarg>

extern "C" {

/// Variable providers read to decide whether destroy may proceed after a device is
/// disassociated (never, here).
bool verbs_allow_disassociate_destroy = false;

void verbs_register_driver_34(const void*) {}
void verbs_set_ops(void*, const void*) {}
void verbs_init_cq(void*, void*, void*, void*) {}
void verbs_uninit_context(void*) {}
void* verbs_open_device(void*, void*) {
  errno = EOPNOTSUPP;
  return nullptr;
}
void* _verbs_init_and_alloc_context(void*, int, unsigned long, unsigned long, unsigned int) {
  errno = EOPNOTSUPP;
  return nullptr;
}
void __verbs_log(void*, unsigned int, const char*, ...) {}
unsigned int __ioctl_final_num_attrs(unsigned int num_attrs, void*) {
  return num_attrs;
}

int execute_ioctl() {
  return EOPNOTSUPP;
}
int ibv_cmd_advise_mr() {
  return EOPNOTSUPP;
}
int ibv_cmd_alloc_dm() {
  return EOPNOTSUPP;
}
int ibv_cmd_alloc_mw() {
  return EOPNOTSUPP;
}
int ibv_cmd_alloc_pd() {
  return EOPNOTSUPP;
}
int ibv_cmd_attach_mcast() {
  return EOPNOTSUPP;
}
int ibv_cmd_close_xrcd() {
  return EOPNOTSUPP;
}
int ibv_cmd_create_ah() {
  return EOPNOTSUPP;
}
int ibv_cmd_create_counters() {
  return EOPNOTSUPP;
}
int ibv_cmd_create_cq() {
  return EOPNOTSUPP;
}
int ibv_cmd_create_cq_ex() {
  return EOPNOTSUPP;
}
int ibv_cmd_create_flow() {
  return EOPNOTSUPP;
}
int ibv_cmd_create_flow_action_esp() {
  return EOPNOTSUPP;
}
int ibv_cmd_create_qp() {
  return EOPNOTSUPP;
}
int ibv_cmd_create_qp_ex() {
  return EOPNOTSUPP;
}
int ibv_cmd_create_qp_ex2() {
  return EOPNOTSUPP;
}
int ibv_cmd_create_rwq_ind_table() {
  return EOPNOTSUPP;
}
int ibv_cmd_create_srq() {
  return EOPNOTSUPP;
}
int ibv_cmd_create_srq_ex() {
  return EOPNOTSUPP;
}
int ibv_cmd_create_wq() {
  return EOPNOTSUPP;
}
int ibv_cmd_dealloc_mw() {
  return EOPNOTSUPP;
}
int ibv_cmd_dealloc_pd() {
  return EOPNOTSUPP;
}
int ibv_cmd_dereg_mr() {
  return EOPNOTSUPP;
}
int ibv_cmd_destroy_ah() {
  return EOPNOTSUPP;
}
int ibv_cmd_destroy_counters() {
  return EOPNOTSUPP;
}
int ibv_cmd_destroy_cq() {
  return EOPNOTSUPP;
}
int ibv_cmd_destroy_flow() {
  return EOPNOTSUPP;
}
int ibv_cmd_destroy_flow_action() {
  return EOPNOTSUPP;
}
int ibv_cmd_destroy_qp() {
  return EOPNOTSUPP;
}
int ibv_cmd_destroy_rwq_ind_table() {
  return EOPNOTSUPP;
}
int ibv_cmd_destroy_srq() {
  return EOPNOTSUPP;
}
int ibv_cmd_destroy_wq() {
  return EOPNOTSUPP;
}
int ibv_cmd_detach_mcast() {
  return EOPNOTSUPP;
}
int ibv_cmd_free_dm() {
  return EOPNOTSUPP;
}
int ibv_cmd_get_context() {
  return EOPNOTSUPP;
}
int ibv_cmd_modify_cq() {
  return EOPNOTSUPP;
}
int ibv_cmd_modify_flow_action_esp() {
  return EOPNOTSUPP;
}
int ibv_cmd_modify_qp() {
  return EOPNOTSUPP;
}
int ibv_cmd_modify_qp_ex() {
  return EOPNOTSUPP;
}
int ibv_cmd_modify_srq() {
  return EOPNOTSUPP;
}
int ibv_cmd_modify_wq() {
  return EOPNOTSUPP;
}
int ibv_cmd_open_qp() {
  return EOPNOTSUPP;
}
int ibv_cmd_open_xrcd() {
  return EOPNOTSUPP;
}
int ibv_cmd_poll_cq() {
  return EOPNOTSUPP;
}
int ibv_cmd_post_recv() {
  return EOPNOTSUPP;
}
int ibv_cmd_post_send() {
  return EOPNOTSUPP;
}
int ibv_cmd_post_srq_recv() {
  return EOPNOTSUPP;
}
int ibv_cmd_query_context() {
  return EOPNOTSUPP;
}
int ibv_cmd_query_device_any() {
  return EOPNOTSUPP;
}
int ibv_cmd_query_mr() {
  return EOPNOTSUPP;
}
int ibv_cmd_query_port() {
  return EOPNOTSUPP;
}
int ibv_cmd_query_qp() {
  return EOPNOTSUPP;
}
int ibv_cmd_query_srq() {
  return EOPNOTSUPP;
}
int ibv_cmd_read_counters() {
  return EOPNOTSUPP;
}
int ibv_cmd_reg_dm_mr() {
  return EOPNOTSUPP;
}
int ibv_cmd_reg_dmabuf_mr() {
  return EOPNOTSUPP;
}
int ibv_cmd_reg_mr() {
  return EOPNOTSUPP;
}
int ibv_cmd_req_notify_cq() {
  return EOPNOTSUPP;
}
int ibv_cmd_rereg_mr() {
  return EOPNOTSUPP;
}
int ibv_cmd_resize_cq() {
  return EOPNOTSUPP;
}

}  // extern "C"
