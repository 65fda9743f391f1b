// ibv_device and ibv_context: the device list (srdma0, or one device per SOFTRDMA_ADDR list
// entry: a multi-NIC host), opening a context on the process's engine device at that address,
// and the device, port, GID and P_Key queries.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "base/ipv4_text.h"
#include "base/library_pin.h"
#include "base/link_rate.h"
#include "base/params.h"
#include "engine/log.h"
#include "verbs/device_identity.h"
#include "verbs/ops.h"
#include "verbs/softrdma_private.h"
#include "verbs/sysfs/tree.h"

// verbs.h wraps these exported names in inline helpers; we define the real symbols.
#undef ibv_get_device_list
#undef ibv_query_port

using namespace softrdma;
using namespace softrdma::verbs;

namespace {

/// The devices this library can list: srdma<N> / uverbs<N> for the N-th address of
/// SOFTRDMA_ADDR (srdma0 only when it holds one address or none). Their identity fields are
/// static; the address a device binds is read at ibv_open_device.
std::array<ibv_device, kMaxDevices> g_devices = [] {
  std::array<ibv_device, kMaxDevices> all{};
  for (size_t i = 0; i < kMaxDevices; ++i) {
    ibv_device& d = all[i];
    d.node_type = IBV_NODE_CA;
    d.transport_type = IBV_TRANSPORT_IB;
    std::snprintf(d.name, sizeof d.name, "srdma%zu", i);
    std::snprintf(d.dev_name, sizeof d.dev_name, "uverbs%zu", i);
    std::snprintf(d.dev_path, sizeof d.dev_path, "/sys/class/infiniband_verbs/uverbs%zu", i);
    std::snprintf(d.ibdev_path, sizeof d.ibdev_path, "/sys/class/infiniband/srdma%zu", i);
  }
  return all;
}();
static_assert(std::string_view(kDeviceName) == "srdma0");

/// How many devices SOFTRDMA_ADDR describes: its comma-separated entries (1 when unset),
/// malformed ones included — opening such a device fails as a malformed address does.
size_t configured_devices() {
  const char* v = params::raw(params::kAddr);
  if (!v) return 1;
  const size_t n = 1 + static_cast<size_t>(std::count(v, v + std::strlen(v), ','));
  return std::min(n, kMaxDevices);
}

/// Index of `d` in g_devices, or -1 when it is not one of ours.
int device_index(const ibv_device* d) {
  if (d < g_devices.data() || d >= g_devices.data() + kMaxDevices) return -1;
  return static_cast<int>(d - g_devices.data());
}

/// The address of device `index` (host order): the index-th SOFTRDMA_ADDR entry; 0 when the
/// list is unset, malformed or shorter.
uint32_t configured_ip_at(size_t index) {
  std::vector<uint32_t> ips;
  std::string malformed;
  if (!params::read_ipv4_list(params::kAddr, ips, malformed) || index >= ips.size()) return 0;
  return ips[index];
}

std::mutex g_open_mu;
/// The devices this process has open, by address. ibv_open_device shares one of them (the
/// default: SOFTRDMA_ADDR's, else the first one opened); the RDMA-CM opens one per address it
/// binds (softrdma_open_device_at), so a process may own several addresses.
/// Never destroyed (objects.h, "Process-wide state").
std::map<uint32_t, std::weak_ptr<engine::Device>>& g_open_devices =
    *new std::map<uint32_t, std::weak_ptr<engine::Device>>;
std::weak_ptr<engine::Device>& g_default_device = *new std::weak_ptr<engine::Device>;

/// EUI-64-style GUID from the device address (device_identity.h), in network order.
__be64 guid_for(uint32_t ip) {
  uint8_t b[8];
  guid_bytes(ip, b);
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

}  // namespace

namespace softrdma::verbs {

uint32_t device_ip() {
  // With SOFTRDMA_ADDR set, srdma0 is its first address whichever device opened first (the
  // default device may be srdma1's when that was opened before srdma0).
  if (const uint32_t first = configured_ip_at(0)) return first;
  std::lock_guard lk(g_open_mu);
  auto dev = g_default_device.lock();
  return dev ? dev->ip() : configured_ip();
}

std::vector<uint32_t> device_ips() {
  std::vector<uint32_t> ips{device_ip()};
  for (size_t i = 1; i < configured_devices(); ++i) {
    const uint32_t ip = configured_ip_at(i);
    if (ip == 0) break;
    ips.push_back(ip);
  }
  return ips;
}

}  // namespace softrdma::verbs

namespace {

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
  // Memory windows of both types (IBV_DEVICE_MEM_WINDOW_TYPE_2B: a type 2 window is bound
  // to one QP, as rxe's IB_DEVICE_MEM_WINDOW_TYPE_2B).
  a.device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SYS_IMAGE_GUID |
                       IBV_DEVICE_PORT_ACTIVE_EVENT | IBV_DEVICE_SRQ_RESIZE | IBV_DEVICE_XRC |
                       IBV_DEVICE_UD_AV_PORT_ENFORCE | IBV_DEVICE_MEM_WINDOW |
                       IBV_DEVICE_MEM_WINDOW_TYPE_2B;
  a.max_sge = L::kMaxSge;
  a.max_sge_rd = L::kMaxSge;
  a.max_cq = L::kMaxCq;
  a.max_cqe = L::kMaxCqe;
  a.max_mr = L::kMaxMr;
  a.max_pd = L::kMaxPd;
  a.max_mw = L::kMaxMw;
  a.max_qp_rd_atom = L::kMaxQpRdAtom;
  a.max_res_rd_atom = L::kMaxQpRdAtom * 1024;
  a.max_qp_init_rd_atom = L::kMaxQpRdAtom;
  a.max_srq = L::kMaxSrq;
  a.max_srq_wr = L::kMaxSrqWr;
  a.max_srq_sge = L::kMaxSrqSge;
  a.max_ah = L::kMaxAh;
  // UD multicast (mcast.cpp, engine/multicast.cpp).
  a.max_mcast_grp = static_cast<int>(L::kMaxMcastGrp);
  a.max_mcast_qp_attach = static_cast<int>(L::kMaxMcastQpAttach);
  a.max_total_mcast_qp_attach = static_cast<int>(L::kMaxTotalMcastQpAttach);
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
  p.gid_tbl_len = static_cast<int>(kGidTableLen);
  p.port_cap_flags = kPortCapFlags;
  static_assert(kPortCapFlags == IBV_PORT_IP_BASED_GIDS);
  p.max_msg_sz = static_cast<uint32_t>(engine::DeviceLimits::kMaxMsgSize);
  p.pkey_tbl_len = 1;
  p.max_vl_num = 1;
  // The port of a NIC that feeds the emulated links: 4X EDR (100 Gb/s) without them, else
  // the slowest standard port at least as fast as the fastest link (1X QDR for 10 Gbit/s,
  // 4X NDR for 400), as the sysfs tree says too.
  const link_rate::PortSpeed speed = sysfs::port_speed(c->dev->ip(), c->dev->wan_topology());
  p.active_width = speed.active_width;
  p.active_speed = speed.active_speed;
  p.phys_state = kPhysStateLinkUp;
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
  // Device memory: the engine's, SOFTRDMA_DM_SIZE bytes per device (dm.cpp).
  full.max_dm_size = to_ctx(ctx)->dev->device_memory().capacity();
  // On-demand paging: the engine reaches registered memory through the process's own page
  // tables, so every MR is "on demand" already — nothing is pinned, pages fault in when the
  // engine copies, and an access to memory unmapped since registration ends in an access
  // error, never a crash (net/fault_guard.h). ODP MRs (IBV_ACCESS_ON_DEMAND) are accepted
  // over ranges not yet mapped, and the implicit MR (NULL, SIZE_MAX) over the whole address
  // space; every transport and operation is covered (docs/verbs.md).
  constexpr uint32_t kOdpAll = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE |
                               IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC |
                               IBV_ODP_SUPPORT_SRQ_RECV;
  full.odp_caps.general_caps = IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT;
  full.odp_caps.per_transport_caps.rc_odp_caps = kOdpAll;
  full.odp_caps.per_transport_caps.uc_odp_caps =
      IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE;
  full.odp_caps.per_transport_caps.ud_odp_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV;
  full.xrc_odp_caps = kOdpAll;
  full.phys_port_cnt_ex = full.orig_attr.phys_port_cnt;  // pyverbs test_phys_port_cnt_ex
  // The 64-bit capability word: the 32 bits of device_cap_flags, and RDMA ATOMIC WRITE —
  // bit 40, the kernel's IB_UVERBS_DEVICE_ATOMIC_WRITE (uapi ib_user_ioctl_verbs.h since Linux
  // 6.2, set by rxe; rdma-core 44's headers do not name it, librpma tests 1 << 40).
  constexpr uint64_t kDeviceAtomicWrite = 1ull << 40;
  full.device_cap_flags_ex = full.orig_attr.device_cap_flags | kDeviceAtomicWrite;
  // Completion timestamps count ns of the (dilated) engine clock (cq_ex.cpp): a 1 GHz clock, 64
  // bits.
  full.completion_timestamp_mask = ~uint64_t{0};
  full.hca_core_clock = 1000000;  // kHz
  std::memcpy(attr, &full, std::min(attr_size, sizeof full));
  return 0;
}

/// Keeps this library mapped for the rest of the process once it has started a device: each
/// device has a progress thread (and the fault guard a SIGSEGV handler) running this
/// library's code, and a program may dlclose it with a context still open (Open MPI's
/// MPI_Finalize unloads libfabric, and with it librdmacm.so.1 and libibverbs.so.1, while
/// libfabric holds an rdma_cm_id and so its device; docs/rdma-cm.md, "Unloading"). rdma-core's
/// libibverbs has no threads of its own; its providers' are the kernel's. RTLD_NODELETE on
/// the loaded library: dlclose then leaves it in place (as -z nodelete would from the start).
void pin_library() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (const std::string e =
            base::pin_object_containing(reinterpret_cast<const void*>(&pin_library));
        !e.empty())
      engine::log().warn("cannot pin this library in memory: {}", e);
  });
}

