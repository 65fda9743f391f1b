// The wide-area study's performance model (issue 24; docs/wide-area.md, "The study"):
// closed-form predictions, in milliseconds, of
//   (a) what a KV-cache hand-off from a prefill site to a decode site adds to the time to
//       first token (bytes, round trip, the engine's window ramp, loss recovery, layer-wise
//       overlap with prefill compute), and
//   (b) a data-parallel training step across two or more sites (flat ring, hierarchical,
//       compressed wide-area hop, DiLoCo, Streaming DiLoCo) and its compute utilisation.
// Pure functions, no I/O, no softrdma dependency: tools/wan_study/model_cli.cpp prints the
// tables, tools/wan_study/tests/model_test.cpp checks hand-computed cases, and
// bench/wan_study.sh compares predictions with the emulated stack.
//
// Units everywhere: bytes, milliseconds (ms), link rates in Gbit/s (1e9 bit/s), FLOP/s.
// Each formula names its source in the comment of the function that evaluates it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace softrdma::wan_model {

// ---------------------------------------------------------------------------------------
// Links and routes
// ---------------------------------------------------------------------------------------

/// How the transport recovers a lost packet (docs/wide-area.md, "Loss recovery").
enum class Recovery {
  kGoBackN,    ///< IBTA: the responder drops everything after a gap, the requester resends
               ///< from the lost PSN (a window per loss)
  kSelective,  ///< IRN-style (Mittal et al., SIGCOMM 2018): only the lost PSNs are resent
};

/// One direction of a wide-area path as the transport sees it.
struct Link {
  double rate_gbps = 10;  ///< bottleneck rate, Gbit/s (> 0)
  double rtt_ms = 10;     ///< round-trip propagation time, ms (≥ 0)
  double loss = 0;        ///< random loss probability per packet, 0 ≤ loss < 1
  Recovery recovery = Recovery::kSelective;
  uint32_t mtu = 4096;  ///< payload bytes per packet (the engine's PSN size)
  /// The requester's first window, PSNs (engine/congestion_window.h kInitialPsns = 128, rxe's
  /// fixed window).
  uint32_t initial_window_psns = 128;
  /// Bytes the layer above keeps in flight per peer at most (0: no limit). ccl's pipelined
  /// collectives keep Config::depth × Config::chunk_bytes = 4 × 512 KiB = 2 MiB per peer,
  /// which caps a collective's rate at 2 MiB / RTT on a long link; a single rendezvous
  /// Send/Recv (the KV hand-off) has no such cap.
  double inflight_cap_bytes = 0;
  /// The QP carried traffic before (a prefill→decode connection reused request after
  /// request): the window is already at one BDP (the engine keeps it across idle periods,
  /// engine/congestion_window.h has no idle restart), so no ramp. false: a fresh QP.
  bool warm = false;
};

/// Serialisation time of `bytes` at `rate_gbps`: bytes × 8 / rate, ms.
double serialise_ms(double bytes, double rate_gbps);

/// The bandwidth-delay product, bytes: rate × RTT.
double bdp_bytes(const Link& link);

/// A named route (docs/wide-area.md "The study"): one-way fibre distance and the RTT it
/// implies, ms.
struct Route {
  std::string name;  ///< e.g. "metro-100km"
  double km = 0;     ///< fibre distance one way, km (0: inside one data centre)
  double rtt_ms = 0;
};

/// RTT of `km` of fibre: 2 × km × 5 µs/km × routing factor, plus `base_ms` (switching and
/// hosts inside the data centres). Light in silica fibre travels at c/1.47 ≈ 204,000 km/s,
/// i.e. ~4.9 µs/km (rounded to 5); real routes run longer than the great circle by a routing
/// factor of ~1.2–1.5 (Singla et al., "The Internet at the Speed of Light", HotNets 2014,
/// measure a median fibre-path stretch of ~1.5–2 over the geodesic; 1.3 is a direct
/// carrier route).
double fibre_rtt_ms(double km, double routing_factor = 1.3, double base_ms = 0.1);

