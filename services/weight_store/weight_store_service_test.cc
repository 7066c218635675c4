// The weight-store through gRPC on loopback, with real UCX (tcp, and shared memory where it
// matters) for the one-sided data path: publish and fetch both ways, every commit check,
// version rules, watch, leases, retention, restart recovery and metrics.
#include "services/weight_store/weight_store_service.h"

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "common/channel.h"
#include "common/checksum.h"
#include "common/server.h"
#include "common/status.h"
#include "common/testing/error_details.h"
#include "common/testing/http_get.h"
#include "common/testing/test_dir.h"
#include "common/testing/test_server.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/client_interceptor.h"
#include "gtest/gtest.h"
#include "services/weight_store/client/adapter_client.h"
#include "services/weight_store/client/read_plan.h"
#include "transfer/lora_testing.h"

namespace tandem::weight_store {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

// The status of a server stream refused before its first message.
template <typename Response>
grpc::Status RefusedStatus(grpc::ClientReaderInterface<Response>& reader) {
  Response response;
  EXPECT_FALSE(reader.Read(&response));
  return reader.Finish();
}

using PlanEdit = std::function<void(internal::v1::GetReadPlanResponse&)>;

// Edits each GetReadPlan response a channel receives before its caller sees it.
class PlanEditing final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit PlanEditing(PlanEdit edit) : edit_(std::move(edit)) {}

  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* info) override {
    if (absl::string_view(info->method()) !=
        "/tandem.internal.v1.WeightStoreUcxService/GetReadPlan") {
      return nullptr;
    }
    return new Editor(edit_);
  }

 private:
  class Editor final : public grpc::experimental::Interceptor {
   public:
    explicit Editor(const PlanEdit& edit) : edit_(edit) {}
    void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
      if (methods->QueryInterceptionHookPoint(
              grpc::experimental::InterceptionHookPoints::POST_RECV_MESSAGE) &&
          methods->GetRecvMessage() != nullptr) {
        edit_(*static_cast<internal::v1::GetReadPlanResponse*>(methods->GetRecvMessage()));
      }
      methods->Proceed();
    }

   private:
    const PlanEdit& edit_;
  };

  PlanEdit edit_;
};

class WeightStoreServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    data_dir_ = tandem::testing::FreshTestDir("weight_store");
    StartServer();
    client_ucx_ = *transfer::UcxWorker::Create({.transports = transports_});
  }

  void StartServer(int keep_versions = 3, absl::Duration upload_expiry = absl::Minutes(1)) {
    server_.reset();
    auto service =
        WeightStoreServiceImpl::Create({.data_dir = data_dir_,
                                        .keep_versions = keep_versions,
                                        .upload_expiry = upload_expiry,
                                        .ucx = {.transports = transports_},
                                        .sweep_interval = absl::Milliseconds(50),
                                        .watch_registered_hook = watch_registered_hook_});
    ASSERT_TRUE(service.ok()) << service.status();
    ServerOptions options = tandem::testing::LoopbackOptions();
    options.max_message_bytes = 80 << 20;
    options.drain_timeout = absl::Milliseconds(200);
    WeightStoreServiceImpl* raw = service->get();
    service_ = raw;
    std::vector<HostedService> services;
    std::unique_ptr<WeightStoreUcxServiceImpl> data_plane = raw->NewUcxService();
    WeightStoreUcxServiceImpl* data_plane_raw = data_plane.get();
    services.push_back({"tandem.internal.v1.WeightStoreUcxService", std::move(data_plane), nullptr,
                        [data_plane_raw] { data_plane_raw->Drain(); }});
    services.push_back({"tandem.weightstore.v1.WeightStoreService", *std::move(service), nullptr,
                        [raw] { raw->Drain(); }});
    auto started =
        tandem::testing::StartLoopbackServer("weight-store", std::move(services), options);
    ASSERT_TRUE(started.ok()) << started.status();
    channel_ = started->Channel();
    server_ = std::move(started->server);
    stubs_ = std::make_unique<WeightStoreStubs>(channel_);
    stub_ = &stubs_->api();
    ucx_stub_ = &stubs_->ucx();
  }

  absl::StatusOr<weightstore::v1::VersionInfo> Publish(const transfer::TestAdapter& adapter,
                                                       bool by_ucx) {
    return PublishAdapter(*stubs_, adapter.manifest, adapter.shard_views(),
                          {.ucx = by_ucx ? client_ucx_.get() : nullptr});
  }

  // Commits `adapter` straight into the service's store on this thread (bytes by Put, no gRPC).
  absl::Status CommitInStore(const transfer::TestAdapter& adapter) {
    AdapterStore& store = service_->store_for_testing();
    absl::StatusOr<BeginResult> begun = store.Begin(adapter.manifest, /*use_ucx=*/false);
    if (!begun.ok()) return begun.status();
    for (size_t i = 0; i < adapter.shards.size(); ++i) {
      absl::StatusOr<uint64_t> written =
          store.Put(begun->upload_id, static_cast<int>(i), 0, adapter.shards[i]);
      if (!written.ok()) return written.status();
    }
    return store.Commit(begun->upload_id).status();
  }

  // Where WatchVersions waits, between registering its watcher and reading the newest
  // version, until the test lets it go.
  struct WatchWindow {
    absl::Notification entered;
    absl::Notification leave;
  };

  // Restarts the server with every WatchVersions call held in its window; one call per test.
  std::shared_ptr<WatchWindow> StartServerHoldingWatches() {
    auto window = std::make_shared<WatchWindow>();
    watch_registered_hook_ = [window] {
      if (window->entered.HasBeenNotified()) return;
      window->entered.Notify();
      // Bounded, so that a broken test fails instead of hanging.
      window->leave.WaitForNotificationWithTimeout(absl::Seconds(30));
    };
    StartServer();
    return window;
  }

  absl::StatusOr<FetchedAdapter> Fetch(const std::string& name, int64_t version, bool by_ucx,
                                       weightstore::v1::TargetLayout target = {}) {
    return FetchAdapter(*stubs_, name, version,
                        {.target = target, .ucx = by_ucx ? client_ucx_.get() : nullptr});
  }

  // Canonical names, experts stacked: what a TP1/EP1 consumer gets with stack_experts.
  static void ExpectCanonical(const transfer::TestAdapter& adapter, const FetchedAdapter& fetched) {
    ASSERT_EQ(fetched.tensors.size(), adapter.canonical.size());
    for (const FetchedTensor& tensor : fetched.tensors) {
      bool found = false;
      for (const auto& [name, bytes] : adapter.canonical) {
        if (transfer::StackedName(name) != tensor.tensor.spec().name()) continue;
        found = true;
        EXPECT_TRUE(tensor.bytes == bytes) << name;
      }
      EXPECT_TRUE(found) << tensor.tensor.spec().name();
    }
  }

  grpc::Status Begin(const weightstore::v1::Manifest& manifest,
                     weightstore::v1::BeginPublishResponse* response) {
    grpc::ClientContext context;
    weightstore::v1::BeginPublishRequest request;
    *request.mutable_manifest() = manifest;
    return stub_->BeginPublish(&context, request, response);
  }

  grpc::Status Put(const std::string& upload, int shard, uint64_t offset, absl::string_view data) {
    grpc::ClientContext context;
    weightstore::v1::PutShardResponse response;
    auto writer = stub_->PutShard(&context, &response);
    weightstore::v1::PutShardRequest chunk;
    chunk.set_upload_id(upload);
    chunk.set_shard_index(shard);
    chunk.set_offset(offset);
    chunk.set_data(data.data(), data.size());
    writer->Write(chunk);
    writer->WritesDone();
    return writer->Finish();
  }

  grpc::Status Commit(const std::string& upload) {
    grpc::ClientContext context;
    weightstore::v1::CommitPublishRequest request;
    request.set_upload_id(upload);
    weightstore::v1::CommitPublishResponse response;
    return stub_->CommitPublish(&context, request, &response);
  }

  // A WatchReadPlans request for job-1 in the stacked layout.
  static internal::v1::WatchReadPlansRequest PlansRequest() {
    internal::v1::WatchReadPlansRequest request;
    request.set_adapter_name("job-1");
    *request.mutable_target() = Stacked();
    request.set_holder("replica-0");
    request.set_shard_checksums(true);  // As rollout replicas ask.
    return request;
  }

  // Waits (up to 10 s) until `lease_id` plans no more: released (asynchronously) or expired.
  void ExpectLeaseEnds(const std::string& lease_id, int64_t version) {
    internal::v1::GetReadPlanRequest request;
    request.set_adapter_name("job-1");
    request.set_version(version);
    *request.mutable_target() = Stacked();
    request.set_lease_id(lease_id);
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    grpc::Status status;
    do {
      grpc::ClientContext context;
      internal::v1::GetReadPlanResponse plan;
      status = ucx_stub_->GetReadPlan(&context, request, &plan);
      if (status.error_code() == grpc::StatusCode::NOT_FOUND) return;
      absl::SleepFor(absl::Milliseconds(20));
    } while (absl::Now() < give_up);
    ADD_FAILURE() << "lease " << lease_id << " still plans: " << status.error_message();
  }

  static weightstore::v1::TargetLayout Stacked() {
    weightstore::v1::TargetLayout target;
    target.set_stack_experts(true);
    return target;
  }

  // The second rank of a TP-2/EP-2 consumer with gate and up fused: sliced, strided copies.
  static weightstore::v1::TargetLayout SecondRankFused() {
    weightstore::v1::TargetLayout target;
    target.set_tp_rank(1);
    target.set_tp_size(2);
    target.set_ep_rank(1);
    target.set_ep_size(2);
    target.set_fuse_gate_up(true);
    return target;
  }

  // The version fetched in `target` by UCX (copied out of mapped memory or not, as `mapped`
  // says) holds the same tensors as fetched by the gRPC stream.
  void ExpectUcxFetchMatchesGrpc(const std::string& name, int64_t version,
                                 const weightstore::v1::TargetLayout& target, bool mapped) {
    absl::StatusOr<FetchedAdapter> by_ucx = Fetch(name, version, /*by_ucx=*/true, target);
    absl::StatusOr<FetchedAdapter> by_grpc = Fetch(name, version, /*by_ucx=*/false, target);
    ASSERT_TRUE(by_ucx.ok()) << by_ucx.status();
    ASSERT_TRUE(by_grpc.ok()) << by_grpc.status();
    EXPECT_TRUE(by_ucx->by_ucx);
    EXPECT_EQ(by_ucx->mapped, mapped);
    ASSERT_EQ(by_ucx->tensors.size(), by_grpc->tensors.size());
    for (size_t i = 0; i < by_ucx->tensors.size(); ++i) {
      EXPECT_EQ(by_ucx->tensors[i].tensor.spec().name(), by_grpc->tensors[i].tensor.spec().name());
      EXPECT_TRUE(by_ucx->tensors[i].bytes == by_grpc->tensors[i].bytes)
          << by_ucx->tensors[i].tensor.spec().name();
    }
  }

  // Watches `next`'s adapter: the first event is a SNAPSHOT of `snapshot_version` (0: no
  // version yet, and no commit time), then publishing `next` arrives as COMMITTED.
  void ExpectSnapshotThenCommit(const transfer::TestAdapter& next, int64_t snapshot_version) {
    grpc::ClientContext context;
    weightstore::v1::WatchVersionsRequest request;
    request.set_adapter_name(next.manifest.adapter_name());
    auto reader = stub_->WatchVersions(&context, request);
    weightstore::v1::WatchVersionsResponse event;
    ASSERT_TRUE(reader->Read(&event));
    EXPECT_EQ(event.type(), weightstore::v1::VERSION_EVENT_TYPE_SNAPSHOT);
    EXPECT_EQ(event.version().version(), snapshot_version);
    EXPECT_EQ(event.version().has_commit_time(), snapshot_version > 0);
    EXPECT_FALSE(event.upload_open());
    ASSERT_TRUE(Publish(next, /*by_ucx=*/true).ok());
    ASSERT_TRUE(reader->Read(&event));
    EXPECT_EQ(event.type(), weightstore::v1::VERSION_EVENT_TYPE_COMMITTED);
    EXPECT_EQ(event.version().version(), next.manifest.version());
    EXPECT_GT(event.version().total_bytes(), 0u);
    context.TryCancel();
    while (reader->Read(&event)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }

  // A stub to this store whose GetReadPlan responses pass through `edit` on arrival.
  std::unique_ptr<WeightStoreStubs> StubEditingPlans(PlanEdit edit) {
    std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> editors;
    editors.push_back(std::make_unique<PlanEditing>(std::move(edit)));
    return std::make_unique<WeightStoreStubs>(
        grpc::experimental::CreateCustomChannelWithInterceptors(
            absl::StrCat("127.0.0.1:", server_->port()), grpc::InsecureChannelCredentials(),
            grpc::ChannelArguments(), std::move(editors)));
  }

  // UCX fetches (by gets, or by copies out of mapped memory, as `mapped` says) through plans
  // that lie, as a faulty store's could, in a layout that reads shards whole (the shards
  // verified: verify_shards) and in one that slices them (the tensors verified). A wrong
  // checksum, blocks that overlap (some bytes written twice, others never), or a block put in
  // another's place (every byte received, in the wrong order) are DATA_LOSS naming the tensor
  // or the shard; a block outside its shard is INTERNAL; a shard larger than the store's region
  // is INVALID_ARGUMENT.
  void ExpectLyingPlansFail(bool mapped) {
    ASSERT_TRUE(Publish(transfer::MakeTestAdapter("job-1", 1, 4), /*by_ucx=*/true).ok());
    for (const auto& [target, shards_verified] :
         {std::pair{Stacked(), true}, std::pair{SecondRankFused(), false}}) {
      SCOPED_TRACE(shards_verified ? "shards verified" : "tensors verified");
      ExpectLyingPlansFail(mapped, target, shards_verified);
    }
  }

  void ExpectLyingPlansFail(bool mapped, const weightstore::v1::TargetLayout& target,
                            bool shards_verified) {
    // The first tensor of two copies of one shape, so that either may take the other's place.
    const auto tensor_of_two_alike =
        [](internal::v1::GetReadPlanResponse& plan) -> internal::v1::PlannedTensor* {
      for (internal::v1::PlannedTensor& tensor : *plan.mutable_tensors()) {
        if (tensor.ops_size() < 2) continue;
        const internal::v1::CopyOp& a = tensor.ops(0);
        const internal::v1::CopyOp& b = tensor.ops(1);
        if (a.count() == b.count() && a.length() == b.length() &&
            a.dst_stride() == b.dst_stride()) {
          return &tensor;
        }
      }
      ADD_FAILURE() << "no tensor of two copies alike";
      return nullptr;
    };
    struct Lie {
      std::string what;
      PlanEdit edit;
      absl::StatusCode code;
    };
    const std::vector<Lie> lies = {
        {"a wrong checksum",
         [](internal::v1::GetReadPlanResponse& plan) {
           // Whichever the plan has: the tensors' or (verify_shards) the shards'.
           weightstore::v1::TargetTensor& tensor = *plan.mutable_tensors(0)->mutable_tensor();
           tensor.set_xxh3_64(tensor.xxh3_64() ^ 1);
           plan.mutable_shards(0)->set_xxh3_64(plan.shards(0).xxh3_64() ^ 1);
         },
         absl::StatusCode::kDataLoss},
        {"overlapping blocks",
         [&](internal::v1::GetReadPlanResponse& plan) {
           if (internal::v1::PlannedTensor* tensor = tensor_of_two_alike(plan)) {
             *tensor->mutable_ops(1) = tensor->ops(0);
           }
         },
         absl::StatusCode::kDataLoss},
        {"a block in another's place",
         [&](internal::v1::GetReadPlanResponse& plan) {
           if (internal::v1::PlannedTensor* tensor = tensor_of_two_alike(plan)) {
             tensor->mutable_ops(1)->set_dst_offset(tensor->ops(0).dst_offset());
           }
         },
         absl::StatusCode::kDataLoss},
        {"a block outside its shard",
         [](internal::v1::GetReadPlanResponse& plan) {
           plan.mutable_tensors(0)->mutable_ops(0)->set_src_offset(plan.shards(0).length());
         },
         absl::StatusCode::kInternal},
        {"a shard larger than the store's region",
         [](internal::v1::GetReadPlanResponse& plan) {
           internal::v1::ShardRegion& shard = *plan.mutable_shards(0);
           for (internal::v1::PlannedTensor& tensor : *plan.mutable_tensors()) {
             for (internal::v1::CopyOp& op : *tensor.mutable_ops()) {
               if (op.shard_index() == shard.shard_index()) op.set_src_offset(shard.length());
             }
           }
           shard.set_length(2 * shard.length() + (1 << 20));
         },
         absl::StatusCode::kInvalidArgument},
    };
    for (const Lie& lie : lies) {
      SCOPED_TRACE(lie.what);
      auto stub = StubEditingPlans([&](internal::v1::GetReadPlanResponse& plan) {
        EXPECT_EQ(plan.verify_shards(), shards_verified);
        lie.edit(plan);
      });
      AdapterFetcher fetcher(*stub);
      FetchedAdapter fetched;
      const absl::Status status =
          fetcher.FetchInto("job-1", 1, {.target = target, .ucx = client_ucx_.get()}, fetched);
      EXPECT_EQ(status.code(), lie.code) << status;
      if (lie.code == absl::StatusCode::kDataLoss) {
        EXPECT_THAT(status.message(), AnyOf(HasSubstr("tensor "), HasSubstr("shard ")));
        EXPECT_EQ(fetched.mapped, mapped);
      }
    }
  }

  std::string transports_ = "tcp";  // UCX's, for the store and the client.
  std::string data_dir_;
  std::unique_ptr<ServiceServer> server_;
  WeightStoreServiceImpl* service_ = nullptr;    // Owned by server_.
  std::function<void()> watch_registered_hook_;  // For the next StartServer.
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<WeightStoreStubs> stubs_;
  weightstore::v1::WeightStoreService::StubInterface* stub_ = nullptr;  // The public API's.
  internal::v1::WeightStoreUcxService::StubInterface* ucx_stub_ = nullptr;
  std::unique_ptr<transfer::UcxWorker> client_ucx_;
};

