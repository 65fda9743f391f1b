// rsockets: the socket API of rdma-core's librdmacm (rsocket(7)), stream sockets over RC QPs,
// written against the public librdmacm and libibverbs calls only (rdma_create_id,
// rdma_connect, ibv_post_send, …) — a library above the CM and verbs, not part of them
// (docs/rdma-cm.md, "rsockets").
//
// Wire compatible with rdma-core's rsocket.c (protocol.h): each side announces its receive
// buffer and a target buffer list in the REQ/REP private data; data goes as RDMA WRITE WITH
// IMMEDIATE (op DATA, length) into the half of the peer's receive buffer the peer last
// granted; the receiver grants room again (op SGL: RDMA WRITE of an Sge into the sender's
// target list, immediate = new receive sequence limit) when half its buffer is free or half
// its receive WQEs are used. The sender may post while (a) a send WQE is free, (b) its send
// buffer has RS_SNDLOWAT bytes, (c) sseq_no != sseq_comp (a receive WQE waits at the peer),
// (d) the current target has room. Shutdown and close send op CTRL.
//
// Locking: one mutex per socket guards its state; a blocking call releases it while it
// sleeps in poll(2) on the CQ's completion channel and the CM channel.
#include <byteswap.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <rdma/rsocket.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cm/log.h"
#include "cm/rsocket/protocol.h"

namespace softrdma::rsocket {
namespace {

using Clock = std::chrono::steady_clock;

// rsocket.c's defaults (also the values rsocket(7) names).
constexpr uint32_t kDefaultMem = 1u << 17;   // receive buffer
constexpr uint32_t kDefaultWmem = 1u << 17;  // send buffer
constexpr uint32_t kDefaultInline = 64;
constexpr uint16_t kDefaultQueue = 384;
constexpr uint32_t kQpMinSize = 16;
constexpr uint32_t kQpMaxSize = 0xFFFE;
constexpr uint64_t kRecvFlag = 1ull << 63;  // RS_WR_ID_FLAG_RECV
// How long connection setup may take before ETIMEDOUT (address, route, REQ/REP); the CM's
// own REQ retries end sooner for a silent peer.
constexpr auto kConnectTimeout = std::chrono::seconds(30);
// A blocking call sleeps in poll(2) at most this long between checks of its socket.
constexpr int kWaitSliceMs = 1000;
// Busy-poll before sleeping (rsocket.c's polling_time, 10 µs).
constexpr auto kSpin = std::chrono::microseconds(10);
// A socket that waits this long without a completion probes its peer (probe_if_idle).
constexpr auto kProbeIdle = std::chrono::seconds(5);

// enum rs_state of rsocket.c: bit sets, so "connected" covers readable/writable.
enum : uint32_t {
  kInit = 0,
  kBound = 0x1,
  kListening = 0x2,
  kOpening = 0x4,
  kResolvingAddr = kOpening | 0x10,
  kResolvingRoute = kOpening | 0x20,
  kConnecting = kOpening | 0x40,
  kConnected = 0x100,
  kWritable = 0x200,
  kReadable = 0x400,
  kConnectRdwr = kConnected | kReadable | kWritable,
  kConnectError = 0x800,
  kDisconnected = 0x1000,
  kError = 0x2000,
};

int set_errno(int e) {
  errno = e;
  return -1;
}

void set_nonblock(int fd, bool on) {
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl >= 0) ::fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
}

/// A registered local buffer for an riomap'd window.
struct IomapMr {
  uint64_t offset = 0;
  ibv_mr* mr = nullptr;
  int index = -1;  ///< entry in the peer's iomap table; -1: a local (read-only) mapping
};

/// One stream rsocket. Its descriptor is the fd of its own CM event channel (as rsocket.c's
/// index is cm_id->channel->fd), so it is a real, unique descriptor number.
struct Socket {
  int fd = -1;
  rdma_event_channel* channel = nullptr;
  rdma_cm_id* id = nullptr;
  std::mutex mu;
  int waiters = 0;

  int fs_flags = 0;  // O_NONBLOCK
  int fd_flags = 0;  // FD_CLOEXEC
  uint32_t state = kInit;
  int err = 0;  // SO_ERROR
  sockaddr_in peer{};
  Clock::time_point connect_deadline{};

  // Options.
  uint32_t sbuf_size = kDefaultWmem;
  uint32_t rbuf_size = kDefaultMem;
  uint32_t sq_inline = kDefaultInline;
  uint32_t sq_size = kDefaultQueue;
  uint32_t rq_size = kDefaultQueue;
  int target_iomap_size = 0;
  uint64_t so_opts = 0;
  uint64_t tcp_opts = 0;
  int ip_tos = 0;
  unsigned keepalive_time = 7200;

  // Credits and control messages.
  bool swap = false;
  uint32_t ctrl_seqno = 0;
  uint32_t ctrl_max_seqno = kCtrlQueue;
  uint16_t sseq_no = 0, sseq_comp = 0, rseq_no = 0, rseq_comp = 0;
  uint32_t remote_sge = 0;
  Sge remote_sgl{}, remote_iomap{};

  // Target buffer list: kSglSize Sge the peer writes credits into, then the iomap table.
  uint8_t* target_buffer = nullptr;
  size_t target_len = 0;
  ibv_mr* target_mr = nullptr;
  volatile Sge* target_sgl = nullptr;
  IomapEntry* target_iomap = nullptr;
  uint32_t target_sge = 0;

  // Receive side.
  struct RMsg {
    Op op;
    uint32_t data;
  };
  std::vector<RMsg> rmsg;  // rq_size + 1 slots
  uint32_t rmsg_head = 0, rmsg_tail = 0;
  uint8_t* rbuf = nullptr;
  ibv_mr* rmr = nullptr;
  uint32_t rbuf_bytes_avail = 0, rbuf_free_offset = 0, rbuf_offset = 0;

  // Send side.
  uint8_t* sbuf = nullptr;
  size_t sbuf_total = 0;
  ibv_mr* smr = nullptr;
  uint32_t sbuf_bytes_avail = 0;
  ibv_sge ssgl[2]{};
  uint32_t sqe_avail = 0;

  // Completions.
  ibv_comp_channel* cq_channel = nullptr;
  ibv_cq* cq = nullptr;
  bool cq_armed = false;
  uint32_t unack_cqe = 0;
  Clock::time_point last_activity{};  // last completion, or last probe

  // iomap.
  std::vector<IomapMr> remote_iomappings;  // writable windows the peer learns of
  std::list<IomapMr*> iomap_queue;         // not yet sent to the peer
  std::list<IomapMr> local_maps;           // read-only windows
  bool iomap_pending = false;

