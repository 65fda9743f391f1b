// What the files of librdmacm.so.1 share: the private side of each public handle (an
// rdma_cm_id, an event channel, an event), the one lock that guards them, and the internal
// functions one file provides to another.
//
// The split follows what Linux divides between the kernel's rdma_cm (drivers/infiniband/core/
// cma.c: ID states, ports, the RDMA IP CM header, turning CM events into rdma_cm events) and
// rdma-core's librdmacm (librdmacm/cma.c: event channels, moving the application's QP along
// on CONNECT_RESPONSE / accept, synchronous IDs) — here both are user space, one library.
//
// Locking: g_mu guards every IdPriv, Channel and CmDevice and each CommManager. Entry points
// take it; the devices' CM threads take it to run received MADs and timers; functions named
// *_locked expect it held. Nothing blocks while holding it: rdma_get_cm_event and the waits
// of synchronous IDs release it (g_cv signals acknowledged events).
#pragma once

#include <rdma/rdma_cma.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "cm/comm_manager.h"

namespace softrdma::cm {

// The public structs are rdma-core 44's (the system header is the one included); their
// x86-64 layout, checked here so a different header cannot slip in unnoticed.
static_assert(sizeof(rdma_cm_id) == 416 && offsetof(rdma_cm_id, route) == 32 &&
              offsetof(rdma_cm_id, ps) == 344 && offsetof(rdma_cm_id, qp_type) == 408);
static_assert(sizeof(rdma_cm_event) == 80 && offsetof(rdma_cm_event, param) == 24);
static_assert(sizeof(rdma_conn_param) == 24 && offsetof(rdma_conn_param, qp_num) == 16);
static_assert(sizeof(rdma_ud_param) == 56 && offsetof(rdma_ud_param, qkey) == 52);
static_assert(sizeof(rdma_addrinfo) == 96 && offsetof(rdma_addrinfo, ai_next) == 88);
static_assert(sizeof(rdma_event_channel) == 4);

class CmDevice;
struct Channel;

/// One rdma_join_multicast on an ID (librdmacm's cma_multicast): the group's IPv4 address
/// and GID (::ffff:a.b.c.d, Linux cma_iboe_set_mgid for RoCEv2), the application's context
/// and join flags, and whether the ID's QP was attached when the join event was fetched.
struct Multicast {
  uint64_t serial = 0;  ///< names it in its MULTICAST_JOIN event
  uint32_t group = 0;   ///< host order
  ibv_gid mgid{};
  void* context = nullptr;
  uint32_t join_flags = 0;  ///< enum rdma_cm_join_mc_attr_join_flags
  ibv_qp* attached = nullptr;
};

/// States of an rdma_cm_id (Linux's enum rdma_cm_state).
enum class IdState : uint8_t {
  kIdle,
  kAddrQuery,
  kAddrResolved,
  kRouteQuery,
  kRouteResolved,
  kConnect,
  kDisconnect,
  kAddrBound,
  kListen,
  kDestroying,
};

/// rdma_cm_id and what the library keeps with it (librdmacm's cma_id_private plus the
/// kernel's rdma_id_private).
struct IdPriv {
  rdma_cm_id id{};  // first: an rdma_cm_id* is an IdPriv*
  Channel* channel() const { return reinterpret_cast<Channel*>(id.channel); }

  CmDevice* dev = nullptr;  ///< set once bound to an address (or resolved)
  IdState state = IdState::kIdle;
  bool sync = false;     ///< created without a channel: calls wait for their event
  uint32_t comm_id = 0;  ///< the CommManager ID of its connection / listen (0: none)

  // Addresses (host order). A wildcard bind keeps src_ip 0 in route.addr but sits on a device.
  uint32_t src_ip = 0;
  uint16_t src_port = 0;
  uint32_t dst_ip = 0;
  uint16_t dst_port = 0;
  bool port_bound = false;      ///< holds src_port in dev's port table
  bool ephemeral_port = false;  ///< src_port was chosen by reserve_port (bound to port 0)
  bool wildcard = false;
  /// Bound to an address of this host that none of the process's devices owns (cm_id.cpp,
  /// owned_locked): as the kernel's rdma_cm, no device is attached (id.verbs NULL); the ID
  /// keeps src_ip and holds its port on the default device, which `dev` names.
  bool unattached = false;

  // rdma_set_option.
  uint8_t tos = 0;
  bool tos_set = false;
  bool reuseaddr = false;
  bool afonly = false;
  uint8_t ack_timeout = 0;  ///< RDMA_OPTION_ID_ACK_TIMEOUT (0: computed)