/// The study's routes: same DC (0.1 ms), metro 100 km (~1.4 ms), 1,500 km (Guizhou–Shanghai
/// class, ~19.6 ms), 5,000 km (~65 ms), intercontinental 10,000 km (~130 ms), all from
/// fibre_rtt_ms with a routing factor of 1.3.
std::vector<Route> study_routes();

// ---------------------------------------------------------------------------------------
// Bulk transfer over one RC QP
// ---------------------------------------------------------------------------------------

/// Growth factor of the requester's window per round trip in slow start, before it reaches
/// one BDP. Paths whose RTT is at least 1 ms: 5 — early in each round the ACK train raises
/// the window to kTrainGain = 4 × what it was when the train began (engine/
/// congestion_window.h; docs/wide-area.md "Slow start"), then slow start goes on adding one
/// PSN per acknowledged PSN for the rest of the round's ~W ACKs: 4W + W. (The emulated hand-
/// offs of bench/wan_study.sh's check points fit 5 within 3 %, 4 by up to 12 %.) Below 1 ms:
/// 2, plain slow start (RFC 5681).
double window_gain(double rtt_ms);

/// Result of bulk_transfer(): times in ms from the moment the first byte may leave.
struct Transfer {
  double total_ms = 0;  ///< until the last byte has arrived at the receiver
  double ideal_ms = 0;  ///< bytes/rate + RTT/2: a sender that fills the pipe from the start
  double ramp_ms = 0;   ///< what the window's ramp adds to ideal (round trips spent below BDP)
  double loss_ms = 0;   ///< expected loss-recovery cost (loss_recovery_ms)
  int ramp_rounds = 0;  ///< round trips spent with the window below one BDP
};

/// Time to move `bytes` in one message over `link` starting from a window of
/// `start_window_bytes` (≤ 0: link.initial_window_psns × mtu; link.warm: one BDP), ms.
///
/// Round model of slow start (Cardwell, Savage & Anderson, "Modeling TCP Latency",
/// INFOCOM 2000, §3 — each slow-start round sends one window and costs one RTT): while
/// the window W is below one BDP (and below the in-flight cap), a round sends W bytes and
/// lasts one RTT; then W ← min(BDP, g·W) with g = window_gain(). Once W reaches the BDP the
/// rest streams at the link rate. The last byte arrives RTT/2 after it leaves. A pipe
/// capped by `inflight_cap_bytes` below its BDP streams at cap/RTT instead of the rate.
/// With DCQCN on an uncontended path nothing changes: the reaction point starts at the line
/// rate (engine/dcqcn.h), so only the window ramps. Loss adds loss_recovery_ms().
Transfer bulk_transfer(double bytes, const Link& link, double start_window_bytes = 0);

/// Expected time that random loss adds to a transfer of `bytes` over `link`, ms.
///
/// Selective (IRN, Mittal et al. SIGCOMM 2018): every lost packet is sent again once —
/// N·p·MTU/rate of link time; a loss among the last BDP of packets delays the end by the
/// NAK's round trip, on average RTT/2 (a uniformly placed loss in the last RTT); the last
/// packet lost (nothing behind it reveals the gap) waits for the tail-loss probe,
/// max(2·SRTT, 10 ms) (RFC 8985 §7; engine requester), then one RTT. A loss does not shrink
/// the window below two measured BDPs (engine/congestion_window.h), so the rate is kept.
///
/// Go-back-N: each loss discards the window in flight behind it, N_w = min(W, BDP)/MTU + 1
/// packets; the expected transmissions per delivered packet are (1 + (N_w − 1)·p)/(1 − p)
/// (Bertsekas & Gallager, *Data Networks*, 2nd ed., §2.4.2, go-back-n efficiency), so the
/// transfer takes that factor × its serialisation time; plus the same tail terms.
///
/// Not modelled: a lost NAK or lost resend that falls to the retransmit timeout (second
/// order in p; docs/wide-area.md's 1 % rows show go-back-N timeout-bound there).
double loss_recovery_ms(double bytes, const Link& link);

