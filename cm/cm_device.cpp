#include "cm/cm_device.h"

#include <dlfcn.h>
#include <endian.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>

#include "base/clock.h"
#include "base/library_pin.h"
#include "base/params.h"
#include "cm/address.h"
#include "cm/log.h"

namespace softrdma::cm {

// Never destroyed: an application thread may still wait on g_cv when the process exits (in
// rdma_get_cm_event on a destroyed channel, which blocks for good, as a read of the kernel's
// closed ucma fd does), and glibc's pthread_cond_destroy waits for its waiters, so a static
// destructor would keep exit() from returning (docs/rdma-cm.md, "Design").
std::mutex& g_mu = *new std::mutex;
std::condition_variable& g_cv = *new std::condition_variable;

namespace {

/// Every device opened so far, in opening order (the first is the default one).
std::vector<std::unique_ptr<CmDevice>>& devices() {
  static auto* d = new std::vector<std::unique_ptr<CmDevice>>;  // closed by close_all()
  return *d;
}

using OpenDeviceAt = ibv_context* (*)(uint32_t);

/// Linux's CMA_IBOE_PACKET_LIFETIME: the packet life time of every RoCE path record.
constexpr uint8_t kRocePacketLifeTime = 16;

uint32_t context_ip(ibv_context* ctx) {
  ibv_gid gid{};
  if (ibv_query_gid(ctx, 1, 0, &gid) != 0) return 0;
  return uint32_t(gid.raw[12]) << 24 | uint32_t(gid.raw[13]) << 16 | uint32_t(gid.raw[14]) << 8 |
         gid.raw[15];
}

CmConfig config_for(const ibv_device_attr& attr) {
  CmConfig c;
  c.ca_guid = be64toh(attr.node_guid);
  c.ca_ack_delay = attr.local_ca_ack_delay;
  c.packet_life_time = kRocePacketLifeTime;
  int64_t timeout = c.response_timeout, retries = c.max_retries;
  std::string error;
  if (!params::read_integer(params::kCmResponseTimeout, timeout, error) ||
      !params::read_integer(params::kCmRetries, retries, error))
    log().warn("{} (using the default)", error);
  c.response_timeout = uint8_t(timeout);
  c.max_retries = uint8_t(retries);
  return c;
}

/// At unload (process exit) the kernel's rdma_cm would tear down the process's connections:
/// do the same — REJ, DREQ or DREP to every peer — so peers do not wait out their retries.
/// Then the CM threads stop: at a dlclose (Open MPI unloads libfabric, and with it this
/// library, in MPI_Finalize) a thread left polling would run on in unmapped code and crash
/// the process seconds later. The threads stop even when g_mu stays busy (another thread
/// holds it while the process exits, or the CM thread is slow in a send): up to 2 s for it,
/// then without the connections' teardown.
/// The process that loaded the library (a forked child's pid differs).
const pid_t g_library_pid = ::getpid();

struct Unload {
  ~Unload() {
    bool idle = false, locked = false;
    std::vector<std::unique_ptr<CmDevice>> devs;
    // A child forked while another thread held g_mu never sees it released: wait less there.
    const int tries = g_library_pid == ::getpid() ? 2000 : 200;
    for (int i = 0; i < tries && !(locked = g_mu.try_lock()); ++i)
      clock::real_sleep_ns(1'000'000);  // real: waits for a lock holder, not the network
    if (locked) {
      release_all_connections_locked();
      // Whether IDs are left and which devices there are, in one critical section: an ID
      // another thread binds after it (exit() from one thread while others still call in:
      // rping's failed connect) finds no device taken here and opens its own.
      idle = live_ids_locked() == 0;
      devs = CmDevice::take_all_locked();
      g_mu.unlock();
    } else {
      devs = CmDevice::take_all_locked();  // g_mu stuck: nobody opens devices then
    }
    CmDevice::close_all(std::move(devs), idle);
  }
} g_unload;

/// Keeps this library mapped for the rest of the process once a device (and so a CM thread)
/// was opened, as -z nodelete would: a program may dlclose it (Open MPI's MPI_Finalize
/// dlcloses libfabric, and with it this library) while an rdma_cm_id is still held and a
/// thread (a CM thread, or one of the application's in a librdmacm call) is inside it
/// (docs/rdma-cm.md, "Unloading"). Unload's teardown then runs at process exit.
void pin_library() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (const std::string e =
            base::pin_object_containing(reinterpret_cast<const void*>(&pin_library));
        !e.empty())
      log().warn("cannot pin this library in memory: {}", e);
  });
}

}  // namespace

