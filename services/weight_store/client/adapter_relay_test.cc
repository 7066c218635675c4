// Relaying versions from reader to reader, over real gRPC servers on loopback: a real weight-store,
// and readers that each serve AdapterRelayService. A chain of three gets every tensor byte-exact,
// a reader that asks before its relay has begun waits for it, every failure of a relay (a
// layout it does not hold, a version it never gets, a relay gone) ends at the store, and a
// relay whose source fails partway relays its read from the store to the readers after it.
#include "services/weight_store/client/adapter_relay.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/test_dir.h"
#include "common/testing/test_server.h"
#include "gtest/gtest.h"
#include "services/weight_store/client/testing/weight_store_server.h"
#include "transfer/lora_testing.h"

namespace tandem::weight_store {
namespace {

weightstore::v1::TargetLayout Stacked() {
  weightstore::v1::TargetLayout target;
  target.set_stack_experts(true);
  return target;
}

// A reader: what it received, and its relay on loopback.
struct Reader {
  explicit Reader(weightstore::v1::TargetLayout layout = Stacked(),
                  absl::Duration wait = absl::Seconds(10),
                  absl::Duration heartbeat = absl::Seconds(1))
      : versions(std::move(layout)) {
    std::vector<HostedService> services;
    services.push_back({"tandem.internal.v1.AdapterRelayService",
                        std::make_unique<AdapterRelayServiceImpl>(versions, wait, heartbeat)});
    server = *tandem::testing::StartLoopbackServer("relay", std::move(services));
    stub = internal::v1::AdapterRelayService::NewStub(server.Channel());
  }

  RelayedVersions versions;
  tandem::testing::LoopbackServer server;
  std::unique_ptr<internal::v1::AdapterRelayService::Stub> stub;
};

class AdapterRelayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = testing::StartWeightStore(
        {.data_dir = tandem::testing::FreshTestDir("adapter_relay"), .enable_ucx = false});
    ASSERT_TRUE(server.ok()) << server.status();
    store_server_ = *std::move(server);
    store_ = std::make_unique<WeightStoreStubs>(store_server_.Channel());
    ASSERT_TRUE(PublishAdapter(*store_, adapter_.manifest, adapter_.shard_views(), {}).ok());
    absl::StatusOr<FetchedAdapter> direct = FetchAdapter(*store_, "job", 1, {.target = Stacked()});
    ASSERT_TRUE(direct.ok()) << direct.status();
    expected_ = *std::move(direct);
  }

  // Reads version 1 through a relay that sends only `chunk`, then ends its stream: a faulty
  // relay, which the reader gives up for the store, whose version it gets whole.
  void ExpectFaultyRelayGivenUpForTheStore(const weightstore::v1::FetchTensorsResponse& chunk) {
    Reader faulty;
    std::shared_ptr<VersionChunks> source = faulty.versions.Begin("job", 1);
    source->Append(chunk);
    source->Finish(absl::OkStatus());
    Reader reader;
    FetchedAdapter fetched;
    const absl::StatusOr<FetchedFrom> from =
        FetchRelaying(*store_, reader.versions, "job", 1, {.upstream = faulty.stub.get()}, fetched);
    ASSERT_TRUE(from.ok()) << from.status();
    EXPECT_EQ(*from, FetchedFrom::kStore);
    ExpectSame(fetched);
  }

  void ExpectSame(const FetchedAdapter& fetched) {
    ASSERT_EQ(fetched.tensors.size(), expected_.tensors.size());
    for (size_t i = 0; i < fetched.tensors.size(); ++i) {
      EXPECT_EQ(fetched.tensors[i].tensor.spec().name(), expected_.tensors[i].tensor.spec().name());
      EXPECT_TRUE(fetched.tensors[i].bytes == expected_.tensors[i].bytes) << i;
    }
  }

