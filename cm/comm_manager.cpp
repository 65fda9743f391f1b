// The IB CM protocol of one device (see comm_manager.h for sources and threading).
#include "cm/comm_manager.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <type_traits>

namespace softrdma::cm {

struct CommManager::Conn {
  uint32_t id = 0;
  CmState state = CmState::kIdle;
  CmHandler handler;
  bool released = false;  ///< destroy_id was called; kept only for time-wait
  MadAddress peer{};
  uint32_t remote_id = 0;
  bool in_remote_table = false;
  uint64_t tid = 0;
  uint64_t service_id = 0;
  uint32_t local_qpn = 0;
  uint32_t remote_qpn = 0;
  /// How long the peer takes to answer (its CM response timeout) and how often to resend.
  uint8_t peer_response_timeout = 20;
  uint8_t max_retries = 15;
  /// The message kept for resends and for answering duplicates.
  std::array<uint8_t, kMadBytes> last{};
  bool has_last = false;
  uint64_t deadline = 0;  ///< 0: no timer
  unsigned retries_left = 0;
  uint64_t timeout_ns = 0;
};

namespace {

constexpr uint8_t kMaxTimeoutExp = 31;

template <size_t N>
std::array<uint8_t, N> to_array(std::span<const uint8_t> in) {
  std::array<uint8_t, N> out{};
  if (!in.empty()) std::memcpy(out.data(), in.data(), std::min(N, in.size()));  // empty: no data
  return out;
}

/// A GUID as the 8 big-endian bytes of a REJ's ARI (reason "timeout": the CA GUID).
std::array<uint8_t, 8> guid_bytes(uint64_t guid) {
  std::array<uint8_t, 8> b;
  for (int i = 0; i < 8; ++i) b[i] = uint8_t(guid >> (56 - 8 * i));
  return b;
}

/// How long a REQ, REP, DREQ or SIDR_REQ waits for its answer before it is sent again, ns:
/// twice the packet life time plus the answering side's CM response timeout, both as IBTA's
/// 4.096 µs · 2^t (IBTA vol 1 12.7.{31,33}; Linux cm_send_req's timeout_ms). The one
/// statement of the formula.
uint64_t answer_timeout_ns(uint8_t packet_life_time, uint8_t response_timeout) {
  return 2 * ib_time_ns(packet_life_time) + ib_time_ns(response_timeout);
}

/// The header of a CM message with transaction ID `tid` (the rest is every CM MAD's:
/// IBTA 16.7.1, ComMgtSend).
MadHeader with_tid(uint64_t tid) {
  MadHeader h;
  h.transaction_id = tid;
  return h;
}

bool awaiting_rep(CmState s) {
  return s == CmState::kReqSent || s == CmState::kMraReqRcvd;
}
bool awaiting_rtu(CmState s) {
  return s == CmState::kRepSent || s == CmState::kMraRepRcvd;
}

}  // namespace

uint64_t ib_time_ns(uint8_t exp) {
  exp = std::min(exp, kMaxTimeoutExp);
  return 4096ull << exp;  // 4.096 µs = 4096 ns
}

uint8_t ack_timeout(uint8_t ack_delay, uint8_t packet_life_time) {
  // Linux cm_ack_timeout: the larger of (2 × packet life time, i.e. exponent + 1) and the ACK
  // delay, plus one when the other is within a factor of two of it.
  int t = packet_life_time + 1;
  if (t >= ack_delay)
    t += (ack_delay >= t - 1);
  else
    t = ack_delay + (t >= ack_delay - 1);
  return uint8_t(std::min(t, 31));
}

const char* to_string(CmState s) {
  switch (s) {
    case CmState::kIdle:
      return "idle";
    case CmState::kListen:
      return "listen";
    case CmState::kReqSent:
      return "REQ sent";
    case CmState::kReqRcvd:
      return "REQ received";
    case CmState::kMraReqSent:
      return "MRA(REQ) sent";
    case CmState::kMraReqRcvd:
      return "MRA(REQ) received";
    case CmState::kRepSent:
      return "REP sent";
    case CmState::kRepRcvd:
      return "REP received";
    case CmState::kMraRepSent:
      return "MRA(REP) sent";
    case CmState::kMraRepRcvd:
      return "MRA(REP) received";
    case CmState::kEstablished:
      return "established";
    case CmState::kDreqSent:
      return "DREQ sent";
    case CmState::kDreqRcvd:
      return "DREQ received";
    case CmState::kTimeWait:
      return "time-wait";
    case CmState::kSidrReqSent:
      return "SIDR_REQ sent";
    case CmState::kSidrReqRcvd:
      return "SIDR_REQ received";
  }
  return "?";
}

const char* to_string(CmEventType t) {
  switch (t) {
    case CmEventType::kReqReceived:
      return "REQ received";
    case CmEventType::kRepReceived:
      return "REP received";
    case CmEventType::kRtuReceived:
      return "RTU received";
    case CmEventType::kUserEstablished:
      return "established (COMM_EST)";
    case CmEventType::kRejReceived:
      return "REJ received";
    case CmEventType::kReqError:
      return "REQ timed out";
    case CmEventType::kRepError:
      return "REP timed out";
    case CmEventType::kDreqReceived:
      return "DREQ received";
    case CmEventType::kDrepReceived:
      return "DREP received";
    case CmEventType::kDreqError:
      return "DREQ timed out";
    case CmEventType::kTimeWaitExit:
      return "time-wait exit";
    case CmEventType::kSidrReqReceived:
      return "SIDR_REQ received";
    case CmEventType::kSidrRepReceived:
      return "SIDR_REP received";
    case CmEventType::kSidrReqError:
      return "SIDR_REQ timed out";
  }
  return "?";
}

CommManager::CommManager(MadTransport& transport, CmConfig config)
    : transport_(transport), config_(config) {
  std::random_device rd;
  comm_id_operand_ = rd();
  hi_tid_ = rd();
}

CommManager::~CommManager() = default;

// ---- IDs and tables ---------------------------------------------------------------------

uint32_t CommManager::new_comm_id() {
  // A counter XORed with a random operand: unique while this manager lives, unpredictable to
  // peers, never 0 (0 means "no ID" in a REJ).
  for (;;) {
    const uint32_t low = ((next_comm_id_++) ^ comm_id_operand_) & ((1u << kCommIdSlotShift) - 1);
    const uint32_t id = uint32_t{config_.slot} << kCommIdSlotShift | low;
    if (id != 0 && !conns_.count(id)) return id;
  }
}

uint64_t CommManager::new_tid(uint32_t comm_id) const {
  return uint64_t{hi_tid_} << 32 | comm_id;
}

CommManager::Conn* CommManager::find(uint32_t id) {
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : it->second.get();
}
const CommManager::Conn* CommManager::find(uint32_t id) const {
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : it->second.get();
}

CommManager::Conn* CommManager::match(uint32_t id, const MadAddress& from) {
  Conn* c = find(id);
  if (!c) {
    ++counters_.mads_unmatched;
    return nullptr;
  }
  if (c->peer.ip != from.ip) {
    ++counters_.mads_wrong_peer;
    return nullptr;
  }
  return c;
}

uint32_t CommManager::create_id(CmHandler handler) {
  auto c = std::make_unique<Conn>();
  c->id = new_comm_id();
  c->handler = std::move(handler);
  c->peer_response_timeout = config_.response_timeout;
  c->max_retries = config_.max_retries;
  uint32_t id = c->id;
  conns_.emplace(id, std::move(c));
  return id;
}

std::optional<CmState> CommManager::state(uint32_t id) const {
  const Conn* c = find(id);
  if (!c || c->released) return std::nullopt;
  return c->state;
}

uint32_t CommManager::remote_qpn(uint32_t id) const {
  const Conn* c = find(id);
  return c ? c->remote_qpn : 0;
}

int CommManager::set_handler(uint32_t id, CmHandler handler) {
  Conn* c = find(id);
  if (!c || c->released) return EINVAL;
  c->handler = std::move(handler);
  return 0;
}

void CommManager::forget(uint32_t id) {
  Conn* c = find(id);
  if (!c) return;
  disarm(*c);
  if (c->in_remote_table) remote_.erase({c->peer.ip, c->remote_id});
  if (c->state == CmState::kListen) listeners_.erase(c->service_id);
  conns_.erase(id);
}

void CommManager::destroy_id(uint32_t id) {
  Conn* c = find(id);
  if (!c || c->released) return;
  c->handler = nullptr;
  c->released = true;
  switch (c->state) {
    case CmState::kReqSent:
    case CmState::kMraReqRcvd: {
      // The active side gives up: REJ "timeout" carrying our CA GUID (Linux cm_destroy_id).
      disarm(*c);
      send_rej(id, RejReason::kTimeout, {}, guid_bytes(config_.ca_guid));
      break;
    }
    case CmState::kSidrReqRcvd: {
      SidrRep rep;
      rep.status = SidrStatus::kReject;
      send_sidr_rep(id, rep);
      break;
    }
    case CmState::kEstablished: {
      // DREQ once, then time-wait (the ID is gone: nobody would see a DREP or its timeout).
      Dreq d;
      d.local_comm_id = c->id;
      d.remote_comm_id = c->remote_id;
      d.remote_qpn = c->remote_qpn;
      c->state = CmState::kDreqSent;
      send_once(*c, new_tid(c->id), d);
      enter_timewait(*c);
      return;
    }
    case CmState::kDreqSent:
      enter_timewait(*c);
      return;
    case CmState::kDreqRcvd:
      send_drep(id, {});
      return;
    case CmState::kTimeWait:
      return;  // stays until the time-wait ends
    default:
      // Connecting with the peer's QP known: REJ "consumer defined" (Linux cm_destroy_id).
      // Idle, listening or a SIDR_REQ sent: nobody to tell.
      if (connecting_with_peer_known(c->state)) send_rej(id, RejReason::kConsumerDefined, {});
      break;
  }
  forget(id);
}

// ---- sending ----------------------------------------------------------------------------

void CommManager::transmit(const MadAddress& to, const std::array<uint8_t, kMadBytes>& mad) {
  ++counters_.mads_sent;
  transport_.send(to, mad);
}

void CommManager::send_once(Conn& c, uint64_t tid, const CmMessage& m) {
  c.last = encode(with_tid(tid), m);
  c.has_last = true;
  transmit(c.peer, c.last);
}

void CommManager::send_with_retries(Conn& c, uint64_t tid, const CmMessage& m,
                                    uint8_t response_timeout, unsigned retries) {
  const uint64_t timeout_ns = answer_timeout_ns(config_.packet_life_time, response_timeout);
  send_once(c, tid, m);
  c.timeout_ns = timeout_ns;
  c.retries_left = retries;
  arm(c, transport_.now_ns() + timeout_ns);
}

void CommManager::arm(Conn& c, uint64_t deadline) {
  disarm(c);
  c.deadline = std::max<uint64_t>(deadline, 1);
  timers_.emplace(c.deadline, c.id);
}

void CommManager::disarm(Conn& c) {
  if (c.deadline) timers_.erase({c.deadline, c.id});
  c.deadline = 0;
}

void CommManager::enter_timewait(Conn& c) {
  // IBTA 12.9.6: time-wait lasts long enough for stray packets of the connection to die out;
  // Linux waits the connection's local ACK timeout.
  c.state = CmState::kTimeWait;
  arm(c, transport_.now_ns() +
             ib_time_ns(ack_timeout(config_.ca_ack_delay, config_.packet_life_time)));
  c.retries_left = 0;
}

void CommManager::emit(uint32_t id, CmEventType type, const Mad* mad, uint64_t service_id) {
  Conn* c = find(id);
  if (!c || c->released || !c->handler) return;
  CmHandler h = c->handler;  // the handler may destroy the ID (and its std::function)
  h(CmEvent{type, id, c->peer, mad, service_id});
}

void CommManager::issue_rej(const MadAddress& to, const MadHeader& req_header,
                            uint32_t remote_comm_id, MessageRef message, RejReason reason) {
  Rej rej;
  rej.local_comm_id = 0;
  rej.remote_comm_id = remote_comm_id;
  rej.message = message;
  rej.reason = uint16_t(reason);
  ++counters_.rej_sent;
  transmit(to, encode(with_tid(req_header.transaction_id), rej));
}

void CommManager::issue_drep(const MadAddress& to, const MadHeader& dreq_header, const Dreq& dreq) {
  Drep drep;
  drep.local_comm_id = dreq.remote_comm_id;
  drep.remote_comm_id = dreq.local_comm_id;
  transmit(to, encode(with_tid(dreq_header.transaction_id), drep));
}

bool CommManager::listened_elsewhere(uint64_t service_id) {
  if (!config_.listened_elsewhere || !config_.listened_elsewhere(service_id)) return false;
  ++counters_.mads_other_process;
  return true;
}

bool CommManager::hold_request(const Mad& mad, const MadAddress& from) {
  auto key = [](const Mad& m) {
    if (const Req* r = std::get_if<Req>(&m.message)) return r->local_comm_id;
    return std::get<SidrReq>(m.message).request_id;
  };
  for (HeldRequest& h : held_)
    if (h.from.ip == from.ip && key(h.mad) == key(mad) &&
        h.mad.message.index() == mad.message.index()) {
      ++counters_.mads_duplicate;  // a resend of a held request: keep the first
      return true;
    }
  if (held_.size() >= kMaxHeldRequests) return false;
  // At most half the time the requester waits for an answer (its REQ says how long; a
  // SIDR_REQ does not: our own response timeout stands in), so a REJ still beats its resend.
  const Req* req = std::get_if<Req>(&mad.message);
  const uint64_t hold =
      std::min(kUnmatchedRequestHoldNs,
               ib_time_ns(req ? req->remote_cm_response_timeout : config_.response_timeout) / 2);
  ++counters_.reqs_held;
  const uint64_t deadline = transport_.now_ns() + hold;
  auto at = std::find_if(held_.begin(), held_.end(),
                         [&](const HeldRequest& h) { return h.deadline > deadline; });
  held_.insert(at, {deadline, from, mad});
  return true;
}

void CommManager::refuse_unmatched(const Mad& mad, const MadAddress& from) {
  if (const Req* r = std::get_if<Req>(&mad.message)) {
    issue_rej(from, mad.header, r->local_comm_id, MessageRef::kReq, RejReason::kInvalidServiceId);
    return;
  }
  const SidrReq& q = std::get<SidrReq>(mad.message);
  SidrRep rep;
  rep.request_id = q.request_id;
  rep.service_id = q.service_id;
  rep.status = SidrStatus::kUnsupported;
  transmit(from, encode(with_tid(mad.header.transaction_id), rep));
}

// ---- the API ----------------------------------------------------------------------------

int CommManager::listen(uint32_t id, uint64_t service_id) {
  Conn* c = find(id);
  if (!c || c->released || c->state != CmState::kIdle) return EINVAL;
  if (listeners_.count(service_id)) return EADDRINUSE;
  c->state = CmState::kListen;
  c->service_id = service_id;
  listeners_.emplace(service_id, id);
  // Requests that came just before the listener: theirs now.
  std::vector<HeldRequest> mine;
  for (auto it = held_.begin(); it != held_.end();) {
    const uint64_t sid = std::holds_alternative<Req>(it->mad.message)
                             ? std::get<Req>(it->mad.message).service_id
                             : std::get<SidrReq>(it->mad.message).service_id;
    if (sid == service_id) {
      mine.push_back(std::move(*it));
      it = held_.erase(it);
    } else {
      ++it;
    }
  }
  for (const HeldRequest& h : mine)
    std::visit(
        [&](const auto& m) {
          using T = std::decay_t<decltype(m)>;
          if constexpr (std::is_same_v<T, Req> || std::is_same_v<T, SidrReq>)
            handle(h.mad, m, h.from);
        },
        h.mad.message);
  return 0;
}

int CommManager::send_req(uint32_t id, const MadAddress& peer, Req req) {
  Conn* c = find(id);
  if (!c || c->released || c->state != CmState::kIdle) return EINVAL;
  c->peer = peer;
  c->service_id = req.service_id;
  c->local_qpn = req.local_qpn;
  c->tid = new_tid(c->id);
  c->max_retries = config_.max_retries;
  c->peer_response_timeout = config_.response_timeout;
  req.local_comm_id = c->id;
  req.local_ca_guid = config_.ca_guid;
  req.remote_cm_response_timeout = config_.response_timeout;
  req.local_cm_response_timeout = config_.response_timeout;
  req.max_cm_retries = config_.max_retries;
  c->state = CmState::kReqSent;
  send_with_retries(*c, c->tid, req, config_.response_timeout, config_.max_retries);
  return 0;
}

int CommManager::send_rep(uint32_t id, Rep rep) {
  Conn* c = find(id);
  if (!c || c->released || (c->state != CmState::kReqRcvd && c->state != CmState::kMraReqSent))
    return EINVAL;
  rep.local_comm_id = c->id;
  rep.remote_comm_id = c->remote_id;
  rep.local_ca_guid = config_.ca_guid;
  rep.target_ack_delay = config_.ca_ack_delay;
  c->local_qpn = rep.local_qpn;
  c->state = CmState::kRepSent;
  send_with_retries(*c, c->tid, rep, c->peer_response_timeout, c->max_retries);
  return 0;
}

int CommManager::send_rtu(uint32_t id, std::span<const uint8_t> private_data) {
  Conn* c = find(id);
  if (!c || c->released || (c->state != CmState::kRepRcvd && c->state != CmState::kMraRepSent))
    return EINVAL;
  Rtu rtu;
  rtu.local_comm_id = c->id;
  rtu.remote_comm_id = c->remote_id;
  rtu.private_data = to_array<kRtuPrivateBytes>(private_data);
  c->state = CmState::kEstablished;
  disarm(*c);
  send_once(*c, c->tid, rtu);
  return 0;
}

int CommManager::send_rej(uint32_t id, RejReason reason, std::span<const uint8_t> private_data,
                          std::span<const uint8_t> ari) {
  Conn* c = find(id);
  if (!c) return EINVAL;
  // "Message REJected" as Linux's cm_format_rej writes it: REQ or REP for the message we
  // answer, "other" when we give up on our own REQ or REP.
  MessageRef ref;
  switch (c->state) {
    case CmState::kReqRcvd:
    case CmState::kMraReqSent:
      ref = MessageRef::kReq;
      break;
    case CmState::kRepRcvd:
    case CmState::kMraRepSent:
      ref = MessageRef::kRep;
      break;
    case CmState::kReqSent:
    case CmState::kMraReqRcvd:
    case CmState::kRepSent:
    case CmState::kMraRepRcvd:
      ref = MessageRef::kOther;
      break;
    default:
      return EINVAL;
  }
  Rej rej;
  rej.local_comm_id = c->id;
  rej.remote_comm_id = c->remote_id;
  rej.message = ref;
  rej.reason = uint16_t(reason);
  rej.reject_info_length = uint8_t(std::min<size_t>(ari.size(), kRejAriBytes));
  rej.ari = to_array<kRejAriBytes>(ari);
  rej.private_data = to_array<kRejPrivateBytes>(private_data);
  disarm(*c);
  ++counters_.rej_sent;
  send_once(*c, c->tid, rej);
  c->state = CmState::kIdle;
  return 0;
}

int CommManager::establish(uint32_t id) {
  Conn* c = find(id);
  if (!c || c->released) return EINVAL;
  if (c->state == CmState::kEstablished) return EISCONN;  // Linux cm_establish
  if (!awaiting_rtu(c->state)) return EINVAL;
  disarm(*c);
  c->state = CmState::kEstablished;
  emit(id, CmEventType::kUserEstablished, nullptr);
  return 0;
}

int CommManager::send_dreq(uint32_t id, std::span<const uint8_t> private_data) {
  Conn* c = find(id);
  if (!c || c->released) return EINVAL;
  // A passive side whose RTU was lost may disconnect from REP_SENT (Linux allows it too).
  if (c->state != CmState::kEstablished && !awaiting_rtu(c->state)) return EINVAL;
  Dreq d;
  d.local_comm_id = c->id;
  d.remote_comm_id = c->remote_id;
  d.remote_qpn = c->remote_qpn;
  d.private_data = to_array<kDreqPrivateBytes>(private_data);
  c->state = CmState::kDreqSent;
  send_with_retries(*c, new_tid(c->id), d, c->peer_response_timeout, c->max_retries);
  return 0;
}

int CommManager::send_drep(uint32_t id, std::span<const uint8_t> private_data) {
  Conn* c = find(id);
  if (!c || c->state != CmState::kDreqRcvd) return EINVAL;
  Drep d;
  d.local_comm_id = c->id;
  d.remote_comm_id = c->remote_id;
  d.private_data = to_array<kDrepPrivateBytes>(private_data);
  send_once(*c, c->tid, d);
  enter_timewait(*c);
  return 0;
}

int CommManager::send_sidr_req(uint32_t id, const MadAddress& peer, SidrReq req) {
  Conn* c = find(id);
  if (!c || c->released || c->state != CmState::kIdle) return EINVAL;
  c->peer = peer;
  c->service_id = req.service_id;
  c->tid = new_tid(c->id);
  req.request_id = c->id;
  c->state = CmState::kSidrReqSent;
  send_with_retries(*c, c->tid, req, config_.response_timeout, config_.max_retries);
  return 0;
}

int CommManager::send_sidr_rep(uint32_t id, SidrRep rep) {
  Conn* c = find(id);
  if (!c || c->state != CmState::kSidrReqRcvd) return EINVAL;
  rep.request_id = c->remote_id;
  rep.service_id = c->service_id;
  send_once(*c, c->tid, rep);
  c->state = CmState::kIdle;
  // The ID stays matched to (peer, request ID) until destroyed, so a resent SIDR_REQ gets
  // this SIDR_REP again (handle(SidrReq) below).
  return 0;
}

// ---- receiving --------------------------------------------------------------------------

void CommManager::on_mad(std::span<const uint8_t> bytes, const MadAddress& from) {
  DecodeResult r = decode(bytes);
  if (!r.mad) {
    if (r.error == MadError::kNotCm || r.error == MadError::kUnknownAttribute)
      ++counters_.mads_not_cm;
    else
      ++counters_.mads_malformed;
    return;
  }
  ++counters_.mads_rcvd;
  const Mad& mad = *r.mad;
  // The receiver's communication ID (every message but REQ and SIDR_REQ names it): one of
  // another slot belongs to another process at this address, which has its own copy.
  const uint32_t receiver_id = std::visit(
      [](const auto& m) -> uint32_t {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, SidrRep>)
          return m.request_id;
        else if constexpr (std::is_same_v<T, Req> || std::is_same_v<T, SidrReq>)
          return 0;
        else
          return m.remote_comm_id;
      },
      mad.message);
  if (receiver_id != 0 && (receiver_id >> kCommIdSlotShift) != config_.slot) {
    ++counters_.mads_other_process;
    return;
  }
  std::visit([&](const auto& m) { handle(mad, m, from); }, mad.message);
}

