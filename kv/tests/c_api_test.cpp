// The C API, driven from C (c_api_check.c), and its TCP store server.
#include <gtest/gtest.h>

#include "kv/kv_c.h"
#include "kv/tests/kv_test_util.h"

extern "C" int kv_c_roundtrip(const char* store_uri, char* err, size_t errlen);

namespace softrdma::kv {
namespace {

TEST(CApi, RoundTripFromCOverAFileStore) {
  test::TempStore t;
  char err[512] = "";
  EXPECT_EQ(0, kv_c_roundtrip(("file://" + t.dir()).c_str(), err, sizeof err)) << err;
}

TEST(CApi, RoundTripFromCOverTheTcpStore) {
  kv_store_server* server = nullptr;
  uint16_t port = 0;
  ASSERT_EQ(KV_OK, kv_store_server_start("127.0.0.1", 0, &server, &port)) << kv_last_error();
  char err[512] = "";
  const std::string uri = "tcp://127.0.0.1:" + std::to_string(port);
  EXPECT_EQ(0, kv_c_roundtrip(uri.c_str(), err, sizeof err)) << err;
  kv_store_server_stop(server);
}

TEST(CApi, BadArgumentsGiveCodesAndMessages) {
  kv_store* s = nullptr;
  EXPECT_EQ(KV_ERR_INVALID, kv_store_open("nope://", &s));
  EXPECT_NE(std::string::npos, std::string(kv_last_error()).find("expected")) << kv_last_error();
  EXPECT_EQ(KV_ERR_INVALID, kv_store_open(nullptr, &s));
  kv_engine* e = nullptr;
  EXPECT_EQ(KV_ERR_INVALID, kv_engine_create("x", nullptr, &e));
  EXPECT_EQ(KV_ERR_INVALID, kv_wait(nullptr, 1, 0));
}

}  // namespace
}  // namespace softrdma::kv