int library_init() {
  static const int result = [] {
    const bool open_at = ::dlsym(RTLD_DEFAULT, "softrdma_open_device_at") != nullptr;
    const bool qp1 = ::dlsym(RTLD_DEFAULT, "softrdma_create_qp1") != nullptr;
    if (open_at && qp1) return 0;
    std::fprintf(stderr,
                 "librdmacm (softrdma): this RDMA-CM needs softrdma's libibverbs.so.1 and its "
                 "private hooks (missing: %s): the libibverbs.so.1 loaded is another one, or an "
                 "older softrdma. Run the program with `softrdma run`, or put softrdma's "
                 "build/lib first in LD_LIBRARY_PATH.\n",
                 !open_at && !qp1 ? "softrdma_open_device_at and softrdma_create_qp1"
                 : !open_at       ? "softrdma_open_device_at"
                                  : "softrdma_create_qp1 (QP1, the GSI)");
    return ENODEV;
  }();
  return result;
}

CmDevice* CmDevice::get_locked(uint32_t ip, int& err) {
  auto& devs = devices();
  if (ip == 0 && !devs.empty()) return devs.front().get();
  for (auto& d : devs)
    if (d->ip_ == ip) return d.get();
  if ((err = library_init())) return nullptr;

  ibv_context* ctx = nullptr;
  if (ip == 0) {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (list && n > 0) ctx = ibv_open_device(list[0]);
    err = ctx ? 0 : (errno ? errno : ENODEV);
    if (list) ibv_free_device_list(list);
  } else {
    if (!is_local_address(ip)) {
      err = EADDRNOTAVAIL;
      return nullptr;
    }
    auto open_at = reinterpret_cast<OpenDeviceAt>(::dlsym(RTLD_DEFAULT, "softrdma_open_device_at"));
    ctx = open_at(ip);
    if (!ctx) err = errno ? errno : ENODEV;
  }
  if (!ctx) {
    log().error("cannot open a softrdma device{}: {}", ip ? " at " + ip_string(ip) : "",
                std::strerror(err));
    return nullptr;
  }
  const uint32_t got = context_ip(ctx);
  for (auto& d : devs)  // the default device may be one we already have
    if (d->ip_ == got) {
      ibv_close_device(ctx);
      return d.get();
    }

  std::unique_ptr<CmDevice> d(new CmDevice);
  d->ctx_ = ctx;
  d->ip_ = got;
  ibv_port_attr port{};
  if (ibv_query_device(ctx, &d->attr_) != 0 || ibv_query_port(ctx, 1, &port) != 0 ||
      !(d->pd_ = ibv_alloc_pd(ctx))) {
    err = errno ? errno : EIO;
    log().error("cannot query or use the device at {}: {}", ip_string(got), std::strerror(err));
    ibv_close_device(ctx);
    return nullptr;
  }
  d->active_mtu_ = uint8_t(port.active_mtu);
  std::string error;
  d->transport_ = VerbsMadTransport::create(ctx, error, err);
  if (!d->transport_) {
    log().error("{}", error);
    if (err == ENOSYS) std::fprintf(stderr, "librdmacm (softrdma): %s\n", error.c_str());
    ibv_dealloc_pd(d->pd_);
    ibv_close_device(ctx);
    return nullptr;
  }
  CmConfig config = config_for(d->attr_);
  // Processes sharing the address (net/address_share.h): this one's slot marks its
  // communication IDs, and the shared port table says which REQs are another's.
  using AddressSlot = int (*)(ibv_context*);
  if (auto slot = reinterpret_cast<AddressSlot>(::dlsym(RTLD_DEFAULT, "softrdma_address_slot")))
    config.slot = uint8_t(std::max(0, slot(ctx)));
  if (int e = d->shared_ports_.open(got); e != 0)
    log().warn("rdma_cm ports of {} not shared with other processes: {}", ip_string(got),
               std::strerror(e));
  config.listened_elsewhere = [dev = d.get()](uint64_t service_id) {
    return dev->shared_ports_.listened_elsewhere(uint16_t(service_id >> 16), uint16_t(service_id));
  };
  d->cm_ = std::make_unique<CommManager>(*d->transport_, std::move(config));
  d->wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  pin_library();
  d->thread_pid_ = ::getpid();
  d->thread_ = std::thread([dev = d.get()] {
    ::pthread_setname_np(::pthread_self(), "srdma-cm");  // top -H, perf sched, gdb
    dev->run();
  });
  log().info("RDMA-CM on {} (QP1 ready; response timeout {}, {} retries)", ip_string(got),
             d->cm_->config().response_timeout, d->cm_->config().max_retries);
  devs.push_back(std::move(d));
  return devs.back().get();
}

