// softrdma — command-line companion of the softrdma drop-ins libibverbs.so.1 and librdmacm.so.1.
//
//   softrdma run [--addr IP[,IP...]] [--transport auto|udp|shm] [--netem SPEC] [--wan FILE|SPEC]
//                [--pcap FILE] [--log LEVEL] [--tdf K] [--rsockets] -- PROGRAM [ARGS...]
//       Runs an unmodified verbs program over softrdma: checks the options, exports
//       SOFTRDMA_ADDR / SOFTRDMA_NETEM / SOFTRDMA_WAN / SOFTRDMA_PCAP / SOFTRDMA_LOG, puts the
//       directory holding
//       the drop-in libibverbs.so.1 and librdmacm.so.1 (<dir of this executable>/../lib) first
//       in LD_LIBRARY_PATH, preloads libsoftrdma_sysfs.so from the same directory (the virtual
//       /sys/class/infiniband, /sys/class/infiniband_verbs and /dev/infiniband; --no-sysfs
//       leaves it out) and execs PROGRAM in place of itself (same pid, exit status, signals
//       and stdio). --tdf K (time dilation, base/clock.h) sets SOFTRDMA_TDF=K and
//       SOFTRDMA_TDF_EPOCH, preloads libsoftrdma_tdf.so (PROGRAM's clock_gettime,
//       gettimeofday, time and sleeps run K times slower) and prints on stderr which
//       programs do not see it (perftest on x86 reads the TSC). --rsockets preloads Debian's
//       librspreload (rdma-core's, over this librdmacm's rsockets) behind
//       libsoftrdma_rspreload_shim.so: PROGRAM's AF_INET stream sockets become rsockets.
//
//   softrdma stat [--all] [--json]
//       Prints the counters that every open softrdma device publishes in
//       /dev/shm/softrdma.<ipv4>.<pid> (see engine/counters.h), in the style of Linux rxe's
//       hw_counters: one "name value" line per counter.
//
//   softrdma stat --clean
//       Removes the counter files, same-host mailboxes, address-share registries and rdma_cm
//       port tables left behind by processes that have exited.
//
//   softrdma sysfs --create DIR [--addr IP[,IP...]]
//       Writes the sysfs and /dev entries of srdma0 (srdma1, … for further addresses: the tree
//       `softrdma run` shows every program through libsoftrdma_sysfs.so) under DIR, for an
//       administrator to bind-mount
//       (docs/verbs.md, "The device outside the verbs API").
//
//   softrdma params [--markdown] [device|ccl]
//       Lists every SOFTRDMA_* environment variable from the registry (base/params.h): name,
//       default, accepted values, meaning; --markdown prints the docs' tables.
//
// Exit status: 0 on success; 2 for a usage error (bad option, malformed --addr, --netem,
// --wan or --log); 1 when the drop-in library cannot be found or a file cannot be removed; 127 when
// PROGRAM cannot be executed. After a successful exec the status is PROGRAM's own.
#include <link.h>
#include <unistd.h>

#include <fmt/core.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "base/clock.h"
#include "base/params.h"
#include "cm/shared_ports.h"
#include "engine/counters.h"
#include "net/address_share.h"
#include "net/netem.h"
#include "net/shm_port.h"
#include "net/udp_port.h"
#include "net/wan_topology.h"
#include "verbs/device_identity.h"
#include "verbs/device_name.h"
#include "verbs/sysfs/tree.h"

