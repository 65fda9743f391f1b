// wan-study: one process of the training-vs-inference study over an emulated wide-area link
// (docs/wide-area.md, "The study"). bench/wan_study.sh starts the processes — each with its
// own device address (SOFTRDMA_ADDR), the link topology (SOFTRDMA_WAN), its site
// (SOFTRDMA_CCL_SITE) and the torchrun variables RANK / WORLD_SIZE / MASTER_ADDR /
// MASTER_PORT — and collects the one CSV line rank 0 prints.
//
//   wan_study train --mode ring|hier|hier-bf16|local-sgd [--bytes B] [--steps N]
//                   [--compute-ms C] [--sync-every H]
//     data-parallel training steps: each step sleeps C ms ("compute") and then AllReduces a
//     float32 gradient of B bytes (sum); local-sgd AllReduces only every H-th step
//     (DiLoCo-style outer synchronisation, Douillard et al. 2023), with the hierarchical
//     AllReduce. Prints: train,<mode>,<bytes>,<steps>,<compute_ms>,<step_ms>,<comm_ms>,
//     <comm_share> — step_ms the mean wall time per step (ms), comm_ms its mean
//     communicating part (ms), comm_share = comm_ms / step_ms.
//
//   wan_study kv --layout whole|layer [--layers L] [--bytes-per-token T] [--tokens K]
//                [--layer-ms C]
//     KV-cache hand-off, 2 ranks: rank 0 (prefill, site A) computes L layers of C ms each and
//     sends each layer's K·T/L bytes to rank 1 (decode, site B) — as each layer finishes
//     (layer) or all at once after the last one (whole). The transfer is ccl's Send/Recv:
//     RDMA WRITE over an RC QP (ccl/verbs_credit_ring.cpp). Prints: kv,<layout>,<bytes>,
//     <layers>,<layer_ms>,<handoff_ms> — handoff_ms = the time from the end of prefill's last
//     layer to the decode side holding the whole cache, i.e. what the hand-off adds to the
//     time to first token. Both processes read the same host's CLOCK_MONOTONIC (divided by
//     SOFTRDMA_TDF under time dilation: base/clock.h), so their timestamps compare directly (two
//     hosts would need a clock synchronisation).
//
//   wan_study model kv|train|tables ...
//     the performance model's predictions, no device needed (model_cli.h, model.h).
//
// Errors: bad options print a message and exit 2; a failed transfer exits 1.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "ccl/bootstrap.h"
#include "ccl/ccl.h"
#include "tools/wan_study/model_cli.h"

