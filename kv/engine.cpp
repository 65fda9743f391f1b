// kv::Engine's API (engine.h): options, the published record, memory registration, segment
// handles and peer probes. Batches and their submission are in submit.cpp (slice lengths in
// slicing.h), notifications in notifications.cpp, the devices, QPs and handshake in
// connection.cpp, the progress thread in progress.cpp.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include "base/params.h"
#include "kv/engine_impl.h"

namespace softrdma::kv {

using detail::Batch;
using detail::Peer;
using detail::PeerRecord;
using detail::Region;

namespace {

constexpr const char* kRecordPrefix = "softrdma-kv/";
constexpr const char* kRecordMagic = "softrdma-kv-record 2";  // 2: one rkey per device

bool valid_name(std::string_view n) {
  if (n.empty() || n.size() > 64) return false;
  return std::all_of(n.begin(), n.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' ||
           c == '-';
  });
}

}  // namespace

// ---- options ------------------------------------------------------------------------------

EngineOptions EngineOptions::from_environment() {
  EngineOptions o;
  using params::integer;
  // One name, or a comma-separated list of them (several devices).
  const std::string d = params::text(params::kKvIbDevice);
  for (size_t at = 0; at < d.size();) {
    const size_t comma = std::min(d.find(',', at), d.size());
    if (comma == at) throw std::invalid_argument(params::malformed(params::kKvIbDevice, d));
    o.devices.push_back(d.substr(at, comma - at));
    at = comma + 1;
    if (comma + 1 == d.size())
      throw std::invalid_argument(params::malformed(params::kKvIbDevice, d));
  }
  o.gid_index = static_cast<int>(integer(params::kKvIbGidIndex, o.gid_index));
  o.qps_per_peer = static_cast<uint32_t>(integer(params::kKvQps, o.qps_per_peer));
  o.slice_bytes =
      static_cast<uint64_t>(integer(params::kKvSliceBytes, static_cast<int64_t>(o.slice_bytes)));
  o.max_wr = static_cast<uint32_t>(integer(params::kKvMaxWr, o.max_wr));
  o.max_wr_from_path = params::flag(params::kKvMaxWrFromPath, o.max_wr_from_path);
  o.max_rd_atomic = static_cast<uint32_t>(integer(params::kKvMaxRdAtomic, o.max_rd_atomic));
  o.ib_timeout = static_cast<uint8_t>(integer(params::kKvIbTimeout, o.ib_timeout));
  o.retry_cnt = static_cast<uint8_t>(integer(params::kKvIbRetryCnt, o.retry_cnt));
  o.host = params::text(params::kKvHost);
  o.spin = std::chrono::microseconds(integer(params::kKvSpinUs, o.spin.count()));
  o.poll_while_busy = params::flag(params::kKvPollBusy, o.poll_while_busy);
  o.connect_timeout =
      std::chrono::milliseconds(integer(params::kKvConnectTimeoutMs, o.connect_timeout.count()));
  return o;
}

// ---- record -------------------------------------------------------------------------------

namespace detail {

PeerRecord parse_record(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != kRecordMagic)
    throw std::runtime_error("not a softrdma-kv record (another version?)");
  PeerRecord r;
  while (std::getline(in, line)) {
    std::istringstream l(line);
    std::string key;
    l >> key;
    if (key == "pid") {
      l >> r.pid;
    } else if (key == "handshake") {
      l >> r.host >> r.port;
    } else if (key == "devices") {
      for (std::string a; l >> a;) r.devices.push_back(a);
      l.clear();
    } else if (key == "segment") {
      Segment s;
      std::string keys;
      l >> s.name >> std::hex >> s.addr >> std::dec >> s.length >> s.location >> keys;
      std::vector<uint32_t> rkeys;
      std::istringstream k(keys);
      for (std::string one; std::getline(k, one, ',');) {
        char* end = nullptr;
        const unsigned long v = std::strtoul(one.c_str(), &end, 10);
        if (one.empty() || *end || v > UINT32_MAX) l.setstate(std::ios::failbit);
        rkeys.push_back(static_cast<uint32_t>(v));
      }
      if (rkeys.empty() || rkeys.size() != r.devices.size()) l.setstate(std::ios::failbit);
      r.segments.push_back(s);
      r.rkeys.push_back(rkeys);
    }
    if (l.fail()) throw std::runtime_error("malformed record line '" + line + "'");
  }
  if (r.host.empty() || r.port == 0) throw std::runtime_error("record without a handshake address");
  if (r.devices.empty()) throw std::runtime_error("record without devices");
  return r;
}

}  // namespace detail

