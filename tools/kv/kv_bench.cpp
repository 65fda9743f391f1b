// kv-bench: throughput and latency of the kv engine, in the spirit of Mooncake's
// transfer_engine_bench (mooncake-transfer-engine/example/transfer_engine_bench.cpp: --mode
// initiator|target, --operation read|write, --block_size, --batch_size, --threads,
// --duration, --buffer_size, --segment_id, --local_server_name, --metadata_server) and of
// nixlbench's columns (block size, batch size, GB/s, avg / p99 latency).
//
//   kv-bench --mode target --serve-metadata            # one process: the target (and store)
//   kv-bench --mode initiator --operation write --block_size 16k,64k,1m,4m --qps 1,2,4,8
//
// The initiator runs every (QPs, block size) pair for --duration seconds: `threads` threads
// each submit batches of `batch_size` transfers of `block_size` bytes (distinct offsets of
// its share of the buffer, the same offsets on the target) and wait for each, keeping up to
// --inflight batches submitted (default 1: submit, wait, submit); with --iterations N each
// thread submits exactly N batches instead (a hand-off of a fixed size: a KV cache larger
// than the buffer is N batches over the same offsets again — the source bytes never change,
// so the target's bytes are the same whatever order the WRITEs land in). A QP count is
// a fresh engine "<name>-q<N>" (the QPs per peer are fixed per connection). Output, one row
// per pair: GB/s (1e9 B/s) over the row's wall time, the batch latency p50 / p99 (µs;
// submit to completion, so with --inflight > 1 it includes the wait behind earlier
// batches), and the row's time (ms, first submit to last completion; virtual under time
// dilation). The initiator finally tells the target to exit.
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <deque>
#include <mutex>
#include <thread>

#include "base/clock.h"
#include "kv/engine.h"
#include "tools/kv/tool_common.h"

