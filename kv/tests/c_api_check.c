/* The C API used from C (compiled as C: kv_c.h must be plain C): two engines in one process,
 * a WRITE with a notification, a READ back, and an error code with its message. */
#include <stdio.h>
#include <string.h>

#include "kv/kv_c.h"

#define CHECK(call)                                                       \
  do {                                                                    \
    int rc_ = (call);                                                     \
    if (rc_ != KV_OK) {                                                   \
      snprintf(err, errlen, "%s -> %d: %s", #call, rc_, kv_last_error()); \
      goto out;                                                           \
    }                                                                     \
  } while (0)

int kv_c_roundtrip(const char* store_uri, char* err, size_t errlen) {
  static unsigned char src[100000], dst[100000], back[100000];
  kv_store* store = NULL;
  kv_engine *a = NULL, *b = NULL;
  int ok = 0;
  kv_segment seg = 0;
  kv_batch batch = 0, batch2 = 0;
  char peer[64];
  char msg[64];
  size_t len = sizeof msg;
  size_t i;
  for (i = 0; i < sizeof src; ++i) src[i] = (unsigned char)(i * 31 + 7);
  CHECK(kv_store_open(store_uri, &store));
  CHECK(kv_engine_create("ca", store, &a));
  CHECK(kv_engine_create("cb", store, &b));
  CHECK(kv_register_memory(a, src, sizeof src, NULL, "src"));
  CHECK(kv_register_memory(a, back, sizeof back, "cpu:0", NULL));
  CHECK(kv_register_memory(b, dst, sizeof dst, NULL, "dst"));
  CHECK(kv_open_segment(a, "cb", "dst", &seg));
  {
    kv_request w = {KV_WRITE, src, seg, 0, sizeof src};
    CHECK(kv_allocate_batch(a, 1, &batch));
    CHECK(kv_submit_transfer(a, batch, &w, 1, "written"));
    CHECK(kv_wait(a, batch, 10000));
    CHECK(kv_free_batch(a, batch));
  }
  CHECK(kv_get_notification(b, peer, sizeof peer, msg, &len, 10000));
  if (strcmp(peer, "ca") != 0 || len != 7 || memcmp(msg, "written", 7) != 0) {
    snprintf(err, errlen, "notification: peer '%s', %zu bytes", peer, len);
    goto out;
  }
  if (memcmp(src, dst, sizeof src) != 0) {
    snprintf(err, errlen, "WRITE: bytes differ");
    goto out;
  }
  {
    kv_request r = {KV_READ, back, seg, 0, sizeof back};
    kv_batch_status st;
    CHECK(kv_allocate_batch(a, 1, &batch2));
    CHECK(kv_submit_transfer(a, batch2, &r, 1, NULL));
    CHECK(kv_wait(a, batch2, 10000));
    CHECK(kv_get_status(a, batch2, &st));
    if (st.state != KV_COMPLETED || st.bytes_done != sizeof back) {
      snprintf(err, errlen, "READ status %d, %llu bytes", st.state,
               (unsigned long long)st.bytes_done);
      goto out;
    }
  }
  if (memcmp(src, back, sizeof src) != 0) {
    snprintf(err, errlen, "READ: bytes differ");
    goto out;
  }
  {
    /* An out-of-bounds request: KV_ERR_INVALID and a message naming the segment. */
    kv_request bad = {KV_WRITE, src, seg, sizeof dst, 1};
    kv_batch b3 = 0;
    CHECK(kv_allocate_batch(a, 1, &b3));
    if (kv_submit_transfer(a, b3, &bad, 1, NULL) != KV_ERR_INVALID ||
        strstr(kv_last_error(), "outside segment 'dst'") == NULL) {
      snprintf(err, errlen, "out of bounds: '%s'", kv_last_error());
      goto out;
    }
    if (kv_open_segment(a, "nobody", "x", &seg) != KV_ERR_PEER) {
      snprintf(err, errlen, "unknown peer: '%s'", kv_last_error());
      goto out;
    }
    len = sizeof msg;
    if (kv_get_notification(b, peer, sizeof peer, msg, &len, 10) != KV_ERR_TIMEOUT) {
      snprintf(err, errlen, "no notification expected");
      goto out;
    }
  }
  ok = 1;
out:
  kv_engine_destroy(a);
  kv_engine_destroy(b);
  kv_store_close(store);
  return ok ? 0 : -1;
}