/// One congestion notification's cost under DCQCN (Zhu et al., SIGCOMM 2015, fig. 7;
/// engine/dcqcn.h): with α = 1 the first CNP halves Rc; fast recovery then halves the
/// distance to Rt = line rate once per increase period T = max(300 µs, RTT) (the engine
/// stretches T to one RTT), so the bytes lost against the line rate are
/// R·T·(1/2 + 1/4 + …) ≈ R·T, i.e. about T of link time, ms.
double dcqcn_cut_cost_ms(const Link& link);

// ---------------------------------------------------------------------------------------
// Models and compute
// ---------------------------------------------------------------------------------------

/// A transformer's shape, as far as the KV cache and the FLOPs need it.
struct ModelShape {
  std::string name;
  double params = 0;        ///< parameters that every token passes through (MoE: active), count
  double total_params = 0;  ///< all parameters (gradient size for training), count
  int layers = 0;           ///< all layers
  int attn_layers = 0;      ///< layers with a KV cache (hybrid: the attention layers only)
  int kv_heads = 0;         ///< KV heads per attention layer (GQA); 0 for MLA
  int head_dim = 0;         ///< dimension per KV head
  int mla_dim = 0;          ///< MLA: latent + RoPE key dimension cached per layer (0: none)
  double attn_width = 0;    ///< query heads × head dim of Q·K and A·V, for the attention FLOPs
  int window = 0;           ///< sliding-window tokens of the local layers (0: none)
  int local_layers = 0;     ///< of attn_layers, how many use the window
  double state_bytes = 0;   ///< fixed per-request state besides the KV cache (Mamba), bytes
  int prefill_gpus = 1;     ///< GPUs a prefill instance of this model runs on
};

/// The study's models: Llama-3-8B, Llama-3-70B, Qwen2.5-7B, DeepSeek-V3 (MLA),
/// Jamba-v0.1 (hybrid, 1 attention : 7 Mamba layers). Sources in model.cpp.
std::vector<ModelShape> study_models();

/// Finds a study model by name; throws std::invalid_argument when unknown.
ModelShape find_model(const std::string& name);

/// KV-cache bytes of one request of `tokens` tokens at `kv_bits` bits per element (16:
/// bf16; 8 and 4: quantised, scales neglected): per attention layer 2 (K, V) × kv_heads ×
/// head_dim elements per token (MLA: mla_dim, one latent for K and V), local layers holding
/// at most `window` tokens, plus state_bytes.
double kv_bytes(const ModelShape& m, double tokens, int kv_bits = 16);

/// The GPU compute model: peak FLOP/s × model FLOPs utilisation (MFU), stated.
struct Gpu {
  std::string name = "H100-SXM bf16 dense";
  double peak_flops = 989e12;  ///< H100 SXM bf16 dense (NVIDIA H100 datasheet)
  double mfu = 0.40;           ///< fraction of peak achieved
};

/// Prefill FLOPs of `tokens` tokens: 2·params·tokens (one multiply-add per active weight per
/// token; Kaplan et al. 2020, table 1) + causal attention 2·attn_layers·attn_width·tokens²
/// (PaLM, Chowdhery et al. 2022, app. B: 4·L·H·Q·T per token over a full context, half of
/// it under a causal mask; a local layer sees at most `window` tokens).
double prefill_flops(const ModelShape& m, double tokens);

/// Prefill time of one request on m.prefill_gpus GPUs, ms: prefill_flops / (gpus · peak ·
/// MFU).
double prefill_ms(const ModelShape& m, double tokens, const Gpu& gpu);

// ---------------------------------------------------------------------------------------
// Inference: the KV hand-off
// ---------------------------------------------------------------------------------------

/// How the cache goes to the decode site.
enum class Layout {
  kWhole,  ///< all of it after the last layer
  kLayer,  ///< each layer as soon as prefill finished it (overlapped with later layers)
};

/// One hand-off's prediction.
struct Handoff {
  double bytes = 0;         ///< the cache, bytes
  double prefill_ms = 0;    ///< prefill compute, ms
  double added_ms = 0;      ///< what the hand-off adds to the time to first token, ms
  double ideal_ms = 0;      ///< whole-cache bytes/rate + RTT/2, ms (reference)
  double produce_gbps = 0;  ///< KV production rate during prefill, Gbit/s
};

