// The rollout service through gRPC on loopback, with a real weight-store (UCX over tcp) and a
// real router-replay: samples equal the engine's own, versions per sample, hot-swap under load
// without torn outputs, routes stored equal the engine's capture, cancellation frees the KV
// cache, admission control, readiness, and every bad request.
#include "services/rollout/rollout_service.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/channel.h"
#include "common/health_client.h"
#include "common/process_status.h"
#include "common/server.h"
#include "common/status.h"
#include "common/testing/error_details.h"
#include "common/testing/simulated_clock.h"
#include "common/testing/test_dir.h"
#include "common/testing/test_server.h"
#include "engine/cpu_model_ops.h"
#include "engine/cuda/device_engines.h"
#include "engine/generator.h"
#include "engine/sampler.h"
#include "engine/sft.h"
#include "engine/tokenizer.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/client_interceptor.h"
#include "gtest/gtest.h"
#include "services/rollout/client/version_swap.h"
#include "services/rollout/rollout_metrics.h"
#include "services/rollout/rollout_testing.h"
#include "services/router_replay/client/replay_fetch.h"
#include "services/router_replay/client/testing/router_replay_server.h"
#include "services/weight_store/client/adapter_client.h"
#include "services/weight_store/client/engine_lora.h"
#include "services/weight_store/client/testing/weight_store_server.h"

namespace tandem::rollout {
namespace {

using ::testing::HasSubstr;

constexpr char kAdapter[] = "policy";

tandem::testing::LoopbackServer Serve(const std::string& name, const std::string& proto_name,
                                      std::unique_ptr<grpc::Service> service,
                                      std::function<bool()> ready = nullptr,
                                      std::function<void()> drain = nullptr) {
  auto server = tandem::testing::StartLoopbackServer(
      name, {proto_name, std::move(service), std::move(ready), std::move(drain)},
      RolloutTestOptions());
  EXPECT_TRUE(server.ok()) << server.status();
  return *std::move(server);
}

// Everything one Generate call streamed, and how it ended.
struct Generated {
  std::vector<rollout::v1::GenerateResponse> samples;
  grpc::Status status;
  std::multimap<grpc::string_ref, grpc::string_ref> trailers;

  // Samples in (prompt, sample) order.
  std::vector<rollout::v1::GenerateResponse> Ordered() const {
    std::vector<rollout::v1::GenerateResponse> ordered = samples;
    std::sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) {
      return std::pair(a.prompt_index(), a.sample_index()) <
             std::pair(b.prompt_index(), b.sample_index());
    });
    return ordered;
  }
};

// One WatchAdapterStatus call of the test's client.
struct StatusStream {
  std::unique_ptr<grpc::ClientContext> context = std::make_unique<grpc::ClientContext>();
  std::unique_ptr<grpc::ClientReader<rollout::v1::WatchAdapterStatusResponse>> reader;

  // `adapter`'s status stream on `stub`, ended by the replica or after 30 s.
  static StatusStream Open(rollout::v1::RolloutService::Stub& stub, const std::string& adapter) {
    StatusStream stream;
    rollout::v1::WatchAdapterStatusRequest request;
    request.set_adapter_name(adapter);
    SetTimeout(*stream.context, absl::Seconds(30));
    stream.reader = stub.WatchAdapterStatus(stream.context.get(), request);
    return stream;
  }
  bool Read(rollout::v1::WatchAdapterStatusResponse& response) { return reader->Read(&response); }
  // Reads what is left; how the replica ended the stream.
  grpc::Status ReadToEnd() {
    rollout::v1::WatchAdapterStatusResponse response;
    while (reader->Read(&response)) {
    }
    return reader->Finish();
  }
  // Ends it from this side.
  void Cancel() {
    context->TryCancel();
    reader->Finish();  // CANCELLED, by us.
  }
};

// The calls a channel made, by method (full name).
class CallCounts {
 public:
  void Add(const std::string& method) {
    absl::MutexLock lock(&mutex_);
    ++calls_[method];
  }
  int operator[](const std::string& method) {
    absl::MutexLock lock(&mutex_);
    return calls_[method];
  }

 private:
  absl::Mutex mutex_;
  std::map<std::string, int> calls_ ABSL_GUARDED_BY(mutex_);
};

// Counts every call of the channel it is installed on into `counts`.
class CallCounting final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit CallCounting(std::shared_ptr<CallCounts> counts) : counts_(std::move(counts)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* info) override {
    counts_->Add(info->method());
    return nullptr;
  }

 private:
  const std::shared_ptr<CallCounts> counts_;
};

class RolloutServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tandem::testing::FreshTestDir("rollout");
    model_config_ = engine::DefaultModelConfig();
    base_ = std::make_unique<engine::BaseModel>(*engine::BaseModel::Create(model_config_, 7));
    ASSERT_TRUE(base_->Save(dir_ + "/base.safetensors").ok());
    serving_base_ = std::make_unique<engine::BaseModel>(base_->RoundedToBf16());

    auto weight_store = weight_store::testing::StartWeightStore(
        {.data_dir = dir_ + "/weights", .keep_versions = 8, .ucx = {.transports = "tcp"}},
        RolloutTestOptions());
    ASSERT_TRUE(weight_store.ok()) << weight_store.status();
    weight_store_ = *std::move(weight_store);
    weight_store_channel_ = weight_store_.Channel();
    weight_store_stub_ = std::make_unique<weight_store::WeightStoreStubs>(weight_store_channel_);

    auto router_replay =
        router_replay::testing::NewRouterReplayService({.store = {.path = dir_ + "/routes"}});
    ASSERT_TRUE(router_replay.ok()) << router_replay.status();
    router_replay_ = Serve("router-replay", "tandem.routerreplay.v1.RouterReplayService",
                           *std::move(router_replay));
    router_replay_channel_ = router_replay_.Channel();
  }

  void TearDown() override {
    rollout_.server.reset();
    rollout_service_ = nullptr;
  }

  RolloutOptions DefaultOptions() {
    RolloutOptions options;
    options.base_model_path = dir_ + "/base.safetensors";
    options.weight_store = weight_store_channel_;
    options.router_replay = router_replay_channel_;
    options.ucx.transports = "tcp";
    options.registry.initial_backoff = absl::Milliseconds(20);
    options.registry.max_backoff = absl::Milliseconds(200);
    return options;
  }

  void StartRollout(RolloutOptions options) {
    rollout_.server.reset();
    auto replica = RolloutReplica::Create(std::move(options));
    ASSERT_TRUE(replica.ok()) << replica.status();
    auto service = std::make_unique<RolloutServiceImpl>(*std::move(replica));
    rollout_service_ = service.get();
    rollout_ = Serve(
        "rollout", "tandem.rollout.v1.RolloutService", std::move(service),
        [raw = rollout_service_] { return raw->Ready(); },
        [raw = rollout_service_] { raw->Drain(); });
    rollout_channel_ = rollout_.Channel();
    rollout_stub_ = rollout::v1::RolloutService::NewStub(rollout_channel_);
  }

  // A replica started with --adapter=kAdapter, once it serves version 1 of it.
  void StartFollowingVersionOne() {
    Publish(1);
    RolloutOptions options = DefaultOptions();
    options.adapters = {kAdapter};
    StartRollout(options);
    AwaitCurrentVersion(1);
  }

  // A random adapter, published as `version` of `name`.
  engine::LoraAdapter Publish(int64_t version, const std::string& name = kAdapter) {
    engine::LoraAdapter adapter = RandomAdapter(model_config_, 100 + version);
    const absl::Status published =
        PublishEngineAdapter(*weight_store_stub_, adapter, model_config_, name, version);
    EXPECT_TRUE(published.ok()) << published;
    return adapter;
  }

  static rollout::v1::GenerateRequest Request(const std::string& id, int prompts, int group_size,
                                              int max_new_tokens, uint64_t seed = 11) {
    rollout::v1::GenerateRequest request;
    request.set_request_id(id);
    for (int p = 0; p < prompts; ++p) {
      rollout::v1::TokenIds& ids = *request.add_prompts()->mutable_token_ids();
      ids.add_ids(engine::kBosId);
      for (int t = 0; t < 3 + p % 4; ++t) ids.add_ids(3 + (p * 7 + t * 3) % 40);
    }
    request.set_group_size(group_size);
    request.mutable_sampling()->set_max_new_tokens(max_new_tokens);
    request.mutable_sampling()->set_seed(seed);
    request.mutable_sampling()->set_temperature(1.0f);
    return request;
  }

  Generated Generate(const rollout::v1::GenerateRequest& request,
                     absl::Duration timeout = absl::Seconds(60)) {
    grpc::ClientContext context;
    SetTimeout(context, timeout);
    auto reader = rollout_stub_->Generate(&context, request);
    Generated generated;
    rollout::v1::GenerateResponse response;
    while (reader->Read(&response)) generated.samples.push_back(response);
    generated.status = reader->Finish();
    generated.trailers = context.GetServerTrailingMetadata();
    return generated;
  }

  // What the engine alone generates for sample (prompt, j) of `request` on `adapter` (null:
  // the base model), in the rollout's bf16 precision.
  engine::GeneratedSample EngineSample(const rollout::v1::GenerateRequest& request, int prompt,
                                       int j, const engine::LoraAdapter* adapter) {
    std::optional<engine::LoraAdapter> rounded;
    if (adapter != nullptr) rounded.emplace(adapter->RoundedToBf16());
    engine::Transformer transformer(*serving_base_, rounded ? &*rounded : nullptr,
                                    std::make_unique<engine::CpuModelOps>(serving_base_->config()),
                                    engine::Precision::kBF16);
    engine::GenerationRequest sample;
    sample.prompt.assign(request.prompts(prompt).token_ids().ids().begin(),
                         request.prompts(prompt).token_ids().ids().end());
    sample.max_new_tokens = request.sampling().max_new_tokens();
    sample.sampling.temperature = request.sampling().temperature();
    sample.seed = engine::MixSeed(engine::MixSeed(request.sampling().seed(), prompt), j);
    sample.stop_tokens = {engine::kEosId};
    return std::move((*engine::Generate(transformer, {sample}))[0]);
  }

  // The mean |difference| between a returned sample's log-probs and those the engine gives its
  // tokens decoded one by one, token t by version versions[t] over the one cache (as the rollout
  // switches a sequence's version): bf16 noise when every token came from the version named
  // (mostly 0, at most 0.02 seen), several times more otherwise (0.04 to 0.3 per sample).
  float LogprobError(
      const rollout::v1::GenerateRequest& request, const rollout::v1::GenerateResponse& sample,
      const std::vector<int64_t>& versions,
      const absl::flat_hash_map<int64_t, std::unique_ptr<engine::Transformer>>& transformers) {
    const engine::ModelConfig& config = serving_base_->config();
    const auto& ids = request.prompts(sample.prompt_index()).token_ids().ids();
    const std::vector<int> prompt(ids.begin(), ids.end());
    const int rows = static_cast<int>(prompt.size());
    engine::Transformer& first = *transformers.at(versions[0]);
    absl::StatusOr<std::unique_ptr<engine::SequenceCache>> cache =
        first.NewCache(rows + sample.token_ids_size());
    EXPECT_TRUE(cache.ok()) << cache.status();
    if (!cache.ok()) return INFINITY;
    std::vector<float> logits(config.vocab_size);
    std::vector<int16_t> routes(static_cast<size_t>(rows) * config.num_layers * config.top_k);
    EXPECT_TRUE(first
                    .Prefill({{.tokens = prompt.data(), .length = rows, .cache = cache->get()}},
                             logits.data(), routes.data())
                    .ok());
    const float* next = logits.data();
    float error = 0;
    for (int t = 0; t < sample.token_ids_size(); ++t) {
      if (t > 0) {
        const int token = sample.token_ids(t - 1), position = rows + t - 1;
        EXPECT_TRUE(transformers.at(versions[t])
                        ->Decode(&token, &position, {cache->get()}, logits.data(), routes.data())
                        .ok());
        next = logits.data();
      }
      const float logprob = LogSoftmaxAt(next, config.vocab_size, request.sampling().temperature(),
                                         sample.token_ids(t));
      error += std::abs(logprob - sample.logprobs(t));
    }
    return error / sample.token_ids_size();
  }

  // log softmax(logits / temperature)[token].
  static float LogSoftmaxAt(const float* logits, int vocab, float temperature, int token) {
    const float top = *std::max_element(logits, logits + vocab) / temperature;
    double sum = 0;
    for (int i = 0; i < vocab; ++i) sum += std::exp(logits[i] / temperature - top);
    return logits[token] / temperature - top - static_cast<float>(std::log(sum));
  }

  static std::vector<int> Tokens(const rollout::v1::GenerateResponse& response) {
    return {response.token_ids().begin(), response.token_ids().end()};
  }

  static std::vector<int> GeneratedTokens(const engine::GeneratedSample& sample) {
    return {sample.tokens.begin() + sample.prompt_length, sample.tokens.end()};
  }

  // Waits until the rollout's current version of kAdapter is `version`, as its status stream
  // tells.
  // A channel to the weight-store that counts the calls made on it into `calls`.
  std::shared_ptr<grpc::Channel> StoreChannelCounting(std::shared_ptr<CallCounts> calls) {
    std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> counting;
    counting.push_back(std::make_unique<CallCounting>(std::move(calls)));
    return grpc::experimental::CreateCustomChannelWithInterceptors(
        weight_store_.target(), grpc::InsecureChannelCredentials(), grpc::ChannelArguments(),
        std::move(counting));
  }

  // On the fixture's replica, or on the one `stub` reaches.
  void AwaitCurrentVersion(int64_t version, rollout::v1::RolloutService::Stub* stub = nullptr) {
    StatusStream stream = StatusStream::Open(stub != nullptr ? *stub : *rollout_stub_, kAdapter);
    rollout::v1::WatchAdapterStatusResponse response;
    while (stream.Read(response)) {
      if (response.status().current_version() == version) {
        stream.Cancel();
        return;
      }
    }
    FAIL() << "version " << version
           << " never became current: " << stream.ReadToEnd().error_message();
  }

  std::string dir_;
  engine::ModelConfig model_config_;
  std::unique_ptr<engine::BaseModel> base_, serving_base_;
  tandem::testing::LoopbackServer weight_store_, router_replay_, rollout_;
  std::shared_ptr<grpc::Channel> weight_store_channel_, router_replay_channel_, rollout_channel_;
  std::unique_ptr<weight_store::WeightStoreStubs> weight_store_stub_;
  std::unique_ptr<rollout::v1::RolloutService::Stub> rollout_stub_;
  RolloutServiceImpl* rollout_service_ = nullptr;
  tandem::testing::SimulatedClock clock_;  // A registry's, where a test gives it.
};

TEST_F(RolloutServiceTest, SameSeedGivesSameSamplesEqualToTheEngineAlone) {
  StartRollout(DefaultOptions());
  const rollout::v1::GenerateRequest request = Request("r1", 3, 4, 12);
  const Generated first = Generate(request);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  ASSERT_EQ(first.samples.size(), 12u);
  rollout::v1::GenerateRequest again = request;
  again.set_request_id("r2");
  const Generated second = Generate(again);
  ASSERT_TRUE(second.status.ok()) << second.status.error_message();

  const std::vector<rollout::v1::GenerateResponse> a = first.Ordered(), b = second.Ordered();
  for (int i = 0; i < 12; ++i) {
    const int prompt = i / 4, j = i % 4;
    ASSERT_EQ(a[i].prompt_index(), prompt);
    ASSERT_EQ(a[i].sample_index(), j);
    EXPECT_EQ(a[i].request_id(), "r1");
    EXPECT_EQ(Tokens(a[i]), Tokens(b[i]));
    EXPECT_EQ(a[i].prompt_tokens(), request.prompts(prompt).token_ids().ids_size());
    EXPECT_EQ(a[i].logprobs_size(), a[i].token_ids_size());
    EXPECT_EQ(a[i].adapter_version(), 0);
    EXPECT_EQ(a[i].route_status(), rollout::v1::ROUTE_STATUS_NOT_REQUESTED);
    EXPECT_EQ(a[i].token_adapter_versions_size(), 0);
    const engine::GeneratedSample engine = EngineSample(request, prompt, j, nullptr);
    EXPECT_EQ(Tokens(a[i]), GeneratedTokens(engine)) << "sample " << i;
    for (int t = 0; t < a[i].logprobs_size() && t < static_cast<int>(engine.logprobs.size()); ++t) {
      EXPECT_NEAR(a[i].logprobs(t), engine.logprobs[t], 1e-4);
    }
    EXPECT_EQ(a[i].finish_reason(), engine.finish_reason == engine::FinishReason::kStop
                                        ? rollout::v1::FINISH_REASON_STOP
                                        : rollout::v1::FINISH_REASON_LENGTH);
  }
  // Different seeds give different samples.
  rollout::v1::GenerateRequest other = Request("r3", 3, 4, 12, /*seed=*/12);
  EXPECT_NE(Tokens(Generate(other).Ordered()[0]), Tokens(a[0]));
}

