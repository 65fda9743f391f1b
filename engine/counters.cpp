#include "engine/counters.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "engine/counter_publisher.h"
#include "net/udp_port.h"

namespace softrdma::engine {

namespace {

constexpr char kMagic[8] = {'S', 'R', 'D', 'M', 'A', 'C', 'N', '1'};

struct ShmHeader {
  char magic[8];
  uint32_t ip;
  int32_t pid;
  uint32_t ncounters;
  uint32_t reserved;
};

struct CounterName {
  const char* name;
  const char* help;
};

constexpr CounterName kNames[] = {
#define SOFTRDMA_COUNTER_NAME(name, help) {#name, help},
    SOFTRDMA_COUNTERS(SOFTRDMA_COUNTER_NAME)
#undef SOFTRDMA_COUNTER_NAME
};
constexpr size_t kNumCounters = sizeof(kNames) / sizeof(kNames[0]);
static_assert(sizeof(Counters) == kNumCounters * sizeof(uint64_t));

bool process_alive(int pid) {
  return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM);
}

bool read_one(const std::string& path, DeviceStats& out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  bool ok = false;
  if (::fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= sizeof(ShmHeader)) {
    void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
      const auto* h = static_cast<const ShmHeader*>(p);
      size_t n = h->ncounters;
      if (std::memcmp(h->magic, kMagic, sizeof kMagic) == 0 &&
          sizeof(ShmHeader) + n * sizeof(uint64_t) <= static_cast<size_t>(st.st_size)) {
        const auto* vals = reinterpret_cast<const std::atomic<uint64_t>*>(h + 1);
        out.path = path;
        out.address = net::ipv4_to_string(h->ip);
        out.pid = h->pid;
        out.alive = process_alive(h->pid);
        out.counters.clear();
        for (size_t i = 0; i < n && i < kNumCounters; ++i)
          out.counters.push_back(
              {kNames[i].name, kNames[i].help, vals[i].load(std::memory_order_relaxed)});
        ok = true;
      }
      ::munmap(p, static_cast<size_t>(st.st_size));
    }
  }
  ::close(fd);
  return ok;
}

}  // namespace

uint64_t DeviceStats::get(const std::string& name) const {
  for (const auto& c : counters)
    if (c.name == name) return c.value;
  return 0;
}

std::vector<DeviceStats> read_published_stats(const std::string& dir) {
  std::vector<DeviceStats> all;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return all;
  while (dirent* e = ::readdir(d)) {
    if (std::strncmp(e->d_name, "softrdma.", 9) != 0) continue;
    DeviceStats s;
    if (read_one(dir + "/" + e->d_name, s)) all.push_back(std::move(s));
  }
  ::closedir(d);
  return all;
}

bool read_device_stats(const std::string& address, DeviceStats& out, int pid) {
  for (auto& s : read_published_stats()) {
    if (s.address == address && s.alive && (pid == 0 || s.pid == pid)) {
      out = std::move(s);
      return true;
    }
  }
  return false;
}

CounterPublisher::CounterPublisher(uint32_t ip, bool publish) {
  if (publish) {
    // Remove files that dead processes left behind for this address.
    for (const auto& s : read_published_stats())
      if (!s.alive && s.address == net::ipv4_to_string(ip)) ::unlink(s.path.c_str());
    path_ = "/dev/shm/softrdma." + net::ipv4_to_string(ip) + "." + std::to_string(::getpid());
    size_t bytes = sizeof(ShmHeader) + sizeof(Counters);
    int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0 && ::ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
      void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) {
        map_ = p;
        map_bytes_ = bytes;
      }
    }
    if (fd >= 0) ::close(fd);
    if (!map_) {
      ::unlink(path_.c_str());
      path_.clear();
    }
  }
  if (map_) {
    auto* h = new (map_) ShmHeader{};
    std::memcpy(h->magic, kMagic, sizeof kMagic);
    h->ip = ip;
    h->pid = ::getpid();
    h->ncounters = kNumCounters;
    counters_ = new (h + 1) Counters{};
  } else {
    owned_ = std::make_unique<Counters>();
    counters_ = owned_.get();
  }
}

CounterPublisher::~CounterPublisher() {
  if (map_) {
    ::munmap(map_, map_bytes_);
    ::unlink(path_.c_str());
  }
}

}  // namespace softrdma::engine