/// Added TTFT of handing `bytes` over `link` after a prefill of `layers` equal layers of
/// `layer_ms` each, ms.
///
/// Whole: bulk_transfer(bytes) from the end of prefill.
/// Layer: the link is a FIFO server fed a layer every layer_ms (tandem queue: the last byte
/// leaves at max over layers i of finish_i + the service of layers i..L; Kleinrock,
/// *Queueing Systems* vol. 1 — for equal layers the maximum is at i = 1 or i = L):
///   link-bound  : layer_ms + T(bytes) − layers·layer_ms  (the first layer starts the
///                 stream, the window ramp and loss cost included in T)
///   compute-bound: T(one layer, starting from the window the earlier layers grew:
///                 W0 + (g − 1)·(bytes − one layer), at most one BDP)
/// and the hand-off adds the larger of the two.
Handoff kv_handoff(double bytes, int layers, double layer_ms, Layout layout, const Link& link);

/// kv_handoff for a study model: bytes from kv_bytes(), produced evenly over m.layers
/// layers of prefill_ms / m.layers each (for a hybrid, the few attention layers' cache and
/// the Mamba state are spread over all layers: an approximation that favours streaming
/// slightly).
Handoff kv_handoff(const ModelShape& m, double tokens, int kv_bits, Layout layout, const Link& link,
                   const Gpu& gpu);

/// The largest context (a multiple of `step` tokens, ≤ max_tokens) such that every
/// context from `step` up to it adds at most budget_ms to the TTFT; 0 when even `step`
/// does not fit.
double max_context_tokens(const ModelShape& m, int kv_bits, Layout layout, const Link& link,
                          const Gpu& gpu, double budget_ms = 200, double step = 1024,
                          double max_tokens = 131072);

// ---------------------------------------------------------------------------------------
// Training across sites
// ---------------------------------------------------------------------------------------

/// How gradients are synchronised.
enum class TrainMode {
  kRing,      ///< flat pipelined ring over all ranks, every step
  kHier,      ///< hierarchical (site reduce → leaders' ring → site broadcast), every step
  kHierBf16,  ///< hierarchical, bf16 on the wide-area hop (half of fp32)
  kHierInt8,  ///< hierarchical, int8 on the wide-area hop (a quarter of fp32)
  kDiloco,    ///< DiLoCo: intra-site AllReduce each step, outer sync every H steps
  kStreamingDiloco,  ///< Streaming DiLoCo: fragments synced in turn, overlapped with compute
};

/// Parses "ring", "hier", "hier-bf16", "hier-int8", "diloco", "streaming-diloco"; throws
/// std::invalid_argument otherwise.
TrainMode parse_train_mode(const std::string& s);
/// The name parse_train_mode accepts.
std::string to_string(TrainMode m);

/// One training configuration.
struct TrainSetup {
  double params = 1e9;              ///< parameters (the gradient's element count)
  double grad_bytes_per_param = 4;  ///< fp32 gradients / pseudo-gradients
  int sites = 2;
  int ranks_per_site = 8;
  double compute_ms = 0;              ///< compute per step, ms; ≤ 0: from tokens and the GPU
  double tokens_per_gpu_step = 8192;  ///< tokens each GPU processes per step
  Gpu gpu;
  double intra_gbps = 3200;          ///< per-rank rate inside a site (8 × 400 Gbit/s NICs)
  double intra_alpha_ms = 0.01;      ///< per-message latency inside a site, ms
  double alpha_ms = 0.01;            ///< per-message software latency beyond propagation, ms
  Link wan;                          ///< the wide-area link between two sites
  int outer_every = 100;             ///< DiLoCo / Streaming DiLoCo: H, inner steps per outer sync
  double outer_bytes_per_param = 4;  ///< DiLoCo: bytes per element on the wide-area hop
  int fragments = 4;                 ///< Streaming DiLoCo: F fragments
  int overlap_steps = 5;             ///< Streaming DiLoCo: τ inner steps a sync may overlap
  /// Each WAN AllReduce starts with a rendezvous: the receiver's first advert crosses the WAN
  /// before the first RDMA WRITE may leave (ccl's Send/Recv, verbs_control.h), + RTT/2 per
  /// AllReduce. false: receive buffers known in advance (NCCL's pre-registered rings).
  bool rendezvous = false;
  /// The per-step AllReduce overlaps the backward pass (2/3 of the compute): only what
  /// exceeds it is exposed (PyTorch DDP's gradient buckets, Li et al., VLDB 2020). Applies to
  /// every step's synchronisation (ring, hier*, DiLoCo's inner one), not to DiLoCo's blocking
  /// outer sync. false: compute, then the AllReduce (wan_study train's sleep + AllReduce).
  bool overlap_backward = false;
};

