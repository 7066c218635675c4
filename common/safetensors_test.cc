#include "common/safetensors.h"

#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

template <typename T>
Tensor MakeTensor(std::vector<int64_t> shape, const std::vector<T>& values) {
  absl::StatusOr<Tensor> tensor =
      Tensor::FromBytes(DTypeOf<T>(), std::move(shape),
                        absl::MakeConstSpan(reinterpret_cast<const std::byte*>(values.data()),
                                            values.size() * sizeof(T)));
  EXPECT_TRUE(tensor.ok()) << tensor.status();
  return std::move(tensor).value_or(Tensor());
}

SafetensorsFile EveryDType() {
  SafetensorsFile file;
  file.tensors["f32"] = MakeTensor<float>({2, 2}, {1.5f, -0.0f, 3e38f, -1e-40f});
  file.tensors["bf16"] =
      MakeTensor<BFloat16>({3}, {ToBFloat16(1.0f), ToBFloat16(-3.140625f), ToBFloat16(1e-3f)});
  file.tensors["f16"] =
      MakeTensor<Float16>({1, 3}, {ToFloat16(65504.0f), ToFloat16(-0.5f), ToFloat16(6e-8f)});
  file.tensors["i16"] = MakeTensor<int16_t>({2}, {-32768, 32767});
  file.tensors["i32"] = MakeTensor<int32_t>({}, {-123456789});
  file.tensors["empty"] = MakeTensor<float>({0, 5}, {});
  return file;
}

std::string EncodeLength(uint64_t length) {
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((length >> (8 * i)) & 0xff));
  return bytes;
}

// A file with the given header text and `data_size` zero bytes of data.
std::string MakeFile(const std::string& header, size_t data_size) {
  return absl::StrCat(EncodeLength(header.size()), header, std::string(data_size, '\0'));
}

std::string Serialize(const SafetensorsFile& file) {
  absl::StatusOr<std::string> bytes = SerializeSafetensors(file);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.value_or("");
}

TEST(SafetensorsTest, EveryDTypeRoundTrips) {
  const SafetensorsFile original = EveryDType();
  absl::StatusOr<SafetensorsFile> parsed = ParseSafetensors(Serialize(original));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, original);
  EXPECT_EQ(ToFloat((*parsed->tensors.at("bf16").data<BFloat16>())[1]), -3.140625f);
  EXPECT_EQ(ToFloat((*parsed->tensors.at("f16").data<Float16>())[0]), 65504.0f);
  EXPECT_EQ((*parsed->tensors.at("i32").data<int32_t>())[0], -123456789);
}

TEST(SafetensorsTest, MetadataRoundTrips) {
  SafetensorsFile original;
  original.metadata = {{"format", "pt"}, {"step", "42"}, {"note", "ünïcode \"quoted\"\n"}};
  original.tensors["w"] = MakeTensor<float>({1}, {2.0f});
  absl::StatusOr<SafetensorsFile> parsed = ParseSafetensors(Serialize(original));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, original);
}

TEST(SafetensorsTest, EmptyFileRoundTrips) {
  absl::StatusOr<SafetensorsFile> parsed = ParseSafetensors(Serialize(SafetensorsFile()));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->tensors.empty());
  EXPECT_TRUE(parsed->metadata.empty());
}

TEST(SafetensorsTest, SerializesLikeTheReferenceImplementation) {
  SafetensorsFile file;
  file.metadata["format"] = "pt";
  file.tensors["b"] = MakeTensor<int16_t>({1}, {7});
  file.tensors["a"] = MakeTensor<float>({2}, {1.0f, 2.0f});
  const std::string bytes = Serialize(file);
  const std::string json = R"({"__metadata__":{"format":"pt"},)"
                           R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"I16","shape":[1],"data_offsets":[8,10]}})";
  const size_t padded = (json.size() + 7) / 8 * 8;
  ASSERT_EQ(bytes.size(), 8 + padded + 10);
  EXPECT_EQ(bytes.substr(0, 8), EncodeLength(padded));
  EXPECT_EQ(bytes.substr(8, padded), json + std::string(padded - json.size(), ' '));
}