  ~Socket();
};

std::mutex g_table_mu;
std::unordered_map<int, std::shared_ptr<Socket>>& table() {
  static auto* t = new std::unordered_map<int, std::shared_ptr<Socket>>;
  return *t;
}

std::shared_ptr<Socket> lookup(int fd) {
  std::lock_guard lk(g_table_mu);
  auto it = table().find(fd);
  return it == table().end() ? nullptr : it->second;
}

void* page_alloc(size_t len) {
  void* p = nullptr;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  len = (len + page - 1) / page * page;
  if (::posix_memalign(&p, page, len)) return nullptr;
  std::memset(p, 0, len);
  // As rsocket.c's forksafe_alloc: a forked child must not share the registered pages.
  ::madvise(p, len, MADV_DONTFORK);
  return p;
}

Socket::~Socket() {
  if (id && id->qp) rdma_destroy_qp(id);
  for (auto& m : remote_iomappings)
    if (m.mr) ibv_dereg_mr(m.mr);
  for (auto& m : local_maps)
    if (m.mr) ibv_dereg_mr(m.mr);
  if (smr) ibv_dereg_mr(smr);
  if (rmr) ibv_dereg_mr(rmr);
  if (target_mr) ibv_dereg_mr(target_mr);
  if (cq) {
    if (unack_cqe) ibv_ack_cq_events(cq, unack_cqe);
    ibv_destroy_cq(cq);
  }
  if (cq_channel) ibv_destroy_comp_channel(cq_channel);
  std::free(sbuf);
  std::free(rbuf);
  std::free(target_buffer);
  if (id) rdma_destroy_id(id);
  if (channel) rdma_destroy_event_channel(channel);
}

std::shared_ptr<Socket> new_socket(const Socket* inherit) {
  auto rs = std::make_shared<Socket>();
  if (inherit) {
    rs->sbuf_size = inherit->sbuf_size;
    rs->rbuf_size = inherit->rbuf_size;
    rs->sq_inline = inherit->sq_inline;
    rs->sq_size = inherit->sq_size;
    rs->rq_size = inherit->rq_size;
    rs->target_iomap_size = inherit->target_iomap_size;
    rs->fs_flags = inherit->fs_flags;
    rs->fd_flags = inherit->fd_flags;
    rs->so_opts = inherit->so_opts;
    rs->tcp_opts = inherit->tcp_opts;
  }
  rs->channel = rdma_create_event_channel();
  if (!rs->channel) return nullptr;
  set_nonblock(rs->channel->fd, true);  // blocking waits poll(2) it themselves
  rs->fd = rs->channel->fd;
  return rs;
}

void insert(const std::shared_ptr<Socket>& rs) {
  std::lock_guard lk(g_table_mu);
  table()[rs->fd] = rs;
}

// ---- endpoint creation (rs_create_ep / rs_init_bufs) ----

int create_ep(Socket& rs) {
  ibv_device_attr attr{};
  uint32_t max_size = kQpMaxSize;
  if (!ibv_query_device(rs.id->verbs, &attr))
    max_size = std::min<uint32_t>(max_size, static_cast<uint32_t>(attr.max_qp_wr));
  rs.sq_size = std::clamp<uint32_t>(rs.sq_size, kQpMinSize, max_size);
  rs.rq_size = std::clamp<uint32_t>(rs.rq_size, kQpMinSize, max_size);

  rs.cq_channel = ibv_create_comp_channel(rs.id->verbs);
  if (!rs.cq_channel) return -1;
  set_nonblock(rs.cq_channel->fd, true);
  rs.cq =
      ibv_create_cq(rs.id->verbs, static_cast<int>(rs.sq_size + rs.rq_size), &rs, rs.cq_channel, 0);
  if (!rs.cq) return -1;

  ibv_qp_init_attr qa{};
  qa.qp_context = &rs;
  qa.send_cq = rs.cq;
  qa.recv_cq = rs.cq;
  qa.qp_type = IBV_QPT_RC;
  qa.sq_sig_all = 1;
  qa.cap.max_send_wr = rs.sq_size;
  qa.cap.max_recv_wr = rs.rq_size;
  qa.cap.max_send_sge = 2;
  qa.cap.max_recv_sge = 1;
  qa.cap.max_inline_data = rs.sq_inline;
  if (rdma_create_qp(rs.id, nullptr, &qa)) return -1;
  rs.sq_inline = qa.cap.max_inline_data;

  rs.rmsg.assign(rs.rq_size + 1, {});
  rs.sbuf_total = rs.sbuf_size;
  if (rs.sq_inline < sizeof(Sge)) rs.sbuf_total += sizeof(Sge) * kCtrlQueue;
  rs.sbuf = static_cast<uint8_t*>(page_alloc(rs.sbuf_total));
  if (!rs.sbuf) return set_errno(ENOMEM);
  rs.smr = rdma_reg_msgs(rs.id, rs.sbuf, rs.sbuf_total);
  if (!rs.smr) return -1;

  rs.target_len = sizeof(Sge) * kSglSize + sizeof(IomapEntry) * rs.target_iomap_size;
  rs.target_buffer = static_cast<uint8_t*>(page_alloc(rs.target_len));
  if (!rs.target_buffer) return set_errno(ENOMEM);
  rs.target_mr = rdma_reg_write(rs.id, rs.target_buffer, rs.target_len);
  if (!rs.target_mr) return -1;
  rs.target_sgl = reinterpret_cast<volatile Sge*>(rs.target_buffer);
  if (rs.target_iomap_size)
    rs.target_iomap = reinterpret_cast<IomapEntry*>(rs.target_buffer + sizeof(Sge) * kSglSize);

  rs.rbuf = static_cast<uint8_t*>(page_alloc(rs.rbuf_size));
  if (!rs.rbuf) return set_errno(ENOMEM);
  rs.rmr = rdma_reg_write(rs.id, rs.rbuf, rs.rbuf_size);
  if (!rs.rmr) return -1;

  rs.ssgl[0].addr = rs.ssgl[1].addr = reinterpret_cast<uintptr_t>(rs.sbuf);
  rs.ssgl[0].lkey = rs.ssgl[1].lkey = rs.smr->lkey;
  rs.sbuf_bytes_avail = rs.sbuf_size;
  rs.rbuf_free_offset = rs.rbuf_size >> 1;
  rs.rbuf_bytes_avail = rs.rbuf_size >> 1;
  rs.sqe_avail = rs.sq_size - rs.ctrl_max_seqno;
  rs.rseq_comp = static_cast<uint16_t>(rs.rq_size >> 1);
  rs.last_activity = Clock::now();

  for (uint32_t i = 0; i < rs.rq_size; ++i) {
    ibv_recv_wr wr{}, *bad = nullptr;
    wr.wr_id = kRecvFlag;
    if (int e = ibv_post_recv(rs.id->qp, &wr, &bad)) return set_errno(e);
  }
  return 0;
}

LocalBuffers local_buffers(const Socket& rs) {
  return {static_cast<uint16_t>(rs.rq_size),
          rs.target_iomap_size,
          reinterpret_cast<uintptr_t>(rs.target_buffer),
          rs.target_mr->rkey,
          reinterpret_cast<uintptr_t>(rs.rbuf),
          rs.rbuf_size,
          rs.rmr->rkey};
}

void save_conn_data(Socket& rs, const PeerBuffers& p) {
  rs.remote_sgl = p.remote_sgl;
  rs.remote_sge = 1;
  rs.swap = p.swap;
  rs.remote_iomap = p.remote_iomap;
  rs.target_sgl[0].addr = p.first_target.addr;
  rs.target_sgl[0].key = p.first_target.key;
  rs.target_sgl[0].length = p.first_target.length;
  rs.sseq_comp = p.credits;
}

// ---- posting ----

int post_write_imm(Socket& rs, ibv_sge* sgl, int nsge, uint32_t msg, unsigned flags, uint64_t addr,
                   uint32_t rkey) {
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = msg;
  wr.sg_list = sgl;
  wr.num_sge = nsge;
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = flags;
  wr.imm_data = htobe32(msg);
  wr.wr.rdma.remote_addr = addr;
  wr.wr.rdma.rkey = rkey;
  if (int e = ibv_post_send(rs.id->qp, &wr, &bad)) return set_errno(e);
  return 0;
}

int post_msg(Socket& rs, uint32_t msg) {
  return post_write_imm(rs, nullptr, 0, msg, 0, 0, 0);
}

uint32_t sbuf_left(const Socket& rs) {
  return static_cast<uint32_t>(reinterpret_cast<uintptr_t>(rs.sbuf + rs.sbuf_size) -
                               rs.ssgl[0].addr);
}

bool ctrl_avail(const Socket& rs) {
  return rs.ctrl_seqno != rs.ctrl_max_seqno;
}

// rs_send_credits: grant the next half of the receive buffer (when free) and new sequence
// room, or only sequence room.
void send_credits(Socket& rs) {
  rs.ctrl_seqno++;
  rs.rseq_comp = static_cast<uint16_t>(rs.rseq_no + (rs.rq_size >> 1));
  const uint32_t limit = static_cast<uint16_t>(rs.rseq_no + rs.rq_size);
  if (rs.rbuf_bytes_avail >= (rs.rbuf_size >> 1)) {
    Sge sge{reinterpret_cast<uintptr_t>(&rs.rbuf[rs.rbuf_free_offset]), rs.rmr->rkey,
            rs.rbuf_size >> 1};
    if (rs.swap) sge = {bswap_64(sge.addr), bswap_32(sge.key), bswap_32(sge.length)};
    ibv_sge ib{};
    unsigned flags = 0;
    if (rs.sq_inline < sizeof sge) {
      auto* slot = rs.sbuf + rs.sbuf_size + sizeof(Sge) * (rs.ctrl_seqno & (kCtrlQueue - 1));
      std::memcpy(slot, &sge, sizeof sge);
      ib.addr = reinterpret_cast<uintptr_t>(slot);
      ib.lkey = rs.smr->lkey;
    } else {
      ib.addr = reinterpret_cast<uintptr_t>(&sge);
      flags = IBV_SEND_INLINE;
    }
    ib.length = sizeof sge;
    if (post_write_imm(rs, &ib, 1, make_msg(Op::kSgl, limit), flags,
                       rs.remote_sgl.addr + rs.remote_sge * sizeof(Sge), rs.remote_sgl.key)) {
      rs.state = kError;
      rs.err = errno;
      return;
    }
    rs.rbuf_bytes_avail -= rs.rbuf_size >> 1;
    rs.rbuf_free_offset += rs.rbuf_size >> 1;
    if (rs.rbuf_free_offset >= rs.rbuf_size) rs.rbuf_free_offset = 0;
    if (++rs.remote_sge == rs.remote_sgl.length) rs.remote_sge = 0;
  } else if (post_msg(rs, make_msg(Op::kSgl, limit))) {
    rs.state = kError;
    rs.err = errno;
  }
}

void update_credits(Socket& rs) {
  const bool give = (rs.rbuf_bytes_avail >= (rs.rbuf_size >> 1)) ||
                    (static_cast<int16_t>(rs.rseq_no - rs.rseq_comp) >= 0);
  if (give && ctrl_avail(rs) && (rs.state & kConnected)) send_credits(rs);
}

// rs_poll_cq: drain the CQ; receives carry the peer's messages in their immediates.
void poll_cq(Socket& rs) {
  if (!rs.cq) return;
  ibv_wc wc[16];
  uint32_t reposts = 0;
  for (int round = 0; round < 64; ++round) {  // bounded: at most 1024 completions a call
    const int n = ibv_poll_cq(rs.cq, 16, wc);
    if (n <= 0) break;
    rs.last_activity = Clock::now();
    for (int i = 0; i < n; ++i) {
      const ibv_wc& w = wc[i];
      if (w.wr_id & kRecvFlag) {
        if (w.status != IBV_WC_SUCCESS) continue;
        ++reposts;
        const uint32_t msg = be32toh(w.imm_data);
        switch (msg_op(msg)) {
          case Op::kSgl:
            rs.sseq_comp = static_cast<uint16_t>(msg_data(msg));
            break;
          case Op::kIomapSgl:
            break;  // the peer's iomap table changed: it is read when needed
          case Op::kCtrl:
            if (msg_data(msg) == static_cast<uint32_t>(Ctrl::kDisconnect)) {
              rs.state = kDisconnected;
            } else if (msg_data(msg) == static_cast<uint32_t>(Ctrl::kShutdown)) {
              if (rs.state & kWritable)
                rs.state &= ~kReadable;
              else
                rs.state = kDisconnected;
            }
            break;
          case Op::kWrite:
            break;
          default:
            rs.rmsg[rs.rmsg_tail] = {msg_op(msg), msg_data(msg)};
            if (++rs.rmsg_tail == rs.rq_size + 1) rs.rmsg_tail = 0;
            break;
        }
      } else {
        const uint32_t data = static_cast<uint32_t>(w.wr_id);
        switch (msg_op(data)) {
          case Op::kSgl:
            rs.ctrl_max_seqno++;
            break;
          case Op::kCtrl:
            rs.ctrl_max_seqno++;
            if (msg_data(data) == static_cast<uint32_t>(Ctrl::kDisconnect))
              rs.state = kDisconnected;
            break;
          case Op::kIomapSgl:
            rs.sqe_avail++;
            rs.sbuf_bytes_avail += sizeof(IomapEntry);
            break;
          default:
            rs.sqe_avail++;
            rs.sbuf_bytes_avail += msg_data(data);
            break;
        }
        if (w.status != IBV_WC_SUCCESS && (rs.state & kConnected)) {
          softrdma::cm::log().info("rsocket {}: send completion {}: connection lost", rs.fd,
                                   ibv_wc_status_str(w.status));
          rs.state = kError;
          rs.err = w.status == IBV_WC_RETRY_EXC_ERR ? ECONNRESET : EIO;
        }
      }
    }
    if (n < 16) break;
  }
  if (rs.state & kConnected) {
    for (uint32_t i = 0; i < reposts; ++i) {
      ibv_recv_wr wr{}, *bad = nullptr;
      wr.wr_id = kRecvFlag;
      if (int e = ibv_post_recv(rs.id->qp, &wr, &bad)) {
        rs.state = kError;
        rs.err = e;
        break;
      }
    }
  }
}

// CM events of a connected socket: the peer's DISCONNECTED, a device removal.
void drain_cm_events(Socket& rs) {
  for (int i = 0; i < 16; ++i) {
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(rs.channel, &ev)) return;
    const auto type = ev->event;
    rdma_ack_cm_event(ev);
    if (type == RDMA_CM_EVENT_DISCONNECTED || type == RDMA_CM_EVENT_DEVICE_REMOVAL ||
        type == RDMA_CM_EVENT_TIMEWAIT_EXIT) {
      if (rs.state & kConnected) {
        rs.state = (type == RDMA_CM_EVENT_DISCONNECTED) ? kDisconnected : kError;
        if (rs.state == kError) rs.err = ECONNRESET;
      }
    }
  }
}

