// The rsockets wire protocol of rdma-core's librdmacm (librdmacm/rsocket.c), as data: the
// connection private data a stream rsocket puts in its REQ and REP, the 32-bit immediate of
// every RDMA WRITE WITH IMMEDIATE it posts (3-bit op, 29-bit data), the control codes and the
// SGE / iomap entries a peer writes into this side's target buffer list. Pure functions, no
// I/O: tests drive it alone. Byte order: the conn data fields are big-endian on the wire;
// SGEs written by RDMA are in the writer's host order, flagged by RS_CONN_FLAG_NET (a
// big-endian host) — a reader of the other order swaps (rsocket.c's RS_OPT_SWAP_SGL).
#pragma once

#include <endian.h>

#include <cstdint>
#include <cstring>

namespace softrdma::rsocket {

/// Ops carried in the top 3 bits of the immediate (rsocket.c's enum RS_OP_*). Values 1, 3, 5
/// are reserved; RS_OP_WRITE (2) only ever names a local send WQE, never a wire message.
enum class Op : uint32_t {
  kData = 0,      ///< data: the low 29 bits are the byte count written into the data buffer
  kWrite = 2,     ///< local only: a riowrite WQE (no immediate, no message at the peer)
  kSgl = 4,       ///< credits: low bits = the sender's new receive sequence limit (16 bits)
  kIomapSgl = 6,  ///< an iomap entry was written at index = low bits
  kCtrl = 7,      ///< control: low bits = Ctrl
};

/// RS_OP_CTRL codes (rsocket.c's RS_CTRL_*).
enum class Ctrl : uint32_t { kDisconnect = 0, kKeepalive = 1, kShutdown = 2 };

/// Builds the immediate `op << 29 | data` (host order; the WR carries htobe32 of it).
constexpr uint32_t make_msg(Op op, uint32_t data) {
  return (static_cast<uint32_t>(op) << 29) | (data & 0x1FFFFFFFu);
}
/// The op of a host-order immediate.
constexpr Op msg_op(uint32_t msg) {
  return static_cast<Op>(msg >> 29);
}
/// The 29-bit data of a host-order immediate.
constexpr uint32_t msg_data(uint32_t msg) {
  return msg & 0x1FFFFFFFu;
}

/// struct rs_sge: a remote buffer (16 bytes, writer's host order when written by RDMA).
struct Sge {
  uint64_t addr;
  uint32_t key;
  uint32_t length;
};
static_assert(sizeof(Sge) == 16);

/// struct rs_iomap: one entry of the peer's iomap table (24 bytes).
struct IomapEntry {
  uint64_t offset;
  Sge sge;
};
static_assert(sizeof(IomapEntry) == 24);

inline constexpr uint8_t kConnVersion = 1;
inline constexpr uint8_t kConnFlagNet = 1 << 0;    ///< RS_CONN_FLAG_NET: big-endian host
inline constexpr uint8_t kConnFlagIomap = 1 << 1;  ///< RS_CONN_FLAG_IOMAP
inline constexpr uint32_t kSglSize = 2;            ///< RS_SGL_SIZE: target SGL entries
inline constexpr uint32_t kCtrlQueue = 4;          ///< RS_QP_CTRL_SIZE: control msgs in flight
inline constexpr uint32_t kSndLowat = 2048;        ///< RS_SNDLOWAT: least send room to send
inline constexpr uint32_t kMaxTransfer = 65536;    ///< RS_MAX_TRANSFER: largest data WRITE
inline constexpr uint32_t kFirstTransfer = 2048;   ///< RS_OLAP_START_SIZE: first WRITE of a call

/// struct rs_conn_data: the REQ/REP private data of a stream rsocket (40 bytes; AF_INET, so
/// no ib_connect_hdr before it). All multi-byte fields big-endian.
struct ConnData {
  uint8_t version;
  uint8_t flags;
  uint16_t credits_be;  ///< receive queue depth = initial send credits of the peer
  uint8_t reserved[3];
  uint8_t target_iomap_size;  ///< scale-encoded (scale_encode with 8 bits)
  Sge target_sgl_be;          ///< where the peer writes credit SGEs: addr, key, length=entries
  Sge data_buf_be;            ///< the first half of the receive buffer: addr, key, length
};
static_assert(sizeof(ConnData) == 40);

/// rs_value_to_scale: values up to 2^(bits-1) as they are, larger ones as a flag bit plus the
/// value >> bits (so 8 bits encode 0..128 exactly, then multiples of 256).
constexpr int scale_encode(int value, int bits) {
  return value <= (1 << (bits - 1)) ? value : (1 << (bits - 1)) | (value >> bits);
}
/// rs_scale_to_value: the inverse of scale_encode.
constexpr int scale_decode(int value, int bits) {
  return value <= (1 << (bits - 1)) ? value : (value & ~(1 << (bits - 1))) << bits;
}

/// What one side announces when it connects or accepts.
struct LocalBuffers {
  uint16_t rq_size;       ///< receive WQEs posted: the peer's initial credits
  int target_iomap_size;  ///< iomap entries this side accepts
  uint64_t target_sgl;    ///< address of the target buffer list (kSglSize Sge, then iomap)
  uint32_t target_rkey;
  uint64_t rbuf;       ///< receive buffer
  uint32_t rbuf_size;  ///< its whole size; the first half is announced
  uint32_t rbuf_rkey;
};

/// rs_format_conn_data: the private data announcing `b` (this host is little-endian unless
/// __BYTE_ORDER says otherwise).
inline ConnData format_conn_data(const LocalBuffers& b) {
  ConnData c{};
  c.version = kConnVersion;
  c.flags = kConnFlagIomap | (__BYTE_ORDER == __BIG_ENDIAN ? kConnFlagNet : 0);
  c.credits_be = htobe16(b.rq_size);
  c.target_iomap_size = static_cast<uint8_t>(scale_encode(b.target_iomap_size, 8));
  c.target_sgl_be = {htobe64(b.target_sgl), htobe32(b.target_rkey), htobe32(kSglSize)};
  c.data_buf_be = {htobe64(b.rbuf), htobe32(b.rbuf_rkey), htobe32(b.rbuf_size >> 1)};
  return c;
}

/// What a peer's private data says, in host order.
struct PeerBuffers {
  Sge remote_sgl;    ///< where to write credit SGEs (length = entries)
  Sge remote_iomap;  ///< where to write iomap entries (length = entries; 0: none)
  Sge first_target;  ///< the first data target (half the peer's receive buffer)
  uint16_t credits;  ///< initial send credits
  bool swap;         ///< the peer's host order differs: SGEs it writes need swapping
};

/// rs_save_conn_data. Returns false for a version other than 1 (rsocket.c refuses those) or
/// private data shorter than ConnData.
inline bool parse_conn_data(const void* data, size_t len, PeerBuffers* out) {
  if (!data || len < sizeof(ConnData)) return false;
  ConnData c;
  std::memcpy(&c, data, sizeof c);
  if (c.version != kConnVersion) return false;
  out->remote_sgl = {be64toh(c.target_sgl_be.addr), be32toh(c.target_sgl_be.key),
                     be32toh(c.target_sgl_be.length)};
  const bool peer_net = (c.flags & kConnFlagNet) != 0;
  out->swap = peer_net != (__BYTE_ORDER == __BIG_ENDIAN);
  out->remote_iomap = {};
  if (c.flags & kConnFlagIomap) {
    out->remote_iomap.addr = out->remote_sgl.addr + sizeof(Sge) * out->remote_sgl.length;
    out->remote_iomap.length = static_cast<uint32_t>(scale_decode(c.target_iomap_size, 8));
    out->remote_iomap.key = out->remote_sgl.key;
  }
  out->first_target = {be64toh(c.data_buf_be.addr), be32toh(c.data_buf_be.key),
                       be32toh(c.data_buf_be.length)};
  out->credits = be16toh(c.credits_be);
  return true;
}

}  // namespace softrdma::rsocket
