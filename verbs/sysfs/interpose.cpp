// libsoftrdma_sysfs.so: an LD_PRELOAD library (loaded by `softrdma run`) that gives programs
// the sysfs and /dev entries of the softrdma devices (srdma0, srdma1, …) without root. The
// virtual tree (tree.h) is written once per list of device views to a real directory,
// /dev/shm/softrdma-sysfs-<uid>/v2-<ip>-<ifname> for one device, v2-<ip>-<if>+<ip>-<if>… for
// several (v2: the tree's layout version, raised with the 16-entry GID table; a changed tree
// takes a new one, so a tree left by an older build is never used), and the libc calls that take a
// path send paths under /sys/class/infiniband, /sys/class/infiniband_verbs and
// /dev/infiniband there: open/open64/openat/openat64 (and
// their _FORTIFY_SOURCE __*_2 forms), fopen/fopen64, stat/lstat/fstatat (and the 64 and
// pre-2.33 __xstat forms), statx, access/faccessat/euidaccess, opendir, readlink/readlinkat,
// realpath/canonicalize_file_name (mapped back to the virtual path), chdir and the
// getxattr/listxattr family. Everything
// that works on the returned descriptors — read, fstat, getdents/readdir, fdopendir,
// openat relative to a tree directory — then needs no interposition at all. This covers what
// rdma-core 44's libibverbs sysfs.c, pyverbs (os.path.exists, os.listdir, open, `ls` in a
// subprocess) and librdmacm reach for. /dev/infiniband/uverbs<N> stats as a character device
// 231:(192 + N) (it is /dev/null underneath: nothing can be done with it but open and close).
//
// Which devices: one per SOFTRDMA_ADDR entry when it is set (what `softrdma run --addr A,B`
// sets: srdma0 at A, srdma1 at B, as the verbs library lists them); otherwise the one device
// this process — or its parent, for a helper program a verbs program started — has open (its
// counter file /dev/shm/softrdma.<ip>.<pid>); otherwise 127.0.0.1. The values are those of
// the verbs queries on each device (verbs/device_identity.h).
//
// Not covered: relative paths resolved against a working directory inside /sys/class, and
// the "//" or "/./" spellings of the virtual paths; programs that make system calls without
// libc (Go binaries) see the real /sys.
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "base/ipv4_text.h"
#include "base/params.h"
#include "verbs/device_identity.h"
#include "verbs/sysfs/tree.h"

namespace sysfs = softrdma::verbs::sysfs;

