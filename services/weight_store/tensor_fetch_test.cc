// TensorFetch on a real AdapterStore: what a FetchTensors call refuses before any byte goes out,
// and the tensors it yields in the asked dtype, each with its size and checksum.
#include "services/weight_store/tensor_fetch.h"

#include <memory>
#include <string>

#include "common/checksum.h"
#include "common/testing/test_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transfer/lora_testing.h"

namespace tandem::weight_store {
namespace {

using ::testing::HasSubstr;

class TensorFetchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = AdapterStore::Open({.data_dir = tandem::testing::FreshTestDir("tensor_fetch")});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    const transfer::TestAdapter adapter = transfer::MakeTestAdapter("job-1", 1, 5);
    absl::StatusOr<BeginResult> begun = store_->Begin(adapter.manifest, /*use_ucx=*/false);
    ASSERT_TRUE(begun.ok()) << begun.status();
    for (size_t i = 0; i < adapter.shards.size(); ++i) {
      ASSERT_TRUE(store_->Put(begun->upload_id, static_cast<int>(i), 0, adapter.shards[i]).ok());
    }
    ASSERT_TRUE(store_->Commit(begun->upload_id).ok());
  }

  static weightstore::v1::FetchTensorsRequest Request(int64_t version = 1) {
    weightstore::v1::FetchTensorsRequest request;
    request.set_adapter_name("job-1");
    request.set_version(version);
    request.mutable_target();  // Required; empty: one rank, canonical names.
    return request;
  }

  std::unique_ptr<AdapterStore> store_;
};

TEST_F(TensorFetchTest, YieldsEveryTensorWithItsSizeAndChecksum) {
  absl::StatusOr<TensorFetch> fetch = TensorFetch::Start(*store_, Request());
  ASSERT_TRUE(fetch.ok()) << fetch.status();
  EXPECT_EQ(fetch->chunk_bytes(), kMaxFetchChunkBytes);
  int tensors = 0;
  while (!fetch->done()) {
    absl::StatusOr<TensorFetch::Tensor> tensor = fetch->Next();
    ASSERT_TRUE(tensor.ok()) << tensor.status();
    EXPECT_GT(tensor->bytes.size(), 0u);
    EXPECT_EQ(tensor->header.byte_size(), tensor->bytes.size());
    EXPECT_EQ(tensor->header.xxh3_64(), Xxh3Checksum(tensor->bytes));
    ++tensors;
  }
  EXPECT_GT(tensors, 1);
}

TEST_F(TensorFetchTest, ConvertsToTheAskedDtype) {
  weightstore::v1::FetchTensorsRequest request = Request();
  absl::StatusOr<TensorFetch> as_stored = TensorFetch::Start(*store_, request);
  request.mutable_target()->set_dtype(type::v1::DTYPE_F32);
  absl::StatusOr<TensorFetch> as_f32 = TensorFetch::Start(*store_, request);
  ASSERT_TRUE(as_stored.ok() && as_f32.ok());
  const TensorFetch::Tensor stored = *as_stored->Next();
  const TensorFetch::Tensor converted = *as_f32->Next();
  ASSERT_EQ(stored.header.spec().dtype(), type::v1::DTYPE_BF16) << "the test adapter's";
  EXPECT_EQ(converted.header.spec().name(), stored.header.spec().name());
  EXPECT_EQ(converted.header.spec().dtype(), type::v1::DTYPE_F32);
  EXPECT_EQ(converted.bytes.size(), 2 * stored.bytes.size());
  EXPECT_EQ(converted.header.xxh3_64(), Xxh3Checksum(converted.bytes));
}

TEST_F(TensorFetchTest, RefusesBeforeAnyByteGoesOut) {
  weightstore::v1::FetchTensorsRequest small_chunks = Request();
  small_chunks.set_max_chunk_bytes(1024);
  const absl::Status chunks = TensorFetch::Start(*store_, small_chunks).status();
  EXPECT_TRUE(absl::IsInvalidArgument(chunks)) << chunks;
  EXPECT_THAT(chunks.message(), HasSubstr("max_chunk_bytes is 1024"));

  EXPECT_TRUE(absl::IsInvalidArgument(TensorFetch::Start(*store_, Request(0)).status()));
  EXPECT_TRUE(absl::IsNotFound(TensorFetch::Start(*store_, Request(7)).status()));

  weightstore::v1::FetchTensorsRequest unknown_name = Request();
  unknown_name.add_tensor_names("no.such.tensor");
  const absl::Status name = TensorFetch::Start(*store_, unknown_name).status();
  EXPECT_TRUE(absl::IsInvalidArgument(name)) << name;
  EXPECT_THAT(name.message(), HasSubstr("no.such.tensor"));
}

}  // namespace
}  // namespace tandem::weight_store
