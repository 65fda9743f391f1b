// kv-demo: a prefill process hands each request's KV cache to a decode process, whole-cache
// (after the last layer's compute) and layer-wise (each layer as its compute finishes, vLLM
// connector style: kv/connector.h), and reports the hand-off time exposed to TTFT.
//
//   kv-demo --role both                     # forks the decode process, runs prefill here
//   kv-demo --role decode --serve-metadata &  kv-demo --role prefill   # two shells
//   kv-demo --describe --model llama3-70b --tokens 32768   # the layout only, nothing allocated
//
// Per request and layer, prefill "computes" the layer: it fills the request's blocks with
// fresh pseudo-random bytes, checksums each block (K and V apart), and sleeps out the rest
// of --layer_ms (the GPU's time). The checksums travel in the same batch as the layer, into
// a table on the decode side; decode recomputes every block's checksum and compares, so a
// byte lost or misplaced anywhere is reported. Exposed hand-off = time from the end of the
// last layer's compute to the moment decode holds the whole cache:
//   prefill's view: last compute → every WRITE of the request acknowledged (RC: an
//                   acknowledged WRITE is in decode's memory) — the figure summarised;
//   decode's view:  (last layer's notification − start notification) − compute time, a
//                   column only: the start notification's own delay shifts it (under load
//                   or sanitizers it can even go below zero).
#include <fmt/core.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstring>
#include <numeric>
#include <sstream>
#include <thread>

#include "base/clock.h"
#include "kv/connector.h"
#include "tools/kv/tool_common.h"

