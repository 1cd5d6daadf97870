// Attacks on the daemon's own bookkeeping: the block size, per-uid limits,
// what Stats shows, and log flooding (docs/security.md, "Hostile clients").
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "hostile/hostile_harness.h"

namespace cxltier::testing {
namespace {

TEST(Hostile, HarnessServesTheGoodClient) {
  if (geteuid() != 0) GTEST_SKIP() << "creating users needs root";
  ASSERT_TRUE(EnsureHostileUsers());
  HostileDaemon d;
  ASSERT_TRUE(d.Alive()) << d.Log();
  GoodClient good;
  ASSERT_TRUE(good.Start(d.socket()));
  ASSERT_TRUE(WaitFor([&] { return true; }));
  ExpectHealthy(d, good, 256ull << 20, 64);
}

}  // namespace
}  // namespace cxltier::testing