TEST(SafetensorsTest, AcceptsForeignTensorOrderAndExtraWhitespace) {
  const std::string header =
      R"( { "b" : {"shape":[1],"dtype":"I16","data_offsets":[0,2]},)"
      R"( "a": {"dtype":"I16","shape":[],"data_offsets":[2,4], "extra": 1} }   )";
  absl::StatusOr<SafetensorsFile> parsed = ParseSafetensors(MakeFile(header, 4));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->tensors.size(), 2);
}

TEST(SafetensorsTest, SerializeRejectsUnrepresentableNames) {
  SafetensorsFile reserved;
  reserved.tensors["__metadata__"] = MakeTensor<float>({1}, {1.0f});
  EXPECT_THAT(SerializeSafetensors(reserved).status().message(), HasSubstr("reserved"));

  SafetensorsFile bad_utf8;
  bad_utf8.tensors["w\xff"] = MakeTensor<float>({1}, {1.0f});
  absl::Status status = SerializeSafetensors(bad_utf8).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("tensor name \"w\\xff\" is not valid UTF-8"));

  SafetensorsFile surrogate;
  surrogate.metadata["k"] = "\xed\xa0\x80";  // U+D800
  EXPECT_THAT(SerializeSafetensors(surrogate).status().message(), HasSubstr("metadata value"));

  SafetensorsFile overlong;
  overlong.metadata["\xc0\xaf"] = "v";  // overlong '/'
  EXPECT_THAT(SerializeSafetensors(overlong).status().message(), HasSubstr("metadata key"));
}

TEST(SafetensorsTest, WriteThenReadFile) {
  const std::string path = ::testing::TempDir() + "/every_dtype.safetensors";
  SafetensorsFile original = EveryDType();
  original.metadata["step"] = "7";
  ASSERT_TRUE(WriteSafetensors(path, original).ok());
  absl::StatusOr<SafetensorsFile> read = ReadSafetensors(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, original);

  struct stat info;
  ASSERT_EQ(stat(path.c_str(), &info), 0);
  EXPECT_EQ(static_cast<size_t>(info.st_size), Serialize(original).size());
}

TEST(SafetensorsTest, MetadataIsReadWithoutTheTensorsAndCheckedLikeAWholeFile) {
  const std::string path = ::testing::TempDir() + "/metadata_only.safetensors";
  SafetensorsFile original = EveryDType();
  original.metadata["owner"] = "job-1";
  ASSERT_TRUE(WriteSafetensors(path, original).ok());
  absl::StatusOr<std::map<std::string, std::string>> metadata = ReadSafetensorsMetadata(path);
  ASSERT_TRUE(metadata.ok()) << metadata.status();
  EXPECT_EQ(*metadata, original.metadata);
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 1);
  EXPECT_EQ(ReadSafetensorsMetadata(path).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadSafetensorsMetadata(path + ".missing").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(SafetensorsTest, WriteReplacesAndLeavesNoTemporaryFiles) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "replace";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "model.safetensors").string();
  ASSERT_TRUE(WriteSafetensors(path, EveryDType()).ok());
  SafetensorsFile smaller;
  smaller.tensors["only"] = MakeTensor<int32_t>({1}, {5});
  ASSERT_TRUE(WriteSafetensors(path, smaller).ok());

  absl::StatusOr<SafetensorsFile> read = ReadSafetensors(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, smaller);
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  EXPECT_THAT(names, ::testing::ElementsAre("model.safetensors"));
}

TEST(SafetensorsTest, FileErrorsNameThePath) {
  const std::string missing = ::testing::TempDir() + "/does_not_exist.safetensors";
  absl::Status status = ReadSafetensors(missing).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr(missing));

  const std::string no_dir = ::testing::TempDir() + "/no/such/dir/x.safetensors";
  status = WriteSafetensors(no_dir, EveryDType());
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("no/such/dir"));
}

