// Where kv engines find each other: a small key/value store holding each engine's record
// (device address, handshake listener, segments with their remote keys).
//
// Mooncake keeps the same records in etcd, Redis or its HTTP metadata server
// (mooncake-transfer-engine/src/transfer_metadata_plugin.cpp); NIXL exchanges them through
// its agent's listener or etcd. Any store with get/put/remove of byte strings fits the
// interface below: an etcd store would map put → etcd PUT, get → RANGE on the key,
// remove → DELETE_RANGE (v3 KV API), an HTTP store GET/PUT/DELETE on <base-url>/<key>.
// Two come built in: a TCP store (TcpMetadataServer, which one process runs, and
// TcpMetadataStore clients) and a directory (FileMetadataStore) for tests on one host.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace softrdma::kv {

/// A key/value store shared by the engines. Keys are 1–255 bytes without NUL; values any
/// bytes up to 1 MiB. Implementations are thread-safe. Failures to reach the store throw
/// std::runtime_error naming it.
class MetadataStore {
 public:
  virtual ~MetadataStore() = default;
  /// Sets `key` to `value` (replacing an older value).
  virtual void put(std::string_view key, std::string_view value) = 0;
  /// The value of `key`, or nullopt when absent.
  virtual std::optional<std::string> get(std::string_view key) = 0;
  /// Removes `key` (absent: nothing happens).
  virtual void remove(std::string_view key) = 0;
  /// "tcp://127.0.0.1:7000", "file:///tmp/kv" — for messages.
  virtual std::string describe() const = 0;
};

/// A directory: one file per key (the key with '/' and '%' escaped as %2F and %25), written
/// to a temporary name and renamed, so a reader sees the old value or the new one. The
/// directory is created if missing. For processes on one host (tests, one-machine demos).
class FileMetadataStore final : public MetadataStore {
 public:
  explicit FileMetadataStore(std::string directory);
  void put(std::string_view key, std::string_view value) override;
  std::optional<std::string> get(std::string_view key) override;
  void remove(std::string_view key) override;
  std::string describe() const override;

 private:
  std::string path_of(std::string_view key) const;
  std::string dir_;
};

/// The TCP store's server: a thread that accepts clients on host:port and keeps the
/// key/value map in memory. One process of a deployment runs it (kv-bench
/// --serve-metadata, kv-demo's prefill side). Protocol (little-endian): request
/// op u8 ('P' put, 'G' get, 'R' remove), key length u32, key, value length u32, value;
/// reply status u8 (0 ok, 1 absent), value length u32, value.
class TcpMetadataServer {
 public:
  /// Binds `host`:`port` (port 0: any free one) and starts serving. Throws
  /// std::runtime_error when the address cannot be bound.
  TcpMetadataServer(const std::string& host, uint16_t port);
  /// Stops the server and drops its connections.
  ~TcpMetadataServer();
  TcpMetadataServer(const TcpMetadataServer&) = delete;
  TcpMetadataServer& operator=(const TcpMetadataServer&) = delete;
  /// The port it listens on.
  uint16_t port() const;
  /// "tcp://host:port", the URI clients open.
  std::string uri() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// A client of TcpMetadataServer: one connection, reopened once when it broke.
class TcpMetadataStore final : public MetadataStore {
 public:
  /// Connects to host:port, retrying for up to `timeout_ms` (the server may start later).
  TcpMetadataStore(std::string host, uint16_t port, int timeout_ms = 10000);
  ~TcpMetadataStore() override;
  void put(std::string_view key, std::string_view value) override;
  std::optional<std::string> get(std::string_view key) override;
  void remove(std::string_view key) override;
  std::string describe() const override;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// Opens a store from a URI: "tcp://host:port" or "file:///absolute/dir" (or a bare
/// directory path). Throws std::invalid_argument on another form.
std::shared_ptr<MetadataStore> open_metadata_store(std::string_view uri);

}  // namespace softrdma::kv