namespace softrdma::kv {
namespace {

using Clock = softrdma::clock::Steady;  // virtual under time dilation (base/clock.h)
using namespace std::chrono_literals;

constexpr uint16_t kDefaultPort = 17712;

struct Options {
  std::string role = "both";
  std::string metadata;
  bool serve = false;
  std::string model = "llama3-8b";
  uint64_t tokens = 2048;
  uint32_t block_tokens = 16;
  double layer_ms = 4.0;
  uint32_t requests = 5;
  std::string modes = "whole,layerwise";
  bool contiguous = false;
  bool describe = false;  ///< print the layout and exit
};

double ms_since(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

/// The bytes of one block: 64-bit words of a counter-based generator seeded by `seed`.
void fill_block(uint8_t* p, uint64_t bytes, uint64_t seed) {
  auto* w = reinterpret_cast<uint64_t*>(p);
  const uint64_t base = seed * 0x9e3779b97f4a7c15ull;
  for (uint64_t i = 0; i < bytes / 8; ++i) w[i] = (base + i) * 0xbf58476d1ce4e5b9ull;
}

/// A 64-bit checksum of a block (four multiply-xor lanes, combined).
uint64_t checksum(const uint8_t* p, uint64_t bytes) {
  uint64_t h[4] = {1, 2, 3, 4};
  const auto* w = reinterpret_cast<const uint64_t*>(p);
  const uint64_t n = bytes / 8;
  for (uint64_t i = 0; i + 3 < n; i += 4)
    for (int k = 0; k < 4; ++k) h[k] = (h[k] ^ w[i + k]) * 0x100000001b3ull;
  for (uint64_t i = n / 4 * 4; i < n; ++i) h[0] = (h[0] ^ w[i]) * 0x100000001b3ull;
  return h[0] ^ (h[1] << 1) ^ (h[2] << 2) ^ (h[3] << 3) ^ bytes;
}

struct Setup {
  PagedKvLayout layout;
  std::vector<uint32_t> local_blocks, remote_blocks;
  uint64_t table_entries() const {
    return uint64_t{layout.model().layers} * layout.model().parts() * layout.num_blocks();
  }
  uint64_t table_index(uint32_t layer, uint32_t part, uint32_t remote_block) const {
    return (uint64_t{layer} * layout.model().parts() + part) * layout.num_blocks() + remote_block;
  }
};

Setup make_setup(const Options& o) {
  const ModelShape& m = model_shape(o.model);
  const uint32_t n = PagedKvLayout(m, o.block_tokens, 1).blocks_for(o.tokens);
  Setup s{PagedKvLayout(m, o.block_tokens, n), {}, {}};
  for (uint32_t i = 0; i < n; ++i) {
    s.local_blocks.push_back(i);
    // Decode's block table: scattered (a permutation, as a paged allocator hands out) unless
    // --contiguous.
    s.remote_blocks.push_back(o.contiguous ? i
                                           : static_cast<uint32_t>((uint64_t{i} * 37 + 11) % n));
  }
  if (!o.contiguous && std::gcd(37u, n) != 1)  // keep it a permutation
    for (uint32_t i = 0; i < n; ++i) s.remote_blocks[i] = n - 1 - i;
  return s;
}

// Waits up to `timeout` for what `next(slice)` returns (a notification), probing `peer` every
// 200 ms (Engine::watch_peer throws KvError naming it when it died or stopped answering): a
// dead peer ends the wait within the RC retry bound, not after `timeout` (issue 21: prefill
// hung 95 s after decode was killed).
template <class Next>
auto wait_watching(Engine& e, const std::string& peer, std::chrono::milliseconds timeout,
                   Next&& next) -> decltype(next(timeout)) {
  const auto until = Clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    if (left.count() <= 0) return std::nullopt;
    if (auto n = next(std::min<std::chrono::milliseconds>(left, 200ms))) return n;
    e.watch_peer(peer);  // throws KvError naming a dead peer
  }
}

std::vector<std::string> split_words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

std::vector<std::string> mode_list(const Options& o) {
  std::vector<std::string> out;
  std::stringstream s(o.modes);
  for (std::string m; std::getline(s, m, ',');) {
    if (m != "whole" && m != "layerwise")
      throw std::invalid_argument("--modes: whole and/or layerwise, got '" + m + "'");
    out.push_back(m);
  }
  return out;
}

/// The run's first line: model, tokens, blocks, cache size (MiB = 2^20 B), compute per layer.
void print_header(const Setup& s, const Options& o) {
  const PagedKvLayout& L = s.layout;
  fmt::print(
      "# kv-demo: {} ({} layers, {} per token), {} tokens = {} blocks of {} tokens, "
      "cache {:.1f} MiB ({:.2f} MiB per layer); {} ms compute per layer; decode blocks {}\n",
      L.model().name, L.model().layers, tool::size_text(L.model().bytes_per_token()), o.tokens,
      L.num_blocks(), o.block_tokens, L.total_bytes() / 1048576.0, L.layer_bytes() / 1048576.0,
      o.layer_ms, o.contiguous ? "contiguous" : "scattered");
}

/// --describe: the header, then the layout as key=value (bytes; one transfer per block and
/// K/V part and layer: transfers = layers × parts × blocks), for scripts that size a
/// hand-off without allocating it (bench/kv_wan.sh).
int describe(const Options& o) {
  const Setup s = make_setup(o);
  const PagedKvLayout& L = s.layout;
  print_header(s, o);
  fmt::print("layout: cache_bytes={} block_bytes={} blocks={} layers={} parts={} transfers={}\n",
             L.total_bytes(), L.block_bytes(), L.num_blocks(), L.model().layers, L.model().parts(),
             uint64_t{L.model().layers} * L.model().parts() * L.num_blocks());
  return 0;
}

// ---- decode -------------------------------------------------------------------------------

int run_decode(const Options& o, std::shared_ptr<MetadataStore> store) {
  const Setup s = make_setup(o);
  std::vector<uint8_t> cache(s.layout.total_bytes());
  std::vector<uint64_t> table(s.table_entries());
  Engine e("decode", store);
  e.register_memory(cache.data(), cache.size(), "cpu:0", "kv-cache");
  e.register_memory(table.data(), table.size() * 8, "cpu:0", "kv-checksums");
  KvConsumer c(e);
  const uint32_t layers = s.layout.model().layers;
  for (;;) {
    auto start = wait_watching(e, "prefill", 120s, [&](auto t) { return c.wait_other(t); });
    if (!start) throw std::runtime_error("decode: no request from prefill within 120 s");
    const auto w = split_words(start->message);
    if (w.size() == 1 && w[0] == "kv-demo-stop") return 0;
    if (w.size() != 2 || w[0] != "kv-start")
      throw std::runtime_error("decode: unexpected message '" + start->message + "'");
    const auto t0 = Clock::now();
    const uint64_t req = std::stoull(w[1]);
    for (uint32_t l = 0; l < layers; ++l) c.wait_for_layer(req, l, start->peer, 60s);
    const double last_ms = ms_since(t0, Clock::now());
    auto done = wait_watching(e, "prefill", 60s, [&](auto t) { return c.wait_other(t); });
    if (!done) throw std::runtime_error("decode: no kv-done from prefill");
    const auto d = split_words(done->message);
    if (d.size() != 3 || d[0] != "kv-done" || d[1] != w[1])
      throw std::runtime_error("decode: unexpected message '" + done->message + "'");
    const double compute_ms = std::stod(d[2]);
    // Every block of every layer against the checksum that travelled with it.
    uint64_t bad = 0, checked = 0;
    for (uint32_t l = 0; l < layers; ++l)
      for (uint32_t part = 0; part < s.layout.model().parts(); ++part)
        for (uint32_t b : s.remote_blocks) {
          ++checked;
          if (checksum(cache.data() + s.layout.offset(l, part, b), s.layout.block_bytes()) !=
              table[s.table_index(l, part, b)])
            ++bad;
        }
    e.notify(start->peer,
             fmt::format("kv-verified {} {} {} {:.3f}", req, checked, bad, last_ms - compute_ms));
  }
}

// ---- prefill ------------------------------------------------------------------------------

struct Result {
  double compute_ms = 0, exposed_prefill_ms = 0, exposed_decode_ms = 0;
  uint64_t checked = 0, bad = 0;
};

Result prefill_request(Engine& e, const Setup& s, const Options& o, uint64_t req, bool layerwise,
                       uint8_t* cache, uint64_t* table, SegmentHandle remote_cache,
                       SegmentHandle remote_table) {
  const PagedKvLayout& L = s.layout;
  const uint32_t layers = L.model().layers, parts = L.model().parts();
  KvRequest r{req, "decode", remote_cache, s.local_blocks, s.remote_blocks};
  KvProducer p(e, L, cache);
  e.notify("decode", fmt::format("kv-start {}", req));
  const auto t0 = Clock::now();
  for (uint32_t l = 0; l < layers; ++l) {
    // The layer's compute: fresh bytes in every block, their checksums, the rest of the
    // layer's time asleep (the accelerator's share).
    for (uint32_t part = 0; part < parts; ++part)
      for (size_t i = 0; i < s.local_blocks.size(); ++i) {
        uint8_t* blk = cache + L.offset(l, part, s.local_blocks[i]);
        fill_block(blk, L.block_bytes(), (req << 40) ^ (uint64_t{l} << 20) ^ (part << 16) ^ i);
        table[s.table_index(l, part, s.remote_blocks[i])] = checksum(blk, L.block_bytes());
      }
    softrdma::clock::sleep_until(
        t0 + std::chrono::duration_cast<std::chrono::nanoseconds>(
                 std::chrono::duration<double, std::milli>(o.layer_ms * (l + 1))));
    if (layerwise) {
      const uint64_t row = s.table_index(l, 0, 0);
      const TransferRequest sums{Opcode::kWrite, table + row, remote_table, row * 8,
                                 uint64_t{parts} * L.num_blocks() * 8};
      p.save_layer(r, l, std::span(&sums, 1));
    }
  }
  const auto tc = Clock::now();
  if (!layerwise)
    for (uint32_t l = 0; l < layers; ++l) {
      const uint64_t row = s.table_index(l, 0, 0);
      const TransferRequest sums{Opcode::kWrite, table + row, remote_table, row * 8,
                                 uint64_t{parts} * L.num_blocks() * 8};
      p.save_layer(r, l, std::span(&sums, 1));
    }
  p.wait_for_save(120s);
  const auto td = Clock::now();
  Result res;
  res.compute_ms = ms_since(t0, tc);
  res.exposed_prefill_ms = ms_since(tc, td);
  e.notify("decode", fmt::format("kv-done {} {:.3f}", req, res.compute_ms));
  auto v = wait_watching(e, "decode", 120s, [&](auto t) { return e.wait_notification(t); });
  if (!v) throw std::runtime_error("prefill: decode did not verify request " + std::to_string(req));
  const auto w = split_words(v->message);
  if (w.size() != 5 || w[0] != "kv-verified" || std::stoull(w[1]) != req)
    throw std::runtime_error("prefill: unexpected message '" + v->message + "'");
  res.checked = std::stoull(w[2]);
  res.bad = std::stoull(w[3]);
  res.exposed_decode_ms = std::stod(w[4]);
  return res;
}

int run_prefill(const Options& o, std::shared_ptr<MetadataStore> store) {
  const Setup s = make_setup(o);
  const PagedKvLayout& L = s.layout;
  std::vector<uint8_t> cache(L.total_bytes());
  std::vector<uint64_t> table(s.table_entries());
  Engine e("prefill", store);
  e.register_memory(cache.data(), cache.size(), "cpu:0", "kv-cache");
  e.register_memory(table.data(), table.size() * 8, "cpu:0", "kv-checksums");
  SegmentHandle rc = 0, rt = 0;
  for (const auto until = Clock::now() + 60s;;) {
    try {
      rc = e.open_segment("decode", "kv-cache");
      rt = e.open_segment("decode", "kv-checksums");
      break;
    } catch (const KvError&) {
      if (Clock::now() > until) throw;
      softrdma::clock::sleep_for(50ms);
    }
  }
  print_header(s, o);
  fmt::print("{:>10} {:>4} {:>11} {:>16} {:>15} {:>15}\n", "mode", "req", "compute_ms",
             "exposed_prefill", "exposed_decode", "blocks_ok");
  std::fflush(stdout);
  struct Summary {
    std::string mode;
    std::vector<double> exposed;
    uint64_t bad = 0;
  };
  std::vector<Summary> sums;
  uint64_t req = 0;
  for (const std::string& mode : mode_list(o)) {
    Summary sm{mode, {}, 0};
    for (uint32_t i = 0; i < o.requests; ++i) {
      const Result r =
          prefill_request(e, s, o, ++req, mode == "layerwise", cache.data(), table.data(), rc, rt);
      fmt::print("{:>10} {:>4} {:>11.1f} {:>13.2f} ms {:>12.2f} ms {:>9}/{}\n", mode, req,
                 r.compute_ms, r.exposed_prefill_ms, r.exposed_decode_ms, r.checked - r.bad,
                 r.checked);
      std::fflush(stdout);
      sm.exposed.push_back(r.exposed_prefill_ms);
      sm.bad += r.bad;
    }
    sums.push_back(sm);
  }
  e.notify("decode", "kv-demo-stop");
  // One layer's transfer time, from the whole-cache runs: their exposed time is the whole
  // cache's transfer.
  double whole = 0, layer_transfer = 0;
  fmt::print(
      "\nTTFT hand-off exposed beyond the last layer's compute (last WRITE acknowledged, "
      "median):\n");
  for (Summary& sm : sums) {
    const double med = tool::percentile(sm.exposed, 0.5);
    if (sm.mode == "whole") {
      whole = med;
      layer_transfer = med / L.model().layers;
    }
    fmt::print(
        "  {:<10} {:8.2f} ms{}\n", sm.mode, med,
        sm.mode == "layerwise" && layer_transfer > 0
            ? fmt::format("  = {:.2f} layer transfers ({:.2f} ms each); whole-cache {:.2f} ms",
                          med / layer_transfer, layer_transfer, whole)
            : std::string());
  }
  uint64_t bad = 0;
  for (const Summary& sm : sums) bad += sm.bad;
  fmt::print("blocks verified by decode: {}\n",
             bad == 0 ? "all match" : std::to_string(bad) + " BAD");
  return bad == 0 ? 0 : 1;
}

}  // namespace
}  // namespace softrdma::kv

