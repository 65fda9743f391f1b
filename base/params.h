// The parameter registry: every SOFTRDMA_* environment variable the project reads, with its
// type, default, accepted range and help text, in one table (kParams below).
//
// NCCL's NCCL_PARAM macro is the model (one line per parameter, read through one function),
// with two differences: the table is data that `softrdma params` and the docs check read, and
// a variable is read each time it is asked for (not cached), because a process may open its
// device several times under different settings (tests do).
//
// Reading: a handle per parameter (params::kSpinUs, …) and one read_* function per kind:
//
//   int64_t us = 20;
//   std::string error;
//   if (!params::read_integer(params::kSpinUs, us, error)) return fail(error);
//
// An unset variable leaves the value as it was (the caller's default); so does an empty one,
// unless the parameter says `empty_is_error`. A malformed value gives `error` =
// "<NAME>: expected <accepted()>, got '<value>'". Callers that report with exceptions use
// integer()/text(), which throw std::invalid_argument with the same message.
//
// This library is the bottom of the layer stack: it depends on nothing in the project, so
// engine/, verbs/, ccl/ (which must build against the system libibverbs) and tools/ can link
// it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace softrdma::params {

/// Who reads a parameter: the device (engine/ inside the drop-in libibverbs.so.1), the
/// collectives library (ccl/), the KV-cache transfer engine (kv/) or the RDMA-CM (cm/, the
/// drop-in librdmacm.so.1).
enum class Group : uint8_t { kDevice, kCcl, kKv, kCm };

/// How a value is written.
enum class Kind : uint8_t {
  kInteger,   ///< decimal integer in [min, max]
  kSize,      ///< byte count in [min, max], optional suffix k/m/g (also kb/kib, …; ×1024ⁿ)
  kFlag,      ///< 1/on or 0/off
  kChoice,    ///< one of `choices` ("a|b|c")
  kIpv4,      ///< dotted-quad IPv4 address other than 0.0.0.0
  kIpv4List,  ///< one such address, or a comma-separated list of them (no spaces)
  kText,      ///< free text (a path, a host:port, a spec parsed by its reader)
};

/// One registered parameter. Values live in kParams; refer to them by their handles.
struct Param {
  std::string_view name;  ///< the environment variable, e.g. "SOFTRDMA_SPIN_US"
  Group group;
  Kind kind;
  /// The default as the reader applies it (kInteger, kSize: the number; kFlag: 0 or 1).
  /// Parameters whose default is computed at run time say so in default_text.
  int64_t default_value = 0;
  /// Default as documented ("20", "auto", "first free 127.0.0.x").
  std::string_view default_text;
  int64_t min = 0;  ///< kInteger, kSize: smallest accepted value
  int64_t max = 0;  ///< kInteger, kSize: largest accepted value
  /// kChoice: accepted values separated by '|'; kText: a description of the form
  /// ("host:port"), shown as the accepted range.
  std::string_view choices;
  std::string_view unit;        ///< kInteger, kSize: unit of the value ("µs", "ms", "bytes")
  bool ignore_case = false;     ///< kChoice: compare case-insensitively
  bool empty_is_error = false;  ///< a set-but-empty variable is malformed (not "unset")
  std::string_view doc;         ///< what it does (one or two sentences, Markdown)
};