namespace {

namespace fs = std::filesystem;
namespace params = softrdma::params;
using softrdma::engine::DeviceStats;

/// Exit status of usage errors (bad option or option value), as in most Unix tools.
constexpr int kExitUsage = 2;
/// Exit status when the program to run cannot be executed (as in POSIX shells).
constexpr int kExitCannotExec = 127;

/// The verbs device name every softrdma process exposes (one device per process).
using softrdma::verbs::kDeviceName;

void error(const std::string& msg) {
  fmt::print(stderr, "softrdma: {}\n", msg);
}

/// The directory that should hold the drop-ins libibverbs.so.1 and librdmacm.so.1:
/// <dir of /proc/self/exe>/../lib (the build puts programs in build/bin and libraries in
/// build/lib). Returns nullopt and sets `why` if either is not there.
std::optional<fs::path> find_dropin_dir(std::string& why) {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) {
    why = "cannot read /proc/self/exe: " + ec.message();
    return std::nullopt;
  }
  fs::path dir = (exe.parent_path() / ".." / "lib").lexically_normal();
  fs::path canonical = fs::weakly_canonical(dir, ec);
  if (!ec) dir = canonical;
  for (const auto& [lib, target] : {std::pair{"libibverbs.so.1", "softrdma_verbs"},
                                    std::pair{"librdmacm.so.1", "softrdma_rdmacm"}}) {
    if (!fs::exists(dir / lib, ec)) {
      why = fmt::format(
          "the softrdma {} is not in {} (expected next to {} as ../lib/); "
          "build the {} target",
          lib, dir.string(), exe.string(), target);
      return std::nullopt;
    }
  }
  return dir;
}

/// Path of the AddressSanitizer runtime loaded in this process, if any. In a sanitizer
/// build the drop-in library is instrumented too, and an uninstrumented program can only
/// load it if the ASan runtime comes first in its library list, i.e. via LD_PRELOAD.
std::string loaded_asan_runtime() {
  std::string found;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        const char* name = info->dlpi_name;
        if (name && std::strstr(name, "/libasan.so")) {
          *static_cast<std::string*>(data) = name;
          return 1;
        }
        return 0;
      },
      &found);
  return found;
}

/// Puts `entry` first in the colon-separated list held by environment variable `var`.
void prepend_env_path(const char* var, const std::string& entry) {
  const char* old = std::getenv(var);
  std::string value = entry;
  if (old && *old) value += std::string(":") + old;
  ::setenv(var, value.c_str(), 1);
}

/// Options of `softrdma run`.
struct RunOptions {
  std::string addr;
  std::string netem;
  std::string wan;
  std::string pcap;
  std::string log;
  std::string transport;
  std::string tdf;
  bool no_sysfs = false;
  bool rsockets = false;
  std::vector<std::string> command;
};

/// Debian's librspreload (package librdmacm1): socket calls on AF_INET stream sockets to the
/// rsocket calls of librdmacm.so.1, everything else to libc.
constexpr const char* kRspreload = "/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so";

/// Parses --addr: one IPv4 address or a comma-separated list of them (one device each:
/// srdma0, srdma1, …) into `ips` (host order). Prints the usage error and returns false for
/// a malformed entry or 0.0.0.0.
bool parse_addr_list(const std::string& addr, std::vector<uint32_t>& ips) {
  size_t at = 0;
  for (;;) {
    const size_t comma = addr.find(',', at);
    const std::string one = addr.substr(at, comma == std::string::npos ? comma : comma - at);
    uint32_t ip = 0;
    if (!softrdma::net::ipv4_from_string(one, ip) || ip == 0) {
      error(
          fmt::format("--addr: '{}' is not a usable IPv4 address (expected a dotted quad "
                      "such as 127.0.0.2, or a comma-separated list of them)",
                      one));
      return false;
    }
    ips.push_back(ip);
    if (comma == std::string::npos) return true;
    at = comma + 1;
  }
}