  // The middle reader of a chain read the version from the store, the last one relayed it from
  // the middle, and both hold every byte.
  void ExpectMiddleFromStoreAndLastRelayed(const absl::StatusOr<FetchedFrom>& middle_from,
                                           const FetchedAdapter& middle,
                                           const absl::StatusOr<FetchedFrom>& last_from,
                                           const FetchedAdapter& last) {
    ASSERT_TRUE(middle_from.ok()) << middle_from.status();
    ASSERT_TRUE(last_from.ok()) << last_from.status();
    EXPECT_EQ(*middle_from, FetchedFrom::kStore);
    EXPECT_EQ(*last_from, FetchedFrom::kRelay);
    ExpectSame(middle);
    ExpectSame(last);
  }

  const transfer::TestAdapter adapter_ = transfer::MakeTestAdapter("job", 1, 7);
  tandem::testing::LoopbackServer store_server_;
  std::unique_ptr<WeightStoreStubs> store_;
  FetchedAdapter expected_;
};

TEST_F(AdapterRelayTest, AChainOfThreeReceivesEveryByteFromTheReaderBefore) {
  Reader first, second, third;
  // The last asks first: its relay waits for the version to begin arriving there.
  FetchedAdapter got_first, got_second, got_third;
  absl::StatusOr<FetchedFrom> third_status, second_status;
  std::thread last([&] {
    third_status = FetchRelaying(*store_, third.versions, "job", 1,
                                 {.upstream = second.stub.get(), .chunk_bytes = 1024}, got_third);
  });
  std::thread middle([&] {
    second_status = FetchRelaying(*store_, second.versions, "job", 1,
                                  {.upstream = first.stub.get(), .chunk_bytes = 1024}, got_second);
  });
  const absl::StatusOr<FetchedFrom> first_status =
      FetchRelaying(*store_, first.versions, "job", 1, {.chunk_bytes = 1024}, got_first);
  middle.join();
  last.join();
  ASSERT_TRUE(first_status.ok()) << first_status.status();
  ASSERT_TRUE(second_status.ok()) << second_status.status();
  ASSERT_TRUE(third_status.ok()) << third_status.status();
  EXPECT_EQ(*first_status, FetchedFrom::kStore);
  EXPECT_EQ(*second_status, FetchedFrom::kRelay);
  EXPECT_EQ(*third_status, FetchedFrom::kRelay);
  ExpectSame(got_first);
  ExpectSame(got_second);
  ExpectSame(got_third);
  // Each relay served what it held: the third reader's chunks are the first's, one by one.
  absl::StatusOr<std::shared_ptr<VersionChunks>> held = third.versions.Await("job", 1, absl::Now());
  ASSERT_TRUE(held.ok());
  EXPECT_TRUE((*held)->Wait(1, absl::Now()).ok());
}

TEST_F(AdapterRelayTest, EveryRelayFailureEndsAtTheStore) {
  FetchedAdapter fetched;
  // A relay in another layout.
  weightstore::v1::TargetLayout sliced = Stacked();
  sliced.set_tp_size(2);
  Reader other_layout(sliced);
  Reader reader;
  EXPECT_EQ(FetchRelaying(*store_, reader.versions, "job", 1, {.upstream = other_layout.stub.get()},
                          fetched)
                .value_or(FetchedFrom::kRelay),
            FetchedFrom::kStore);
  ExpectSame(fetched);
  // A relay that never gets the version.
  Reader idle(Stacked(), absl::Milliseconds(100));
  Reader after_idle;
  EXPECT_EQ(
      FetchRelaying(*store_, after_idle.versions, "job", 1, {.upstream = idle.stub.get()}, fetched)
          .value_or(FetchedFrom::kRelay),
      FetchedFrom::kStore);
  ExpectSame(fetched);
  // A relay that is gone.
  auto gone = std::make_unique<Reader>();
  auto channel = gone->server.Channel();
  auto stub = internal::v1::AdapterRelayService::NewStub(channel);
  gone.reset();
  Reader orphan;
  EXPECT_EQ(FetchRelaying(*store_, orphan.versions, "job", 1,
                          {.upstream = stub.get(), .timeout = absl::Seconds(5)}, fetched)
                .value_or(FetchedFrom::kRelay),
            FetchedFrom::kStore);
  ExpectSame(fetched);
}