void CommManager::handle(const Mad& mad, const Req& m, const MadAddress& from) {
  // A REQ we know (same peer, same remote ID): the active side resent it.
  if (auto it = remote_.find({from.ip, m.local_comm_id}); it != remote_.end()) {
    Conn* c = find(it->second);
    ++counters_.mads_duplicate;
    if (!c) return;
    switch (c->state) {
      case CmState::kReqRcvd:
      case CmState::kMraReqSent: {
        // Our consumer has not answered yet: tell the peer to wait (IBTA 12.6.6, MRA), so a
        // slow accept is not mistaken for a dead peer. It waits at most Max CM Retries more.
        Mra mra;
        mra.local_comm_id = c->id;
        mra.remote_comm_id = c->remote_id;
        mra.message = MessageRef::kReq;
        mra.service_timeout = config_.response_timeout;
        c->state = CmState::kMraReqSent;
        transmit(c->peer, encode(with_tid(c->tid), mra));
        break;
      }
      case CmState::kRepSent:
      case CmState::kMraRepRcvd:
        if (c->has_last) transmit(c->peer, c->last);  // our REP was lost
        break;
      case CmState::kTimeWait:
        issue_rej(from, mad.header, m.local_comm_id, MessageRef::kReq, RejReason::kStaleConn);
        break;
      default:
        break;
    }
    return;
  }
  auto l = listeners_.find(m.service_id);
  if (l == listeners_.end()) {
    if (listened_elsewhere(m.service_id)) return;  // another process at this address's
    // Nobody listens (yet): held for a listener, then REJ "invalid service ID", as Linux's
    // cm_req_handler answers.
    if (!hold_request(mad, from)) refuse_unmatched(mad, from);
    return;
  }
  Conn* listener = find(l->second);
  if (m.transport != ReqTransport::kRc &&
      !(m.transport == ReqTransport::kExtended && m.extended_transport == kExtendedTransportXrc)) {
    issue_rej(from, mad.header, m.local_comm_id, MessageRef::kReq,
              RejReason::kInvalidTransportType);
    return;
  }
  uint32_t id = create_id(listener ? listener->handler : nullptr);
  Conn& c = *find(id);
  c.state = CmState::kReqRcvd;
  c.peer = from;
  c.remote_id = m.local_comm_id;
  c.in_remote_table = true;
  remote_.emplace(std::make_pair(from.ip, m.local_comm_id), id);
  c.tid = mad.header.transaction_id;
  c.service_id = m.service_id;
  c.remote_qpn = m.local_qpn;
  c.peer_response_timeout = m.local_cm_response_timeout;
  c.max_retries = m.max_cm_retries;
  emit(id, CmEventType::kReqReceived, &mad, m.service_id);
}

