// The CM field tables (cm/mad.cpp) against IBTA vol. 1 ch. 12: every field of every message
// at the byte, bit and width the spec's tables 106–120 give (written out here from the spec
// and Linux's include/rdma/ibta_vol1_c12.h, not from the code), the tables tile each 232-byte
// message without overlap, and Wireshark decodes a capture of our MADs field by field.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "cm/mad.h"
#include "cm/tests/mad_samples.h"

namespace softrdma::cm {
namespace {

using testing_samples::pattern;
using testing_samples::sample_req;

/// (byte, bit, width) of a field, keyed by the table's field name.
using Place = std::tuple<unsigned, unsigned, unsigned>;
using Expected = std::map<std::string, Place>;

std::map<std::string, Place> places(const std::vector<FieldLayout>& layout) {
  std::map<std::string, Place> out;
  for (const FieldLayout& f : layout) out[std::string(f.name)] = Place{f.byte, f.bit, f.width};
  return out;
}

// The spec's layouts. Bits count from the MSB of the byte named; widths are in bits.
const std::map<AttrId, Expected>& spec_layouts() {
  static const std::map<AttrId, Expected> m = {
      {AttrId::kReq,  // table 106 (vendor ID: Linux's CM_REQ_VENDOR_ID, ECE)
       {{"local_comm_id", {0, 0, 32}},
        {"vendor_id", {5, 0, 24}},
        {"service_id", {8, 0, 64}},
        {"local_ca_guid", {16, 0, 64}},
        {"local_qkey", {28, 0, 32}},
        {"local_qpn", {32, 0, 24}},
        {"responder_resources", {35, 0, 8}},
        {"local_eecn", {36, 0, 24}},
        {"initiator_depth", {39, 0, 8}},
        {"remote_eecn", {40, 0, 24}},
        {"remote_cm_response_timeout", {43, 0, 5}},
        {"transport", {43, 5, 2}},
        {"flow_control", {43, 7, 1}},
        {"starting_psn", {44, 0, 24}},
        {"local_cm_response_timeout", {47, 0, 5}},
        {"retry_count", {47, 5, 3}},
        {"pkey", {48, 0, 16}},
        {"path_mtu", {50, 0, 4}},
        {"rdc_exists", {50, 4, 1}},
        {"rnr_retry_count", {50, 5, 3}},
        {"max_cm_retries", {51, 0, 4}},
        {"srq", {51, 4, 1}},
        {"extended_transport", {51, 5, 3}},
        {"primary.local_lid", {52, 0, 16}},
        {"primary.remote_lid", {54, 0, 16}},
        {"primary.local_gid", {56, 0, 128}},
        {"primary.remote_gid", {72, 0, 128}},
        {"primary.flow_label", {88, 0, 20}},
        {"primary.packet_rate", {91, 2, 6}},
        {"primary.traffic_class", {92, 0, 8}},
        {"primary.hop_limit", {93, 0, 8}},
        {"primary.sl", {94, 0, 4}},
        {"primary.subnet_local", {94, 4, 1}},
        {"primary.local_ack_timeout", {95, 0, 5}},
        {"private_data", {140, 0, 736}}}},
      {AttrId::kMra,  // table 107
       {{"local_comm_id", {0, 0, 32}},
        {"remote_comm_id", {4, 0, 32}},
        {"message", {8, 0, 2}},
        {"service_timeout", {9, 0, 5}},
        {"private_data", {10, 0, 1776}}}},
      {AttrId::kRej,  // table 108
       {{"local_comm_id", {0, 0, 32}},
        {"remote_comm_id", {4, 0, 32}},
        {"message", {8, 0, 2}},
        {"reject_info_length", {9, 0, 7}},
        {"reason", {10, 0, 16}},
        {"ari", {12, 0, 576}},
        {"private_data", {84, 0, 1184}}}},
      {AttrId::kRep,  // table 110 (vendor ID: Linux's CM_REP_VENDOR_ID_H/M/L, ECE)
       {{"local_comm_id", {0, 0, 32}},
        {"remote_comm_id", {4, 0, 32}},
        {"local_qkey", {8, 0, 32}},
        {"local_qpn", {12, 0, 24}},
        {"vendor_id_h", {15, 0, 8}},
        {"local_eecn", {16, 0, 24}},
        {"vendor_id_m", {19, 0, 8}},
        {"starting_psn", {20, 0, 24}},
        {"vendor_id_l", {23, 0, 8}},
        {"responder_resources", {24, 0, 8}},
        {"initiator_depth", {25, 0, 8}},
        {"target_ack_delay", {26, 0, 5}},
        {"failover_accepted", {26, 5, 2}},
        {"flow_control", {26, 7, 1}},
        {"rnr_retry_count", {27, 0, 3}},
        {"srq", {27, 3, 1}},
        {"local_ca_guid", {28, 0, 64}},
        {"private_data", {36, 0, 1568}}}},
      {AttrId::kRtu,  // table 111
       {{"local_comm_id", {0, 0, 32}},
        {"remote_comm_id", {4, 0, 32}},
        {"private_data", {8, 0, 1792}}}},
      {AttrId::kDreq,  // table 112
       {{"local_comm_id", {0, 0, 32}},
        {"remote_comm_id", {4, 0, 32}},
        {"remote_qpn", {8, 0, 24}},
        {"private_data", {12, 0, 1760}}}},
      {AttrId::kDrep,  // table 113
       {{"local_comm_id", {0, 0, 32}},
        {"remote_comm_id", {4, 0, 32}},
        {"private_data", {8, 0, 1792}}}},
      {AttrId::kSidrReq,  // table 119
       {{"request_id", {0, 0, 32}},
        {"pkey", {4, 0, 16}},
        {"service_id", {8, 0, 64}},
        {"private_data", {16, 0, 1728}}}},
      {AttrId::kSidrRep,  // table 120 (vendor ID in reserved bytes 6, 7 and 11, ECE)
       {{"request_id", {0, 0, 32}},
        {"status", {4, 0, 8}},
        {"additional_info_length", {5, 0, 8}},
        {"vendor_id_hm", {6, 0, 16}},
        {"qpn", {8, 0, 24}},
        {"vendor_id_l", {11, 0, 8}},
        {"service_id", {12, 0, 64}},
        {"qkey", {20, 0, 32}},
        {"additional_info", {24, 0, 576}},
        {"private_data", {96, 0, 1088}}}},
  };
  return m;
}

TEST(MadLayout, EveryMessageMatchesIbtaChapter12) {
  for (const auto& [id, want] : spec_layouts())
    EXPECT_EQ(places(field_layout(id)), want) << attr_name(uint16_t(id));
  EXPECT_TRUE(field_layout(AttrId::kLap).empty());
  EXPECT_TRUE(field_layout(AttrId::kApr).empty());
}

TEST(MadLayout, HeaderMatchesIbta13_4_2) {
  const Expected want = {
      {"base_version", {0, 0, 8}},    {"mgmt_class", {1, 0, 8}}, {"class_version", {2, 0, 8}},
      {"method", {3, 0, 8}},          {"status", {4, 0, 16}},    {"class_specific", {6, 0, 16}},
      {"transaction_id", {8, 0, 64}}, {"attr_id", {16, 0, 16}},  {"attr_mod", {20, 0, 32}}};
  EXPECT_EQ(places(mad_header_layout()), want);
}

TEST(MadLayout, IpCmHeaderMatchesAnnexA11) {
  const Expected want = {{"cm_version", {0, 0, 8}},
                         {"ip_version", {1, 0, 4}},
                         {"src_port", {2, 0, 16}},
                         {"src_ip", {16, 0, 32}},
                         {"dst_ip", {32, 0, 32}}};
  EXPECT_EQ(places(ip_cm_header_layout()), want);
}

// Each table is in wire order, its fields never share a bit, and its last field (the private
// data) ends at the MAD's last byte.
TEST(MadLayout, TablesTileTheMessageWithoutOverlap) {
  constexpr size_t kBits = (kMadBytes - kMadHeaderBytes) * 8;
  for (const auto& [id, unused] : spec_layouts()) {
    const auto layout = field_layout(id);
    ASSERT_FALSE(layout.empty());
    size_t end = 0;
    for (const FieldLayout& f : layout) {
      const size_t begin = size_t(f.byte) * 8 + f.bit;
      EXPECT_GE(begin, end) << attr_name(uint16_t(id)) << " " << f.name;
      end = begin + f.width;
    }
    EXPECT_EQ(end, kBits) << attr_name(uint16_t(id));
  }
}

// Any bytes that decode re-encode to the same bytes in every field the table states (the
// reserved bits between fields are written as zero).
TEST(MadLayout, DecodeThenEncodeKeepsEveryTabledBit) {
  std::mt19937 rng(26);
  for (const auto& [id, unused] : spec_layouts()) {
    for (int i = 0; i < 200; ++i) {
      std::array<uint8_t, kMadBytes> b;
      for (auto& x : b) x = uint8_t(rng());
      b[0] = kMadBaseVersion;
      b[1] = kMgmtClassCm;
      b[2] = kCmClassVersion;
      b[3] = kMethodSend;
      b[16] = uint8_t(uint16_t(id) >> 8);
      b[17] = uint8_t(id);
      DecodeResult d = decode(b);
      ASSERT_TRUE(d.mad);
      const auto again = encode(d.mad->header, d.mad->message);
      for (const FieldLayout& f : mad_header_layout())  // (bytes 18–19 are reserved)
        for (unsigned k = 0; k < f.width / 8; ++k) ASSERT_EQ(b[f.byte + k], again[f.byte + k]);
      for (const FieldLayout& f : field_layout(id)) {
        for (unsigned k = 0; k < f.width; ++k) {
          const size_t bit = (size_t(f.byte) * 8 + f.bit + k);
          const size_t byte = kMadHeaderBytes + bit / 8;
          const unsigned mask = 0x80u >> (bit % 8);
          ASSERT_EQ(b[byte] & mask, again[byte] & mask)
              << attr_name(uint16_t(id)) << " " << f.name << " bit " << k;
        }
      }
    }
  }
}

// ---- Wireshark: a capture of our MADs (RoCEv2 UD SEND to QP1), decoded field by field ----

/// The frame carrying `mad`: Ethernet, IPv4, UDP to 4791, BTH (UD SEND Only to QP 1), DETH
/// (the GSI Q_Key, source QP 1), the MAD and an ICRC Wireshark does not check by default.
std::vector<uint8_t> roce_frame(const std::array<uint8_t, kMadBytes>& mad) {
  const size_t udp_len = 8 + 12 + 8 + kMadBytes + 4, ip_len = 20 + udp_len;
  std::vector<uint8_t> f;
  f.reserve(14 + ip_len);
  auto add = [&](std::initializer_list<uint8_t> bytes) { f.insert(f.end(), bytes); };
  add({2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00});  // Ethernet
  add({0x45,
       0,
       uint8_t(ip_len >> 8),
       uint8_t(ip_len),
       0,
       0,
       0x40,
       0,
       64,
       17,
       0,
       0,  // IPv4
       10,
       0,
       0,
       1,
       10,
       0,
       0,
       2});
  add({0xc0, 0x00, 0x12, 0xb7, uint8_t(udp_len >> 8), uint8_t(udp_len), 0, 0});  // UDP → 4791
  add({0x64, 0, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 0});  // BTH: UD SEND Only to QP 1
  add({0x80, 0x01, 0x00, 0x00, 0, 0, 0, 1});           // DETH: GSI Q_Key, source QP 1
  for (uint8_t b : mad) f.push_back(b);
  for (int i = 0; i < 4; ++i) f.push_back(0);  // ICRC
  return f;
}

/// Writes a pcap file (little-endian, Ethernet link type) of one frame per MAD.
void write_pcap(const std::string& path, const std::vector<std::array<uint8_t, kMadBytes>>& mads) {
  std::ofstream out(path, std::ios::binary);
  auto u32 = [&](uint32_t v) { out.write(reinterpret_cast<const char*>(&v), 4); };
  auto u16 = [&](uint16_t v) { out.write(reinterpret_cast<const char*>(&v), 2); };
  u32(0xa1b2c3d4);
  u16(2);
  u16(4);
  u32(0);
  u32(0);
  u32(65535);
  u32(1);
  uint32_t t = 0;
  for (const auto& m : mads) {
    const auto f = roce_frame(m);
    u32(++t);
    u32(0);
    u32(uint32_t(f.size()));
    u32(uint32_t(f.size()));
    out.write(reinterpret_cast<const char*>(f.data()), std::streamsize(f.size()));
  }
}

std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

template <size_t N>
std::string hex(const std::array<uint8_t, N>& a) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (uint8_t x : a) {
    s += digits[x >> 4];
    s += digits[x & 15];
  }
  return s;
}

/// One message and what Wireshark must show for it: (field, value) with integers as tshark
/// prints them in hex or decimal, byte strings as lower-case hex.
struct Check {
  std::string filter;
  std::array<uint8_t, kMadBytes> mad;
  std::vector<std::pair<std::string, std::string>> fields;
};

std::string num(uint64_t v) {
  return std::to_string(v);
}

std::vector<Check> checks() {
  std::vector<Check> out;
  MadHeader h;
  h.transaction_id = 0x0102030405060708ull;
  {
    // Every field non-zero and not its default, and a service ID that is no IP CM one (so
    // Wireshark shows the private data as bytes).
    Req r = sample_req();
    r.service_id = 0x1122334455667788ull;
    r.transport = ReqTransport::kUc;
    r.retry_count = 5;
    r.pkey = 0x8001;
    r.rdc_exists = true;
    r.max_cm_retries = 14;
    r.extended_transport = 1;
    r.primary.local_lid = 0x1234;
    r.primary.remote_lid = 0x4321;
    r.primary.subnet_local = true;
    // Not compared: Wireshark 4.0 reads the primary flow label (table 106: byte 88, 20 bits)
    // and packet rate (byte 91, bits 2–7) with other masks (0xabcde shows as 0xabc).
    out.push_back({"infiniband.cm.req",
                   encode(h, r),
                   {{"infiniband.cm.req", num(r.local_comm_id)},
                    {"infiniband.cm.req.serviceid", num(r.service_id)},
                    {"infiniband.cm.req.localcaguid", num(r.local_ca_guid)},
                    {"infiniband.cm.req.localqkey", num(r.local_qkey)},
                    {"infiniband.cm.req.localqpn", num(r.local_qpn)},
                    {"infiniband.cm.req.responderres", num(r.responder_resources)},
                    {"infiniband.cm.req.localeecn", num(r.local_eecn)},
                    {"infiniband.cm.req.initdepth", num(r.initiator_depth)},
                    {"infiniband.cm.req.remoteeecn", num(r.remote_eecn)},
                    {"infiniband.cm.req.remoteresptout", num(r.remote_cm_response_timeout)},
                    {"infiniband.cm.req.transpsvctype", num(uint8_t(r.transport))},
                    {"infiniband.cm.req.e2eflowctrl", num(r.flow_control)},
                    {"infiniband.cm.req.startpsn", num(r.starting_psn)},
                    {"infiniband.cm.req.localresptout", num(r.local_cm_response_timeout)},
                    {"infiniband.cm.req.retrcount", num(r.retry_count)},
                    {"infiniband.cm.req.pkey", num(r.pkey)},
                    {"infiniband.cm.req.pppmtu", num(r.path_mtu)},
                    {"infiniband.cm.req.rdcexist", num(r.rdc_exists)},
                    {"infiniband.cm.req.rnrretrcount", num(r.rnr_retry_count)},
                    {"infiniband.cm.req.maxcmretr", num(r.max_cm_retries)},
                    {"infiniband.cm.req.srq", num(r.srq)},
                    {"infiniband.cm.req.ext_transport", num(r.extended_transport)},
                    {"infiniband.cm.req.prim_locallid", num(r.primary.local_lid)},
                    {"infiniband.cm.req.prim_remotelid", num(r.primary.remote_lid)},
                    {"infiniband.cm.req.prim_tfcclass", num(r.primary.traffic_class)},
                    {"infiniband.cm.req.prim_hoplim", num(r.primary.hop_limit)},
                    {"infiniband.cm.req.prim_sl", num(r.primary.sl)},
                    {"infiniband.cm.req.prim_subnetlocal", num(r.primary.subnet_local)},
                    {"infiniband.cm.req.prim_localacktout", num(r.primary.local_ack_timeout)},
                    {"infiniband.cm.req.private", hex(r.private_data)}}});
  }
  {
    Rep r;
    r.local_comm_id = 0x01020304;
    r.remote_comm_id = 0x11223344;
    r.local_qkey = 0x12345678;
    r.local_qpn = 0x000123;
    r.local_eecn = 0x456789;
    r.starting_psn = 0xabcdef;
    r.vendor_id = 0x02c9a5;
    r.responder_resources = 4;
    r.initiator_depth = 2;
    r.target_ack_delay = 21;
    r.failover_accepted = 2;
    r.flow_control = true;
    r.rnr_retry_count = 7;
    r.srq = true;
    r.local_ca_guid = 0x0011223344556677ull;
    r.private_data = pattern<kRepPrivateBytes>(5);
    out.push_back({"infiniband.cm.rep",
                   encode(h, r),
                   {{"infiniband.cm.rep", num(r.local_comm_id)},
                    {"infiniband.cm.rep.remotecommid", num(r.remote_comm_id)},
                    {"infiniband.cm.rep.localqkey", num(r.local_qkey)},
                    {"infiniband.cm.rep.localqpn", num(r.local_qpn)},
                    {"infiniband.cm.rep.localeecn", num(r.local_eecn)},
                    {"infiniband.cm.rep.startpsn", num(r.starting_psn)},
                    {"infiniband.cm.rep.respres", num(r.responder_resources)},
                    {"infiniband.cm.rep.initdepth", num(r.initiator_depth)},
                    {"infiniband.cm.rep.tgtackdelay", num(r.target_ack_delay)},
                    {"infiniband.cm.rep.failoveracc", num(r.failover_accepted)},
                    {"infiniband.cm.rep.e2eflowctrl", num(r.flow_control)},
                    {"infiniband.cm.rep.rnrretrcount", num(r.rnr_retry_count)},
                    {"infiniband.cm.rep.srq", num(r.srq)},
                    {"infiniband.cm.rep.localcaguid", num(r.local_ca_guid)},
                    {"infiniband.cm.rep.private", hex(r.private_data)}}});
  }
  {
    Rtu r;
    r.local_comm_id = 0x0a0b0c0d;
    r.remote_comm_id = 0x01020304;
    r.private_data = pattern<kRtuPrivateBytes>(7);
    out.push_back({"infiniband.cm.rtu.localcommid",
                   encode(h, r),
                   {{"infiniband.cm.rtu.localcommid", num(r.local_comm_id)},
                    {"infiniband.cm.rtu.remotecommid", num(r.remote_comm_id)},
                    {"infiniband.cm.rtu.private", hex(r.private_data)}}});
  }
  {
    Rej r;
    r.local_comm_id = 0x55667788;
    r.remote_comm_id = 0x99aabbcc;
    r.message = MessageRef::kRep;
    r.reject_info_length = 72;
    r.reason = uint16_t(RejReason::kConsumerDefined);
    r.ari = pattern<kRejAriBytes>(9);
    r.private_data = pattern<kRejPrivateBytes>(11);
    out.push_back({"infiniband.cm.rej.localcommid",
                   encode(h, r),
                   {{"infiniband.cm.rej.localcommid", num(r.local_comm_id)},
                    {"infiniband.cm.rej.remotecommid", num(r.remote_comm_id)},
                    {"infiniband.cm.rej.msgrej", num(uint8_t(r.message))},
                    {"infiniband.cm.rej.rejinfolen", num(r.reject_info_length)},
                    {"infiniband.cm.rej.reason", num(r.reason)},
                    {"infiniband.cm.rej.ari", hex(r.ari)},
                    {"infiniband.cm.rej.private", hex(r.private_data)}}});
  }
  {
    Dreq r;
    r.local_comm_id = 0x13572468;
    r.remote_comm_id = 0x24681357;
    r.remote_qpn = 0x00beef;
    r.private_data = pattern<kDreqPrivateBytes>(13);
    out.push_back({"infiniband.cm.dreq.localcommid",
                   encode(h, r),
                   {{"infiniband.cm.dreq.localcommid", num(r.local_comm_id)},
                    {"infiniband.cm.dreq.remotecommid", num(r.remote_comm_id)},
                    {"infiniband.cm.req.remoteqpneecn", num(r.remote_qpn)},  // (sic) in 4.0
                    {"infiniband.cm.dreq.private", hex(r.private_data)}}});
  }
  {
    Drep r;
    r.local_comm_id = 0x0badcafe;
    r.remote_comm_id = 0x0d15ea5e;
    r.private_data = pattern<kDrepPrivateBytes>(17);
    out.push_back({"infiniband.cm.drsp.localcommid",
                   encode(h, r),
                   {{"infiniband.cm.drsp.localcommid", num(r.local_comm_id)},
                    {"infiniband.cm.drsp.remotecommid", num(r.remote_comm_id)},
                    {"infiniband.cm.drsp.private", hex(r.private_data)}}});
  }
  return out;
}

/// tshark's value as a canonical string: integers in decimal, byte strings as bare hex.
std::string canonical(std::string v) {
  std::erase(v, ':');
  if (v.empty()) return v;
  if (v.starts_with("0x")) return std::to_string(std::stoull(v, nullptr, 16));
  return v;
}

// MRA and SIDR are not in Wireshark 4.0's CM dissector; the field tables above cover them.
TEST(MadWireshark, DecodesEachFieldOfOurReqRepRtuRejDreqDrep) {
  if (std::system("command -v tshark >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "tshark is not installed: the Wireshark decode check is skipped";
  const auto all = checks();
  std::vector<std::array<uint8_t, kMadBytes>> mads;
  for (const Check& c : all) mads.push_back(c.mad);
  const std::string file = testing::TempDir() + "cm_mads_" + std::to_string(getpid()) + ".pcap";
  write_pcap(file, mads);
  for (const Check& c : all) {
    std::string cmd = "tshark -r '" + file + "' -Y '" + c.filter + "' -T fields -E separator=/t";
    for (const auto& [name, unused] : c.fields) cmd += " -e " + name;
    std::istringstream line(run(cmd + " 2>/dev/null"));
    std::string got_line;
    ASSERT_TRUE(std::getline(line, got_line)) << "tshark decoded no " << c.filter;
    std::istringstream cols(got_line);
    for (const auto& [name, want] : c.fields) {
      std::string got;
      std::getline(cols, got, '\t');
      EXPECT_EQ(canonical(got), want) << name;
    }
  }
  std::remove(file.c_str());
}

}  // namespace
}  // namespace softrdma::cm