  // The connection: what this side's QP is moved to RTR/RTS with (rdma_init_qp_attr).
  uint8_t initiator_depth = 0;
  uint8_t responder_resources = 0;
  uint32_t seq_num = 0;  ///< our starting PSN (REQ / REP)
  uint32_t remote_qpn = 0;
  uint32_t remote_psn = 0;
  uint8_t retry_count = 7;
  uint8_t rnr_retry_count = 7;
  uint8_t path_mtu = 0;           ///< IB MTU enum
  uint8_t local_ack_timeout = 0;  ///< the QP's timeout attribute
  uint8_t hop_limit = 64;
  uint32_t qkey = 0;    ///< UD: the Q_Key of this side's QP
  uint32_t qp_num = 0;  ///< QPN sent in REQ/REP when no QP was created on the ID
  bool connect_error = false;
  bool remote_established = false;

  // Events reported to the application for this ID and those it acknowledged: destroy waits
  // until they match (rdma_destroy_id, librdmacm's events_completed).
  unsigned events_reported = 0;
  unsigned events_completed = 0;

  // rdma_create_ep: the QP to create on each request of a passive endpoint; data to prepend
  // to the private data of rdma_connect (rdma_addrinfo::ai_connect).
  std::unique_ptr<ibv_qp_init_attr> qp_init_attr;
  std::vector<uint8_t> connect_data;

  ibv_sa_path_rec path{};  ///< id.route.path_rec points here once the route is resolved
  ibv_ece local_ece{};
  ibv_ece remote_ece{};

  /// A passive ID whose CONNECT_REQUEST has not been fetched yet belongs to its listener:
  /// destroying the listener rejects and destroys it.
  IdPriv* listener = nullptr;