namespace softrdma::kv {
namespace {

using Clock = softrdma::clock::Steady;  // virtual under time dilation (base/clock.h)
using namespace std::chrono_literals;

constexpr uint16_t kDefaultPort = 17711;
constexpr const char* kSegment = "kv-bench-buffer";
constexpr const char* kStop = "kv-bench: stop";

std::atomic<bool> g_interrupted{false};

struct Options {
  std::string mode = "initiator";
  std::string metadata;
  bool serve = false;
  std::string name;
  std::string segment_id = "target";
  std::string operation = "write";
  std::string block_sizes = "65536";
  std::string qps;
  uint64_t batch_size = 128;
  std::string buffer_size = "256m";
  uint32_t threads = 1;
  uint32_t inflight = 1;  ///< batches each thread keeps submitted before it waits
  /// Batches each thread submits per row; 0: as many as `duration` allows.
  uint64_t iterations = 0;
  double duration = 2.0;  ///< seconds per row (virtual under time dilation)
  bool keep_target = false;
  std::string devices;  ///< comma list of verbs device names; empty: SOFTRDMA_KV_IB_DEVICE / all
};

/// The engine options of this process: SOFTRDMA_KV_* with --devices over them.
EngineOptions engine_options(const Options& o) {
  EngineOptions e = EngineOptions::from_environment();
  if (!o.devices.empty()) {
    e.devices.clear();
    e.device.clear();
    for (size_t at = 0; at <= o.devices.size();) {
      const size_t comma = std::min(o.devices.find(',', at), o.devices.size());
      if (comma == at) throw std::invalid_argument("--devices: an empty device name");
      e.devices.push_back(o.devices.substr(at, comma - at));
      at = comma + 1;
    }
  }
  return e;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

struct Row {
  double gbps = 0;                ///< bytes moved ÷ the row's time, GB/s = 1e9 B/s
  double p50_us = 0, p99_us = 0;  ///< batch latency, submit to completion, µs
  uint64_t batches = 0;
  double ms = 0;  ///< the row's time, first submit to the last batch's completion, ms
};

int run_target(const Options& o, std::shared_ptr<MetadataStore> store) {
  const uint64_t size = tool::parse_size(o.buffer_size);
  std::vector<uint8_t> buf(size);
  Engine e(o.name.empty() ? "target" : o.name, store, engine_options(o));
  e.register_memory(buf.data(), buf.size(), "cpu:0", kSegment);
  fmt::print("kv-bench target '{}' on {} (devices {}): {} registered as '{}'; store {}\n", e.name(),
             e.device_address(), join(e.devices()), tool::size_text(size), kSegment,
             store->describe());
  std::fflush(stdout);
  while (!g_interrupted) {
    auto n = e.wait_notification(200ms);
    if (n && n->message == kStop) {
      fmt::print("kv-bench target: stopped by '{}'\n", n->peer);
      break;
    }
  }
  return 0;
}

Row run_row(Engine& e, SegmentHandle h, uint8_t* buf, uint64_t buf_size, Opcode op, uint64_t block,
            const Options& o) {
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> bytes{0};
  std::vector<std::vector<double>> lat(o.threads);
  std::vector<std::string> errors(o.threads);
  std::mutex failed_mu;  // guards `failed` and `finished`, which wake the waiting main thread
  std::condition_variable failed_cv;
  bool failed = false;
  uint32_t finished = 0;  // threads done with their --iterations
  const uint64_t share = buf_size / o.threads;
  const uint64_t slots = std::max<uint64_t>(1, share / block);
  auto worker = [&](uint32_t t) {
    uint64_t next = 0;
    std::vector<TransferRequest> reqs(o.batch_size);
    // Batches submitted and not yet waited for, oldest first, with their submit times.
    std::deque<std::pair<BatchId, Clock::time_point>> pending;
    auto finish_oldest = [&] {
      const auto [b, submitted] = pending.front();
      pending.pop_front();
      const BatchStatus s = e.wait(b, 60s);
      if (s.state != BatchState::kCompleted)
        throw std::runtime_error(s.state == BatchState::kFailed ? s.error : "batch timed out");
      e.free_batch(b);
      lat[t].push_back(std::chrono::duration<double, std::micro>(Clock::now() - submitted).count());
      bytes += block * o.batch_size;
    };
    try {
      for (uint64_t n = 0; !stop && (o.iterations == 0 || n < o.iterations); ++n) {
        while (pending.size() >= o.inflight) finish_oldest();
        for (uint64_t i = 0; i < o.batch_size; ++i) {
          const uint64_t off = t * share + (next++ % slots) * block;
          reqs[i] = TransferRequest{op, buf + off, h, off, block};
        }
        const auto submitted = Clock::now();
        const BatchId b = e.allocate_batch(reqs.size());
        e.submit_transfer(b, reqs);  // sliced at submit: reqs may be refilled at once
        pending.emplace_back(b, submitted);
      }
      while (!pending.empty()) finish_oldest();
      std::lock_guard lock(failed_mu);
      ++finished;
      failed_cv.notify_all();
    } catch (const std::exception& ex) {
      errors[t] = ex.what();
      // A failed batch ends the row now, not when --duration runs out.
      std::lock_guard lock(failed_mu);
      failed = true;
      failed_cv.notify_all();
    }
  };
  const auto t0 = Clock::now();
  std::vector<std::thread> ts;
  for (uint32_t t = 0; t < o.threads; ++t) ts.emplace_back(worker, t);
  {
    std::unique_lock lock(failed_mu);
    if (o.iterations > 0)  // each batch's wait is bounded (60 s): so is this one
      while (!g_interrupted &&
             !softrdma::clock::wait_for(failed_cv, lock, std::chrono::milliseconds(200),
                                        [&] { return failed || finished == o.threads; })) {
      }
    else
      softrdma::clock::wait_for(failed_cv, lock, std::chrono::duration<double>(o.duration),
                                [&] { return failed; });
  }
  stop = true;
  for (auto& t : ts) t.join();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  for (const std::string& err : errors)
    if (!err.empty()) throw std::runtime_error(err);
  std::vector<double> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  Row r;
  r.batches = all.size();
  r.gbps = static_cast<double>(bytes.load()) / secs / 1e9;
  r.ms = secs * 1e3;
  r.p50_us = tool::percentile(all, 0.50);
  r.p99_us = tool::percentile(all, 0.99);
  return r;
}

int run_initiator(const Options& o, std::shared_ptr<MetadataStore> store) {
  if (o.operation != "read" && o.operation != "write")
    throw std::invalid_argument("--operation must be read or write");
  const Opcode op = o.operation == "read" ? Opcode::kRead : Opcode::kWrite;
  const std::vector<uint64_t> blocks = tool::parse_sizes(o.block_sizes);
  const uint64_t size = tool::parse_size(o.buffer_size);
  EngineOptions base = engine_options(o);
  std::vector<uint64_t> qps_list;
  for (uint64_t q : tool::parse_sizes(o.qps.empty() ? std::to_string(base.qps_per_peer) : o.qps))
    qps_list.push_back(q);
  for (uint64_t b : blocks)
    if (b == 0 || b * o.threads > size)
      throw std::invalid_argument("--block_size " + std::to_string(b) + " × --threads exceeds " +
                                  "--buffer_size");
  std::vector<uint8_t> buf(size);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i * 131 + 7);
  const std::string name = o.name.empty() ? "initiator" : o.name;
  fmt::print(
      "# kv-bench: {} to '{}', batch {} × threads {} × in flight {}, {} s per row, slice {}, "
      "max_wr {}, devices {}\n",
      o.operation, o.segment_id, o.batch_size, o.threads, o.inflight, o.duration,
      tool::size_text(base.slice_bytes), base.max_wr,
      base.device_list().empty() ? std::string("all") : join(base.device_list()));
  fmt::print("{:>9} {:>11} {:>10} {:>4} {:>7} {:>9} {:>9} {:>10} {:>10} {:>10}\n", "operation",
             "block_size", "batch_size", "qps", "threads", "GB/s", "batches", "p50_us", "p99_us",
             "ms");
  std::fflush(stdout);
  std::unique_ptr<Engine> last;
  for (uint64_t q : qps_list) {
    EngineOptions opt = base;
    opt.qps_per_peer = static_cast<uint32_t>(q);
    last.reset();
    auto e = std::make_unique<Engine>(name + "-q" + std::to_string(q), store, opt);
    e->register_memory(buf.data(), buf.size());
    SegmentHandle h = 0;
    const auto until = Clock::now() + 30s;
    for (;;) {
      try {
        h = e->open_segment(o.segment_id, kSegment);
        break;
      } catch (const KvError&) {
        if (Clock::now() > until) throw;  // the target did not come up
        softrdma::clock::sleep_for(50ms);
      }
    }
    if (e->segment_info(h).length < size)
      throw std::invalid_argument("the target's buffer is smaller than --buffer_size");
    // The rows measure a connection whose windows are sized: the path's RTT is probed once
    // connected (EngineOptions::max_wr_from_path, five probes one after another; PeerQp's
    // path_rtt reads 0 until the windows are set); a row that began before would run its
    // first round trips at max_wr. At most 10 s.
    if (opt.max_wr_from_path)
      for (const auto probed = Clock::now() + 10s; Clock::now() < probed;) {
        const std::vector<PeerQp> qs = e->peer_qps(o.segment_id);
        if (!qs.empty() && qs[0].path_rtt.count() > 0) break;
        softrdma::clock::sleep_for(1ms);
      }
    for (uint64_t b : blocks) {
      const Row r = run_row(*e, h, buf.data(), size, op, b, o);
      fmt::print("{:>9} {:>11} {:>10} {:>4} {:>7} {:>9.3f} {:>9} {:>10.1f} {:>10.1f} {:>10.1f}\n",
                 o.operation, b, o.batch_size, q, o.threads, r.gbps, r.batches, r.p50_us, r.p99_us,
                 r.ms);
      std::fflush(stdout);
      if (g_interrupted) break;
    }
    last = std::move(e);
    if (g_interrupted) break;
  }
  if (!o.keep_target && last) last->notify(o.segment_id, kStop);
  return 0;
}

}  // namespace
}  // namespace softrdma::kv

