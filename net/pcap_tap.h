// Packet capture of RoCEv2 traffic in pcap format (libpcap), readable by tcpdump,
// Wireshark and tshark, which decode UDP port 4791 as RoCEv2 (BTH, RETH, AETH, AtomicETH,
// ImmDt, ICRC). Frames are Ethernet II with zero MAC addresses — what `tcpdump -i lo`
// records on Linux loopback — so captures from the tap and from tcpdump decode alike.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace softrdma::net {

/// The IPv4 / UDP header fields of one captured packet (addresses and ports host order).
struct CapturedHeaders {
  uint32_t src_ip = 0;
  uint32_t dst_ip = 0;
  uint16_t src_port = 0;
  uint16_t dst_port = 0;
  uint16_t ip_id = 0;
  bool dont_fragment = true;
  uint8_t ttl = 64;
  uint8_t tos = 0;
};

/// Writes packets to a pcap file. Not thread-safe: a device records under its lock.
class PcapTap {
 public:
  /// Opens `path` for writing (truncating it). In the path, "%p" becomes the process id
  /// and "%a" the device address (dotted quad), so several processes can capture at once.
  /// Returns nullptr and sets `error` when the file cannot be created.
  static std::unique_ptr<PcapTap> open(const std::string& path, uint32_t device_ip,
                                       std::string& error);
  ~PcapTap();
  PcapTap(const PcapTap&) = delete;
  PcapTap& operator=(const PcapTap&) = delete;

  /// Appends one frame: Ethernet + IPv4 (with a correct header checksum) + UDP (checksum
  /// 0: none, valid for IPv4) + `udp_payload` gathered from the iovecs, timestamped now.
  void record(const CapturedHeaders& h, std::span<const iovec> udp_payload);
  /// Pushes buffered frames to the file (a killed process then loses nothing recorded
  /// before its last flush).
  void flush();
  /// The file actually written (after %p / %a substitution).
  const std::string& path() const { return path_; }

 private:
  PcapTap() = default;
  struct Handles;
  std::unique_ptr<Handles> h_;
  std::string path_;
};

}  // namespace softrdma::net