std::string Engine::Impl::record_text() const {
  std::ostringstream s;
  s << kRecordMagic << "\n";
  s << "pid " << getpid() << "\n";
  s << "handshake " << handshake.host << " " << handshake.port << "\n";
  s << "devices";
  for (const detail::Device& d : context.devs) s << " " << d.addr;
  s << "\n";
  for (const auto& [n, r] : regions_by_name) {
    s << "segment " << n << " " << std::hex << r->seg.addr << std::dec << " " << r->seg.length
      << " " << r->seg.location << " ";
    for (size_t i = 0; i < r->mrs.size(); ++i) s << (i ? "," : "") << r->mrs[i]->rkey;
    s << "\n";
  }
  return s.str();
}

void Engine::Impl::publish() {
  std::lock_guard pl(publish_mu);
  std::string text;
  {
    std::lock_guard lk(mu);
    text = record_text();
  }
  store->put(kRecordPrefix + name, text);
}

void Engine::Impl::fail_local(const std::string& what) const {
  throw KvError("kv engine '" + name + "': " + what, "");
}

BatchStatus Engine::Impl::status_of(const Batch& b) const {
  BatchStatus s;
  s.bytes_done = b.bytes_done;
  s.bytes_total = b.bytes_total;
  s.transfers = b.transfers;
  if (b.slices_left > 0 || b.transfers == 0) {
    s.state = BatchState::kPending;
  } else if (b.failed) {
    s.state = BatchState::kFailed;
    s.error = b.error;
    s.peer = b.error_peer;
  } else {
    s.state = BatchState::kCompleted;
  }
  return s;
}

std::chrono::milliseconds Engine::Impl::retry_bound() const {
  // 4.096 µs·2^timeout per try, retry_cnt + 1 tries (IBTA vol. 1 9.7.6.1.3, C9-141).
  const double per_try_ms = 4.096e-3 * static_cast<double>(uint64_t{1} << opt.ib_timeout);
  return std::chrono::milliseconds(static_cast<int64_t>(per_try_ms * (opt.retry_cnt + 1)) + 1);
}

// ---- Engine -------------------------------------------------------------------------------

Engine::Engine(std::string name, std::shared_ptr<MetadataStore> store, const EngineOptions& options)
    : impl_(std::make_unique<Impl>()) {
  if (!valid_name(name))
    throw std::invalid_argument("kv::Engine: a name is 1-64 characters of [A-Za-z0-9._:-], got '" +
                                name + "'");
  if (!store) throw std::invalid_argument("kv::Engine '" + name + "': no metadata store");
  if (options.qps_per_peer < 1 || options.qps_per_peer > 16 || options.max_wr < 1 ||
      options.slice_bytes < 4096)
    throw std::invalid_argument("kv::Engine '" + name +
                                "': qps_per_peer in 1..16, max_wr >= 1, slice_bytes >= 4096");
  Impl& I = *impl_;
  I.name = std::move(name);
  I.opt = options;
  I.store = std::move(store);
  try {
    I.open_devices();
    I.start_listener();
    I.start_progress();
    I.publish();
  } catch (...) {
    I.close_device();
    throw;
  }
}

Engine::~Engine() {
  Impl& I = *impl_;
  {
    // Linger for posted sends (a notify() just before exit would otherwise die with its QP).
    const double ack_timeout_s = 4.096e-6 * std::ldexp(1.0, I.opt.ib_timeout);
    const auto bound = std::min<std::chrono::milliseconds>(
        I.opt.connect_timeout, std::chrono::milliseconds(static_cast<int64_t>(
                                   1000 * ack_timeout_s * (I.opt.retry_cnt + 1))));
    const auto deadline = Clock::now() + bound;
    auto busy = [&] {
      for (const auto& [name, p] : I.peers) {
        if (p->state != detail::PeerState::kConnected) continue;
        if (!p->pending_notify.empty()) return true;
        for (const detail::Qp* q : p->qps)
          if (q->outstanding > 0) return true;
      }
      return false;
    };
    std::unique_lock lk(I.mu);
    while (busy() && Clock::now() < deadline) {
      lk.unlock();
      clock::sleep_for(std::chrono::milliseconds(1));
      lk.lock();
    }
  }
  try {
    impl_->store->remove(kRecordPrefix + impl_->name);
  } catch (const std::exception&) {
    // The store is gone: peers find a record whose handshake address does not answer.
  }
  impl_->close_device();
}

const std::string& Engine::name() const {
  return impl_->name;
}

const EngineOptions& Engine::options() const {
  return impl_->opt;
}