TEST_F(RolloutServiceTest, TextPromptsAreTokenizedWithBosAndAnsweredWithText) {
  StartRollout(DefaultOptions());
  rollout::v1::GenerateRequest request = Request("text", 1, 1, 6);
  request.mutable_prompts(0)->set_text("12+34=");
  const Generated generated = Generate(request);
  ASSERT_TRUE(generated.status.ok()) << generated.status.error_message();
  const rollout::v1::GenerateResponse& sample = generated.samples.at(0);
  EXPECT_EQ(sample.prompt_tokens(), 7);  // <bos> + 6 characters.
  EXPECT_EQ(sample.text(), engine::Decode(Tokens(sample)));
}

TEST_F(RolloutServiceTest, RecordedRoutesEqualTheEngineCaptureAndAreSealed) {
  StartRollout(DefaultOptions());
  rollout::v1::GenerateRequest request = Request("routes", 2, 3, 10);
  request.mutable_routes()->set_enabled(true);
  request.mutable_routes()->set_job_id("job-7");
  request.mutable_routes()->set_attempt(2);
  request.mutable_prompts(1)->set_prompt_id("second");
  const Generated generated = Generate(request);
  ASSERT_TRUE(generated.status.ok()) << generated.status.error_message();
  ASSERT_EQ(generated.samples.size(), 6u);

  auto stub = routerreplay::v1::RouterReplayService::NewStub(router_replay_channel_);
  for (const rollout::v1::GenerateResponse& sample : generated.Ordered()) {
    ASSERT_EQ(sample.route_status(), rollout::v1::ROUTE_STATUS_RECORDED) << sample.route_error();
    const int64_t tokens = sample.prompt_tokens() + sample.token_ids_size();
    EXPECT_EQ(sample.route_rows(), tokens - 1);
    EXPECT_EQ(sample.route_key().job_id(), "job-7");
    EXPECT_EQ(sample.route_key().policy_version(), 0);
    EXPECT_EQ(sample.route_key().attempt(), 2);
    EXPECT_EQ(sample.route_key().sample_id(),
              absl::StrCat(sample.prompt_index() == 0 ? "routes.0" : "second", "/",
                           sample.sample_index()));
    const router_replay::RecordKey key{"job-7", 0, sample.route_key().sample_id(), 2};
    auto fetched =
        router_replay::FetchReplayRoutes(*stub, {router_replay::ReplaySequence{key, tokens}},
                                         {.moe_layers = model_config_.MoeLayerIndices(),
                                          .top_k = model_config_.top_k,
                                          .num_experts = model_config_.num_experts});
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    EXPECT_EQ(fetched->statuses[0], routerreplay::v1::RECORD_STATUS_COMPLETE);
    const engine::GeneratedSample engine =
        EngineSample(request, sample.prompt_index(), sample.sample_index(), nullptr);
    ASSERT_EQ(Tokens(sample), GeneratedTokens(engine));
    const size_t row = model_config_.num_moe_layers() * model_config_.top_k;
    EXPECT_EQ(std::vector<int16_t>(fetched->routes.begin(), fetched->routes.end() - row),
              engine.routes);
  }
}

TEST_F(RolloutServiceTest, UnreachableRouterReplayIsReportedPerSampleNeverSilently) {
  RolloutOptions options = DefaultOptions();
  options.router_replay = *CreateChannel(
      {.target = "127.0.0.1:1", .service_name = "tandem.routerreplay.v1.RouterReplayService"});
  options.routes.max_attempts = 1;
  options.routes.rpc_timeout = absl::Milliseconds(300);
  StartRollout(std::move(options));
  rollout::v1::GenerateRequest request = Request("lost", 1, 2, 4);
  request.mutable_routes()->set_enabled(true);
  request.mutable_routes()->set_job_id("job");
  const Generated generated = Generate(request);
  ASSERT_TRUE(generated.status.ok()) << generated.status.error_message();
  ASSERT_EQ(generated.samples.size(), 2u);
  for (const rollout::v1::GenerateResponse& sample : generated.samples) {
    EXPECT_EQ(sample.route_status(), rollout::v1::ROUTE_STATUS_FAILED);
    EXPECT_FALSE(sample.route_error().empty());
    EXPECT_GT(sample.token_ids_size(), 0) << "the sample itself is still returned";
  }
}

// A replica fetching by UCX watches with WatchReadPlans: every version it loads starts from the
// lease and the plan pushed with its announcement, so it never asks for a lease or a plan.
TEST_F(RolloutServiceTest, AReplicaFetchingByUcxLoadsFromPlansPushedWithEachVersion) {
  auto calls = std::make_shared<CallCounts>();
  RolloutOptions options = DefaultOptions();
  options.weight_store = StoreChannelCounting(calls);
  options.adapters = {kAdapter};
  Publish(1);
  StartRollout(options);
  AwaitCurrentVersion(1);
  Publish(2);
  AwaitCurrentVersion(2);
  EXPECT_EQ((*calls)["/tandem.internal.v1.WeightStoreUcxService/WatchReadPlans"], 1);
  EXPECT_EQ((*calls)["/tandem.internal.v1.WeightStoreUcxService/GetReadPlan"], 0);
  EXPECT_EQ((*calls)["/tandem.weightstore.v1.WeightStoreService/AcquireLease"], 0);
  EXPECT_EQ((*calls)["/tandem.weightstore.v1.WeightStoreService/FetchTensors"], 0);
  EXPECT_EQ((*calls)["/tandem.weightstore.v1.WeightStoreService/ReleaseLease"], 2);
}

// A store older than WatchReadPlans (it answers UNIMPLEMENTED), and one without UCX
// (FAILED_PRECONDITION): the replica watches versions and fetches as before.
TEST_F(RolloutServiceTest, AStoreThatPushesNoPlansIsWatchedAsBefore) {
  const weight_store::WeightStoreOptions store_options{
      .data_dir = dir_ + "/weights", .keep_versions = 8, .ucx = {.transports = "tcp"}};
  weight_store::WeightStoreOptions without_ucx = store_options;
  without_ucx.enable_ucx = false;
  for (const bool older : {true, false}) {
    SCOPED_TRACE(older ? "a store without WatchReadPlans" : "a store without UCX");
    weight_store_.server.reset();
    rollout_.server.reset();
    std::filesystem::remove_all(dir_ + "/weights");
    auto store = older ? weight_store::testing::StartWeightStoreWithoutPushedPlans(
                             store_options, RolloutTestOptions())
                       : weight_store::testing::StartWeightStore(without_ucx, RolloutTestOptions());
    ASSERT_TRUE(store.ok()) << store.status();
    weight_store_ = *std::move(store);
    weight_store_channel_ = weight_store_.Channel();
    weight_store_stub_ = std::make_unique<weight_store::WeightStoreStubs>(weight_store_channel_);
    StartFollowingVersionOne();
    Publish(2);
    AwaitCurrentVersion(2);
  }
}

// Replicas in a chain (--relay, --relay_from): the first reads each version from the store and
// relays it as it arrives; the second reads every version from the first, never from the store.
TEST_F(RolloutServiceTest, ReplicasInAChainReadVersionsFromTheReplicaBefore) {
  const auto start = [&](RolloutOptions options) {
    options.adapters = {kAdapter};
    options.relay = true;
    auto replica = RolloutReplica::Create(std::move(options));
    EXPECT_TRUE(replica.ok()) << replica.status();
    auto server = tandem::testing::StartLoopbackServer(
        "rollout", RolloutServices(*std::move(replica)), RolloutTestOptions());
    EXPECT_TRUE(server.ok()) << server.status();
    return *std::move(server);
  };
  const auto relayed = [] {
    return RolloutMetrics::Get().adapter_fetches.Add({{"source", "relay"}}).Value();
  };
  const double relayed_before = relayed();
  Publish(1);
  tandem::testing::LoopbackServer first = start(DefaultOptions());
  auto first_stub = rollout::v1::RolloutService::NewStub(first.Channel());
  AwaitCurrentVersion(1, first_stub.get());
  auto calls = std::make_shared<CallCounts>();
  RolloutOptions second_options = DefaultOptions();
  second_options.weight_store = StoreChannelCounting(calls);
  second_options.relay_from = first.Channel();
  tandem::testing::LoopbackServer second = start(second_options);
  auto second_stub = rollout::v1::RolloutService::NewStub(second.Channel());
  AwaitCurrentVersion(1, second_stub.get());
  Publish(2);
  AwaitCurrentVersion(2, first_stub.get());
  AwaitCurrentVersion(2, second_stub.get());
  EXPECT_EQ((*calls)["/tandem.weightstore.v1.WeightStoreService/FetchTensors"], 0);
  EXPECT_EQ((*calls)["/tandem.internal.v1.WeightStoreUcxService/WatchReadPlans"], 0);
  EXPECT_EQ(relayed() - relayed_before, 2);
  // What the second serves is what the first does: the same samples for the same seed.
  rollout::v1::GenerateRequest request = Request("relayed", 2, 2, 8);
  request.mutable_adapter()->set_adapter_name(kAdapter);
  request.mutable_adapter()->set_exact_version(2);
  const auto samples = [&](rollout::v1::RolloutService::Stub& stub) {
    grpc::ClientContext context;
    auto reader = stub.Generate(&context, request);
    std::map<std::pair<int, int>, std::vector<int>> tokens;
    rollout::v1::GenerateResponse response;
    while (reader->Read(&response)) {
      tokens[{response.prompt_index(), response.sample_index()}].assign(
          response.token_ids().begin(), response.token_ids().end());
    }
    EXPECT_TRUE(reader->Finish().ok());
    return tokens;
  };
  const auto from_first = samples(*first_stub);
  EXPECT_EQ(from_first.size(), 4u);
  EXPECT_EQ(samples(*second_stub), from_first);
}