TEST_F(WeightStoreServiceTest, PublishesAndFetchesByGrpcAndByUcxIntoAnyLayout) {
  const transfer::TestAdapter grpc_adapter = transfer::MakeTestAdapter("job-1", 1, 1);
  ASSERT_TRUE(Publish(grpc_adapter, /*by_ucx=*/false).ok());
  const transfer::TestAdapter ucx_adapter = transfer::MakeTestAdapter("job-1", 2, 2);
  absl::StatusOr<weightstore::v1::VersionInfo> committed = Publish(ucx_adapter, /*by_ucx=*/true);
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(committed->version(), 2);
  EXPECT_EQ(committed->name(), "adapters/job-1/versions/2");

  for (bool by_ucx : {false, true}) {
    absl::StatusOr<FetchedAdapter> v1 = Fetch("job-1", 1, by_ucx, Stacked());
    ASSERT_TRUE(v1.ok()) << v1.status();
    EXPECT_EQ(v1->by_ucx, by_ucx);
    ExpectCanonical(grpc_adapter, *v1);
    absl::StatusOr<FetchedAdapter> v2 = Fetch("job-1", 2, by_ucx, Stacked());
    ASSERT_TRUE(v2.ok()) << v2.status();
    ExpectCanonical(ucx_adapter, *v2);
  }
  // A TP-2 rank of a consumer gets the same tensors by either path; over tcp, by gets.
  ExpectUcxFetchMatchesGrpc("job-1", 2, SecondRankFused(), /*mapped=*/false);
}

// The store plans each layout's reads once per manifest layout: versions sharded alike reuse
// the plan's copies (with their own checksums and memory), a version sharded otherwise gets
// its own.
TEST_F(WeightStoreServiceTest, ReadPlansFollowEachVersionsShardLayout) {
  const transfer::TestAdapter v1 = transfer::MakeTestAdapter("job-1", 1, 11);
  const transfer::TestAdapter v2 =
      transfer::MakeTestAdapter("job-1", 2, 12, {.tp_size = 1, .ep_size = 1});
  const transfer::TestAdapter v3 =
      transfer::MakeTestAdapter("job-1", 3, 13, {.tp_size = 1, .ep_size = 1});
  ASSERT_NE(v1.manifest.shards_size(), v2.manifest.shards_size());
  for (const transfer::TestAdapter* adapter : {&v1, &v2, &v3}) {
    ASSERT_TRUE(Publish(*adapter, /*by_ucx=*/true).ok());
    absl::StatusOr<FetchedAdapter> fetched =
        Fetch("job-1", adapter->manifest.version(), /*by_ucx=*/true, Stacked());
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    EXPECT_TRUE(fetched->by_ucx);
    ExpectCanonical(*adapter, *fetched);
  }
}

// A ~47 MiB adapter merged from TP-2/EP-2 shards pulls three staging batches through the
// fetcher's two staging slots: the UCX fetch still equals the gRPC stream's bytes.
TEST_F(WeightStoreServiceTest, ALargeUcxFetchCyclesItsStagingSlotsAndMatchesGrpc) {
  const transfer::TestAdapter adapter =
      transfer::MakeTestAdapter("big", 1, 7, transfer::TestAdapterSpecOfSize(52));
  size_t bytes = 0;
  for (const std::string& shard : adapter.shards) bytes += shard.size();
  ASSERT_GT(bytes, 2 * kBatchBytes + (size_t{8} << 20));  // At least three batches.
  ASSERT_TRUE(Publish(adapter, /*by_ucx=*/true).ok());
  absl::StatusOr<FetchedAdapter> by_ucx = Fetch("big", 1, /*by_ucx=*/true, Stacked());
  absl::StatusOr<FetchedAdapter> by_grpc = Fetch("big", 1, /*by_ucx=*/false, Stacked());
  ASSERT_TRUE(by_ucx.ok()) << by_ucx.status();
  ASSERT_TRUE(by_grpc.ok()) << by_grpc.status();
  ASSERT_TRUE(by_ucx->by_ucx);
  ASSERT_EQ(by_ucx->tensors.size(), by_grpc->tensors.size());
  for (size_t i = 0; i < by_ucx->tensors.size(); ++i) {
    EXPECT_TRUE(by_ucx->tensors[i].bytes == by_grpc->tensors[i].bytes)
        << by_ucx->tensors[i].tensor.spec().name();
  }
}

TEST_F(WeightStoreServiceTest, UcxFetchesThroughLyingPlansFail) {
  ExpectLyingPlansFail(/*mapped=*/false);
}

// Store and client on shared memory, which maps the store's UCX memory into the client.
class WeightStoreSharedMemoryTest : public WeightStoreServiceTest {
 protected:
  WeightStoreSharedMemoryTest() { transports_ = "posix,sysv,self"; }
};

// The read plan runs as copies out of the store's memory: in every layout a rollout may ask
// for, the tensors are those the gRPC stream sends.
TEST_F(WeightStoreSharedMemoryTest, FetchesCopyOutOfTheStoresMappedMemoryInAnyLayout) {
  ASSERT_TRUE(Publish(transfer::MakeTestAdapter("job-1", 1, 5, transfer::TestAdapterSpecOfSize(8)),
                      /*by_ucx=*/true)
                  .ok());
  for (const weightstore::v1::TargetLayout& target :
       {weightstore::v1::TargetLayout(), Stacked(), SecondRankFused()}) {
    SCOPED_TRACE(target.ShortDebugString());
    ExpectUcxFetchMatchesGrpc("job-1", 1, target, /*mapped=*/true);
  }
}

TEST_F(WeightStoreSharedMemoryTest, MappedFetchesThroughLyingPlansFail) {
  ExpectLyingPlansFail(/*mapped=*/true);
}

