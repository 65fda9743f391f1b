// The built-in metadata stores: a directory, and the TCP server with its clients.
#include <gtest/gtest.h>

#include <thread>

#include "kv/metadata_store.h"
#include "kv/tests/kv_test_util.h"

namespace softrdma::kv {
namespace {

void exercise(MetadataStore& s) {
  EXPECT_FALSE(s.get("softrdma-kv/none").has_value());
  s.put("softrdma-kv/a", "one");
  s.put("weird%/key", std::string("bin\0ary\n", 8));
  EXPECT_EQ("one", s.get("softrdma-kv/a").value_or(""));
  EXPECT_EQ(std::string("bin\0ary\n", 8), s.get("weird%/key").value_or(""));
  s.put("softrdma-kv/a", "two");
  EXPECT_EQ("two", s.get("softrdma-kv/a").value_or(""));
  s.remove("softrdma-kv/a");
  s.remove("softrdma-kv/a");  // absent: nothing happens
  EXPECT_FALSE(s.get("softrdma-kv/a").has_value());
  EXPECT_THROW(s.put("", "x"), std::invalid_argument);
  EXPECT_THROW(s.put(std::string(256, 'k'), "x"), std::invalid_argument);
}

TEST(FileMetadataStore, PutGetRemove) {
  test::TempStore t;
  exercise(*t.store());
  EXPECT_EQ("file://" + t.dir(), t.store()->describe());
}

TEST(TcpMetadataStore, PutGetRemoveAndSharedBetweenClients) {
  TcpMetadataServer server("127.0.0.1", 0);
  ASSERT_NE(0, server.port());
  auto c1 = open_metadata_store(server.uri());
  auto c2 = open_metadata_store(server.uri());
  exercise(*c1);
  c1->put("k", std::string(100'000, 'v'));
  EXPECT_EQ(std::string(100'000, 'v'), c2->get("k").value_or(""));
  // Several threads on one client.
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i)
    ts.emplace_back([&, i] {
      for (int j = 0; j < 50; ++j) c2->put("t" + std::to_string(i), std::to_string(j));
    });
  for (auto& t : ts) t.join();
  for (int i = 0; i < 4; ++i) EXPECT_EQ("49", c1->get("t" + std::to_string(i)).value_or(""));
}

TEST(TcpMetadataStore, AnUnreachableServerIsNamed) {
  uint16_t port = 0;
  {
    TcpMetadataServer s("127.0.0.1", 0);
    port = s.port();
  }
  try {
    TcpMetadataStore c("127.0.0.1", port, 100);
    ADD_FAILURE();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string::npos, std::string(e.what()).find(std::to_string(port))) << e.what();
  }
}

TEST(OpenMetadataStore, RefusesOtherForms) {
  EXPECT_THROW(open_metadata_store("etcd://x:1"), std::invalid_argument);
  EXPECT_THROW(open_metadata_store("tcp://host"), std::invalid_argument);
  EXPECT_THROW(open_metadata_store("tcp://host:99999"), std::invalid_argument);
  EXPECT_THROW(open_metadata_store("relative/dir"), std::invalid_argument);
}

}  // namespace
}  // namespace softrdma::kv