// A reader whose relay refuses it reads from the store, and the reader after it, already
// waiting, relays that read: the refusal does not travel down the chain.
TEST_F(AdapterRelayTest, ARelayRefusedHalfwayDownTheChainStillRelaysTheStoresCopy) {
  weightstore::v1::TargetLayout sliced = Stacked();
  sliced.set_tp_size(2);
  Reader refusing(sliced), middle, last;
  absl::StatusOr<FetchedFrom> last_from;
  FetchedAdapter got_middle, got_last;
  std::thread downstream([&] {
    last_from =
        FetchRelaying(*store_, last.versions, "job", 1, {.upstream = middle.stub.get()}, got_last);
  });
  absl::SleepFor(absl::Milliseconds(100));  // The last reader is waiting on the middle one.
  const absl::StatusOr<FetchedFrom> middle_from = FetchRelaying(
      *store_, middle.versions, "job", 1, {.upstream = refusing.stub.get()}, got_middle);
  downstream.join();
  ExpectMiddleFromStoreAndLastRelayed(middle_from, got_middle, last_from, got_last);
}

// A relay whose own source fails partway reads the version again from the store and tells its
// readers to ask again (ABORTED): the reader after it, already receiving the failed try, gets
// the store's copy through it rather than reading from the store itself.
TEST_F(AdapterRelayTest, ARelayWhoseSourceFailsPartwayStillRelaysTheVersion) {
  Reader failing, middle, last;
  std::shared_ptr<VersionChunks> source = failing.versions.Begin("job", 1);
  weightstore::v1::FetchTensorsResponse first;
  *first.mutable_tensor() = expected_.tensors[0].tensor;
  first.set_data(expected_.tensors[0].bytes.substr(0, 16));
  source->Append(first);
  absl::StatusOr<FetchedFrom> middle_from, last_from;
  FetchedAdapter got_middle, got_last;
  std::thread middle_reads([&] {
    middle_from = FetchRelaying(*store_, middle.versions, "job", 1,
                                {.upstream = failing.stub.get()}, got_middle);
  });
  std::thread last_reads([&] {
    last_from =
        FetchRelaying(*store_, last.versions, "job", 1, {.upstream = middle.stub.get()}, got_last);
  });
  // The last reader has begun to receive: the first chunk of the middle reader's first try.
  EXPECT_TRUE(last.versions.Await("job", 1, absl::Now() + absl::Seconds(10)).ok());
  source->Finish(absl::UnavailableError("the failing relay's source is gone"));
  middle_reads.join();
  last_reads.join();
  ExpectMiddleFromStoreAndLastRelayed(middle_from, got_middle, last_from, got_last);
}

// A relay gone silent (no heartbeat either: its process frozen, say).
constexpr absl::Duration kSilent = absl::Hours(1);

// The reader below a relay gone silent gives it up after the stall time and reads from the
// store; the reader after it, which hears its heartbeats while it waits, stays, is told to ask
// again, and gets that read relayed: a stall sends one reader, not the chain, to the store.
TEST_F(AdapterRelayTest, ASilentRelaySendsOnlyTheReaderBelowItToTheStore) {
  Reader silent(Stacked(), absl::Seconds(10), kSilent);
  Reader middle(Stacked(), absl::Seconds(10), /*heartbeat=*/absl::Milliseconds(50));
  Reader last;
  std::shared_ptr<VersionChunks> source = silent.versions.Begin("job", 1);
  weightstore::v1::FetchTensorsResponse first;
  *first.mutable_tensor() = expected_.tensors[0].tensor;
  first.set_data(expected_.tensors[0].bytes.substr(0, 16));
  source->Append(first);  // And never another.
  constexpr absl::Duration kStall = absl::Milliseconds(300);
  absl::StatusOr<FetchedFrom> middle_from, last_from;
  FetchedAdapter got_middle, got_last;
  std::thread middle_reads([&] {
    middle_from = FetchRelaying(*store_, middle.versions, "job", 1,
                                {.upstream = silent.stub.get(), .relay_stall = kStall}, got_middle);
  });
  std::thread last_reads([&] {
    last_from = FetchRelaying(*store_, last.versions, "job", 1,
                              {.upstream = middle.stub.get(), .relay_stall = kStall}, got_last);
  });
  middle_reads.join();
  last_reads.join();
  ExpectMiddleFromStoreAndLastRelayed(middle_from, got_middle, last_from, got_last);
  source->Finish(absl::CancelledError("test over"));
}

