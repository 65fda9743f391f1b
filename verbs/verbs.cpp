// The libibverbs C API/ABI (rdma-core 44 layouts, <infiniband/verbs.h>) over the softrdma
// engine. Each entry point translates arguments and handles to engine calls and engine
// results to the errno conventions of libibverbs(3) — nothing more.
//
// Conventions kept from rdma-core: functions returning int return 0 or an errno value
// (ibv_modify_qp, ibv_post_*, ibv_dealloc_pd, …) unless their man page says -1/errno
// (ibv_query_gid, ibv_query_pkey, ibv_get_cq_event); functions returning a pointer return
// NULL and set errno.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "base/params.h"
#include "engine/log.h"
#include "net/udp_port.h"
#include "verbs/device_name.h"
#include "verbs/objects.h"

// verbs.h wraps these exported names in inline helpers; we define the real symbols.
#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

using namespace softrdma;
using namespace softrdma::verbs;

namespace {

constexpr uint32_t kVendorId = 0xffffff;  // as rxe: no IEEE OUI
constexpr char kFirmware[] = "softrdma-0.1.0";

static_assert(sizeof(ibv_sge) == sizeof(engine::Sge));
static_assert(offsetof(ibv_sge, lkey) == offsetof(engine::Sge, lkey));
static_assert(IBV_WC_RETRY_EXC_ERR == int(engine::WcStatus::kRetryExcErr));
static_assert(IBV_WC_GENERAL_ERR == int(engine::WcStatus::kGeneralErr));
static_assert(IBV_WC_RECV_RDMA_WITH_IMM == int(engine::WcOpcode::kRecvRdmaWithImm));
static_assert(IBV_WR_ATOMIC_FETCH_AND_ADD == int(engine::WrOpcode::kFetchAdd) &&
              IBV_WR_ATOMIC_FETCH_AND_ADD + 1 == int(engine::kWrOpcodeCount));
static_assert(unsigned(IBV_QP_DEST_QPN) == engine::kAttrDestQpn &&
              unsigned(IBV_QP_RATE_LIMIT) == engine::kAttrRateLimit);
static_assert(unsigned(IBV_ACCESS_REMOTE_ATOMIC) == engine::kRemoteAtomic);
static_assert(unsigned(IBV_SEND_INLINE) == engine::kInline &&
              unsigned(IBV_SEND_FENCE) == engine::kFence);
static_assert(IBV_QPS_ERR == int(engine::QpState::kErr));

/// The one device this library exposes. Its identity fields are static; the address it
/// binds is chosen at ibv_open_device.
ibv_device g_device = [] {
  ibv_device d{};
  d.node_type = IBV_NODE_CA;
  d.transport_type = IBV_TRANSPORT_IB;
  std::snprintf(d.name, sizeof d.name, "%s", kDeviceName);
  std::snprintf(d.dev_name, sizeof d.dev_name, "uverbs0");
  std::snprintf(d.dev_path, sizeof d.dev_path, "/sys/class/infiniband_verbs/uverbs0");
  std::snprintf(d.ibdev_path, sizeof d.ibdev_path, "/sys/class/infiniband/%s", kDeviceName);
  return d;
}();

std::mutex g_open_mu;
std::weak_ptr<engine::Device> g_open_device;

/// Live CQs. An event already queued on a channel when its CQ is destroyed still sits in
/// the pipe; ibv_get_cq_event skips such events instead of returning a freed CQ (the
/// kernel drops them from its queue in the same case).
std::mutex g_cq_mu;
std::unordered_set<ibv_cq*> g_live_cqs;

/// EUI-64-style GUID from the device address (02:00:a:ff:fe:b:c:d), in network order.
__be64 guid_for(uint32_t ip) {
  uint8_t b[8] = {
      0x02, 0x00, uint8_t(ip >> 24), 0xff, 0xfe, uint8_t(ip >> 16), uint8_t(ip >> 8), uint8_t(ip)};
  __be64 g;
  std::memcpy(&g, b, sizeof g);
  return g;
}

/// SOFTRDMA_ADDR, for the GUID of a device not yet opened; 127.0.0.1 when unset or malformed
/// (a malformed address makes ibv_open_device refuse, through DeviceConfig).
uint32_t configured_ip() {
  uint32_t ip = (127u << 24) | 1;
  std::string malformed;
  params::read_ipv4(params::kAddr, ip, malformed);
  return ip;
}

/// Whether every page of [addr, addr+length) is mapped in this process. msync(MS_ASYNC) is
/// one system call whatever the length (no per-page vector as mincore needs, no copy as
/// process_vm_readv does): Linux walks the VMAs of the range and answers ENOMEM for a hole,
/// without writing anything back. A PROT_NONE mapping counts as mapped here (the kernel's
/// ib_umem_get would fail on it when pinning); softrdma pins nothing.
bool range_is_mapped(const void* addr, size_t length) {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t start = reinterpret_cast<uintptr_t>(addr) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(addr) + length;
  return ::msync(reinterpret_cast<void*>(start), end - start, MS_ASYNC) == 0;
}

int err(engine::Status s) {
  return static_cast<int>(s);
}

template <class T>
T* fail(int e) {
  errno = e;
  return nullptr;
}

void fill_wc(const engine::Cqe& c, ibv_wc& w) {
  w = ibv_wc{};
  w.wr_id = c.wr_id;
  w.status = static_cast<ibv_wc_status>(c.status);
  w.opcode = static_cast<ibv_wc_opcode>(c.opcode);
  w.vendor_err = c.vendor_err;
  w.byte_len = c.byte_len;
  w.imm_data = c.imm_be;
  w.qp_num = c.qp_num;
  w.src_qp = c.src_qp;
  w.wc_flags = c.wc_flags;
}

// ---- data-path ops (reached through ibv_context::ops by the inline verbs) ---------------

int op_poll_cq(ibv_cq* cq, int n, ibv_wc* wc) {
  engine::Cqe buf[32];
  int total = 0;
  while (total < n) {
    const int want = std::min<int>(n - total, 32);
    const int got = to_cq(cq)->cq->poll(want, buf);
    if (got < 0) return total ? total : -1;  // CQ overrun
    for (int i = 0; i < got; ++i) fill_wc(buf[i], wc[total + i]);
    total += got;
    if (got < want) break;
  }
  return total;
}

int op_req_notify_cq(ibv_cq* cq, int solicited_only) {
  return to_cq(cq)->cq->request_notify(solicited_only != 0);
}

int op_post_send(ibv_qp* ibqp, ibv_send_wr* wr, ibv_send_wr** bad) {
  engine::QueuePair& qp = *to_qp(ibqp)->qp;
  thread_local std::vector<engine::SendWr> wrs;
  wrs.clear();
  for (ibv_send_wr* w = wr; w; w = w->next) {
    engine::SendWr e;
    e.wr_id = w->wr_id;
    if (!engine::wr_opcode_supported(w->opcode) || w->num_sge < 0) {
      // SEND_WITH_INV, LOCAL_INV, BIND_MW, TSO, ATOMIC_WRITE, …: not on an RC QP here.
      // WRs before this one are posted.
      size_t ok = 0;
      engine::Status st = qp.post_send_batch(wrs.data(), wrs.size(), ok);
      if (bad) {
        ibv_send_wr* b = wr;
        for (size_t i = 0; i < ok; ++i) b = b->next;
        *bad = st == engine::kOk ? w : b;
      }
      return st == engine::kOk ? EINVAL : err(st);
    }
    e.opcode = static_cast<engine::WrOpcode>(w->opcode);
    e.flags = w->send_flags;
    e.imm_be = w->imm_data;
    e.sg_list = reinterpret_cast<const engine::Sge*>(w->sg_list);
    e.num_sge = static_cast<uint32_t>(w->num_sge);
    if (engine::wr_info(e.opcode).cls == engine::WrClass::kAtomic) {
      e.remote_addr = w->wr.atomic.remote_addr;
      e.rkey = w->wr.atomic.rkey;
      e.compare_add = w->wr.atomic.compare_add;
      e.swap = w->wr.atomic.swap;
    } else {
      e.remote_addr = w->wr.rdma.remote_addr;
      e.rkey = w->wr.rdma.rkey;
    }
    wrs.push_back(e);
  }
  size_t ok = 0;
  engine::Status st = qp.post_send_batch(wrs.data(), wrs.size(), ok);
  if (st != engine::kOk && bad) {
    ibv_send_wr* b = wr;
    for (size_t i = 0; i < ok; ++i) b = b->next;
    *bad = b;
  }
  return err(st);
}

int op_post_recv(ibv_qp* ibqp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  engine::QueuePair& qp = *to_qp(ibqp)->qp;
  for (ibv_recv_wr* w = wr; w; w = w->next) {
    engine::Status st =
        w->num_sge < 0 ? std::errc::invalid_argument
                       : qp.post_recv(w->wr_id, reinterpret_cast<const engine::Sge*>(w->sg_list),
                                      static_cast<uint32_t>(w->num_sge));
    if (st != engine::kOk) {
      if (bad) *bad = w;
      return err(st);
    }
  }
  return 0;
}

int op_post_srq_recv(ibv_srq*, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  if (bad) *bad = wr;
  return EOPNOTSUPP;
}

// ---- attribute queries ----------------------------------------------------------------

void fill_device_attr(Context* c, ibv_device_attr& a) {
  using L = engine::DeviceLimits;
  a = ibv_device_attr{};
  std::snprintf(a.fw_ver, sizeof a.fw_ver, "%s", kFirmware);
  a.node_guid = guid_for(c->dev->ip());
  a.sys_image_guid = a.node_guid;
  a.max_mr_size = L::kMaxMrSize;
  a.page_size_cap = 0xfffff000;
  a.vendor_id = kVendorId;
  a.vendor_part_id = 0;
  a.hw_ver = 0;
  a.max_qp = L::kMaxQp;
  a.max_qp_wr = L::kMaxQpWr;
  a.device_cap_flags =
      IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_PORT_ACTIVE_EVENT;
  a.max_sge = L::kMaxSge;
  a.max_sge_rd = L::kMaxSge;
  a.max_cq = L::kMaxCq;
  a.max_cqe = L::kMaxCqe;
  a.max_mr = L::kMaxMr;
  a.max_pd = L::kMaxPd;
  a.max_qp_rd_atom = L::kMaxQpRdAtom;
  a.max_res_rd_atom = L::kMaxQpRdAtom * 1024;
  a.max_qp_init_rd_atom = L::kMaxQpRdAtom;
  a.atomic_cap = IBV_ATOMIC_HCA;
  a.max_pkeys = 1;
  a.local_ca_ack_delay = 15;
  a.phys_port_cnt = 1;
}

void fill_port_attr(Context* c, ibv_port_attr& p) {
  p = ibv_port_attr{};
  p.state = IBV_PORT_ACTIVE;
  p.max_mtu = static_cast<ibv_mtu>(c->dev->active_mtu());
  p.active_mtu = static_cast<ibv_mtu>(c->dev->active_mtu());
  p.gid_tbl_len = 1;
  p.port_cap_flags = IBV_PORT_IP_BASED_GIDS;
  p.max_msg_sz = static_cast<uint32_t>(engine::DeviceLimits::kMaxMsgSize);
  p.pkey_tbl_len = 1;
  p.max_vl_num = 1;
  p.active_width = 2;   // 4X
  p.active_speed = 32;  // EDR (25 Gb/s per lane): the port claims 100 Gb/s
  p.phys_state = 5;     // LinkUp
  p.link_layer = IBV_LINK_LAYER_ETHERNET;
}

int ctx_query_port(ibv_context* ctx, uint8_t port, ibv_port_attr* attr, size_t attr_len) {
  if (port != 1) return EINVAL;
  ibv_port_attr full;
  fill_port_attr(to_ctx(ctx), full);
  std::memcpy(attr, &full, std::min(attr_len, sizeof full));
  return 0;
}

int ctx_query_device_ex(ibv_context* ctx, const ibv_query_device_ex_input* input,
                        ibv_device_attr_ex* attr, size_t attr_size) {
  if (input && input->comp_mask) return EINVAL;
  ibv_device_attr_ex full{};
  fill_device_attr(to_ctx(ctx), full.orig_attr);
  full.max_dm_size = 0;
  full.phys_port_cnt_ex = full.orig_attr.phys_port_cnt;  // pyverbs test_phys_port_cnt_ex
  std::memcpy(attr, &full, std::min(attr_size, sizeof full));
  return 0;
}

ibv_qp* create_qp_common(ibv_pd* pd, ibv_qp_init_attr_ex* a);

ibv_qp* ctx_create_qp_ex(ibv_context* ctx, ibv_qp_init_attr_ex* a) {
  if (!(a->comp_mask & IBV_QP_INIT_ATTR_PD) || !a->pd || a->pd->context != ctx)
    return fail<ibv_qp>(EINVAL);
  if (a->comp_mask & ~uint32_t(IBV_QP_INIT_ATTR_PD)) return fail<ibv_qp>(EOPNOTSUPP);
  return create_qp_common(a->pd, a);
}

ibv_qp* create_qp_common(ibv_pd* pd, ibv_qp_init_attr_ex* a) {
  if (a->qp_type != IBV_QPT_RC) return fail<ibv_qp>(EOPNOTSUPP);  // UC/UD/XRC not yet
  if (!a->send_cq || !a->recv_cq) return fail<ibv_qp>(EINVAL);
  if (a->srq) return fail<ibv_qp>(EOPNOTSUPP);
  engine::QpCap cap{a->cap.max_send_wr, a->cap.max_recv_wr, a->cap.max_send_sge,
                    a->cap.max_recv_sge, a->cap.max_inline_data};
  if (engine::QueuePair::validate_cap(cap) != engine::kOk) return fail<ibv_qp>(EINVAL);
  Context* c = to_ctx(pd->context);
  if (a->send_cq->context != pd->context || a->recv_cq->context != pd->context)
    return fail<ibv_qp>(EINVAL);
  auto* q = new Qp{};
  if (!q->slot.take(*c->dev, engine::ObjectKind::kQp)) {
    delete q;
    return fail<ibv_qp>(ENOMEM);  // max_qp reached
  }
  q->qp = std::make_unique<engine::QueuePair>(*c->dev, *to_pd(pd)->pd, *to_cq(a->send_cq)->cq,
                                              *to_cq(a->recv_cq)->cq, cap, a->sq_sig_all != 0);
  ibv_qp& ib = *q->as_qp();
  ib.context = pd->context;
  ib.qp_context = a->qp_context;
  ib.pd = pd;
  ib.send_cq = a->send_cq;
  ib.recv_cq = a->recv_cq;
  ib.srq = nullptr;
  ib.handle = q->qp->qpn();
  ib.qp_num = q->qp->qpn();
  ib.state = IBV_QPS_RESET;
  ib.qp_type = IBV_QPT_RC;
  pthread_mutex_init(&ib.mutex, nullptr);
  pthread_cond_init(&ib.cond, nullptr);
  return &ib;
}

}  // namespace

