#include "common/cpu_budget.h"

#include <thread>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(CpuBudgetTest, CgroupV2LimitIsQuotaOverPeriod) {
  EXPECT_EQ(CgroupV2CpuLimit("150000 100000"), 1.5);
  EXPECT_EQ(CgroupV2CpuLimit("200000 100000\n"), 2.0);
  EXPECT_EQ(CgroupV2CpuLimit("max 100000"), std::nullopt);
  EXPECT_EQ(CgroupV2CpuLimit("garbage"), std::nullopt);
  EXPECT_EQ(CgroupV2CpuLimit("0 100000"), std::nullopt);
}

TEST(CpuBudgetTest, UsableCoresIsAtLeastOneAndAtMostTheMachine) {
  const int cores = UsableCores();
  EXPECT_GE(cores, 1);
  EXPECT_LE(cores, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
}

}  // namespace
}  // namespace tandem
