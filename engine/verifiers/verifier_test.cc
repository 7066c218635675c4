#include "engine/verifiers/verifier.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::engine {
namespace {

TEST(VerifierTest, ExactMatchComparesBytes) {
  auto exact = FindVerifier("exact_match");
  ASSERT_TRUE(exact.ok());
  EXPECT_EQ((*exact)("42", "42"), 1.0);
  EXPECT_EQ((*exact)("42 ", "42"), 0.0);
}

TEST(VerifierTest, MathReadsTheFinalAnswer) {
  auto math = FindVerifier("math");
  ASSERT_TRUE(math.ok());
  EXPECT_EQ((*math)("so it is \\boxed{1,000}", "1000"), 1.0);
}

TEST(VerifierTest, AnUnknownNameListsTheKnownOnes) {
  auto unknown = FindVerifier("fuzzy");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(unknown.status().message(), "'fuzzy' is unknown; known: exact_match, math");
}

}  // namespace
}  // namespace tandem::engine