extern "C" {

// ---- devices ----------------------------------------------------------------------------

ibv_device** ibv_get_device_list(int* num_devices) {
  auto** list = static_cast<ibv_device**>(std::calloc(2, sizeof(ibv_device*)));
  if (!list) return fail<ibv_device*>(ENOMEM);
  list[0] = &g_device;
  if (num_devices) *num_devices = 1;
  return list;
}

void ibv_free_device_list(ibv_device** list) {
  std::free(list);
}

const char* ibv_get_device_name(ibv_device* device) {
  return device ? device->name : nullptr;
}

__be64 ibv_get_device_guid(ibv_device*) {
  std::lock_guard lk(g_open_mu);
  auto dev = g_open_device.lock();
  return guid_for(dev ? dev->ip() : configured_ip());
}

int ibv_get_device_index(ibv_device* device) {
  return device == &g_device ? 0 : -1;
}

ibv_context* ibv_open_device(ibv_device* device) {
  if (device != &g_device) return fail<ibv_context>(ENODEV);
  std::shared_ptr<engine::Device> dev;
  {
    std::lock_guard lk(g_open_mu);
    dev = g_open_device.lock();
    if (!dev) {
      engine::DeviceConfig cfg;
      std::string e;
      if (!engine::DeviceConfig::from_environment(cfg, e)) {
        engine::log().error("{}", e);
        return fail<ibv_context>(EINVAL);
      }
      int rc = 0;
      dev = engine::Device::open(cfg, rc);
      if (!dev) {
        engine::log().error("cannot open {}: {} ({})", kDeviceName, std::strerror(rc),
                            cfg.ip ? "SOFTRDMA_ADDR=" + net::ipv4_to_string(cfg.ip)
                                   : std::string("no free address in 127.0.0.1-254"));
        return fail<ibv_context>(rc);
      }
      g_open_device = dev;
    }
  }
  auto* c = new Context{};
  c->dev = std::move(dev);
  if (::pipe2(c->async_fds, O_CLOEXEC) != 0) {
    int e = errno;
    delete c;
    return fail<ibv_context>(e);
  }
  verbs_context& v = c->vctx;
  v.sz = sizeof(verbs_context);
  v.query_port = ctx_query_port;
  v.query_device_ex = ctx_query_device_ex;
  v.create_qp_ex = ctx_create_qp_ex;
  ibv_context& ctx = v.context;
  ctx.device = device;
  ctx.ops.poll_cq = op_poll_cq;
  ctx.ops.req_notify_cq = op_req_notify_cq;
  ctx.ops.post_send = op_post_send;
  ctx.ops.post_recv = op_post_recv;
  ctx.ops.post_srq_recv = op_post_srq_recv;
  ctx.cmd_fd = -1;
  ctx.async_fd = c->async_fds[0];
  ctx.num_comp_vectors = 1;
  pthread_mutex_init(&ctx.mutex, nullptr);
  ctx.abi_compat = __VERBS_ABI_IS_EXTENDED;
  return &ctx;
}

int ibv_close_device(ibv_context* ctx) {
  Context* c = to_ctx(ctx);
  ::close(c->async_fds[0]);
  ::close(c->async_fds[1]);
  pthread_mutex_destroy(&ctx->mutex);
  {
    std::lock_guard lk(g_open_mu);
    c->dev.reset();  // the last context stops the progress thread and frees the address
  }
  delete c;
  return 0;
}

int ibv_query_device(ibv_context* ctx, ibv_device_attr* attr) {
  if (!ctx || !attr) return EINVAL;
  fill_device_attr(to_ctx(ctx), *attr);
  return 0;
}

int ibv_query_port(ibv_context* ctx, uint8_t port, struct _compat_ibv_port_attr* attr) {
  if (!ctx || !attr) return EINVAL;
  if (port != 1) return EINVAL;
  ibv_port_attr full;
  fill_port_attr(to_ctx(ctx), full);
  // rdma-core's _compat_ibv_port_attr is ibv_port_attr up to and including `flags`.
  std::memcpy(attr, &full, offsetof(ibv_port_attr, port_cap_flags2));
  return 0;
}

int _ibv_query_gid_ex(ibv_context* ctx, uint32_t port, uint32_t index, ibv_gid_entry* entry,
                      uint32_t flags, size_t entry_size) {
  if (!ctx || !entry || flags) return EINVAL;
  if (port != 1 || index != 0) return EINVAL;
  ibv_gid_entry e{};
  engine::Gid g = to_ctx(ctx)->dev->gid();
  std::memcpy(e.gid.raw, g.raw, 16);
  e.gid_index = 0;
  e.port_num = 1;
  e.gid_type = IBV_GID_TYPE_ROCE_V2;
  e.ndev_ifindex = 0;
  std::memcpy(entry, &e, std::min(entry_size, sizeof e));
  return 0;
}

ssize_t _ibv_query_gid_table(ibv_context* ctx, ibv_gid_entry* entries, size_t max_entries,
                             uint32_t flags, size_t entry_size) {
  // The kernel's query_gid_table (ib_uverbs, rdma_query_gid_table) refuses a buffer too
  // small for the valid entries with EINVAL (pyverbs test_query_gid_table_bad_flow).
  if (!ctx || !entries || flags || entry_size == 0) return -EINVAL;
  if (max_entries < 1) return -EINVAL;
  int r = _ibv_query_gid_ex(ctx, 1, 0, entries, 0, entry_size);
  return r ? -r : 1;
}

int ibv_query_gid(ibv_context* ctx, uint8_t port, int index, ibv_gid* gid) {
  ibv_gid_entry e;
  if (index < 0 || _ibv_query_gid_ex(ctx, port, static_cast<uint32_t>(index), &e, 0, sizeof e)) {
    errno = EINVAL;
    return -1;
  }
  *gid = e.gid;
  return 0;
}

int ibv_query_pkey(ibv_context* ctx, uint8_t port, int index, __be16* pkey) {
  if (!ctx || port != 1 || index != 0 || !pkey) {
    errno = EINVAL;
    return -1;
  }
  *pkey = htobe16(0xffff);
  return 0;
}

int ibv_get_pkey_index(ibv_context* ctx, uint8_t port, __be16 pkey) {
  if (!ctx || port != 1) return -EINVAL;
  return be16toh(pkey) == 0xffff ? 0 : -ENOENT;
}

// ---- protection domains and memory regions --------------------------------------------

ibv_pd* ibv_alloc_pd(ibv_context* ctx) {
  if (!ctx) return fail<ibv_pd>(EINVAL);
  auto* p = new Pd{};
  if (!p->slot.take(*to_ctx(ctx)->dev, engine::ObjectKind::kPd)) {
    delete p;
    return fail<ibv_pd>(ENOMEM);  // max_pd reached
  }
  p->pd = std::make_unique<engine::ProtectionDomain>(*to_ctx(ctx)->dev);
  p->ibv.context = ctx;
  p->ibv.handle = 0;
  return &p->ibv;
}

int ibv_dealloc_pd(ibv_pd* pd) {
  Pd* p = to_pd(pd);
  if (p->pd->users.load() > 0) return EBUSY;
  delete p;
  return 0;
}

ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova,
                         unsigned int access) {
  if (!pd) return fail<ibv_mr>(EINVAL);
  if (engine::Status s = engine::MemoryRegion::validate(addr, length, access); s != engine::kOk)
    return fail<ibv_mr>(err(s));
  // As ib_umem_get: a range that wraps the address space is EINVAL, one that is not mapped
  // (e.g. address 0x10) EFAULT.
  if (reinterpret_cast<uintptr_t>(addr) + length < reinterpret_cast<uintptr_t>(addr))
    return fail<ibv_mr>(EINVAL);
  if (length && !range_is_mapped(addr, length)) return fail<ibv_mr>(EFAULT);
  auto* m = new Mr{};
  if (!m->slot.take(*to_ctx(pd->context)->dev, engine::ObjectKind::kMr)) {
    delete m;
    return fail<ibv_mr>(ENOMEM);  // max_mr reached
  }
  m->mr = std::make_unique<engine::MemoryRegion>(*to_pd(pd)->pd, addr, length, iova, access);
  m->ibv.context = pd->context;
  m->ibv.pd = pd;
  m->ibv.addr = addr;
  m->ibv.length = length;
  m->ibv.handle = m->mr->key();
  m->ibv.lkey = m->mr->key();
  m->ibv.rkey = m->mr->key();
  return &m->ibv;
}

ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, reinterpret_cast<uintptr_t>(addr),
                          static_cast<unsigned>(access));
}

