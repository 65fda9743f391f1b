// kv::Engine's API (engine.h): options, the published record, memory registration, segment
// handles, batches (validation and slicing) and notifications. The device, QPs and
// handshake are in connection.cpp; the progress thread in progress.cpp.
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
using detail::Slice;

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
  o.max_rd_atomic = static_cast<uint32_t>(integer(params::kKvMaxRdAtomic, o.max_rd_atomic));
  o.ib_timeout = static_cast<uint8_t>(integer(params::kKvIbTimeout, o.ib_timeout));
  o.retry_cnt = static_cast<uint8_t>(integer(params::kKvIbRetryCnt, o.retry_cnt));
  o.host = params::text(params::kKvHost);
  o.spin = std::chrono::microseconds(integer(params::kKvSpinUs, o.spin.count()));
  if (std::string error; !params::read_flag(params::kKvPollBusy, o.poll_while_busy, error))
    throw std::invalid_argument(error);
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
  s << "handshake " << listen_host << " " << listen_port << "\n";
  s << "devices";
  for (const detail::Device& d : devs) s << " " << d.addr;
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
  return impl_->device_addr;
}

const std::vector<std::string>& Engine::devices() const {
  return impl_->device_names;
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
    for (const detail::Device& d : I.devs) {
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
    out.push_back(PeerQp{impl_->devs[q->dev].name, q->qp->qp_num, a.dest_qp_num, 128u << a.path_mtu,
                         a.max_rd_atomic});
  }
  return out;
}

// ---- batches ------------------------------------------------------------------------------

BatchId Engine::allocate_batch(size_t capacity) {
  if (capacity == 0)
    throw std::invalid_argument("kv::Engine::allocate_batch ('" + impl_->name +
                                "'): capacity must be at least 1");
  std::lock_guard lk(impl_->mu);
  auto b = std::make_unique<Batch>();
  b->id = impl_->next_batch++;
  b->capacity = capacity;
  const BatchId id = b->id;
  impl_->batches[id] = std::move(b);
  return id;
}