namespace {

/// The next definition of libc function `name` (the real one), looked up once.
#define REAL(name)                                                                 \
  ([]() {                                                                          \
    static auto fn = reinterpret_cast<decltype(&::name)>(dlsym(RTLD_NEXT, #name)); \
    return fn;                                                                     \
  }())

/// Set while the tree is built: getifaddrs then answers with the real interfaces only.
thread_local bool t_real_ifaddrs = false;

bool parse_dotted(const char* s, uint32_t& ip) {
  unsigned a, b, c, d;
  char tail;
  if (std::sscanf(s, "%u.%u.%u.%u%c", &a, &b, &c, &d, &tail) != 4 || a > 255 || b > 255 ||
      c > 255 || d > 255)
    return false;
  ip = (a << 24) | (b << 16) | (c << 8) | d;
  return true;
}

/// The address of the device process `pid` has open, from its counter file
/// /dev/shm/softrdma.<a.b.c.d>.<pid> (engine/counters.cpp); 0 when none.
uint32_t device_of(pid_t pid) {
  DIR* d = REAL(opendir)("/dev/shm");
  if (!d) return 0;
  const std::string suffix = "." + std::to_string(pid);
  uint32_t ip = 0;
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n.rfind("softrdma.", 0) != 0 || n.size() <= suffix.size() + 9 ||
        n.compare(n.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    if (parse_dotted(n.substr(9, n.size() - 9 - suffix.size()).c_str(), ip)) break;
  }
  closedir(d);
  return ip;
}

/// The addresses of the devices this process lists, srdma0 first: every SOFTRDMA_ADDR entry
/// when it is set and well formed (what `softrdma run --addr A,B` sets, and what the devices
/// bind); otherwise the one device this process — or its parent — has open; otherwise
/// 127.0.0.1.
std::vector<uint32_t> device_ips() {
  std::vector<uint32_t> ips;
  std::string malformed;
  if (softrdma::params::read_ipv4_list(softrdma::params::kAddr, ips, malformed) && !ips.empty()) {
    if (ips.size() > softrdma::verbs::kMaxDevices) ips.resize(softrdma::verbs::kMaxDevices);
    return ips;
  }
  uint32_t ip = 0;
  if ((ip = device_of(::getpid())) || (ip = device_of(::getppid()))) return {ip};
  return {(127u << 24) | 1};
}

/// The directory name of the tree for `views`: v2-<ip>-<ifname> for one device (as before
/// several devices were described), the views joined with '+' for several, or a hash of
/// that when it would be too long for a file name. A port other than the default 4X EDR
/// adds -s<speed>w<width> to its view (processes under different SOFTRDMA_WAN rates see
/// different trees).
std::string tree_name(const std::vector<sysfs::DeviceView>& views) {
  std::string key;
  for (const sysfs::DeviceView& v : views) {
    key += (key.empty() ? "" : "+") + softrdma::base::ipv4_text(v.ip) + "-" + v.ifname;
    if (v.port != softrdma::link_rate::kDefaultPortSpeed)
      key += "-s" + std::to_string(v.port.active_speed) + "w" + std::to_string(v.port.active_width);
  }
  if (key.size() <= 200) return "v2-" + key;
  uint64_t h = 1469598103934665603ull;  // FNV-1a, 64 bits
  for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
  char hex[20];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return "v2-" + std::to_string(views.size()) + "dev-" + hex;
}

/// The directory holding the tree for this process's devices, written on first use;
/// empty when it cannot be (the real paths are used then).
std::string tree_root() {
  static std::mutex mu;
  // Never destroyed (objects.h, "Process-wide state").
  static auto& cached_ips = *new std::vector<uint32_t>;
  static auto& cached_root = *new std::string;
  const std::vector<uint32_t> ips = device_ips();
  std::lock_guard lk(mu);
  if (ips == cached_ips && !cached_root.empty()) return cached_root;
  const int saved = errno;
  t_real_ifaddrs = true;  // the tree names each device's real interface (lo for 127.x)
  const std::vector<sysfs::DeviceView> views = sysfs::views_for(ips, sysfs::wan_from_environment());
  t_real_ifaddrs = false;
  const std::string base = "/dev/shm/softrdma-sysfs-" + std::to_string(::getuid());
  const std::string root = base + "/" + tree_name(views);
  struct stat st;
  if (REAL(stat)((root + "/dev").c_str(), &st) != 0) {
    // Written aside, then renamed into place: a reader never sees a partial tree.
    ::mkdir(base.c_str(), 0755);
    const std::string pattern = base + "/tmp-XXXXXX";
    std::string tmp = pattern;
    const std::vector<sysfs::Entry> entries = sysfs::build(views);
    if (!::mkdtemp(tmp.data()) || sysfs::materialize(tmp, entries) != 0) {
      errno = saved;
      return {};
    }
    ::chmod(tmp.c_str(), 0755);
    if (::rename(tmp.c_str(), root.c_str()) != 0) {
      // Another process won the race (its tree is the same): remove ours, children first.
      for (auto e = entries.rbegin(); e != entries.rend(); ++e) {
        const std::string p = tmp + "/" + e->path;
        if (e->kind == sysfs::Entry::Kind::kDir)
          ::rmdir(p.c_str());
        else
          ::unlink(p.c_str());
      }
      ::rmdir(tmp.c_str());
    }
  }
  errno = saved;
  cached_ips = ips;
  cached_root = root;
  return root;
}

/// The path to use instead of `path`: the tree's copy for a virtual path, else `path`.
/// `keep` holds the string the returned pointer points into.
const char* map(const char* path, std::string& keep) {
  if (!sysfs::in_tree(path)) return path;
  const std::string root = tree_root();
  if (root.empty()) return path;
  keep = root + path;
  return keep.c_str();
}

/// fn(tree path, args…) for a path-taking libc function `fn`.
template <class Fn, class... Args>
auto redirect(Fn fn, const char* path, Args... args) {
  std::string keep;
  return fn(map(path, keep), args...);
}
/// fn(dirfd, tree path, args…) for the *at forms (a relative path is left alone).
template <class Fn, class... Args>
auto redirect_at(Fn fn, int dirfd, const char* path, Args... args) {
  std::string keep;
  return fn(dirfd, map(path, keep), args...);
}

/// /dev/infiniband/uverbsN is a character device 231:(192 + N) (its stand-in is /dev/null):
/// patches a successful stat of it; returns `rc`.
template <class Stat>
int fix_uverbs(const char* path, int rc, Stat* st) {
  if (const int n = sysfs::uverbs_index(path); rc == 0 && n >= 0) {
    st->st_mode = S_IFCHR | 0666;
    st->st_rdev = makedev(softrdma::verbs::kUverbsMajor, sysfs::uverbs_minor(n));
  }
  return rc;
}

}  // namespace

/// Declares `mode`: the mode argument of an open call that has one (O_CREAT or O_TMPFILE),
/// else 0. A macro: it reads the calling function's variadic arguments.
#define DECLARE_OPEN_MODE(flags, mode)                         \
  mode_t mode = 0;                                             \
  if (((flags)&O_CREAT) || ((flags)&O_TMPFILE) == O_TMPFILE) { \
    va_list ap;                                                \
    va_start(ap, flags);                                       \
    mode = va_arg(ap, mode_t);                                 \
    va_end(ap);                                                \
  }

namespace {}  // namespace

// Declarations glibc's headers no longer give (pre-2.33 stat entry points, still exported
// for old binaries).
extern "C" {
int __xstat(int, const char*, struct stat*);
int __xstat64(int, const char*, struct stat64*);
int __lxstat(int, const char*, struct stat*);
int __lxstat64(int, const char*, struct stat64*);
int __fxstatat(int, int, const char*, struct stat*, int);
int __fxstatat64(int, int, const char*, struct stat64*, int);
int __open_2(const char*, int);
int __open64_2(const char*, int);
int __openat_2(int, const char*, int);
int __openat64_2(int, const char*, int);
}

extern "C" {

// ---- open, stat, access, directories, links --------------------------------------------
// Each call goes to the real function with the tree's path in place of a virtual one.

int open(const char* path, int flags, ...) {
  DECLARE_OPEN_MODE(flags, mode);
  return redirect(REAL(open), path, flags, mode);
}
int open64(const char* path, int flags, ...) {
  DECLARE_OPEN_MODE(flags, mode);
  return redirect(REAL(open64), path, flags, mode);
}
int openat(int dirfd, const char* path, int flags, ...) {
  DECLARE_OPEN_MODE(flags, mode);
  return redirect_at(REAL(openat), dirfd, path, flags, mode);
}
int openat64(int dirfd, const char* path, int flags, ...) {
  DECLARE_OPEN_MODE(flags, mode);
  return redirect_at(REAL(openat64), dirfd, path, flags, mode);
}
int __open_2(const char* path, int flags) {
  return redirect(REAL(__open_2), path, flags);
}
int __open64_2(const char* path, int flags) {
  return redirect(REAL(__open64_2), path, flags);
}
int __openat_2(int dirfd, const char* path, int flags) {
  return redirect_at(REAL(__openat_2), dirfd, path, flags);
}
int __openat64_2(int dirfd, const char* path, int flags) {
  return redirect_at(REAL(__openat64_2), dirfd, path, flags);
}
FILE* fopen(const char* path, const char* mode) {
  return redirect(REAL(fopen), path, mode);
}
FILE* fopen64(const char* path, const char* mode) {
  return redirect(REAL(fopen64), path, mode);
}

int stat(const char* path, struct stat* st) {
  return fix_uverbs(path, redirect(REAL(stat), path, st), st);
}
int stat64(const char* path, struct stat64* st) {
  return fix_uverbs(path, redirect(REAL(stat64), path, st), st);
}
int lstat(const char* path, struct stat* st) {
  return fix_uverbs(path, redirect(REAL(lstat), path, st), st);
}
int lstat64(const char* path, struct stat64* st) {
  return fix_uverbs(path, redirect(REAL(lstat64), path, st), st);
}
int fstatat(int dirfd, const char* path, struct stat* st, int flags) {
  return fix_uverbs(path, redirect_at(REAL(fstatat), dirfd, path, st, flags), st);
}
int fstatat64(int dirfd, const char* path, struct stat64* st, int flags) {
  return fix_uverbs(path, redirect_at(REAL(fstatat64), dirfd, path, st, flags), st);
}
// The pre-2.33 entry points: on x86_64 their struct is the kernel's, as stat's.
int __xstat(int, const char* path, struct stat* st) {
  return stat(path, st);
}
int __xstat64(int, const char* path, struct stat64* st) {
  return stat64(path, st);
}
int __lxstat(int, const char* path, struct stat* st) {
  return lstat(path, st);
}
int __lxstat64(int, const char* path, struct stat64* st) {
  return lstat64(path, st);
}
int __fxstatat(int, int dirfd, const char* path, struct stat* st, int flags) {
  return fstatat(dirfd, path, st, flags);
}
int __fxstatat64(int, int dirfd, const char* path, struct stat64* st, int flags) {
  return fstatat64(dirfd, path, st, flags);
}
int statx(int dirfd, const char* path, int flags, unsigned int mask, struct statx* st) {
  const int rc = redirect_at(REAL(statx), dirfd, path, flags, mask, st);
  if (const int n = sysfs::uverbs_index(path); rc == 0 && n >= 0) {
    st->stx_mode = S_IFCHR | 0666;
    st->stx_rdev_major = softrdma::verbs::kUverbsMajor;
    st->stx_rdev_minor = sysfs::uverbs_minor(n);
  }
  return rc;
}

int access(const char* path, int how) {
  return redirect(REAL(access), path, how);
}
int faccessat(int dirfd, const char* path, int how, int flags) {
  return redirect_at(REAL(faccessat), dirfd, path, how, flags);
}
int euidaccess(const char* path, int how) {
  return redirect(REAL(euidaccess), path, how);
}
int eaccess(const char* path, int how) {
  return redirect(REAL(eaccess), path, how);
}
DIR* opendir(const char* path) {
  return redirect(REAL(opendir), path);
}
int chdir(const char* path) {
  return redirect(REAL(chdir), path);
}
ssize_t readlink(const char* path, char* buf, size_t size) {
  return redirect(REAL(readlink), path, buf, size);
}
ssize_t readlinkat(int dirfd, const char* path, char* buf, size_t size) {
  return redirect_at(REAL(readlinkat), dirfd, path, buf, size);
}
// Extended attributes (ls -l asks for ACLs and security labels).
ssize_t getxattr(const char* path, const char* name, void* value, size_t size) {
  return redirect(REAL(getxattr), path, name, value, size);
}
ssize_t lgetxattr(const char* path, const char* name, void* value, size_t size) {
  return redirect(REAL(lgetxattr), path, name, value, size);
}
ssize_t listxattr(const char* path, char* list, size_t size) {
  return redirect(REAL(listxattr), path, list, size);
}
ssize_t llistxattr(const char* path, char* list, size_t size) {
  return redirect(REAL(llistxattr), path, list, size);
}

/// realpath of a virtual path: resolved in the tree, then given back under its virtual name
/// (a link out of the tree, e.g. device/net/lo, resolves to the real target).
char* realpath(const char* path, char* resolved) {
  std::string k;
  const char* p = map(path, k);
  char* r = REAL(realpath)(p, resolved);
  if (!r || p == path) return r;
  const std::string root = k.substr(0, k.size() - std::strlen(path));
  if (std::strncmp(r, root.c_str(), root.size()) == 0)
    std::memmove(r, r + root.size(), std::strlen(r + root.size()) + 1);
  return r;
}
char* canonicalize_file_name(const char* path) {
  return realpath(path, nullptr);
}

// getifaddrs / freeifaddrs: the addresses of the devices `softrdma run --addr` gave the process
// (SOFTRDMA_ADDR) as addresses of lo labelled lo:srdma0, lo:srdma1, … — what
// `ip addr add 127.0.96.1/8 dev lo label lo:srdma0` shows — when no interface has them
// already. An RDMA device's address is an interface's address (the GID table is built from
// it); libfabric's verbs provider finds its devices' addresses this way (binding each
// interface address with the RDMA-CM, skipping the interface named "lo") and has no FI_EP_MSG
// endpoints without one (docs/rdma-cm.md, "libfabric"). The entries are appended to libc's
// list, in blocks of this library that freeifaddrs takes off again.

namespace {

struct ExtraIfaddr {
  ifaddrs ifa{};
  sockaddr_in addr{};
  sockaddr_in netmask{};
  char name[IFNAMSIZ]{};
};

std::mutex g_extra_mu;
std::set<const void*>& extra_blocks() {
  static auto* s = new std::set<const void*>;
  return *s;
}

}  // namespace

int getifaddrs(ifaddrs** out) {
  const int r = REAL(getifaddrs)(out);
  if (r != 0 || t_real_ifaddrs || !softrdma::params::raw(softrdma::params::kAddr)) return r;
  std::vector<uint32_t> ips;
  std::string malformed;
  if (!softrdma::params::read_ipv4_list(softrdma::params::kAddr, ips, malformed)) return r;
  ifaddrs** tail = out;
  std::vector<uint32_t> present;
  for (ifaddrs* a = *out; a; a = a->ifa_next) {
    if (a->ifa_addr && a->ifa_addr->sa_family == AF_INET)
      present.push_back(ntohl(reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr));
    tail = &a->ifa_next;
  }
  std::lock_guard lk(g_extra_mu);
  for (size_t i = 0; i < ips.size() && i < softrdma::verbs::kMaxDevices; ++i) {
    if (std::find(present.begin(), present.end(), ips[i]) != present.end()) continue;
    auto* e = new ExtraIfaddr;
    std::snprintf(e->name, sizeof e->name, "lo:srdma%zu", i);
    e->addr.sin_family = AF_INET;
    e->addr.sin_addr.s_addr = htonl(ips[i]);
    e->netmask.sin_family = AF_INET;
    e->netmask.sin_addr.s_addr = htonl((ips[i] >> 24) == 127 ? 0xff000000u : 0xffffffffu);
    e->ifa.ifa_name = e->name;
    e->ifa.ifa_flags = IFF_UP | IFF_RUNNING;
    e->ifa.ifa_addr = reinterpret_cast<sockaddr*>(&e->addr);
    e->ifa.ifa_netmask = reinterpret_cast<sockaddr*>(&e->netmask);
    extra_blocks().insert(e);
    *tail = &e->ifa;
    tail = &e->ifa.ifa_next;
  }
  return r;
}

void freeifaddrs(ifaddrs* list) {
  {
    std::lock_guard lk(g_extra_mu);
    ifaddrs** link = &list;
    while (*link && !extra_blocks().count(*link)) link = &(*link)->ifa_next;
    ifaddrs* extra = *link;  // the appended entries are the list's tail
    *link = nullptr;
    while (extra) {
      ifaddrs* next = extra->ifa_next;
      extra_blocks().erase(extra);
      delete reinterpret_cast<ExtraIfaddr*>(extra);
      extra = next;
    }
  }
  if (list) REAL(freeifaddrs)(list);
}

}  // extern "C"
