// `wan_study model ...`: the performance model's command line and the study's tables
// (docs/wide-area.md, "The study"; formulas in model.h).
#include "tools/wan_study/model_cli.h"

#include <fmt/format.h>
#include <fmt/os.h>
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "tools/wan_study/model.h"

namespace softrdma::wan_model {

namespace {

Recovery parse_recovery(const std::string& s) {
  if (s == "gbn" || s == "go-back-n") return Recovery::kGoBackN;
  if (s == "selective") return Recovery::kSelective;
  throw std::invalid_argument("unknown recovery '" + s + "' (gbn|selective)");
}

const char* recovery_name(Recovery r) {
  return r == Recovery::kGoBackN ? "gbn" : "selective";
}

const char* layout_name(Layout l) {
  return l == Layout::kWhole ? "whole" : "layer";
}

/// The link options every subcommand shares.
struct LinkOptions {
  double rate = 10, rtt = 10, loss_pct = 0, cap = 0;
  bool warm = false;
  std::string recovery = "selective";
  uint32_t mtu = 4096;
  void add(CLI::App* app) {
    app->add_option("--rate", rate, "WAN rate, Gbit/s")->check(CLI::PositiveNumber);
    app->add_option("--rtt", rtt, "WAN round trip, ms")->check(CLI::NonNegativeNumber);
    app->add_option("--loss", loss_pct, "random loss per packet, %")->check(CLI::Range(0.0, 99.0));
    app->add_option("--recovery", recovery, "gbn|selective");
    app->add_option("--mtu", mtu, "payload bytes per packet");
    app->add_option("--inflight-cap", cap, "bytes in flight per peer at most (0: none)");
    app->add_flag("--warm", warm, "the QP's window is at one BDP already (no ramp)");
  }
  Link link() const {
    Link l;
    l.rate_gbps = rate;
    l.rtt_ms = rtt;
    l.loss = loss_pct / 100;
    l.recovery = parse_recovery(recovery);
    l.mtu = mtu;
    l.inflight_cap_bytes = cap;
    l.warm = warm;
    return l;
  }
};

// ---- the tables --------------------------------------------------------------------------

const double kRates[] = {1, 10, 100, 400};
const int kBits[] = {16, 8, 4};

/// The link of a table row: `rate` Gbit/s over route `r` (its RTT), random loss `loss` (a
/// fraction), recovery mode `rec`, a warm QP (window at one BDP) or a fresh one.
Link route_link(double rate, const Route& r, double loss, Recovery rec, bool warm) {
  Link l;
  l.rate_gbps = rate;
  l.rtt_ms = r.rtt_ms;
  l.loss = loss;
  l.recovery = rec;
  l.warm = warm;
  return l;
}

/// kv_max_context.csv: the largest context whose hand-off fits 200 ms of added TTFT, per
/// model × KV precision × layout × rate × route, lossless and selective, over a warm QP
/// (window at one BDP: a prefill→decode connection in use) and, for bf16, a fresh one
/// (cold: the window ramps); plus a lossy slice (0.1 % and 1 %, go-back-N and selective,
/// bf16, layer-wise, warm). fits_at_max_tokens: whether 128 K tokens fit too (streaming can
/// hide a long prefill's cache where a shorter one does not fit: the attention FLOPs grow
/// with the square of the context, the cache linearly).
void max_context_table(const std::string& dir, const Gpu& gpu) {
  auto out = fmt::output_file(dir + "/kv_max_context.csv");
  out.print(
      "model,kv_bits,layout,window,rate_gbps,route,rtt_ms,loss_pct,recovery,max_context_tokens,"
      "kv_bytes_at_max,added_ms_at_max,prefill_ms_at_max,fits_at_131072\n");
  auto row = [&](const ModelShape& m, int bits, Layout lay, bool warm, double rate, const Route& r,
                 double loss, Recovery rec) {
    const Link l = route_link(rate, r, loss, rec, warm);
    const double t = max_context_tokens(m, bits, lay, l, gpu);
    const Handoff h = t > 0 ? kv_handoff(m, t, bits, lay, l, gpu) : Handoff{};
    const bool fits_max = kv_handoff(m, 131072, bits, lay, l, gpu).added_ms <= 200;
    out.print("{},{},{},{},{},{},{:.2f},{},{},{},{:.0f},{:.1f},{:.1f},{}\n", m.name, bits,
              layout_name(lay), warm ? "warm" : "cold", rate, r.name, r.rtt_ms, loss * 100,
              recovery_name(rec), t, h.bytes, h.added_ms, h.prefill_ms, fits_max ? 1 : 0);
  };
  for (const auto& m : study_models())
    for (int bits : kBits)
      for (Layout lay : {Layout::kWhole, Layout::kLayer})
        for (bool warm : {true, false}) {
          if (!warm && bits != 16) continue;
          for (double rate : kRates)
            for (const auto& r : study_routes())
              row(m, bits, lay, warm, rate, r, 0, Recovery::kSelective);
        }
  for (const auto& m : study_models())
    for (double loss : {0.001, 0.01})
      for (Recovery rec : {Recovery::kGoBackN, Recovery::kSelective})
        for (double rate : kRates)
          for (const auto& r : study_routes()) row(m, 16, Layout::kLayer, true, rate, r, loss, rec);
}

/// kv_production.csv: prefill time, cache size and the KV production rate (Gbit/s) per
/// model × context × precision.
void production_table(const std::string& dir, const Gpu& gpu) {
  auto out = fmt::output_file(dir + "/kv_production.csv");
  out.print("model,tokens,kv_bits,prefill_ms,kv_bytes,bytes_per_token,produce_gbps\n");
  for (const auto& m : study_models())
    for (double t = 1024; t <= 131072; t *= 2)
      for (int bits : kBits) {
        const double b = kv_bytes(m, t, bits), p = prefill_ms(m, t, gpu);
        out.print("{},{:.0f},{},{:.2f},{:.0f},{:.0f},{:.2f}\n", m.name, t, bits, p, b, b / t,
                  b * 8 / (p * 1e6));
      }
}

/// kv_handoff.csv: added TTFT per model × context × layout × rate × route (bf16, lossless,
/// warm and cold QP) and, for Llama-3-8B at 16 K tokens, per loss × recovery (warm).
void handoff_table(const std::string& dir, const Gpu& gpu) {
  auto out = fmt::output_file(dir + "/kv_handoff.csv");
  out.print(
      "model,tokens,kv_bits,layout,window,rate_gbps,route,rtt_ms,loss_pct,recovery,kv_bytes,"
      "prefill_ms,added_ms,ideal_ms\n");
  auto row = [&](const ModelShape& m, double t, Layout lay, bool warm, double rate, const Route& r,
                 double loss, Recovery rec) {
    const Link l = route_link(rate, r, loss, rec, warm);
    const Handoff h = kv_handoff(m, t, 16, lay, l, gpu);
    out.print("{},{:.0f},16,{},{},{},{},{:.2f},{},{},{:.0f},{:.1f},{:.1f},{:.1f}\n", m.name, t,
              layout_name(lay), warm ? "warm" : "cold", rate, r.name, r.rtt_ms, loss * 100,
              recovery_name(rec), h.bytes, h.prefill_ms, h.added_ms, h.ideal_ms);
  };
  for (const auto& m : study_models())
    for (double t = 1024; t <= 131072; t *= 2)
      for (Layout lay : {Layout::kWhole, Layout::kLayer})
        for (bool warm : {true, false})
          for (double rate : kRates)
            for (const auto& r : study_routes())
              row(m, t, lay, warm, rate, r, 0, Recovery::kSelective);
  const ModelShape m = find_model("llama3-8b");
  for (double loss : {0.0001, 0.001, 0.01})
    for (Recovery rec : {Recovery::kGoBackN, Recovery::kSelective})
      for (double rate : kRates)
        for (const auto& r : study_routes())
          row(m, 16384, Layout::kLayer, true, rate, r, loss, rec);
}

/// One training mode of the tables: the mode and its H.
struct ModeCase {
  TrainMode mode;
  int h;
  std::string label() const {
    return h > 0 ? fmt::format("{}-H{}", to_string(mode), h) : to_string(mode);
  }
};

std::vector<ModeCase> mode_cases() {
  return {{TrainMode::kRing, 0},     {TrainMode::kHier, 0},
          {TrainMode::kHierBf16, 0}, {TrainMode::kHierInt8, 0},
          {TrainMode::kDiloco, 10},  {TrainMode::kDiloco, 100},
          {TrainMode::kDiloco, 500}, {TrainMode::kStreamingDiloco, 100}};
}

/// The training setup of the tables: 2 sites × 8 H100 at 40 % MFU, 8,192 tokens per GPU
/// per step, fp32 gradients, 3.2 Tbit/s per rank inside a site; Streaming DiLoCo with
/// F = 4 fragments, τ = 5 overlapped steps and 4-bit outer gradients (0.5 B/param); every
/// step's AllReduce overlaps the backward pass (DDP).
TrainSetup table_setup(double params, const ModeCase& c, double rate, double rtt) {
  TrainSetup s;
  s.params = params;
  s.wan.rate_gbps = rate;
  s.wan.rtt_ms = rtt;
  if (c.h > 0) s.outer_every = c.h;
  s.outer_bytes_per_param = c.mode == TrainMode::kStreamingDiloco ? 0.5 : 4;
  s.overlap_backward = true;
  return s;
}

const double kParams[] = {1e9, 3e9, 8e9, 13e9, 70e9};

/// train_util.csv (utilisation against rate and route) and train_crossover.csv (the WAN rate
/// at which each mode reaches 90 % utilisation).
void train_tables(const std::string& dir) {
  auto out = fmt::output_file(dir + "/train_util.csv");
  out.print(
      "params,mode,rate_gbps,route,rtt_ms,compute_ms,comm_ms,step_ms,utilisation,"
      "wan_bytes_per_step\n");
  for (double p : kParams)
    for (const auto& c : mode_cases())
      for (const auto& r : study_routes())
        for (double lr = -1; lr <= 4.001; lr += 0.25) {
          const double rate = std::pow(10.0, lr);
          const Step st = train_step(c.mode, table_setup(p, c, rate, r.rtt_ms));
          out.print("{:.0f},{},{:.4g},{},{:.2f},{:.2f},{:.2f},{:.2f},{:.4f},{:.0f}\n", p, c.label(),
                    rate, r.name, r.rtt_ms, st.compute_ms, st.comm_ms, st.step_ms, st.utilisation,
                    st.wan_bytes_per_step);
        }
  auto x = fmt::output_file(dir + "/train_crossover.csv");
  x.print("params,mode,route,rtt_ms,compute_ms,rate_gbps_for_90pct\n");
  for (double p : kParams)
    for (const auto& c : mode_cases())
      for (const auto& r : study_routes()) {
        const TrainSetup s = table_setup(p, c, 10, r.rtt_ms);
        x.print("{:.0f},{},{},{:.2f},{:.2f},{:.4g}\n", p, c.label(), r.name, r.rtt_ms,
                train_compute_ms(s), rate_for_utilisation(c.mode, s, 0.9));
      }
}

/// reproduction.csv: DiLoCo's and INTELLECT-1's bandwidth arithmetic from the model.
void reproduction_table(const std::string& dir) {
  auto out = fmt::output_file(dir + "/reproduction.csv");
  out.print("case,quantity,published,model,assumptions\n");
  // DiLoCo (Douillard et al. 2023): H = 500 inner steps, fp32 outer gradients → 500× less
  // communication than data parallelism that syncs fp32 every step.
  {
    TrainSetup s;
    s.params = 400e6;  // the paper's largest model (400 M)
    s.outer_every = 500;
    const double dp = train_step(TrainMode::kHier, s).wan_bytes_per_step;
    const double dl = train_step(TrainMode::kDiloco, s).wan_bytes_per_step;
    out.print(
        "diloco,communication reduction vs DP,500,{:.1f},H=500 fp32 outer vs fp32 every step\n",
        dp / dl);
  }
  // INTELLECT-1 (arXiv 2412.01152): 10 B parameters, 100 inner steps, int8 outer gradients
  // → 400× less than fp32 DP; 83–96 % compute utilisation on up to 14 nodes of 8 H100.
  TrainSetup s;
  s.params = 10e9;
  s.sites = 14;
  s.ranks_per_site = 8;
  s.outer_every = 100;
  s.outer_bytes_per_param = 1;
  s.gpu.mfu = 0.388;                    // the report's 36.2–41.4 % MFU, middle
  s.tokens_per_gpu_step = 16.0 * 8192;  // assumed: 16 sequences of 8,192 tokens per GPU
  {
    const double dp = train_step(TrainMode::kHier, s).wan_bytes_per_step;
    const double dl = train_step(TrainMode::kDiloco, s).wan_bytes_per_step;
    out.print(
        "intellect-1,communication reduction vs DP,400,{:.1f},H=100 int8 vs fp32 every step\n",
        dp / dl);
  }
  const double compute = train_compute_ms(s);
  out.print(
      "intellect-1,inner step compute ms,,{:.0f},6·10e9·131072 FLOP / (989 TFLOP/s × 38.8 %)\n",
      compute);
  for (auto [rtt, label] :
       {std::pair{30.0, "USA-only RTT 30 ms"}, std::pair{100.0, "USA+Europe RTT 100 ms"},
        std::pair{200.0, "global RTT 200 ms"}}) {
    s.wan.rtt_ms = rtt;
    for (double rate : {0.5, 1.0, 2.0, 4.0}) {
      s.wan.rate_gbps = rate;
      out.print("intellect-1,utilisation at {} Gbit/s {},83-96 %,{:.1f} %,14-site ring of int8\n",
                rate, label, 100 * train_step(TrainMode::kDiloco, s).utilisation);
    }
    for (double target : {0.83, 0.96})
      out.print("intellect-1,WAN Gbit/s for {:.0f} % at {},,{:.3f},\n", target * 100, label,
                rate_for_utilisation(TrainMode::kDiloco, s, target));
  }
}

int tables(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const Gpu gpu;
  max_context_table(dir, gpu);
  production_table(dir, gpu);
  handoff_table(dir, gpu);
  train_tables(dir);
  reproduction_table(dir);
  fmt::print(
      "wan_study model: wrote kv_max_context.csv, kv_production.csv, kv_handoff.csv, "
      "train_util.csv, train_crossover.csv, reproduction.csv in {} (GPU: {}, {:.0f} TFLOP/s × "
      "{:.0f} % MFU)\n",
      dir, gpu.name, gpu.peak_flops / 1e12, gpu.mfu * 100);
  return 0;
}

}  // namespace

int model_main(int argc, char** argv) {
  CLI::App app{"wan_study model: predictions of the wide-area performance model (model.h)",
               "wan_study model"};
  app.require_subcommand(1);

  CLI::App* kv = app.add_subcommand("kv", "one KV hand-off: added time to first token, ms");
  LinkOptions kvl;
  kvl.add(kv);
  std::string model, layout = "layer";
  double tokens = 2048, bytes_per_token = 0, layer_ms = -1;
  int layers = 0, kv_bits = 16;
  kv->add_option("--model", model,
                 "a study model (llama3-8b, llama3-70b, qwen2.5-7b, "
                 "deepseek-v3, jamba-v0.1)");
  kv->add_option("--tokens", tokens, "context, tokens")->check(CLI::PositiveNumber);
  kv->add_option("--kv-bits", kv_bits, "16, 8 or 4");
  kv->add_option("--layout", layout, "whole|layer");
  kv->add_option("--bytes-per-token", bytes_per_token, "instead of --model: cache bytes/token");
  kv->add_option("--layers", layers, "instead of --model: layers");
  kv->add_option("--layer-ms", layer_ms, "instead of --model: prefill ms per layer");

  CLI::App* tr = app.add_subcommand("train", "one training step: time and utilisation");
  LinkOptions trl;
  trl.add(tr);
  TrainSetup s;
  std::string mode = "ring";
  tr->add_option("--mode", mode, "ring|hier|hier-bf16|hier-int8|diloco|streaming-diloco");
  tr->add_option("--params", s.params, "parameters")->check(CLI::PositiveNumber);
  tr->add_option("--grad-bytes", s.grad_bytes_per_param, "gradient bytes per parameter");
  tr->add_option("--compute-ms", s.compute_ms, "compute per step, ms (default: from tokens)");
  tr->add_option("--tokens-per-gpu", s.tokens_per_gpu_step, "tokens per GPU per step");
  tr->add_option("--mfu", s.gpu.mfu, "model FLOPs utilisation")->check(CLI::Range(0.01, 1.0));
  tr->add_option("--sites", s.sites, "sites")->check(CLI::PositiveNumber);
  tr->add_option("--ranks-per-site", s.ranks_per_site, "ranks per site")
      ->check(CLI::PositiveNumber);
  tr->add_option("--intra-gbps", s.intra_gbps, "per-rank rate inside a site, Gbit/s");
  tr->add_option("--intra-alpha-ms", s.intra_alpha_ms, "per-message latency inside a site, ms");
  tr->add_option("--alpha-ms", s.alpha_ms, "per-message software latency on the WAN, ms");
  tr->add_option("--outer-every", s.outer_every, "DiLoCo H")->check(CLI::PositiveNumber);
  tr->add_option("--outer-bytes", s.outer_bytes_per_param, "DiLoCo bytes per parameter on the WAN");
  tr->add_option("--fragments", s.fragments, "Streaming DiLoCo F")->check(CLI::PositiveNumber);
  tr->add_option("--overlap-steps", s.overlap_steps, "Streaming DiLoCo τ");
  tr->add_flag("--rendezvous", s.rendezvous, "+ RTT/2 per AllReduce: ccl's first advert");
  tr->add_flag("--overlap-backward", s.overlap_backward,
               "per-step AllReduce hidden behind 2/3 of the compute (DDP)");

  CLI::App* tb = app.add_subcommand("tables", "write every table of the study (CSV)");
  std::string dir = "docs/wan_study";
  tb->add_option("--out", dir, "directory for the CSV files");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    if (*kv) {
      const Link l = kvl.link();
      const Layout lay = layout == "whole"   ? Layout::kWhole
                         : layout == "layer" ? Layout::kLayer
                                             : throw std::invalid_argument("--layout whole|layer");
      Handoff h;
      std::string name = model;
      if (!model.empty()) {
        h = kv_handoff(find_model(model), tokens, kv_bits, lay, l, Gpu{});
      } else {
        if (bytes_per_token <= 0 || layers < 1 || layer_ms < 0)
          throw std::invalid_argument("without --model: --bytes-per-token, --layers, --layer-ms");
        h = kv_handoff(bytes_per_token * tokens, layers, layer_ms, lay, l);
        name = "custom";
      }
      fmt::print(
          "model,tokens,layout,rate_gbps,rtt_ms,loss_pct,recovery,bytes,prefill_ms,"
          "added_ms,ideal_ms\n{},{:g},{},{:g},{:g},{:g},{},{:.0f},{:.3f},{:.3f},{:.3f}\n",
          name, tokens, layout, l.rate_gbps, l.rtt_ms, l.loss * 100, recovery_name(l.recovery),
          h.bytes, h.prefill_ms, h.added_ms, h.ideal_ms);
      return 0;
    }
    if (*tr) {
      s.wan = trl.link();
      const TrainMode m = parse_train_mode(mode);
      const Step st = train_step(m, s);
      fmt::print(
          "mode,params,rate_gbps,rtt_ms,compute_ms,comm_ms,step_ms,utilisation,"
          "wan_bytes_per_step\n{},{:g},{:g},{:g},{:.3f},{:.3f},{:.3f},{:.4f},{:.0f}\n",
          mode, s.params, s.wan.rate_gbps, s.wan.rtt_ms, st.compute_ms, st.comm_ms, st.step_ms,
          st.utilisation, st.wan_bytes_per_step);
      return 0;
    }
    return tables(dir);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "wan_study model: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wan_study model: %s\n", e.what());
    return 1;
  }
}

}  // namespace softrdma::wan_model