void CommManager::handle(const Mad& mad, const Mra& m, const MadAddress& from) {
  Conn* c = match(m.remote_comm_id, from);
  if (!c) return;
  (void)mad;
  // The peer needs service_timeout more: the pending message's next resend waits that long
  // (its retry count is not renewed, so the wait stays bounded).
  const uint64_t wait = ib_time_ns(m.service_timeout) + 2 * ib_time_ns(config_.packet_life_time);
  if (m.message == MessageRef::kReq && awaiting_rep(c->state)) {
    c->state = CmState::kMraReqRcvd;
    arm(*c, transport_.now_ns() + wait);
  } else if (m.message == MessageRef::kRep && awaiting_rtu(c->state)) {
    c->state = CmState::kMraRepRcvd;
    arm(*c, transport_.now_ns() + wait);
  } else {
    ++counters_.mads_bad_state;
  }
}

void CommManager::handle(const Mad& mad, const Rej& m, const MadAddress& from) {
  ++counters_.rej_rcvd;
  // A REJ "timeout" from an active side that gave up before our REP reached it names us only
  // by its own ID (and its CA GUID in the ARI): find it as the peer's (Linux
  // cm_acquire_rejected_id).
  Conn* c = nullptr;
  if (m.reason == uint16_t(RejReason::kTimeout) && m.remote_comm_id == 0) {
    auto it = remote_.find({from.ip, m.local_comm_id});
    c = it == remote_.end() ? nullptr : find(it->second);
    if (!c) ++counters_.mads_unmatched;
  } else {
    c = match(m.remote_comm_id, from);
  }
  if (!c) return;
  switch (c->state) {
    case CmState::kReqSent:
    case CmState::kMraReqRcvd:
    case CmState::kReqRcvd:
    case CmState::kMraReqSent:
    case CmState::kRepSent:
    case CmState::kMraRepRcvd:
    case CmState::kRepRcvd:
    case CmState::kMraRepSent:
    case CmState::kEstablished:
      break;
    default:
      ++counters_.mads_bad_state;
      return;
  }
  disarm(*c);
  c->state = CmState::kIdle;
  if (c->released) {
    forget(c->id);
    return;
  }
  emit(c->id, CmEventType::kRejReceived, &mad);
}