std::vector<CmDevice*> CmDevice::all_locked() {
  std::vector<CmDevice*> out;
  for (auto& d : devices()) out.push_back(d.get());
  return out;
}

std::vector<std::unique_ptr<CmDevice>> CmDevice::take_all_locked() {
  std::vector<std::unique_ptr<CmDevice>> devs;
  devs.swap(devices());
  return devs;
}

void CmDevice::close_all(std::vector<std::unique_ptr<CmDevice>> devs, bool close) {
  // Outside g_mu: the threads take it.
  for (auto& d : devs) {
    d->stop_ = true;
    d->kick();
  }
  for (auto& d : devs) {
    if (!d->thread_.joinable()) continue;
    if (d->thread_pid_ != ::getpid()) {
      // A child forked with the device open (pyverbs' rdmacm tests): the thread is the
      // parent's, it does not exist here.
      close = false;
      continue;
    }
    // A thread that does not come back within 2 s (stuck behind g_mu) is left: waiting for
    // it would hang the unload. Polled every 20 µs: a kicked thread is back within tens of
    // µs, and every ms the exit takes is a ms in which another thread of the application can
    // reach exit() too (docs/rdma-cm.md, "exit() beside a call in progress").
    const uint64_t until = clock::real_now_ns() + 2'000'000'000;
    while (!d->exited_ && clock::real_now_ns() < until)
      clock::real_sleep_ns(20'000);  // real: waits for a thread to exit, not the network
    if (d->exited_ && d->thread_.get_id() != std::this_thread::get_id()) {
      d->thread_.join();
    } else {
      d->thread_.detach();  // stuck, or exit() was called from this CM thread
      close = false;
    }
  }
  if (close) {
    devs.clear();
  } else {
    for (auto& d : devs) {
      if (d->thread_.joinable()) d->thread_.detach();  // not ours to join (see above)
      (void)d.release();                               // still in the application's hands
    }
  }
}

CmDevice::~CmDevice() {
  stop_ = true;
  kick();
  if (thread_.joinable()) thread_.join();
  cm_.reset();
  transport_.reset();
  if (xrcd_) ibv_close_xrcd(xrcd_);
  if (pd_) ibv_dealloc_pd(pd_);
  if (ctx_) ibv_close_device(ctx_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

ibv_xrcd* CmDevice::xrcd() {
  std::lock_guard lk(g_mu);
  if (!xrcd_) {
    ibv_xrcd_init_attr a{};
    a.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    a.fd = -1;
    a.oflags = O_CREAT;
    xrcd_ = ibv_open_xrcd(ctx_, &a);
  }
  return xrcd_;
}

void CmDevice::kick() {
  uint64_t one = 1;
  if (wake_fd_ < 0) return;
  ssize_t n = ::write(wake_fd_, &one, sizeof one);
  (void)n;  // a full counter already wakes the thread
}

void CmDevice::run() {
  struct Exited {
    std::atomic<bool>& flag;
    ~Exited() { flag = true; }
  } exited{exited_};
  while (!stop_) {
    int timeout_ms = -1;
    {
      std::lock_guard lk(g_mu);
      if (auto d = cm_->next_deadline()) {
        const uint64_t now = transport_->now_ns();
        // The CM's deadlines are virtual (clock::now_ns); poll waits in real time.
        timeout_ms = clock::to_real_timeout_ms(
            *d <= now ? 0 : int(std::min<uint64_t>((*d - now + 999'999) / 1'000'000, 60'000)));
      }
    }
    pollfd fds[2] = {{transport_->event_fd(), POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    ::poll(fds, 2, timeout_ms);
    if (stop_) break;
    if (fds[1].revents & POLLIN) {
      uint64_t v;
      ssize_t n = ::read(wake_fd_, &v, sizeof v);
      (void)n;
    }
    std::lock_guard lk(g_mu);
    transport_->arm();  // before polling: a completion after this raises a new event
    transport_->poll(
        [this](std::span<const uint8_t> mad, const MadAddress& from) { cm_->on_mad(mad, from); });
    const CmCounters before = cm_->counters();
    cm_->on_timer();
    // A resend costs a response timeout (~4.8 s at Linux's defaults): worth a line where a
    // connect took that long for no visible reason (a MAD lost on the way).
    const CmCounters& after = cm_->counters();
    if (after.mads_resent != before.mads_resent || after.timeouts != before.timeouts)
      log().info(
          "RDMA-CM on {}: {} MAD(s) sent again, {} given up, after their response "
          "timeout (totals {} / {})",
          ip_string(ip_), after.mads_resent - before.mads_resent, after.timeouts - before.timeouts,
          after.mads_resent, after.timeouts);
  }
}

int CmDevice::reserve_port(uint16_t ps, uint16_t& port, IdPriv* id) {
  const bool ephemeral = port == 0;
  if (ephemeral) {
    // An ephemeral port, as Linux's cma_alloc_any_port: random start in the local range.
    static thread_local std::minstd_rand rng{std::random_device{}()};
    constexpr uint16_t kLow = 32768, kHigh = 60999;
    const uint16_t start = uint16_t(kLow + rng() % (kHigh - kLow + 1));
    for (uint32_t i = 0; i <= kHigh - kLow; ++i) {
      const uint16_t p = uint16_t(kLow + (start - kLow + i) % (kHigh - kLow + 1));
      if (!ports_.count({ps, p}) && !shared_ports_.taken_elsewhere(ps, p)) {
        port = p;
        break;
      }
    }
    if (port == 0) return EADDRINUSE;
  }
  auto& holders = ports_[{ps, port}];
  for (IdPriv* h : holders)
    if (!h->reuseaddr || !id->reuseaddr || h->state == IdState::kListen) {
      // Worth a line: a well-known port in the ephemeral range (32768–60999) can be taken by
      // one of the process's own IDs bound to port 0 (as with the kernel's rdma_cm).
      log().info("port {} of {} (port space {:#x}) is in use by an ID of this process{}", port,
                 ip_string(ip_), ps, h->ephemeral_port ? " that got it as its ephemeral port" : "");
      return EADDRINUSE;
    }
  if (holders.empty()) {
    // The first local holder takes it across the processes sharing the address.
    if (int e = shared_ports_.claim(ps, port); e != 0) {
      ports_.erase({ps, port});
      if (e == EADDRINUSE)
        log().info("port {} of {} (port space {:#x}) is in use by another process at the address",
                   port, ip_string(ip_), ps);
      return e == ENOSPC ? EADDRINUSE : e;
    }
  }
  holders.push_back(id);
  id->ephemeral_port = ephemeral;
  return 0;
}

void CmDevice::set_listening(uint16_t ps, uint16_t port, bool listening) {
  shared_ports_.set_listening(ps, port, listening);
}

void CmDevice::release_port(uint16_t ps, uint16_t port, IdPriv* id) {
  auto it = ports_.find({ps, port});
  if (it == ports_.end()) return;
  std::erase(it->second, id);
  if (it->second.empty()) {
    ports_.erase(it);
    shared_ports_.release(ps, port);
  }
}

const std::vector<IdPriv*>* CmDevice::port_holders(uint16_t ps, uint16_t port) const {
  auto it = ports_.find({ps, port});
  return it == ports_.end() ? nullptr : &it->second;
}

}  // namespace softrdma::cm
