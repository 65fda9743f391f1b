// The built-in metadata stores (metadata_store.h): a directory, and a TCP key/value server
// with its client.
#include "kv/metadata_store.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kv/socket.h"

namespace softrdma::kv {

namespace {

constexpr size_t kMaxKey = 255;
constexpr size_t kMaxValue = 1 << 20;

void check_key(std::string_view key, const char* call) {
  if (key.empty() || key.size() > kMaxKey || key.find('\0') != std::string_view::npos)
    throw std::invalid_argument(std::string(call) + ": a key is 1-255 bytes without NUL, got '" +
                                std::string(key) + "'");
}

void check_value(std::string_view value, const char* call) {
  if (value.size() > kMaxValue)
    throw std::invalid_argument(std::string(call) + ": a value is at most 1 MiB, got " +
                                std::to_string(value.size()) + " bytes");
}

}  // namespace

// ---- FileMetadataStore --------------------------------------------------------------------

FileMetadataStore::FileMetadataStore(std::string directory) : dir_(std::move(directory)) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec || !std::filesystem::is_directory(dir_))
    throw std::runtime_error("FileMetadataStore: cannot create directory " + dir_ + ": " +
                             ec.message());
}

std::string FileMetadataStore::path_of(std::string_view key) const {
  std::string name;
  for (char c : key) {
    if (c == '/')
      name += "%2F";
    else if (c == '%')
      name += "%25";
    else
      name += c;
  }
  return dir_ + "/" + name;
}

void FileMetadataStore::put(std::string_view key, std::string_view value) {
  check_key(key, "FileMetadataStore::put");
  check_value(value, "FileMetadataStore::put");
  const std::string path = path_of(key);
  const std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." +
                          std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(value.data(), static_cast<std::streamsize>(value.size()));
    if (!out) throw std::runtime_error("FileMetadataStore: cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw std::runtime_error("FileMetadataStore: cannot rename to " + path + ": " +
                             std::strerror(errno));
}