ibv_mr* ibv_reg_mr_iova(ibv_pd* pd, void* addr, size_t length, uint64_t iova, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, iova, static_cast<unsigned>(access));
}

int ibv_rereg_mr(ibv_mr*, int, ibv_pd*, void*, size_t, int) {
  errno = EOPNOTSUPP;
  return IBV_REREG_MR_ERR_INPUT;
}

int ibv_dereg_mr(ibv_mr* mr) {
  delete to_mr(mr);
  return 0;
}

// ---- completion channels and CQs ------------------------------------------------------

ibv_comp_channel* ibv_create_comp_channel(ibv_context* ctx) {
  if (!ctx) return fail<ibv_comp_channel>(EINVAL);
  auto* ch = new Channel{};
  if (!ch->channel.ok()) {
    int e = errno;
    delete ch;
    return fail<ibv_comp_channel>(e);
  }
  ch->ibv.context = ctx;
  ch->ibv.fd = ch->channel.fd();
  ch->ibv.refcnt = 0;
  return &ch->ibv;
}

int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
  Channel* ch = to_channel(channel);
  if (ch->channel.users.load() > 0) return EBUSY;
  delete ch;
  return 0;
}

ibv_cq* ibv_create_cq(ibv_context* ctx, int cqe, void* cq_context, ibv_comp_channel* channel,
                      int comp_vector) {
  if (!ctx || cqe < 1 || static_cast<uint32_t>(cqe) > engine::DeviceLimits::kMaxCqe)
    return fail<ibv_cq>(EINVAL);
  if (comp_vector < 0 || comp_vector >= ctx->num_comp_vectors) return fail<ibv_cq>(EINVAL);
  auto* c = new Cq{};
  if (!c->slot.take(*to_ctx(ctx)->dev, engine::ObjectKind::kCq)) {
    delete c;
    return fail<ibv_cq>(ENOMEM);  // max_cq reached
  }
  ibv_cq* ib = c->as_cq();
  c->cq = std::make_unique<engine::CompletionQueue>(
      *to_ctx(ctx)->dev, static_cast<uint32_t>(cqe),
      channel ? &to_channel(channel)->channel : nullptr, ib);
  ib->context = ctx;
  ib->channel = channel;
  ib->cq_context = cq_context;
  ib->cqe = cqe;
  pthread_mutex_init(&ib->mutex, nullptr);
  pthread_cond_init(&ib->cond, nullptr);
  if (channel) ++channel->refcnt;
  std::lock_guard lk(g_cq_mu);
  g_live_cqs.insert(ib);
  return ib;
}

