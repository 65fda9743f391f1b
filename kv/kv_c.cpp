// The C API (kv_c.h) over kv::Engine: exceptions become error codes and a thread-local
// message.
#include "kv/kv_c.h"

#include <cstring>
#include <deque>
#include <mutex>
#include <new>
#include <string>

#include "kv/engine.h"

using namespace softrdma::kv;  // NOLINT(google-build-using-namespace): the wrapped API

struct kv_store {
  std::shared_ptr<MetadataStore> store;
};
struct kv_store_server {
  std::unique_ptr<TcpMetadataServer> server;
};
struct kv_engine {
  std::unique_ptr<Engine> engine;
  // A notification taken from the engine but too long for the caller's buffer waits here.
  std::mutex mu;
  std::deque<Notification> held;
};

namespace {

thread_local std::string g_last_error;

template <class F>
int guarded(F&& f) {
  try {
    g_last_error.clear();
    return f();
  } catch (const std::invalid_argument& e) {
    g_last_error = e.what();
    return KV_ERR_INVALID;
  } catch (const KvError& e) {
    g_last_error = e.what();
    return KV_ERR_PEER;
  } catch (const std::exception& e) {
    g_last_error = e.what();
    return KV_ERR_INTERNAL;
  } catch (...) {
    g_last_error = "unknown exception";
    return KV_ERR_INTERNAL;
  }
}

int invalid(const char* what) {
  g_last_error = what;
  return KV_ERR_INVALID;
}

}  // namespace