/// The engine device at `ip` (host order) of this process, opened if none is; ip 0 asks for
/// the default one (SOFTRDMA_ADDR's if set, else any open device, else the first free
/// 127.0.0.x). Returns nullptr with `err` set as engine::Device::open (EINVAL for a malformed
/// SOFTRDMA_* variable).
std::shared_ptr<engine::Device> open_engine_device(uint32_t ip, int& err) {
  std::lock_guard lk(g_open_mu);
  // A child forked while the parent had devices open inherits their objects but none of
  // their threads: a device it opens is its own, sharing the address with the parent (as a
  // context a child opens on a real device is its own). The inherited ones stay the parent
  // contexts' (the child may not use them, as with real verbs after fork).
  static pid_t open_pid = ::getpid();
  if (open_pid != ::getpid()) {
    open_pid = ::getpid();
    g_open_devices.clear();
    g_default_device.reset();
  }
  engine::DeviceConfig cfg;
  std::string e;
  if (!engine::DeviceConfig::from_environment(cfg, e)) {
    engine::log().error("{}", e);
    err = EINVAL;
    return nullptr;
  }
  if (ip == 0) {
    if (cfg.ip == 0) {
      if (auto d = g_default_device.lock()) return d;
      for (auto& [a, w] : g_open_devices)
        if (auto d = w.lock()) return d;
    }
    ip = cfg.ip;
  }
  if (ip != 0) {
    if (auto it = g_open_devices.find(ip); it != g_open_devices.end())
      if (auto d = it->second.lock()) return d;
  }
  cfg.ip = ip;
  std::shared_ptr<engine::Device> dev = engine::Device::open(cfg, err);
  if (!dev) {
    engine::log().error(
        "cannot open {}: {} ({})", kDeviceName, std::strerror(err),
        cfg.ip ? base::ipv4_text(cfg.ip) : std::string("no free address in 127.0.0.2-254"));
    return nullptr;
  }
  pin_library();
  std::erase_if(g_open_devices, [](const auto& kv) { return kv.second.expired(); });
  g_open_devices[dev->ip()] = dev;
  if (g_default_device.expired()) g_default_device = dev;
  return dev;
}

}  // namespace

