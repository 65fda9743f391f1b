// Event channels and events: rdma_create_event_channel's fd is an eventfd, readable while
// events wait (poll/epoll/select work on it); rdma_get_cm_event blocks on it, or fails with
// EAGAIN when the application set O_NONBLOCK. Fetching an event does what librdmacm does in
// rdma_get_cm_event: a CONNECT_RESPONSE on an ID with a QP moves the QP to RTR and RTS, sends
// RTU and is reported as ESTABLISHED; a REJECTED moves the QP to ERR; a synchronous listener's
// new ID gets its own channel.
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include "cm/cm_device.h"
#include "cm/cma.h"
#include "cm/log.h"

using namespace softrdma::cm;

namespace softrdma::cm {
namespace {

void set_readable_locked(Channel* ch, bool readable) {
  if (ch->readable == readable) return;
  uint64_t v = 1;
  ssize_t n = readable ? ::write(ch->ch.fd, &v, sizeof v) : ::read(ch->ch.fd, &v, sizeof v);
  (void)n;  // an eventfd counter of 0 or 1 never blocks either call
  ch->readable = readable;
}

/// Moves `id`'s queued events from its channel to `to` and makes `to` its channel.
void move_events_locked(IdPriv* id, Channel* to) {
  Channel* from = id->channel();
  if (from == to) return;
  for (auto it = from->queue.begin(); it != from->queue.end();) {
    if ((*it)->event.id == &id->id && (*it)->owner == id) {
      to->queue.push_back(*it);
      it = from->queue.erase(it);
    } else {
      ++it;
    }
  }
  set_readable_locked(from, !from->queue.empty());
  set_readable_locked(to, !to->queue.empty());
  id->id.channel = &to->ch;
}

/// librdmacm's post-processing of a fetched event (rdma_get_cm_event's switch). Returns false
/// when the event is to be dropped (an ID that already failed its connect).
bool process_fetched_locked(CmaEvent* ev) {
  IdPriv* id = priv(ev->event.id);
  switch (ev->event.event) {
    case RDMA_CM_EVENT_CONNECT_REQUEST: {
      IdPriv* listener = id->listener;
      id->listener = nullptr;
      if (listener && listener->sync) {  // rdma_get_request: the new ID is synchronous too
        Channel* own = create_channel();
        if (own) {
          move_events_locked(id, own);
          id->sync = true;
        }
      }
      return true;
    }
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
      if (!ev->needs_rtu || !id->id.qp) return true;
      if (modify_qp_rtr_rts_locked(id, RDMA_MAX_RESP_RES, RDMA_MAX_INIT_DEPTH) == 0 &&
          send_rtu_locked(id) == 0) {
        ev->event.event = RDMA_CM_EVENT_ESTABLISHED;
      } else {
        ev->event.event = RDMA_CM_EVENT_CONNECT_ERROR;
        ev->event.status = -(errno ? errno : EINVAL);
        id->connect_error = true;
        modify_qp_err_locked(id);
        if (id->comm_id && id->dev)
          id->dev->cm().send_rej(id->comm_id, RejReason::kConsumerDefined, {});
      }
      return true;
    case RDMA_CM_EVENT_REJECTED:
      if (id->connect_error) return false;
      modify_qp_err_locked(id);
      return true;
    case RDMA_CM_EVENT_DISCONNECTED:
      return !id->connect_error;
    case RDMA_CM_EVENT_MULTICAST_JOIN:
      process_join_locked(ev);
      return true;
    default:
      return true;
  }
}

bool nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  return flags >= 0 && (flags & O_NONBLOCK);
}

}  // namespace

Channel* create_channel() {
  int fd = ::eventfd(0, EFD_CLOEXEC);
  if (fd < 0) return nullptr;
  auto* ch = new Channel;
  ch->ch.fd = fd;
  return ch;
}