// Replicas woken by a new version ask for its read plan at once: one computes it, the others
// wait for it, and every one fetches the version whole.
TEST_F(WeightStoreServiceTest, ReplicasFetchingANewVersionAtOnceAllGetIt) {
  const transfer::TestAdapter adapter =
      transfer::MakeTestAdapter("job-1", 1, 3, transfer::TestAdapterSpecOfSize(8));
  ASSERT_TRUE(Publish(adapter, /*by_ucx=*/true).ok());
  constexpr int kReplicas = 4;
  std::vector<absl::StatusOr<FetchedAdapter>> fetched(kReplicas);
  std::vector<std::thread> replicas;
  for (int r = 0; r < kReplicas; ++r) {
    replicas.emplace_back([&, r] { fetched[r] = Fetch("job-1", 1, /*by_ucx=*/true, Stacked()); });
  }
  for (std::thread& replica : replicas) replica.join();
  for (const absl::StatusOr<FetchedAdapter>& replica : fetched) {
    ASSERT_TRUE(replica.ok()) << replica.status();
    EXPECT_TRUE(replica->by_ucx);
    ExpectCanonical(adapter, *replica);
  }
}

// A loader that fetches version after version into one FetchedAdapter gets each version's bytes
// in the same memory (no fresh pages on a refit), by UCX and by gRPC.
TEST_F(WeightStoreServiceTest, FetchIntoReusesTheMemoryOfTheLastVersion) {
  const transfer::TestAdapter first = transfer::MakeTestAdapter("job-1", 1, 1);
  const transfer::TestAdapter second = transfer::MakeTestAdapter("job-1", 2, 2);
  ASSERT_TRUE(Publish(first, /*by_ucx=*/true).ok());
  ASSERT_TRUE(Publish(second, /*by_ucx=*/true).ok());
  for (bool by_ucx : {true, false}) {
    AdapterFetcher fetcher(*stubs_);
    FetchedAdapter fetched;
    const FetchOptions options{.target = Stacked(), .ucx = by_ucx ? client_ucx_.get() : nullptr};
    ASSERT_TRUE(fetcher.FetchInto("job-1", 1, options, fetched).ok());
    ExpectCanonical(first, fetched);
    std::vector<const char*> memory;
    for (const FetchedTensor& tensor : fetched.tensors) memory.push_back(tensor.bytes.data());
    ASSERT_TRUE(fetcher.FetchInto("job-1", 2, options, fetched).ok());
    EXPECT_EQ(fetched.by_ucx, by_ucx);
    ExpectCanonical(second, fetched);
    for (size_t i = 0; i < fetched.tensors.size(); ++i) {
      EXPECT_EQ(fetched.tensors[i].bytes.data(), memory[i])
          << fetched.tensors[i].tensor.spec().name();
    }
  }
}

TEST_F(WeightStoreServiceTest, FetchConvertsDtypesOverGrpc) {
  const transfer::TestAdapter adapter =
      transfer::MakeTestAdapter("job-1", 1, 3, {.tp_size = 1, .ep_size = 1});
  ASSERT_TRUE(Publish(adapter, false).ok());
  weightstore::v1::TargetLayout target = Stacked();
  target.set_dtype(type::v1::DTYPE_F32);
  absl::StatusOr<FetchedAdapter> fetched = Fetch("job-1", 1, false, target);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  const FetchedTensor& first = fetched->tensors.front();
  EXPECT_EQ(first.tensor.spec().dtype(), type::v1::DTYPE_F32);
  const std::string& bf16 = adapter.canonical.begin()->second;
  for (const auto& [name, bytes] : adapter.canonical) {
    if (transfer::StackedName(name) != first.tensor.spec().name()) continue;
    ASSERT_EQ(first.bytes.size(), 2 * bytes.size());
    for (size_t i = 0; i < bytes.size() / 2; ++i) {  // bf16 -> f32 is exact: bits move up.
      EXPECT_EQ(first.bytes.substr(4 * i + 2, 2), bytes.substr(2 * i, 2));
      EXPECT_EQ(first.bytes.substr(4 * i, 2), std::string(2, '\0'));
    }
  }
  (void)bf16;
  target.set_dtype(type::v1::DTYPE_I32);
  EXPECT_EQ(Fetch("job-1", 1, false, target).status().code(), absl::StatusCode::kInvalidArgument);
}

// A version that also holds an integer tensor cannot be converted to a float dtype: the stream
// is refused before its first chunk, not after the float tensors went out.
TEST_F(WeightStoreServiceTest, AnUnconvertibleTensorRefusesTheFetchBeforeAnyChunk) {
  transfer::TestAdapter adapter =
      transfer::MakeTestAdapter("job-1", 1, 74, {.tp_size = 1, .ep_size = 1});
  const std::string counts(16, '\x01');  // Four int32 elements, last in name order.
  weightstore::v1::CanonicalTensor& tensor = *adapter.manifest.add_tensors();
  tensor.mutable_spec()->set_name("zz.step_counts");
  tensor.mutable_spec()->set_dtype(type::v1::DTYPE_I32);
  tensor.mutable_spec()->add_shape(4);
  weightstore::v1::Shard& shard = *adapter.manifest.add_shards();
  shard.set_byte_size(counts.size());
  shard.set_xxh3_64(Xxh3Checksum(counts));
  weightstore::v1::ShardPiece& piece = *shard.add_pieces();
  piece.set_tensor_name("zz.step_counts");
  piece.add_slice()->set_size(4);
  piece.set_byte_length(counts.size());
  adapter.shards.push_back(counts);
  ASSERT_TRUE(Publish(adapter, /*by_ucx=*/false).ok());

  grpc::ClientContext context;
  weightstore::v1::FetchTensorsRequest request;
  request.set_adapter_name("job-1");
  request.set_version(1);
  request.mutable_target()->set_dtype(type::v1::DTYPE_F32);
  auto reader = stub_->FetchTensors(&context, request);
  const grpc::Status status = RefusedStatus(*reader);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("zz.step_counts"));
  EXPECT_THAT(status.error_message(), HasSubstr("cannot convert DTYPE_I32 to DTYPE_F32"));
}