/// Every parameter, grouped by reader. Add a row here and a handle below; `softrdma params`,
/// `softrdma --help` and the docs tables (checked by base_tests) follow.
inline constexpr Param kParams[] = {
    // ---- device (engine/, read when a process opens srdma0) ------------------------------
    {.name = "SOFTRDMA_ADDR",
     .group = Group::kDevice,
     .kind = Kind::kIpv4List,
     .default_text = "first free 127.0.0.1–254",
     .doc = "IPv4 address the device srdma0 binds (UDP 4791; `softrdma run --addr`). GID index "
            "0 is `::ffff:<addr>` (RoCE v2): give verbs programs `-g 0` (pingpong) or `-x 0` "
            "(perftest). A comma-separated list (`127.0.0.2,127.0.0.3`) makes a multi-NIC "
            "host: one device per address, srdma0, srdma1, … in list order"},
    {.name = "SOFTRDMA_NETEM",
     .group = Group::kDevice,
     .kind = Kind::kText,
     .default_text = "off",
     .choices = "loss=P%,every=N,seed=S",
     .doc = "drop transmitted packets (`--netem`), e.g. `loss=5%,every=13,seed=42`"},
    {.name = "SOFTRDMA_WAN",
     .group = Group::kDevice,
     .kind = Kind::kText,
     .default_text = "off",
     .choices = "a topology file, or link parameters",
     .doc = "emulate wide-area links on transmit (`--wan`): a file of `site`/`link` lines, or "
            "one line of parameters for every pair of addresses, e.g. "
            "`delay=10ms,jitter=1ms,loss=0.1%,rate=1gbit` (docs/wide-area.md)"},
    {.name = "SOFTRDMA_PCAP",
     .group = Group::kDevice,
     .kind = Kind::kText,
     .default_text = "off",
     .choices = "a file path",
     .doc = "write every RoCEv2 packet sent and received to this pcap file (`--pcap`; `%p` and "
            "`%a` become the pid and the device address); tshark/Wireshark decode it"},
    {.name = "SOFTRDMA_LOG",
     .group = Group::kDevice,
     .kind = Kind::kChoice,
     .default_text = "warn",
     .choices = "trace|debug|info|warn|error|critical|off",
     .doc = "library log level (`--log`), to stderr"},
    {.name = "SOFTRDMA_TRANSPORT",
     .group = Group::kDevice,
     .kind = Kind::kChoice,
     .default_text = "auto",
     .choices = "auto|udp|shm",
     .doc = "packet path (`--transport`): `auto` = shared memory to peers that are softrdma "
            "devices on this host, UDP to the rest; `udp` = UDP port 4791 only (the wire, e.g. "
            "for tcpdump); `shm` = shared memory only"},
    {.name = "SOFTRDMA_GSO",
     .group = Group::kDevice,
     .kind = Kind::kFlag,
     .default_value = 1,
     .default_text = "1",
     .doc = "UDP GSO on send and GRO on receive (UDP path). With GSO, `lo` carries each batch "
            "as one datagram: use 0 for per-packet tcpdump"},
    {.name = "SOFTRDMA_SELECTIVE_RETX",
     .group = Group::kDevice,
     .kind = Kind::kFlag,
     .default_value = 1,
     .default_text = "1",
     .doc = "selective retransmission between softrdma peers (IRN-style, docs/wide-area.md): "
            "requests carry a reserved BTH bit; a responder with it on keeps what arrives out "
            "of order (places WRITE segments, stages SENDs to execute in order), NAKs only "
            "the missing PSNs and says how many it holds "
            "and which runs are still missing (selective ACKs), so the requester's window "
            "counts only what is in flight and a lost NAK or resend is sent again within a "
            "round trip; a "
            "requester places READ responses that arrive out of order and asks for the lost "
            "ones alone. 0: "
            "go-back-N only, as with any other RoCE peer"},
    {.name = "SOFTRDMA_FAULT_GUARD",
     .group = Group::kDevice,
     .kind = Kind::kFlag,
     .default_value = 1,
     .default_text = "1",
     .doc = "copies into and out of registered memory survive memory unmapped since "
            "registration (a SIGSEGV/SIGBUS handler; the access fails with a remote access "
            "error). 0: plain copies, no handler (for programs whose own SIGSEGV handler must "
            "see every fault)"},
    {.name = "SOFTRDMA_SHM_PLACE",
     .group = Group::kDevice,
     .kind = Kind::kFlag,
     .default_value = 1,
     .default_text = "1",
     .doc = "same-host direct placement (docs/architecture.md, \"One copy on the same-host "
            "path\"): an RDMA WRITE's payload goes from the requester's memory straight into "
            "the responder's (process_vm_writev), checked against the regions and QPs the "
            "responder publishes; the ring carries the headers only. Falls back to the ring "
            "where cross-memory attach is refused. 0: every payload through the ring"},
    {.name = "SOFTRDMA_CC",
     .group = Group::kDevice,
     .kind = Kind::kChoice,
     .default_text = "auto",
     .choices = "auto|dcqcn|none",
     .doc = "congestion control of requesters (docs/wide-area.md): `dcqcn` = DCQCN's reaction "
            "point (Zhu et al., SIGCOMM 2015) paces each QP, cut by RoCEv2 CNPs; `none` = the "
            "congestion window only; `auto` = `dcqcn` when a SOFTRDMA_WAN link marks ECN "
            "(`ecn=`), else `none`"},
    {.name = "SOFTRDMA_SPIN_US",
     .group = Group::kDevice,
     .kind = Kind::kInteger,
     .default_value = 20,
     .default_text = "20",
     .min = 0,
     .max = 1'000'000,
     .unit = "µs",
     .doc = "how long the progress thread keeps polling shared-memory rings after traffic "
            "before it sleeps (never while the CPUs are oversubscribed)"},
    {.name = "SOFTRDMA_DM_SIZE",
     .group = Group::kDevice,
     .kind = Kind::kSize,
     .default_value = 256 * 1024,
     .default_text = "256k",
     .min = 0,
     .max = int64_t{1} << 30,
     .unit = "bytes",
     .empty_is_error = true,
     .doc = "device memory of each device (`max_dm_size`): what `ibv_alloc_dm` hands out in "
            "all, counted in 64-byte units; 0: no device memory (docs/verbs.md)"},

    {.name = "SOFTRDMA_TDF",
     .group = Group::kDevice,
     .kind = Kind::kText,
     .default_text = "1",
     .choices = "a real number in 1..1000000",
     .doc = "time dilation factor K (`softrdma run --tdf`): every clock softrdma reads runs K "
            "times slower than real time (CLOCK_MONOTONIC / K), so emulated link rates and "
            "delays, timers, timeouts and the tools' measurements are virtual: 100 Gbit/s at "
            "K = 50 is paced at 2 Gbit/s real (docs/wide-area.md, Time dilation). Every "
            "process of one emulated system must use the same K"},
    {.name = "SOFTRDMA_TDF_EPOCH",
     .group = Group::kDevice,
     .kind = Kind::kInteger,
     .default_value = 0,
     .default_text = "the boot time",
     .min = 0,
     .max = INT64_MAX,
     .unit = "ns since 1970",
     .doc = "with SOFTRDMA_TDF: the instant from which the wall clock (CLOCK_REALTIME) is "
            "dilated; `softrdma run --tdf` sets it to its start"},

    // ---- ccl (collectives) -------------------------------------------------------------------
    {.name = "SOFTRDMA_CCL_ALGO",
     .group = Group::kCcl,
     .kind = Kind::kChoice,
     .default_text = "auto",
     .choices = "ring|rd|recursive_doubling|rabenseifner|hierarchical|auto",
     .ignore_case = true,
     .doc = "algorithm family: `ring` (bandwidth; chain for Broadcast/Reduce), `rd` = the "
            "log2(n)-message algorithms (recursive doubling, binomial trees, Bruck, recursive "
            "halving), `rabenseifner` (AllReduce; elsewhere as auto), `hierarchical` (AllReduce "
            "by site, SOFTRDMA_CCL_SITE; elsewhere as auto), `auto` by size, rank count and "
            "sites (docs/collectives.md)"},
    {.name = "SOFTRDMA_CCL_SITE",
     .group = Group::kCcl,
     .kind = Kind::kText,
     .default_text = "unset",
     .choices = "a site name, at most 63 characters",
     .doc = "the site (data centre) of this rank; ranks exchange sites at their first "
            "AllReduce (unset ranks form one site) and `auto` runs the hierarchical AllReduce "
            "when they span several sites (docs/wide-area.md, WAN-aware collectives)"},
    {.name = "SOFTRDMA_CCL_WAN_COMPRESS",
     .group = Group::kCcl,
     .kind = Kind::kChoice,
     .default_text = "none",
     .choices = "none|fp16|bf16",
     .ignore_case = true,
     .doc = "hierarchical AllReduce of float32: the leaders' AllReduce between sites runs on "
            "the buffer rounded to float16 / bfloat16 (half the wide-area bytes; precision cost "
            "in docs/wide-area.md)"},
    {.name = "SOFTRDMA_CCL_SMALL_BYTES",
     .group = Group::kCcl,
     .kind = Kind::kSize,
     .default_value = 64 * 1024,
     .default_text = "64k",
     .min = 0,
     .max = int64_t{1} << 40,
     .unit = "bytes",
     .empty_is_error = true,
     .doc = "auto: at or below this the log2(n)-message algorithms run (AllGather and "
            "ReduceScatter: the whole n-block buffer)"},
    {.name = "SOFTRDMA_CCL_MEDIUM_BYTES",
     .group = Group::kCcl,
     .kind = Kind::kSize,
     .default_value = 1024 * 1024,
     .default_text = "1m",
     .min = 0,
     .max = int64_t{1} << 40,
     .unit = "bytes",
     .empty_is_error = true,
     .doc = "auto, AllReduce with more than 2 ranks: above SOFTRDMA_CCL_SMALL_BYTES and up to "
            "this, Rabenseifner; above (and with 2 ranks), the ring"},
    {.name = "SOFTRDMA_CCL_EAGER_BYTES",
     .group = Group::kCcl,
     .kind = Kind::kSize,
     .default_value = 8192,
     .default_text = "8k",
     .min = 0,
     .max = 65536,
     .unit = "bytes",
     .empty_is_error = true,
     .doc = "transfers up to this size travel in the control SEND into a pre-posted slot (one "
            "one-way trip); larger ones by rendezvous (advert + RDMA WRITE); 0: always "
            "rendezvous. Each pair of ranks uses the smaller of their two values"},
    {.name = "SOFTRDMA_CCL_CHANNELS",
     .group = Group::kCcl,
     .kind = Kind::kInteger,
     .default_value = 1,
     .default_text = "1",
     .min = 1,
     .max = 16,
     .empty_is_error = true,
     .doc = "RC QPs per peer (NCCL's channels): a rendezvous transfer is split into up to this "
            "many contiguous stripes, one RDMA WRITE WITH IMMEDIATE per QP. Each pair of ranks "
            "uses the smaller of their two values"},
    {.name = "SOFTRDMA_CCL_CHANNEL_MIN_BYTES",
     .group = Group::kCcl,
     .kind = Kind::kSize,
     .default_value = 64 * 1024,
     .default_text = "64k",
     .min = 4096,
     .max = int64_t{1} << 30,
     .unit = "bytes",
     .empty_is_error = true,
     .doc = "a transfer is striped over k channels only when each stripe gets at least this "
            "many bytes (the receiver decides k and says so in its advert)"},
    {.name = "SOFTRDMA_CCL_CHUNK_BYTES",
     .group = Group::kCcl,
     .kind = Kind::kSize,
     .default_value = 512 * 1024,
     .default_text = "512k",
     .min = 1,
     .max = int64_t{1} << 30,
     .unit = "bytes",
     .empty_is_error = true,
     .doc = "pipeline chunk of the ring algorithms (one RDMA WRITE stays well under the 2 GiB "
            "message limit)"},
    {.name = "SOFTRDMA_CCL_DEPTH",
     .group = Group::kCcl,
     .kind = Kind::kInteger,
     .default_value = 4,
     .default_text = "4",
     .min = 1,
     .max = 256,
     .unit = "chunks",
     .empty_is_error = true,
     .doc = "chunks in flight per peer (on a long path, at least: see "
            "SOFTRDMA_CCL_DEPTH_FROM_PATH)"},
    {.name = "SOFTRDMA_CCL_DEPTH_FROM_PATH",
     .group = Group::kCcl,
     .kind = Kind::kFlag,
     .default_value = 1,
     .default_text = "1",
     .doc = "raise the depth to cover each peer's bandwidth-delay product: ⌈RTT × port rate ÷ "
            "chunk⌉ chunks, at most 256, the RTT measured at connect with zero-length RDMA "
            "WRITEs (docs/collectives.md, \"Depth\"); 0 keeps SOFTRDMA_CCL_DEPTH on every "
            "path"},
    {.name = "SOFTRDMA_CCL_TIMEOUT_MS",
     .group = Group::kCcl,
     .kind = Kind::kInteger,
     .default_value = 30000,
     .default_text = "30000",
     .min = 1,
     .max = 86'400'000,
     .unit = "ms",
     .doc = "a blocking call raises `PeerError` when the peer it waits for made no progress "
            "this long"},
    {.name = "SOFTRDMA_CCL_BOOTSTRAP_TIMEOUT_MS",
     .group = Group::kCcl,
     .kind = Kind::kInteger,
     .default_value = 30000,
     .default_text = "30000",
     .min = 1,
     .max = 86'400'000,
     .unit = "ms",
     .doc = "how long the rendezvous waits for all ranks"},
    {.name = "SOFTRDMA_CCL_MASTER",
     .group = Group::kCcl,
     .kind = Kind::kText,
     .default_text = "—",
     .choices = "host:port",
     .doc = "the rendezvous (mpirun/Slurm across hosts; overrides torchrun's)"},
    {.name = "SOFTRDMA_CCL_HOST",
     .group = Group::kCcl,
     .kind = Kind::kText,
     .default_text = "—",
     .choices = "a host name or address",
     .doc = "the address `make_unique_id()` advertises"},
    {.name = "SOFTRDMA_CCL_SOCKET_IFNAME",
     .group = Group::kCcl,
     .kind = Kind::kText,
     .default_text = "first up non-loopback",
     .choices = "an interface name",
     .doc = "the interface whose IPv4 address `make_unique_id()` advertises when "
            "SOFTRDMA_CCL_HOST is unset"},
    {.name = "SOFTRDMA_CCL_IB_DEVICE",
     .group = Group::kCcl,
     .kind = Kind::kText,
     .default_text = "first device",
     .choices = "a verbs device name",
     .doc = "verbs device name"},
    {.name = "SOFTRDMA_CCL_IB_PORT",
     .group = Group::kCcl,
     .kind = Kind::kInteger,
     .default_value = 1,
     .default_text = "1",
     .min = 1,
     .max = 255,
     .doc = "port"},
    {.name = "SOFTRDMA_CCL_IB_GID_INDEX",
     .group = Group::kCcl,
     .kind = Kind::kInteger,
     .default_value = 0,
     .default_text = "0",
     .min = 0,
     .max = 255,
     .doc = "GID index (RoCE)"},
    {.name = "SOFTRDMA_CCL_IB_TIMEOUT",
     .group = Group::kCcl,
     .kind = Kind::kInteger,
     .default_value = 14,
     .default_text = "14",
     .min = 1,
     .max = 31,
     .doc = "QP ACK timeout exponent: 4.096 µs·2^x per retry (14 ≈ 67 ms)"},
    {.name = "SOFTRDMA_CCL_IB_RETRY_CNT",
     .group = Group::kCcl,
     .kind = Kind::kInteger,
     .default_value = 7,
     .default_text = "7",
     .min = 0,
     .max = 7,
     .doc = "retransmissions before a peer is declared unreachable (14/7: ~0.5 s)"},
    {.name = "SOFTRDMA_CCL_IB_MAX_WRITE",
     .group = Group::kCcl,
     .kind = Kind::kInteger,
     .default_value = 0,
     .default_text = "port max_msg_sz, ≤ 1 GiB",
     .min = 0,
     .max = int64_t{1} << 40,
     .unit = "bytes",
     .doc = "bytes per RDMA WRITE (longer transfers are split; 0: the default)"},
    {.name = "SOFTRDMA_CCL_SPIN_US",
     .group = Group::kCcl,
     .kind = Kind::kInteger,
     .default_value = 50,
     .default_text = "50",
     .min = 0,
     .max = 10'000'000,
     .unit = "µs",
     .doc = "busy-poll time before a waiting rank starts napping"},
    {.name = "SOFTRDMA_CCL_NAP_US",
     .group = Group::kCcl,
     .kind = Kind::kInteger,
     .default_value = 20,
     .default_text = "20",
     .min = 1,
     .max = 10'000,
     .unit = "µs",
     .doc = "nap between polls while waiting (then 10 ms sleeps after 20 ms idle)"},

    // ---- kv (KV-cache transfer engine) -------------------------------------------------------
    {.name = "SOFTRDMA_KV_METADATA",
     .group = Group::kKv,
     .kind = Kind::kText,
     .default_text = "—",
     .choices = "tcp://host:port or file:///dir",
     .doc = "the metadata store kv-bench and kv-demo open when `--metadata` is not given: a "
            "`kv::TcpMetadataServer` (`--serve-metadata`) or a shared directory"},
    {.name = "SOFTRDMA_KV_HOST",
     .group = Group::kKv,
     .kind = Kind::kText,
     .default_text = "the device's IPv4 address",
     .choices = "a host name or address",
     .doc = "the address an engine's handshake listener binds and advertises (TCP, where peers "
            "exchange QP numbers)"},
    {.name = "SOFTRDMA_KV_IB_DEVICE",
     .group = Group::kKv,
     .kind = Kind::kText,
     .default_text = "every active device",
     .choices = "a verbs device name, or a comma-separated list",
     .doc = "verbs device(s) the engine opens; with several, its QPs to a peer and the slices "
            "over them are striped across the devices (docs/kv.md, Devices)"},
    {.name = "SOFTRDMA_KV_IB_GID_INDEX",
     .group = Group::kKv,
     .kind = Kind::kInteger,
     .default_value = 0,
     .default_text = "0",
     .min = 0,
     .max = 255,
     .doc = "GID index (RoCE)"},
    {.name = "SOFTRDMA_KV_QPS",
     .group = Group::kKv,
     .kind = Kind::kInteger,
     .default_value = 2,
     .default_text = "2",
     .min = 1,
     .max = 16,
     .unit = "QPs",
     .empty_is_error = true,
     .doc = "RC QPs per peer; slices are striped over them (Mooncake: 2). The engine that opens "
            "the connection decides"},
    {.name = "SOFTRDMA_KV_SLICE_BYTES",
     .group = Group::kKv,
     .kind = Kind::kSize,
     .default_value = 256 * 1024,
     .default_text = "256k",
     .min = 4096,
     .max = int64_t{1} << 30,
     .unit = "bytes",
     .empty_is_error = true,
     .doc = "transfers are cut into slices of this size (one work request each; a tail of at "
            "most a quarter slice joins the slice before it, as in Mooncake)"},
    {.name = "SOFTRDMA_KV_MAX_WR",
     .group = Group::kKv,
     .kind = Kind::kInteger,
     .default_value = 1024,
     .default_text = "1024",
     .min = 1,
     .max = 8192,
     .unit = "WRs",
     .empty_is_error = true,
     .doc = "slices outstanding per QP; the rest wait in the engine's queue. Over a long link "
            "the bytes outstanding (max_wr × QPs × slice or block size) must cover the "
            "bandwidth-delay product: a Llama-3-8B hand-off of scattered 32 KiB blocks over 10 "
            "Gbit/s and 50 ms RTT took 857 ms at 256 (16 MiB outstanding over 2 QPs), 391 ms "
            "at 1024 (64 MiB, one BDP); with 32, 10 ms RTT ran at 1.5 Gbit/s. The floor: "
            "SOFTRDMA_KV_MAX_WR_FROM_PATH raises it from the measured path"},
    {.name = "SOFTRDMA_KV_MAX_WR_FROM_PATH",
     .group = Group::kKv,
     .kind = Kind::kFlag,
     .default_value = 1,
     .default_text = "1",
     .doc = "raise each QP's slices outstanding to cover four times the path's "
            "bandwidth-delay product once connected (a loaded round trip's worth — the path "
            "and a one-BDP queue — in flight, as much again behind a loss being repaired): 4 × "
            "RTT (5 zero-length RDMA WRITEs, the smallest) × port rate ÷ QPs in bytes, in "
            "slices of whatever size the transfers have, at most 32768 (the send queue's "
            "depth, within the device's max_qp_wr) and as the CQ allows (docs/kv.md, "
            "\"Slices in flight\"); 0 keeps SOFTRDMA_KV_MAX_WR"},
    {.name = "SOFTRDMA_KV_IB_TIMEOUT",
     .group = Group::kKv,
     .kind = Kind::kInteger,
     .default_value = 14,
     .default_text = "14",
     .min = 1,
     .max = 31,
     .doc = "QP ACK timeout exponent: 4.096 µs·2^x per retry (14 ≈ 67 ms; set it above the RTT "
            "on long links)"},
    {.name = "SOFTRDMA_KV_IB_RETRY_CNT",
     .group = Group::kKv,
     .kind = Kind::kInteger,
     .default_value = 7,
     .default_text = "7",
     .min = 0,
     .max = 7,
     .doc = "retransmissions before a peer is declared dead: a transfer to a dead peer fails "
            "after about (retry_cnt + 1) ACK timeouts (14/7: ~0.5 s)"},
    {.name = "SOFTRDMA_KV_MAX_RD_ATOMIC",
     .group = Group::kKv,
     .kind = Kind::kInteger,
     .default_value = 16,
     .default_text = "16",
     .min = 1,
     .max = 255,
     .doc = "RDMA READs (and atomics) in flight per QP, at most: each side offers "
            "min(this, its device's max_qp_rd_atom) as responder resources in the handshake, "
            "and an initiator uses min(this, its max_qp_init_rd_atom, the peer's offer) (IBTA "
            "vol 1, 9.5: a requester must not exceed the responder's resources)"},
    {.name = "SOFTRDMA_KV_SPIN_US",
     .group = Group::kKv,
     .kind = Kind::kInteger,
     .default_value = 50,
     .default_text = "50",
     .min = 0,
     .max = 10'000'000,
     .unit = "µs",
     .doc = "how long the engine's progress thread busy-polls its CQ after a completion before "
            "it sleeps on the completion channel"},
    {.name = "SOFTRDMA_KV_POLL_BUSY",
     .group = Group::kKv,
     .kind = Kind::kFlag,
     .default_value = 1,
     .default_text = "1",
     .doc = "1: the progress thread busy-polls its CQs for as long as it has READs/WRITEs "
            "outstanding (one core per engine while transferring, as perftest and NCCL's "
            "proxy do: a polling consumer needs no doorbell per completion); 0: it polls "
            "SOFTRDMA_KV_SPIN_US after each completion, then sleeps"},
    {.name = "SOFTRDMA_KV_CONNECT_TIMEOUT_MS",
     .group = Group::kKv,
     .kind = Kind::kInteger,
     .default_value = 10000,
     .default_text = "10000",
     .min = 1,
     .max = 86'400'000,
     .unit = "ms",
     .doc = "bound on one handshake with a peer (TCP connect, QP exchange)"},
    // ---- RDMA-CM (cm/, the drop-in librdmacm.so.1, read when it opens a device) ----------
    {.name = "SOFTRDMA_CM_RESPONSE_TIMEOUT",
     .group = Group::kCm,
     .kind = Kind::kInteger,
     .default_value = 20,
     .default_text = "20 (4.3 s)",
     .min = 8,
     .max = 24,
     .unit = "(n of 4.096 µs · 2^n)",
     .doc = "CM response timeout written in REQ/REP (IBTA 12.6.5; Linux's CMA_CM_RESPONSE_TIMEOUT "
            "is 20): a REQ, REP, DREQ or SIDR_REQ is resent after 2 × packet life time + this"},
    {.name = "SOFTRDMA_CM_RETRIES",
     .group = Group::kCm,
     .kind = Kind::kInteger,
     .default_value = 15,
     .default_text = "15",
     .min = 0,
     .max = 15,
     .doc = "Max CM Retries: resends before a connection attempt ends in "
            "RDMA_CM_EVENT_UNREACHABLE (Linux's CMA_MAX_CM_RETRIES is 15)"},
};