TEST(SafetensorsTest, ReadRejectsTruncatedFile) {
  const std::string path = ::testing::TempDir() + "/truncated.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, EveryDType()).ok());
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 1);
  absl::Status status = ReadSafetensors(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(status.message()), StartsWith(path + ": "));
  EXPECT_THAT(status.message(), HasSubstr("run past the end"));
}

TEST(SafetensorsTest, EveryTruncationIsDataLoss) {
  const std::string bytes = Serialize(EveryDType());
  for (size_t size = 0; size < bytes.size(); ++size) {
    absl::Status status = ParseSafetensors(bytes.substr(0, size)).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << size << ": " << status;
  }
}

TEST(SafetensorsTest, RejectsShortInput) {
  absl::Status status = ParseSafetensors("1234567").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("input is 7 bytes, shorter than the 8-byte"));
}

TEST(SafetensorsTest, RejectsHugeHeaderLength) {
  absl::Status status = ParseSafetensors(EncodeLength(uint64_t{1} << 40) + "{}").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("huge header length 1099511627776"));
}

TEST(SafetensorsTest, RejectsHeaderLengthPastEnd) {
  absl::Status status = ParseSafetensors(EncodeLength(100) + "{}").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("header length 100 exceeds the 2 bytes"));
}

struct MalformedCase {
  std::string test_name;
  std::string header;
  size_t data_size;
  absl::StatusCode code;
  std::string message;
};

class MalformedHeaderTest : public ::testing::TestWithParam<MalformedCase> {};

TEST_P(MalformedHeaderTest, IsRejectedWithClearMessage) {
  const MalformedCase& test_case = GetParam();
  absl::Status status = ParseSafetensors(MakeFile(test_case.header, test_case.data_size)).status();
  EXPECT_EQ(status.code(), test_case.code) << status;
  EXPECT_THAT(status.message(), HasSubstr(test_case.message));
}

const absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