namespace {

using softrdma::ccl::Algorithm;
using softrdma::ccl::Communicator;
using softrdma::ccl::Config;
using softrdma::ccl::DataType;
using softrdma::ccl::RedOp;
using softrdma::ccl::WanCompression;
using Clock = softrdma::clock::Steady;  // virtual under time dilation (base/clock.h)

double ms_since(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

struct Options {
  std::string command;
  std::string mode = "ring";     // train
  std::string layout = "layer";  // kv
  size_t bytes = 4 << 20;        // train: gradient bytes
  int steps = 10;
  double compute_ms = 50;
  int sync_every = 4;
  int layers = 32;
  size_t bytes_per_token = 128 * 1024;  // Llama-3-8B, bf16
  size_t tokens = 2048;
  double layer_ms = 2;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "wan_study: %s\n"
               "usage: wan_study train --mode ring|hier|hier-bf16|local-sgd [--bytes B] "
               "[--steps N] [--compute-ms C] [--sync-every H]\n"
               "       wan_study kv --layout whole|layer [--layers L] [--bytes-per-token T] "
               "[--tokens K] [--layer-ms C]\n"
               "       wan_study model kv|train|tables ... (the performance model; --help)\n"
               "Run one process per rank with the torchrun variables (RANK, WORLD_SIZE, "
               "MASTER_ADDR, MASTER_PORT); bench/wan_study.sh does it.\n",
               why.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  if (argc < 2) usage("no command");
  o.command = argv[1];
  if (o.command != "train" && o.command != "kv") usage("unknown command '" + o.command + "'");
  for (int i = 2; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) usage(k + " needs a value");
    const std::string v = argv[++i];
    try {
      if (k == "--mode")
        o.mode = v;
      else if (k == "--layout")
        o.layout = v;
      else if (k == "--bytes")
        o.bytes = std::stoull(v);
      else if (k == "--steps")
        o.steps = std::stoi(v);
      else if (k == "--compute-ms")
        o.compute_ms = std::stod(v);
      else if (k == "--sync-every")
        o.sync_every = std::stoi(v);
      else if (k == "--layers")
        o.layers = std::stoi(v);
      else if (k == "--bytes-per-token")
        o.bytes_per_token = std::stoull(v);
      else if (k == "--tokens")
        o.tokens = std::stoull(v);
      else if (k == "--layer-ms")
        o.layer_ms = std::stod(v);
      else
        usage("unknown option " + k);
    } catch (const std::logic_error&) {
      usage("bad value '" + v + "' for " + k);
    }
  }
  if (o.mode != "ring" && o.mode != "hier" && o.mode != "hier-bf16" && o.mode != "local-sgd")
    usage("unknown --mode '" + o.mode + "'");
  if (o.layout != "whole" && o.layout != "layer") usage("unknown --layout '" + o.layout + "'");
  if (o.steps < 1 || o.sync_every < 1 || o.layers < 1 || o.bytes < 4 || o.tokens < 1 ||
      o.compute_ms < 0 || o.layer_ms < 0)
    usage("--steps, --sync-every, --layers, --tokens ≥ 1, --bytes ≥ 4, times ≥ 0");
  return o;
}

void sleep_ms(double ms) {
  softrdma::clock::sleep_for(std::chrono::duration<double, std::milli>(ms));
}

int train(const Options& o) {
  Config cfg = Config::from_environment();
  cfg.algorithm = o.mode == "ring" ? Algorithm::kRing : Algorithm::kHierarchical;
  cfg.wan_compress = o.mode == "hier-bf16" ? WanCompression::kBfloat16 : WanCompression::kNone;
  auto comm = softrdma::ccl::init_from_environment(cfg);
  const size_t count = o.bytes / sizeof(float);
  std::vector<float> grad(count);
  for (size_t i = 0; i < count; ++i) grad[i] = static_cast<float>(i % 97) * 0.01f;
  // One untimed AllReduce: connections, registrations and the site exchange.
  comm->all_reduce(grad.data(), grad.data(), count, DataType::kFloat32, RedOp::kAvg);
  comm->barrier();
  double comm_ms = 0;
  const auto t0 = Clock::now();
  for (int s = 1; s <= o.steps; ++s) {
    sleep_ms(o.compute_ms);
    if (o.mode == "local-sgd" && s % o.sync_every != 0) continue;
    const auto c0 = Clock::now();
    comm->all_reduce(grad.data(), grad.data(), count, DataType::kFloat32, RedOp::kAvg);
    comm_ms += ms_since(c0, Clock::now());
  }
  const double total = ms_since(t0, Clock::now());
  // Rank 0's view; the slowest rank sets the pace, so take the maximum over ranks.
  double mine[2] = {total, comm_ms};
  double worst[2];
  comm->all_reduce(mine, worst, 2, DataType::kFloat64, RedOp::kMax);
  if (comm->rank() == 0)
    std::printf("train,%s,%zu,%d,%g,%.3f,%.3f,%.4f\n", o.mode.c_str(), o.bytes, o.steps,
                o.compute_ms, worst[0] / o.steps, worst[1] / o.steps, worst[1] / worst[0]);
  return 0;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// Prefill (rank 0); returns when its last layer finished computing (ns of clock::Steady).
// Layer by layer, a sender thread sends layer i as soon as the compute loop has finished it,
// so transfers overlap the following layers' compute.
int64_t prefill(Communicator& comm, const Options& o, std::vector<unsigned char>& cache,
                size_t layer_bytes) {
  if (o.layout == "whole") {
    sleep_ms(o.layer_ms * o.layers);
    const int64_t done = now_ns();
    comm.send(cache.data(), cache.size(), DataType::kUint8, 1);
    return done;
  }
  std::atomic<int> ready{0};
  std::exception_ptr failure;
  std::thread sender([&] {
    try {
      // Every layer finished since the last batch goes out in one group, so their WRITEs
      // are in flight together instead of one round trip each (a blocking Send waits for
      // the peer's acknowledgement).
      for (int sent = 0; sent < o.layers;) {
        const int now = ready.load(std::memory_order_acquire);
        if (now == sent) {
          sleep_ms(0.05);
          continue;
        }
        comm.group_start();
        for (int l = sent; l < now; ++l)
          comm.send(cache.data() + static_cast<size_t>(l) * layer_bytes, layer_bytes,
                    DataType::kUint8, 1);
        comm.group_end();
        sent = now;
      }
    } catch (...) {
      failure = std::current_exception();
    }
  });
  for (int l = 0; l < o.layers; ++l) {
    sleep_ms(o.layer_ms);
    ready.store(l + 1, std::memory_order_release);
  }
  const int64_t done = now_ns();
  sender.join();
  if (failure) std::rethrow_exception(failure);
  return done;
}

int kv(const Options& o) {
  auto comm = softrdma::ccl::init_from_environment();
  if (comm->size() != 2) usage("kv needs exactly 2 ranks (prefill = 0, decode = 1)");
  const size_t layer_bytes = o.tokens * o.bytes_per_token / static_cast<size_t>(o.layers);
  std::vector<unsigned char> cache(layer_bytes * static_cast<size_t>(o.layers));
  for (size_t i = 0; i < cache.size(); i += 4096) cache[i] = static_cast<unsigned char>(i >> 12);
  // Untimed: one small exchange over the path, then both start together.
  int64_t stamp = 0;
  if (comm->rank() == 0)
    comm->send(&stamp, 1, DataType::kInt64, 1);
  else
    comm->recv(&stamp, 1, DataType::kInt64, 0);
  comm->barrier();
  if (comm->rank() == 0) {
    stamp = prefill(*comm, o, cache, layer_bytes);
    comm->send(&stamp, 1, DataType::kInt64, 1);
    return 0;
  }
  std::fill(cache.begin(), cache.end(), 0);
  if (o.layout == "whole") {
    comm->recv(cache.data(), cache.size(), DataType::kUint8, 0);
  } else {
    // All receives posted at once: the sender never waits for the decode side to be ready.
    comm->group_start();
    for (int l = 0; l < o.layers; ++l)
      comm->recv(cache.data() + static_cast<size_t>(l) * layer_bytes, layer_bytes, DataType::kUint8,
                 0);
    comm->group_end();
  }
  const int64_t arrived = now_ns();
  comm->recv(&stamp, 1, DataType::kInt64, 0);
  for (size_t i = 0; i < cache.size(); i += 4096)
    if (cache[i] != static_cast<unsigned char>(i >> 12))
      throw std::runtime_error("decode: KV cache wrong at byte " + std::to_string(i));
  std::printf("kv,%s,%zu,%d,%g,%.3f\n", o.layout.c_str(), cache.size(), o.layers, o.layer_ms,
              static_cast<double>(arrived - stamp) / 1e6);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "model") == 0)
    return softrdma::wan_model::model_main(argc - 1, argv + 1);
  const Options o = parse(argc, argv);
  try {
    return o.command == "train" ? train(o) : kv(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wan_study %s: %s\n", o.command.c_str(), e.what());
    return 1;
  }
}