namespace softrdma::verbs {

/// A new ibv_context on `dev`, listed as `device` (several contexts may share one device).
ibv_context* new_context(std::shared_ptr<engine::Device> dev, ibv_device* device,
                         std::shared_ptr<CommandFile> file, int cmd_fd) {
  auto* c = new Context{};
  c->dev = std::move(dev);
  if (::pipe2(c->async_fds, O_CLOEXEC) != 0) {
    int e = errno;
    delete c;
    return fail<ibv_context>(e);
  }
  if (!file) {
    // A real descriptor where libibverbs has the open uverbs device: programs dup it to
    // share the context (ibv_import_device, import.cpp) or poll it. Nothing is ever read
    // from or written to it.
    cmd_fd = open_command_file(device, c->dev, file);
    if (cmd_fd < 0) {
      const int e = errno;
      ::close(c->async_fds[0]);
      ::close(c->async_fds[1]);
      delete c;
      return fail<ibv_context>(e);
    }
  }
  c->file = std::move(file);
  ::fcntl(c->async_fds[1], F_SETFL, O_NONBLOCK);  // the engine never waits for a reader
  verbs_context& v = c->vctx;
  v.sz = sizeof(verbs_context);
  v.query_port = ctx_query_port;
  v.query_device_ex = ctx_query_device_ex;
  v.create_qp_ex = ctx_create_qp_ex;
  v.create_cq_ex = ctx_create_cq_ex;
  v.query_rt_values = ctx_query_rt_values;
  v.create_srq_ex = ctx_create_srq_ex;
  v.get_srq_num = ctx_get_srq_num;
  v.open_xrcd = ctx_open_xrcd;
  v.close_xrcd = ctx_close_xrcd;
  v.open_qp = ctx_open_qp;
  v.advise_mr = ctx_advise_mr;
  v.alloc_dm = ctx_alloc_dm;
  v.free_dm = ctx_free_dm;
  v.reg_dm_mr = ctx_reg_dm_mr;
  v.alloc_td = ctx_alloc_td;
  v.dealloc_td = ctx_dealloc_td;
  v.alloc_parent_domain = ctx_alloc_parent_domain;
  ibv_context& ctx = v.context;
  ctx.device = device;
  ctx.ops.poll_cq = op_poll_cq;
  ctx.ops.req_notify_cq = op_req_notify_cq;
  ctx.ops.post_send = op_post_send;
  ctx.ops.post_recv = op_post_recv;
  ctx.ops.post_srq_recv = op_post_srq_recv;
  ctx.ops.alloc_mw = op_alloc_mw;
  ctx.ops.dealloc_mw = op_dealloc_mw;
  ctx.ops.bind_mw = op_bind_mw;
  ctx.cmd_fd = cmd_fd;
  ctx.async_fd = c->async_fds[0];
  ctx.num_comp_vectors = 1;
  pthread_mutex_init(&ctx.mutex, nullptr);
  ctx.abi_compat = __VERBS_ABI_IS_EXTENDED;
  return &ctx;
}

}  // namespace softrdma::verbs