void destroy_channel(Channel* ch, bool application_owned) {
  if (!ch) return;
  for (CmaEvent* ev : ch->queue) delete ev;
  std::deque<CmaEvent*>().swap(ch->queue);
  if (!application_owned && ch->waiters == 0) {
    // A synchronous ID's own channel: only this library waits on it, under the lock held.
    ::close(ch->ch.fd);
    delete ch;
    return;
  }
  ch->destroyed = true;
  // Threads blocked on it keep its fd (see Channel::waiters); otherwise it closes now.
  if (ch->waiters == 0) {
    ::close(ch->ch.fd);
    ch->ch.fd = -1;
  }
  // The struct itself is never freed: an application thread may still be on its way into
  // rdma_get_cm_event with it (rping's CM thread, started just before its main thread's
  // early exit path destroys the channel) and must find memory that says "destroyed", not
  // freed memory. A few dozen bytes per destroyed channel, reachable from here.
  static auto* graveyard = new std::vector<Channel*>;
  graveyard->push_back(ch);
}

std::unique_ptr<CmaEvent> make_event(IdPriv* id, rdma_cm_event_type type, int status) {
  auto ev = std::make_unique<CmaEvent>();
  ev->event.id = &id->id;
  ev->event.event = type;
  ev->event.status = status;
  ev->owner = id;
  return ev;
}

void queue_event_locked(IdPriv* id, std::unique_ptr<CmaEvent> ev) {
  Channel* ch = reinterpret_cast<Channel*>(ev->event.listen_id ? ev->event.listen_id->channel
                                                               : id->id.channel);
  log().debug("event {} (status {}) queued", rdma_event_str(ev->event.event), ev->event.status);
  ch->queue.push_back(ev.release());
  set_readable_locked(ch, true);
}

std::vector<std::unique_ptr<CmaEvent>> unqueue_events_locked(IdPriv* id) {
  std::vector<std::unique_ptr<CmaEvent>> out;
  Channel* ch = id->channel();
  if (!ch) return out;
  for (auto it = ch->queue.begin(); it != ch->queue.end();) {
    if ((*it)->event.id == &id->id || (*it)->owner == id) {
      out.emplace_back(*it);
      it = ch->queue.erase(it);
    } else {
      ++it;
    }
  }
  set_readable_locked(ch, !ch->queue.empty());
  return out;
}

int get_event_locked(Channel* ch, rdma_cm_event** out, std::unique_lock<std::mutex>& lk) {
  for (;;) {
    // A destroyed channel has no events and never will: block as a read of the kernel's
    // closed ucma fd does for a thread already in it (see Channel::waiters).
    if (ch->destroyed) g_cv.wait(lk, [] { return false; });
    while (!ch->queue.empty()) {
      std::unique_ptr<CmaEvent> ev(ch->queue.front());
      ch->queue.pop_front();
      set_readable_locked(ch, !ch->queue.empty());
      if (!process_fetched_locked(ev.get())) continue;
      ++ev->owner->events_reported;
      *out = &ev.release()->event;
      return 0;
    }
    if (nonblocking(ch->ch.fd)) return fail_errno(EAGAIN);
    const int fd = ch->ch.fd;
    ++ch->waiters;
    lk.unlock();
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, -1);
    const int e = errno;
    lk.lock();
    if (ch->destroyed) g_cv.wait(lk, [] { return false; });  // until the process exits
    --ch->waiters;
    // A signal ends the wait with EINTR, as librdmacm's read() of the kernel's channel does.
    if (r < 0) return fail_errno(e);
  }
}

int complete_sync_locked(IdPriv* id, std::unique_lock<std::mutex>& lk) {
  if (id->id.event) {
    CmaEvent* old = reinterpret_cast<CmaEvent*>(id->id.event);
    id->id.event = nullptr;
    ++old->owner->events_completed;
    delete old;
    g_cv.notify_all();
  }
  rdma_cm_event* ev = nullptr;
  if (get_event_locked(id->channel(), &ev, lk)) return -1;
  id->id.event = ev;
  if (ev->status) {
    if (ev->event == RDMA_CM_EVENT_REJECTED) return fail_errno(ECONNREFUSED);
    return fail_errno(ev->status < 0 ? -ev->status : ev->status);
  }
  return 0;
}

}  // namespace softrdma::cm