bool can_send(const Socket& rs) {
  return rs.sqe_avail && rs.sbuf_bytes_avail >= kSndLowat && rs.sseq_no != rs.sseq_comp &&
         rs.target_sgl[rs.target_sge].length != 0;
}
bool conn_can_send(const Socket& rs) {
  return can_send(rs) || !(rs.state & kWritable);
}
bool have_rdata(const Socket& rs) {
  return rs.rmsg_head != rs.rmsg_tail;
}
bool conn_have_rdata(const Socket& rs) {
  return have_rdata(rs) || !(rs.state & kReadable);
}
bool conn_can_send_ctrl(const Socket& rs) {
  return ctrl_avail(rs) || !(rs.state & kConnected);
}
bool all_sends_done(const Socket& rs) {
  return (static_cast<int>(rs.ctrl_max_seqno) - static_cast<int>(rs.ctrl_seqno)) +
                 static_cast<int>(rs.sqe_avail) ==
             static_cast<int>(rs.sq_size) ||
         !(rs.state & kConnected);
}

bool is_nonblocking(const Socket& rs, int flags) {
  return (rs.fs_flags & O_NONBLOCK) || (flags & MSG_DONTWAIT);
}

// A peer whose process died sends nothing more — no RS_CTRL_DISCONNECT, no DREQ (a kernel
// would send one for it; softrdma's CM dies with the process) — so a socket that only
// receives would wait forever. After kProbeIdle without a completion, post a zero-length
// RDMA WRITE (no immediate: it consumes no receive WQE and no credit at the peer, rsocket.c
// peers included): a live peer ACKs it, a dead one lets the RC retries run out and the
// completion error ends the socket (ECONNRESET).
void probe_if_idle(Socket& rs) {
  if (!(rs.state & kConnected) || !rs.cq || !rs.sqe_avail) return;
  const auto now = Clock::now();
  if (now - rs.last_activity < kProbeIdle) return;
  rs.last_activity = now;
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = make_msg(Op::kWrite, 0);
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.wr.rdma.remote_addr = rs.remote_sgl.addr;
  wr.wr.rdma.rkey = rs.remote_sgl.key;
  if (ibv_post_send(rs.id->qp, &wr, &bad) == 0) rs.sqe_avail--;
}

// Sleeps (lock released) until the CQ or the CM channel has something, at most `ms`.
void sleep_on_channels(Socket& rs, std::unique_lock<std::mutex>& lk, int ms) {
  probe_if_idle(rs);
  pollfd p[2] = {{rs.cq_channel ? rs.cq_channel->fd : -1, POLLIN, 0}, {rs.channel->fd, POLLIN, 0}};
  ++rs.waiters;
  lk.unlock();
  ::poll(p, 2, ms);
  lk.lock();
  --rs.waiters;
  if (p[0].revents & POLLIN) {
    ibv_cq* cq = nullptr;
    void* ctx = nullptr;
    if (rs.cq_channel && !ibv_get_cq_event(rs.cq_channel, &cq, &ctx)) {
      rs.cq_armed = false;
      if (++rs.unack_cqe >= 64) {
        ibv_ack_cq_events(rs.cq, rs.unack_cqe);
        rs.unack_cqe = 0;
      }
    }
  }
  if (p[1].revents & POLLIN) drain_cm_events(rs);
}

// rs_get_comp: progress until test(rs), spinning briefly, then sleeping on the channels.
// Returns 0 when test holds, -1/EWOULDBLOCK when non-blocking, -1/errno on a lost connection
// that makes test false forever (test functions include "or no longer connected").
template <typename Test>
int get_comp(Socket& rs, std::unique_lock<std::mutex>& lk, bool nonblock, Test test) {
  const auto spin_until = Clock::now() + kSpin;
  for (;;) {
    update_credits(rs);
    poll_cq(rs);
    update_credits(rs);
    if (test(rs)) return 0;
    if (nonblock) {
      probe_if_idle(rs);  // a program that polls with MSG_DONTWAIT never sleeps here
      return set_errno(EWOULDBLOCK);
    }
    if (Clock::now() < spin_until) continue;
    if (!rs.cq_armed) {
      ibv_req_notify_cq(rs.cq, 0);
      rs.cq_armed = true;
      continue;  // poll once more: a completion may have come before the arming
    }
    // Another thread may consume the wake-up this one waits for: then wake up often.
    sleep_on_channels(rs, lk, rs.waiters > 0 ? 5 : kWaitSliceMs);
  }
}

// rsend/riowrite: waits (or, non-blocking, fails with EAGAIN) until a send may be posted.
// Returns 0, or -1 with errno set (ECONNRESET when the connection ended meanwhile).
int wait_for_send_room(Socket& rs, std::unique_lock<std::mutex>& lk, int flags) {
  if (can_send(rs)) return 0;
  if (const int ret = get_comp(rs, lk, is_nonblocking(rs, flags), conn_can_send)) return ret;
  if (!(rs.state & kWritable)) return set_errno(ECONNRESET);
  return 0;
}

// The next transfer's size, bytes: `left` when it fits in `olen`, else `olen`, which doubles
// from kFirstTransfer up to kMaxTransfer per transfer (rsocket.c's olen).
uint32_t next_transfer(uint32_t& olen, size_t left) {
  if (olen >= left) return static_cast<uint32_t>(left);
  const uint32_t xfer = olen;
  if (olen < kMaxTransfer) olen <<= 1;
  return xfer;
}

// ---- connection setup ----

// Waits for the next CM event of the socket's own channel; copies what is needed and acks it.
struct CmResult {
  rdma_cm_event_type type;
  int status;
  std::vector<uint8_t> private_data;
};

int next_cm_event(Socket& rs, std::unique_lock<std::mutex>* lk, bool nonblock, CmResult* out) {
  for (;;) {
    rdma_cm_event* ev = nullptr;
    if (!rdma_get_cm_event(rs.channel, &ev)) {
      out->type = ev->event;
      out->status = ev->status;
      const auto* pd = static_cast<const uint8_t*>(ev->param.conn.private_data);
      if (pd && ev->param.conn.private_data_len)
        out->private_data.assign(pd, pd + ev->param.conn.private_data_len);
      rdma_ack_cm_event(ev);
      return 0;
    }
    if (errno != EAGAIN) return -1;
    if (nonblock) return set_errno(EINPROGRESS);
    const auto left = rs.connect_deadline - Clock::now();
    if (left <= Clock::duration::zero()) return set_errno(ETIMEDOUT);
    pollfd p{rs.channel->fd, POLLIN, 0};
    const int ms = static_cast<int>(std::min<int64_t>(
        kWaitSliceMs, std::chrono::duration_cast<std::chrono::milliseconds>(left).count() + 1));
    if (lk) lk->unlock();
    ::poll(&p, 1, ms);
    if (lk) lk->lock();
  }
}

int connect_error(Socket& rs, int e) {
  rs.state = kConnectError;
  rs.err = e;
  return set_errno(e);
}

int errno_of_event(const CmResult& ev) {
  switch (ev.type) {
    case RDMA_CM_EVENT_REJECTED:
      return ECONNREFUSED;
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
      return ev.status == -ETIMEDOUT ? ETIMEDOUT : EHOSTUNREACH;
    case RDMA_CM_EVENT_CONNECT_ERROR:
      return ECONNRESET;
    default:
      return ECONNREFUSED;
  }
}

// The connect state machine's wait for its next CM event, which must be `want`: 0 with
// *ev filled; -1/EINPROGRESS while a non-blocking connect has none yet; otherwise -1 with the
// connect failed (connect_error: the error event's errno, or next_cm_event's).
int connect_event(Socket& rs, std::unique_lock<std::mutex>* lk, bool nonblock,
                  rdma_cm_event_type want, CmResult* ev) {
  if (next_cm_event(rs, lk, nonblock, ev)) {
    if (errno == EINPROGRESS) return -1;
    return connect_error(rs, errno);
  }
  if (ev->type != want) return connect_error(rs, errno_of_event(*ev));
  return 0;
}