std::optional<std::string> FileMetadataStore::get(std::string_view key) {
  check_key(key, "FileMetadataStore::get");
  std::ifstream in(path_of(key), std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void FileMetadataStore::remove(std::string_view key) {
  check_key(key, "FileMetadataStore::remove");
  std::remove(path_of(key).c_str());
}

std::string FileMetadataStore::describe() const {
  return "file://" + dir_;
}

// ---- TCP store ----------------------------------------------------------------------------

namespace {

constexpr auto kIoTimeout = std::chrono::seconds(10);

// One request: op, key, value (see TcpMetadataServer's comment for the layout).
std::string request(char op, std::string_view key, std::string_view value) {
  std::string s(1, op);
  tcp::put_bytes(s, key);
  tcp::put_bytes(s, value);
  return s;
}

bool read_blob(int fd, std::string& out, tcp::Clock::time_point deadline) {
  std::string len;
  if (!tcp::recv_exact(fd, 4, len, deadline)) return false;
  const uint32_t n = tcp::get_u32(len, 0);
  if (n > kMaxValue) return false;
  return tcp::recv_exact(fd, n, out, deadline);
}

}  // namespace

struct TcpMetadataServer::Impl {
  std::string host;
  uint16_t port = 0;
  tcp::Fd listener;
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::map<std::string, std::string, std::less<>> data;
  std::thread acceptor;
  std::mutex clients_mu;
  std::vector<std::thread> clients;

  // Serves one client until it closes or the server stops. Idle clients are polled once a
  // 200 ms so the destructor is seen.
  void serve(tcp::Fd fd) {
    while (!stop) {
      std::string op;
      const auto deadline = tcp::Clock::now() + std::chrono::milliseconds(200);
      if (!tcp::recv_exact(fd.get(), 1, op, deadline)) {
        if (tcp::Clock::now() >= deadline && !stop) continue;  // idle: keep the connection
        return;
      }
      const auto io = tcp::Clock::now() + kIoTimeout;
      std::string key, value;
      if (!read_blob(fd.get(), key, io) || !read_blob(fd.get(), value, io)) return;
      std::string reply;
      {
        std::lock_guard lk(mu);
        if (op[0] == 'P') {
          data[key] = value;
          reply = std::string(1, '\0');
          tcp::put_bytes(reply, {});
        } else if (op[0] == 'G') {
          auto it = data.find(key);
          reply = std::string(1, it == data.end() ? '\1' : '\0');
          tcp::put_bytes(reply, it == data.end() ? std::string_view() : it->second);
        } else if (op[0] == 'R') {
          data.erase(key);
          reply = std::string(1, '\0');
          tcp::put_bytes(reply, {});
        } else {
          return;  // not a client of this protocol
        }
      }
      if (!tcp::send_all(fd.get(), reply, io)) return;
    }
  }
};

TcpMetadataServer::TcpMetadataServer(const std::string& host, uint16_t port)
    : impl_(std::make_unique<Impl>()) {
  impl_->host = host;
  impl_->listener = tcp::listen_tcp(host, port, impl_->port);
  Impl* s = impl_.get();
  impl_->acceptor = std::thread([s] {
    while (!s->stop) {
      tcp::Fd fd = tcp::accept_tcp(s->listener.get(), 100);
      if (!fd) continue;
      std::lock_guard lk(s->clients_mu);
      s->clients.emplace_back([s, f = std::move(fd)]() mutable { s->serve(std::move(f)); });
    }
  });
}

TcpMetadataServer::~TcpMetadataServer() {
  impl_->stop = true;
  ::shutdown(impl_->listener.get(), SHUT_RDWR);  // wakes the acceptor's poll
  impl_->acceptor.join();
  std::lock_guard lk(impl_->clients_mu);
  for (std::thread& t : impl_->clients) t.join();
}

uint16_t TcpMetadataServer::port() const {
  return impl_->port;
}

std::string TcpMetadataServer::uri() const {
  return "tcp://" + impl_->host + ":" + std::to_string(impl_->port);
}

struct TcpMetadataStore::Impl {
  std::string host;
  uint16_t port;
  std::mutex mu;
  tcp::Fd fd;

  std::string where() const { return "tcp://" + host + ":" + std::to_string(port); }

  // One round trip; reconnects once if the connection broke since the last call.
  std::pair<char, std::string> call(char op, std::string_view key, std::string_view value) {
    std::lock_guard lk(mu);
    const std::string req = request(op, key, value);
    for (int attempt = 0; attempt < 2; ++attempt) {
      const auto deadline = tcp::Clock::now() + kIoTimeout;
      if (!fd) fd = tcp::connect_tcp(host, port, deadline, false);
      std::string status, body;
      if (tcp::send_all(fd.get(), req, deadline) &&
          tcp::recv_exact(fd.get(), 1, status, deadline) && read_blob(fd.get(), body, deadline))
        return {status[0], body};
      fd = tcp::Fd();
    }
    throw std::runtime_error("metadata store " + where() + " does not answer");
  }
};

TcpMetadataStore::TcpMetadataStore(std::string host, uint16_t port, int timeout_ms)
    : impl_(std::make_unique<Impl>()) {
  impl_->host = std::move(host);
  impl_->port = port;
  try {
    impl_->fd = tcp::connect_tcp(impl_->host, port,
                                 tcp::Clock::now() + std::chrono::milliseconds(timeout_ms), true);
  } catch (const std::exception& e) {
    throw std::runtime_error("metadata store " + impl_->where() + ": " + e.what());
  }
}

TcpMetadataStore::~TcpMetadataStore() = default;

void TcpMetadataStore::put(std::string_view key, std::string_view value) {
  check_key(key, "TcpMetadataStore::put");
  check_value(value, "TcpMetadataStore::put");
  impl_->call('P', key, value);
}

std::optional<std::string> TcpMetadataStore::get(std::string_view key) {
  check_key(key, "TcpMetadataStore::get");
  auto [status, body] = impl_->call('G', key, {});
  if (status != 0) return std::nullopt;
  return body;
}

void TcpMetadataStore::remove(std::string_view key) {
  check_key(key, "TcpMetadataStore::remove");
  impl_->call('R', key, {});
}

std::string TcpMetadataStore::describe() const {
  return impl_->where();
}

std::shared_ptr<MetadataStore> open_metadata_store(std::string_view uri) {
  if (uri.starts_with("tcp://")) {
    const std::string_view rest = uri.substr(6);
    const size_t colon = rest.rfind(':');
    if (colon == std::string_view::npos || colon + 1 == rest.size())
      throw std::invalid_argument("open_metadata_store: expected tcp://host:port, got '" +
                                  std::string(uri) + "'");
    int port = 0;
    try {
      port = std::stoi(std::string(rest.substr(colon + 1)));
    } catch (const std::exception&) {
      port = -1;
    }
    if (port <= 0 || port > 65535)
      throw std::invalid_argument("open_metadata_store: bad port in '" + std::string(uri) + "'");
    return std::make_shared<TcpMetadataStore>(std::string(rest.substr(0, colon)),
                                              static_cast<uint16_t>(port));
  }
  if (uri.starts_with("file://"))
    return std::make_shared<FileMetadataStore>(std::string(uri.substr(7)));
  if (uri.starts_with("/")) return std::make_shared<FileMetadataStore>(std::string(uri));
  throw std::invalid_argument(
      "open_metadata_store: expected tcp://host:port, file:///dir or /dir, got '" +
      std::string(uri) + "'");
}

}  // namespace softrdma::kv