extern "C" {

rdma_event_channel* rdma_create_event_channel(void) {
  if (int e = library_init()) {
    errno = e;
    return nullptr;
  }
  Channel* ch = create_channel();
  return ch ? &ch->ch : nullptr;
}

void rdma_destroy_event_channel(rdma_event_channel* channel) {
  if (!channel) return;
  std::lock_guard lk(g_mu);
  destroy_channel(reinterpret_cast<Channel*>(channel), /*application_owned=*/true);
}

int rdma_get_cm_event(rdma_event_channel* channel, rdma_cm_event** event) {
  if (!channel || !event) return fail_errno(EINVAL);
  std::unique_lock lk(g_mu);
  return get_event_locked(reinterpret_cast<Channel*>(channel), event, lk);
}

int rdma_ack_cm_event(rdma_cm_event* event) {
  if (!event) return fail_errno(EINVAL);
  std::lock_guard lk(g_mu);
  auto* ev = reinterpret_cast<CmaEvent*>(event);
  ++ev->owner->events_completed;
  delete ev;
  g_cv.notify_all();
  return 0;
}

int rdma_migrate_id(rdma_cm_id* id, rdma_event_channel* channel) {
  if (!id) return fail_errno(EINVAL);
  std::unique_lock lk(g_mu);
  IdPriv* p = priv(id);
  if (p->sync && !channel) return fail_errno(EINVAL);
  Channel* to = reinterpret_cast<Channel*>(channel);
  const bool sync = to == nullptr;
  if (sync && !(to = create_channel())) return -1;
  Channel* old = p->channel();
  const bool old_sync = p->sync;
  if (old_sync && p->id.event) {
    CmaEvent* ev = reinterpret_cast<CmaEvent*>(p->id.event);
    p->id.event = nullptr;
    ++ev->owner->events_completed;
    delete ev;
  }
  move_events_locked(p, to);
  p->sync = sync;
  if (old_sync) destroy_channel(old, /*application_owned=*/false);
  // Events of this ID the application fetched from the old channel must be acknowledged
  // before it reads the new one (librdmacm waits the same way).
  g_cv.wait(lk, [p] { return p->events_completed >= p->events_reported; });
  return 0;
}

const char* rdma_event_str(rdma_cm_event_type event) {
  switch (event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      return "RDMA_CM_EVENT_ADDR_RESOLVED";
    case RDMA_CM_EVENT_ADDR_ERROR:
      return "RDMA_CM_EVENT_ADDR_ERROR";
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
      return "RDMA_CM_EVENT_ROUTE_RESOLVED";
    case RDMA_CM_EVENT_ROUTE_ERROR:
      return "RDMA_CM_EVENT_ROUTE_ERROR";
    case RDMA_CM_EVENT_CONNECT_REQUEST:
      return "RDMA_CM_EVENT_CONNECT_REQUEST";
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
      return "RDMA_CM_EVENT_CONNECT_RESPONSE";
    case RDMA_CM_EVENT_CONNECT_ERROR:
      return "RDMA_CM_EVENT_CONNECT_ERROR";
    case RDMA_CM_EVENT_UNREACHABLE:
      return "RDMA_CM_EVENT_UNREACHABLE";
    case RDMA_CM_EVENT_REJECTED:
      return "RDMA_CM_EVENT_REJECTED";
    case RDMA_CM_EVENT_ESTABLISHED:
      return "RDMA_CM_EVENT_ESTABLISHED";
    case RDMA_CM_EVENT_DISCONNECTED:
      return "RDMA_CM_EVENT_DISCONNECTED";
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
      return "RDMA_CM_EVENT_DEVICE_REMOVAL";
    case RDMA_CM_EVENT_MULTICAST_JOIN:
      return "RDMA_CM_EVENT_MULTICAST_JOIN";
    case RDMA_CM_EVENT_MULTICAST_ERROR:
      return "RDMA_CM_EVENT_MULTICAST_ERROR";
    case RDMA_CM_EVENT_ADDR_CHANGE:
      return "RDMA_CM_EVENT_ADDR_CHANGE";
    case RDMA_CM_EVENT_TIMEWAIT_EXIT:
      return "RDMA_CM_EVENT_TIMEWAIT_EXIT";
  }
  return "UNKNOWN EVENT";
}

}  // extern "C"