// rs_do_connect: one step, or all steps when blocking. Returns 0 connected, -1/EINPROGRESS
// while a non-blocking connect is under way, -1/errno when it failed.
int do_connect(Socket& rs, std::unique_lock<std::mutex>* lk, bool nonblock) {
  for (int step = 0; step < 8; ++step) {
    switch (rs.state) {
      case kInit:
      case kBound:
        rs.connect_deadline = Clock::now() + kConnectTimeout;
        if (rdma_resolve_addr(rs.id, nullptr, reinterpret_cast<sockaddr*>(&rs.peer), 2000))
          return connect_error(rs, errno);
        rs.state = kResolvingAddr;
        break;
      case kResolvingAddr: {
        CmResult ev;
        if (connect_event(rs, lk, nonblock, RDMA_CM_EVENT_ADDR_RESOLVED, &ev)) return -1;
        if (rdma_resolve_route(rs.id, 2000)) return connect_error(rs, errno);
        rs.state = kResolvingRoute;
        break;
      }
      case kResolvingRoute: {
        CmResult ev;
        if (connect_event(rs, lk, nonblock, RDMA_CM_EVENT_ROUTE_RESOLVED, &ev)) return -1;
        if (create_ep(rs)) return connect_error(rs, errno);
        ConnData cd = format_conn_data(local_buffers(rs));
        rdma_conn_param param{};
        param.private_data = &cd;
        param.private_data_len = sizeof cd;
        param.flow_control = 1;
        param.retry_count = 7;
        param.rnr_retry_count = 7;
        param.responder_resources = 1;
        param.initiator_depth = 1;
        if (rdma_connect(rs.id, &param)) return connect_error(rs, errno);
        rs.state = kConnecting;
        break;
      }
      case kConnecting: {
        CmResult ev;
        if (connect_event(rs, lk, nonblock, RDMA_CM_EVENT_ESTABLISHED, &ev)) return -1;
        PeerBuffers peer{};
        if (!parse_conn_data(ev.private_data.data(), ev.private_data.size(), &peer)) {
          softrdma::cm::log().warn("rsocket {}: the peer's private data is not rsocket version 1",
                                   rs.fd);
          return connect_error(rs, ENOTSUP);
        }
        save_conn_data(rs, peer);
        rs.state = kConnectRdwr;
        return 0;
      }
      case kConnectError:
      case kDisconnected:
      case kError:
        return set_errno(ENOTCONN);
      default:
        return (rs.state & kConnected) ? 0 : set_errno(EINVAL);
    }
  }
  return set_errno(EINPROGRESS);
}

// A connect begun non-blocking finishes in the data calls (as rsocket.c: EAGAIN meanwhile).
int finish_opening(Socket& rs, std::unique_lock<std::mutex>& lk, int flags) {
  if (!(rs.state & kOpening)) return 0;
  if (do_connect(rs, &lk, is_nonblocking(rs, flags))) {
    if (errno == EINPROGRESS) errno = EAGAIN;
    return -1;
  }
  return 0;
}

// ---- data ----

// Update the target before posting: the peer may rewrite the entry as soon as the data lands.
// SGEs the peer wrote are already in this host's order (the writer swaps, as rsocket.c).
int write_data(Socket& rs, ibv_sge* sgl, int nsge, uint32_t length, unsigned flags) {
  rs.sseq_no++;
  rs.sqe_avail--;
  rs.sbuf_bytes_avail -= length;
  volatile Sge& t = rs.target_sgl[rs.target_sge];
  const uint64_t addr = t.addr;
  const uint32_t rkey = t.key;
  t.addr = addr + length;
  t.length = t.length - length;
  if (!t.length && ++rs.target_sge == kSglSize) rs.target_sge = 0;
  return post_write_imm(rs, sgl, nsge, make_msg(Op::kData, length), flags, addr, rkey);
}

// Copies `len` bytes from the gather list (iov, *idx, *off) into dst and advances it.
void gather(const iovec* iov, int* idx, size_t* off, uint8_t* dst, size_t len) {
  while (len) {
    const size_t n = std::min(len, iov[*idx].iov_len - *off);
    std::memcpy(dst, static_cast<const uint8_t*>(iov[*idx].iov_base) + *off, n);
    dst += n;
    len -= n;
    *off += n;
    if (*off == iov[*idx].iov_len) {
      ++*idx;
      *off = 0;
    }
  }
}

int send_iomaps(Socket& rs, std::unique_lock<std::mutex>& lk, int flags);

ssize_t sendv(int fd, const iovec* iov, int iovcnt, int flags) {
  auto rs = lookup(fd);
  if (!rs) return set_errno(EBADF);
  if (iovcnt < 0 || (iovcnt && !iov)) return set_errno(EINVAL);
  size_t len = 0;
  for (int i = 0; i < iovcnt; ++i) len += iov[i].iov_len;
  std::unique_lock lk(rs->mu);
  if (finish_opening(*rs, lk, flags)) return -1;
  if (!(rs->state & kConnected)) {
    if (rs->state & (kDisconnected | kError)) return set_errno(EPIPE);
    return set_errno(ENOTCONN);
  }
  if (!(rs->state & kWritable)) return set_errno(EPIPE);
  if (rs->iomap_pending && send_iomaps(*rs, lk, flags)) return -1;
  int idx = 0;
  size_t off = 0;
  while (idx < iovcnt && iov[idx].iov_len == 0) ++idx;
  size_t left = len;
  uint32_t olen = kFirstTransfer;
  int ret = 0;
  while (left) {
    if ((ret = wait_for_send_room(*rs, lk, flags))) break;
    uint32_t xfer = next_transfer(olen, left);
    xfer = std::min(xfer, rs->sbuf_bytes_avail);
    xfer = std::min<uint32_t>(xfer, static_cast<uint32_t>(rs->target_sgl[rs->target_sge].length));
    if (xfer <= rs->sq_inline && iovcnt == 1) {
      ibv_sge sge{reinterpret_cast<uintptr_t>(iov[0].iov_base) + off, xfer, 0};
      ret = write_data(*rs, &sge, 1, xfer, IBV_SEND_INLINE);
      off += xfer;
    } else if (xfer <= sbuf_left(*rs)) {
      gather(iov, &idx, &off, reinterpret_cast<uint8_t*>(rs->ssgl[0].addr), xfer);
      rs->ssgl[0].length = xfer;
      ret = write_data(*rs, rs->ssgl, 1, xfer, 0);
      if (xfer < sbuf_left(*rs))
        rs->ssgl[0].addr += xfer;
      else
        rs->ssgl[0].addr = reinterpret_cast<uintptr_t>(rs->sbuf);
    } else {
      rs->ssgl[0].length = sbuf_left(*rs);
      gather(iov, &idx, &off, reinterpret_cast<uint8_t*>(rs->ssgl[0].addr), rs->ssgl[0].length);
      rs->ssgl[1].length = xfer - rs->ssgl[0].length;
      gather(iov, &idx, &off, rs->sbuf, rs->ssgl[1].length);
      ret = write_data(*rs, rs->ssgl, 2, xfer, 0);
      rs->ssgl[0].addr = reinterpret_cast<uintptr_t>(rs->sbuf) + rs->ssgl[1].length;
    }
    if (ret) break;
    left -= xfer;
  }
  if (ret && left == len) return -1;
  return static_cast<ssize_t>(len - left);
}

// Copies up to len received bytes into the scatter list; consumes them unless peek.
size_t copy_out(Socket& rs, const iovec* iov, int iovcnt, size_t len, bool peek) {
  uint32_t head = rs.rmsg_head, offset = rs.rbuf_offset;
  size_t done = 0;
  int idx = 0;
  size_t ioff = 0;
  while (done < len && head != rs.rmsg_tail) {
    uint32_t rsize = rs.rmsg[head].data;
    bool whole = true;
    if (len - done < rsize) {
      rsize = static_cast<uint32_t>(len - done);
      whole = false;
    }
    uint32_t copied = 0;
    while (copied < rsize) {
      const uint32_t chunk = std::min(rsize - copied, rs.rbuf_size - offset);
      // scatter chunk from rbuf[offset]
      uint32_t c = 0;
      while (c < chunk) {
        const size_t n = std::min<size_t>(chunk - c, iov[idx].iov_len - ioff);
        std::memcpy(static_cast<uint8_t*>(iov[idx].iov_base) + ioff, &rs.rbuf[offset + c], n);
        c += static_cast<uint32_t>(n);
        ioff += n;
        if (ioff == iov[idx].iov_len && idx + 1 < iovcnt) {
          ++idx;
          ioff = 0;
        }
      }
      copied += chunk;
      offset += chunk;
      if (offset == rs.rbuf_size) offset = 0;
    }
    done += rsize;
    if (!peek) {
      rs.rbuf_bytes_avail += rsize;
      if (whole) {
        rs.rseq_no++;
      } else {
        rs.rmsg[head].data -= rsize;
      }
    }
    if (whole && ++head == rs.rq_size + 1) head = 0;
  }
  if (!peek) {
    rs.rmsg_head = head;
    rs.rbuf_offset = offset;
  }
  return done;
}

ssize_t recvv(int fd, const iovec* iov, int iovcnt, int flags) {
  auto rs = lookup(fd);
  if (!rs) return set_errno(EBADF);
  if (iovcnt < 0 || (iovcnt && !iov)) return set_errno(EINVAL);
  size_t len = 0;
  for (int i = 0; i < iovcnt; ++i) len += iov[i].iov_len;
  std::unique_lock lk(rs->mu);
  if (finish_opening(*rs, lk, flags)) return -1;
  if (!(rs->state & (kConnected | kDisconnected | kError))) return set_errno(ENOTCONN);
  if (len == 0) return 0;
  size_t done = 0;
  int ret = 0;
  do {
    if (!have_rdata(*rs)) {
      ret = get_comp(*rs, lk, is_nonblocking(*rs, flags), conn_have_rdata);
      if (ret) break;
    }
    if (!have_rdata(*rs)) {
      // End of stream: 0 after an orderly disconnect or shutdown, an error after a failure.
      if (done == 0 && (rs->state & kError)) ret = set_errno(rs->err ? rs->err : ECONNRESET);
      break;
    }
    // Skip what an earlier pass of MSG_WAITALL filled.
    std::vector<iovec> rest;
    size_t skip = done;
    for (int i = 0; i < iovcnt; ++i) {
      if (skip >= iov[i].iov_len) {
        skip -= iov[i].iov_len;
        continue;
      }
      rest.push_back({static_cast<uint8_t*>(iov[i].iov_base) + skip, iov[i].iov_len - skip});
      skip = 0;
    }
    const size_t n =
        copy_out(*rs, rest.data(), static_cast<int>(rest.size()), len - done, flags & MSG_PEEK);
    done += n;
    update_credits(*rs);
    if (flags & MSG_PEEK) break;
  } while (done < len && (flags & MSG_WAITALL) && (rs->state & kReadable));
  if (done == 0 && ret) return -1;
  return static_cast<ssize_t>(done);
}