int ibv_resize_cq(ibv_cq*, int) {
  return EOPNOTSUPP;
}

int ibv_destroy_cq(ibv_cq* cq) {
  Cq* c = to_cq(cq);
  if (c->cq->users.load() > 0) return EBUSY;
  {
    std::lock_guard lk(g_cq_mu);
    g_live_cqs.erase(cq);
  }
  // As libibverbs does: wait until every event reported on the channel has been acked, so
  // no event can name a freed CQ.
  pthread_mutex_lock(&cq->mutex);
  while (cq->comp_events_completed != c->events_reported.load())
    pthread_cond_wait(&cq->cond, &cq->mutex);
  pthread_mutex_unlock(&cq->mutex);
  if (cq->channel) --cq->channel->refcnt;
  pthread_mutex_destroy(&cq->mutex);
  pthread_cond_destroy(&cq->cond);
  delete c;
  return 0;
}

int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  ibv_cq* handle = nullptr;
  for (;;) {
    ssize_t r;
    do {
      r = ::read(channel->fd, &handle, sizeof handle);
    } while (r < 0 && errno == EINTR);
    if (r != sizeof handle) {
      if (r >= 0) errno = EIO;
      return -1;
    }
    std::lock_guard lk(g_cq_mu);
    if (g_live_cqs.count(handle)) break;  // else: event of a destroyed CQ, skip it
  }
  to_cq(handle)->events_reported++;
  *cq = handle;
  *cq_context = handle->cq_context;
  return 0;
}

