// The wide-area study's performance model: formulas and their sources in model.h.
#include "tools/wan_study/model.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace softrdma::wan_model {

namespace {

/// Bytes per ms at `gbps` Gbit/s.
double bytes_per_ms(double gbps) {
  return gbps * 1e9 / 8 / 1e3;
}

/// The rate a window of at most `cap` bytes sustains over `rtt_ms`: min(rate, cap / RTT),
/// bytes per ms.
double effective_bytes_per_ms(const Link& l) {
  const double r = bytes_per_ms(l.rate_gbps);
  if (l.inflight_cap_bytes > 0 && l.rtt_ms > 0) return std::min(r, l.inflight_cap_bytes / l.rtt_ms);
  return r;
}

/// The rate one step of a collective moves `step_bytes` at over the WAN, bytes per ms: the
/// link rate, or cap / RTT when the step's bytes exceed what the layer above keeps in
/// flight (a step that fits the cap leaves as one flight: its time is bytes/rate + α).
double step_bytes_per_ms(const Link& l, double step_bytes) {
  if (l.inflight_cap_bytes > 0 && step_bytes > l.inflight_cap_bytes)
    return effective_bytes_per_ms(l);
  return bytes_per_ms(l.rate_gbps);
}

void check_link(const Link& l) {
  if (!(l.rate_gbps > 0) || !(l.rtt_ms >= 0) || !(l.loss >= 0 && l.loss < 1) || l.mtu == 0)
    throw std::invalid_argument("wan_model: link needs rate > 0, RTT ≥ 0, 0 ≤ loss < 1, MTU > 0");
}

}  // namespace

double serialise_ms(double bytes, double rate_gbps) {
  return bytes / bytes_per_ms(rate_gbps);
}

double bdp_bytes(const Link& link) {
  return bytes_per_ms(link.rate_gbps) * link.rtt_ms;
}

double fibre_rtt_ms(double km, double routing_factor, double base_ms) {
  return 2 * km * 0.005 * routing_factor + base_ms;
}

std::vector<Route> study_routes() {
  std::vector<Route> r;
  const std::pair<const char*, double> km[] = {{"same-DC", 0},
                                               {"metro-100km", 100},
                                               {"1500km", 1500},
                                               {"5000km", 5000},
                                               {"intercontinental-10000km", 10000}};
  for (const auto& [name, d] : km) r.push_back({name, d, fibre_rtt_ms(d)});
  return r;
}

double window_gain(double rtt_ms) {
  return rtt_ms >= 1.0 ? 5.0 : 2.0;
}

double loss_recovery_ms(double bytes, const Link& l) {
  check_link(l);
  const double p = l.loss;
  if (p <= 0 || bytes <= 0) return 0;
  const double n = std::ceil(bytes / l.mtu);
  const double pkt_ms = serialise_ms(l.mtu, l.rate_gbps);
  const double bdp = std::max<double>(l.mtu, l.inflight_cap_bytes > 0
                                                 ? std::min(bdp_bytes(l), l.inflight_cap_bytes)
                                                 : bdp_bytes(l));
  // Packets in flight behind a loss (the last round trip's worth), at most the message.
  const double nw = std::min(n, bdp / l.mtu + 1);
  // A loss in the last round trip delays the end by the NAK's round trip, RTT/2 on average;
  // the very last packet lost waits for the tail-loss probe, max(2·SRTT, 10 ms), then RTT.
  const double tail =
      (1 - std::pow(1 - p, nw)) * l.rtt_ms / 2 + p * (std::max(2 * l.rtt_ms, 10.0) + l.rtt_ms);
  if (l.recovery == Recovery::kSelective) return n * p * pkt_ms + tail;
  const double factor = (1 + (nw - 1) * p) / (1 - p);
  return n * pkt_ms * (factor - 1) + tail;
}