// ---- iomap ----

int write_iomap(Socket& rs, IomapMr& m, ibv_sge* sgl, int nsge, unsigned flags) {
  rs.sseq_no++;
  rs.sqe_avail--;
  rs.sbuf_bytes_avail -= sizeof(IomapEntry);
  const uint64_t addr = rs.remote_iomap.addr + m.index * sizeof(IomapEntry);
  return post_write_imm(rs, sgl, nsge, make_msg(Op::kIomapSgl, static_cast<uint32_t>(m.index)),
                        flags, addr, rs.remote_iomap.key);
}

int send_iomaps(Socket& rs, std::unique_lock<std::mutex>& lk, int flags) {
  while (!rs.iomap_queue.empty()) {
    if (!can_send(rs)) {
      if (get_comp(rs, lk, is_nonblocking(rs, flags), conn_can_send)) return -1;
      if (!(rs.state & kWritable)) return set_errno(ECONNRESET);
    }
    IomapMr& m = *rs.iomap_queue.front();
    IomapEntry e{
        m.offset,
        {reinterpret_cast<uintptr_t>(m.mr->addr), m.mr->rkey, static_cast<uint32_t>(m.mr->length)}};
    if (rs.swap)
      e = {bswap_64(e.offset), {bswap_64(e.sge.addr), bswap_32(e.sge.key), bswap_32(e.sge.length)}};
    int ret;
    if (rs.sq_inline >= sizeof e) {
      ibv_sge sge{reinterpret_cast<uintptr_t>(&e), sizeof e, 0};
      ret = write_iomap(rs, m, &sge, 1, IBV_SEND_INLINE);
    } else {
      // Through the send buffer (two pieces when it wraps).
      const uint32_t first = std::min<uint32_t>(sizeof e, sbuf_left(rs));
      std::memcpy(reinterpret_cast<void*>(rs.ssgl[0].addr), &e, first);
      rs.ssgl[0].length = first;
      rs.ssgl[1].length = sizeof e - first;
      std::memcpy(rs.sbuf, reinterpret_cast<uint8_t*>(&e) + first, rs.ssgl[1].length);
      ret = write_iomap(rs, m, rs.ssgl, rs.ssgl[1].length ? 2 : 1, 0);
      if (rs.ssgl[1].length)
        rs.ssgl[0].addr = reinterpret_cast<uintptr_t>(rs.sbuf) + rs.ssgl[1].length;
      else if (first < sbuf_left(rs))
        rs.ssgl[0].addr += first;
      else
        rs.ssgl[0].addr = reinterpret_cast<uintptr_t>(rs.sbuf);
    }
    rs.iomap_queue.pop_front();
    if (ret) return -1;
  }
  rs.iomap_pending = false;
  return 0;
}

// ---- poll ----

// rs_poll_rs: the events that hold now (progressing the socket without sleeping).
short poll_socket(Socket& rs, short events) {
  std::unique_lock lk(rs.mu);
  if (rs.state & kOpening) {
    if (do_connect(rs, &lk, true) && errno == EINPROGRESS) return 0;
  }
  if ((rs.state & kConnected) || rs.state == kDisconnected || (rs.state & kError)) {
    if (rs.cq) {
      update_credits(rs);
      poll_cq(rs);
      update_credits(rs);
      probe_if_idle(rs);  // rpoll with timeout 0 in a loop never sleeps either
    }
    // No system call here (this runs on every rpoll): the CM channel is read when rpoll's
    // sleep finds it readable (do_rpoll) or a blocking call's sleep does.
    short rev = 0;
    if ((events & POLLIN) && conn_have_rdata(rs)) rev |= POLLIN;
    if ((events & POLLOUT) && rs.cq && can_send(rs)) rev |= POLLOUT;
    // Hang-up once the data the peer sent before its disconnect has been read: rsocket.c
    // reports POLLHUP at once, and a program that treats POLLHUP as an error (rstream's
    // do_poll) then loses the tail of a transfer whose last bytes arrived with the peer's
    // RS_CTRL_DISCONNECT (rstream -T a: its 1m_lat step). TCP, too, reports the peer's FIN
    // as readable, not as a hang-up.
    if (!(rs.state & kConnected) && !have_rdata(rs))
      rev |= (rs.state == kDisconnected) ? POLLHUP : POLLERR;
    return rev;
  }
  if (rs.state == kListening) {
    pollfd p{rs.channel->fd, static_cast<short>(events & POLLIN), 0};
    ::poll(&p, 1, 0);
    return p.revents;
  }
  if (rs.state == kConnectError) return (events & (POLLIN | POLLOUT)) | POLLERR;
  return 0;
}

// The descriptors to sleep on for a socket, with the CQ armed.
void arm_socket(Socket& rs, std::vector<pollfd>* out) {
  std::lock_guard lk(rs.mu);
  out->push_back({rs.channel->fd, POLLIN, 0});
  if (rs.cq && (rs.state & kConnected)) {
    probe_if_idle(rs);
    if (!rs.cq_armed) {
      ibv_req_notify_cq(rs.cq, 0);
      rs.cq_armed = true;
    }
    out->push_back({rs.cq_channel->fd, POLLIN, 0});
  }
}

// CM events of a connected socket (a connecting one reads its own in do_connect, a listener's
// wait for raccept).
void consume_cm_events(Socket& rs) {
  std::lock_guard lk(rs.mu);
  if (rs.state & kConnected) drain_cm_events(rs);
}

void consume_cq_event(Socket& rs) {
  std::lock_guard lk(rs.mu);
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  if (rs.cq_channel && !ibv_get_cq_event(rs.cq_channel, &cq, &ctx)) {
    rs.cq_armed = false;
    if (++rs.unack_cqe >= 64) {
      ibv_ack_cq_events(rs.cq, rs.unack_cqe);
      rs.unack_cqe = 0;
    }
  }
}

int do_rpoll(pollfd* fds, nfds_t nfds, int timeout) {
  if (nfds && !fds) return set_errno(EFAULT);
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::milliseconds(timeout < 0 ? 0 : timeout);
  std::vector<std::shared_ptr<Socket>> socks(nfds);
  for (nfds_t i = 0; i < nfds; ++i) socks[i] = fds[i].fd >= 0 ? lookup(fds[i].fd) : nullptr;
  for (;;) {
    // Check: rsockets by progressing them, others with a zero-timeout poll(2).
    int ready = 0;
    std::vector<pollfd> plain;
    std::vector<nfds_t> plain_at;
    for (nfds_t i = 0; i < nfds; ++i) {
      fds[i].revents = 0;
      if (socks[i]) {
        fds[i].revents = poll_socket(*socks[i], fds[i].events);
      } else {
        plain.push_back(fds[i]);
        plain_at.push_back(i);
      }
    }
    if (!plain.empty() && ::poll(plain.data(), plain.size(), 0) < 0) return -1;
    for (size_t k = 0; k < plain.size(); ++k) fds[plain_at[k]].revents = plain[k].revents;
    for (nfds_t i = 0; i < nfds; ++i) ready += fds[i].revents != 0;
    if (ready || timeout == 0) return ready;
    const auto now = Clock::now();
    if (timeout > 0 && now >= deadline) return 0;
    if (now - start < kSpin) continue;

    // Sleep: the plain descriptors, and each rsocket's channels with its CQ armed.
    std::vector<pollfd> sleep = plain;
    std::vector<std::pair<Socket*, size_t>> owners;  // (socket, first index in sleep)
    for (nfds_t i = 0; i < nfds; ++i) {
      if (!socks[i]) continue;
      owners.push_back({socks[i].get(), sleep.size()});
      arm_socket(*socks[i], &sleep);
    }
    // Re-check after arming: a completion may have come in between.
    bool now_ready = false;
    for (nfds_t i = 0; i < nfds && !now_ready; ++i)
      if (socks[i] && poll_socket(*socks[i], fds[i].events)) now_ready = true;
    if (now_ready) continue;
    int ms = kWaitSliceMs;
    if (timeout > 0)
      ms = static_cast<int>(std::min<int64_t>(
          ms,
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count() +
              1));
    if (::poll(sleep.data(), sleep.size(), ms) < 0) return -1;
    for (size_t o = 0; o < owners.size(); ++o) {
      const size_t end = o + 1 < owners.size() ? owners[o + 1].second : sleep.size();
      if (sleep[owners[o].second].revents & POLLIN) consume_cm_events(*owners[o].first);
      for (size_t k = owners[o].second + 1; k < end; ++k)
        if (sleep[k].revents & POLLIN) consume_cq_event(*owners[o].first);
    }
  }
}

