// softrdma's private interface of the drop-in libibverbs.so.1, for softrdma's own
// libraries (the RDMA-CM in cm/, the drop-in librdmacm.so.1) — not part of the verbs API,
// exported in the symbol version node SOFTRDMA_PRIVATE_1.0 (verbs/libibverbs.map) so that
// nothing built against Debian's libibverbs can bind to it by accident. cm/ finds them with
// dlsym(RTLD_DEFAULT, name), so that running over another libibverbs fails with a clear
// message instead of a link error.
#pragma once

#include <infiniband/verbs.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/// The resource_type a parent domain's alloc and free callbacks (ibv_alloc_parent_domain(3))
/// are called with, naming the queue the buffer is for, as mlx5dv.h's MLX5DV_RES_TYPE_*: the
/// provider's id in the upper 32 bits (softrdma has no RDMA_DRIVER_* number; 0x5352 is "SR"),
/// the queue in the lower.
#define SOFTRDMADV_RES_TYPE_SQ ((uint64_t)0x5352 << 32 | 1)  /* a QP's send queue */
#define SOFTRDMADV_RES_TYPE_RQ ((uint64_t)0x5352 << 32 | 2)  /* a QP's receive queue */
#define SOFTRDMADV_RES_TYPE_SRQ ((uint64_t)0x5352 << 32 | 3) /* an SRQ's receive queue */
#define SOFTRDMADV_RES_TYPE_CQ ((uint64_t)0x5352 << 32 | 4)  /* a CQ's ring */

/// Creates QP1, the General Services Interface QP (IBTA vol 1, 13.5.1 and 14.4), on the
/// device of `pd`: the QP over which IB CM MADs (REQ, REP, RTU, REJ, DREQ, DREP; ch. 12)
/// travel, in RoCEv2 datagrams to UDP port 4791 like every other packet.
///
/// `attr` is read as for ibv_create_qp(3) and must ask for `qp_type = IBV_QPT_UD`, with
/// send_cq and recv_cq of the same context, no SRQ, and capacities within the device's
/// limits; on success attr->cap is left as given (nothing is rounded).
///
/// What the hook guarantees:
/// - the QP it returns is a UD QP whose qp_num is 1 on that device, an ordinary ibv_qp in
///   every other respect: ibv_modify_qp / ibv_query_qp / ibv_post_send / ibv_post_recv /
///   ibv_poll_cq on its CQs / ibv_destroy_qp work on it exactly as on any UD QP, and it
///   follows the UD rows of the state table (RESET→INIT with IBV_QP_STATE |
///   IBV_QP_PKEY_INDEX (0) | IBV_QP_PORT (1) | IBV_QP_QKEY; INIT→RTR with IBV_QP_STATE;
///   RTR→RTS with IBV_QP_STATE | IBV_QP_SQ_PSN);
/// - its Q_Key is the GSI's well-known 0x80010000 whatever IBV_QP_QKEY says: it receives
///   only datagrams whose DETH carries 0x80010000 (others are dropped and counted in
///   rcvd_qkey_err), and a send WR whose wr.ud.remote_qkey has the most significant bit set
///   (0x80010000 included) goes out with 0x80010000 (IBTA 10.2.5: such a Q_Key means "the
///   QP's own");
/// - the P_Key check is the one of every UD QP: the default partition 0xffff (full or
///   limited member), others dropped and counted (rcvd_malformed);
/// - messages up to the port MTU (at least 1024 B on loopback: a 256-byte MAD always fits);
///   each receive buffer gets the 40-byte GRH area first (its last 20 bytes the sender's
///   IPv4 header), and wc.src_qp of a received MAD is the sender's QPN (1 when it came from
///   another QP1), wc.wc_flags has IBV_WC_GRH;
/// - UD semantics: no acknowledgement or retransmission — a MAD lost (a full ring, an
///   emulated loss) is lost; the CM's own timeouts and retries are the caller's job;
/// - one QP1 per device (per process: one device each): while it exists a second call
///   fails with EBUSY; after ibv_destroy_qp it may be created again.
///
/// Returns NULL with errno set: EINVAL (NULL arguments, a type other than IBV_QPT_UD,
/// missing CQs, an SRQ, capacities over the limits), EBUSY (the device has a QP1), ENOMEM
/// (max_qp reached).
struct ibv_qp* softrdma_create_qp1(struct ibv_pd* pd, struct ibv_qp_init_attr* attr);

/// Opens (or shares) this process's softrdma device bound to the IPv4 address `ipv4` (host
/// order) and returns a new context on it; ibv_close_device releases it. A process may own
/// several addresses this way (ibv_open_device(srdma0) returns the default one: SOFTRDMA_ADDR's
/// first address, else the first opened; srdmaN the N-th address of a SOFTRDMA_ADDR list, from
/// the same per-address map). The context's device is the srdmaN whose address `ipv4` is, else
/// srdma0. A device another process owns at `ipv4` is shared with it (this process joins the
/// address as a member: docs/rdma-cm.md, "Several processes on one address"). Returns NULL
/// with errno: EINVAL (ipv4 0 or a malformed SOFTRDMA_* variable), EADDRINUSE (UDP 4791 at
/// the address is held by something that is not a softrdma device, or all 16 slots of the
/// address are taken), EADDRNOTAVAIL (the address is not configured on this host), or the
/// socket error.
struct ibv_context* softrdma_open_device_at(uint32_t ipv4);

/// The slot (0..15) of this process among the processes sharing the address of `ctx`'s
/// device (net/address_share.h): the top 4 bits of the QPNs it allocates, which the CM also
/// puts in its communication IDs so that each process keeps the MADs that are its own
/// (every process at an address receives each MAD sent to QP1 there). -1 with errno EINVAL
/// for a NULL or foreign context.
int softrdma_address_slot(struct ibv_context* ctx);

#ifdef __cplusplus
}
#endif
