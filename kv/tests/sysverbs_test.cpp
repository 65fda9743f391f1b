// The engine built against the system's libibverbs (rdma-core), not the drop-in: where the
// machine has no RDMA device, opening an engine fails with a clear KvError (and nothing
// leaks); where it has one, an engine opens and publishes itself.
#include <gtest/gtest.h>

#include <infiniband/verbs.h>

#include "kv/engine.h"
#include "kv/tests/kv_test_util.h"

namespace softrdma::kv {
namespace {

TEST(SystemVerbs, AnEngineOpensOrSaysWhyNot) {
  test::TempStore store;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list) ibv_free_device_list(list);
  if (n == 0) {
    try {
      Engine e("sys", store.store(), test::test_options());
      ADD_FAILURE() << "an engine opened without a device";
    } catch (const KvError& e) {
      EXPECT_NE(std::string::npos, std::string(e.what()).find("no verbs device")) << e.what();
    }
    EXPECT_FALSE(store.store()->get("softrdma-kv/sys").has_value());
  } else {
    Engine e("sys", store.store(), test::test_options());
    EXPECT_TRUE(store.store()->get("softrdma-kv/sys").has_value());
  }
}

}  // namespace
}  // namespace softrdma::kv