int shutdown_socket(Socket& rs, std::unique_lock<std::mutex>& lk, int how) {
  if (!(rs.state & kConnected)) {
    if (rs.state & (kDisconnected | kError)) return 0;
    return set_errno(ENOTCONN);
  }
  uint32_t ctrl;
  if (how == SHUT_RDWR) {
    ctrl = static_cast<uint32_t>(Ctrl::kDisconnect);
    rs.state &= ~(kReadable | kWritable);
  } else if (how == SHUT_WR) {
    rs.state &= ~kWritable;
    ctrl = static_cast<uint32_t>((rs.state & kReadable) ? Ctrl::kShutdown : Ctrl::kDisconnect);
  } else {
    rs.state &= ~kReadable;
    if (rs.state & kWritable) return 0;
    ctrl = static_cast<uint32_t>(Ctrl::kDisconnect);
  }
  // Blocking from here, bounded: a dead peer errors the QP (retry_count), which ends it.
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  auto bounded = [&](auto test) {
    return [&, test](const Socket& s) { return test(s) || Clock::now() > deadline; };
  };
  if (!ctrl_avail(rs) && get_comp(rs, lk, false, bounded(conn_can_send_ctrl))) return -1;
  if ((rs.state & kConnected) && ctrl_avail(rs)) {
    rs.ctrl_seqno++;
    if (post_msg(rs, make_msg(Op::kCtrl, ctrl))) return -1;
  }
  if (rs.state & kConnected) get_comp(rs, lk, false, bounded(all_sends_done));
  return 0;
}

bool valid_addr(const sockaddr* addr, socklen_t len) {
  return addr && len >= sizeof(sockaddr_in) && addr->sa_family == AF_INET;
}

}  // namespace
}  // namespace softrdma::rsocket

using namespace softrdma::rsocket;

extern "C" {

/// rsocket(3): AF_INET stream sockets. Errors: EAFNOSUPPORT for another family (rdma-core
/// also takes AF_INET6/AF_IB; softrdma's CM is IPv4 only), ESOCKTNOSUPPORT for SOCK_DGRAM
/// (datagram rsockets are not implemented), EPROTONOSUPPORT for another protocol, ENOTSUP
/// for another type; then the CM's errors.
int rsocket(int domain, int type, int protocol) {
  const int stype = type & ~(SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (domain != AF_INET) return set_errno(EAFNOSUPPORT);
  if (stype == SOCK_DGRAM) {
    softrdma::cm::log().debug("rsocket: datagram rsockets are not supported");
    return set_errno(ESOCKTNOSUPPORT);
  }
  if (stype != SOCK_STREAM) return set_errno(ENOTSUP);
  if (protocol && protocol != IPPROTO_TCP) return set_errno(EPROTONOSUPPORT);
  auto rs = new_socket(nullptr);
  if (!rs) return -1;
  if (rdma_create_id(rs->channel, &rs->id, rs.get(), RDMA_PS_TCP)) return -1;
  rs->fs_flags = (type & SOCK_NONBLOCK) ? O_NONBLOCK : 0;
  rs->fd_flags = (type & SOCK_CLOEXEC) ? FD_CLOEXEC : 0;
  insert(rs);
  return rs->fd;
}

/// rbind(3): binds to an IPv4 address (its softrdma device). EBADF, EAFNOSUPPORT for another
/// family, EINVAL for a null address or a socket already bound/connected; then the CM's errors.
int rbind(int socket, const sockaddr* addr, socklen_t addrlen) {
  auto rs = lookup(socket);
  if (!rs) return set_errno(EBADF);
  if (!valid_addr(addr, addrlen)) return set_errno(addr ? EAFNOSUPPORT : EINVAL);
  std::lock_guard lk(rs->mu);
  if (rs->state != kInit) return set_errno(EINVAL);
  if (rdma_bind_addr(rs->id, const_cast<sockaddr*>(addr))) return -1;
  rs->state = kBound;
  return 0;
}

/// rlisten(3): listens (rdma_listen). EBADF; EINVAL once connecting or connected.
int rlisten(int socket, int backlog) {
  auto rs = lookup(socket);
  if (!rs) return set_errno(EBADF);
  std::lock_guard lk(rs->mu);
  if (rs->state == kListening) return 0;
  if (rs->state != kBound && rs->state != kInit) return set_errno(EINVAL);
  if (rdma_listen(rs->id, backlog)) return -1;
  rs->state = kListening;
  return 0;
}

/// raccept(3): takes the next connection request, answers it with this side's rs_conn_data and
/// returns the new rsocket (its QP ready to send). Blocks unless O_NONBLOCK (then EAGAIN);
/// EINVAL when not listening; a request without rsocket private data is rejected and skipped.
int raccept(int socket, sockaddr* addr, socklen_t* addrlen) {
  auto rs = lookup(socket);
  if (!rs) return set_errno(EBADF);
  std::unique_lock lk(rs->mu);
  if (rs->state != kListening) return set_errno(EINVAL);
  for (;;) {
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(rs->channel, &ev)) {
      if (errno != EAGAIN) return -1;
      if (rs->fs_flags & O_NONBLOCK) return set_errno(EAGAIN);
      pollfd p{rs->channel->fd, POLLIN, 0};
      lk.unlock();
      const int r = ::poll(&p, 1, 1000);
      lk.lock();
      if (r < 0 && errno == EINTR) return -1;
      if (rs->state != kListening) return set_errno(EINVAL);
      continue;
    }
    if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
      rdma_ack_cm_event(ev);
      continue;
    }
    rdma_cm_id* cid = ev->id;
    PeerBuffers peer{};
    const bool ok =
        parse_conn_data(ev->param.conn.private_data, ev->param.conn.private_data_len, &peer);
    rdma_conn_param req = ev->param.conn;
    rdma_ack_cm_event(ev);
    if (!ok) {
      softrdma::cm::log().info("rsocket {}: refusing a connection without rsocket private data",
                               socket);
      rdma_reject(cid, nullptr, 0);
      rdma_destroy_id(cid);
      continue;
    }
    auto nrs = new_socket(rs.get());
    if (!nrs) {
      rdma_reject(cid, nullptr, 0);
      rdma_destroy_id(cid);
      return -1;
    }
    nrs->id = cid;
    cid->context = nrs.get();
    if (rdma_migrate_id(cid, nrs->channel) || create_ep(*nrs)) {
      const int e = errno;
      rdma_reject(cid, nullptr, 0);
      return set_errno(e);  // nrs's destructor destroys the ID
    }
    save_conn_data(*nrs, peer);
    ConnData cd = format_conn_data(local_buffers(*nrs));
    rdma_conn_param param{};
    param.private_data = &cd;
    param.private_data_len = sizeof cd;
    param.responder_resources = std::min<uint8_t>(req.initiator_depth, 1);
    param.initiator_depth = std::min<uint8_t>(req.responder_resources, 1);
    param.flow_control = 1;
    param.retry_count = 7;
    param.rnr_retry_count = 7;
    if (rdma_accept(cid, &param)) return -1;
    // The QP is ready to send now; ESTABLISHED is read with the socket's other CM events.
    nrs->state = kConnectRdwr;
    if (const sockaddr* pa = rdma_get_peer_addr(cid)) std::memcpy(&nrs->peer, pa, sizeof nrs->peer);
    insert(nrs);
    if (addr && addrlen) {
      const socklen_t n = std::min<socklen_t>(*addrlen, sizeof(sockaddr_in));
      std::memcpy(addr, &nrs->peer, n);
      *addrlen = sizeof(sockaddr_in);
    }
    return nrs->fd;
  }
}

/// rconnect(3): resolves, creates the QP and buffers, connects with rs_conn_data. Blocking: 0
/// or ECONNREFUSED / ETIMEDOUT / EHOSTUNREACH (within 30 s); non-blocking: EINPROGRESS, then
/// EALREADY while under way; EISCONN when connected.
int rconnect(int socket, const sockaddr* addr, socklen_t addrlen) {
  auto rs = lookup(socket);
  if (!rs) return set_errno(EBADF);
  std::unique_lock lk(rs->mu);
  if (rs->state & kConnected) return set_errno(EISCONN);
  if (rs->state & kOpening) {
    if (rs->fs_flags & O_NONBLOCK) {
      if (do_connect(*rs, &lk, true) && errno == EINPROGRESS) return set_errno(EALREADY);
      return rs->state & kConnected ? 0 : -1;
    }
    return do_connect(*rs, &lk, false);
  }
  if (rs->state == kListening) return set_errno(EINVAL);
  if (rs->state == kConnectError || rs->state == kDisconnected || rs->state == kError)
    return set_errno(rs->err ? rs->err : ECONNREFUSED);
  if (!valid_addr(addr, addrlen)) return set_errno(addr ? EAFNOSUPPORT : EINVAL);
  std::memcpy(&rs->peer, addr, sizeof rs->peer);
  return do_connect(*rs, &lk, rs->fs_flags & O_NONBLOCK);
}

/// rshutdown(3): SHUT_WR sends RS_CTRL_SHUTDOWN (the peer reads end of file), SHUT_RDWR
/// RS_CTRL_DISCONNECT, then waits (at most 10 s) for the sends to complete. EBADF, EINVAL for
/// another `how`, ENOTCONN when never connected.
int rshutdown(int socket, int how) {
  auto rs = lookup(socket);
  if (!rs) return set_errno(EBADF);
  if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) return set_errno(EINVAL);
  std::unique_lock lk(rs->mu);
  const int ret = shutdown_socket(*rs, lk, how);
  if (rs->state & kDisconnected) rdma_disconnect(rs->id);
  return ret;
}

/// rclose(3): shuts down (SHUT_RDWR) a connected socket, disconnects and frees it once no
/// call on it is in flight. EBADF for a descriptor that is not an rsocket.
int rclose(int socket) {
  std::shared_ptr<Socket> rs;
  {
    std::lock_guard lk(g_table_mu);
    auto it = table().find(socket);
    if (it == table().end()) return set_errno(EBADF);
    rs = std::move(it->second);
    table().erase(it);
  }
  std::unique_lock lk(rs->mu);
  if (rs->state & kConnected) shutdown_socket(*rs, lk, SHUT_RDWR);
  if (rs->id && rs->id->qp) rdma_disconnect(rs->id);
  rs->state = kDisconnected;
  return 0;  // the last reference (this one, or a call still in flight) frees it
}