/// `softrdma run`: validate, set the environment, exec. Returns only on failure.
int cmd_run(const RunOptions& o) {
  if (std::vector<uint32_t> ips; !o.addr.empty() && !parse_addr_list(o.addr, ips))
    return kExitUsage;
  if (!o.netem.empty()) {
    softrdma::net::NetemConfig cfg;
    std::string why;
    if (!softrdma::net::parse_netem(o.netem, cfg, why)) {
      error(fmt::format("--netem: '{}': {} (expected e.g. \"loss=5%,every=13,seed=42\")", o.netem,
                        why));
      return kExitUsage;
    }
  }
  if (!o.wan.empty()) {
    // A topology file when one exists under that name, else one line of link parameters.
    softrdma::net::WanTopology topo;
    std::string text, why;
    if (!softrdma::net::read_wan_spec(o.wan, topo, text, why)) {
      error(
          fmt::format("--wan: '{}': {} (expected a topology file or e.g. "
                      "\"delay=10ms,loss=0.1%,rate=1gbit\")",
                      o.wan, why));
      return kExitUsage;
    }
  }
  // Time dilation: --tdf, or SOFTRDMA_TDF inherited from the environment.
  double tdf = 1;
  if (!o.tdf.empty()) {
    std::string why;
    if (!softrdma::clock::parse_tdf(o.tdf, tdf, why)) {
      error("--tdf: " + why.substr(why.find(": ") + 2));
      return kExitUsage;
    }
  } else if (const char* env = params::raw(params::kTdf)) {
    std::string why;
    if (!softrdma::clock::parse_tdf(env, tdf, why)) {
      error(why);
      return kExitUsage;
    }
  }
  if (o.command.empty() || o.command.front().empty()) {
    error("run: no program given (usage: softrdma run [OPTIONS] -- PROGRAM [ARGS...])");
    return kExitUsage;
  }

  std::string why;
  auto dir = find_dropin_dir(why);
  if (!dir) {
    error(why);
    return 1;
  }

  if (!o.addr.empty()) ::setenv("SOFTRDMA_ADDR", o.addr.c_str(), 1);
  if (!o.netem.empty()) ::setenv("SOFTRDMA_NETEM", o.netem.c_str(), 1);
  if (!o.wan.empty()) ::setenv("SOFTRDMA_WAN", o.wan.c_str(), 1);
  if (!o.pcap.empty()) ::setenv("SOFTRDMA_PCAP", o.pcap.c_str(), 1);
  if (!o.log.empty()) ::setenv("SOFTRDMA_LOG", o.log.c_str(), 1);
  if (!o.transport.empty()) ::setenv("SOFTRDMA_TRANSPORT", o.transport.c_str(), 1);
  if (!o.tdf.empty()) ::setenv("SOFTRDMA_TDF", o.tdf.c_str(), 1);
  if (tdf != 1) {
    // One epoch for every process this run starts (and their children): their wall clocks
    // then agree, and read the real date at the start.
    if (!params::raw(params::kTdfEpoch))
      ::setenv("SOFTRDMA_TDF_EPOCH", std::to_string(softrdma::clock::real_realtime_ns()).c_str(),
               1);
    const fs::path lib = *dir / "libsoftrdma_tdf.so";
    std::error_code ec;
    if (!fs::exists(lib, ec)) {
      error(fmt::format("{} is missing (build the softrdma_tdf target)", lib.string()));
      return 1;
    }
    prepend_env_path("LD_PRELOAD", lib.string());
    fmt::print(stderr,
               "softrdma: time dilation K = {}: softrdma's clocks and this program's "
               "clock_gettime/gettimeofday/time/sleeps run {}x slower than real time. Programs "
               "that read the TSC uncalibrated or time themselves without libc report real "
               "time: divide their durations by {} (multiply their rates) for virtual "
               "figures. Make sure the machine is not the limit: real rate needed = virtual "
               "rate / K (docs/wide-area.md, Time dilation).\n",
               tdf, tdf, tdf);
  }
  prepend_env_path("LD_LIBRARY_PATH", dir->string());
  // The torch.distributed backend's package (pytorch/, built into <build>/python) when it
  // was built, so `softrdma run -- torchrun ...` finds `import softrdma_torch`.
  if (std::error_code ec; fs::is_directory(dir->parent_path() / "python" / "softrdma_torch", ec))
    prepend_env_path("PYTHONPATH", (dir->parent_path() / "python").string());
  // rsockets: librspreload, with the shim (accept4, ioctl FIONBIO) in front of it.
  if (o.rsockets) {
    const fs::path shim = *dir / "libsoftrdma_rspreload_shim.so";
    std::error_code ec;
    if (!fs::exists(kRspreload, ec)) {
      error(fmt::format("{} is missing (Debian package librdmacm1)", kRspreload));
      return 1;
    }
    if (!fs::exists(shim, ec)) {
      error(fmt::format("{} is missing (build the softrdma_rspreload_shim target)", shim.string()));
      return 1;
    }
    prepend_env_path("LD_PRELOAD", kRspreload);
    prepend_env_path("LD_PRELOAD", shim.string());
  }
  // The sysfs interposer first, then (below) the ASan runtime in front of everything.
  if (const fs::path sysfs = *dir / "libsoftrdma_sysfs.so"; !o.no_sysfs) {
    std::error_code ec;
    if (!fs::exists(sysfs, ec)) {
      error(fmt::format("{} is missing (build the softrdma_sysfs target, or pass --no-sysfs)",
                        sysfs.string()));
      return 1;
    }
    prepend_env_path("LD_PRELOAD", sysfs.string());
  }
  if (std::string asan = loaded_asan_runtime(); !asan.empty()) {
    const char* pre = std::getenv("LD_PRELOAD");
    if (!pre || !std::strstr(pre, "libasan.so")) prepend_env_path("LD_PRELOAD", asan);
  }

  std::vector<char*> argv;
  argv.reserve(o.command.size() + 1);
  for (const auto& a : o.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  int e = errno;
  error(fmt::format("cannot execute '{}': {}", o.command.front(), std::strerror(e)));
  return kExitCannotExec;
}

/// Options of `softrdma stat`.
struct StatOptions {
  std::string dir = "/dev/shm";
  bool all = false;
  bool json = false;
  bool clean = false;
};

/// Published devices, ordered by address (numerically), then pid.
std::vector<DeviceStats> published_devices(const std::string& dir) {
  auto devs = softrdma::engine::read_published_stats(dir);
  auto key = [](const DeviceStats& d) {
    uint32_t ip = 0;
    softrdma::net::ipv4_from_string(d.address, ip);
    return std::tuple(ip, d.pid, d.path);
  };
  std::sort(devs.begin(), devs.end(),
            [&](const DeviceStats& a, const DeviceStats& b) { return key(a) < key(b); });
  return devs;
}

int cmd_stat_clean(const StatOptions& o) {
  int removed = 0, failed = 0;
  for (const auto& d : published_devices(o.dir)) {
    if (d.alive) continue;
    if (::unlink(d.path.c_str()) == 0 || errno == ENOENT) {
      fmt::print("removed {} ({} pid {}, exited)\n", d.path, d.address, d.pid);
      ++removed;
    } else {
      error(fmt::format("cannot remove {}: {}", d.path, std::strerror(errno)));
      ++failed;
    }
  }
  // Same-host mailboxes (softrdma-shm-ns<N>-<addr>, in the same directory) of killed devices
  // of this network namespace (net/netns.h).
  softrdma::net::ShmConfig shm;
  shm.dir = o.dir;
  for (const std::string& p : softrdma::net::shm_remove_stale_mailboxes(shm)) {
    fmt::print("removed {} (same-host mailbox, owner exited)\n", p);
    ++removed;
  }
  // The share registries (softrdma-share-ns<N>-<addr>, this namespace) and rdma_cm port
  // tables (softrdma-cmports-*, every namespace) of addresses no live process holds.
  for (const std::string& p : softrdma::net::share_remove_stale(o.dir)) {
    fmt::print("removed {} (address share, its processes exited)\n", p);
    ++removed;
  }
  for (const std::string& p : softrdma::cm::SharedPorts::remove_stale(o.dir)) {
    fmt::print("removed {} (rdma_cm ports, their processes exited)\n", p);
    ++removed;
  }
  if (removed == 0 && failed == 0) fmt::print("no files of exited processes to remove\n");
  return failed ? 1 : 0;
}

int cmd_stat(const StatOptions& o) {
  if (o.clean) return cmd_stat_clean(o);
  const auto devs = published_devices(o.dir);

  if (o.json) {
    // Every counter, always (a stable schema is worth more to scripts than brevity), in
    // engine/counters.h order.
    nlohmann::ordered_json out = {{"devices", nlohmann::ordered_json::array()}};
    for (const auto& d : devs) {
      nlohmann::ordered_json counters = nlohmann::ordered_json::object();
      for (const auto& c : d.counters) counters[c.name] = c.value;
      out["devices"].push_back({{"device", kDeviceName},
                                {"address", d.address},
                                {"pid", d.pid},
                                {"alive", d.alive},
                                {"path", d.path},
                                {"counters", std::move(counters)}});
    }
    fmt::print("{}\n", out.dump(2));
    return 0;
  }

  if (devs.empty()) {
    fmt::print("no softrdma devices are open\n");
    return 0;
  }
  bool first = true;
  for (const auto& d : devs) {
    if (!first) fmt::print("\n");
    first = false;
    fmt::print("{} {} pid {} {} ({})\n", kDeviceName, d.address, d.pid, d.alive ? "alive" : "dead",
               d.path);
    size_t width = 0;
    for (const auto& c : d.counters) width = std::max(width, c.name.size());
    size_t shown = 0;
    for (const auto& c : d.counters) {
      if (!o.all && c.value == 0) continue;
      fmt::print("    {:<{}} {}\n", c.name, width, c.value);
      ++shown;
    }
    if (shown == 0)
      fmt::print("    (all {} counters are zero; --all lists them)\n", d.counters.size());
  }
  return 0;
}

/// `softrdma sysfs --create DIR [--addr IP[,IP...]]`: the virtual tree as real files under
/// DIR, one device per address (srdma0, srdma1, …; default SOFTRDMA_ADDR's list, else
/// 127.0.0.1), each port's rate from SOFTRDMA_WAN's links as the devices report it. Returns 0,
/// kExitUsage for a malformed --addr, 1 when DIR cannot be written.
int cmd_sysfs(const std::string& dir, const std::string& addr) {
  std::vector<uint32_t> ips;
  if (!addr.empty()) {
    if (!parse_addr_list(addr, ips)) return kExitUsage;
  } else {
    std::string malformed;
    if (!params::read_ipv4_list(params::kAddr, ips, malformed) || ips.empty())
      ips = {(127u << 24) | 1};
  }
  namespace sysfs = softrdma::verbs::sysfs;
  const std::vector<sysfs::DeviceView> views = sysfs::views_for(ips, sysfs::wan_from_environment());
  if (int e = sysfs::materialize(dir, sysfs::build(views)); e != 0) {
    error(fmt::format("cannot write the tree under {}: {}", dir, std::strerror(e)));
    return 1;
  }
  std::string devices, mknods;
  for (size_t i = 0; i < views.size(); ++i) {
    devices += fmt::format("{}{} ({}, net device {})", i ? ", " : "", sysfs::ibdev_name(i),
                           softrdma::net::ipv4_to_string(views[i].ip), views[i].ifname);
    mknods += fmt::format("  mknod /dev/infiniband/{} c {} {}\n", sysfs::uverbs_name(i),
                          softrdma::verbs::kUverbsMajor, sysfs::uverbs_minor(i));
  }
  const std::string stand_in =
      views.size() == 1
          ? "uverbs0 there stands in as a link"
          : fmt::format("uverbs0 … uverbs{} there stand in as links", views.size() - 1);
  fmt::print(
      "wrote {0}/sys/class/infiniband, {0}/sys/class/infiniband_verbs and {0}/dev/infiniband "
      "for {1}.\n"
      "As root, to show them to every program ({2} to /dev/null):\n"
      "  mkdir -p /sys/class/infiniband /sys/class/infiniband_verbs /dev/infiniband\n"
      "  mount --bind {0}/sys/class/infiniband /sys/class/infiniband\n"
      "  mount --bind {0}/sys/class/infiniband_verbs /sys/class/infiniband_verbs\n"
      "{3}",
      dir, devices, stand_in, mknods);
  return 0;
}

/// Options of `softrdma params`.
struct ParamsOptions {
  bool markdown = false;
  std::vector<std::string> groups;  // empty: all
};

/// `softrdma params`: the registry, one group after the other.
int cmd_params(const ParamsOptions& o) {
  bool first = true;
  for (params::Group g :
       {params::Group::kDevice, params::Group::kCcl, params::Group::kKv, params::Group::kCm}) {
    const std::string name(params::group_name(g));
    if (!o.groups.empty() && std::find(o.groups.begin(), o.groups.end(), name) == o.groups.end())
      continue;
    // One group in Markdown is exactly the docs' table (no heading), so it can be pasted.
    if (!o.markdown || o.groups.size() != 1)
      fmt::print("{}{}\n", first ? "" : "\n",
                 g == params::Group::kDevice ? "device (libibverbs.so.1, read when srdma0 opens):"
                 : g == params::Group::kCcl  ? "ccl (collectives, read when a communicator starts):"
                 : g == params::Group::kKv
                     ? "kv (KV-cache transfer engine, read when a kv::Engine starts):"
                     : "cm (RDMA-CM, librdmacm.so.1, read when it opens a device):");
    fmt::print("{}", o.markdown ? params::markdown_table(g) : params::help_text(g));
    first = false;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string env_help =
      "Environment read by the library (`softrdma run` sets it from its options):\n" +
      params::help_text(params::Group::kDevice) +
      "\n`softrdma params` lists every SOFTRDMA_* variable, the collectives' (ccl), the KV "
      "engine's (kv) and the RDMA-CM's (cm) too.\n"
      "\n"
      "Example (two shells; pingpong's TCP exchange goes to 127.0.0.1):\n"
      "  softrdma run --addr 127.0.0.2 -- ibv_rc_pingpong -g 0\n"
      "  softrdma run --addr 127.0.0.3 -- ibv_rc_pingpong -g 0 127.0.0.1\n"
      "  softrdma stat";

  CLI::App app{
      "softrdma: user-space RoCEv2 behind the libibverbs API/ABI. Unmodified verbs programs\n"
      "run over it through the drop-in libibverbs.so.1 (and librdmacm.so.1 for RDMA-CM\n"
      "programs); this tool starts them (run), shows the devices' counters (stat), lists\n"
      "the SOFTRDMA_* parameters (params) and writes the devices' sysfs tree for bind mounts\n"
      "(sysfs)."};
  app.name("softrdma");
  app.set_version_flag("--version", std::string(SOFTRDMA_VERSION));
  app.require_subcommand(1, 1);
  app.footer(env_help);

  // ---- run ----------------------------------------------------------------------------
  RunOptions ro;
  CLI::App* run = app.add_subcommand(
      "run",
      "run an unmodified verbs program over softrdma: softrdma run [OPTIONS] -- PROGRAM "
      "[ARGS...]");
  run->footer(
      "Checks the options, exports SOFTRDMA_ADDR / SOFTRDMA_TRANSPORT / SOFTRDMA_NETEM /\n"
      "SOFTRDMA_PCAP / SOFTRDMA_LOG / SOFTRDMA_TDF (--tdf also preloads libsoftrdma_tdf.so\n"
      "and prints on stderr which programs do not see dilated time), puts the\n"
      "directories of the drop-ins libibverbs.so.1 and librdmacm.so.1 (<dir of this\n"
      "executable>/../lib) first in LD_LIBRARY_PATH (and ../python, the torch.distributed\n"
      "backend softrdma_torch, first in PYTHONPATH when it was built) and executes PROGRAM in\n"
      "place of itself (same pid, stdio, signals).\n"
      "Options not given leave the inherited environment as it is.\n"
      "Exit status: PROGRAM's own; 2 for a bad option; 1 if a drop-in is not found;\n"
      "127 if PROGRAM cannot be executed.\n\n" +
      env_help);
  run->add_option("--addr", ro.addr,
                  "IPv4 address of this process's device (sets SOFTRDMA_ADDR), e.g. "
                  "127.0.0.2; each process needs its own. A comma-separated list gives the "
                  "process one device per address (srdma0, srdma1, ...). Default: the first "
                  "free 127.0.0.x")
      ->type_name("IP[,IP...]");
  run->add_option("--transport", ro.transport,
                  "packet path (sets SOFTRDMA_TRANSPORT): auto = shared memory to softrdma "
                  "peers on this host, UDP otherwise; udp = UDP port 4791 only; shm = shared "
                  "memory only")
      ->type_name("PATH")
      ->check(CLI::IsMember(params::choices(params::kTransport)));
  run->add_option("--netem", ro.netem,
                  "emulate a lossy link on transmit (sets SOFTRDMA_NETEM): comma-separated "
                  "loss=P% (or a fraction 0..1), every=N (drop every Nth packet), seed=S")
      ->type_name("SPEC");
  run->add_option("--wan", ro.wan,
                  "emulate wide-area links on transmit (sets SOFTRDMA_WAN): a topology file "
                  "(site/link lines) or one line of link parameters for every pair of "
                  "addresses, e.g. delay=10ms,jitter=1ms,loss=0.1%,rate=1gbit,queue=1bdp")
      ->type_name("FILE|SPEC");
  run->add_option("--pcap", ro.pcap,
                  "capture every RoCEv2 packet this process sends and receives to FILE (sets "
                  "SOFTRDMA_PCAP; %p and %a in FILE become the pid and device address)")
      ->type_name("FILE");
  run->add_option("--log", ro.log, "library log level (sets SOFTRDMA_LOG); default warn")
      ->type_name("LEVEL")
      ->check(CLI::IsMember(params::choices(params::kLog)));
  run->add_option("--tdf", ro.tdf,
                  "time dilation factor K >= 1 (sets SOFTRDMA_TDF): softrdma's clocks, and "
                  "PROGRAM's clock_gettime, gettimeofday, time and sleeps (through the "
                  "preloaded libsoftrdma_tdf.so), run K times slower than real time, so "
                  "emulated links K times faster than this machine can carry keep their "
                  "virtual rates and delays (docs/wide-area.md, Time dilation)")
      ->type_name("K");
  run->add_flag("--rsockets", ro.rsockets,
                "run PROGRAM's TCP sockets over rsockets: preloads Debian's librspreload "
                "(with libsoftrdma_rspreload_shim.so for accept4 and ioctl FIONBIO); AF_INET "
                "stream sockets go to rsockets, everything else passes through");
  run->add_flag("--no-sysfs", ro.no_sysfs,
                "do not preload libsoftrdma_sysfs.so (the virtual /sys/class/infiniband, "
                "/sys/class/infiniband_verbs and /dev/infiniband/uverbsN)");
  run->add_option("PROGRAM", ro.command,
                  "the program to run (searched in PATH) and its arguments; put them after "
                  "`--` so that their options are not taken for softrdma's")
      ->type_name("")
      ->required();
  run->positionals_at_end();  // everything from PROGRAM on belongs to PROGRAM

  // ---- stat ---------------------------------------------------------------------------
  StatOptions so;
  CLI::App* stat = app.add_subcommand("stat", "show the counters of every open softrdma device");
  stat->footer(
      "Every process that opens srdma0 publishes its counters in /dev/shm/softrdma.<ip>.<pid>.\n"
      "stat prints each device (address, pid, alive or dead) and its counters, one\n"
      "`name value` line each as Linux rxe's hw_counters; counters that are zero are left\n"
      "out unless --all is given. A process that exited without closing its device (killed)\n"
      "leaves its file behind, shown as dead until --clean removes it or a new device binds\n"
      "the same address; --clean also removes the same-host mailboxes (softrdma-shm-ns<N>-<ip>),\n"
      "address-share registries (softrdma-share-ns<N>-<ip>) and rdma_cm port tables\n"
      "(softrdma-cmports-ns<N>-<ip>) such processes left; ns<N> names the network namespace\n"
      "(the inode of /proc/self/ns/net), and mailboxes and registries are cleaned only in the\n"
      "namespace stat runs in (ip netns exec NS softrdma stat --clean for another).\n"
      "Counter meanings: engine/counters.h.");
  auto* all = stat->add_flag("--all,-a", so.all, "list every counter, zero or not");
  auto* json = stat->add_flag("--json", so.json,
                              "print JSON instead: {\"devices\": [{device, address, pid, alive, "
                              "path, counters: {name: value}}]}, always with every counter");
  stat->add_flag("--clean", so.clean,
                 "remove the counter files, same-host mailboxes, address-share registries and "
                 "rdma_cm port tables of processes that have exited, list them, and exit")
      ->excludes(all)
      ->excludes(json);
  stat->add_option("--dir", so.dir,
                   "where to look for the counter files (softrdma.*); the library always "
                   "publishes in /dev/shm, other values are for tests")
      ->type_name("DIR")
      ->capture_default_str();

  // ---- sysfs --------------------------------------------------------------------------
  std::string sysfs_dir, sysfs_addr;
  CLI::App* sysfs = app.add_subcommand(
      "sysfs",
      "write the devices' sysfs and /dev entries to a directory (for bind mounts as root)");
  sysfs->footer(
      "`softrdma run` shows every program the virtual /sys/class/infiniband,\n"
      "/sys/class/infiniband_verbs and /dev/infiniband through an LD_PRELOAD library, no root\n"
      "needed. This writes the same tree as real files, for an administrator who wants it\n"
      "visible to every process (bind mounts; a real mknod for each uverbsN).");
  sysfs->add_option("--create", sysfs_dir, "the directory to write (created if missing)")
      ->type_name("DIR")
      ->required();
  sysfs
      ->add_option("--addr", sysfs_addr,
                   "the device addresses the files describe, one device each (srdma0, "
                   "srdma1, ...): an IPv4 address or a comma-separated list (default "
                   "SOFTRDMA_ADDR, else 127.0.0.1)")
      ->type_name("IP[,IP...]");

  // ---- params -------------------------------------------------------------------------
  ParamsOptions po;
  CLI::App* prm = app.add_subcommand(
      "params", "list every SOFTRDMA_* environment variable: default, accepted values, meaning");
  prm->footer(
      "One registry (base/params.h) defines each variable; the library and the collectives\n"
      "read them through it, and README.md / docs/collectives.md / docs/kv.md /\n"
      "docs/rdma-cm.md hold its --markdown tables (base_tests fails when they differ).");
  prm->add_flag("--markdown", po.markdown, "print Markdown tables (the docs' format)");
  prm->add_option("GROUP", po.groups,
                  "only these groups: device (the library), ccl (collectives), kv (KV engine), "
                  "cm (RDMA-CM)")
      ->check(CLI::IsMember({"device", "ccl", "kv", "cm"}));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : kExitUsage;  // --help / --version: 0; anything else: usage error
  }

  if (run->parsed()) return cmd_run(ro);
  if (stat->parsed()) return cmd_stat(so);
  if (prm->parsed()) return cmd_params(po);
  if (sysfs->parsed()) return cmd_sysfs(sysfs_dir, sysfs_addr);
  return kExitUsage;  // unreachable: require_subcommand(1)
}