extern "C" {

ibv_device** ibv_get_device_list(int* num_devices) {
  const size_t n = configured_devices();
  auto** list = static_cast<ibv_device**>(std::calloc(n + 1, sizeof(ibv_device*)));
  if (!list) return fail<ibv_device*>(ENOMEM);
  for (size_t i = 0; i < n; ++i) list[i] = &g_devices[i];
  if (num_devices) *num_devices = static_cast<int>(n);
  return list;
}

void ibv_free_device_list(ibv_device** list) {
  std::free(list);
}

const char* ibv_get_device_name(ibv_device* device) {
  return device ? device->name : nullptr;
}

__be64 ibv_get_device_guid(ibv_device* device) {
  const int i = device_index(device);
  const uint32_t ip = i > 0 ? configured_ip_at(static_cast<size_t>(i)) : 0;
  return guid_for(ip ? ip : device_ip());
}

int ibv_get_device_index(ibv_device* device) {
  const int i = device_index(device);
  return i >= 0 && static_cast<size_t>(i) < configured_devices() ? i : -1;
}

ibv_context* ibv_open_device(ibv_device* device) {
  const int i = device_index(device);
  if (i < 0 || static_cast<size_t>(i) >= configured_devices()) return fail<ibv_context>(ENODEV);
  // srdma0 is the default device (SOFTRDMA_ADDR's first address, else shared or picked);
  // srdmaN the N-th address. A malformed list makes open_engine_device refuse (EINVAL).
  const uint32_t ip = i == 0 ? 0 : configured_ip_at(static_cast<size_t>(i));
  int rc = 0;
  std::shared_ptr<engine::Device> dev = open_engine_device(ip, rc);
  if (!dev) return fail<ibv_context>(rc);
  return new_context(std::move(dev), device);
}

int ibv_close_device(ibv_context* ctx) {
  Context* c = to_ctx(ctx);
  if (ctx->cmd_fd >= 0) ::close(ctx->cmd_fd);
  ::close(c->async_fds[0]);
  ::close(c->async_fds[1]);
  pthread_mutex_destroy(&ctx->mutex);
  c->file.reset();  // the objects it keeps go before the device they are published in
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

/// ibv_query_gid_ex(3): the GID table entry `index` of port 1. EINVAL for another port, an
/// index past gid_tbl_len (kGidTableLen), flags or a NULL argument; ENODATA for an empty entry
/// (every index but 0), as the kernel answers rdma-core 44.
int _ibv_query_gid_ex(ibv_context* ctx, uint32_t port, uint32_t index, ibv_gid_entry* entry,
                      uint32_t flags, size_t entry_size) {
  if (!ctx || !entry || flags) return EINVAL;
  if (port != 1 || index >= kGidTableLen) return EINVAL;
  if (index != 0) return ENODATA;  // an empty entry (the kernel's rdma_query_gid_table)
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

/// ibv_query_gid(3): the GID at `index`; an empty entry gives the zero GID and 0 (rdma-core
/// 44 turns ENODATA into that); -1 with errno EINVAL for a bad port or index.
int ibv_query_gid(ibv_context* ctx, uint8_t port, int index, ibv_gid* gid) {
  ibv_gid_entry e;
  const int r = index < 0
                    ? EINVAL
                    : _ibv_query_gid_ex(ctx, port, static_cast<uint32_t>(index), &e, 0, sizeof e);
  if (r == ENODATA) {
    *gid = ibv_gid{};  // an empty entry: the zero GID, success (rdma-core 44's ibv_query_gid)
    return 0;
  }
  if (r) {
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

ibv_context* softrdma_open_device_at(uint32_t ipv4) {
  if (ipv4 == 0) return fail<ibv_context>(EINVAL);
  int rc = 0;
  std::shared_ptr<engine::Device> dev = open_engine_device(ipv4, rc);
  if (!dev) return fail<ibv_context>(rc);
  // Listed as the SOFTRDMA_ADDR entry it is, else as srdma0.
  ibv_device* listed = &g_devices[0];
  for (size_t i = 1; i < configured_devices(); ++i)
    if (configured_ip_at(i) == ipv4) listed = &g_devices[i];
  return new_context(std::move(dev), listed);
}

}  // extern "C"