/// The registered parameter called `name`; a name not in kParams does not compile.
consteval const Param& by_name(std::string_view name) {
  for (const Param& p : kParams)
    if (p.name == name) return p;
  throw "not a registered SOFTRDMA_* parameter";  // makes the call ill-formed at compile time
}

// Handles, one per parameter.
inline constexpr const Param& kAddr = by_name("SOFTRDMA_ADDR");
inline constexpr const Param& kCmResponseTimeout = by_name("SOFTRDMA_CM_RESPONSE_TIMEOUT");
inline constexpr const Param& kCmRetries = by_name("SOFTRDMA_CM_RETRIES");
inline constexpr const Param& kNetem = by_name("SOFTRDMA_NETEM");
inline constexpr const Param& kWan = by_name("SOFTRDMA_WAN");
inline constexpr const Param& kPcap = by_name("SOFTRDMA_PCAP");
inline constexpr const Param& kLog = by_name("SOFTRDMA_LOG");
inline constexpr const Param& kTransport = by_name("SOFTRDMA_TRANSPORT");
inline constexpr const Param& kGso = by_name("SOFTRDMA_GSO");
inline constexpr const Param& kSpinUs = by_name("SOFTRDMA_SPIN_US");
inline constexpr const Param& kSelectiveRetx = by_name("SOFTRDMA_SELECTIVE_RETX");
inline constexpr const Param& kCc = by_name("SOFTRDMA_CC");
inline constexpr const Param& kFaultGuard = by_name("SOFTRDMA_FAULT_GUARD");
inline constexpr const Param& kShmPlace = by_name("SOFTRDMA_SHM_PLACE");
inline constexpr const Param& kDmSize = by_name("SOFTRDMA_DM_SIZE");
inline constexpr const Param& kTdf = by_name("SOFTRDMA_TDF");
inline constexpr const Param& kTdfEpoch = by_name("SOFTRDMA_TDF_EPOCH");
inline constexpr const Param& kCclAlgo = by_name("SOFTRDMA_CCL_ALGO");
inline constexpr const Param& kCclSite = by_name("SOFTRDMA_CCL_SITE");
inline constexpr const Param& kCclWanCompress = by_name("SOFTRDMA_CCL_WAN_COMPRESS");
inline constexpr const Param& kCclSmallBytes = by_name("SOFTRDMA_CCL_SMALL_BYTES");
inline constexpr const Param& kCclMediumBytes = by_name("SOFTRDMA_CCL_MEDIUM_BYTES");
inline constexpr const Param& kCclEagerBytes = by_name("SOFTRDMA_CCL_EAGER_BYTES");
inline constexpr const Param& kCclChannels = by_name("SOFTRDMA_CCL_CHANNELS");
inline constexpr const Param& kCclChannelMinBytes = by_name("SOFTRDMA_CCL_CHANNEL_MIN_BYTES");
inline constexpr const Param& kCclChunkBytes = by_name("SOFTRDMA_CCL_CHUNK_BYTES");
inline constexpr const Param& kCclDepth = by_name("SOFTRDMA_CCL_DEPTH");
inline constexpr const Param& kCclDepthFromPath = by_name("SOFTRDMA_CCL_DEPTH_FROM_PATH");
inline constexpr const Param& kCclTimeoutMs = by_name("SOFTRDMA_CCL_TIMEOUT_MS");
inline constexpr const Param& kCclBootstrapTimeoutMs = by_name("SOFTRDMA_CCL_BOOTSTRAP_TIMEOUT_MS");
inline constexpr const Param& kCclMaster = by_name("SOFTRDMA_CCL_MASTER");
inline constexpr const Param& kCclHost = by_name("SOFTRDMA_CCL_HOST");
inline constexpr const Param& kCclSocketIfname = by_name("SOFTRDMA_CCL_SOCKET_IFNAME");
inline constexpr const Param& kCclIbDevice = by_name("SOFTRDMA_CCL_IB_DEVICE");
inline constexpr const Param& kCclIbPort = by_name("SOFTRDMA_CCL_IB_PORT");
inline constexpr const Param& kCclIbGidIndex = by_name("SOFTRDMA_CCL_IB_GID_INDEX");
inline constexpr const Param& kCclIbTimeout = by_name("SOFTRDMA_CCL_IB_TIMEOUT");
inline constexpr const Param& kCclIbRetryCnt = by_name("SOFTRDMA_CCL_IB_RETRY_CNT");
inline constexpr const Param& kCclIbMaxWrite = by_name("SOFTRDMA_CCL_IB_MAX_WRITE");
inline constexpr const Param& kCclSpinUs = by_name("SOFTRDMA_CCL_SPIN_US");
inline constexpr const Param& kCclNapUs = by_name("SOFTRDMA_CCL_NAP_US");
inline constexpr const Param& kKvMetadata = by_name("SOFTRDMA_KV_METADATA");
inline constexpr const Param& kKvHost = by_name("SOFTRDMA_KV_HOST");
inline constexpr const Param& kKvIbDevice = by_name("SOFTRDMA_KV_IB_DEVICE");
inline constexpr const Param& kKvIbGidIndex = by_name("SOFTRDMA_KV_IB_GID_INDEX");
inline constexpr const Param& kKvQps = by_name("SOFTRDMA_KV_QPS");
inline constexpr const Param& kKvSliceBytes = by_name("SOFTRDMA_KV_SLICE_BYTES");
inline constexpr const Param& kKvMaxWr = by_name("SOFTRDMA_KV_MAX_WR");
inline constexpr const Param& kKvMaxWrFromPath = by_name("SOFTRDMA_KV_MAX_WR_FROM_PATH");
inline constexpr const Param& kKvIbTimeout = by_name("SOFTRDMA_KV_IB_TIMEOUT");
inline constexpr const Param& kKvIbRetryCnt = by_name("SOFTRDMA_KV_IB_RETRY_CNT");
inline constexpr const Param& kKvMaxRdAtomic = by_name("SOFTRDMA_KV_MAX_RD_ATOMIC");
inline constexpr const Param& kKvSpinUs = by_name("SOFTRDMA_KV_SPIN_US");
inline constexpr const Param& kKvPollBusy = by_name("SOFTRDMA_KV_POLL_BUSY");
inline constexpr const Param& kKvConnectTimeoutMs = by_name("SOFTRDMA_KV_CONNECT_TIMEOUT_MS");