// A relay that began the version and then sent nothing more is given up for the store after
// the stall time, not at the fetch's deadline.
TEST_F(AdapterRelayTest, ARelayThatStallsIsGivenUpForTheStore) {
  Reader stalled(Stacked(), absl::Seconds(10), kSilent);
  std::shared_ptr<VersionChunks> begun = stalled.versions.Begin("job", 1);
  weightstore::v1::FetchTensorsResponse first = weightstore::v1::FetchTensorsResponse();
  *first.mutable_tensor() = expected_.tensors[0].tensor;
  first.set_data(expected_.tensors[0].bytes.substr(0, 16));
  begun->Append(first);  // And never another.
  Reader reader;
  FetchedAdapter fetched;
  const absl::Time start = absl::Now();
  const absl::StatusOr<FetchedFrom> from = FetchRelaying(
      *store_, reader.versions, "job", 1,
      {.upstream = stalled.stub.get(), .relay_stall = absl::Milliseconds(300)}, fetched);
  ASSERT_TRUE(from.ok()) << from.status();
  EXPECT_EQ(*from, FetchedFrom::kStore);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ExpectSame(fetched);
  begun->Finish(absl::CancelledError("test over"));
}

// A relay that sends a tensor's bytes short or long is given up for the store.
TEST_F(AdapterRelayTest, ARelayThatSendsATensorsBytesShortOrLongIsGivenUpForTheStore) {
  const std::string bytes = expected_.tensors[0].bytes;
  for (const std::string& sent : {bytes.substr(0, bytes.size() - 1), bytes + "extra"}) {
    SCOPED_TRACE(sent.size());
    weightstore::v1::FetchTensorsResponse only;
    *only.mutable_tensor() = expected_.tensors[0].tensor;
    only.set_data(sent);
    ExpectFaultyRelayGivenUpForTheStore(only);
  }
}

// A relay whose tensor header claims more bytes than any memory holds: the reader reserves no
// more than arrives, and gives the relay up once its stream ends short.
TEST_F(AdapterRelayTest, ARelayClaimingAHugeTensorIsGivenUpForTheStore) {
  weightstore::v1::FetchTensorsResponse only;
  *only.mutable_tensor() = expected_.tensors[0].tensor;
  only.mutable_tensor()->set_byte_size(uint64_t{1} << 50);
  only.set_data(expected_.tensors[0].bytes);
  ExpectFaultyRelayGivenUpForTheStore(only);
}