INSTANTIATE_TEST_SUITE_P(
    Safetensors, MalformedHeaderTest,
    ::testing::Values(
        MalformedCase{"InvalidJson", R"({"w": {"dtype": "F32",)", 0, kInvalid,
                      "header is not valid JSON: [json.exception.parse_error"},
        MalformedCase{"TrailingGarbage", R"({} x)", 0, kInvalid, "header is not valid JSON"},
        MalformedCase{"InvalidUtf8", "{\"w\xff\": 1}", 0, kInvalid, "header is not valid JSON"},
        MalformedCase{"NotAnObject", R"([1, 2])", 0, kInvalid,
                      "header is [1,2], expected a JSON object"},
        MalformedCase{"EntryNotAnObject", R"({"w": 5})", 0, kInvalid,
                      "tensor 'w': entry is 5, expected an object"},
        MalformedCase{"MissingDType", R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", 4,
                      kInvalid, "tensor 'w': missing \"dtype\""},
        MalformedCase{"MissingShape", R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", 4,
                      kInvalid, "tensor 'w': missing \"shape\""},
        MalformedCase{"MissingOffsets", R"({"w": {"dtype": "F32", "shape": [1]}})", 4, kInvalid,
                      "tensor 'w': missing \"data_offsets\""},
        MalformedCase{"DTypeNotString",
                      R"({"w": {"dtype": 4, "shape": [1], "data_offsets": [0, 4]}})", 4, kInvalid,
                      "tensor 'w': \"dtype\" is 4, expected a string"},
        MalformedCase{"UnknownDType",
                      R"({"w": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})", 8,
                      kInvalid, "tensor 'w': unknown dtype 'F64'"},
        MalformedCase{"ShapeNotArray",
                      R"({"w": {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}})", 8,
                      kInvalid, "tensor 'w': \"shape\" is \"2\", expected an array"},
        MalformedCase{"FractionalDim",
                      R"({"w": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]}})", 8,
                      kInvalid, "tensor 'w': shape[0] is 2.5, expected an int64 >= 0"},
        MalformedCase{"DimPastInt64",
                      R"({"w": {"dtype": "F32", "shape": [9223372036854775808],)"
                      R"( "data_offsets": [0, 8]}})",
                      8, kInvalid, "shape[0] is 9223372036854775808"},
        MalformedCase{"NegativeDim",
                      R"({"w": {"dtype": "F32", "shape": [2, -3], "data_offsets": [0, 0]}})", 0,
                      kInvalid, "tensor 'w': negative dimension -3 at index 1 in shape [2,-3]"},
        MalformedCase{"ShapeOverflow",
                      R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296],)"
                      R"( "data_offsets": [0, 0]}})",
                      0, kInvalid, "tensor 'w': shape [4294967296,4294967296] is too large"},
        MalformedCase{"OffsetsNotPair",
                      R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}})", 8,
                      kInvalid, "tensor 'w': \"data_offsets\" is [0,4,8], expected [begin, end]"},
        MalformedCase{"NegativeOffset",
                      R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 4,
                      kInvalid, "\"data_offsets\" is [-4,0]"},
        MalformedCase{"BeginAfterEnd",
                      R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 8,
                      kInvalid, "tensor 'w': data_offsets [8, 4) has begin > end"},
        MalformedCase{"OffsetsPastBuffer",
                      R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 3,
                      absl::StatusCode::kDataLoss,
                      "tensor 'w': data_offsets [0, 4) run past the end of the 3-byte data "
                      "buffer"},
        MalformedCase{"DTypeShapeMismatch",
                      R"({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}})", 12,
                      kInvalid,
                      "tensor 'w': data_offsets [0, 12) has 12 bytes but dtype F32 shape [2,2] "
                      "needs 16"},
        MalformedCase{"Overlap",
                      R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                      R"( "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                      8, kInvalid, "tensors 'a' [0, 8) and 'b' [4, 8) overlap"},
        MalformedCase{"EmptyTensorInsideAnother",
                      R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                      R"( "b": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]}})",
                      8, kInvalid, "tensors 'a' [0, 8) and 'b' [4, 4) overlap"},
        MalformedCase{"Gap",
                      R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                      R"( "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
                      12, kInvalid, "data buffer bytes [4, 8) belong to no tensor"},
        MalformedCase{"LeadingGap",
                      R"({"a": {"dtype": "I16", "shape": [1], "data_offsets": [2, 4]}})", 4,
                      kInvalid, "data buffer bytes [0, 2) belong to no tensor"},
        MalformedCase{"TrailingBytes",
                      R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 6,
                      kInvalid, "data buffer bytes [4, 6) belong to no tensor"},
        MalformedCase{"DataWithoutTensors", R"({})", 1, kInvalid,
                      "data buffer bytes [0, 1) belong to no tensor"},
        MalformedCase{"MetadataNotObject", R"({"__metadata__": ["a"]})", 0, kInvalid,
                      "\"__metadata__\" is [\"a\"], expected an object of strings"},
        MalformedCase{"MetadataValueNotString", R"({"__metadata__": {"step": 5}})", 0, kInvalid,
                      "metadata 'step' is 5, expected a string"}),
    [](const ::testing::TestParamInfo<MalformedCase>& info) { return info.param.test_name; });

TEST(SafetensorsTest, QuotedValuesAreShortened) {
  const std::string long_text(1000, 'x');
  for (const std::string& header : {absl::StrCat(R"({"w": [")", long_text, R"("]})"),
                                    absl::StrCat(R"({")", long_text, R"(": []})"),
                                    absl::StrCat(R"({"w": {"dtype": ")", long_text,
                                                 R"(", "shape": [], "data_offsets": [0, 4]}})")}) {
    absl::Status status = ParseSafetensors(MakeFile(header, 4)).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("xxx..."));
    EXPECT_LT(status.message().size(), 300) << status;
  }
}

TEST(SafetensorsTest, JsonErrorsAreShortened) {
  const std::string header = absl::StrCat(R"({"w": ")", std::string(100000, 'x'));
  absl::Status status = ParseSafetensors(MakeFile(header, 0)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("header is not valid JSON"));
  EXPECT_LT(status.message().size(), 400);
}

}  // namespace
}  // namespace tandem