TEST_F(WeightStoreServiceTest, CommitRejectsMissingCorruptAndOversizedShards) {
  const transfer::TestAdapter adapter = transfer::MakeTestAdapter("job-1", 1, 4);
  weightstore::v1::BeginPublishResponse begun;
  ASSERT_TRUE(Begin(adapter.manifest, &begun).ok());
  const std::string& upload = begun.upload_id();
  const std::string& shard0 = adapter.shards[0];
  ASSERT_TRUE(Put(upload, 0, 0, shard0.substr(0, shard0.size() / 2)).ok());
  grpc::Status missing = Commit(upload);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(missing.error_message(),
              HasSubstr(absl::StrCat("shard 0: ", shard0.size() / 2, " of ", shard0.size())));
  grpc::Status oversized = Put(upload, 0, shard0.size() - 1, "ab");
  EXPECT_EQ(oversized.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Put(upload, 99, 0, "a").error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  std::string corrupt = shard0;
  corrupt[7] ^= 1;
  ASSERT_TRUE(Put(upload, 0, 0, corrupt).ok());
  for (size_t i = 1; i < adapter.shards.size(); ++i)
    ASSERT_TRUE(Put(upload, i, 0, adapter.shards[i]).ok());
  grpc::Status mismatch = Commit(upload);
  EXPECT_EQ(mismatch.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(mismatch.error_message(), HasSubstr("shard 0: xxh3 0x"));
  // The upload stays open: re-put the shard and commit again; a retried commit is a no-op.
  ASSERT_TRUE(Put(upload, 0, 0, shard0).ok());
  ASSERT_TRUE(Commit(upload).ok());
  EXPECT_TRUE(Commit(upload).ok());
  EXPECT_EQ(Put(upload, 0, 0, "x").error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(Commit("upload-unknown").error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(WeightStoreServiceTest, VersionRulesAndConcurrentPublishOfOneVersion) {
  const transfer::TestAdapter v2 = transfer::MakeTestAdapter("job-1", 2, 5);
  weightstore::v1::BeginPublishResponse first, again, other;
  ASSERT_TRUE(Begin(v2.manifest, &first).ok());
  ASSERT_TRUE(Begin(v2.manifest, &again).ok());  // A retry gets the same upload.
  EXPECT_EQ(again.upload_id(), first.upload_id());
  transfer::TestAdapter rival = transfer::MakeTestAdapter("job-1", 2, 6);
  grpc::Status concurrent = Begin(rival.manifest, &other);
  EXPECT_EQ(concurrent.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(concurrent.error_message(), HasSubstr("in progress"));
  for (size_t i = 0; i < v2.shards.size(); ++i)
    ASSERT_TRUE(Put(first.upload_id(), i, 0, v2.shards[i]).ok());
  ASSERT_TRUE(Commit(first.upload_id()).ok());
  EXPECT_EQ(Begin(rival.manifest, &other).error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(Begin(transfer::MakeTestAdapter("job-1", 1, 7).manifest, &other).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  weightstore::v1::Manifest broken = transfer::MakeTestAdapter("job-1", 3, 8).manifest;
  broken.mutable_shards(0)->mutable_pieces()->RemoveLast();
  EXPECT_EQ(Begin(broken, &other).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Aborting frees the upload; the version can be published again.
  const transfer::TestAdapter v3 = transfer::MakeTestAdapter("job-1", 3, 9);
  ASSERT_TRUE(Begin(v3.manifest, &other).ok());
  grpc::ClientContext context;
  weightstore::v1::AbortPublishRequest abort;
  abort.set_upload_id(other.upload_id());
  weightstore::v1::AbortPublishResponse aborted;
  ASSERT_TRUE(stub_->AbortPublish(&context, abort, &aborted).ok());
  EXPECT_EQ(Commit(other.upload_id()).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(Publish(v3, false).ok());
}

TEST_F(WeightStoreServiceTest, UnknownRetiredAndExpiredAreNotFoundAndLeasesPinVersions) {
  StartServer(/*keep_versions=*/1, /*upload_expiry=*/absl::Milliseconds(100));
  ASSERT_TRUE(Publish(transfer::MakeTestAdapter("job-1", 1, 10), false).ok());
  grpc::ClientContext acquire_context;
  weightstore::v1::AcquireLeaseRequest acquire;
  acquire.set_adapter_name("job-1");
  acquire.set_version(1);
  acquire.set_holder("replica-0");
  weightstore::v1::AcquireLeaseResponse lease;
  ASSERT_TRUE(stub_->AcquireLease(&acquire_context, acquire, &lease).ok());
  ASSERT_TRUE(Publish(transfer::MakeTestAdapter("job-1", 2, 11), false).ok());
  ASSERT_TRUE(Publish(transfer::MakeTestAdapter("job-1", 3, 12), false).ok());
  absl::SleepFor(absl::Milliseconds(200));               // Sweeps run.
  EXPECT_TRUE(Fetch("job-1", 1, true, Stacked()).ok());  // Leased: kept.
  EXPECT_EQ(Fetch("job-1", 2, false).status().code(), absl::StatusCode::kNotFound);  // Retired.
  EXPECT_EQ(Fetch("job-9", 1, false).status().code(), absl::StatusCode::kNotFound);
  {
    grpc::ClientContext context;
    weightstore::v1::ReleaseLeaseRequest release;
    release.set_lease_id(lease.lease_id());
    weightstore::v1::ReleaseLeaseResponse released;
    ASSERT_TRUE(stub_->ReleaseLease(&context, release, &released).ok());
  }
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(Fetch("job-1", 1, false).status().code(), absl::StatusCode::kNotFound);

  internal::v1::GetReadPlanRequest plan;
  plan.set_adapter_name("job-1");
  plan.set_version(3);
  plan.set_lease_id(lease.lease_id());
  plan.mutable_target();
  grpc::ClientContext plan_context;
  internal::v1::GetReadPlanResponse planned;
  EXPECT_EQ(ucx_stub_->GetReadPlan(&plan_context, plan, &planned).error_code(),
            grpc::StatusCode::NOT_FOUND);

  weightstore::v1::BeginPublishResponse begun;
  ASSERT_TRUE(Begin(transfer::MakeTestAdapter("job-1", 4, 13).manifest, &begun).ok());
  absl::SleepFor(absl::Milliseconds(300));  // The upload expires.
  EXPECT_EQ(Commit(begun.upload_id()).error_code(), grpc::StatusCode::NOT_FOUND);
}

// Every id and name a request carries follows common.proto's identifier rule, and every
// version a request names is >= 1: INVALID_ARGUMENT naming the field, before any lookup.
TEST_F(WeightStoreServiceTest, IdsNamesAndVersionsAreCheckedAtTheEdge) {
  ASSERT_TRUE(Publish(transfer::MakeTestAdapter("job-1", 1, 70), /*by_ucx=*/false).ok());
  const auto expect_invalid = [](const grpc::Status& status, const std::string& message) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << message;
    EXPECT_THAT(status.error_message(), HasSubstr(message));
  };
  const auto get_manifest = [&](const type::v1::AdapterSelector& selector) {
    grpc::ClientContext context;
    weightstore::v1::GetManifestRequest request;
    *request.mutable_adapter() = selector;
    weightstore::v1::GetManifestResponse response;
    return stub_->GetManifest(&context, request, &response);
  };
  type::v1::AdapterSelector selector;
  selector.set_adapter_name("job 1");
  expect_invalid(get_manifest(selector), "bad adapter.adapter_name: 'job 1'");
  selector.set_adapter_name("job-1");
  selector.set_exact_version(0);
  expect_invalid(get_manifest(selector), "adapter.exact_version is 0");
  selector.set_min_version(-3);
  expect_invalid(get_manifest(selector), "adapter.min_version is -3");

  {
    grpc::ClientContext context;
    weightstore::v1::WatchVersionsRequest request;
    request.set_adapter_name("../other");
    expect_invalid(RefusedStatus(*stub_->WatchVersions(&context, request)),
                   "bad adapter_name: '../other'");
  }
  {
    grpc::ClientContext context;
    weightstore::v1::FetchTensorsRequest request;
    request.set_adapter_name("job-1");
    request.set_version(0);
    expect_invalid(RefusedStatus(*stub_->FetchTensors(&context, request)), "version is 0");
  }
  {
    grpc::ClientContext context;
    internal::v1::GetReadPlanRequest request;
    request.set_adapter_name("job-1");
    request.set_version(-1);
    request.set_lease_id("lease-1");
    internal::v1::GetReadPlanResponse response;
    expect_invalid(ucx_stub_->GetReadPlan(&context, request, &response), "version is -1");
  }
  {
    grpc::ClientContext context;
    weightstore::v1::AbortPublishRequest request;  // No upload_id.
    weightstore::v1::AbortPublishResponse response;
    expect_invalid(stub_->AbortPublish(&context, request, &response), "bad upload_id: ''");
  }
  {
    grpc::ClientContext context;
    weightstore::v1::ReleaseLeaseRequest request;
    request.set_lease_id("lease 1");
    weightstore::v1::ReleaseLeaseResponse response;
    expect_invalid(stub_->ReleaseLease(&context, request, &response), "bad lease_id: 'lease 1'");
  }
  {
    grpc::ClientContext context;
    weightstore::v1::AcquireLeaseRequest request;
    request.set_adapter_name("");
    request.set_version(1);
    request.set_holder("replica-0");
    weightstore::v1::AcquireLeaseResponse response;
    expect_invalid(stub_->AcquireLease(&context, request, &response), "bad adapter_name: ''");
  }
  for (const std::string& client_id : {std::string(), std::string("replica 0")}) {
    grpc::ClientContext context;
    internal::v1::ExchangeUcxEndpointRequest request;
    request.set_worker_address("address");
    request.set_client_id(client_id);
    internal::v1::ExchangeUcxEndpointResponse response;
    expect_invalid(ucx_stub_->ExchangeUcxEndpoint(&context, request, &response),
                   absl::StrCat("bad client_id: '", client_id, "'"));
  }
  {
    grpc::ClientContext context;
    internal::v1::ExchangeUcxEndpointRequest request;
    request.set_worker_address(std::string((64 << 10) + 1, 'a'));
    request.set_client_id("replica-0");
    internal::v1::ExchangeUcxEndpointResponse response;
    expect_invalid(ucx_stub_->ExchangeUcxEndpoint(&context, request, &response),
                   "worker_address has 65537 bytes");
  }
  {
    grpc::ClientContext context;
    weightstore::v1::PutShardResponse response;
    auto writer = stub_->PutShard(&context, &response);
    writer->WritesDone();  // No chunk, so no upload.
    expect_invalid(writer->Finish(), "upload_id is required");
  }
}

// Every documented rule of every RPC, as a client built from the protos sees it: INVALID_ARGUMENT
// whose details name the field by its path from the request root (with list indices and map
// keys) and give the ErrorInfo reason.
TEST_F(WeightStoreServiceTest, EveryRuleNamesTheFieldPathAndReasonInItsDetails) {
  ASSERT_TRUE(Publish(transfer::MakeTestAdapter("job-1", 1, 90), /*by_ucx=*/true).ok());
  const absl::StatusOr<std::string> lease =
      AcquireLease(*stubs_, "job-1", 1, "replica-0", absl::Seconds(30));
  ASSERT_TRUE(lease.ok()) << lease.status();
  const transfer::TestAdapter open = transfer::MakeTestAdapter("job-2", 1, 91);
  weightstore::v1::BeginPublishResponse upload;
  ASSERT_TRUE(Begin(open.manifest, &upload).ok());
  const uint64_t shard_bytes = open.manifest.shards(0).byte_size();
  const std::string upload_id = upload.upload_id();

  const weightstore::v1::Manifest manifest = transfer::MakeTestAdapter("job-3", 1, 92).manifest;
  // A tensor that is not per expert; a piece of shard 0 that covers one tensor (not fused).
  int plain = -1;
  for (int t = 0; t < manifest.tensors_size() && plain < 0; ++t) {
    if (!absl::StrContains(manifest.tensors(t).spec().name(), "{e}")) plain = t;
  }
  int lone_piece = -1;
  for (int p = 0; p < manifest.shards(0).pieces_size() && lone_piece < 0; ++p) {
    if (!manifest.shards(0).pieces(p).fused_gate_up()) lone_piece = p;
  }
  ASSERT_GE(plain, 0);
  ASSERT_GE(lone_piece, 0);
  int lone_tensor = -1;
  for (int t = 0; t < manifest.tensors_size(); ++t) {
    if (manifest.tensors(t).spec().name() == manifest.shards(0).pieces(lone_piece).tensor_name()) {
      lone_tensor = t;
    }
  }
  ASSERT_GE(lone_tensor, 0);

  using Manifest = weightstore::v1::Manifest;
  const auto begin = [&](const std::function<void(Manifest&)>& edit) {
    return [this, manifest, edit] {
      weightstore::v1::BeginPublishRequest request;
      *request.mutable_manifest() = manifest;
      edit(*request.mutable_manifest());
      grpc::ClientContext context;
      weightstore::v1::BeginPublishResponse response;
      return stub_->BeginPublish(&context, request, &response);
    };
  };
  const auto put = [&](const std::function<void(weightstore::v1::PutShardRequest&)>& edit) {
    return [this, upload_id, edit] {
      weightstore::v1::PutShardRequest chunk;
      chunk.set_upload_id(upload_id);
      chunk.set_shard_index(0);
      chunk.set_offset(0);
      chunk.set_data("a");
      edit(chunk);
      grpc::ClientContext context;
      weightstore::v1::PutShardResponse response;
      auto writer = stub_->PutShard(&context, &response);
      writer->Write(chunk);
      writer->WritesDone();
      return writer->Finish();
    };
  };
  const auto get_manifest = [&](const std::function<void(type::v1::AdapterSelector&)>& edit) {
    return [this, edit] {
      weightstore::v1::GetManifestRequest request;
      request.mutable_adapter()->set_adapter_name("job-1");
      edit(*request.mutable_adapter());
      grpc::ClientContext context;
      weightstore::v1::GetManifestResponse response;
      return stub_->GetManifest(&context, request, &response);
    };
  };
  using FetchRequest = weightstore::v1::FetchTensorsRequest;
  const auto fetch = [&](const std::function<void(FetchRequest&)>& edit) {
    return [this, edit] {
      FetchRequest request;
      request.set_adapter_name("job-1");
      request.set_version(1);
      request.mutable_target();
      edit(request);
      grpc::ClientContext context;
      return RefusedStatus(*stub_->FetchTensors(&context, request));
    };
  };
  using AcquireRequest = weightstore::v1::AcquireLeaseRequest;
  const auto acquire = [&](const std::function<void(AcquireRequest&)>& edit) {
    return [this, edit] {
      AcquireRequest request;
      request.set_adapter_name("job-1");
      request.set_version(1);
      request.set_holder("replica-0");
      edit(request);
      grpc::ClientContext context;
      weightstore::v1::AcquireLeaseResponse response;
      return stub_->AcquireLease(&context, request, &response);
    };
  };
  using RenewRequest = weightstore::v1::RenewLeaseRequest;
  const auto renew = [&](const std::function<void(RenewRequest&)>& edit) {
    return [this, lease, edit] {
      RenewRequest request;
      request.set_lease_id(*lease);
      edit(request);
      grpc::ClientContext context;
      weightstore::v1::RenewLeaseResponse response;
      return stub_->RenewLease(&context, request, &response);
    };
  };
  using PlanRequest = internal::v1::GetReadPlanRequest;
  const auto plan = [&](const std::function<void(PlanRequest&)>& edit) {
    return [this, lease, edit] {
      PlanRequest request;
      request.set_adapter_name("job-1");
      request.set_version(1);
      request.set_lease_id(*lease);
      request.mutable_target();
      edit(request);
      grpc::ClientContext context;
      internal::v1::GetReadPlanResponse response;
      return ucx_stub_->GetReadPlan(&context, request, &response);
    };
  };
  using WatchPlansRequest = internal::v1::WatchReadPlansRequest;
  const auto watch_plans = [&](const std::function<void(WatchPlansRequest&)>& edit) {
    return [this, edit] {
      WatchPlansRequest request = PlansRequest();
      edit(request);
      grpc::ClientContext context;
      return RefusedStatus(*ucx_stub_->WatchReadPlans(&context, request));
    };
  };
  using ExchangeRequest = internal::v1::ExchangeUcxEndpointRequest;
  const auto exchange = [&](const std::function<void(ExchangeRequest&)>& edit) {
    return [this, edit] {
      ExchangeRequest request;
      request.set_worker_address("address");
      request.set_client_id("replica-0");
      edit(request);
      grpc::ClientContext context;
      internal::v1::ExchangeUcxEndpointResponse response;
      return ucx_stub_->ExchangeUcxEndpoint(&context, request, &response);
    };
  };
  const std::string tensor_path = absl::StrCat("manifest.tensors[", plain, "]");
  const std::string plain_name = manifest.tensors(plain).spec().name();
  const std::string piece_path = absl::StrCat("manifest.shards[0].pieces[", lone_piece, "]");

  const std::vector<InvalidArgumentCase> cases = {
      // BeginPublish: the manifest's rules (manifest_test.cc has every one).
      {"BeginNoManifest",
       [this] {
         grpc::ClientContext context;
         weightstore::v1::BeginPublishResponse response;
         return stub_->BeginPublish(&context, weightstore::v1::BeginPublishRequest(), &response);
       },
       "manifest.adapter_name"},
      {"BeginBadAdapterName", begin([](Manifest& m) { m.set_adapter_name("a b"); }),
       "manifest.adapter_name"},
      {"BeginNoVersion", begin([](Manifest& m) { m.clear_version(); }), "manifest.version"},
      {"BeginNoRank", begin([](Manifest& m) { m.mutable_lora()->clear_rank(); }),
       "manifest.lora.rank"},
      {"BeginUnknownModule", begin([](Manifest& m) {
         m.mutable_lora()->add_target_modules("q_proj");
         m.mutable_lora()->add_target_modules("lm_head");
       }),
       "manifest.lora.target_modules[1]"},
      {"BeginNoExpertLayout", begin([](Manifest& m) { m.mutable_lora()->clear_expert_layout(); }),
       "manifest.lora.expert_layout"},
      {"BeginLongBaseModel", begin([](Manifest& m) { m.set_base_model(std::string(4097, 'm')); }),
       "manifest.base_model"},
      {"BeginLongLabel",
       begin([](Manifest& m) { (*m.mutable_labels())["note"] = std::string(4097, 'v'); }),
       "manifest.labels[\"note\"]"},
      {"BeginTooManyLabels", begin([](Manifest& m) {
         for (int i = 0; i < 65; ++i) (*m.mutable_labels())[absl::StrCat("k", i)] = "v";
       }),
       "manifest.labels"},
      {"BeginNoTensors", begin([](Manifest& m) {
         m.clear_tensors();
         m.clear_shards();
       }),
       "manifest.tensors"},
      {"BeginUnnamedTensor",
       begin([plain](Manifest& m) { m.mutable_tensors(plain)->mutable_spec()->clear_name(); }),
       tensor_path + ".spec.name"},
      {"BeginNoDtype",
       begin([plain](Manifest& m) { m.mutable_tensors(plain)->mutable_spec()->clear_dtype(); }),
       tensor_path + ".spec.dtype"},
      {"BeginZeroDim",
       begin([plain](Manifest& m) { m.mutable_tensors(plain)->mutable_spec()->set_shape(1, 0); }),
       tensor_path + ".spec.shape[1]"},
      {"BeginExpertsWithoutPlaceholder",
       begin([plain](Manifest& m) { m.mutable_tensors(plain)->set_num_experts(2); }),
       tensor_path + ".num_experts"},
      {"BeginNoShards", begin([](Manifest& m) { m.clear_shards(); }), "manifest.shards"},
      {"BeginNegativeProducerRank",
       begin([](Manifest& m) { m.mutable_shards(0)->set_producer_rank(-1); }),
       "manifest.shards[0].producer_rank"},
      {"BeginEmptyShard", begin([](Manifest& m) { m.mutable_shards(0)->clear_byte_size(); }),
       "manifest.shards[0].byte_size"},
      {"BeginShardWithoutPieces", begin([](Manifest& m) { m.add_shards()->set_byte_size(1); }),
       absl::StrCat("manifest.shards[", manifest.shards_size(), "].pieces")},
      {"BeginUnknownTensor", begin([lone_piece](Manifest& m) {
         m.mutable_shards(0)->mutable_pieces(lone_piece)->set_tensor_name("nope");
       }),
       piece_path + ".tensor_name"},
      {"BeginNegativeSliceOffset", begin([lone_piece](Manifest& m) {
         m.mutable_shards(0)->mutable_pieces(lone_piece)->mutable_slice(0)->set_offset(-1);
       }),
       piece_path + ".slice[0].offset"},
      {"BeginSliceMissing", begin([lone_piece](Manifest& m) {
         m.mutable_shards(0)->mutable_pieces(lone_piece)->mutable_slice()->RemoveLast();
       }),
       piece_path + ".slice"},
      {"BeginWrongByteLength", begin([lone_piece](Manifest& m) {
         weightstore::v1::ShardPiece& piece = *m.mutable_shards(0)->mutable_pieces(lone_piece);
         piece.set_byte_length(piece.byte_length() + 2);
       }),
       piece_path + ".byte_length"},
      {"BeginUncoveredTensor", begin([lone_piece](Manifest& m) {
         m.mutable_shards(0)->mutable_pieces()->DeleteSubrange(lone_piece, 1);
       }),
       absl::StrCat("manifest.tensors[", lone_tensor, "]")},
      {"BeginUcxNoVersion",
       [this, manifest] {
         internal::v1::BeginUcxPublishRequest request;
         *request.mutable_manifest() = manifest;
         request.mutable_manifest()->set_version(0);
         grpc::ClientContext context;
         internal::v1::BeginUcxPublishResponse response;
         return ucx_stub_->BeginUcxPublish(&context, request, &response);
       },
       "manifest.version"},
      // PutShard.
      {"PutNoChunk",
       [this] {
         grpc::ClientContext context;
         weightstore::v1::PutShardResponse response;
         auto writer = stub_->PutShard(&context, &response);
         writer->WritesDone();
         return writer->Finish();
       },
       "upload_id"},
      {"PutBadUploadId", put([](weightstore::v1::PutShardRequest& r) { r.clear_upload_id(); }),
       "upload_id"},
      {"PutSecondUpload",
       [this, upload_id] {
         grpc::ClientContext context;
         weightstore::v1::PutShardResponse response;
         auto writer = stub_->PutShard(&context, &response);
         weightstore::v1::PutShardRequest chunk;
         chunk.set_upload_id(upload_id);
         chunk.set_data("a");
         writer->Write(chunk);
         chunk.set_upload_id("upload-other");
         writer->Write(chunk);
         writer->WritesDone();
         return writer->Finish();
       },
       "upload_id"},
      {"PutNoData", put([](weightstore::v1::PutShardRequest& r) { r.clear_data(); }), "data"},
      {"PutNoSuchShard", put([](weightstore::v1::PutShardRequest& r) { r.set_shard_index(99); }),
       "shard_index"},
      {"PutPastTheShard",
       put([shard_bytes](weightstore::v1::PutShardRequest& r) { r.set_offset(shard_bytes + 1); }),
       "offset"},
      {"PutDataOverflowingTheShard", put([shard_bytes](weightstore::v1::PutShardRequest& r) {
         r.set_data(std::string(shard_bytes + 1, 'x'));
       }),
       "data"},
      // CommitPublish, AbortPublish.
      {"CommitBadUploadId",
       [this] {
         grpc::ClientContext context;
         weightstore::v1::CommitPublishRequest request;
         request.set_upload_id("upload 1");
         weightstore::v1::CommitPublishResponse response;
         return stub_->CommitPublish(&context, request, &response);
       },
       "upload_id"},
      {"AbortNoUploadId",
       [this] {
         grpc::ClientContext context;
         weightstore::v1::AbortPublishResponse response;
         return stub_->AbortPublish(&context, weightstore::v1::AbortPublishRequest(), &response);
       },
       "upload_id"},
      // GetManifest, WatchVersions.
      {"GetManifestNoAdapter",
       get_manifest([](type::v1::AdapterSelector& a) { a.clear_adapter_name(); }),
       "adapter.adapter_name"},
      {"GetManifestExactVersionZero",
       get_manifest([](type::v1::AdapterSelector& a) { a.set_exact_version(0); }),
       "adapter.exact_version"},
      {"GetManifestNegativeMinVersion",
       get_manifest([](type::v1::AdapterSelector& a) { a.set_min_version(-1); }),
       "adapter.min_version"},
      {"WatchBadAdapterName",
       [this] {
         grpc::ClientContext context;
         weightstore::v1::WatchVersionsRequest request;
         request.set_adapter_name("../x");
         return RefusedStatus(*stub_->WatchVersions(&context, request));
       },
       "adapter_name"},
      // FetchTensors.
      {"FetchNoAdapter", fetch([](FetchRequest& r) { r.clear_adapter_name(); }), "adapter_name"},
      {"FetchNoVersion", fetch([](FetchRequest& r) { r.clear_version(); }), "version"},
      {"FetchNoTarget", fetch([](FetchRequest& r) { r.clear_target(); }), "target"},
      {"FetchSmallChunks", fetch([](FetchRequest& r) { r.set_max_chunk_bytes(1000); }),
       "max_chunk_bytes"},
      {"FetchNegativeTpSize", fetch([](FetchRequest& r) { r.mutable_target()->set_tp_size(-1); }),
       "target.tp_size"},
      {"FetchTpRankBeyondSize", fetch([](FetchRequest& r) {
         r.mutable_target()->set_tp_rank(2);
         r.mutable_target()->set_tp_size(2);
       }),
       "target.tp_rank"},
      {"FetchTpSizeNotDividing", fetch([](FetchRequest& r) { r.mutable_target()->set_tp_size(3); }),
       "target.tp_size"},
      {"FetchEpSizeNotDividing", fetch([](FetchRequest& r) { r.mutable_target()->set_ep_size(3); }),
       "target.ep_size"},
      {"FetchNegativeExpertTpRank",
       fetch([](FetchRequest& r) { r.mutable_target()->set_expert_tp_rank(-1); }),
       "target.expert_tp_rank"},
      {"FetchUnknownNaming", fetch([](FetchRequest& r) {
         r.mutable_target()->set_naming(static_cast<weightstore::v1::TensorNaming>(99));
       }),
       "target.naming"},
      {"FetchIntegerDtype",
       fetch([](FetchRequest& r) { r.mutable_target()->set_dtype(type::v1::DTYPE_I32); }),
       "target.dtype"},
      {"FetchUnknownTensor", fetch([](FetchRequest& r) { r.add_tensor_names("nope"); }),
       "tensor_names[0]"},
      {"FetchLongTensorName", fetch([plain_name](FetchRequest& r) {
         r.add_tensor_names(plain_name);  // Delivered whole, under its canonical name.
         r.add_tensor_names(std::string(513, 'n'));
       }),
       "tensor_names[1]"},
      // AcquireLease, RenewLease, ReleaseLease.
      {"AcquireNoHolder", acquire([](AcquireRequest& r) { r.clear_holder(); }), "holder"},
      {"AcquireLongHolder", acquire([](AcquireRequest& r) { r.set_holder(std::string(257, 'h')); }),
       "holder"},
      {"AcquireNoAdapter", acquire([](AcquireRequest& r) { r.clear_adapter_name(); }),
       "adapter_name"},
      {"AcquireNoVersion", acquire([](AcquireRequest& r) { r.clear_version(); }), "version"},
      {"AcquireLongTtl", acquire([](AcquireRequest& r) { r.mutable_ttl()->set_seconds(601); }),
       "ttl"},
      {"AcquireMalformedTtl", acquire([](AcquireRequest& r) {
         r.mutable_ttl()->set_seconds(1);
         r.mutable_ttl()->set_nanos(-1);
       }),
       "ttl"},
      {"RenewNoLeaseId", renew([](RenewRequest& r) { r.clear_lease_id(); }), "lease_id"},
      {"RenewShortTtl", renew([](RenewRequest& r) { r.mutable_ttl()->set_nanos(500000000); }),
       "ttl"},
      {"ReleaseBadLeaseId",
       [this] {
         grpc::ClientContext context;
         weightstore::v1::ReleaseLeaseRequest request;
         request.set_lease_id("lease 1");
         weightstore::v1::ReleaseLeaseResponse response;
         return stub_->ReleaseLease(&context, request, &response);
       },
       "lease_id"},
      // GetReadPlan, ExchangeUcxEndpoint, WatchReadPlans.
      {"PlanConverting",
       plan([](PlanRequest& r) { r.mutable_target()->set_dtype(type::v1::DTYPE_BF16); }),
       "target.dtype"},
      {"PlanNoAdapter", plan([](PlanRequest& r) { r.clear_adapter_name(); }), "adapter_name"},
      {"PlanNoVersion", plan([](PlanRequest& r) { r.clear_version(); }), "version"},
      {"PlanNoLeaseId", plan([](PlanRequest& r) { r.clear_lease_id(); }), "lease_id"},
      {"PlanNoTarget", plan([](PlanRequest& r) { r.clear_target(); }), "target"},
      {"PlanNegativeEpSize", plan([](PlanRequest& r) { r.mutable_target()->set_ep_size(-2); }),
       "target.ep_size"},
      {"PlanUnknownTensor", plan([](PlanRequest& r) { r.add_tensor_names("nope"); }),
       "tensor_names[0]"},
      {"ExchangeNoWorkerAddress", exchange([](ExchangeRequest& r) { r.clear_worker_address(); }),
       "worker_address"},
      {"ExchangeNoClientId", exchange([](ExchangeRequest& r) { r.clear_client_id(); }),
       "client_id"},
      {"WatchPlansNoAdapter", watch_plans([](WatchPlansRequest& r) { r.clear_adapter_name(); }),
       "adapter_name"},
      {"WatchPlansNoHolder", watch_plans([](WatchPlansRequest& r) { r.clear_holder(); }), "holder"},
      {"WatchPlansNoTarget", watch_plans([](WatchPlansRequest& r) { r.clear_target(); }), "target"},
      {"WatchPlansConverting", watch_plans([](WatchPlansRequest& r) {
         r.mutable_target()->set_dtype(type::v1::DTYPE_F16);
       }),
       "target.dtype"},
      {"WatchPlansLongLeases",
       watch_plans([](WatchPlansRequest& r) { r.mutable_lease_ttl()->set_seconds(601); }),
       "lease_ttl"},
  };
  ExpectEachRefusedWithDetails(cases);
}

// A valid manifest whose shards (up to 2^40 bytes each) the store's host could never hold is
// refused at BeginPublish, before any memory is taken.
TEST_F(WeightStoreServiceTest, BeginRefusesUploadsLargerThanTheHostsMemory) {
  transfer::TestAdapter adapter = transfer::MakeTestAdapter("job-1", 1, 71);
  weightstore::v1::Manifest huge_shard = adapter.manifest;
  huge_shard.mutable_shards(0)->set_byte_size(uint64_t{1} << 40);  // Its pieces still fit.
  weightstore::v1::BeginPublishResponse begun;
  const auto expect_refused = [](const grpc::Status& status) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr("bytes of memory"));
  };
  {
    grpc::ClientContext context;
    weightstore::v1::BeginPublishRequest request;
    *request.mutable_manifest() = huge_shard;
    expect_refused(stub_->BeginPublish(&context, request, &begun));
  }
  {
    grpc::ClientContext context;
    internal::v1::BeginUcxPublishRequest request;
    *request.mutable_manifest() = huge_shard;
    internal::v1::BeginUcxPublishResponse ucx_begun;
    expect_refused(ucx_stub_->BeginUcxPublish(&context, request, &ucx_begun));
  }
  ASSERT_TRUE(Begin(adapter.manifest, &begun).ok()) << "the store took nothing from those";
}

// Two CommitPublish calls for one upload at once (a client retrying one whose deadline passed)
// both answer with the committed version: the second waits for the first's commit.
TEST_F(WeightStoreServiceTest, ACommitRetriedWhileCommittingGetsTheSameVersion) {
  const transfer::TestAdapter adapter =
      transfer::MakeTestAdapter("job-1", 1, 72, transfer::TestAdapterSpecOfSize(16));
  weightstore::v1::BeginPublishResponse begun;
  ASSERT_TRUE(Begin(adapter.manifest, &begun).ok());
  for (size_t i = 0; i < adapter.shards.size(); ++i) {
    const absl::string_view shard = adapter.shards[i];
    for (size_t offset = 0; offset < shard.size(); offset += 4 << 20) {
      ASSERT_TRUE(Put(begun.upload_id(), i, offset, shard.substr(offset, 4 << 20)).ok());
    }
  }
  constexpr int kCalls = 3;
  std::vector<grpc::Status> statuses(kCalls);
  std::vector<weightstore::v1::CommitPublishResponse> responses(kCalls);
  std::vector<std::thread> calls;
  for (int c = 0; c < kCalls; ++c) {
    calls.emplace_back([&, c] {
      grpc::ClientContext context;
      weightstore::v1::CommitPublishRequest request;
      request.set_upload_id(begun.upload_id());
      statuses[c] = stub_->CommitPublish(&context, request, &responses[c]);
    });
  }
  for (std::thread& call : calls) call.join();
  for (int c = 0; c < kCalls; ++c) {
    EXPECT_TRUE(statuses[c].ok()) << statuses[c].error_message();
    EXPECT_EQ(responses[c].version().version(), 1);
  }
}

// A read plan is cached for the exact request: names that differ only in how they would join
// are still checked ("A,B" is no tensor's name).
TEST_F(WeightStoreServiceTest, ReadPlansAreCachedForTheExactTensorNames) {
  ASSERT_TRUE(Publish(transfer::MakeTestAdapter("job-1", 1, 73), /*by_ucx=*/true).ok());
  absl::StatusOr<std::string> lease =
      AcquireLease(*stubs_, "job-1", 1, "replica-0", absl::Seconds(30));
  ASSERT_TRUE(lease.ok()) << lease.status();
  const auto plan = [&](const std::vector<std::string>& names) {
    grpc::ClientContext context;
    internal::v1::GetReadPlanRequest request;
    request.set_adapter_name("job-1");
    request.set_version(1);
    request.set_lease_id(*lease);
    request.mutable_target();
    for (const std::string& name : names) request.add_tensor_names(name);
    internal::v1::GetReadPlanResponse response;
    grpc::Status status = ucx_stub_->GetReadPlan(&context, request, &response);
    return std::make_pair(status, response);
  };
  const auto [everything, all] = plan({});
  ASSERT_TRUE(everything.ok()) << everything.error_message();
  ASSERT_GE(all.tensors_size(), 2);
  const std::string first = all.tensors(0).tensor().spec().name();
  const std::string second = all.tensors(1).tensor().spec().name();
  const auto [two, two_plan] = plan({first, second});
  ASSERT_TRUE(two.ok()) << two.error_message();
  EXPECT_EQ(two_plan.tensors_size(), 2);
  const auto [joined, unused] = plan({absl::StrCat(first, ",", second)});
  EXPECT_EQ(joined.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << joined.error_message();
}

// A reader that asks for shard checksums gets them where its plan reads each shard whole: the
// manifest's, verified at commit, and no tensor checksums (no pass over the bytes). A sliced
// layout, a few tensors, or a reader that does not ask get the tensors' checksums.
TEST_F(WeightStoreServiceTest, ReadPlansCarryShardChecksumsWhereTheyReadShardsWhole) {
  const transfer::TestAdapter adapter = transfer::MakeTestAdapter("job-1", 1, 74);
  ASSERT_TRUE(Publish(adapter, /*by_ucx=*/true).ok());
  absl::StatusOr<std::string> lease =
      AcquireLease(*stubs_, "job-1", 1, "replica-0", absl::Seconds(30));
  ASSERT_TRUE(lease.ok()) << lease.status();
  const auto plan = [&](const weightstore::v1::TargetLayout& target, bool shard_checksums,
                        const std::vector<std::string>& names) {
    grpc::ClientContext context;
    internal::v1::GetReadPlanRequest request;
    request.set_adapter_name("job-1");
    request.set_version(1);
    request.set_lease_id(*lease);
    *request.mutable_target() = target;
    request.set_shard_checksums(shard_checksums);
    for (const std::string& name : names) request.add_tensor_names(name);
    internal::v1::GetReadPlanResponse response;
    const grpc::Status status = ucx_stub_->GetReadPlan(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response;
  };
  const internal::v1::GetReadPlanResponse whole = plan(Stacked(), true, {});
  EXPECT_TRUE(whole.verify_shards());
  ASSERT_EQ(whole.shards_size(), adapter.manifest.shards_size());
  for (const internal::v1::ShardRegion& region : whole.shards()) {
    EXPECT_EQ(region.xxh3_64(), adapter.manifest.shards(region.shard_index()).xxh3_64());
  }
  for (const internal::v1::PlannedTensor& tensor : whole.tensors()) {
    EXPECT_EQ(tensor.tensor().xxh3_64(), 0u) << tensor.tensor().spec().name();
  }
  const std::string first = whole.tensors(0).tensor().spec().name();
  for (const internal::v1::GetReadPlanResponse& hashed :
       {plan(Stacked(), false, {}), plan(SecondRankFused(), true, {}),
        plan(Stacked(), true, {first})}) {
    EXPECT_FALSE(hashed.verify_shards());
    for (const internal::v1::ShardRegion& region : hashed.shards()) {
      EXPECT_EQ(region.xxh3_64(), 0u);
    }
    for (const internal::v1::PlannedTensor& tensor : hashed.tensors()) {
      EXPECT_NE(tensor.tensor().xxh3_64(), 0u) << tensor.tensor().spec().name();
    }
  }
}

// The lease rules of the proto, over gRPC: ttl 1 s..600 s, 30 s when unset (zero, negative,
// out-of-range and malformed Durations refused), renewals of unknown leases NOT_FOUND, releases
// of unknown ones OK, and read plans only for the leased version, never converting.
TEST_F(WeightStoreServiceTest, LeaseRulesHoldOverGrpc) {
  ASSERT_TRUE(Publish(transfer::MakeTestAdapter("job-1", 1, 75), /*by_ucx=*/true).ok());
  ASSERT_TRUE(Publish(transfer::MakeTestAdapter("job-1", 2, 76), /*by_ucx=*/true).ok());
  // A Duration of (seconds, nanos), or none.
  using Ttl = std::optional<std::pair<int64_t, int32_t>>;
  const auto set_ttl = [](const Ttl& ttl, auto& request) {
    if (!ttl.has_value()) return;
    request.mutable_ttl()->set_seconds(ttl->first);
    request.mutable_ttl()->set_nanos(ttl->second);
  };
  const auto acquire = [&](const Ttl& ttl, weightstore::v1::AcquireLeaseResponse* response) {
    grpc::ClientContext context;
    weightstore::v1::AcquireLeaseRequest request;
    request.set_adapter_name("job-1");
    request.set_version(1);
    request.set_holder("replica-0");
    set_ttl(ttl, request);
    return stub_->AcquireLease(&context, request, response);
  };
  const auto renew = [&](const std::string& lease_id, const Ttl& ttl,
                         weightstore::v1::RenewLeaseResponse* response) {
    grpc::ClientContext context;
    weightstore::v1::RenewLeaseRequest request;
    request.set_lease_id(lease_id);
    set_ttl(ttl, request);
    return stub_->RenewLease(&context, request, response);
  };
  const auto seconds_left = [](const google::protobuf::Timestamp& expire_time) {
    return absl::ToDoubleSeconds(absl::FromUnixSeconds(expire_time.seconds()) - absl::Now());
  };
  weightstore::v1::AcquireLeaseResponse lease;
  ASSERT_TRUE(acquire(std::nullopt, &lease).ok());  // The default, 30 s.
  EXPECT_NEAR(seconds_left(lease.expire_time()), 30, 2);
  weightstore::v1::RenewLeaseResponse renewed;
  ASSERT_TRUE(renew(lease.lease_id(), std::pair{600, 0}, &renewed).ok());
  EXPECT_NEAR(seconds_left(renewed.expire_time()), 600, 2);
  for (const Ttl& bad :
       std::vector<Ttl>{std::pair{0, 0}, std::pair{0, 500000000}, std::pair{600, 1},
                        std::pair{-1, 0}, std::pair{5, -1}, std::pair{0, 2000000000}}) {
    SCOPED_TRACE(absl::StrCat(bad->first, "s ", bad->second, "ns"));
    weightstore::v1::AcquireLeaseResponse refused;
    const grpc::Status status = acquire(bad, &refused);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("ttl"));
    EXPECT_EQ(renew(lease.lease_id(), bad, &renewed).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  {  // The holder is kept with the lease: its size is bounded.
    grpc::ClientContext context;
    weightstore::v1::AcquireLeaseRequest request;
    request.set_adapter_name("job-1");
    request.set_version(1);
    request.set_holder(std::string(257, 'h'));
    weightstore::v1::AcquireLeaseResponse refused;
    const grpc::Status status = stub_->AcquireLease(&context, request, &refused);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("holder has 257 bytes; at most 256"));
  }
  EXPECT_EQ(renew("lease-unknown", std::pair{30, 0}, &renewed).error_code(),
            grpc::StatusCode::NOT_FOUND);
  {
    grpc::ClientContext context;
    weightstore::v1::ReleaseLeaseRequest request;
    request.set_lease_id("lease-unknown");
    weightstore::v1::ReleaseLeaseResponse response;
    EXPECT_TRUE(stub_->ReleaseLease(&context, request, &response).ok());
  }
  const auto plan = [&](int64_t version, type::v1::Dtype dtype) {
    grpc::ClientContext context;
    internal::v1::GetReadPlanRequest request;
    request.set_adapter_name("job-1");
    request.set_version(version);
    request.set_lease_id(lease.lease_id());
    request.mutable_target()->set_dtype(dtype);
    internal::v1::GetReadPlanResponse response;
    return ucx_stub_->GetReadPlan(&context, request, &response);
  };
  EXPECT_TRUE(plan(1, type::v1::DTYPE_UNSPECIFIED).ok());
  {  // A tensor name no tensor can have is refused by its size, not echoed back.
    grpc::ClientContext context;
    internal::v1::GetReadPlanRequest request;
    request.set_adapter_name("job-1");
    request.set_version(1);
    request.set_lease_id(lease.lease_id());
    request.mutable_target();
    request.add_tensor_names(std::string(1 << 20, 'n'));
    internal::v1::GetReadPlanResponse response;
    const grpc::Status status = ucx_stub_->GetReadPlan(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_LT(status.error_message().size(), 1024u);
    EXPECT_THAT(status.error_message(),
                HasSubstr("tensor_names[0] has 1048576 bytes; at most 512"));
  }
  EXPECT_EQ(plan(2, type::v1::DTYPE_UNSPECIFIED).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(plan(1, type::v1::DTYPE_F32).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// The streams' rules of the proto, over gRPC: chunk sizes both ways, one upload per PutShard
// stream, aborts of committed and unknown uploads, unknown tensor names, and manifests by
// minimum version.
TEST_F(WeightStoreServiceTest, StreamAndUploadRulesHoldOverGrpc) {
  const transfer::TestAdapter adapter = transfer::MakeTestAdapter("job-1", 1, 77);
  weightstore::v1::BeginPublishResponse begun, other;
  ASSERT_TRUE(Begin(adapter.manifest, &begun).ok());
  EXPECT_EQ(Put(begun.upload_id(), 0, 0, "").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Put(begun.upload_id(), 0, 0, std::string((4 << 20) + 1, 'x')).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(Begin(transfer::MakeTestAdapter("job-2", 1, 78).manifest, &other).ok());
  {
    grpc::ClientContext context;
    weightstore::v1::PutShardResponse response;
    auto writer = stub_->PutShard(&context, &response);
    weightstore::v1::PutShardRequest chunk;
    chunk.set_upload_id(begun.upload_id());
    chunk.set_data("a");
    writer->Write(chunk);
    chunk.set_upload_id(other.upload_id());
    writer->Write(chunk);
    writer->WritesDone();
    const grpc::Status status = writer->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("this stream writes"));
  }
  for (size_t i = 0; i < adapter.shards.size(); ++i) {
    ASSERT_TRUE(Put(begun.upload_id(), i, 0, adapter.shards[i]).ok());
  }
  ASSERT_TRUE(Commit(begun.upload_id()).ok());
  const auto abort = [&](const std::string& upload_id) {
    grpc::ClientContext context;
    weightstore::v1::AbortPublishRequest request;
    request.set_upload_id(upload_id);
    weightstore::v1::AbortPublishResponse response;
    return stub_->AbortPublish(&context, request, &response);
  };
  const grpc::Status committed = abort(begun.upload_id());
  EXPECT_EQ(committed.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(committed.error_message(), HasSubstr("is committed"));
  EXPECT_TRUE(abort("upload-unknown").ok());
  EXPECT_TRUE(abort(other.upload_id()).ok());
  EXPECT_TRUE(abort(other.upload_id()).ok());  // Already aborted.

  const auto fetch = [&](uint64_t max_chunk_bytes, const std::string& name) {
    grpc::ClientContext context;
    weightstore::v1::FetchTensorsRequest request;
    request.set_adapter_name("job-1");
    request.set_version(1);
    request.mutable_target();
    request.set_max_chunk_bytes(max_chunk_bytes);
    if (!name.empty()) request.add_tensor_names(name);
    auto reader = stub_->FetchTensors(&context, request);
    weightstore::v1::FetchTensorsResponse chunk;
    size_t largest = 0;
    while (reader->Read(&chunk)) largest = std::max(largest, chunk.data().size());
    return std::make_pair(reader->Finish(), largest);
  };
  for (uint64_t bad : {uint64_t{(1 << 20) - 1}, uint64_t{(4 << 20) + 1}}) {
    EXPECT_EQ(fetch(bad, "").first.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad;
  }
  const auto [fetched, largest] = fetch(1 << 20, "");
  ASSERT_TRUE(fetched.ok()) << fetched.error_message();
  EXPECT_LE(largest, size_t{1} << 20);
  EXPECT_EQ(fetch(0, "no.such.tensor").first.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  const auto manifest_at_least = [&](int64_t min_version,
                                     weightstore::v1::GetManifestResponse* response) {
    grpc::ClientContext context;
    weightstore::v1::GetManifestRequest request;
    request.mutable_adapter()->set_adapter_name("job-1");
    request.mutable_adapter()->set_min_version(min_version);
    return stub_->GetManifest(&context, request, response);
  };
  weightstore::v1::GetManifestResponse manifest;
  ASSERT_TRUE(manifest_at_least(1, &manifest).ok());
  EXPECT_EQ(manifest.manifest().version(), 1);
  EXPECT_TRUE(manifest.manifest().has_commit_time());
  EXPECT_EQ(manifest_at_least(2, &manifest).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(WeightStoreServiceTest, WatchSendsTheNewestThenEveryCommit) {
  ASSERT_TRUE(Publish(transfer::MakeTestAdapter("job-1", 1, 14), false).ok());
  ExpectSnapshotThenCommit(transfer::MakeTestAdapter("job-1", 2, 15), /*snapshot_version=*/1);
}

// An adapter with no version yet is watched from a version-0 snapshot.
TEST_F(WeightStoreServiceTest, WatchingAnAdapterWithNoVersionStartsAtVersionZero) {
  ExpectSnapshotThenCommit(transfer::MakeTestAdapter("job-new", 1, 79), /*snapshot_version=*/0);
}

// What a watcher learns of a name: version 0 and no open upload is a name the store does not
// know; an open upload makes it known before its first commit.
TEST_F(WeightStoreServiceTest, TheSnapshotSaysWhetherAnUploadIsOpen) {
  const auto snapshot_of = [&](const std::string& adapter) {
    grpc::ClientContext context;
    weightstore::v1::WatchVersionsRequest request;
    request.set_adapter_name(adapter);
    auto reader = stub_->WatchVersions(&context, request);
    weightstore::v1::WatchVersionsResponse event;
    EXPECT_TRUE(reader->Read(&event));
    context.TryCancel();
    while (reader->Read(&event)) {
    }
    reader->Finish();
    return event;
  };
  const transfer::TestAdapter first = transfer::MakeTestAdapter("job-first", 1, 21);
  weightstore::v1::BeginPublishResponse begun;
  ASSERT_TRUE(Begin(first.manifest, &begun).ok());
  const weightstore::v1::WatchVersionsResponse publishing = snapshot_of("job-first");
  EXPECT_EQ(publishing.version().version(), 0);
  EXPECT_TRUE(publishing.upload_open());
  const weightstore::v1::WatchVersionsResponse unknown = snapshot_of("job-nobody");
  EXPECT_EQ(unknown.version().version(), 0);
  EXPECT_FALSE(unknown.upload_open());
}

// The double-snapshot window: commits land while WatchVersions is between registering its
// watcher and reading the newest version. Version 2's announcement reaches the stream first and
// is its SNAPSHOT. Version 3 is committed and already the newest version when the stream reads
// it, but announced to the stream only after that (a watcher registered before the stream's is
// called first, and holds it). Exactly one SNAPSHOT, then every version once, as COMMITTED.
TEST_F(WeightStoreServiceTest, WatchSendsOneSnapshotWhenCommitsLandAsItStarts) {
  const std::shared_ptr<WatchWindow> window = StartServerHoldingWatches();
  ASSERT_TRUE(CommitInStore(transfer::MakeTestAdapter("job-1", 1, 80)).ok());
  struct Held {
    absl::Notification committed;
    absl::Notification release;
  };
  const auto held = std::make_shared<Held>();
  AdapterStore& store = service_->store_for_testing();
  const int64_t ahead = store.Watch("job-1", [held](const weightstore::v1::VersionInfo& version) {
    if (version.version() != 3) return;
    held->committed.Notify();
    held->release.WaitForNotificationWithTimeout(absl::Seconds(30));
  });

  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  weightstore::v1::WatchVersionsRequest request;
  request.set_adapter_name("job-1");
  auto reader = stub_->WatchVersions(&context, request);
  // No ASSERT until `third` is joined and `ahead` unwatched.
  EXPECT_TRUE(window->entered.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(CommitInStore(transfer::MakeTestAdapter("job-1", 2, 81)).ok());
  std::thread third(
      [&] { EXPECT_TRUE(CommitInStore(transfer::MakeTestAdapter("job-1", 3, 82)).ok()); });
  EXPECT_TRUE(held->committed.WaitForNotificationWithTimeout(absl::Seconds(30)));
  window->leave.Notify();  // The stream reads the newest version: 3, not yet announced to it.
  weightstore::v1::WatchVersionsResponse first;
  weightstore::v1::WatchVersionsResponse second;
  const bool read_two = reader->Read(&first) && reader->Read(&second);
  held->release.Notify();  // Version 3's announcement reaches the stream now.
  third.join();
  store.Unwatch(ahead);

  ASSERT_TRUE(read_two);
  EXPECT_EQ(first.type(), weightstore::v1::VERSION_EVENT_TYPE_SNAPSHOT);
  EXPECT_EQ(first.version().version(), 2);
  EXPECT_EQ(second.type(), weightstore::v1::VERSION_EVENT_TYPE_COMMITTED);
  EXPECT_EQ(second.version().version(), 3);
  // Version 3, announced again, is not sent again: the next event is version 4.
  ASSERT_TRUE(CommitInStore(transfer::MakeTestAdapter("job-1", 4, 83)).ok());
  weightstore::v1::WatchVersionsResponse next;
  ASSERT_TRUE(reader->Read(&next));
  EXPECT_EQ(next.type(), weightstore::v1::VERSION_EVENT_TYPE_COMMITTED);
  EXPECT_EQ(next.version().version(), 4);
  context.TryCancel();
  while (reader->Read(&next)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

// A version committed in the window reaches the stream both as an announcement and as the
// newest version: it is sent once, as the SNAPSHOT.
TEST_F(WeightStoreServiceTest, WatchSendsAVersionCommittedAsItStartsOnce) {
  const std::shared_ptr<WatchWindow> window = StartServerHoldingWatches();
  ASSERT_TRUE(CommitInStore(transfer::MakeTestAdapter("job-1", 1, 84)).ok());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  weightstore::v1::WatchVersionsRequest request;
  request.set_adapter_name("job-1");
  auto reader = stub_->WatchVersions(&context, request);
  const bool entered = window->entered.WaitForNotificationWithTimeout(absl::Seconds(30));
  const absl::Status committed = CommitInStore(transfer::MakeTestAdapter("job-1", 2, 85));
  window->leave.Notify();
  ASSERT_TRUE(entered);
  ASSERT_TRUE(committed.ok()) << committed;
  weightstore::v1::WatchVersionsResponse event;
  ASSERT_TRUE(reader->Read(&event));
  EXPECT_EQ(event.type(), weightstore::v1::VERSION_EVENT_TYPE_SNAPSHOT);
  EXPECT_EQ(event.version().version(), 2);
  ASSERT_TRUE(CommitInStore(transfer::MakeTestAdapter("job-1", 3, 86)).ok());
  ASSERT_TRUE(reader->Read(&event));
  EXPECT_EQ(event.type(), weightstore::v1::VERSION_EVENT_TYPE_COMMITTED);
  EXPECT_EQ(event.version().version(), 3);
  context.TryCancel();
  while (reader->Read(&event)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

// Clients that cancel a watch while commits stream to it: whether a write was in flight at the
// cancel or not, the stream finishes, so a later drain never waits for it.
TEST_F(WeightStoreServiceTest, WatchesCancelledAsCommitsStreamNeverHoldUpTheDrain) {
  int64_t version = 0;
  for (int round = 0; round < 20; ++round) {
    StartServer(/*keep_versions=*/3);
    ASSERT_TRUE(CommitInStore(transfer::MakeTestAdapter("job-1", ++version, 90)).ok());
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    weightstore::v1::WatchVersionsRequest request;
    request.set_adapter_name("job-1");
    auto reader = stub_->WatchVersions(&context, request);
    weightstore::v1::WatchVersionsResponse event;
    ASSERT_TRUE(reader->Read(&event));
    std::thread commits([&, first = version + 1] {
      for (int64_t v = first; v < first + 20; ++v) {
        EXPECT_TRUE(CommitInStore(transfer::MakeTestAdapter("job-1", v, 90)).ok());
      }
    });
    for (int i = 0; i < round % 5 && reader->Read(&event); ++i) {
    }
    context.TryCancel();
    commits.join();
    version += 20;
    while (reader->Read(&event)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
    const absl::Time start = absl::Now();
    server_->Drain();
    EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "round " << round;
  }
}

TEST_F(WeightStoreServiceTest, ADrainEndsWatchStreamsAtOnceTellingClientsToWatchAgain) {
  grpc::ClientContext context;
  weightstore::v1::WatchVersionsRequest request;
  request.set_adapter_name("job-1");
  auto reader = stub_->WatchVersions(&context, request);
  weightstore::v1::WatchVersionsResponse snapshot;
  ASSERT_TRUE(reader->Read(&snapshot));
  // The fixture's drain timeout would cancel the stream (CANCELLED) if the drain waited for it.
  std::thread drain([this] { server_->Drain(); });
  weightstore::v1::WatchVersionsResponse more;
  while (reader->Read(&more)) {
  }
  const grpc::Status status = reader->Finish();
  drain.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("watch again"));
}

// A reader registering its layout gets with every announcement a lease taken for it and the
// read plan of its layout: it fetches at once, the bytes those of a plain fetch, and gives the
// lease back when done.
TEST_F(WeightStoreServiceTest, WatchReadPlansPushesALeaseAndAPlanWithEveryVersion) {
  const transfer::TestAdapter first = transfer::MakeTestAdapter("job-1", 1, 21);
  ASSERT_TRUE(Publish(first, /*by_ucx=*/true).ok());
  grpc::ClientContext context;
  auto reader = ucx_stub_->WatchReadPlans(&context, PlansRequest());
  AdapterFetcher fetcher(*stubs_);
  const FetchOptions options{.target = Stacked(), .ucx = client_ucx_.get()};
  for (const transfer::TestAdapter& adapter : {first, transfer::MakeTestAdapter("job-1", 2, 22)}) {
    const int64_t version = adapter.manifest.version();
    if (version == 2) ASSERT_TRUE(Publish(adapter, /*by_ucx=*/true).ok());
    internal::v1::WatchReadPlansResponse announced;
    ASSERT_TRUE(reader->Read(&announced));
    EXPECT_EQ(announced.announcement().type(), version == 1
                                                   ? weightstore::v1::VERSION_EVENT_TYPE_SNAPSHOT
                                                   : weightstore::v1::VERSION_EVENT_TYPE_COMMITTED);
    EXPECT_EQ(announced.announcement().version().version(), version);
    ASSERT_FALSE(announced.lease_id().empty());
    ASSERT_TRUE(announced.has_plan());
    EXPECT_TRUE(announced.plan().verify_shards());
    FetchedAdapter fetched;
    ASSERT_TRUE(fetcher.FetchAnnounced("job-1", announced, options, fetched).ok());
    EXPECT_TRUE(fetched.by_ucx);
    ExpectCanonical(adapter, fetched);
    ExpectLeaseEnds(announced.lease_id(), version);
  }
  context.TryCancel();
}

// A reader too slow for the commits (its stream's window 1 KiB) skips to the newest version:
// the store gives back the leases of the announcements it never sent, so once the reader has
// released the ones it got and gone, no lease is left.
TEST_F(WeightStoreServiceTest, ASlowReaderSkipsVersionsAndTheirLeasesAreGivenBack) {
  grpc::ChannelArguments arguments;
  arguments.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 1024);
  arguments.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  const auto narrow = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                                grpc::InsecureChannelCredentials(), arguments);
  auto stub = internal::v1::WeightStoreUcxService::NewStub(narrow);
  grpc::ClientContext context;
  auto reader = stub->WatchReadPlans(&context, PlansRequest());
  internal::v1::WatchReadPlansResponse announced;
  ASSERT_TRUE(reader->Read(&announced));  // The snapshot: version 0, nothing leased.
  constexpr int kVersions = 12;
  for (int version = 1; version <= kVersions; ++version) {
    ASSERT_TRUE(CommitInStore(transfer::MakeTestAdapter("job-1", version, 30 + version)).ok());
  }
  std::vector<int64_t> received;
  while (received.empty() || received.back() < kVersions) {
    ASSERT_TRUE(reader->Read(&announced));
    received.push_back(announced.announcement().version().version());
    grpc::ClientContext release_context;
    weightstore::v1::ReleaseLeaseRequest release;
    release.set_lease_id(announced.lease_id());
    weightstore::v1::ReleaseLeaseResponse released;
    ASSERT_TRUE(stub_->ReleaseLease(&release_context, release, &released).ok());
  }
  std::printf("a slow reader got versions %s of 1..%d\n", absl::StrJoin(received, ",").c_str(),
              kVersions);
  EXPECT_LT(received.size(), static_cast<size_t>(kVersions));  // It skipped some.
  context.TryCancel();
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (service_->store_for_testing().totals().leases > 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(service_->store_for_testing().totals().leases, 0);
}

// An announcement fetched after its lease ended (lease_ttl 1 s) is fetched the usual way.
TEST_F(WeightStoreServiceTest, AnAnnouncementOutlivingItsLeaseIsFetchedTheUsualWay) {
  const transfer::TestAdapter adapter = transfer::MakeTestAdapter("job-1", 1, 23);
  ASSERT_TRUE(Publish(adapter, /*by_ucx=*/true).ok());
  internal::v1::WatchReadPlansRequest request = PlansRequest();
  request.mutable_lease_ttl()->set_seconds(1);
  grpc::ClientContext context;
  auto reader = ucx_stub_->WatchReadPlans(&context, request);
  internal::v1::WatchReadPlansResponse announced;
  ASSERT_TRUE(reader->Read(&announced));
  ASSERT_FALSE(announced.lease_id().empty());
  absl::SleepFor(absl::Milliseconds(1500));
  ExpectLeaseEnds(announced.lease_id(), 1);  // Expired on its own.
  AdapterFetcher fetcher(*stubs_);
  FetchedAdapter fetched;
  ASSERT_TRUE(fetcher
                  .FetchAnnounced("job-1", announced,
                                  {.target = Stacked(), .ucx = client_ucx_.get()}, fetched)
                  .ok());
  ExpectCanonical(adapter, fetched);
  context.TryCancel();
}

TEST_F(WeightStoreServiceTest, WatchReadPlansRefusesRequestsNoAnnouncementCouldServe) {
  const auto refused = [&](const internal::v1::WatchReadPlansRequest& request) {
    grpc::ClientContext context;
    auto reader = ucx_stub_->WatchReadPlans(&context, request);
    internal::v1::WatchReadPlansResponse ignored;
    EXPECT_FALSE(reader->Read(&ignored));
    return reader->Finish();
  };
  internal::v1::WatchReadPlansRequest no_holder = PlansRequest();
  no_holder.clear_holder();
  internal::v1::WatchReadPlansRequest no_target = PlansRequest();
  no_target.clear_target();
  internal::v1::WatchReadPlansRequest converting = PlansRequest();
  converting.mutable_target()->set_dtype(type::v1::DTYPE_BF16);
  internal::v1::WatchReadPlansRequest long_lease = PlansRequest();
  long_lease.mutable_lease_ttl()->set_seconds(601);
  internal::v1::WatchReadPlansRequest bad_name = PlansRequest();
  bad_name.set_adapter_name("");
  for (const auto& [request, message] :
       std::vector<std::pair<internal::v1::WatchReadPlansRequest, std::string>>{
           {no_holder, "holder is required"},
           {no_target, "target is required"},
           {converting, "leave target.dtype unset"},
           {long_lease, "lease_ttl is 10m1s"},
           {bad_name, "adapter_name"}}) {
    const grpc::Status status = refused(request);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << message;
    EXPECT_THAT(status.error_message(), HasSubstr(message));
  }
}

TEST_F(WeightStoreServiceTest, ADrainEndsReadPlanWatchesTellingClientsToWatchAgain) {
  grpc::ClientContext context;
  auto reader = ucx_stub_->WatchReadPlans(&context, PlansRequest());
  internal::v1::WatchReadPlansResponse snapshot;
  ASSERT_TRUE(reader->Read(&snapshot));
  EXPECT_EQ(snapshot.announcement().version().version(), 0);
  EXPECT_TRUE(snapshot.lease_id().empty());  // Nothing to lease yet.
  std::thread drain([this] { server_->Drain(); });
  internal::v1::WatchReadPlansResponse more;
  while (reader->Read(&more)) {
  }
  const grpc::Status status = reader->Finish();
  drain.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("watch again"));
}

TEST_F(WeightStoreServiceTest, CommittedVersionsSurviveARestartAndPartialWritesDoNot) {
  const transfer::TestAdapter adapter = transfer::MakeTestAdapter("team/job:1", 5, 16);
  ASSERT_TRUE(Publish(adapter, true).ok());
  weightstore::v1::BeginPublishResponse begun;
  ASSERT_TRUE(Begin(transfer::MakeTestAdapter("team/job:1", 6, 17).manifest, &begun).ok());
  std::filesystem::create_directories(data_dir_ + "/team%2Fjob%3A1/7.partial");
  StartServer();
  absl::StatusOr<FetchedAdapter> fetched = Fetch("team/job:1", 5, true, Stacked());
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  ExpectCanonical(adapter, *fetched);
  EXPECT_EQ(Commit(begun.upload_id()).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_FALSE(std::filesystem::exists(data_dir_ + "/team%2Fjob%3A1/7.partial"));
  grpc::ClientContext context;
  weightstore::v1::GetManifestRequest request;
  request.mutable_adapter()->set_adapter_name("team/job:1");
  weightstore::v1::GetManifestResponse manifest;
  ASSERT_TRUE(stub_->GetManifest(&context, request, &manifest).ok());
  EXPECT_EQ(manifest.manifest().version(), 5);
  EXPECT_TRUE(manifest.manifest().has_commit_time());

  auto page = tandem::testing::HttpGet(
      absl::StrCat("http://127.0.0.1:", server_->metrics_port(), "/metrics"));
  ASSERT_TRUE(page.ok());
  for (const char* series :
       {"tandem_weight_store_bytes_out_total{transport=\"ucx\"}", "tandem_weight_store_versions",
        "tandem_weight_store_held_bytes", "tandem_weight_store_active_leases",
        "tandem_weight_store_publish_seconds_bucket", "tandem_weight_store_fetch_seconds_bucket"}) {
    EXPECT_THAT(*page, HasSubstr(series));
  }
}

}  // namespace
}  // namespace tandem::weight_store