Transfer bulk_transfer(double bytes, const Link& l, double start_window_bytes) {
  check_link(l);
  Transfer t;
  const double rate = bytes_per_ms(l.rate_gbps);
  const double rtt = l.rtt_ms;
  double cap = bdp_bytes(l);
  if (l.inflight_cap_bytes > 0) cap = std::min(cap, l.inflight_cap_bytes);
  const double stream = effective_bytes_per_ms(l);
  t.ideal_ms = bytes / rate + rtt / 2;
  double w = start_window_bytes > 0 ? start_window_bytes
             : l.warm               ? cap
                                    : static_cast<double>(l.initial_window_psns) * l.mtu;
  const double g = window_gain(rtt);
  double time = 0, sent = 0;
  while (rtt > 0 && w < cap && sent < bytes) {
    if (bytes - sent <= w) {  // the last flight: it leaves at the link rate
      time += (bytes - sent) / rate;
      sent = bytes;
      break;
    }
    sent += w;  // a window-limited round: one window, one round trip
    time += rtt;
    w = std::min(cap, w * g);
    ++t.ramp_rounds;
  }
  if (sent < bytes) time += (bytes - sent) / stream;
  time += rtt / 2;
  t.loss_ms = loss_recovery_ms(bytes, l);
  t.ramp_ms = time - t.ideal_ms;
  t.total_ms = time + t.loss_ms;
  return t;
}

double dcqcn_cut_cost_ms(const Link& link) {
  return std::max(0.3, link.rtt_ms);
}

std::vector<ModelShape> study_models() {
  std::vector<ModelShape> m;
  // Llama-3-8B (Meta, config.json): 32 layers, 32 query / 8 KV heads of 128; 8.03 B params.
  m.push_back({"llama3-8b", 8.03e9, 8.03e9, 32, 32, 8, 128, 0, 32 * 128, 0, 0, 0, 1});
  // Llama-3-70B: 80 layers, 64 query / 8 KV heads of 128; 70.6 B; prefill on 8 GPUs (TP8).
  m.push_back({"llama3-70b", 70.6e9, 70.6e9, 80, 80, 8, 128, 0, 64 * 128, 0, 0, 0, 8});
  // Qwen2.5-7B (Qwen team, config.json): 28 layers, 28 query / 4 KV heads of 128; 7.62 B.
  m.push_back({"qwen2.5-7b", 7.62e9, 7.62e9, 28, 28, 4, 128, 0, 28 * 128, 0, 0, 0, 1});
  // DeepSeek-V3 (arXiv 2412.19437): 61 layers of MLA caching a 512-dim latent + 64-dim RoPE
  // key per token; 37 B active of 671 B; 128 heads with QK dim 192 and V dim 128 (width
  // 128 × (192 + 128) / 2 for QK and AV together); prefill unit of 32 GPUs (§3.4.1).
  m.push_back({"deepseek-v3", 37e9, 671e9, 61, 61, 0, 0, 512 + 64, 128 * 160, 0, 0, 0, 32});
  // Jamba-v0.1 (AI21, arXiv 2403.19887, config.json): 32 layers, one attention layer in 8
  // (4 attention, 28 Mamba), 8 KV heads of 128; 12 B active of 52 B; each Mamba layer keeps
  // a d_inner 8192 × (d_state 16 + d_conv 4) state per request, bf16: 28 × 8192 × 20 × 2 B.
  m.push_back(
      {"jamba-v0.1", 12e9, 52e9, 32, 4, 8, 128, 0, 32 * 128, 0, 0, 28.0 * 8192 * 20 * 2, 2});
  return m;
}

ModelShape find_model(const std::string& name) {
  for (const auto& m : study_models())
    if (m.name == name) return m;
  throw std::invalid_argument("unknown model '" + name + "'");
}

double kv_bytes(const ModelShape& m, double tokens, int kv_bits) {
  if (kv_bits != 16 && kv_bits != 8 && kv_bits != 4)
    throw std::invalid_argument("kv_bits must be 16, 8 or 4");
  const double elem = kv_bits / 8.0;
  const double per_layer_token =
      m.mla_dim > 0 ? m.mla_dim * elem : 2.0 * m.kv_heads * m.head_dim * elem;
  const int global_layers = m.attn_layers - m.local_layers;
  const double local_tokens = m.window > 0 ? std::min<double>(tokens, m.window) : tokens;
  return per_layer_token * (global_layers * tokens + m.local_layers * local_tokens) + m.state_bytes;
}

double prefill_flops(const ModelShape& m, double tokens) {
  const int global_layers = m.attn_layers - m.local_layers;
  // Causal attention: token t sees t tokens (a local layer at most `window`).
  const double local_pairs = m.window > 0 && tokens > m.window
                                 ? m.window * m.window / 2.0 + (tokens - m.window) * m.window
                                 : tokens * tokens / 2.0;
  return 2 * m.params * tokens +
         4 * m.attn_width * (global_layers * tokens * tokens / 2.0 + m.local_layers * local_pairs);
}