void CommManager::handle(const Mad& mad, const Rep& m, const MadAddress& from) {
  Conn* c = match(m.remote_comm_id, from);
  if (!c) return;
  if (awaiting_rep(c->state)) {
    disarm(*c);
    c->state = CmState::kRepRcvd;
    c->remote_id = m.local_comm_id;
    c->remote_qpn = m.local_qpn;
    if (!c->in_remote_table) {
      c->in_remote_table = true;
      remote_.emplace(std::make_pair(from.ip, m.local_comm_id), c->id);
    }
    emit(c->id, CmEventType::kRepReceived, &mad);
    return;
  }
  ++counters_.mads_duplicate;
  // The passive side resent its REP: our RTU was lost — send it again (Linux cm_dup_rep_handler).
  if (c->state == CmState::kEstablished && c->has_last) transmit(c->peer, c->last);
}

void CommManager::handle(const Mad& mad, const Rtu& m, const MadAddress& from) {
  Conn* c = match(m.remote_comm_id, from);
  if (!c) return;
  if (!awaiting_rtu(c->state)) {
    ++counters_.mads_duplicate;
    return;
  }
  disarm(*c);
  c->state = CmState::kEstablished;
  emit(c->id, CmEventType::kRtuReceived, &mad);
}

void CommManager::handle(const Mad& mad, const Dreq& m, const MadAddress& from) {
  Conn* c = find(m.remote_comm_id);
  if (!c || c->peer.ip != from.ip || (c->local_qpn && m.remote_qpn != c->local_qpn)) {
    // No such connection (destroyed and forgotten, or never ours): answer anyway so the
    // peer does not wait out its retries (Linux cm_issue_drep).
    ++counters_.mads_unmatched;
    issue_drep(from, mad.header, m);
    return;
  }
  switch (c->state) {
    case CmState::kEstablished:
    case CmState::kRepSent:
    case CmState::kMraRepRcvd:
    case CmState::kDreqSent:
      break;
    case CmState::kTimeWait: {
      ++counters_.mads_duplicate;
      Drep d;
      d.local_comm_id = c->id;
      d.remote_comm_id = c->remote_id;
      transmit(c->peer, encode(with_tid(mad.header.transaction_id), d));
      return;
    }
    case CmState::kDreqRcvd:
      ++counters_.mads_duplicate;
      return;
    default:
      ++counters_.mads_bad_state;
      return;
  }
  disarm(*c);
  c->state = CmState::kDreqRcvd;
  c->tid = mad.header.transaction_id;
  if (c->released) {  // nobody to tell: answer at once
    send_drep(c->id, {});
    return;
  }
  emit(c->id, CmEventType::kDreqReceived, &mad);
}