  /// The multicast groups joined on this ID (multicast.cpp), oldest first.
  std::vector<Multicast> mcs;
};

/// An event: rdma_cm_event and the storage its pointers point into.
struct CmaEvent {
  rdma_cm_event event{};    // first: rdma_ack_cm_event finds the CmaEvent from it
  IdPriv* owner = nullptr;  ///< the ID whose events_reported counts it
  uint8_t private_data[kMadBytes]{};
  /// CONNECT_RESPONSE: the REP's values the active side's QP needs (applied when fetched).
  bool needs_rtu = false;
  /// MULTICAST_JOIN: the Multicast::serial of the join (its QP is attached when fetched).
  uint64_t mc_serial = 0;
};

/// rdma_event_channel: an eventfd that is readable while the queue holds events.
struct Channel {
  rdma_event_channel ch{};  // first
  std::deque<CmaEvent*> queue;
  bool readable = false;  ///< the eventfd's counter is non-zero
  /// Threads blocked in rdma_get_cm_event on it. A channel destroyed while some wait, or
  /// before one gets there (an application bug rping has: on an early error its main thread
  /// destroys the channel its CM thread waits on, then exits), is never freed (its fd is
  /// kept while a thread polls it), and rdma_get_cm_event on it blocks until the process
  /// exits — as a thread blocked in librdmacm's read of the kernel's ucma fd stays when
  /// another thread closes it. Returning an error instead had rping's CM thread call exit()
  /// beside its main thread's (a double free in the exit handlers).
  int waiters = 0;
  bool destroyed = false;
};

extern std::mutex& g_mu;  // never destroyed (cm_device.cpp)
extern std::condition_variable& g_cv;

inline IdPriv* priv(rdma_cm_id* id) {
  return reinterpret_cast<IdPriv*>(id);
}

/// librdmacm's ERR(): errno = e, return -1.
inline int fail_errno(int e) {
  errno = e;
  return -1;
}

// ---- library state (cm_device.cpp) --------------------------------------------------------
/// The first use of the library: checks that softrdma's libibverbs is loaded (its private
/// hooks), once. Returns 0 or ENOSYS (after one message on stderr saying what is missing).
int library_init();

// ---- event channels (event_channel.cpp) ------------------------------------------------------
/// Queues `ev` on `id`'s channel (takes ownership) and counts it against `id`.
void queue_event_locked(IdPriv* id, std::unique_ptr<CmaEvent> ev);
/// A new event of `type` / `status` about `id`.
std::unique_ptr<CmaEvent> make_event(IdPriv* id, rdma_cm_event_type type, int status = 0);
/// Removes the queued (unfetched) events of `id` from its channel; returns them.
std::vector<std::unique_ptr<CmaEvent>> unqueue_events_locked(IdPriv* id);
/// Waits for the next event of a synchronous ID's own channel and keeps it in id->event
/// (librdmacm's ucma_complete): 0, or -1 with errno (ECONNREFUSED for REJECTED, the event's
/// status otherwise). Releases g_mu while waiting (`lk` holds it).
int complete_sync_locked(IdPriv* id, std::unique_lock<std::mutex>& lk);
/// rdma_get_cm_event's body; `lk` holds g_mu.
int get_event_locked(Channel* ch, rdma_cm_event** out, std::unique_lock<std::mutex>& lk);
Channel* create_channel();
/// Destroys a channel and its queued events. An application's channel (rdma_create_event_
/// channel) is kept, marked destroyed (see Channel::waiters); a synchronous ID's own channel,
/// which only this library waits on, is freed unless a thread waits on it now.
void destroy_channel(Channel* ch, bool application_owned);

// ---- IDs (cm_id.cpp) ---------------------------------------------------------------------
/// An IPv4 address from a sockaddr the application passed: AF_INET, or AF_INET6 holding the
/// unspecified address (the wildcard) or an IPv4-mapped address. Returns 0 or an errno:
/// EINVAL for no address or an unknown family (librdmacm's ucma_addrlen), EAFNOSUPPORT for
/// IPv6 and AF_IB (softrdma devices are IPv4 addresses).
int ipv4_of(const sockaddr* sa, uint32_t& ip, uint16_t& port);
IdPriv* alloc_id_locked(Channel* channel, void* context, rdma_port_space ps, ibv_qp_type qp_type);
/// Frees an ID's resources (ports, CM ID, path) and the ID; g_mu held, no event pending.
void free_id_locked(IdPriv* id);
/// Binds `id` to (ip, port) on the device owning ip (0: the default device, wildcard).
int bind_locked(IdPriv* id, uint32_t ip, uint16_t port, bool wildcard);
/// Releases every ID's connection (library unload: peers get REJ/DREQ/DREP, not silence).
void release_all_connections_locked();
/// How many rdma_cm_ids are alive (the library's unload closes its devices only at 0).
size_t live_ids_locked();
/// Fills id.route.addr from the ID's addresses and GIDs.
void publish_addresses_locked(IdPriv* id);
/// The path record of the ID's route (RoCE: built locally, no SA; Linux
/// cma_resolve_iboe_route), from its addresses, path MTU, hop limit and TOS; id.route points
/// at it.
void build_path_locked(IdPriv* id);

// ---- connections (connection.cpp) ----------------------------------------------------------
/// The CommManager handler of an ID (active or passive) and of a listener.
CmHandler id_handler(IdPriv* id);
/// Releases the ID's connection in the CommManager (sends what its state calls for).
void release_connection_locked(IdPriv* id);
/// Sends RTU after a REP (the active side's accept step, librdmacm ucma_process_conn_resp).
int send_rtu_locked(IdPriv* id);
/// The path values of a new connection not set yet: MTU (the port's), local ACK timeout.
void init_path_locked(IdPriv* id);
/// An address vector from the ID's port towards `dgid` (RoCEv2: always a GRH), with the
/// ID's TOS as traffic class and service level.
ibv_ah_attr ah_attr_to(const IdPriv* id, const ibv_gid& dgid, uint8_t hop_limit);
/// The address vector to reach the ID's peer (its IPv4-mapped GID, the ID's hop limit).
ibv_ah_attr peer_ah_attr(const IdPriv* id);

// ---- multicast (multicast.cpp) -----------------------------------------------------------
/// A fetched MULTICAST_JOIN: attaches the ID's QP to the group unless the join was send-only
/// (librdmacm's ucma_process_join); a failure turns the event into MULTICAST_ERROR.
void process_join_locked(CmaEvent* ev);
/// Leaves every group of `id` (an ID being destroyed): detaches its QP where attached.
void leave_all_locked(IdPriv* id);

// ---- QPs (qp.cpp) ------------------------------------------------------------------------
/// rdma_init_qp_attr's body (the attributes of the requested state for the ID's QP).
int init_qp_attr_locked(IdPriv* id, ibv_qp_attr* attr, int* mask);
/// Moves id->qp to RTR (with max_dest_rd_atomic = resp_res unless 0xff) and RTS.
int modify_qp_rtr_rts_locked(IdPriv* id, uint8_t resp_res, uint8_t init_depth);
/// Moves id->qp to ERR (librdmacm ucma_modify_qp_err); 0 when there is no QP.
int modify_qp_err_locked(IdPriv* id);

}  // namespace softrdma::cm
