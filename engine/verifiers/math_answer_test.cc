#include "engine/verifiers/math_answer.h"

#include "gtest/gtest.h"

namespace tandem::engine {
namespace {

TEST(FinalAnswerTest, TheLastBoxedWinsWithNestedBraces) {
  EXPECT_EQ(FinalAnswer("First \\boxed{2}, then \\boxed{\\frac{3}{4}}."), "\\frac{3}{4}");
  EXPECT_EQ(FinalAnswer("\\fbox{7}"), "7");
  EXPECT_EQ(FinalAnswer("\\boxed {x^{2}+1}"), "x^{2}+1");
}

TEST(FinalAnswerTest, Gsm8kHashesWhenNothingIsBoxed) {
  // The style of GSM8K's reference solutions.
  EXPECT_EQ(FinalAnswer("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
                        "Natalia sold 48+24 = <<48+24=72>>72 clips altogether.\n#### 72"),
            "72");
  EXPECT_EQ(FinalAnswer("#### 1,234\nextra"), "1,234");
  EXPECT_EQ(FinalAnswer("The answer is 5."), std::nullopt);
  EXPECT_EQ(FinalAnswer("\\boxed{unclosed"), std::nullopt);
}

struct Case {
  const char* completion;
  const char* reference;
  double reward;
};

class MathRewardTest : public testing::TestWithParam<Case> {};

TEST_P(MathRewardTest, ScoresAsAMathGraderWould) {
  EXPECT_EQ(MathReward(GetParam().completion, GetParam().reference), GetParam().reward)
      << GetParam().completion << " vs " << GetParam().reference;
}

INSTANTIATE_TEST_SUITE_P(
    AnswerStyles, MathRewardTest,
    testing::Values(
        // GSM8K: the reference is a whole solution ending in "#### n".
        Case{"... so she has \\boxed{72} clips.", "She sold 48+24=72.\n#### 72", 1},
        Case{"#### 73", "#### 72", 0}, Case{"The total is $1,080.\n#### 1,080", "1080", 1},
        Case{"\\boxed{\\$18}", "18", 1}, Case{"\\boxed{18 \\text{ dollars}}", "18dollars", 1},
        // Numbers by value: trailing zeros, signs, U+2212, percent, fractions.
        Case{"\\boxed{3.50}", "3.5", 1}, Case{"\\boxed{+5}", "5", 1},
        Case{"\\boxed{\xE2\x88\x92"
             "3}",
             "-3", 1},
        Case{"\\boxed{-0.0}", "0", 1}, Case{"\\boxed{50\\%}", "50", 1},
        Case{"\\boxed{\\frac{1}{2}}", "0.5", 1}, Case{"\\boxed{\\dfrac{2}{4}}", "1/2", 1},
        Case{"\\boxed{\\frac12}", "\\frac{1}{2}", 1}, Case{"\\boxed{-\\frac{3}{4}}", "-0.75", 1},
        Case{"\\boxed{0.333}", "\\frac{1}{3}", 0},
        Case{"\\boxed{1/0}", "1/0", 1},  // Not a number: equal as text.
        Case{"\\boxed{12}", "1,2", 0},
        // Expressions and tuples compare as normalised text.
        Case{"\\boxed{x + 1}", "x+1", 1}, Case{"\\boxed{\\left( 1, 2 \\right)}", "(1,2)", 1},
        Case{"\\boxed{(1,2)}", "(2,1)", 0}, Case{"\\boxed{\\sqrt{2}}.", "\\sqrt{2}", 1},
        // No final answer, or an empty one, is wrong.
        Case{"The answer is 72.", "72", 0}, Case{"\\boxed{}", "", 0},
        // Digits past exact range compare as text rather than overflowing.
        Case{"\\boxed{1234567890123456789012345678901234567890}",
             "1234567890123456789012345678901234567890", 1}));

}  // namespace
}  // namespace tandem::engine
