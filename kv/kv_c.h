/* C API of the kv engine (kv/engine.h), for bindings (Python ctypes/cffi, Rust, Go).
 *
 * Opaque handles; every call returns KV_OK (0) or a negative KV_ERR_* code, and
 * kv_last_error() gives the message of the calling thread's last failure (naming the peer
 * where one is involved). Units: bytes, milliseconds. Thread-safe like the C++ engine. */
#ifndef KV_C_H_INCLUDED
#define KV_C_H_INCLUDED

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kv_engine kv_engine;             /* one engine (kv::Engine) */
typedef struct kv_store kv_store;               /* a metadata store */
typedef struct kv_store_server kv_store_server; /* a TCP metadata server */
typedef uint64_t kv_segment;                    /* an opened peer segment; 0 is invalid */
typedef uint64_t kv_batch;                      /* a batch; 0 is invalid */

enum kv_status_code {
  KV_OK = 0,
  KV_ERR_INVALID = -1, /* bad argument (std::invalid_argument) */
  KV_ERR_PEER = -2,    /* a peer failed, is unknown or unreachable, or the device failed */
  KV_ERR_TIMEOUT = -3, /* nothing arrived / finished within the timeout */
  KV_ERR_INTERNAL = -4 /* anything else (store unreachable, out of memory) */
};

enum kv_opcode { KV_READ = 0, KV_WRITE = 1 };
enum kv_batch_state { KV_PENDING = 0, KV_COMPLETED = 1, KV_FAILED = 2 };

typedef struct kv_request {
  int opcode;        /* KV_READ or KV_WRITE */
  void* local;       /* in memory registered with the engine */
  kv_segment target; /* kv_open_segment */
  uint64_t offset;   /* bytes into the target segment */
  uint64_t length;   /* bytes, >= 1 */
} kv_request;

typedef struct kv_batch_status {
  int state; /* kv_batch_state */
  uint64_t bytes_done;
  uint64_t bytes_total;
} kv_batch_status;

/* Message of the calling thread's last failure ("" if none). Valid until its next call. */
const char* kv_last_error(void);

/* Metadata stores: uri "tcp://host:port" or "file:///dir" (kv::open_metadata_store). */
int kv_store_open(const char* uri, kv_store** out);
void kv_store_close(kv_store* store);
/* A TCP metadata server on host:port (0: any free port); *port_out gets the port. */
int kv_store_server_start(const char* host, uint16_t port, kv_store_server** out,
                          uint16_t* port_out);
void kv_store_server_stop(kv_store_server* server);

/* An engine named `name` (1-64 of [A-Za-z0-9._:-]) publishing in `store`; options from the
 * SOFTRDMA_KV_* environment. The engine keeps its own reference to the store. */
int kv_engine_create(const char* name, kv_store* store, kv_engine** out);
void kv_engine_destroy(kv_engine* engine);

/* Registers [addr, addr+length) as segment `name` (NULL: "seg<N>"), location e.g. "cpu:0"
 * (NULL: "cpu:0"). */
int kv_register_memory(kv_engine* e, void* addr, size_t length, const char* location,
                       const char* name);
int kv_deregister_memory(kv_engine* e, const char* name);

int kv_open_segment(kv_engine* e, const char* peer, const char* segment, kv_segment* out);

int kv_allocate_batch(kv_engine* e, size_t capacity, kv_batch* out);
/* notify: NULL or a NUL-terminated message sent after the batch completed. */
int kv_submit_transfer(kv_engine* e, kv_batch batch, const kv_request* requests, size_t count,
                       const char* notify);
int kv_get_status(kv_engine* e, kv_batch batch, kv_batch_status* out);
/* Waits up to timeout_ms; KV_OK when completed, KV_ERR_PEER when failed (kv_last_error says
 * why), KV_ERR_TIMEOUT when still pending. */
int kv_wait(kv_engine* e, kv_batch batch, int timeout_ms);
int kv_free_batch(kv_engine* e, kv_batch batch);

int kv_notify(kv_engine* e, const char* peer, const void* message, size_t length);
/* The oldest notification, waiting up to timeout_ms: the sender's name into peer (peer_cap
 * bytes, NUL-terminated) and the message into message (*length: capacity in, bytes out; a
 * longer message is KV_ERR_INVALID and stays queued). KV_ERR_TIMEOUT when none arrived. */
int kv_get_notification(kv_engine* e, char* peer, size_t peer_cap, void* message, size_t* length,
                        int timeout_ms);

#ifdef __cplusplus
}
#endif

#endif /* KV_C_H_INCLUDED */