int main(int argc, char** argv) {
  using namespace softrdma::kv;
  Options o;
  CLI::App app{
      "kv-bench: throughput and batch latency of the kv engine (kv/engine.h), in the spirit "
      "of Mooncake's transfer_engine_bench. Start a target, then an initiator:\n"
      "  kv-bench --mode target --serve-metadata &\n"
      "  kv-bench --mode initiator --operation write --block_size 16k,64k,1m,4m --qps 1,2,4,8\n"
      "Each process opens its own softrdma device (first free 127.0.0.x, or `softrdma run "
      "--addr`). GB/s = 1e9 B/s; latency = one batch, submit to completion (µs)."};
  app.add_option("--mode", o.mode, "target or initiator")
      ->check(CLI::IsMember({"target", "initiator"}))
      ->capture_default_str();
  app.add_option("--metadata,--metadata_server", o.metadata,
                 "store URI: tcp://host:port or file:///dir (default SOFTRDMA_KV_METADATA, "
                 "else tcp://127.0.0.1:17711)");
  app.add_flag("--serve-metadata", o.serve, "run the TCP store server at --metadata's address");
  app.add_option("--local_server_name", o.name,
                 "this engine's name (default: target / initiator; the initiator adds -q<QPs>)");
  app.add_option("--segment_id", o.segment_id, "initiator: the target engine's name")
      ->capture_default_str();
  app.add_option("--operation", o.operation, "read or write")
      ->check(CLI::IsMember({"read", "write"}))
      ->capture_default_str();
  app.add_option("--block_size", o.block_sizes, "bytes per transfer; a list runs one row each")
      ->capture_default_str();
  app.add_option("--batch_size", o.batch_size, "transfers per batch")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  app.add_option("--buffer_size", o.buffer_size, "bytes registered on each side")
      ->capture_default_str();
  app.add_option("--threads", o.threads, "submitting threads (initiator)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--inflight", o.inflight,
                 "batches each thread keeps submitted before waiting for the oldest (1: submit, "
                 "wait, submit: Mooncake's transfer_engine_bench; more keeps the QPs busy "
                 "between batches, as perftest's tx depth does)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--qps", o.qps,
                 "QPs per peer; a list runs one engine each (default SOFTRDMA_KV_QPS)");
  app.add_option("--duration", o.duration, "seconds per row")
      ->check(CLI::Range(0.01, 3600.0))
      ->capture_default_str();
  app.add_option("--iterations", o.iterations,
                 "batches each thread submits per row, in place of --duration (nixlbench's "
                 "--num_iter); the row's ms column is then a hand-off of threads × iterations × "
                 "batch_size × block_size bytes, first submit to last completion (0: "
                 "--duration)")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 32))
      ->capture_default_str();
  app.add_flag("--keep-target", o.keep_target, "do not tell the target to exit at the end");
  app.add_option("--devices", o.devices,
                 "verbs devices of this process's engine, a comma list such as srdma0,srdma1 "
                 "(default SOFTRDMA_KV_IB_DEVICE, else every active device; give a process "
                 "several with SOFTRDMA_ADDR=A,B)");
  CLI11_PARSE(app, argc, argv);
  std::signal(SIGINT, [](int) { g_interrupted = true; });
  std::signal(SIGTERM, [](int) { g_interrupted = true; });
  try {
    std::unique_ptr<TcpMetadataServer> server;
    auto store = tool::open_store(o.metadata, o.serve, kDefaultPort, server);
    return o.mode == "target" ? run_target(o, store) : run_initiator(o, store);
  } catch (const std::exception& e) {
    fmt::print(stderr, "kv-bench: {}\n", e.what());
    return 1;
  }
}
