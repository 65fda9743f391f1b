// One softrdma device as the RDMA-CM sees it: an ibv_context on the device that owns an IPv4
// address, QP1 (verbs_mad_transport.h) and the CommManager that speaks through it, the thread
// that receives MADs and runs the CM's timers, and the rdma_cm port tables of its address.
//
// Which device an ID lands on (docs/rdma-cm.md, "Addresses and devices"): a softrdma device
// is one IPv4 address. rdma_bind_addr / rdma_resolve_addr's source address name it: the
// process's device at that address is used, or opened there (softrdma_open_device_at) — so a
// process may hold several. The wildcard address and an unbound active ID use the default
// device (what ibv_open_device returns: SOFTRDMA_ADDR's, else the first one this process
// opened, else the first free 127.0.0.x). Devices stay open until the library is unloaded,
// as librdmacm keeps its devices open.
#pragma once

#include <infiniband/verbs.h>

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "cm/cma.h"
#include "cm/comm_manager.h"
#include "cm/shared_ports.h"
#include "cm/verbs_mad_transport.h"

namespace softrdma::cm {

class CmDevice {
 public:
  /// The device owning `ip` (host order; 0: the default device), opened with its QP1 and CM
  /// thread on first use (another process's device at `ip` is shared with it). g_mu held.
  /// Returns nullptr with `err`: ENOSYS (not softrdma's libibverbs), EADDRNOTAVAIL (not an
  /// address of this host), or what opening the device returned.
  static CmDevice* get_locked(uint32_t ip, int& err);
  /// Every device opened so far (rdma_get_devices). g_mu held.
  static std::vector<CmDevice*> all_locked();
  /// Library unload: removes every device from the list (a later get_locked opens anew) and
  /// returns them, for close_all. g_mu held (or stuck: see Unload in cm_device.cpp).
  static std::vector<std::unique_ptr<CmDevice>> take_all_locked();
  /// Library unload (dlclose, or process exit), for the devices take_all_locked returned:
  /// stops every device's CM thread, so that none runs on in an unmapped library, and — when
  /// `close` (no rdma_cm_id was left when they were taken) — destroys QP1 and the PD and
  /// closes the contexts, so that the engine's progress threads stop too. Devices an
  /// application still uses (IDs left, maybe its QPs on id->verbs) are left open. g_mu not
  /// held; waits for each thread at most 2 s, and leaves open what it could not stop.
  static void close_all(std::vector<std::unique_ptr<CmDevice>> devs, bool close);

  ~CmDevice();
  CmDevice(const CmDevice&) = delete;
  CmDevice& operator=(const CmDevice&) = delete;

  ibv_context* verbs() const { return ctx_; }
  /// The PD the library allocates per device: rdma_cm_id::pd of IDs on it, used by
  /// rdma_create_qp when the application passes none (librdmacm's cma_dev->pd).
  ibv_pd* pd() const { return pd_; }
  uint32_t ip() const { return ip_; }
  /// The XRC domain the library opens once per device for XRC IDs that name none
  /// (librdmacm's ucma_get_xrcd): the target QP and its SRQs must share one. nullptr with
  /// errno set when the device refuses.
  ibv_xrcd* xrcd();
  CommManager& cm() { return *cm_; }
  const ibv_device_attr& attr() const { return attr_; }
  uint8_t active_mtu() const { return active_mtu_; }
  /// IB static rate of the port (ibv_rate), for path records and REQ.
  uint8_t rate() const { return rate_; }

  /// Wakes the CM thread so it looks at the CM's timers again (after a call that armed one).
  void kick();

  /// Takes `port` (host order; 0: a free ephemeral one, returned in `port`) of port space
  /// `ps` for `id`. A taken port is shared only when every holder set RDMA_OPTION_ID_REUSEADDR
  /// and none listens. Returns 0 or EADDRINUSE.
  int reserve_port(uint16_t ps, uint16_t& port, IdPriv* id);
  void release_port(uint16_t ps, uint16_t port, IdPriv* id);
  /// The IDs holding (ps, port).
  const std::vector<IdPriv*>* port_holders(uint16_t ps, uint16_t port) const;
  /// Tells the processes sharing this address that (ps, port) is listened to here (or no
  /// longer): their CMs leave REQs for it to this one.
  void set_listening(uint16_t ps, uint16_t port, bool listening);

 private:
  CmDevice() = default;
  void run();

  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_xrcd* xrcd_ = nullptr;
  uint32_t ip_ = 0;
  ibv_device_attr attr_{};
  uint8_t active_mtu_ = IBV_MTU_1024;
  uint8_t rate_ = IBV_RATE_100_GBPS;
  std::unique_ptr<VerbsMadTransport> transport_;
  std::unique_ptr<CommManager> cm_;
  int wake_fd_ = -1;
  std::atomic<bool> stop_{false};
  pid_t thread_pid_ = 0;             ///< the process that started thread_ (a forked child has none)
  std::atomic<bool> exited_{false};  ///< run() returned (close_all waits for it, bounded)
  std::thread thread_;
  std::map<std::pair<uint16_t, uint16_t>, std::vector<IdPriv*>> ports_;
  SharedPorts shared_ports_;  // the address's ports across processes (cm/shared_ports.h)
};

}  // namespace softrdma::cm