const std::string& Engine::device_address() const {
  return impl_->context.device_addr;
}

const std::vector<std::string>& Engine::devices() const {
  return impl_->context.device_names;
}

// ---- memory -------------------------------------------------------------------------------

Segment Engine::register_memory(void* addr, size_t length, std::string_view location,
                                std::string_view name) {
  Impl& I = *impl_;
  const std::string who = "kv::Engine::register_memory ('" + I.name + "')";
  if (!addr || length == 0) throw std::invalid_argument(who + ": null address or zero length");
  if (!name.empty() && !valid_name(name))
    throw std::invalid_argument(who + ": a segment name is 1-64 characters of [A-Za-z0-9._:-]");
  if (location.empty() || location.find_first_of(" \n\t") != std::string_view::npos)
    throw std::invalid_argument(who + ": a location is a word such as cpu:0");
  const uint64_t a = reinterpret_cast<uint64_t>(addr);
  Segment out;
  {
    std::lock_guard lk(I.mu);
    // The registration cache: the same range again is the same segment.
    if (auto it = I.regions.find(a); it != I.regions.end() && it->second->seg.length == length &&
                                     (name.empty() || it->second->seg.name == name)) {
      ++it->second->refs;
      return it->second->seg;
    }
    // Overlapping registrations would make a local address ambiguous.
    auto next = I.regions.lower_bound(a);
    if ((next != I.regions.end() && next->first < a + length) ||
        (next != I.regions.begin() &&
         std::prev(next)->first + std::prev(next)->second->seg.length > a))
      throw std::invalid_argument(who + ": the range overlaps a registered segment");
    std::string n(name);
    if (n.empty()) {
      do n = "seg" + std::to_string(I.next_segment++);
      while (I.regions_by_name.count(n));
    }
    if (I.regions_by_name.count(n))
      throw std::invalid_argument(who + ": segment name '" + n + "' is taken");
    // On every device, or on none: a failure deregisters the ones done and names the device.
    const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    std::vector<ibv_mr*> mrs;
    for (const detail::Device& d : I.context.devs) {
      ibv_mr* mr = ibv_reg_mr(d.pd, addr, length, access);
      if (!mr) {
        const int e = errno;
        for (ibv_mr* done : mrs) ibv_dereg_mr(done);
        I.fail_local("ibv_reg_mr(" + std::to_string(length) + " bytes) on device " + d.name + ": " +
                     std::strerror(e));
      }
      mrs.push_back(mr);
    }
    auto r = std::make_unique<Region>();
    r->seg = Segment{n, a, length, std::string(location)};
    r->mrs = std::move(mrs);
    out = r->seg;
    I.regions_by_name[n] = r.get();
    I.regions[a] = std::move(r);
  }
  try {
    I.publish();
  } catch (...) {
    // Nothing left half-registered: undo, then report.
    std::lock_guard lk(I.mu);
    auto it = I.regions.find(a);
    for (ibv_mr* mr : it->second->mrs) ibv_dereg_mr(mr);
    I.regions_by_name.erase(out.name);
    I.regions.erase(it);
    throw;
  }
  return out;
}

void Engine::deregister_memory(std::string_view name) {
  Impl& I = *impl_;
  {
    std::lock_guard lk(I.mu);
    auto it = I.regions_by_name.find(name);
    if (it == I.regions_by_name.end())
      throw std::invalid_argument("kv::Engine::deregister_memory ('" + I.name + "'): no segment '" +
                                  std::string(name) + "'");
    Region* r = it->second;
    if (r->inflight > 0)
      throw std::invalid_argument("kv::Engine::deregister_memory ('" + I.name + "'): segment '" +
                                  std::string(name) + "' is in use by " +
                                  std::to_string(r->inflight) + " transfer slice(s)");
    if (--r->refs > 0) return;
    for (ibv_mr* mr : r->mrs) ibv_dereg_mr(mr);
    const uint64_t a = r->seg.addr;
    I.regions_by_name.erase(it);
    I.regions.erase(a);
  }
  I.publish();
}

std::vector<Segment> Engine::segments() const {
  std::lock_guard lk(impl_->mu);
  std::vector<Segment> out;
  for (const auto& [n, r] : impl_->regions_by_name) out.push_back(r->seg);
  return out;
}

// ---- peers --------------------------------------------------------------------------------

