#include "net/pcap_tap.h"

#include <pcap/pcap.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "base/clock.h"
#include "net/udp_port.h"

namespace softrdma::net {

namespace {

constexpr size_t kEthernetBytes = 14;
constexpr size_t kIpUdpBytes = 28;
constexpr int kSnapLen = 65535;

uint16_t ipv4_checksum(const uint8_t* h) {
  uint32_t sum = 0;
  for (int i = 0; i < 20; i += 2) sum += uint32_t(h[i]) << 8 | h[i + 1];
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return static_cast<uint16_t>(~sum);
}

void put16(uint8_t* p, uint16_t v) {
  p[0] = uint8_t(v >> 8);
  p[1] = uint8_t(v);
}
void put32(uint8_t* p, uint32_t v) {
  put16(p, uint16_t(v >> 16));
  put16(p + 2, uint16_t(v));
}

std::string expand(const std::string& pattern, uint32_t ip) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      char c = pattern[i + 1];
      if (c == 'p') {
        out += std::to_string(::getpid());
        ++i;
        continue;
      }
      if (c == 'a') {
        out += ipv4_to_string(ip);
        ++i;
        continue;
      }
    }
    out += pattern[i];
  }
  return out;
}

}  // namespace

struct PcapTap::Handles {
  pcap_t* pcap = nullptr;
  pcap_dumper_t* dumper = nullptr;
  std::vector<uint8_t> frame;
};

std::unique_ptr<PcapTap> PcapTap::open(const std::string& path, uint32_t device_ip,
                                       std::string& error) {
  std::unique_ptr<PcapTap> t(new PcapTap());
  t->path_ = expand(path, device_ip);
  t->h_ = std::make_unique<Handles>();
  t->h_->pcap = pcap_open_dead(DLT_EN10MB, kSnapLen);
  if (!t->h_->pcap) {
    error = "pcap_open_dead failed";
    return nullptr;
  }
  t->h_->dumper = pcap_dump_open(t->h_->pcap, t->path_.c_str());
  if (!t->h_->dumper) {
    error = "cannot write " + t->path_ + ": " + pcap_geterr(t->h_->pcap);
    return nullptr;
  }
  return t;
}

PcapTap::~PcapTap() {
  if (!h_) return;
  if (h_->dumper) pcap_dump_close(h_->dumper);
  if (h_->pcap) pcap_close(h_->pcap);
}

void PcapTap::record(const CapturedHeaders& hd, std::span<const iovec> payload) {
  size_t len = 0;
  for (const iovec& v : payload) len += v.iov_len;
  auto& f = h_->frame;
  f.assign(kEthernetBytes + kIpUdpBytes, 0);
  f[12] = 0x08;  // EtherType IPv4; MAC addresses zero, as on Linux loopback
  uint8_t* ip = f.data() + kEthernetBytes;
  ip[0] = 0x45;
  ip[1] = hd.tos;
  put16(ip + 2, static_cast<uint16_t>(kIpUdpBytes + len));
  put16(ip + 4, hd.ip_id);
  put16(ip + 6, hd.dont_fragment ? 0x4000 : 0);
  ip[8] = hd.ttl;
  ip[9] = 17;  // UDP
  put32(ip + 12, hd.src_ip);
  put32(ip + 16, hd.dst_ip);
  put16(ip + 10, ipv4_checksum(ip));
  uint8_t* udp = ip + 20;
  put16(udp, hd.src_port);
  put16(udp + 2, hd.dst_port);
  put16(udp + 4, static_cast<uint16_t>(8 + len));
  for (const iovec& v : payload)
    f.insert(f.end(), static_cast<const uint8_t*>(v.iov_base),
             static_cast<const uint8_t*>(v.iov_base) + v.iov_len);
  pcap_pkthdr ph{};
  // Virtual wall-clock time: under time dilation a capture's gaps are the emulated ones.
  const uint64_t t = clock::realtime_ns();
  ph.ts.tv_sec = static_cast<time_t>(t / 1'000'000'000);
  ph.ts.tv_usec = static_cast<suseconds_t>(t % 1'000'000'000 / 1000);
  ph.caplen = ph.len = static_cast<bpf_u_int32>(f.size());
  pcap_dump(reinterpret_cast<u_char*>(h_->dumper), &ph, f.data());
}

void PcapTap::flush() {
  pcap_dump_flush(h_->dumper);
}

}  // namespace softrdma::net