/// rrecv(3) and the forms below: bytes copied from the receive buffer (0 at end of stream);
/// MSG_PEEK, MSG_WAITALL, MSG_DONTWAIT. EBADF, ENOTCONN, EAGAIN, ECONNRESET/EIO on a lost
/// connection with nothing left to read.
ssize_t rrecv(int socket, void* buf, size_t len, int flags) {
  iovec v{buf, len};
  return recvv(socket, &v, 1, flags);
}
ssize_t rrecvfrom(int socket, void* buf, size_t len, int flags, sockaddr* src_addr,
                  socklen_t* addrlen) {
  const ssize_t r = rrecv(socket, buf, len, flags);
  if (r >= 0 && src_addr && addrlen) rgetpeername(socket, src_addr, addrlen);
  return r;
}
ssize_t rrecvmsg(int socket, msghdr* msg, int flags) {
  if (!msg) return set_errno(EFAULT);
  if (msg->msg_control && msg->msg_controllen) return set_errno(ENOTSUP);
  msg->msg_flags = 0;
  return recvv(socket, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags);
}
ssize_t rread(int socket, void* buf, size_t count) {
  return rrecv(socket, buf, count, 0);
}
ssize_t rreadv(int socket, const iovec* iov, int iovcnt) {
  return recvv(socket, iov, iovcnt, 0);
}

/// rsend(3) and the forms below: bytes queued as RDMA WRITE WITH IMMEDIATE (RS_OP_DATA);
/// blocks for credits unless non-blocking (EAGAIN when nothing was sent). EBADF, ENOTCONN,
/// EPIPE after SHUT_WR or a disconnect, ECONNRESET when the connection fails meanwhile.
ssize_t rsend(int socket, const void* buf, size_t len, int flags) {
  iovec v{const_cast<void*>(buf), len};
  return sendv(socket, &v, 1, flags);
}
ssize_t rsendto(int socket, const void* buf, size_t len, int flags, const sockaddr* dest_addr,
                socklen_t) {
  if (dest_addr) return set_errno(EISCONN);
  return rsend(socket, buf, len, flags);
}
ssize_t rsendmsg(int socket, const msghdr* msg, int flags) {
  if (!msg) return set_errno(EFAULT);
  if (msg->msg_control && msg->msg_controllen) return set_errno(ENOTSUP);
  return sendv(socket, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags);
}
ssize_t rwrite(int socket, const void* buf, size_t count) {
  return rsend(socket, buf, count, 0);
}
ssize_t rwritev(int socket, const iovec* iov, int iovcnt) {
  return sendv(socket, iov, iovcnt, 0);
}

/// rpoll(3): poll(2) over rsockets and ordinary descriptors; timeout in ms (-1: none).
int rpoll(pollfd* fds, nfds_t nfds, int timeout) {
  return do_rpoll(fds, nfds, timeout);
}

/// rselect(3): select(2) through rpoll. EINVAL for nfds outside 0..FD_SETSIZE or a negative
/// timeout.
int rselect(int nfds, fd_set* readfds, fd_set* writefds, fd_set* exceptfds, timeval* timeout) {
  if (nfds < 0 || nfds > FD_SETSIZE) return set_errno(EINVAL);
  std::vector<pollfd> p;
  for (int fd = 0; fd < nfds; ++fd) {
    short ev = 0;
    if (readfds && FD_ISSET(fd, readfds)) ev |= POLLIN;
    if (writefds && FD_ISSET(fd, writefds)) ev |= POLLOUT;
    if (exceptfds && FD_ISSET(fd, exceptfds)) ev |= POLLPRI;
    if (ev) p.push_back({fd, ev, 0});
  }
  int to = -1;
  if (timeout) {
    if (timeout->tv_sec < 0 || timeout->tv_usec < 0) return set_errno(EINVAL);
    to = static_cast<int>(timeout->tv_sec * 1000 + (timeout->tv_usec + 999) / 1000);
  }
  const int r = do_rpoll(p.data(), p.size(), to);
  if (r < 0) return r;
  if (readfds) FD_ZERO(readfds);
  if (writefds) FD_ZERO(writefds);
  if (exceptfds) FD_ZERO(exceptfds);
  int count = 0;
  for (const pollfd& q : p) {
    if (readfds && (q.revents & (POLLIN | POLLHUP | POLLERR))) {
      FD_SET(q.fd, readfds);
      ++count;
    }
    if (writefds && (q.revents & (POLLOUT | POLLERR))) {
      FD_SET(q.fd, writefds);
      ++count;
    }
    if (exceptfds && (q.revents & POLLPRI)) {
      FD_SET(q.fd, exceptfds);
      ++count;
    }
  }
  return count;
}

/// rgetpeername(3): the peer's IPv4 address. EBADF, EFAULT, ENOTCONN.
int rgetpeername(int socket, sockaddr* addr, socklen_t* addrlen) {
  auto rs = lookup(socket);
  if (!rs) return set_errno(EBADF);
  if (!addr || !addrlen) return set_errno(EFAULT);
  std::lock_guard lk(rs->mu);
  if (!(rs->state & (kConnected | kDisconnected))) return set_errno(ENOTCONN);
  std::memcpy(addr, &rs->peer, std::min<socklen_t>(*addrlen, sizeof rs->peer));
  *addrlen = sizeof rs->peer;
  return 0;
}

/// rgetsockname(3): the bound or connected local IPv4 address. EBADF, EFAULT.
int rgetsockname(int socket, sockaddr* addr, socklen_t* addrlen) {
  auto rs = lookup(socket);
  if (!rs) return set_errno(EBADF);
  if (!addr || !addrlen) return set_errno(EFAULT);
  std::lock_guard lk(rs->mu);
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  if (const sockaddr* a = rdma_get_local_addr(rs->id); a && a->sa_family == AF_INET)
    std::memcpy(&sin, a, sizeof sin);
  std::memcpy(addr, &sin, std::min<socklen_t>(*addrlen, sizeof sin));
  *addrlen = sizeof sin;
  return 0;
}

/// rsetsockopt(3): the options rsocket(7) lists (docs/rdma-cm.md, "rsockets"). EBADF, EINVAL
/// (short value, SOL_RDMA after connecting), ENOTSUP for others.
int rsetsockopt(int socket, int level, int optname, const void* optval, socklen_t optlen) {
  auto rs = lookup(socket);
  if (!rs) return set_errno(EBADF);
  if (!optval || optlen < static_cast<socklen_t>(sizeof(int))) return set_errno(EINVAL);
  std::lock_guard lk(rs->mu);
  const int v = *static_cast<const int*>(optval);
  uint64_t* opts = nullptr;
  bool on = false;
  switch (level) {
    case SOL_SOCKET:
      opts = &rs->so_opts;
      switch (optname) {
        case SO_REUSEADDR:
          rdma_set_option(rs->id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR,
                          const_cast<void*>(optval), optlen);
          on = v;
          break;
        case SO_RCVBUF:
          if (!rs->rbuf)
            rs->rbuf_size = std::max<uint32_t>(static_cast<uint32_t>(v) << 1, kSndLowat * 2);
          break;
        case SO_SNDBUF:
          if (!rs->sbuf) rs->sbuf_size = static_cast<uint32_t>(v) << 1;
          if (rs->sbuf_size < kSndLowat) rs->sbuf_size = kSndLowat << 1;
          break;
        case SO_LINGER:
          if (optlen < static_cast<socklen_t>(sizeof(linger))) return set_errno(EINVAL);
          on = !static_cast<const linger*>(optval)->l_onoff;  // inverted: default is on
          break;
        case SO_KEEPALIVE:
        case SO_OOBINLINE:
          on = v;
          break;
        default:
          return set_errno(ENOTSUP);
      }
      break;
    case IPPROTO_IP:
      if (optname != IP_TOS) return set_errno(ENOTSUP);
      rs->ip_tos = v;
      {
        uint8_t tos = static_cast<uint8_t>(v);
        return rdma_set_option(rs->id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof tos);
      }
    case IPPROTO_TCP:
      opts = &rs->tcp_opts;
      switch (optname) {
        case TCP_KEEPCNT:
        case TCP_KEEPINTVL:
        case TCP_MAXSEG:
        case TCP_CONGESTION:
          return 0;  // not applicable on a reliable connection
        case TCP_KEEPIDLE:
          if (v <= 0) return set_errno(EINVAL);
          rs->keepalive_time = static_cast<unsigned>(v);
          return 0;
        case TCP_NODELAY:
          on = v;
          break;
        default:
          return set_errno(ENOTSUP);
      }
      break;
    case SOL_RDMA:
      if (rs->state >= kOpening) return set_errno(EINVAL);
      switch (optname) {
        case RDMA_SQSIZE:
          rs->sq_size = std::min<uint32_t>(static_cast<uint32_t>(v), kQpMaxSize);
          return 0;
        case RDMA_RQSIZE:
          rs->rq_size = std::min<uint32_t>(static_cast<uint32_t>(v), kQpMaxSize);
          return 0;
        case RDMA_INLINE:
          rs->sq_inline = std::min<uint32_t>(static_cast<uint32_t>(v), kQpMaxSize);
          return 0;
        case RDMA_IOMAPSIZE:
          if (v < 0) return set_errno(EINVAL);
          rs->target_iomap_size = scale_decode(scale_encode(v, 8), 8);
          return 0;
        default:
          return set_errno(ENOTSUP);  // RDMA_ROUTE: IB paths, not on RoCE here
      }
    default:
      return set_errno(ENOTSUP);
  }
  if (opts && optname < 64) {
    if (on)
      *opts |= 1ull << optname;
    else
      *opts &= ~(1ull << optname);
  }
  return 0;
}