extern "C" {

const char* kv_last_error(void) {
  return g_last_error.c_str();
}

int kv_store_open(const char* uri, kv_store** out) {
  if (!uri || !out) return invalid("kv_store_open: null argument");
  return guarded([&] {
    *out = new kv_store{open_metadata_store(uri)};
    return KV_OK;
  });
}

void kv_store_close(kv_store* store) {
  delete store;
}

int kv_store_server_start(const char* host, uint16_t port, kv_store_server** out,
                          uint16_t* port_out) {
  if (!host || !out) return invalid("kv_store_server_start: null argument");
  return guarded([&] {
    auto s = std::make_unique<TcpMetadataServer>(host, port);
    if (port_out) *port_out = s->port();
    *out = new kv_store_server{std::move(s)};
    return KV_OK;
  });
}

void kv_store_server_stop(kv_store_server* server) {
  delete server;
}

int kv_engine_create(const char* name, kv_store* store, kv_engine** out) {
  if (!name || !store || !out) return invalid("kv_engine_create: null argument");
  return guarded([&] {
    auto e = std::make_unique<kv_engine>();
    e->engine = std::make_unique<Engine>(name, store->store);
    *out = e.release();
    return KV_OK;
  });
}

void kv_engine_destroy(kv_engine* engine) {
  delete engine;
}

int kv_register_memory(kv_engine* e, void* addr, size_t length, const char* location,
                       const char* name) {
  if (!e) return invalid("kv_register_memory: null engine");
  return guarded([&] {
    e->engine->register_memory(addr, length, location ? location : "cpu:0", name ? name : "");
    return KV_OK;
  });
}

int kv_deregister_memory(kv_engine* e, const char* name) {
  if (!e || !name) return invalid("kv_deregister_memory: null argument");
  return guarded([&] {
    e->engine->deregister_memory(name);
    return KV_OK;
  });
}

int kv_open_segment(kv_engine* e, const char* peer, const char* segment, kv_segment* out) {
  if (!e || !peer || !segment || !out) return invalid("kv_open_segment: null argument");
  return guarded([&] {
    *out = e->engine->open_segment(peer, segment);
    return KV_OK;
  });
}

int kv_allocate_batch(kv_engine* e, size_t capacity, kv_batch* out) {
  if (!e || !out) return invalid("kv_allocate_batch: null argument");
  return guarded([&] {
    *out = e->engine->allocate_batch(capacity);
    return KV_OK;
  });
}

int kv_submit_transfer(kv_engine* e, kv_batch batch, const kv_request* requests, size_t count,
                       const char* notify) {
  if (!e || (count && !requests)) return invalid("kv_submit_transfer: null argument");
  return guarded([&] {
    std::vector<TransferRequest> reqs(count);
    for (size_t i = 0; i < count; ++i) {
      const kv_request& r = requests[i];
      if (r.opcode != KV_READ && r.opcode != KV_WRITE)
        throw std::invalid_argument("kv_submit_transfer: request " + std::to_string(i) +
                                    ": opcode is neither KV_READ nor KV_WRITE");
      reqs[i] = TransferRequest{r.opcode == KV_READ ? Opcode::kRead : Opcode::kWrite, r.local,
                                r.target, r.offset, r.length};
    }
    e->engine->submit_transfer(batch, reqs, notify ? notify : "");
    return KV_OK;
  });
}

int kv_get_status(kv_engine* e, kv_batch batch, kv_batch_status* out) {
  if (!e || !out) return invalid("kv_get_status: null argument");
  return guarded([&] {
    const BatchStatus s = e->engine->get_status(batch);
    out->state = s.state == BatchState::kPending     ? KV_PENDING
                 : s.state == BatchState::kCompleted ? KV_COMPLETED
                                                     : KV_FAILED;
    out->bytes_done = s.bytes_done;
    out->bytes_total = s.bytes_total;
    if (s.state == BatchState::kFailed) g_last_error = s.error;
    return KV_OK;
  });
}

int kv_wait(kv_engine* e, kv_batch batch, int timeout_ms) {
  if (!e || timeout_ms < 0) return invalid("kv_wait: null engine or negative timeout");
  return guarded([&] {
    const BatchStatus s = e->engine->wait(batch, std::chrono::milliseconds(timeout_ms));
    if (s.state == BatchState::kCompleted) return KV_OK;
    if (s.state == BatchState::kFailed) {
      g_last_error = s.error;
      return KV_ERR_PEER;
    }
    g_last_error = "kv_wait: batch " + std::to_string(batch) + " still pending after " +
                   std::to_string(timeout_ms) + " ms";
    return KV_ERR_TIMEOUT;
  });
}

int kv_free_batch(kv_engine* e, kv_batch batch) {
  if (!e) return invalid("kv_free_batch: null engine");
  return guarded([&] {
    e->engine->free_batch(batch);
    return KV_OK;
  });
}

int kv_notify(kv_engine* e, const char* peer, const void* message, size_t length) {
  if (!e || !peer || (length && !message)) return invalid("kv_notify: null argument");
  return guarded([&] {
    e->engine->notify(peer, std::string_view(static_cast<const char*>(message), length));
    return KV_OK;
  });
}

int kv_get_notification(kv_engine* e, char* peer, size_t peer_cap, void* message, size_t* length,
                        int timeout_ms) {
  if (!e || !peer || !length || (*length && !message) || timeout_ms < 0)
    return invalid("kv_get_notification: null argument or negative timeout");
  return guarded([&] {
    std::lock_guard lk(e->mu);
    if (e->held.empty()) {
      auto n = e->engine->wait_notification(std::chrono::milliseconds(timeout_ms));
      if (!n) {
        g_last_error = "kv_get_notification: none within " + std::to_string(timeout_ms) + " ms";
        return KV_ERR_TIMEOUT;
      }
      e->held.push_back(std::move(*n));
    }
    const Notification& n = e->held.front();
    if (n.message.size() > *length || n.peer.size() + 1 > peer_cap) {
      *length = n.message.size();
      throw std::invalid_argument("kv_get_notification: buffers too small (message " +
                                  std::to_string(n.message.size()) + " bytes, peer name " +
                                  std::to_string(n.peer.size() + 1) + ")");
    }
    std::memcpy(peer, n.peer.c_str(), n.peer.size() + 1);
    std::memcpy(message, n.message.data(), n.message.size());
    *length = n.message.size();
    e->held.pop_front();
    return KV_OK;
  });
}

}  // extern "C"