void ibv_ack_cq_events(ibv_cq* cq, unsigned int nevents) {
  pthread_mutex_lock(&cq->mutex);
  cq->comp_events_completed += nevents;
  pthread_cond_signal(&cq->cond);
  pthread_mutex_unlock(&cq->mutex);
}

// ---- queue pairs --------------------------------------------------------------------------

ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  if (!pd || !attr) return fail<ibv_qp>(EINVAL);
  ibv_qp_init_attr_ex a{};
  a.qp_context = attr->qp_context;
  a.send_cq = attr->send_cq;
  a.recv_cq = attr->recv_cq;
  a.srq = attr->srq;
  a.cap = attr->cap;
  a.qp_type = attr->qp_type;
  a.sq_sig_all = attr->sq_sig_all;
  a.comp_mask = IBV_QP_INIT_ATTR_PD;
  a.pd = pd;
  ibv_qp* qp = create_qp_common(pd, &a);
  if (qp) attr->cap = a.cap;
  return qp;
}

int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  if (!qp || !attr) return EINVAL;
  engine::QpAttr a;
  a.state = static_cast<engine::QpState>(attr->qp_state);
  a.cur_state = static_cast<engine::QpState>(attr->cur_qp_state);
  a.path_mtu = static_cast<uint8_t>(attr->path_mtu);
  a.qkey = attr->qkey;
  a.rq_psn = attr->rq_psn;
  a.sq_psn = attr->sq_psn;
  a.dest_qp_num = attr->dest_qp_num;
  a.access_flags = static_cast<uint32_t>(attr->qp_access_flags);
  a.pkey_index = attr->pkey_index;
  a.en_sqd_async_notify = attr->en_sqd_async_notify != 0;
  a.max_rd_atomic = attr->max_rd_atomic;
  a.max_dest_rd_atomic = attr->max_dest_rd_atomic;
  a.min_rnr_timer = attr->min_rnr_timer;
  a.port_num = attr->port_num;
  a.timeout = attr->timeout;
  a.retry_cnt = attr->retry_cnt;
  a.rnr_retry = attr->rnr_retry;
  const ibv_ah_attr& ah = attr->ah_attr;
  a.ah.is_global = ah.is_global != 0;
  std::memcpy(a.ah.dgid.raw, ah.grh.dgid.raw, 16);
  a.ah.flow_label = ah.grh.flow_label;
  a.ah.sgid_index = ah.grh.sgid_index;
  a.ah.hop_limit = ah.grh.hop_limit;
  a.ah.traffic_class = ah.grh.traffic_class;
  a.ah.sl = ah.sl;
  a.ah.port_num = ah.port_num;
  a.ah.static_rate = ah.static_rate;
  a.ah.dlid = ah.dlid;
  a.ah.src_path_bits = ah.src_path_bits;
  if (engine::Status s = to_qp(qp)->qp->modify(a, static_cast<uint32_t>(mask)); s != engine::kOk)
    return err(s);
  if (mask & IBV_QP_STATE) qp->state = attr->qp_state;
  return 0;
}

