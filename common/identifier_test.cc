#include "common/identifier.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

TEST(IdentifierTest, TheCommonProtoCharactersAreAccepted) {
  for (const char* id : {"a", "job-1f2e", "team/policy:v2", "s3.p1/0", "A_Z-0.9"}) {
    EXPECT_TRUE(IsIdentifier(id)) << id;
    EXPECT_TRUE(ValidateIdentifier("job_id", id).ok()) << id;
  }
  EXPECT_TRUE(IsIdentifier(std::string(128, 'x')));
}

TEST(IdentifierTest, SpacesPathClimbingLengthAndOtherBytesAreRejected) {
  for (const std::string& id : {std::string(""), std::string("has space"), std::string("../etc"),
                                std::string("a/../b"), std::string(129, 'x'),
                                std::string("."), std::string("team/./policy"),
                                std::string("caf\xC3\xA9"), std::string("tab\t"),
                                std::string("nul\0x", 5)}) {
    EXPECT_FALSE(IsIdentifier(id)) << id;
    const absl::Status status = ValidateIdentifier("adapter_name", id);
    EXPECT_TRUE(absl::IsInvalidArgument(status));
    EXPECT_THAT(status.message(), HasSubstr("bad adapter_name: '"));
  }
  EXPECT_THAT(ValidateIdentifier("request_id", std::string(200, 'r')).message(),
              HasSubstr("200 bytes"));
}

}  // namespace
}  // namespace tandem