double prefill_ms(const ModelShape& m, double tokens, const Gpu& gpu) {
  return prefill_flops(m, tokens) / (m.prefill_gpus * gpu.peak_flops * gpu.mfu) * 1e3;
}

Handoff kv_handoff(double bytes, int layers, double layer_ms, Layout layout, const Link& link) {
  if (layers < 1 || layer_ms < 0 || bytes < 0)
    throw std::invalid_argument("kv_handoff: layers ≥ 1, layer_ms ≥ 0, bytes ≥ 0");
  Handoff h;
  h.bytes = bytes;
  h.prefill_ms = layers * layer_ms;
  h.ideal_ms = serialise_ms(bytes, link.rate_gbps) + link.rtt_ms / 2;
  h.produce_gbps = h.prefill_ms > 0 ? bytes * 8 / (h.prefill_ms * 1e6) : 0;
  const Transfer all = bulk_transfer(bytes, link);
  if (layout == Layout::kWhole || layers == 1) {
    h.added_ms = all.total_ms;
    return h;
  }
  const double one = bytes / layers;
  const double link_bound = layer_ms + all.total_ms - h.prefill_ms;
  const double w0 = static_cast<double>(link.initial_window_psns) * link.mtu;
  // A warm QP is at one BDP already (0: bulk_transfer's default for it).
  const double grown = link.warm ? 0 : w0 + (window_gain(link.rtt_ms) - 1) * (bytes - one);
  const double compute_bound = bulk_transfer(one, link, grown).total_ms;
  h.added_ms = std::max(link_bound, compute_bound);
  return h;
}

Handoff kv_handoff(const ModelShape& m, double tokens, int kv_bits, Layout layout, const Link& link,
                   const Gpu& gpu) {
  return kv_handoff(kv_bytes(m, tokens, kv_bits), m.layers, prefill_ms(m, tokens, gpu) / m.layers,
                    layout, link);
}

double max_context_tokens(const ModelShape& m, int kv_bits, Layout layout, const Link& link,
                          const Gpu& gpu, double budget_ms, double step, double max_tokens) {
  double fits = 0;
  for (double t = step; t <= max_tokens; t += step) {
    if (kv_handoff(m, t, kv_bits, layout, link, gpu).added_ms > budget_ms) break;
    fits = t;
  }
  return fits;
}

TrainMode parse_train_mode(const std::string& s) {
  for (TrainMode m : {TrainMode::kRing, TrainMode::kHier, TrainMode::kHierBf16,
                      TrainMode::kHierInt8, TrainMode::kDiloco, TrainMode::kStreamingDiloco})
    if (to_string(m) == s) return m;
  throw std::invalid_argument("unknown training mode '" + s + "'");
}

std::string to_string(TrainMode m) {
  switch (m) {
    case TrainMode::kRing:
      return "ring";
    case TrainMode::kHier:
      return "hier";
    case TrainMode::kHierBf16:
      return "hier-bf16";
    case TrainMode::kHierInt8:
      return "hier-int8";
    case TrainMode::kDiloco:
      return "diloco";
    case TrainMode::kStreamingDiloco:
      return "streaming-diloco";
  }
  return "?";
}

double train_compute_ms(const TrainSetup& s) {
  if (s.compute_ms > 0) return s.compute_ms;
  return 6 * s.params * s.tokens_per_gpu_step / (s.gpu.peak_flops * s.gpu.mfu) * 1e3;
}

double ring_allreduce_ms(double bytes, const TrainSetup& s) {
  const int n = s.sites * s.ranks_per_site;
  if (n <= 1) return 0;
  if (s.sites <= 1) return intra_allreduce_ms(bytes, s);
  check_link(s.wan);
  const double alpha = s.wan.rtt_ms / 2 + s.alpha_ms;
  return (s.rendezvous ? s.wan.rtt_ms / 2 : 0) + 2.0 * (n - 1) * alpha +
         2.0 * (n - 1) / n * bytes / step_bytes_per_ms(s.wan, bytes / n);
}

double intra_allreduce_ms(double bytes, const TrainSetup& s) {
  const int r = s.ranks_per_site;
  if (r <= 1) return 0;
  return 2.0 * (r - 1) * s.intra_alpha_ms + 2.0 * (r - 1) / r * bytes / bytes_per_ms(s.intra_gbps);
}

