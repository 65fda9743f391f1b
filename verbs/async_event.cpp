// Asynchronous events (ibv_get_async_event / ibv_ack_async_event) on the context's
// async_fd.
#include <unistd.h>

#include "verbs/ops.h"

using namespace softrdma;
using namespace softrdma::verbs;

extern "C" {

int ibv_get_async_event(ibv_context* ctx, ibv_async_event* event) {
  ssize_t r;
  do {
    r = ::read(ctx->async_fd, event, sizeof *event);
  } while (r < 0 && errno == EINTR);
  if (r != static_cast<ssize_t>(sizeof *event)) {
    if (r >= 0) errno = EIO;
    return -1;
  }
  return 0;
}

void ibv_ack_async_event(ibv_async_event*) {}

}  // extern "C"