/// rgetsockopt(3): as rsetsockopt, plus SO_ERROR (read and cleared) and SO_TYPE.
int rgetsockopt(int socket, int level, int optname, void* optval, socklen_t* optlen) {
  auto rs = lookup(socket);
  if (!rs) return set_errno(EBADF);
  if (!optval || !optlen) return set_errno(EFAULT);
  std::lock_guard lk(rs->mu);
  auto put = [&](int v) {
    if (*optlen < static_cast<socklen_t>(sizeof(int))) return set_errno(EINVAL);
    *static_cast<int*>(optval) = v;
    *optlen = sizeof(int);
    return 0;
  };
  switch (level) {
    case SOL_SOCKET:
      switch (optname) {
        case SO_REUSEADDR:
        case SO_KEEPALIVE:
        case SO_OOBINLINE:
          return put(!!(rs->so_opts & (1ull << optname)));
        case SO_RCVBUF:
          return put(static_cast<int>(rs->rbuf_size));
        case SO_SNDBUF:
          return put(static_cast<int>(rs->sbuf_size));
        case SO_LINGER: {
          if (*optlen < static_cast<socklen_t>(sizeof(linger))) return set_errno(EINVAL);
          auto* l = static_cast<linger*>(optval);
          l->l_onoff = !(rs->so_opts & (1ull << SO_LINGER));
          l->l_linger = 0;
          *optlen = sizeof(linger);
          return 0;
        }
        case SO_ERROR: {
          const int e = rs->err;
          rs->err = 0;
          return put(e);
        }
        case SO_TYPE:
          return put(SOCK_STREAM);
        default:
          return set_errno(ENOTSUP);
      }
    case IPPROTO_IP:
      if (optname == IP_TOS) return put(rs->ip_tos);
      return set_errno(ENOTSUP);
    case IPPROTO_TCP:
      switch (optname) {
        case TCP_NODELAY:
          return put(!!(rs->tcp_opts & (1ull << TCP_NODELAY)));
        case TCP_KEEPIDLE:
          return put(static_cast<int>(rs->keepalive_time));
        case TCP_KEEPCNT:
        case TCP_KEEPINTVL:
          return put(1);
        case TCP_MAXSEG:
          return put(4096);
        default:
          return set_errno(ENOTSUP);
      }
    case SOL_RDMA:
      switch (optname) {
        case RDMA_SQSIZE:
          return put(static_cast<int>(rs->sq_size));
        case RDMA_RQSIZE:
          return put(static_cast<int>(rs->rq_size));
        case RDMA_INLINE:
          return put(static_cast<int>(rs->sq_inline));
        case RDMA_IOMAPSIZE:
          return put(rs->target_iomap_size);
        default:
          return set_errno(ENOTSUP);
      }
    default:
      return set_errno(ENOTSUP);
  }
}

/// rfcntl(3): F_GETFL / F_SETFL (O_NONBLOCK), F_GETFD / F_SETFD. ENOTSUP for other commands.
int rfcntl(int socket, int cmd, ...) {
  auto rs = lookup(socket);
  if (!rs) return set_errno(EBADF);
  va_list ap;
  va_start(ap, cmd);
  int ret = 0;
  std::lock_guard lk(rs->mu);
  switch (cmd) {
    case F_GETFL:
      ret = rs->fs_flags | O_RDWR;
      break;
    case F_SETFL:
      rs->fs_flags = va_arg(ap, int) & ~O_ACCMODE;
      break;
    case F_GETFD:
      ret = rs->fd_flags;
      break;
    case F_SETFD:
      rs->fd_flags = va_arg(ap, int);
      break;
    default:
      ret = set_errno(ENOTSUP);
      break;
  }
  va_end(ap);
  return ret;
}

/// riomap(3): registers [buf, buf+len) at `offset` (-1: the buffer's address). PROT_WRITE:
/// the peer may riowrite into it; it is announced (RS_OP_IOMAP_SGL) with the next send. ENOMEM
/// when the peer's iomap table (RDMA_IOMAPSIZE) is full, EINVAL for other prot/flags.
off_t riomap(int socket, void* buf, size_t len, int prot, int flags, off_t offset) {
  auto rs = lookup(socket);
  if (!rs) return set_errno(EBADF);
  std::lock_guard lk(rs->mu);
  if (!rs->id || !rs->id->pd || !buf || !len || flags || (prot & ~(PROT_WRITE | PROT_NONE)))
    return set_errno(EINVAL);
  IomapMr* m = nullptr;
  int access = IBV_ACCESS_LOCAL_WRITE;
  if (prot & PROT_WRITE) {
    if (rs->remote_iomappings.empty()) {
      rs->remote_iomappings.resize(rs->remote_iomap.length);
      for (size_t i = 0; i < rs->remote_iomappings.size(); ++i)
        rs->remote_iomappings[i].index = static_cast<int>(i);
    }
    for (auto& r : rs->remote_iomappings)
      if (!r.mr) {
        m = &r;
        break;
      }
    if (!m) return set_errno(ENOMEM);  // the peer's iomap table is full (or it has none)
    access |= IBV_ACCESS_REMOTE_WRITE;
  } else {
    m = &rs->local_maps.emplace_back();
  }
  m->mr = ibv_reg_mr(rs->id->pd, buf, len, access);
  if (!m->mr) {
    if (m->index < 0) rs->local_maps.pop_back();
    return -1;
  }
  if (offset == -1) offset = static_cast<off_t>(reinterpret_cast<uintptr_t>(buf));
  m->offset = static_cast<uint64_t>(offset);
  if (m->index >= 0) {
    rs->iomap_queue.push_back(m);
    rs->iomap_pending = true;
  }
  return offset;
}

/// riounmap(3): unregisters a window riomap registered. EINVAL if there is none.
int riounmap(int socket, void* buf, size_t len) {
  auto rs = lookup(socket);
  if (!rs) return set_errno(EBADF);
  std::lock_guard lk(rs->mu);
  for (auto& r : rs->remote_iomappings)
    if (r.mr && r.mr->addr == buf && r.mr->length == len) {
      rs->iomap_queue.remove(&r);
      ibv_dereg_mr(r.mr);
      r.mr = nullptr;
      return 0;
    }
  for (auto it = rs->local_maps.begin(); it != rs->local_maps.end(); ++it)
    if (it->mr->addr == buf && it->mr->length == len) {
      ibv_dereg_mr(it->mr);
      rs->local_maps.erase(it);
      return 0;
    }
  return set_errno(EINVAL);
}

/// riowrite(3): RDMA WRITE of `count` bytes at the peer's iomap offset, no message at the
/// peer; stops at the end of the windows (returns what was written). (size_t)-1 and errno as
/// rsend.
size_t riowrite(int socket, const void* buf, size_t count, off_t offset, int flags) {
  auto rs = lookup(socket);
  if (!rs) return static_cast<size_t>(set_errno(EBADF));
  std::unique_lock lk(rs->mu);
  if (!(rs->state & kConnected)) return static_cast<size_t>(set_errno(ENOTCONN));
  if (rs->iomap_pending && send_iomaps(*rs, lk, flags)) return static_cast<size_t>(-1);
  const auto* p = static_cast<const uint8_t*>(buf);
  size_t left = count;
  uint32_t olen = kFirstTransfer;
  int ret = 0;
  const IomapEntry* iom = nullptr;
  IomapEntry cur{};
  while (left) {
    if (!iom || static_cast<uint64_t>(offset) >= cur.offset + cur.sge.length) {
      iom = nullptr;
      for (int i = 0; i < rs->target_iomap_size; ++i) {
        const IomapEntry e = rs->target_iomap[i];  // written in this host's order
        if (static_cast<uint64_t>(offset) >= e.offset &&
            static_cast<uint64_t>(offset) < e.offset + e.sge.length) {
          cur = e;
          iom = &rs->target_iomap[i];
          break;
        }
      }
      if (!iom) break;  // no window at this offset: what was written is returned
    }
    if ((ret = wait_for_send_room(*rs, lk, flags))) break;
    uint32_t xfer = next_transfer(olen, left);
    xfer = std::min(xfer, rs->sbuf_bytes_avail);
    xfer = static_cast<uint32_t>(
        std::min<uint64_t>(xfer, cur.offset + cur.sge.length - static_cast<uint64_t>(offset)));
    const uint64_t raddr = cur.sge.addr + static_cast<uint64_t>(offset) - cur.offset;
    rs->sqe_avail--;
    rs->sbuf_bytes_avail -= xfer;
    ibv_send_wr wr{}, *bad = nullptr;
    ibv_sge sge[2]{};
    wr.wr_id = make_msg(Op::kWrite, xfer);
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = cur.sge.key;
    wr.sg_list = sge;
    if (xfer <= rs->sq_inline) {
      sge[0] = {reinterpret_cast<uintptr_t>(p), xfer, 0};
      wr.num_sge = 1;
      wr.send_flags = IBV_SEND_INLINE;
    } else if (xfer <= sbuf_left(*rs)) {
      std::memcpy(reinterpret_cast<void*>(rs->ssgl[0].addr), p, xfer);
      sge[0] = {rs->ssgl[0].addr, xfer, rs->smr->lkey};
      wr.num_sge = 1;
      if (xfer < sbuf_left(*rs))
        rs->ssgl[0].addr += xfer;
      else
        rs->ssgl[0].addr = reinterpret_cast<uintptr_t>(rs->sbuf);
    } else {
      const uint32_t first = sbuf_left(*rs);
      std::memcpy(reinterpret_cast<void*>(rs->ssgl[0].addr), p, first);
      std::memcpy(rs->sbuf, p + first, xfer - first);
      sge[0] = {rs->ssgl[0].addr, first, rs->smr->lkey};
      sge[1] = {reinterpret_cast<uintptr_t>(rs->sbuf), xfer - first, rs->smr->lkey};
      wr.num_sge = 2;
      rs->ssgl[0].addr = reinterpret_cast<uintptr_t>(rs->sbuf) + (xfer - first);
    }
    if (int e = ibv_post_send(rs->id->qp, &wr, &bad)) {
      ret = set_errno(e);
      break;
    }
    left -= xfer;
    p += xfer;
    offset += xfer;
  }
  if (ret && left == count) return static_cast<size_t>(-1);
  return count - left;
}

}  // extern "C"