int ibv_query_qp(ibv_qp* qp, ibv_qp_attr* attr, int /*mask*/, ibv_qp_init_attr* init) {
  if (!qp || !attr || !init) return EINVAL;
  engine::QpAttr a = to_qp(qp)->qp->query();
  *attr = ibv_qp_attr{};
  attr->qp_state = static_cast<ibv_qp_state>(a.state);
  attr->cur_qp_state = static_cast<ibv_qp_state>(a.state);
  attr->path_mtu = static_cast<ibv_mtu>(a.path_mtu);
  attr->path_mig_state = IBV_MIG_MIGRATED;
  attr->qkey = a.qkey;
  attr->rq_psn = a.rq_psn;
  attr->sq_psn = a.sq_psn;
  attr->dest_qp_num = a.dest_qp_num;
  attr->qp_access_flags = static_cast<unsigned>(a.access_flags);
  attr->cap = {a.cap.max_send_wr, a.cap.max_recv_wr, a.cap.max_send_sge, a.cap.max_recv_sge,
               a.cap.max_inline_data};
  attr->ah_attr.is_global = a.ah.is_global;
  std::memcpy(attr->ah_attr.grh.dgid.raw, a.ah.dgid.raw, 16);
  attr->ah_attr.grh.flow_label = a.ah.flow_label;
  attr->ah_attr.grh.sgid_index = a.ah.sgid_index;
  attr->ah_attr.grh.hop_limit = a.ah.hop_limit;
  attr->ah_attr.grh.traffic_class = a.ah.traffic_class;
  attr->ah_attr.sl = a.ah.sl;
  attr->ah_attr.port_num = a.ah.port_num;
  attr->ah_attr.static_rate = a.ah.static_rate;
  attr->pkey_index = a.pkey_index;
  attr->en_sqd_async_notify = a.en_sqd_async_notify;
  attr->sq_draining = a.sq_draining;
  attr->max_rd_atomic = a.max_rd_atomic;
  attr->max_dest_rd_atomic = a.max_dest_rd_atomic;
  attr->min_rnr_timer = a.min_rnr_timer;
  attr->port_num = a.port_num;
  attr->timeout = a.timeout;
  attr->retry_cnt = a.retry_cnt;
  attr->rnr_retry = a.rnr_retry;
  *init = ibv_qp_init_attr{};
  init->qp_context = qp->qp_context;
  init->send_cq = qp->send_cq;
  init->recv_cq = qp->recv_cq;
  init->srq = qp->srq;
  init->cap = attr->cap;
  init->qp_type = qp->qp_type;
  init->sq_sig_all = to_qp(qp)->qp->sq_sig_all;
  return 0;
}

int ibv_destroy_qp(ibv_qp* qp) {
  Qp* q = to_qp(qp);
  pthread_mutex_destroy(&qp->mutex);
  pthread_cond_destroy(&qp->cond);
  delete q;
  return 0;
}

ibv_qp_ex* ibv_qp_to_qp_ex(ibv_qp*) {
  return nullptr;
}  // only QPs created with send_ops

// ---- async events -------------------------------------------------------------------------

int ibv_get_async_event(ibv_context* ctx, ibv_async_event* event) {
  ssize_t r;
  do {
    r = ::read(ctx->async_fd, event, sizeof *event);
  } while (r < 0 && errno == EINTR);
  if (r != static_cast<ssize_t>(sizeof *event)) {
    if (r >= 0) errno = EIO;
    return -1;
  }
  return 0;
}

void ibv_ack_async_event(ibv_async_event*) {}

}  // extern "C"