int main(int argc, char** argv) {
  using namespace softrdma::kv;
  Options o;
  CLI::App app{
      "kv-demo: prefill → decode KV-cache hand-off over the kv engine, whole-cache vs "
      "layer-wise, every block checksummed and verified by decode.\n"
      "  kv-demo --role both            (forks the decode process; store on 127.0.0.1:17712)\n"
      "  kv-demo --role decode --serve-metadata &   kv-demo --role prefill"};
  app.add_option("--role", o.role, "prefill, decode, or both (forks decode)")
      ->check(CLI::IsMember({"prefill", "decode", "both"}))
      ->capture_default_str();
  app.add_option("--metadata", o.metadata,
                 "store URI (default SOFTRDMA_KV_METADATA, else tcp://127.0.0.1:17712)");
  app.add_flag("--serve-metadata", o.serve,
               "run the TCP store server (decode does with --role both)");
  app.add_option("--model", o.model, "llama3-8b, llama3-70b, qwen2.5-7b, deepseek-v3")
      ->capture_default_str();
  app.add_option("--tokens", o.tokens, "prompt tokens")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--block_tokens", o.block_tokens, "tokens per paged block")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--layer_ms", o.layer_ms, "synthetic compute time per layer (ms)")
      ->check(CLI::Range(0.0, 10000.0))
      ->capture_default_str();
  app.add_option("--requests", o.requests, "requests per mode")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--modes", o.modes, "whole and/or layerwise")->capture_default_str();
  app.add_flag("--contiguous", o.contiguous,
               "decode's blocks in the same order as prefill's (default: scattered)");
  app.add_flag("--describe", o.describe,
               "print the cache's layout (bytes per block, transfers) and exit, allocating "
               "nothing");
  CLI11_PARSE(app, argc, argv);
  try {
    if (o.describe) return describe(o);
    if (o.role == "both") {
      std::fflush(stdout);
      const pid_t child = fork();
      if (child == 0) {
        int code = 1;
        try {
          Options d = o;
          d.serve = true;
          std::unique_ptr<TcpMetadataServer> server;
          auto store = tool::open_store(d.metadata, true, kDefaultPort, server);
          code = run_decode(d, store);
        } catch (const std::exception& e) {
          fmt::print(stderr, "kv-demo decode: {}\n", e.what());
        }
        std::fflush(stdout);
        _exit(code);
      }
      std::unique_ptr<TcpMetadataServer> none;
      int code = 1;
      try {
        auto store = tool::open_store(o.metadata, false, kDefaultPort, none);
        code = run_prefill(o, store);
      } catch (const std::exception& e) {
        fmt::print(stderr, "kv-demo prefill: {}\n", e.what());
        kill(child, SIGKILL);
      }
      int st = 0;
      waitpid(child, &st, 0);
      return code != 0 ? code : (WIFEXITED(st) ? WEXITSTATUS(st) : 1);
    }
    std::unique_ptr<TcpMetadataServer> server;
    auto store = tool::open_store(o.metadata, o.serve, kDefaultPort, server);
    return o.role == "decode" ? run_decode(o, store) : run_prefill(o, store);
  } catch (const std::exception& e) {
    fmt::print(stderr, "kv-demo: {}\n", e.what());
    return 1;
  }
}