void CommManager::handle(const Mad& mad, const Drep& m, const MadAddress& from) {
  Conn* c = match(m.remote_comm_id, from);
  if (!c) return;
  if (c->state != CmState::kDreqSent && c->state != CmState::kDreqRcvd) {
    ++counters_.mads_duplicate;
    return;
  }
  enter_timewait(*c);
  emit(c->id, CmEventType::kDrepReceived, &mad);
}

void CommManager::handle(const Mad& mad, const SidrReq& m, const MadAddress& from) {
  if (auto it = remote_.find({from.ip, m.request_id}); it != remote_.end()) {
    ++counters_.mads_duplicate;
    Conn* c = find(it->second);
    // Already answered: answer again (the SIDR_REP was lost).
    if (c && c->state == CmState::kIdle && c->has_last) transmit(c->peer, c->last);
    return;
  }
  auto l = listeners_.find(m.service_id);
  if (l == listeners_.end()) {
    if (listened_elsewhere(m.service_id)) return;  // another process at this address's
    if (!hold_request(mad, from)) refuse_unmatched(mad, from);
    return;
  }
  Conn* listener = find(l->second);
  uint32_t id = create_id(listener ? listener->handler : nullptr);
  Conn& c = *find(id);
  c.state = CmState::kSidrReqRcvd;
  c.peer = from;
  c.remote_id = m.request_id;
  c.in_remote_table = true;
  remote_.emplace(std::make_pair(from.ip, m.request_id), id);
  c.tid = mad.header.transaction_id;
  c.service_id = m.service_id;
  emit(id, CmEventType::kSidrReqReceived, &mad, m.service_id);
}