double hier_allreduce_ms(double bytes, double wan_bytes, const TrainSetup& s) {
  const int r = s.ranks_per_site, S = s.sites;
  const double chain = r > 1 ? (r - 1) * s.intra_alpha_ms + bytes / bytes_per_ms(s.intra_gbps) : 0;
  double wan = 0;
  if (S > 1) {
    check_link(s.wan);
    const double alpha = s.wan.rtt_ms / 2 + s.alpha_ms;
    wan = (s.rendezvous ? s.wan.rtt_ms / 2 : 0) + 2.0 * (S - 1) * alpha +
          2.0 * (S - 1) / S * wan_bytes / step_bytes_per_ms(s.wan, wan_bytes / S);
  }
  return 2 * chain + wan;
}

Step train_step(TrainMode mode, const TrainSetup& s) {
  if (s.sites < 1 || s.ranks_per_site < 1 || s.outer_every < 1 || s.fragments < 1 ||
      s.overlap_steps < 0 || !(s.params > 0))
    throw std::invalid_argument("train_step: sites, ranks, H, fragments ≥ 1, params > 0");
  Step st;
  st.compute_ms = train_compute_ms(s);
  const double grad = s.params * s.grad_bytes_per_param;
  const int S = s.sites, n = S * s.ranks_per_site;
  const double hop = S > 1 ? 2.0 * (S - 1) / S : 0;  // share of a buffer each site sends
  // What of a per-step AllReduce stays exposed: all of it, or beyond the backward pass.
  const double backward = s.overlap_backward ? st.compute_ms * 2 / 3 : 0;
  auto exposed = [&](double ms) { return std::max(0.0, ms - backward); };
  switch (mode) {
    case TrainMode::kRing:
      st.comm_ms = exposed(ring_allreduce_ms(grad, s));
      st.wan_bytes_per_step = S > 1 ? 2.0 * (n - 1) / n * grad : 0;
      break;
    case TrainMode::kHier:
    case TrainMode::kHierBf16:
    case TrainMode::kHierInt8: {
      const double bits = mode == TrainMode::kHier       ? s.grad_bytes_per_param * 8
                          : mode == TrainMode::kHierBf16 ? 16
                                                         : 8;
      const double wan = s.params * std::min(bits / 8, s.grad_bytes_per_param);
      st.comm_ms = exposed(hier_allreduce_ms(grad, wan, s));
      st.wan_bytes_per_step = hop * wan;
      break;
    }
    case TrainMode::kDiloco: {
      const double inner = exposed(intra_allreduce_ms(grad, s));
      const double outer = hier_allreduce_ms(grad, s.params * s.outer_bytes_per_param, s);
      st.comm_ms = inner + outer / s.outer_every;
      st.wan_bytes_per_step = hop * s.params * s.outer_bytes_per_param / s.outer_every;
      break;
    }
    case TrainMode::kStreamingDiloco: {
      const double inner = exposed(intra_allreduce_ms(grad, s));
      const double frag = hier_allreduce_ms(grad / s.fragments,
                                            s.params * s.outer_bytes_per_param / s.fragments, s);
      const double hidden = s.overlap_steps * (st.compute_ms + inner);
      st.comm_ms =
          inner + static_cast<double>(s.fragments) / s.outer_every * std::max(0.0, frag - hidden);
      st.wan_bytes_per_step = hop * s.params * s.outer_bytes_per_param / s.outer_every;
      break;
    }
  }
  st.step_ms = st.compute_ms + st.comm_ms;
  st.utilisation = st.step_ms > 0 ? st.compute_ms / st.step_ms : 1;
  return st;
}

double rate_for_utilisation(TrainMode mode, TrainSetup s, double target) {
  auto util = [&](double log_rate) {
    s.wan.rate_gbps = std::pow(10.0, log_rate);
    return train_step(mode, s).utilisation;
  };
  double lo = -3, hi = 5;
  if (util(hi) < target) return 0;
  if (util(lo) >= target) return std::pow(10.0, lo);
  for (int i = 0; i < 60; ++i) {
    const double mid = (lo + hi) / 2;
    (util(mid) >= target ? hi : lo) = mid;
  }
  return std::pow(10.0, hi);
}

}  // namespace softrdma::wan_model
