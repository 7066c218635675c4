#include "engine/text/bpe_model.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::engine::text {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Merges as ["left", "right"] arrays (a braced list of string pairs would make an object).
nlohmann::json Pairs(std::vector<std::pair<std::string, std::string>> pairs) {
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& [left, right] : pairs) merges.push_back(nlohmann::json::array({left, right}));
  return merges;
}

nlohmann::json Model(nlohmann::json merges) {
  return {{"type", "BPE"},
          {"vocab", {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"abc", 4}, {"bc", 5}}},
          {"merges", std::move(merges)}};
}

std::vector<int32_t> Ids(const BpeModel& model, absl::string_view word) {
  std::vector<int32_t> ids;
  EXPECT_TRUE(model.AppendIds(word, ids).ok());
  return ids;
}

TEST(BpeModelTest, TheLowestRankedPairMergesFirst) {
  auto ab_first = BpeModel::FromJson(Model(Pairs({{"a", "b"}, {"ab", "c"}, {"b", "c"}})));
  ASSERT_TRUE(ab_first.ok()) << ab_first.status();
  EXPECT_THAT(Ids(*ab_first, "abc"), ElementsAre(4));
  auto bc_first = BpeModel::FromJson(
      Model(nlohmann::json::array({"b c", "a b", "ab c"})));  // The older string form.
  ASSERT_TRUE(bc_first.ok()) << bc_first.status();
  EXPECT_THAT(Ids(*bc_first, "abc"), ElementsAre(0, 5));
  EXPECT_THAT(Ids(*bc_first, "abc"), ElementsAre(0, 5));  // From the cache.
}

TEST(BpeModelTest, TiesGoToTheLeftmostPair) {
  auto model =
      BpeModel::FromJson({{"vocab", {{"a", 0}, {"aa", 1}}}, {"merges", Pairs({{"a", "a"}})}});
  ASSERT_TRUE(model.ok());
  EXPECT_THAT(Ids(*model, "aaa"), ElementsAre(1, 0));
}

TEST(BpeModelTest, IgnoreMergesTakesAWholeWordFromTheVocabulary) {
  nlohmann::json json = Model(Pairs({{"b", "c"}}));
  json["ignore_merges"] = true;
  auto model = BpeModel::FromJson(json);
  ASSERT_TRUE(model.ok());
  EXPECT_THAT(Ids(*model, "abc"), ElementsAre(4));
  EXPECT_THAT(Ids(*model, "cbc"), ElementsAre(2, 5));
}

TEST(BpeModelTest, AnUnknownCharacterIsUnkOrAnError) {
  auto without_unk = BpeModel::FromJson(Model(nlohmann::json::array()));
  ASSERT_TRUE(without_unk.ok());
  std::vector<int32_t> ids;
  const absl::Status status = without_unk->AppendIds("axb", ids);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("'x'"));
  nlohmann::json json = Model(nlohmann::json::array());
  json["unk_token"] = "c";
  auto with_unk = BpeModel::FromJson(json);
  ASSERT_TRUE(with_unk.ok());
  EXPECT_THAT(Ids(*with_unk, "axb"), ElementsAre(0, 2, 1));
}

TEST(BpeModelTest, WhatItDoesNotImplementIsRefusedByName) {
  for (const auto& [field, value] :
       std::vector<std::pair<std::string, nlohmann::json>>{{"type", "WordPiece"},
                                                           {"dropout", 0.1},
                                                           {"byte_fallback", true},
                                                           {"continuing_subword_prefix", "##"},
                                                           {"end_of_word_suffix", "</w>"}}) {
    nlohmann::json json = Model(nlohmann::json::array());
    json[field] = value;
    auto model = BpeModel::FromJson(json);
    ASSERT_FALSE(model.ok()) << field;
    EXPECT_THAT(model.status().message(), HasSubstr("model." + field));
  }
}

TEST(BpeModelTest, AMergeOutsideTheVocabularyIsRefused) {
  auto model = BpeModel::FromJson(Model(Pairs({{"c", "a"}})));
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(model.status().message(), HasSubstr("merge 0"));
}

}  // namespace
}  // namespace tandem::engine::text