void CommManager::handle(const Mad& mad, const SidrRep& m, const MadAddress& from) {
  Conn* c = match(m.request_id, from);
  if (!c) return;
  if (c->state != CmState::kSidrReqSent) {
    ++counters_.mads_duplicate;
    return;
  }
  disarm(*c);
  c->state = CmState::kIdle;
  emit(c->id, CmEventType::kSidrRepReceived, &mad);
}

// ---- timers -----------------------------------------------------------------------------

std::optional<uint64_t> CommManager::next_deadline() const {
  std::optional<uint64_t> next;
  if (!timers_.empty()) next = timers_.begin()->first;
  if (!held_.empty() && (!next || held_.front().deadline < *next)) next = held_.front().deadline;
  return next;
}

void CommManager::on_timer() {
  const uint64_t now = transport_.now_ns();
  while (!held_.empty() && held_.front().deadline <= now) {  // nobody came: refuse
    HeldRequest h = std::move(held_.front());
    held_.erase(held_.begin());
    const uint64_t sid = std::holds_alternative<Req>(h.mad.message)
                             ? std::get<Req>(h.mad.message).service_id
                             : std::get<SidrReq>(h.mad.message).service_id;
    if (!listened_elsewhere(sid)) refuse_unmatched(h.mad, h.from);
  }
  // Bounded: each round pops one due timer; a resend re-arms later than now.
  for (size_t round = 0; round < conns_.size() + 1 && !timers_.empty(); ++round) {
    auto [deadline, id] = *timers_.begin();
    if (deadline > now) break;
    timers_.erase(timers_.begin());
    Conn* c = find(id);
    if (!c || c->deadline != deadline) continue;
    c->deadline = 0;
    if (c->state == CmState::kTimeWait) {
      if (c->released) {
        forget(id);
      } else {
        c->state = CmState::kIdle;
        emit(id, CmEventType::kTimeWaitExit, nullptr);
      }
      continue;
    }
    if (c->retries_left > 0 && c->has_last) {
      --c->retries_left;
      ++counters_.mads_resent;
      transmit(c->peer, c->last);
      arm(*c, now + c->timeout_ns);
      continue;
    }
    ++counters_.timeouts;
    switch (c->state) {
      case CmState::kReqSent:
      case CmState::kMraReqRcvd:
        c->state = CmState::kIdle;
        emit(id, CmEventType::kReqError, nullptr);
        break;
      case CmState::kRepSent:
      case CmState::kMraRepRcvd: {
        // Tell the active side we gave up (Linux: REJ "timeout" with our CA GUID).
        send_rej(id, RejReason::kTimeout, {}, guid_bytes(config_.ca_guid));
        emit(id, CmEventType::kRepError, nullptr);
        break;
      }
      case CmState::kDreqSent:
        enter_timewait(*c);
        emit(id, CmEventType::kDreqError, nullptr);
        break;
      case CmState::kSidrReqSent:
        c->state = CmState::kIdle;
        emit(id, CmEventType::kSidrReqError, nullptr);
        break;
      default:
        break;
    }
  }
}

}  // namespace softrdma::cm