/// Compute per step, ms: setup.compute_ms when > 0, else 6·params·tokens_per_gpu_step /
/// (peak · MFU) (forward + backward = 3 × forward's 2 FLOPs per parameter per token; Kaplan
/// et al. 2020 §2.1; every GPU holds or shards a full replica inside its site).
double train_compute_ms(const TrainSetup& s);

/// Flat ring AllReduce of `bytes` over n = sites × ranks_per_site ranks, ms (Thakur,
/// Rabenseifner & Gropp, IJHPCA 2005, §4: 2(n−1)·α + 2(n−1)/n·bytes·β). Every one of the
/// 2(n−1) steps waits for its slowest hop, the wide-area one: α = RTT/2 + alpha_ms,
/// β = 1 / rate — or 1 / (inflight_cap/RTT) when one step's bytes/n exceed the cap. The
/// window is taken as grown (the QPs persist across steps), so no ramp.
double ring_allreduce_ms(double bytes, const TrainSetup& s);

/// Ring AllReduce of `bytes` among the ranks of one site, ms (same formula, intra-site α, β).
double intra_allreduce_ms(double bytes, const TrainSetup& s);

/// Hierarchical AllReduce (ccl/allreduce_hierarchical.cpp), ms: a pipelined chain reduce
/// to the site leader (bytes/intra rate + (r−1)·α_intra), the leaders' ring over the sites
/// on `wan_bytes` (the compressed size; 2(S−1) steps of wan_bytes/S, each α = RTT/2 +
/// alpha_ms; β as in ring_allreduce_ms), the chain broadcast back (same as the reduce);
/// phases not overlapped.
double hier_allreduce_ms(double bytes, double wan_bytes, const TrainSetup& s);

/// One step's prediction.
struct Step {
  double compute_ms = 0;
  double comm_ms = 0;             ///< communication not hidden by compute, per step (mean), ms
  double step_ms = 0;             ///< compute + comm
  double utilisation = 0;         ///< compute / step
  double wan_bytes_per_step = 0;  ///< bytes each site sends over the WAN per step (mean)
};

/// A step of `mode`, ms.
///   ring/hier/hier-bf16/hier-int8: compute + the AllReduce of the gradient, every step
///     (with overlap_backward only what exceeds 2/3 of the compute).
///   DiLoCo (Douillard et al., arXiv 2311.08455, 2023): each inner step AllReduces inside
///     the site; every H = outer_every steps the sites AllReduce the pseudo-gradient
///     (outer_bytes_per_param per parameter) hierarchically, blocking: + outer / H.
///   Streaming DiLoCo (Douillard et al., arXiv 2501.18512, 2025): the parameters in F
///     fragments, one fragment synced every H/F steps, its AllReduce overlapped with τ
///     inner steps; only what exceeds τ steps' time stalls:
///     + F/H · max(0, T(fragment) − τ · inner step).
Step train_step(TrainMode mode, const TrainSetup& s);

/// The smallest WAN rate (Gbit/s, searched on a log scale in [0.001, 1e5]) at which
/// train_step(mode) reaches `target` utilisation; 0 when it is not reached even at 1e5
/// Gbit/s (latency-bound).
double rate_for_utilisation(TrainMode mode, TrainSetup s, double target = 0.9);

}  // namespace softrdma::wan_model