void Engine::submit_transfer(BatchId batch, std::span<const TransferRequest> requests,
                             std::string_view notify) {
  Impl& I = *impl_;
  const std::string who =
      "kv::Engine::submit_transfer ('" + I.name + "', batch " + std::to_string(batch) + ")";
  if (notify.size() > Engine::kMaxNotifyBytes)
    throw std::invalid_argument(who + ": a notification carries at most " +
                                std::to_string(Engine::kMaxNotifyBytes) + " bytes");
  std::unique_lock lk(I.mu);
  auto bit = I.batches.find(batch);
  if (bit == I.batches.end()) throw std::invalid_argument(who + ": unknown batch");
  Batch& b = *bit->second;
  if (b.transfers + requests.size() > b.capacity)
    throw std::invalid_argument(who + ": " + std::to_string(b.transfers + requests.size()) +
                                " transfers exceed the batch's capacity of " +
                                std::to_string(b.capacity));
  if (!b.notify.empty() && b.slices_left > 0)
    throw std::invalid_argument(who + ": the batch's notification is still pending");

  // Validate everything before anything is posted.
  struct Checked {
    const TransferRequest* req;
    Region* region;
    Impl::OpenSegment seg;
  };
  std::vector<Checked> checked;
  std::vector<std::string> peer_names;
  for (size_t i = 0; i < requests.size(); ++i) {
    const TransferRequest& r = requests[i];
    const std::string at = who + ": transfer " + std::to_string(i);
    auto sit = I.open_segments.find(r.target);
    if (sit == I.open_segments.end())
      throw std::invalid_argument(at + ": unknown segment handle " + std::to_string(r.target));
    const Impl::OpenSegment& seg = sit->second;
    if (r.length == 0) throw std::invalid_argument(at + ": zero length");
    if (r.offset > seg.seg.length || r.length > seg.seg.length - r.offset)
      throw std::invalid_argument(at + ": [" + std::to_string(r.offset) + ", +" +
                                  std::to_string(r.length) + ") is outside segment '" +
                                  seg.seg.name + "' of peer '" + seg.peer + "' (" +
                                  std::to_string(seg.seg.length) + " bytes)");
    if (r.opcode != Opcode::kRead && r.opcode != Opcode::kWrite)
      throw std::invalid_argument(at + ": opcode is neither READ nor WRITE");
    const uint64_t a = reinterpret_cast<uint64_t>(r.local);
    auto rit = I.regions.upper_bound(a);
    Region* region = nullptr;
    if (rit != I.regions.begin()) {
      Region* cand = std::prev(rit)->second.get();
      if (a >= cand->seg.addr && r.length <= cand->seg.addr + cand->seg.length - a) region = cand;
    }
    if (!region)
      throw std::invalid_argument(at + ": local memory [" + std::to_string(a) + ", +" +
                                  std::to_string(r.length) +
                                  ") is not inside one registered segment (register_memory)");
    checked.push_back({&r, region, seg});
    if (std::find(peer_names.begin(), peer_names.end(), seg.peer) == peer_names.end())
      peer_names.push_back(seg.peer);
  }
  if (!notify.empty() && peer_names.size() > 1)
    throw std::invalid_argument(who + ": a batch with a notification must target one peer");
  if (!notify.empty() && peer_names.empty())
    throw std::invalid_argument(who + ": a notification needs at least one transfer (use notify)");

  // Connect (may release mu for the handshake); a batch freed meanwhile is refused.
  for (const std::string& p : peer_names) I.ensure_connected(lk, p, nullptr);
  for (const std::string& p : peer_names) {
    const Peer& peer = *I.peers.find(p)->second;
    if (peer.state != detail::PeerState::kConnected)
      throw KvError(who + ": peer " + peer.desc + ": " + peer.broken_reason, p);
  }
  // The peer's QPs must land on devices its segment record has keys for (a peer that came
  // back with fewer devices than its record announced).
  for (const Checked& c : checked)
    for (const detail::Qp* q : I.peers.find(c.seg.peer)->second->qps)
      if (q->remote_dev >= c.seg.rkeys.size())
        throw KvError(who + ": segment '" + c.seg.seg.name + "' of peer '" + c.seg.peer +
                          "' has no key for its device " + std::to_string(q->remote_dev) +
                          " (open the segment again)",
                      c.seg.peer);
  if (I.batches.find(batch) == I.batches.end())
    throw std::invalid_argument(who + ": batch freed meanwhile");

  // Slice: every slice_bytes, a tail of at most a quarter slice joined to the previous slice
  // (Mooncake's slicing), capped by the port's largest message.
  const uint64_t slice = std::min<uint64_t>(I.opt.slice_bytes, I.max_msg);
  std::vector<detail::Qp*> touched;
  for (const Checked& c : checked) {
    Peer& p = *I.peers.find(c.seg.peer)->second;
    const TransferRequest& r = *c.req;
    uint64_t off = 0;
    while (off < r.length) {
      uint64_t len = std::min(slice, r.length - off);
      const uint64_t rest = r.length - off - len;
      if (rest > 0 && rest <= slice / 4 && len + rest <= I.max_msg) len += rest;
      Slice& s = b.slices.emplace_back();
      s.batch = &b;
      s.region = c.region;
      s.qp = p.qps[p.stripe++ % p.qps.size()];  // QP i is on local device i % devices
      s.local = reinterpret_cast<uint64_t>(r.local) + off;
      s.remote = c.seg.seg.addr + r.offset + off;
      s.lkey = c.region->mrs[s.qp->dev]->lkey;
      s.rkey = c.seg.rkeys[s.qp->remote_dev];
      s.length = static_cast<uint32_t>(len);
      s.opcode = r.opcode;
      s.qp->queue.push_back(&s);
      ++c.region->inflight;
      ++b.slices_left;
      if (std::find(touched.begin(), touched.end(), s.qp) == touched.end()) touched.push_back(s.qp);
      off += len;
    }
    ++b.transfers;
    b.bytes_total += r.length;
  }
  b.notify = std::string(notify);
  b.notify_peer = notify.empty() ? std::string() : peer_names.front();
  detail::DueCallbacks due;
  for (detail::Qp* q : touched) I.pump(*q, due);
  lk.unlock();
  for (auto& [cb, args] : due) cb(args.first, args.second);
}