SegmentHandle Engine::open_segment(std::string_view peer, std::string_view segment) {
  Impl& I = *impl_;
  const std::string p(peer);
  const std::string who =
      "kv engine '" + I.name + "': open_segment('" + p + "', '" + std::string(segment) + "')";
  std::optional<std::string> text = I.store->get(kRecordPrefix + p);
  if (!text) throw KvError(who + ": no engine '" + p + "' in " + I.store->describe(), p);
  PeerRecord rec;
  try {
    rec = detail::parse_record(*text);
  } catch (const std::exception& e) {
    throw KvError(who + ": " + e.what(), p);
  }
  size_t i = 0;
  while (i < rec.segments.size() && rec.segments[i].name != segment) ++i;
  if (i == rec.segments.size())
    throw KvError(who + ": peer '" + p + "' has no segment '" + std::string(segment) + "'", p);
  std::unique_lock lk(I.mu);
  I.ensure_connected(lk, p, &rec);
  const SegmentHandle h = I.next_handle++;
  I.open_segments[h] = Impl::OpenSegment{p, rec.segments[i], rec.rkeys[i]};
  return h;
}

Segment Engine::segment_info(SegmentHandle handle) const {
  std::lock_guard lk(impl_->mu);
  auto it = impl_->open_segments.find(handle);
  if (it == impl_->open_segments.end())
    throw std::invalid_argument("kv::Engine::segment_info: unknown segment handle " +
                                std::to_string(handle));
  return it->second.seg;
}

void Engine::close_segment(SegmentHandle handle) {
  std::lock_guard lk(impl_->mu);
  if (!impl_->open_segments.erase(handle))
    throw std::invalid_argument("kv::Engine::close_segment: unknown segment handle " +
                                std::to_string(handle));
}

void Engine::watch_peer(std::string_view peer) {
  {
    std::lock_guard lk(impl_->mu);
    auto it = impl_->peers.find(peer);
    if (it == impl_->peers.end()) return;
    const Peer& p = *it->second;
    if (p.state != detail::PeerState::kConnected) {
      // A wait that starts after the connection failed (its own flag could not know it was
      // ever up) still ends: before, kv-demo's decode waited 120 s for the next request of a
      // prefill killed while decode's last notification to it was in flight.
      if (p.lost && p.state != detail::PeerState::kConnecting) throw impl_->broken_error(p);
      return;
    }
  }
  check_peer(peer);  // connected: a probe (throws naming the peer when it does not answer)
}

bool Engine::connected(std::string_view peer) const {
  std::lock_guard lk(impl_->mu);
  auto it = impl_->peers.find(peer);
  return it != impl_->peers.end() && it->second->state == detail::PeerState::kConnected;
}

std::vector<PeerQp> Engine::peer_qps(std::string_view peer) const {
  std::lock_guard lk(impl_->mu);
  std::vector<PeerQp> out;
  auto it = impl_->peers.find(peer);
  if (it == impl_->peers.end() || it->second->state != detail::PeerState::kConnected) return out;
  for (const detail::Qp* q : it->second->qps) {
    ibv_qp_attr a{};
    ibv_qp_init_attr init{};
    if (ibv_query_qp(q->qp, &a, IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_MAX_QP_RD_ATOMIC, &init))
      continue;
    out.push_back(PeerQp{impl_->context.devs[q->dev].name, q->qp->qp_num, a.dest_qp_num,
                         128u << a.path_mtu, a.max_rd_atomic, q->window,
                         it->second->path_probes >= detail::kPathProbes
                             ? it->second->path_rtt
                             : std::chrono::nanoseconds{0}});
  }
  return out;
}

void Engine::check_peer(std::string_view peer) {
  Impl& I = *impl_;
  std::unique_lock lk(I.mu);
  auto it = I.peers.find(peer);
  const std::string who = "kv engine '" + I.name + "': peer '" + std::string(peer) + "'";
  if (it == I.peers.end() || it->second->state != detail::PeerState::kConnected)
    throw KvError(who + ": not connected" +
                      (it != I.peers.end() && !it->second->broken_reason.empty()
                           ? " (" + it->second->broken_reason + ")"
                           : std::string()),
                  std::string(peer));
  Peer& p = *it->second;
  I.post_probe(p);
  const uint64_t mine = p.probes_sent;
  const auto bound = 2 * I.retry_bound() + std::chrono::seconds(1);
  const bool answered = clock::wait_for(I.cv, lk, bound, [&] {
    return p.probes_done >= mine || p.state != detail::PeerState::kConnected;
  });
  if (p.state != detail::PeerState::kConnected) throw I.broken_error(p);
  if (!answered)
    throw KvError(who + ": no answer to a probe within " + std::to_string(bound.count()) + " ms",
                  p.name);
}

}  // namespace softrdma::kv