TEST_F(RolloutServiceTest, AdapterVersionsAreResolvedLoadedAndReported) {
  const engine::LoraAdapter v1_adapter = Publish(1);
  StartRollout(DefaultOptions());
  rollout::v1::GenerateRequest request = Request("latest", 2, 2, 10);
  request.mutable_adapter()->set_adapter_name(kAdapter);
  request.mutable_adapter()->set_latest(true);
  Generated generated = Generate(request);
  ASSERT_TRUE(generated.status.ok()) << generated.status.error_message();
  for (const rollout::v1::GenerateResponse& sample : generated.samples) {
    EXPECT_EQ(sample.adapter_version(), 1);
    EXPECT_EQ(Tokens(sample), GeneratedTokens(EngineSample(request, sample.prompt_index(),
                                                           sample.sample_index(), &v1_adapter)));
  }
  const std::vector<int> base_tokens = GeneratedTokens(EngineSample(request, 0, 0, nullptr));
  EXPECT_NE(Tokens(generated.Ordered()[0]), base_tokens) << "the adapter must change outputs";

  const engine::LoraAdapter v2_adapter = Publish(2);
  AwaitCurrentVersion(2);
  request.set_request_id("latest-2");
  generated = Generate(request);
  ASSERT_TRUE(generated.status.ok());
  EXPECT_EQ(generated.samples[0].adapter_version(), 2);

  request.set_request_id("exact-1");
  request.mutable_adapter()->set_exact_version(1);
  generated = Generate(request);
  ASSERT_TRUE(generated.status.ok()) << generated.status.error_message();
  const rollout::v1::GenerateResponse first = generated.Ordered()[0];
  EXPECT_EQ(first.adapter_version(), 1);
  EXPECT_EQ(Tokens(first), GeneratedTokens(EngineSample(request, 0, 0, &v1_adapter)));

  request.set_request_id("min-3");
  request.mutable_adapter()->set_min_version(3);
  generated = Generate(request, absl::Milliseconds(500));
  EXPECT_EQ(generated.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);

  request.set_request_id("exact-99");
  request.mutable_adapter()->set_exact_version(99);
  generated = Generate(request);
  EXPECT_EQ(generated.status.error_code(), grpc::StatusCode::NOT_FOUND);

  request.set_request_id("unknown");
  request.mutable_adapter()->set_adapter_name("nobody");
  request.mutable_adapter()->set_latest(true);
  generated = Generate(request);
  EXPECT_EQ(generated.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(generated.status.error_message(), HasSubstr("no committed version"));

  rollout::v1::GetAdapterStatusRequest status_request;
  status_request.set_adapter_name(kAdapter);
  rollout::v1::GetAdapterStatusResponse status;
  grpc::ClientContext context;
  ASSERT_TRUE(rollout_stub_->GetAdapterStatus(&context, status_request, &status).ok());
  EXPECT_THAT(status.replica_id(), HasSubstr("rollout-"));
  const rollout::v1::AdapterStatus& adapter = status.adapters(0);
  EXPECT_EQ(adapter.current_version(), 2);
  EXPECT_EQ(adapter.newest_announced_version(), 2);
  EXPECT_EQ(adapter.load_phase(), rollout::v1::LOAD_PHASE_IDLE);
  ASSERT_EQ(adapter.resident_versions_size(), 2);
  EXPECT_EQ(adapter.resident_versions(0).version(), 1);
  EXPECT_EQ(adapter.resident_versions(1).version(), 2);

  status_request.set_adapter_name("never-asked");
  grpc::ClientContext unknown_context;
  EXPECT_EQ(rollout_stub_->GetAdapterStatus(&unknown_context, status_request, &status).error_code(),
            grpc::StatusCode::NOT_FOUND);
  status_request.set_adapter_name("two words");
  grpc::ClientContext bad_context;
  const grpc::Status bad_name =
      rollout_stub_->GetAdapterStatus(&bad_context, status_request, &status);
  EXPECT_EQ(bad_name.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad_name.error_message(), HasSubstr("bad adapter_name: 'two words'"));
}

TEST_F(RolloutServiceTest, HotSwapUnderLoadNeverTearsASample) {
  absl::flat_hash_map<int64_t, engine::LoraAdapter> adapters;
  adapters.emplace(1, Publish(1));
  StartRollout(DefaultOptions());
  rollout::v1::GenerateRequest request = Request("load", 8, 8, 40);
  request.mutable_adapter()->set_adapter_name(kAdapter);
  request.mutable_adapter()->set_latest(true);
  rollout::v1::GenerateRequest switching = request;
  switching.set_request_id("switching");
  switching.set_allow_version_switch(true);

  Generated fixed, partial;
  std::thread fixed_thread([&] { fixed = Generate(request); });
  std::thread switching_thread([&] { partial = Generate(switching); });
  for (int64_t version = 2; version <= 3; ++version) {
    absl::SleepFor(absl::Milliseconds(30));
    adapters.emplace(version, Publish(version));
  }
  fixed_thread.join();
  switching_thread.join();
  ASSERT_TRUE(fixed.status.ok()) << fixed.status.error_message();
  ASSERT_TRUE(partial.status.ok()) << partial.status.error_message();
  ASSERT_EQ(fixed.samples.size(), 64u);
  ASSERT_EQ(partial.samples.size(), 64u);

  // Each sample is scored token by token on the versions it names: token t's log-prob must be
  // what version token_adapter_versions(t) (or, without switching, adapter_version) gives it
  // after the tokens before it. Exact tokens cannot be asked for: batched decoding rounds
  // otherwise than one row at a time (BLAS kernels are not row-invariant), and in bf16 a
  // rounding flip can tip a near-tie. Tokens of another version are off by several times the
  // noise allowed.
  std::map<int64_t, engine::LoraAdapter> rounded;  // Stable addresses for the transformers.
  absl::flat_hash_map<int64_t, std::unique_ptr<engine::Transformer>> transformers;
  for (const auto& [version, adapter] : adapters) {
    rounded.emplace(version, adapter.RoundedToBf16());
    transformers[version] = std::make_unique<engine::Transformer>(
        *serving_base_, &rounded.at(version),
        std::make_unique<engine::CpuModelOps>(serving_base_->config()), engine::Precision::kBF16);
  }
  constexpr float kBf16Noise = 0.03f;  // Mean |log-prob difference| per token.
  float wrong_version_error = 0;
  for (const rollout::v1::GenerateResponse& sample : fixed.samples) {
    ASSERT_TRUE(adapters.contains(sample.adapter_version()));
    const std::vector<int64_t> versions(sample.token_ids_size(), sample.adapter_version());
    EXPECT_LE(LogprobError(request, sample, versions, transformers), kBf16Noise)
        << "sample " << sample.prompt_index() << "/" << sample.sample_index() << " of version "
        << sample.adapter_version();
    const std::vector<int64_t> other(sample.token_ids_size(), sample.adapter_version() % 3 + 1);
    wrong_version_error += LogprobError(request, sample, other, transformers);
  }
  EXPECT_GT(wrong_version_error / fixed.samples.size(), 3 * kBf16Noise)
      << "versions must be told apart by their log-probs";
  // With switching, versions are per token and never go back.
  int switched = 0;
  for (const rollout::v1::GenerateResponse& sample : partial.samples) {
    ASSERT_EQ(sample.token_adapter_versions_size(), sample.token_ids_size());
    EXPECT_EQ(sample.token_adapter_versions(0), sample.adapter_version());
    for (int t = 1; t < sample.token_adapter_versions_size(); ++t) {
      EXPECT_LE(sample.token_adapter_versions(t - 1), sample.token_adapter_versions(t));
    }
    switched +=
        sample.token_adapter_versions(sample.token_ids_size() - 1) != sample.adapter_version();
    const std::vector<int64_t> versions(sample.token_adapter_versions().begin(),
                                        sample.token_adapter_versions().end());
    EXPECT_LE(LogprobError(switching, sample, versions, transformers), kBf16Noise)
        << "sample " << sample.prompt_index() << "/" << sample.sample_index();
  }
  std::printf("%d of 64 samples switched versions mid-sample\n", switched);
}

TEST_F(RolloutServiceTest, CancellingTheCallFreesTheKvCache) {
  StartRollout(DefaultOptions());
  const rollout::v1::GenerateRequest request = Request("cancel", 16, 16, 40);
  {
    grpc::ClientContext context;
    auto reader = rollout_stub_->Generate(&context, request);
    rollout::v1::GenerateResponse response;
    ASSERT_TRUE(reader->Read(&response));
    // The gauge is set at the end of the scheduler's step, which may come after the first
    // sample reached us; 255 samples still run, so it must show their cache.
    for (int i = 0; i < 1000 && RolloutMetrics::Get().kv_cache_used_bytes.Value() == 0; ++i) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    ASSERT_GT(RolloutMetrics::Get().kv_cache_used_bytes.Value(), 0);
    context.TryCancel();
    while (reader->Read(&response)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  for (int i = 0; i < 200 && RolloutMetrics::Get().kv_cache_used_bytes.Value() > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(RolloutMetrics::Get().kv_cache_used_bytes.Value(), 0);
  EXPECT_EQ(RolloutMetrics::Get().batch_occupancy.Value(), 0);
  // The request id is free again, and the replica still serves.
  const Generated after = Generate(Request("cancel", 1, 1, 4));
  EXPECT_TRUE(after.status.ok()) << after.status.error_message();
}

TEST_F(RolloutServiceTest, DrainEndsRunningSamplesEarlyWithWhatTheyHave) {
  RolloutOptions options = DefaultOptions();
  options.scheduler.max_batch_sequences = 64;  // Some samples wait for admission.
  StartRollout(std::move(options));
  rollout::v1::GenerateRequest request = Request("drained", 32, 4, 40);
  request.mutable_routes()->set_enabled(true);
  request.mutable_routes()->set_job_id("drain");
  grpc::ClientContext context;
  auto reader = rollout_stub_->Generate(&context, request);
  rollout::v1::GenerateResponse response;
  ASSERT_TRUE(reader->Read(&response));
  std::thread drain([&] { rollout_.server->Drain(); });
  int received = 1, cancelled = 0, partial = 0;
  while (reader->Read(&response)) {
    ++received;
    if (response.finish_reason() != rollout::v1::FINISH_REASON_CANCELLED) continue;
    ++cancelled;
    partial += response.token_ids_size() > 0;
    EXPECT_EQ(response.logprobs_size(), response.token_ids_size());
    if (response.token_ids_size() > 0) {
      EXPECT_EQ(response.route_status(), rollout::v1::ROUTE_STATUS_RECORDED)
          << response.route_error();
    } else {
      // Never admitted: routes were asked for, none was recorded.
      EXPECT_EQ(response.route_status(), rollout::v1::ROUTE_STATUS_FAILED);
      EXPECT_EQ(response.route_key().job_id(), "drain");
      EXPECT_FALSE(response.route_error().empty());
    }
  }
  const grpc::Status finished = reader->Finish();
  EXPECT_TRUE(finished.ok()) << finished.error_code() << ": " << finished.error_message();
  drain.join();
  EXPECT_EQ(received, 128) << "every sample is answered";
  EXPECT_GT(cancelled, 0);
  EXPECT_GT(partial, 0) << "running samples come back with their tokens so far";
}

TEST_F(RolloutServiceTest, AdmissionControlRejectsWhatCannotFitWithARetryHint) {
  RolloutOptions options = DefaultOptions();
  options.scheduler.kv_cache_bytes = 40 * 2048;  // 40 positions of the default model.
  options.scheduler.max_queued_positions = 200;
  StartRollout(std::move(options));

  Generated too_big = Generate(Request("big", 1, 1, 44));
  EXPECT_EQ(too_big.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(too_big.status.error_message(), HasSubstr("bytes of KV cache"));

  // One request fills the queue and stays queued, waiting for an adapter version that is not
  // published yet; meanwhile another is turned away with pushback.
  Publish(1);
  rollout::v1::GenerateRequest fill = Request("fill", 8, 2, 20);
  fill.mutable_adapter()->set_adapter_name(kAdapter);
  fill.mutable_adapter()->set_min_version(2);
  grpc::ClientContext context;
  SetTimeout(context, absl::Seconds(60));
  auto filling = rollout_stub_->Generate(&context, fill);
  for (int i = 0; i < 400 && RolloutMetrics::Get().queued_tokens.Value() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_GT(RolloutMetrics::Get().queued_tokens.Value(), 0) << "the filling request never queued";
  const Generated rejected = Generate(Request("more", 4, 2, 20));
  ASSERT_EQ(rejected.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(rejected.status.error_message(), HasSubstr("retry in"));
  EXPECT_EQ(rejected.trailers.count("grpc-retry-pushback-ms"), 1u);
  // A selector that can never be valid is INVALID_ARGUMENT even while the queue is full: it is
  // checked before the request queues.
  rollout::v1::GenerateRequest bad_selector = Request("bad", 1, 1, 2);
  bad_selector.mutable_adapter()->set_adapter_name("policy");
  bad_selector.mutable_adapter()->set_exact_version(-2);
  EXPECT_EQ(Generate(bad_selector).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  Publish(2);
  int received = 0;
  rollout::v1::GenerateResponse response;
  while (filling->Read(&response)) ++received;
  EXPECT_TRUE(filling->Finish().ok());
  EXPECT_EQ(received, 16);
  EXPECT_TRUE(Generate(Request("more", 4, 2, 20)).status.ok()) << "room again once it is done";
}

TEST_F(RolloutServiceTest, DuplicateInFlightRequestIdIsRejected) {
  StartRollout(DefaultOptions());
  // The first request stays in flight: it waits for an adapter version not published yet.
  Publish(1);
  rollout::v1::GenerateRequest waiting = Request("same", 2, 2, 8);
  waiting.mutable_adapter()->set_adapter_name(kAdapter);
  waiting.mutable_adapter()->set_min_version(2);
  grpc::ClientContext context;
  SetTimeout(context, absl::Seconds(60));
  auto first = rollout_stub_->Generate(&context, waiting);
  for (int i = 0; i < 400 && RolloutMetrics::Get().queued_tokens.Value() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_GT(RolloutMetrics::Get().queued_tokens.Value(), 0) << "the first request never queued";
  const Generated second = Generate(Request("same", 1, 1, 2));
  EXPECT_EQ(second.status.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(second.status.error_message(), HasSubstr("request same is in flight"));
  Publish(2);
  rollout::v1::GenerateResponse response;
  int received = 0;
  while (first->Read(&response)) ++received;
  EXPECT_TRUE(first->Finish().ok());
  EXPECT_EQ(received, 4);
}

TEST_F(RolloutServiceTest, DeadlineIsHonoured) {
  StartRollout(DefaultOptions());
  const Generated generated = Generate(Request("slow", 64, 32, 40), absl::Milliseconds(100));
  EXPECT_EQ(generated.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  for (int i = 0; i < 200 && RolloutMetrics::Get().kv_cache_used_bytes.Value() > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(RolloutMetrics::Get().kv_cache_used_bytes.Value(), 0);
}

// The device is checked when the service is made: a bad name, a precision the GPU engine does
// not compute in (FP8), and (on a machine without one) a missing GPU each say so.
TEST_F(RolloutServiceTest, AnUnusableDeviceIsRefusedAtStart) {
  RolloutOptions bad_name = DefaultOptions();
  bad_name.device = "gpu0";
  EXPECT_EQ(RolloutReplica::Create(std::move(bad_name)).status().code(),
            absl::StatusCode::kInvalidArgument);
  RolloutOptions fp8_on_gpu = DefaultOptions();
  fp8_on_gpu.device = "cuda";
  fp8_on_gpu.precision = engine::Precision::kFP8;
  EXPECT_EQ(RolloutReplica::Create(std::move(fp8_on_gpu)).status().code(),
            absl::StatusCode::kUnimplemented);
  if (engine::CudaDeviceVisible()) return;
  RolloutOptions no_gpu = DefaultOptions();
  no_gpu.device = "cuda:0";
  no_gpu.precision = engine::Precision::kF32;
  EXPECT_EQ(RolloutReplica::Create(std::move(no_gpu)).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(RolloutServiceTest, BadRequestsGetClearStatuses) {
  StartRollout(DefaultOptions());
  const auto expect_invalid = [&](rollout::v1::GenerateRequest request,
                                  const std::string& message) {
    const Generated generated = Generate(request);
    EXPECT_EQ(generated.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << message;
    EXPECT_THAT(generated.status.error_message(), HasSubstr(message));
  };
  rollout::v1::GenerateRequest request = Request("bad", 2, 1, 4);
  rollout::v1::GenerateRequest bad = request;
  bad.clear_request_id();
  expect_invalid(bad, "request_id");
  bad = request;
  bad.clear_prompts();
  expect_invalid(bad, "prompts has 0 entries");
  bad = request;
  bad.mutable_prompts(1)->mutable_token_ids()->clear_ids();
  expect_invalid(bad, "prompts[1]: empty prompt");
  bad = request;
  bad.mutable_prompts(1)->clear_token_ids();
  expect_invalid(bad, "prompts[1]: set token_ids or text");
  bad = request;
  bad.mutable_prompts(0)->mutable_token_ids()->add_ids(70000);
  expect_invalid(bad, "prompts[0]: token 70000 >= vocab 49");
  bad = request;
  bad.mutable_prompts(0)->set_text("ABC");
  expect_invalid(bad, "prompts[0]");
  bad = request;
  bad.mutable_sampling()->set_max_new_tokens(45);
  expect_invalid(bad, "prompts[0]: 4 + 45 tokens > context 48");
  bad = request;
  bad.mutable_prompts(0)->set_prompt_id(std::string(129, 'p'));  // Routes off: still bounded.
  expect_invalid(bad, "prompts[0]: prompt_id has 129 bytes; at most 128");
  bad = request;
  bad.mutable_sampling()->set_max_new_tokens(0);
  expect_invalid(bad, "max_new_tokens is 0");
  bad = request;
  bad.clear_sampling();
  expect_invalid(bad, "sampling is required");
  bad = request;
  bad.mutable_sampling()->set_temperature(-1);
  expect_invalid(bad, "temperature is -1");
  bad = request;
  bad.mutable_sampling()->set_top_p(0);
  expect_invalid(bad, "top_p is 0");
  bad = request;
  bad.mutable_sampling()->set_top_k(50);
  expect_invalid(bad, "top_k is 50");
  bad = request;
  bad.mutable_sampling()->add_stop_token_ids(-3);
  expect_invalid(bad, "stop_token_ids: -3");
  bad = request;
  bad.set_group_size(300);
  expect_invalid(bad, "group_size is 300");
  bad = request;
  bad.mutable_prompts(0)->set_prompt_id("p");
  bad.mutable_prompts(1)->set_prompt_id("p");
  expect_invalid(bad, "prompt_id 'p' is not unique");
  bad = request;
  bad.mutable_routes()->set_enabled(true);
  expect_invalid(bad, "routes.job_id");
  bad = request;
  bad.mutable_adapter()->set_exact_version(3);
  expect_invalid(bad, "only exact_version 0");
  bad = request;
  bad.mutable_adapter()->set_adapter_name(kAdapter);
  bad.mutable_adapter()->set_min_version(0);
  expect_invalid(bad, "min_version is 0");
  bad = request;
  bad.mutable_adapter()->set_adapter_name(kAdapter);
  bad.mutable_adapter()->set_exact_version(-2);
  expect_invalid(bad, "exact_version is -2");
  bad = request;
  bad.mutable_adapter()->set_adapter_name("../other tenant");
  expect_invalid(bad, "bad adapter.adapter_name");
  bad = request;
  bad.mutable_prompts(0)->set_text("");
  expect_invalid(bad, "prompts[0]: text has 0 bytes");
  bad = request;
  bad.set_request_id("two words");
  expect_invalid(bad, "bad request_id");
}

// Every documented rule of every RPC, as a client built from the protos sees it: INVALID_ARGUMENT
// whose details name the field by its path from the request root (with list indices) and give
// the ErrorInfo reason.
TEST_F(RolloutServiceTest, EveryRuleNamesTheFieldPathAndReasonInItsDetails) {
  RolloutOptions options = DefaultOptions();
  options.scheduler.kv_cache_bytes = 40 * 2048;  // 40 positions of the default model.
  StartRollout(std::move(options));
  using GenerateRequest = rollout::v1::GenerateRequest;
  const GenerateRequest base = Request("rules", 2, 1, 4);  // Prompts of 4, 5 ids.
  const auto generate = [&](const std::function<void(GenerateRequest&)>& edit) {
    return [this, base, edit] {
      GenerateRequest request = base;
      edit(request);
      return Generate(request).status;
    };
  };
  const auto status_of = [&](const std::string& adapter) {
    return [this, adapter] {
      grpc::ClientContext context;
      rollout::v1::GetAdapterStatusRequest request;
      request.set_adapter_name(adapter);
      rollout::v1::GetAdapterStatusResponse response;
      return rollout_stub_->GetAdapterStatus(&context, request, &response);
    };
  };
  const auto watch = [&](const std::string& adapter) {
    return [this, adapter] { return StatusStream::Open(*rollout_stub_, adapter).ReadToEnd(); };
  };
  const std::vector<InvalidArgumentCase> cases = {
      // Generate.
      {"NoRequestId", generate([](GenerateRequest& r) { r.clear_request_id(); }), "request_id"},
      {"BadRequestId", generate([](GenerateRequest& r) { r.set_request_id("two words"); }),
       "request_id"},
      {"NoPrompts", generate([](GenerateRequest& r) { r.clear_prompts(); }), "prompts"},
      {"GroupTooLarge", generate([](GenerateRequest& r) { r.set_group_size(300); }), "group_size"},
      {"NoSampling", generate([](GenerateRequest& r) { r.clear_sampling(); }), "sampling"},
      {"NoMaxNewTokens",
       generate([](GenerateRequest& r) { r.mutable_sampling()->clear_max_new_tokens(); }),
       "sampling.max_new_tokens"},
      {"NegativeTemperature",
       generate([](GenerateRequest& r) { r.mutable_sampling()->set_temperature(-1); }),
       "sampling.temperature"},
      {"ZeroTopP", generate([](GenerateRequest& r) { r.mutable_sampling()->set_top_p(0); }),
       "sampling.top_p"},
      {"TopKBeyondVocabulary",
       generate([](GenerateRequest& r) { r.mutable_sampling()->set_top_k(50); }), "sampling.top_k"},
      {"TooManyStopTokens", generate([](GenerateRequest& r) {
         for (int i = 0; i < 65; ++i) r.mutable_sampling()->add_stop_token_ids(5);
       }),
       "sampling.stop_token_ids"},
      {"StopTokenOutsideVocabulary", generate([](GenerateRequest& r) {
         r.mutable_sampling()->add_stop_token_ids(5);
         r.mutable_sampling()->add_stop_token_ids(-3);
       }),
       "sampling.stop_token_ids[1]"},
      {"BaseModelWithAVersion",
       generate([](GenerateRequest& r) { r.mutable_adapter()->set_exact_version(3); }),
       "adapter.exact_version"},
      {"BaseModelWithAMinVersion",
       generate([](GenerateRequest& r) { r.mutable_adapter()->set_min_version(1); }),
       "adapter.min_version"},
      {"BadAdapterName", generate([](GenerateRequest& r) {
         r.mutable_adapter()->set_adapter_name("../other tenant");
       }),
       "adapter.adapter_name"},
      {"MinVersionZero", generate([](GenerateRequest& r) {
         r.mutable_adapter()->set_adapter_name(kAdapter);
         r.mutable_adapter()->set_min_version(0);
       }),
       "adapter.min_version"},
      {"NegativeExactVersion", generate([](GenerateRequest& r) {
         r.mutable_adapter()->set_adapter_name(kAdapter);
         r.mutable_adapter()->set_exact_version(-2);
       }),
       "adapter.exact_version"},
      {"RoutesWithoutJob",
       generate([](GenerateRequest& r) { r.mutable_routes()->set_enabled(true); }),
       "routes.job_id"},
      {"NegativeRouteAttempt", generate([](GenerateRequest& r) {
         r.mutable_routes()->set_enabled(true);
         r.mutable_routes()->set_job_id("job-1");
         r.mutable_routes()->set_attempt(-1);
       }),
       "routes.attempt"},
      {"PromptWithoutContent",
       generate([](GenerateRequest& r) { r.mutable_prompts(1)->clear_content(); }),
       "prompts[1].content"},
      {"EmptyPrompt",
       generate([](GenerateRequest& r) { r.mutable_prompts(1)->mutable_token_ids()->clear_ids(); }),
       "prompts[1].token_ids.ids"},
      {"TokenBeyondVocabulary", generate([](GenerateRequest& r) {
         r.mutable_prompts(0)->mutable_token_ids()->add_ids(70000);
       }),
       "prompts[0].token_ids.ids[4]"},
      {"EmptyText", generate([](GenerateRequest& r) { r.mutable_prompts(0)->set_text(""); }),
       "prompts[0].text"},
      {"PromptBeyondTheContext",
       generate([](GenerateRequest& r) { r.mutable_sampling()->set_max_new_tokens(45); }),
       "prompts[0].token_ids"},
      {"LongPromptId", generate([](GenerateRequest& r) {
         r.mutable_prompts(0)->set_prompt_id(std::string(129, 'p'));
       }),
       "prompts[0].prompt_id"},
      {"DuplicatePromptId", generate([](GenerateRequest& r) {
         r.mutable_prompts(0)->set_prompt_id("p");
         r.mutable_prompts(1)->set_prompt_id("p");
       }),
       "prompts[1].prompt_id"},
      {"PromptIdsThatMakeNoRouteKeys", generate([](GenerateRequest& r) {
         r.set_request_id(std::string(127, 'r'));  // Sample ids "<r>.0/0": 131 bytes.
         r.mutable_routes()->set_enabled(true);
         r.mutable_routes()->set_job_id("job-1");
       }),
       "prompts[0].prompt_id"},
      {"SampleBeyondTheKvCache", generate([](GenerateRequest& r) {
         r.mutable_prompts()->RemoveLast();  // 4 + 44 tokens fit the context, not the cache.
         r.mutable_sampling()->set_max_new_tokens(44);
       }),
       "", "SAMPLE_EXCEEDS_KV_CACHE"},
      // GetAdapterStatus, WatchAdapterStatus.
      {"StatusOfABadName", status_of("two words"), "adapter_name"},
      {"WatchWithoutAName", watch(""), "adapter_name"},
      {"WatchABadName", watch("two words"), "adapter_name"},
  };
  ExpectEachRefusedWithDetails(cases);
}

TEST_F(RolloutServiceTest, AReplicaFollowsABoundedNumberOfAdapters) {
  for (const char* adapter : {"first", "second", "third"}) Publish(1, adapter);
  RolloutOptions options = DefaultOptions();
  options.registry.max_followed_adapters = 2;
  options.registry.unfollow_idle_after = absl::Hours(1);
  StartRollout(std::move(options));
  const auto generate_for = [&](const std::string& adapter) {
    rollout::v1::GenerateRequest request = Request(absl::StrCat("for-", adapter), 1, 1, 2);
    request.mutable_adapter()->set_adapter_name(adapter);
    request.mutable_adapter()->set_exact_version(1);
    return Generate(request).status;
  };
  ASSERT_TRUE(generate_for("first").ok());
  ASSERT_TRUE(generate_for("second").ok());
  const grpc::Status third = generate_for("third");
  EXPECT_EQ(third.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << third.error_message();
  EXPECT_THAT(third.error_message(), HasSubstr("--max_followed_adapters"));
  EXPECT_TRUE(generate_for("first").ok()) << "an adapter already followed is still served";
}

TEST_F(RolloutServiceTest, AnIdleAdapterIsUnfollowedAndFreesItsSlot) {
  Publish(1);
  Publish(1, "next-job");
  RolloutOptions options = DefaultOptions();
  options.registry.max_followed_adapters = 1;
  options.registry.unfollow_idle_after = absl::Minutes(10);
  options.registry.clock = &clock_;
  StartRollout(std::move(options));
  rollout::v1::GenerateRequest request = Request("served", 1, 1, 2);
  request.mutable_adapter()->set_adapter_name(kAdapter);
  request.mutable_adapter()->set_exact_version(1);
  ASSERT_EQ(Generate(request).status.error_code(), grpc::StatusCode::OK);
  StatusStream watch = StatusStream::Open(*rollout_stub_, kAdapter);
  clock_.Advance(absl::Minutes(9));
  rollout::v1::GenerateRequest early = Request("too-early", 1, 1, 2);
  early.mutable_adapter()->set_adapter_name("next-job");
  early.mutable_adapter()->set_exact_version(1);
  EXPECT_EQ(Generate(early).status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << "not idle for long enough yet";
  clock_.Advance(absl::Minutes(2));  // The idle period is what is under test.

  // A job after the first one gets the slot the idle adapter held.
  rollout::v1::GenerateRequest next = Request("next-job", 1, 1, 2);
  next.mutable_adapter()->set_adapter_name("next-job");
  next.mutable_adapter()->set_exact_version(1);
  const grpc::Status status = Generate(next).status;
  EXPECT_TRUE(status.ok()) << status.error_message();

  grpc::ClientContext status_context;
  rollout::v1::GetAdapterStatusRequest status_request;
  status_request.set_adapter_name(kAdapter);
  rollout::v1::GetAdapterStatusResponse adapter_status;
  const grpc::Status unfollowed =
      rollout_stub_->GetAdapterStatus(&status_context, status_request, &adapter_status);
  EXPECT_EQ(unfollowed.error_code(), grpc::StatusCode::NOT_FOUND) << unfollowed.error_message();
  // Its status stream ends with it, rather than going silent.
  const grpc::Status watch_end = watch.ReadToEnd();
  EXPECT_EQ(watch_end.error_code(), grpc::StatusCode::NOT_FOUND) << watch_end.error_message();
  EXPECT_THAT(watch_end.error_message(), HasSubstr("no longer follows"));
}

// A careless or hostile client naming adapters that do not exist: each request is NOT_FOUND at
// once, whatever its selector, and leaves no follow slot, stream or thread behind, so a real new
// adapter is served right after. Threads are read from /proc, not from a gauge of our own.
TEST_F(RolloutServiceTest, ABurstOfUnknownAdaptersLeavesNothingBehind) {
  RolloutOptions options = DefaultOptions();
  options.registry.max_followed_adapters = 8;
  StartRollout(std::move(options));
  // Concurrent requests, one per unknown name, with every kind of selector; how many ended
  // NOT_FOUND.
  const auto burst = [&](const std::string& prefix, int requests) {
    std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
    std::vector<std::unique_ptr<grpc::ClientReader<rollout::v1::GenerateResponse>>> readers;
    for (int i = 0; i < requests; ++i) {
      rollout::v1::GenerateRequest request = Request(absl::StrCat(prefix, i), 1, 1, 2);
      request.mutable_adapter()->set_adapter_name(absl::StrCat(prefix, i));
      switch (i % 3) {
        case 0:
          request.mutable_adapter()->set_latest(true);
          break;
        case 1:
          request.mutable_adapter()->set_exact_version(1);
          break;
        default:
          request.mutable_adapter()->set_min_version(1);
      }
      contexts.push_back(std::make_unique<grpc::ClientContext>());
      SetTimeout(*contexts.back(), absl::Seconds(30));
      readers.push_back(rollout_stub_->Generate(contexts.back().get(), request));
    }
    int not_found = 0;
    for (auto& reader : readers) {
      rollout::v1::GenerateResponse response;
      while (reader->Read(&response)) {
      }
      const grpc::Status status = reader->Finish();
      EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();
      not_found += status.error_code() == grpc::StatusCode::NOT_FOUND;
    }
    return not_found;
  };
  burst("warm-", 50);  // gRPC's own threads for the streams start here.
  const int threads_before = ProcessThreads();
  constexpr int kRequests = 200;
  const int not_found = burst("nobody-", kRequests);
  std::printf("burst of %d unknown adapters (%d follow slots): %d NOT_FOUND; threads %d -> %d\n",
              kRequests, 8, not_found, threads_before, ProcessThreads());
  EXPECT_LE(ProcessThreads(), threads_before + 5);

  rollout::v1::GetAdapterStatusRequest status_request;
  rollout::v1::GetAdapterStatusResponse status;
  grpc::ClientContext status_context;
  ASSERT_TRUE(rollout_stub_->GetAdapterStatus(&status_context, status_request, &status).ok());
  EXPECT_EQ(status.adapters_size(), 0) << "no follow slot is left taken";

  Publish(1);
  rollout::v1::GenerateRequest real = Request("real", 1, 1, 2);
  real.mutable_adapter()->set_adapter_name(kAdapter);
  real.mutable_adapter()->set_latest(true);
  const Generated generated = Generate(real);
  ASSERT_TRUE(generated.status.ok()) << generated.status.error_message();
  EXPECT_EQ(generated.samples[0].adapter_version(), 1);
}

// Following many real adapters costs streams and memory, not threads.
TEST_F(RolloutServiceTest, FollowingManyAdaptersAddsNoThreads) {
  constexpr int kAdapters = 64;  // --max_followed_adapters by default.
  for (int i = 0; i < kAdapters; ++i) Publish(1, absl::StrCat("job-", i));
  StartRollout(DefaultOptions());
  rollout::v1::GenerateRequest warm = Request("warm", 1, 1, 2);
  warm.mutable_adapter()->set_adapter_name("job-0");
  warm.mutable_adapter()->set_latest(true);
  ASSERT_TRUE(Generate(warm).status.ok());
  const int threads_before = ProcessThreads();
  for (int i = 1; i < kAdapters; ++i) {
    rollout::v1::GenerateRequest request = Request(absl::StrCat("for-", i), 1, 1, 2);
    request.mutable_adapter()->set_adapter_name(absl::StrCat("job-", i));
    request.mutable_adapter()->set_latest(true);
    const grpc::Status status = Generate(request).status;
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  std::printf("following %d adapters: threads %d -> %d\n", kAdapters, threads_before,
              ProcessThreads());
  EXPECT_LE(ProcessThreads(), threads_before + 5);
}

TEST_F(RolloutServiceTest, NotServingUntilTheRequiredAdapterIsLoaded) {
  Publish(1);
  RolloutOptions options = DefaultOptions();
  options.adapters = {kAdapter};
  // A store that is not there yet: the replica must not serve (stale or base) weights.
  options.weight_store = *CreateChannel(
      {.target = "127.0.0.1:1", .service_name = "tandem.weightstore.v1.WeightStoreService"});
  StartRollout(options);
  // The server has been told it may serve (SetReady), which a replica without a readiness gate
  // would do at once: NOT_SERVING here is the gate's answer, not the state servers start in.
  EXPECT_FALSE(rollout_service_->Ready());
  EXPECT_EQ(*CheckHealth(rollout_channel_, "tandem.rollout.v1.RolloutService", absl::Seconds(5)),
            Health::kNotServing);
  // A client that calls anyway is told to come back, rather than served or kept waiting.
  const Generated early = Generate(Request("early", 1, 1, 2), absl::Seconds(5));
  EXPECT_EQ(early.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(early.status.error_message(), HasSubstr("not yet serving current weights"));

  options.weight_store = weight_store_channel_;
  StartRollout(options);
  ASSERT_TRUE(WaitUntilServing({.target = rollout_.target()}, "tandem.rollout.v1.RolloutService",
                               absl::Seconds(20))
                  .ok());
  rollout::v1::GetAdapterStatusRequest request;
  rollout::v1::GetAdapterStatusResponse response;
  grpc::ClientContext context;
  ASSERT_TRUE(rollout_stub_->GetAdapterStatus(&context, request, &response).ok());
  EXPECT_EQ(response.adapters(0).current_version(), 1);
}

TEST_F(RolloutServiceTest, TheStatusStreamTellsEachSwapAndEndsOnDrain) {
  StartFollowingVersionOne();
  StatusStream stream = StatusStream::Open(*rollout_stub_, kAdapter);
  rollout::v1::WatchAdapterStatusResponse response;
  ASSERT_TRUE(stream.Read(response));  // The status now.
  EXPECT_THAT(response.replica_id(), HasSubstr("rollout-"));
  EXPECT_EQ(response.status().current_version(), 1);

  Publish(2);
  std::vector<rollout::v1::AdapterStatus> told;
  while (response.status().current_version() < 2 && stream.Read(response)) {
    told.push_back(response.status());
  }
  ASSERT_FALSE(told.empty());
  EXPECT_EQ(told.back().current_version(), 2);
  EXPECT_EQ(told.back().newest_announced_version(), 2);
  for (size_t i = 1; i < told.size(); ++i) {
    EXPECT_NE(told[i].SerializeAsString(), told[i - 1].SerializeAsString()) << "repeated";
  }

  // The trainer's wait rides the same stream: nothing polls.
  Publish(3);
  tandem::testing::SimulatedClock clock;
  const std::vector<ReplicaStub> replicas = {
      {.address = rollout_.target(), .stub = rollout_stub_.get()}};
  EXPECT_TRUE(
      AwaitVersionServed(replicas, kAdapter, 3, {.timeout = absl::Seconds(30)}, clock).ok());
  EXPECT_TRUE(clock.sleeps().empty());

  rollout_service_->Drain();
  const grpc::Status ended = stream.ReadToEnd();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::UNAVAILABLE) << ended.error_message();
  EXPECT_THAT(ended.error_message(), HasSubstr("draining"));
  // A stream opened while the replica drains ends at once.
  EXPECT_EQ(StatusStream::Open(*rollout_stub_, kAdapter).ReadToEnd().error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(RolloutServiceTest, StatusStreamsAddNoThreads) {
  StartFollowingVersionOne();
  const int threads_before = ProcessThreads();
  constexpr int kStreams = 64;
  std::vector<StatusStream> streams;
  for (int i = 0; i < kStreams; ++i) {
    streams.push_back(StatusStream::Open(*rollout_stub_, kAdapter));
    rollout::v1::WatchAdapterStatusResponse response;
    ASSERT_TRUE(streams.back().Read(response));  // Open: the status now arrived.
  }
  const int threads_open = ProcessThreads();
  std::printf("%d status streams open: threads %d -> %d\n", kStreams, threads_before, threads_open);
  EXPECT_LE(threads_open, threads_before + 5);
  for (StatusStream& stream : streams) stream.Cancel();
}

TEST_F(RolloutServiceTest, AStatusStreamNeedsAnAdapterTheReplicaFollows) {
  StartRollout(DefaultOptions());
  for (const auto& [name, code] : std::vector<std::pair<std::string, grpc::StatusCode>>{
           {"", grpc::StatusCode::INVALID_ARGUMENT},
           {"two words", grpc::StatusCode::INVALID_ARGUMENT},
           {"never-asked", grpc::StatusCode::NOT_FOUND}}) {
    EXPECT_EQ(StatusStream::Open(*rollout_stub_, name).ReadToEnd().error_code(), code)
        << "'" << name << "'";
  }
}

TEST_F(RolloutServiceTest, AFailedLoadKeepsTheOldVersionAndRetries) {
  StartFollowingVersionOne();
  // Version 2 is for a different model: it commits, but this replica cannot load it.
  engine::ModelConfig other = model_config_;
  other.expert_ffn_dim = 32;
  engine::LoraAdapter wrong = *engine::LoraAdapter::Create(other, engine::LoraConfig{}, 1);
  ASSERT_TRUE(PublishEngineAdapter(*weight_store_stub_, wrong, other, kAdapter, 2).ok());
  rollout::v1::GetAdapterStatusRequest request;
  rollout::v1::GetAdapterStatusResponse response;
  for (int i = 0; i < 200; ++i) {
    grpc::ClientContext context;
    ASSERT_TRUE(rollout_stub_->GetAdapterStatus(&context, request, &response).ok());
    if (!response.adapters(0).last_error().empty()) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  const rollout::v1::AdapterStatus& status = response.adapters(0);
  EXPECT_THAT(status.last_error(), HasSubstr("version 2"));
  EXPECT_TRUE(status.has_last_error_time());
  EXPECT_EQ(status.current_version(), 1);
  EXPECT_EQ(status.newest_announced_version(), 2);
  // Requests keep being served by version 1 meanwhile.
  rollout::v1::GenerateRequest generate = Request("meanwhile", 1, 1, 4);
  generate.mutable_adapter()->set_adapter_name(kAdapter);
  generate.mutable_adapter()->set_min_version(1);
  const Generated generated = Generate(generate);
  ASSERT_TRUE(generated.status.ok()) << generated.status.error_message();
  EXPECT_EQ(generated.samples[0].adapter_version(), 1);
  // A good version 3 replaces it.
  Publish(3);
  AwaitCurrentVersion(3);
}

}  // namespace
}  // namespace tandem::rollout
