#include "tools/cli/step_metrics_tsv.h"

#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::cli {
namespace {

TEST(StepMetricsTsvTest, EveryNumberHasAColumnAtFullPrecision) {
  trainer::v1::StepMetrics metrics;
  metrics.set_step(7);
  metrics.set_mismatch_kl_k3(1.234567e-7);
  metrics.set_learning_rate(0.005);
  const std::vector<std::string> header = absl::StrSplit(StepMetricsTsvHeader(), '\t');
  const std::vector<std::string> row = absl::StrSplit(StepMetricsTsvRow(metrics), '\t');
  // Every field but the per-rank shares (repeated).
  ASSERT_EQ(header.size(), trainer::v1::StepMetrics::descriptor()->field_count() - 1);
  EXPECT_EQ(std::find(header.begin(), header.end(), "ranks"), header.end());
  ASSERT_EQ(row.size(), header.size());
  auto at = [&](const std::string& name) {
    const auto column = std::find(header.begin(), header.end(), name);
    EXPECT_NE(column, header.end()) << name;
    return row[column - header.begin()];
  };
  EXPECT_EQ(at("step"), "7");
  EXPECT_EQ(at("mismatch_kl_k3"), "1.234567e-07");  // Not rounded to the progress line's 5 digits.
  EXPECT_EQ(at("learning_rate"), "0.005");
  EXPECT_EQ(at("reward_mean"), "0");
}

}  // namespace
}  // namespace tandem::cli