TEST_F(AdapterRelayTest, BadRequestsAreRefused) {
  Reader reader(Stacked(), absl::Milliseconds(50));
  const auto relay = [&](const std::string& adapter, int64_t version,
                         const weightstore::v1::TargetLayout& target) {
    internal::v1::RelayRequest request;
    request.set_adapter_name(adapter);
    request.set_version(version);
    *request.mutable_target() = target;
    grpc::ClientContext context;
    auto stream = reader.stub->Relay(&context, request);
    weightstore::v1::FetchTensorsResponse chunk;
    while (stream->Read(&chunk)) {
    }
    return stream->Finish().error_code();
  };
  EXPECT_EQ(relay("", 1, Stacked()), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(relay("job", 0, Stacked()), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(relay("job", 1, weightstore::v1::TargetLayout()),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(relay("job", 1, Stacked()), grpc::StatusCode::NOT_FOUND);
}

TEST(RelayedVersionsTest, AVersionPassedOverIsRefusedAtOnce) {
  RelayedVersions versions(Stacked());
  versions.Begin("a", 3)->Finish({});
  const absl::Time start = absl::Now();
  EXPECT_TRUE(absl::IsNotFound(versions.Await("a", 2, start + absl::Seconds(10)).status()));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // A newer one is waited for, until it begins.
  std::thread later([&] {
    absl::SleepFor(absl::Milliseconds(50));
    versions.Begin("a", 4);
  });
  EXPECT_TRUE(versions.Await("a", 4, absl::Now() + absl::Seconds(10)).ok());
  later.join();
}

// A reader that gives up on a relay waiting for a version frees the relay's thread at once: the
// relay's server stops within a second, not at the end of the wait.
TEST_F(AdapterRelayTest, AReaderThatGoesAwayFreesAWaitingRelay) {
  auto relay = std::make_unique<Reader>(Stacked(), absl::Seconds(60));
  {
    internal::v1::RelayRequest request;
    request.set_adapter_name("job");
    request.set_version(1);
    *request.mutable_target() = Stacked();
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    auto stream = relay->stub->Relay(&context, request);
    weightstore::v1::FetchTensorsResponse chunk;
    EXPECT_FALSE(stream->Read(&chunk));
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  const absl::Time stopping = absl::Now();
  relay.reset();
  EXPECT_LT(absl::Now() - stopping, absl::Seconds(4));
}

TEST(RelayedVersionsTest, KeepsTheNewestVersionsOfEachAdapter) {
  RelayedVersions versions(Stacked(), /*keep=*/2);
  for (int64_t version = 1; version <= 3; ++version) versions.Begin("a", version)->Finish({});
  versions.Begin("b", 1)->Finish({});
  EXPECT_TRUE(absl::IsNotFound(versions.Await("a", 1, absl::Now()).status()));
  EXPECT_TRUE(versions.Await("a", 2, absl::Now()).ok());
  EXPECT_TRUE(versions.Await("a", 3, absl::Now()).ok());
  EXPECT_TRUE(versions.Await("b", 1, absl::Now()).ok());
}

// A failed try is forgotten only while it is the version's newest: readers then wait for the
// next try, and a try begun meanwhile is kept.
TEST(RelayedVersionsTest, AFailedTryIsForgottenOnlyWhileItIsTheNewest) {
  RelayedVersions versions(Stacked());
  std::shared_ptr<VersionChunks> failed = versions.Begin("a", 1);
  versions.Forget("a", 1, failed);
  EXPECT_TRUE(absl::IsDeadlineExceeded(versions.Await("a", 1, absl::Now()).status()))
      << "a reader waits for the next try";
  std::shared_ptr<VersionChunks> next = versions.Begin("a", 1);
  versions.Forget("a", 1, failed);
  absl::StatusOr<std::shared_ptr<VersionChunks>> held = versions.Await("a", 1, absl::Now());
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(*held, next);
}

TEST(VersionChunksTest, AReaderWaitsForChunksAndSeesHowTheVersionEnded) {
  VersionChunks chunks;
  EXPECT_TRUE(absl::IsDeadlineExceeded(chunks.Wait(0, absl::Now()).status()));
  weightstore::v1::FetchTensorsResponse chunk;
  chunk.set_data("abc");
  chunks.Append(chunk);
  absl::StatusOr<const weightstore::v1::FetchTensorsResponse*> first = chunks.Wait(0, absl::Now());
  ASSERT_TRUE(first.ok());
  EXPECT_EQ((*first)->data(), "abc");
  chunks.Finish(absl::OkStatus());
  absl::StatusOr<const weightstore::v1::FetchTensorsResponse*> end = chunks.Wait(1, absl::Now());
  ASSERT_TRUE(end.ok());
  EXPECT_EQ(*end, nullptr);
  VersionChunks failed;
  failed.Finish(absl::UnavailableError("source gone"));
  EXPECT_TRUE(absl::IsUnavailable(failed.Wait(0, absl::Now()).status()));
}

}  // namespace
}  // namespace tandem::weight_store