/// Every registered parameter, in table order.
std::span<const Param> all();

/// What `p` accepts, for messages and docs: "an integer in 0..1000000 (µs)", "one of auto,
/// udp, shm", "1/on or 0/off", "an IPv4 address", or the form of a kText parameter.
std::string accepted(const Param& p);

/// kChoice: the accepted values, in order (for command-line checks that mirror a variable).
std::vector<std::string> choices(const Param& p);

/// "<NAME>: expected <accepted(p)>, got '<value>'": the message of every malformed value.
std::string malformed(const Param& p, std::string_view value);

/// The variable's value, or nullptr when unset or (unless p.empty_is_error) empty.
const char* raw(const Param& p);

// ---- reading; each returns false with `error` = malformed(…) on a bad value and leaves
// `out` unchanged when the variable is unset. Using the wrong kind is a programming error
// (checked by assert).

/// kInteger, kSize.
bool read_integer(const Param& p, int64_t& out, std::string& error);
/// kFlag: true for 1/on, false for 0/off.
bool read_flag(const Param& p, bool& out, std::string& error);
/// kChoice: the value as listed in p.choices (so lower case when p.ignore_case); kText: the
/// value as set.
bool read_text(const Param& p, std::string& out, std::string& error);
/// kIpv4: host byte order. kIpv4List: the first address (every entry is checked).
bool read_ipv4(const Param& p, uint32_t& out, std::string& error);
/// kIpv4List (or kIpv4): every address, host byte order, in the order given; a malformed or
/// empty entry, or 0.0.0.0, is an error naming the whole value.
bool read_ipv4_list(const Param& p, std::vector<uint32_t>& out, std::string& error);

/// read_integer over p.default_value; throws std::invalid_argument(malformed(…)).
int64_t integer(const Param& p);
/// read_integer over `fallback` (a default computed by the caller); throws like integer(p).
int64_t integer(const Param& p, int64_t fallback);
/// read_flag over `fallback` (the caller's default); throws like integer(p).
bool flag(const Param& p, bool fallback);
/// read_text over p.default_text for kChoice, over "" for kText; throws like integer(p).
std::string text(const Param& p);

// ---- listing (softrdma params, the docs check) ----

/// A Markdown table of `group`'s parameters: | variable | default | accepted | meaning |.
std::string markdown_table(Group group);
/// Plain text for a terminal, `width` columns: each parameter's name, default and accepted
/// values on one line, its doc indented below.
std::string help_text(Group group, size_t width = 80);
/// "device" / "ccl" / "kv".
std::string_view group_name(Group group);

}  // namespace softrdma::params
