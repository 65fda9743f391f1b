// VerbsTransport's public methods: each forwards to the state in verbs_transport_impl.h, whose
// parts live one concept per file (listed there). The protocol is described in
// verbs_transport.h.
#include "ccl/verbs_transport.h"

#include <infiniband/verbs.h>

#include <cerrno>
#include <stdexcept>
#include <string>

#include "ccl/verbs_transport_impl.h"

namespace softrdma::ccl {

using verbs::verbs_fail;
using verbs::VerbsBuffer;

// ---- VerbsTransport -----------------------------------------------------------------------

VerbsTransport::VerbsTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

VerbsTransport::~VerbsTransport() {
  if (impl_) impl_->close();
}

int VerbsTransport::rank() const {
  return impl_->rank;
}
int VerbsTransport::size() const {
  return impl_->size;
}

std::string VerbsTransport::peer_description(int peer) const {
  if (peer < 0 || peer >= impl_->size) return "rank " + std::to_string(peer);
  const std::string& d = impl_->peers[peer].desc;
  return d.empty() ? "rank " + std::to_string(peer) : d;
}

std::chrono::milliseconds VerbsTransport::timeout() const {
  return impl_->opt.timeout;
}

std::string VerbsTransport::local_address() const {
  return impl_->my_addr;
}

std::string VerbsTransport::device_name() const {
  return impl_->dev && impl_->dev->ctx ? ibv_get_device_name(impl_->dev->ctx->device) : "";
}

std::unique_ptr<Buffer> VerbsTransport::register_buffer(void* data, size_t bytes) {
  ibv_mr* mr = nullptr;
  if (bytes > 0) {
    if (!data) throw std::invalid_argument("register_buffer: null data with bytes > 0");
    mr = ibv_reg_mr(impl_->dev->pd, data, bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!mr) verbs_fail("ibv_reg_mr(" + std::to_string(bytes) + " bytes)", errno);
  }
  return std::make_unique<VerbsBuffer>(impl_->dev, impl_.get(), data, bytes, mr);
}

RequestId VerbsTransport::send(int peer, const Buffer& buf, size_t offset, size_t bytes,
                               uint64_t tag) {
  return impl_->send(peer, buf, offset, bytes, tag);
}

RequestId VerbsTransport::recv(int peer, Buffer& buf, size_t offset, size_t bytes, uint64_t tag) {
  return impl_->recv(peer, buf, offset, bytes, tag);
}

void VerbsTransport::wait(RequestId id, const char* op) {
  impl_->wait(id, op);
}
bool VerbsTransport::test(RequestId id, const char* op) {
  return impl_->test(id, op);
}
void VerbsTransport::barrier(const char* op) {
  impl_->barrier(op);
}
uint64_t VerbsTransport::path_bytes(int peer) const {
  return impl_->path_bytes(peer);
}

}  // namespace softrdma::ccl