BatchStatus Engine::get_status(BatchId batch) const {
  std::lock_guard lk(impl_->mu);
  auto it = impl_->batches.find(batch);
  if (it == impl_->batches.end())
    throw std::invalid_argument("kv::Engine::get_status ('" + impl_->name + "'): unknown batch " +
                                std::to_string(batch));
  return impl_->status_of(*it->second);
}

void Engine::on_complete(BatchId batch, BatchCallback callback) {
  std::unique_lock lk(impl_->mu);
  auto it = impl_->batches.find(batch);
  if (it == impl_->batches.end())
    throw std::invalid_argument("kv::Engine::on_complete ('" + impl_->name + "'): unknown batch " +
                                std::to_string(batch));
  const BatchStatus s = impl_->status_of(*it->second);
  if (s.state != BatchState::kPending) {
    lk.unlock();
    callback(batch, s);
    return;
  }
  it->second->callback = std::move(callback);
}

BatchStatus Engine::wait(BatchId batch, std::chrono::milliseconds timeout) {
  std::unique_lock lk(impl_->mu);
  const auto until = Clock::now() + timeout;
  for (;;) {
    auto it = impl_->batches.find(batch);
    if (it == impl_->batches.end())
      throw std::invalid_argument("kv::Engine::wait ('" + impl_->name + "'): unknown batch " +
                                  std::to_string(batch));
    BatchStatus s = impl_->status_of(*it->second);
    if (s.state != BatchState::kPending || it->second->transfers == 0) return s;
    if (clock::wait_until(impl_->cv, lk, until) == std::cv_status::timeout)
      return impl_->status_of(*impl_->batches.at(batch));
  }
}

void Engine::free_batch(BatchId batch) {
  std::lock_guard lk(impl_->mu);
  auto it = impl_->batches.find(batch);
  if (it == impl_->batches.end())
    throw std::invalid_argument("kv::Engine::free_batch ('" + impl_->name + "'): unknown batch " +
                                std::to_string(batch));
  if (it->second->slices_left > 0)
    throw std::invalid_argument("kv::Engine::free_batch ('" + impl_->name + "'): batch " +
                                std::to_string(batch) + " still has " +
                                std::to_string(it->second->slices_left) + " slice(s) in flight");
  impl_->batches.erase(it);
}

// ---- notifications ------------------------------------------------------------------------

void Engine::notify(std::string_view peer, std::string_view message) {
  Impl& I = *impl_;
  if (message.size() > kMaxNotifyBytes)
    throw std::invalid_argument("kv::Engine::notify ('" + I.name + "'): at most " +
                                std::to_string(kMaxNotifyBytes) + " bytes, got " +
                                std::to_string(message.size()));
  std::unique_lock lk(I.mu);
  Peer& p = I.ensure_connected(lk, std::string(peer), nullptr);
  p.pending_notify.emplace_back(message);
  detail::DueCallbacks due;
  I.post_notify(p, due);
  const bool broken = p.state == detail::PeerState::kBroken;
  const std::string error =
      "kv engine '" + I.name + "': notify to peer " + p.desc + ": " + p.broken_reason;
  lk.unlock();
  for (auto& [cb, args] : due) cb(args.first, args.second);
  if (broken) throw KvError(error, std::string(peer));
}

std::vector<Notification> Engine::get_notifications() {
  std::lock_guard lk(impl_->mu);
  std::vector<Notification> out(std::make_move_iterator(impl_->inbox.begin()),
                                std::make_move_iterator(impl_->inbox.end()));
  impl_->inbox.clear();
  return out;
}

std::optional<Notification> Engine::wait_notification(std::chrono::milliseconds timeout) {
  std::unique_lock lk(impl_->mu);
  if (!clock::wait_for(impl_->cv, lk, timeout, [&] { return !impl_->inbox.empty(); }))
    return std::nullopt;
  Notification n = std::move(impl_->inbox.front());
  impl_->inbox.pop_front();
  return n;
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
  if (p.state != detail::PeerState::kConnected)
    throw KvError("kv engine '" + I.name + "': peer " + p.desc + ": " + p.broken_reason, p.name);
  if (!answered)
    throw KvError(who + ": no answer to a probe within " + std::to_string(bound.count()) + " ms",
                  p.name);
}

}  // namespace softrdma::kv
