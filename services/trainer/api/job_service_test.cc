// The Job API through gRPC on loopback with the real job runner but without the other services:
// jobs whose base model is missing fail at start, which is all paging, filtering, watching and
// persistence need. The job state machine itself is unit-tested in job_manager_test.
#include "services/trainer/api/job_service.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/server.h"
#include "common/status.h"
#include "common/testing/error_details.h"
#include "common/testing/test_dir.h"
#include "common/testing/test_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::trainer {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Pair;

class JobServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tandem::testing::FreshTestDir("jobs");
    Start();
  }

  void Start() {
    server_.reset();
    auto jobs = JobManager::Open(dir_, [](const trainer::v1::Job& job, const JobProgress& progress,
                                          const std::atomic<bool>& cancelled) {
      return RunJob(job, JobEnvironment(), progress, cancelled);
    });
    ASSERT_TRUE(jobs.ok()) << jobs.status();
    ServerOptions options = tandem::testing::LoopbackOptions();
    options.drain_timeout = absl::Milliseconds(200);
    auto started = tandem::testing::StartLoopbackServer(
        "trainer",
        {"tandem.trainer.v1.JobService", std::make_unique<JobServiceImpl>(*std::move(jobs))},
        options);
    ASSERT_TRUE(started.ok()) << started.status();
    stub_ = trainer::v1::JobService::NewStub(started->Channel());
    server_ = std::move(started->server);
  }

  trainer::v1::JobSpec Spec(int steps) const {
    trainer::v1::JobSpec spec;
    spec.mutable_task()->set_name("addition");
    spec.set_base_model_path(dir_ + "/missing.safetensors");
    spec.mutable_lora()->set_rank(4);
    spec.set_algorithm(trainer::v1::ALGORITHM_GRPO);
    spec.mutable_algorithm_config()->set_learning_rate(1e-3);
    spec.set_prompts_per_step(2);
    spec.set_group_size(2);
    spec.set_num_steps(steps);
    spec.mutable_sampling()->set_max_new_tokens(2);
    return spec;
  }

  std::string Create(int steps, const std::string& request_id) {
    trainer::v1::CreateJobRequest request;
    request.set_request_id(request_id);
    *request.mutable_spec() = Spec(steps);
    trainer::v1::Job response;
    grpc::ClientContext context;
    EXPECT_TRUE(stub_->CreateJob(&context, request, &response).ok());
    return response.id();
  }

  grpc::Status List(trainer::v1::ListJobsRequest request, trainer::v1::ListJobsResponse* response) {
    grpc::ClientContext context;
    return stub_->ListJobs(&context, request, response);
  }

  trainer::v1::Job AwaitTerminal(const std::string& job_id) {
    trainer::v1::GetJobRequest request;
    request.set_job_id(job_id);
    trainer::v1::Job response;
    for (int i = 0; i < 400; ++i) {
      grpc::ClientContext context;
      EXPECT_TRUE(stub_->GetJob(&context, request, &response).ok());
      const trainer::v1::JobState state = response.state();
      if (state == trainer::v1::JOB_STATE_FAILED || state == trainer::v1::JOB_STATE_SUCCEEDED ||
          state == trainer::v1::JOB_STATE_CANCELLED) {
        break;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return response;
  }

  std::string dir_;
  std::unique_ptr<ServiceServer> server_;
  std::unique_ptr<trainer::v1::JobService::Stub> stub_;
};

TEST_F(JobServiceTest, ListPagesNewestFirstAndFiltersByState) {
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(Create(1 + i, absl::StrCat("r", i)));
  for (const std::string& id : ids) {
    const trainer::v1::Job job = AwaitTerminal(id);
    EXPECT_EQ(job.state(), trainer::v1::JOB_STATE_FAILED);
    EXPECT_THAT(job.error_message(), HasSubstr("base model"));
  }
  trainer::v1::ListJobsRequest request;
  request.set_page_size(2);
  std::vector<std::string> listed;
  int pages = 0;
  do {
    trainer::v1::ListJobsResponse response;
    ASSERT_TRUE(List(request, &response).ok());
    for (const trainer::v1::Job& job : response.jobs()) listed.push_back(job.id());
    request.set_page_token(response.next_page_token());
    ++pages;
  } while (!request.page_token().empty());
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(listed, std::vector<std::string>(ids.rbegin(), ids.rend())) << "newest first";

  trainer::v1::ListJobsRequest running;
  running.add_states(trainer::v1::JOB_STATE_RUNNING);
  trainer::v1::ListJobsResponse response;
  ASSERT_TRUE(List(running, &response).ok());
  EXPECT_EQ(response.jobs_size(), 0);

  // A token belongs to its filter; bad values are INVALID_ARGUMENT.
  trainer::v1::ListJobsRequest first_page;
  first_page.set_page_size(2);
  ASSERT_TRUE(List(first_page, &response).ok());
  trainer::v1::ListJobsRequest other_filter = running;
  other_filter.set_page_token(response.next_page_token());
  EXPECT_EQ(List(other_filter, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  trainer::v1::ListJobsRequest bad;
  bad.set_page_token("garbage");
  EXPECT_EQ(List(bad, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  bad.set_page_token("9223372036854775807/");  // Once overflowed offset + page_size.
  EXPECT_EQ(List(bad, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  bad.clear_page_token();
  bad.set_page_size(-1);
  EXPECT_EQ(List(bad, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  bad.set_page_size(0);
  bad.add_states(trainer::v1::JOB_STATE_UNSPECIFIED);
  EXPECT_EQ(List(bad, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(JobServiceTest, JobsSurviveARestartAndWatchingAFinishedJobSendsOnlyItsSnapshot) {
  const std::string id = Create(3, "persisted");
  const trainer::v1::Job failed = AwaitTerminal(id);
  ASSERT_EQ(failed.state(), trainer::v1::JOB_STATE_FAILED);
  Start();  // A new service over the same directory.
  trainer::v1::GetJobRequest get;
  get.set_job_id(id);
  trainer::v1::Job response;
  grpc::ClientContext context;
  ASSERT_TRUE(stub_->GetJob(&context, get, &response).ok());
  EXPECT_EQ(response.state(), trainer::v1::JOB_STATE_FAILED);
  EXPECT_EQ(response.error_message(), failed.error_message());
  EXPECT_EQ(Create(3, "persisted"), id) << "request ids are remembered across restarts";

  grpc::ClientContext watch_context;
  trainer::v1::WatchJobRequest watch;
  watch.set_job_id(id);
  auto reader = stub_->WatchJob(&watch_context, watch);
  trainer::v1::WatchJobResponse event;
  int events = 0;
  while (reader->Read(&event)) {
    ++events;
    EXPECT_EQ(event.type(), trainer::v1::WATCH_EVENT_TYPE_SNAPSHOT);
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(events, 1);
}

// Every spec rule is unit-tested in job_spec_test; this checks the status reaches the client.
TEST_F(JobServiceTest, ABadSpecIsInvalidArgumentNamingTheField) {
  trainer::v1::CreateJobRequest request;
  request.set_request_id("bad");
  *request.mutable_spec() = Spec(1);
  request.mutable_spec()->set_group_size(1);
  trainer::v1::Job response;
  grpc::ClientContext context;
  const grpc::Status status = stub_->CreateJob(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("spec.group_size: ALGORITHM_GRPO needs >= 2"));
  // The details say which field, as google.rpc.BadRequest and ErrorInfo (their wire form is
  // status_test's), for clients to act on.
  const absl::Status received = FromGrpcStatus(status);
  const std::vector<FieldViolation> violations = FieldViolations(received);
  ASSERT_EQ(violations.size(), 1u);
  EXPECT_EQ(violations[0].field, "spec.group_size");
  EXPECT_EQ(ErrorReason(received), "INVALID_FIELD");
  // Also for the limits every service shares: sizes and identifiers.
  const auto refused_field = [&](const trainer::v1::CreateJobRequest& bad) {
    grpc::ClientContext bad_context;
    return FieldViolations(FromGrpcStatus(stub_->CreateJob(&bad_context, bad, &response)));
  };
  request.mutable_spec()->set_group_size(2);
  request.mutable_spec()->set_display_name(std::string(257, 'n'));
  EXPECT_EQ(refused_field(request).at(0).field, "spec.display_name");
  request.mutable_spec()->clear_display_name();
  request.mutable_spec()->set_adapter_name("no spaces");
  EXPECT_EQ(refused_field(request).at(0).field, "spec.adapter_name");
  request.mutable_spec()->clear_adapter_name();
  request.mutable_spec()->mutable_algorithm_config()->set_learning_rate(-1);
  EXPECT_EQ(refused_field(request).at(0).field, "spec.algorithm_config.learning_rate");
}

// The trainer runs in float: a learning rate that float rounds to inf or 0 would fail at step 1
// or train nothing, so CreateJob refuses it naming the field.
TEST_F(JobServiceTest, NumbersThatFloatCannotHoldAreRefusedNamingTheField) {
  const auto create = [&](const std::function<void(trainer::v1::AlgorithmConfig&)>& change) {
    trainer::v1::CreateJobRequest request;
    request.set_request_id("narrow");
    *request.mutable_spec() = Spec(1);
    change(*request.mutable_spec()->mutable_algorithm_config());
    trainer::v1::Job response;
    grpc::ClientContext context;
    return stub_->CreateJob(&context, request, &response);
  };
  const grpc::Status huge = create([](auto& config) { config.set_learning_rate(1e39); });
  EXPECT_EQ(huge.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(huge.error_message(), HasSubstr("spec.algorithm_config.learning_rate is 1e+39"));
  const grpc::Status tiny = create([](auto& config) { config.set_learning_rate(1e-46); });
  EXPECT_EQ(tiny.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(tiny.error_message(), HasSubstr("spec.algorithm_config.learning_rate is 1e-46"));
  const grpc::Status decay = create([](auto& config) { config.set_weight_decay(1e-50); });
  EXPECT_EQ(decay.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(decay.error_message(), HasSubstr("spec.algorithm_config.weight_decay is 1e-50"));
  const grpc::Status norm = create([](auto& config) { config.set_max_grad_norm(1e40); });
  EXPECT_EQ(norm.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(norm.error_message(), HasSubstr("spec.algorithm_config.max_grad_norm is 1e+40"));
  const grpc::Status value_lr = create([](auto& config) { config.set_value_learning_rate(1e39); });
  EXPECT_EQ(value_lr.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(value_lr.error_message(),
              HasSubstr("spec.algorithm_config.value_learning_rate is 1e+39"));
}

// Job.spec is the spec as the job runs it: every default the trainer applies is written out.
TEST_F(JobServiceTest, TheCreatedJobShowsEveryDefaultItRunsWith) {
  trainer::v1::CreateJobRequest request;
  request.set_request_id("defaults");
  *request.mutable_spec() = Spec(1);
  trainer::v1::Job response;
  grpc::ClientContext context;
  ASSERT_TRUE(stub_->CreateJob(&context, request, &response).ok());
  const trainer::v1::JobSpec& task_spec = response.spec();
  EXPECT_THAT(task_spec.task().params(), Contains(Pair("digits", "2")));
  EXPECT_EQ(task_spec.lora().alpha(), 4.0f) << "alpha 0 means alpha = rank";
  EXPECT_EQ(task_spec.lora().target_modules_size(), 7);
  ASSERT_TRUE(task_spec.sampling().has_temperature());
  EXPECT_EQ(task_spec.sampling().temperature(), 1.0f);
  ASSERT_TRUE(task_spec.sampling().has_top_p());
  EXPECT_EQ(task_spec.sampling().top_p(), 1.0f);

  request.set_request_id("dataset-defaults");
  request.mutable_spec()->mutable_dataset()->set_path("/data/train.jsonl");
  request.mutable_spec()->mutable_dataset()->set_verifier("exact_match");
  grpc::ClientContext dataset_context;
  ASSERT_TRUE(stub_->CreateJob(&dataset_context, request, &response).ok());
  const trainer::v1::DatasetSpec& dataset = response.spec().dataset();
  EXPECT_EQ(dataset.prompt_field(), "prompt");
  EXPECT_EQ(dataset.answer_field(), "answer");
  EXPECT_EQ(dataset.messages_field(), "messages");
}

// A job's output_dir is its own: a directory that already holds files (another job's
// checkpoint above all) is refused at CreateJob instead of being resumed from later.
TEST_F(JobServiceTest, AnOutputDirThatHoldsFilesIsRefusedNamingIt) {
  const std::string taken = dir_ + "/taken";
  std::filesystem::create_directories(taken);
  std::ofstream(taken + "/checkpoint.safetensors") << "someone else's";
  trainer::v1::CreateJobRequest request;
  request.set_request_id("reuse");
  *request.mutable_spec() = Spec(1);
  request.mutable_spec()->set_output_dir(taken);
  trainer::v1::Job response;
  grpc::ClientContext context;
  const grpc::Status status = stub_->CreateJob(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("spec.output_dir: " + taken));

  // Any other file, and another job's output_dir even before it wrote anything, are refused too.
  const std::string used = dir_ + "/used";
  std::filesystem::create_directories(used);
  std::ofstream(used + "/notes.txt") << "mine";
  request.mutable_spec()->set_output_dir(used);
  grpc::ClientContext used_context;
  const grpc::Status not_empty = stub_->CreateJob(&used_context, request, &response);
  EXPECT_EQ(not_empty.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(not_empty.error_message(), HasSubstr("is not empty (it holds 'notes.txt')"));
  request.mutable_spec()->set_output_dir(dir_ + "/first");
  grpc::ClientContext first_context;
  ASSERT_TRUE(stub_->CreateJob(&first_context, request, &response).ok());
  const std::string first = response.id();
  request.set_request_id("second");
  grpc::ClientContext second_context;
  const grpc::Status shared = stub_->CreateJob(&second_context, request, &response);
  EXPECT_EQ(shared.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(shared.error_message(), HasSubstr("is the output_dir of job " + first));
}

// Strings from outside have a maximum size, so a page of ListJobs cannot outgrow the message
// limit and fail listing for everyone.
TEST_F(JobServiceTest, OversizedStringsAreRefusedAndListingKeepsWorking) {
  int accepted = 0;
  for (int i = 0; i < 40; ++i) {
    trainer::v1::CreateJobRequest request;
    request.set_request_id(absl::StrCat("huge", i));
    *request.mutable_spec() = Spec(1);
    request.mutable_spec()->set_base_model_path(std::string(1 << 20, 'p') + std::to_string(i));
    trainer::v1::Job response;
    grpc::ClientContext context;
    const grpc::Status status = stub_->CreateJob(&context, request, &response);
    if (status.ok()) {
      ++accepted;
      continue;
    }
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("spec.base_model_path"));
  }
  EXPECT_EQ(accepted, 0);

  // Jobs at the limits (names of 256 bytes, paths of 4096) still list, over several pages.
  std::set<std::string> created;
  for (int i = 0; i < 20; ++i) {
    trainer::v1::CreateJobRequest request;
    request.set_request_id(absl::StrCat("large", i));
    *request.mutable_spec() = Spec(1);
    request.mutable_spec()->set_display_name(std::string(256, 'n'));
    request.mutable_spec()->set_base_model_path(
        absl::StrCat(dir_, "/", std::string(4096 - dir_.size() - 1, 'm')));
    request.mutable_spec()->set_initial_adapter_path(std::string(4096, 'a'));
    trainer::v1::Job response;
    grpc::ClientContext context;
    const grpc::Status status = stub_->CreateJob(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    created.insert(response.id());
  }
  std::set<std::string> listed;
  int pages = 0;
  trainer::v1::ListJobsRequest request;
  request.set_page_size(7);
  do {
    trainer::v1::ListJobsResponse response;
    const grpc::Status status = List(request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_GT(response.jobs_size(), 0);
    EXPECT_LE(response.ByteSizeLong(), size_t{4} << 20);
    for (const trainer::v1::Job& job : response.jobs()) listed.insert(job.id());
    request.set_page_token(response.next_page_token());
    ++pages;
  } while (!request.page_token().empty());
  EXPECT_EQ(listed, created);
  EXPECT_GT(pages, 1);
}

TEST_F(JobServiceTest, UnknownAndMissingIdsGetClearStatuses) {
  trainer::v1::GetJobRequest get;
  trainer::v1::Job got;
  grpc::ClientContext empty_context;
  EXPECT_EQ(stub_->GetJob(&empty_context, get, &got).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  get.set_job_id("job-nope");
  grpc::ClientContext context;
  const grpc::Status missing = stub_->GetJob(&context, get, &got);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(missing.error_message(), "job job-nope not found");
  trainer::v1::CancelJobRequest cancel;
  cancel.set_job_id("job-nope");
  trainer::v1::Job cancelled;
  grpc::ClientContext cancel_context;
  EXPECT_EQ(stub_->CancelJob(&cancel_context, cancel, &cancelled).error_code(),
            grpc::StatusCode::NOT_FOUND);
  grpc::ClientContext watch_context;
  trainer::v1::WatchJobRequest watch;
  watch.set_job_id("job-nope");
  auto reader = stub_->WatchJob(&watch_context, watch);
  trainer::v1::WatchJobResponse event;
  EXPECT_FALSE(reader->Read(&event));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  // Ids that can name no job are INVALID_ARGUMENT naming the value, not NOT_FOUND.
  for (const std::string& bad_id : {std::string("../x"), std::string("a b")}) {
    get.set_job_id(bad_id);
    grpc::ClientContext bad_context;
    const grpc::Status bad = stub_->GetJob(&bad_context, get, &got);
    EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad_id;
    EXPECT_THAT(bad.error_message(), HasSubstr("bad job_id: '" + bad_id + "'"));
  }
}

// A job is also named by its resource name, "jobs/{id}", in Get, Cancel and Watch; a name of
// another form, or one naming another job than job_id, is INVALID_ARGUMENT naming the field.
TEST_F(JobServiceTest, AJobGoesByItsResourceNameToo) {
  const std::string id = Create(2, "named");
  trainer::v1::GetJobRequest get;
  get.set_name("jobs/" + id);
  trainer::v1::Job got;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->GetJob(&context, get, &got).ok());
    EXPECT_EQ(got.id(), id);
    EXPECT_EQ(got.name(), "jobs/" + id);
  }
  get.set_job_id(id);  // Both, naming the same job.
  {
    grpc::ClientContext context;
    EXPECT_TRUE(stub_->GetJob(&context, get, &got).ok());
  }
  {
    grpc::ClientContext context;
    trainer::v1::WatchJobRequest watch;
    watch.set_name("jobs/" + id);
    auto reader = stub_->WatchJob(&context, watch);
    trainer::v1::WatchJobResponse event;
    ASSERT_TRUE(reader->Read(&event));
    EXPECT_EQ(event.job().name(), "jobs/" + id);
    context.TryCancel();
  }
  trainer::v1::CancelJobRequest cancel;
  cancel.set_name("jobs/job-nope");
  trainer::v1::Job cancelled;
  {
    grpc::ClientContext context;
    const grpc::Status status = stub_->CancelJob(&context, cancel, &cancelled);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(status.error_message(), "job job-nope not found");
  }
  const auto violations = [&](const trainer::v1::GetJobRequest& request) {
    grpc::ClientContext context;
    return FieldViolations(FromGrpcStatus(stub_->GetJob(&context, request, &got)));
  };
  for (const std::string& bad : {std::string("job-x"), std::string("jobs/"),
                                 std::string("jobs/a/b"), std::string("projects/p/jobs/x")}) {
    trainer::v1::GetJobRequest request;
    request.set_name(bad);
    const std::vector<FieldViolation> found = violations(request);
    ASSERT_EQ(found.size(), 1u) << bad;
    EXPECT_EQ(found[0].field, "name") << bad;
  }
  trainer::v1::GetJobRequest conflicting;
  conflicting.set_job_id(id);
  conflicting.set_name("jobs/job-other");
  ASSERT_EQ(violations(conflicting).size(), 1u);
  EXPECT_THAT(violations(conflicting)[0].description, HasSubstr("different jobs"));
  ASSERT_EQ(violations(trainer::v1::GetJobRequest()).size(), 1u);
  EXPECT_EQ(violations(trainer::v1::GetJobRequest())[0].field, "job_id");
}

// Every documented rule of every RPC (trainer.proto, and common.proto's for the types a JobSpec
// holds), as a client built from the protos sees it: INVALID_ARGUMENT whose details name the
// field by its path from the request root (with list indices and map keys) and give the
// ErrorInfo reason. job_spec_test checks each rule's message.
TEST_F(JobServiceTest, EveryRuleNamesTheFieldPathAndReasonInItsDetails) {
  using trainer::v1::AlgorithmConfig;
  using trainer::v1::CreateJobRequest;
  using trainer::v1::JobSpec;
  CreateJobRequest base;
  base.set_request_id("rules");
  *base.mutable_spec() = Spec(1);
  const auto create = [&](const std::function<void(CreateJobRequest&)>& edit) {
    return [this, base, edit] {
      CreateJobRequest request = base;
      edit(request);
      trainer::v1::Job response;
      grpc::ClientContext context;
      return stub_->CreateJob(&context, request, &response);
    };
  };
  const auto spec = [&](const std::function<void(JobSpec&)>& edit) {
    return create([edit](CreateJobRequest& r) { edit(*r.mutable_spec()); });
  };
  const auto config = [&](const std::function<void(AlgorithmConfig&)>& edit) {
    return spec([edit](JobSpec& s) { edit(*s.mutable_algorithm_config()); });
  };
  const auto get = [this](const std::string& job_id, const std::string& name) {
    return [this, job_id, name] {
      trainer::v1::GetJobRequest request;
      request.set_job_id(job_id);
      request.set_name(name);
      trainer::v1::Job response;
      grpc::ClientContext context;
      return stub_->GetJob(&context, request, &response);
    };
  };
  const auto cancel = [this](const std::string& job_id, const std::string& name) {
    return [this, job_id, name] {
      trainer::v1::CancelJobRequest request;
      request.set_job_id(job_id);
      request.set_name(name);
      trainer::v1::Job response;
      grpc::ClientContext context;
      return stub_->CancelJob(&context, request, &response);
    };
  };
  const auto watch = [this](const std::string& job_id, const std::string& name) {
    return [this, job_id, name] {
      trainer::v1::WatchJobRequest request;
      request.set_job_id(job_id);
      request.set_name(name);
      grpc::ClientContext context;
      auto reader = stub_->WatchJob(&context, request);
      trainer::v1::WatchJobResponse event;
      while (reader->Read(&event)) {
      }
      return reader->Finish();
    };
  };
  const auto list = [this](const std::function<void(trainer::v1::ListJobsRequest&)>& edit) {
    return [this, edit] {
      trainer::v1::ListJobsRequest request;
      edit(request);
      trainer::v1::ListJobsResponse response;
      return List(request, &response);
    };
  };
  const std::string long_key(257, 'k');
  const std::vector<InvalidArgumentCase> cases = {
      // CreateJob: the request.
      {"NoRequestId", create([](CreateJobRequest& r) { r.clear_request_id(); }), "request_id"},
      {"BadRequestId", create([](CreateJobRequest& r) { r.set_request_id("two words"); }),
       "request_id"},
      {"RemovedEndpoints", spec([](JobSpec& s) {
         s.GetReflection()->MutableUnknownFields(&s)->AddLengthDelimited(18, "rollout:50052");
       }),
       "spec.endpoints"},
      // The spec's strings, data and sizes.
      {"LongDisplayName", spec([](JobSpec& s) { s.set_display_name(std::string(257, 'n')); }),
       "spec.display_name"},
      {"NeitherTaskNorDataset", spec([](JobSpec& s) { s.clear_task(); }), "spec.task"},
      {"UnknownTask", spec([](JobSpec& s) { s.mutable_task()->set_name("division"); }),
       "spec.task.name"},
      {"UnknownTaskParam",
       spec([](JobSpec& s) { (*s.mutable_task()->mutable_params())["size"] = "3"; }),
       "spec.task.params[\"size\"]"},
      {"DigitsNotANumber",
       spec([](JobSpec& s) { (*s.mutable_task()->mutable_params())["digits"] = "two"; }),
       "spec.task.params[\"digits\"]"},
      {"TooManyDigits",
       spec([](JobSpec& s) { (*s.mutable_task()->mutable_params())["digits"] = "10"; }),
       "spec.task.params[\"digits\"]"},
      {"LongTaskParamKey",
       spec([long_key](JobSpec& s) { (*s.mutable_task()->mutable_params())[long_key] = "1"; }),
       "spec.task.params[\"" + long_key + "\"]"},
      {"DatasetWithoutPath",
       spec([](JobSpec& s) { s.mutable_dataset()->set_verifier("exact_match"); }),
       "spec.dataset.path"},
      {"UnknownVerifier", spec([](JobSpec& s) {
         s.mutable_dataset()->set_path("/data/train.jsonl");
         s.mutable_dataset()->set_verifier("fuzzy");
       }),
       "spec.dataset.verifier"},
      {"NoBaseModel", spec([](JobSpec& s) { s.clear_base_model_path(); }), "spec.base_model_path"},
      {"LongBaseModelPath", spec([](JobSpec& s) { s.set_base_model_path(std::string(4097, 'p')); }),
       "spec.base_model_path"},
      {"LongOutputDir", spec([](JobSpec& s) { s.set_output_dir(std::string(4097, 'o')); }),
       "spec.output_dir"},
      {"LongInitialAdapterPath",
       spec([](JobSpec& s) { s.set_initial_adapter_path(std::string(4097, 'a')); }),
       "spec.initial_adapter_path"},
      {"LongInitialCheckpointDir",
       spec([](JobSpec& s) { s.set_initial_checkpoint_dir(std::string(4097, 'c')); }),
       "spec.initial_checkpoint_dir"},
      {"TwoStartingPoints", spec([](JobSpec& s) {
         s.set_initial_adapter_path("/adapters/a");
         s.set_initial_checkpoint_dir("/checkpoints/c");
       }),
       "spec.initial_adapter_path"},
      {"NoPrompts", spec([](JobSpec& s) { s.set_prompts_per_step(0); }), "spec.prompts_per_step"},
      {"GroupTooLarge", spec([](JobSpec& s) { s.set_group_size(300); }), "spec.group_size"},
      {"GrpoGroupOfOne", spec([](JobSpec& s) { s.set_group_size(1); }), "spec.group_size"},
      {"NoSteps", spec([](JobSpec& s) { s.set_num_steps(0); }), "spec.num_steps"},
      {"NegativeMicroBatch", spec([](JobSpec& s) { s.set_micro_batch_size(-1); }),
       "spec.micro_batch_size"},
      {"NegativeCheckpointEvery", spec([](JobSpec& s) { s.set_checkpoint_every(-1); }),
       "spec.checkpoint_every"},
      // Sampling.
      {"SamplingSeed", spec([](JobSpec& s) { s.mutable_sampling()->set_seed(1); }),
       "spec.sampling.seed"},
      {"NoSampling", spec([](JobSpec& s) { s.clear_sampling(); }), "spec.sampling.max_new_tokens"},
      {"NegativeTemperature", spec([](JobSpec& s) { s.mutable_sampling()->set_temperature(-1); }),
       "spec.sampling.temperature"},
      {"ZeroTopP", spec([](JobSpec& s) { s.mutable_sampling()->set_top_p(0); }),
       "spec.sampling.top_p"},
      {"NegativeTopK", spec([](JobSpec& s) { s.mutable_sampling()->set_top_k(-1); }),
       "spec.sampling.top_k"},
      {"TooManyStopTokens", spec([](JobSpec& s) {
         for (int i = 0; i < 65; ++i) s.mutable_sampling()->add_stop_token_ids(5);
       }),
       "spec.sampling.stop_token_ids"},
      {"NegativeStopToken", spec([](JobSpec& s) {
         s.mutable_sampling()->add_stop_token_ids(5);
         s.mutable_sampling()->add_stop_token_ids(-3);
       }),
       "spec.sampling.stop_token_ids[1]"},
      // The algorithm and its config.
      {"NoAlgorithm", spec([](JobSpec& s) { s.set_algorithm(trainer::v1::ALGORITHM_UNSPECIFIED); }),
       "spec.algorithm"},
      {"ZeroLearningRate", config([](AlgorithmConfig& c) { c.set_learning_rate(0); }),
       "spec.algorithm_config.learning_rate"},
      {"LearningRateBeyondFloat", config([](AlgorithmConfig& c) { c.set_learning_rate(1e39); }),
       "spec.algorithm_config.learning_rate"},
      {"NegativeWeightDecay", config([](AlgorithmConfig& c) { c.set_weight_decay(-1); }),
       "spec.algorithm_config.weight_decay"},
      {"NegativeMaxGradNorm", config([](AlgorithmConfig& c) { c.set_max_grad_norm(-1); }),
       "spec.algorithm_config.max_grad_norm"},
      {"ClipEpsLowOfOne", config([](AlgorithmConfig& c) { c.set_clip_eps_low(1); }),
       "spec.algorithm_config.clip_eps_low"},
      {"NegativeClipEpsHigh", config([](AlgorithmConfig& c) { c.set_clip_eps_high(-1); }),
       "spec.algorithm_config.clip_eps_high"},
      {"DualClipBelowOne", config([](AlgorithmConfig& c) { c.set_dual_clip_c(0.5); }),
       "spec.algorithm_config.dual_clip_c"},
      {"NegativeKlCoef", config([](AlgorithmConfig& c) { c.set_kl_coef(-1); }),
       "spec.algorithm_config.kl_coef"},
      {"UnknownKlEstimator", config([](AlgorithmConfig& c) {
         c.set_kl_estimator(static_cast<trainer::v1::KlEstimator>(99));
       }),
       "spec.algorithm_config.kl_estimator"},
      {"GammaAboveOne", config([](AlgorithmConfig& c) { c.set_gamma(2); }),
       "spec.algorithm_config.gamma"},
      {"NegativeGaeLambda", config([](AlgorithmConfig& c) { c.set_gae_lambda(-1); }),
       "spec.algorithm_config.gae_lambda"},
      {"NegativeValueLossCoef", config([](AlgorithmConfig& c) { c.set_value_loss_coef(-1); }),
       "spec.algorithm_config.value_loss_coef"},
      {"NegativeValueClip", config([](AlgorithmConfig& c) { c.set_value_clip(-1); }),
       "spec.algorithm_config.value_clip"},
      {"ZeroValueLearningRate", config([](AlgorithmConfig& c) { c.set_value_learning_rate(0); }),
       "spec.algorithm_config.value_learning_rate"},
      {"UnknownLossAggregation", config([](AlgorithmConfig& c) {
         c.set_loss_aggregation(static_cast<trainer::v1::LossAggregation>(99));
       }),
       "spec.algorithm_config.loss_aggregation"},
      {"UpdatesNotDividingPrompts", config([](AlgorithmConfig& c) { c.set_updates_per_step(3); }),
       "spec.algorithm_config.updates_per_step"},
      {"NegativeWarmup",
       config([](AlgorithmConfig& c) { c.mutable_lr_schedule()->set_warmup_updates(-1); }),
       "spec.algorithm_config.lr_schedule.warmup_updates"},
      {"WarmupBeyondTheUpdates",
       config([](AlgorithmConfig& c) { c.mutable_lr_schedule()->set_warmup_updates(2); }),
       "spec.algorithm_config.lr_schedule.warmup_updates"},
      {"UnknownDecay", config([](AlgorithmConfig& c) {
         c.mutable_lr_schedule()->set_decay(static_cast<trainer::v1::LrDecay>(99));
       }),
       "spec.algorithm_config.lr_schedule.decay"},
      {"MinLrRatioAboveOne",
       config([](AlgorithmConfig& c) { c.mutable_lr_schedule()->set_min_lr_ratio(2); }),
       "spec.algorithm_config.lr_schedule.min_lr_ratio"},
      // Mismatch correction.
      {"UnknownCorrectionMode", spec([](JobSpec& s) {
         s.mutable_is_correction()->set_mode(static_cast<trainer::v1::IsCorrectionMode>(99));
       }),
       "spec.is_correction.mode"},
      {"UnknownRejectionLevel", spec([](JobSpec& s) {
         s.mutable_is_correction()->set_rejection_level(
             static_cast<trainer::v1::RejectionLevel>(99));
       }),
       "spec.is_correction.rejection_level"},
      {"ZeroUpperBound", spec([](JobSpec& s) { s.mutable_is_correction()->set_upper_bound(0); }),
       "spec.is_correction.upper_bound"},
      {"NegativeLowerBound",
       spec([](JobSpec& s) { s.mutable_is_correction()->set_lower_bound(-1); }),
       "spec.is_correction.lower_bound"},
      {"UpperBelowLower", spec([](JobSpec& s) {
         s.mutable_is_correction()->set_upper_bound(0.5);
         s.mutable_is_correction()->set_lower_bound(1);
       }),
       "spec.is_correction.upper_bound"},
      // Modes.
      {"UnknownRoutingReplay", spec([](JobSpec& s) {
         s.set_routing_replay(static_cast<trainer::v1::RoutingReplayMode>(99));
       }),
       "spec.routing_replay"},
      {"UnknownSyncMode",
       spec([](JobSpec& s) { s.set_sync_mode(static_cast<trainer::v1::SyncMode>(99)); }),
       "spec.sync_mode"},
      {"StalenessInSync", spec([](JobSpec& s) { s.set_max_staleness(1); }), "spec.max_staleness"},
      {"StalenessBeyond16", spec([](JobSpec& s) {
         s.set_sync_mode(trainer::v1::SYNC_MODE_ASYNC);
         s.set_max_staleness(17);
       }),
       "spec.max_staleness"},
      {"PartialRolloutsInSync", spec([](JobSpec& s) { s.set_partial_rollouts(true); }),
       "spec.partial_rollouts"},
      // Parallelism: the spec's own rules, then this deployment's ranks (one).
      {"DataParallelBeyond1024",
       spec([](JobSpec& s) { s.mutable_parallelism()->set_data_parallel(2000); }),
       "spec.parallelism.data_parallel"},
      {"NegativeExpertParallel",
       spec([](JobSpec& s) { s.mutable_parallelism()->set_expert_parallel(-1); }),
       "spec.parallelism.expert_parallel"},
      {"ExpertParallelWithACritic", spec([](JobSpec& s) {
         s.set_algorithm(trainer::v1::ALGORITHM_PPO);
         s.mutable_parallelism()->set_expert_parallel(2);
       }),
       "spec.parallelism.expert_parallel"},
      {"RanksNotDividingTheGroups",
       spec([](JobSpec& s) { s.mutable_parallelism()->set_data_parallel(3); }),
       "spec.parallelism.data_parallel"},
      {"BalanceWithoutExpertParallel",
       spec([](JobSpec& s) { s.mutable_parallelism()->set_balance_experts(true); }),
       "spec.parallelism.balance_experts"},
      {"BalanceWithoutR3", spec([](JobSpec& s) {
         s.mutable_parallelism()->set_expert_parallel(2);
         s.mutable_parallelism()->set_balance_experts(true);
         s.set_routing_replay(trainer::v1::ROUTING_REPLAY_MODE_OFF);
       }),
       "spec.parallelism.balance_experts"},
      {"MoreDataRanksThanTheDeployment",
       spec([](JobSpec& s) { s.mutable_parallelism()->set_data_parallel(2); }),
       "spec.parallelism.data_parallel"},
      {"MoreExpertRanksThanTheDeployment",
       spec([](JobSpec& s) { s.mutable_parallelism()->set_expert_parallel(2); }),
       "spec.parallelism.expert_parallel"},
      // LoRA and the adapter's name.
      {"NoLora", spec([](JobSpec& s) { s.clear_lora(); }), "spec.lora.rank"},
      {"LoraRankBeyond1024", spec([](JobSpec& s) { s.mutable_lora()->set_rank(2000); }),
       "spec.lora.rank"},
      {"NegativeLoraAlpha", spec([](JobSpec& s) { s.mutable_lora()->set_alpha(-1); }),
       "spec.lora.alpha"},
      {"LoraDropoutOfOne", spec([](JobSpec& s) { s.mutable_lora()->set_dropout(1); }),
       "spec.lora.dropout"},
      {"UnknownExpertLayout", spec([](JobSpec& s) {
         s.mutable_lora()->set_expert_layout(static_cast<type::v1::ExpertLayout>(99));
       }),
       "spec.lora.expert_layout"},
      {"UnknownTargetModule", spec([](JobSpec& s) {
         s.mutable_lora()->add_target_modules("q_proj");
         s.mutable_lora()->add_target_modules("router");
       }),
       "spec.lora.target_modules[1]"},
      {"DuplicateTargetModule", spec([](JobSpec& s) {
         s.mutable_lora()->add_target_modules("q_proj");
         s.mutable_lora()->add_target_modules("v_proj");
         s.mutable_lora()->add_target_modules("q_proj");
       }),
       "spec.lora.target_modules[2]"},
      {"BadAdapterName", spec([](JobSpec& s) { s.set_adapter_name("two words"); }),
       "spec.adapter_name"},
      // GetJob, CancelJob, WatchJob: the job by job_id or name.
      {"GetNeitherIdNorName", get("", ""), "job_id"},
      {"GetABadId", get("a b", ""), "job_id"},
      {"GetABadName", get("", "job-1"), "name"},
      {"GetANestedName", get("", "jobs/a/b"), "name"},
      {"GetTwoJobs", get("job-a", "jobs/job-b"), "name"},
      {"CancelNeitherIdNorName", cancel("", ""), "job_id"},
      {"CancelABadId", cancel("../x", ""), "job_id"},
      {"CancelABadName", cancel("", "jobs/"), "name"},
      {"CancelTwoJobs", cancel("job-a", "jobs/job-b"), "name"},
      {"WatchNeitherIdNorName", watch("", ""), "job_id"},
      {"WatchABadId", watch("a b", ""), "job_id"},
      {"WatchABadName", watch("", "projects/p/jobs/x"), "name"},
      {"WatchTwoJobs", watch("job-a", "jobs/job-b"), "name"},
      // ListJobs.
      {"NegativePageSize", list([](trainer::v1::ListJobsRequest& r) { r.set_page_size(-1); }),
       "page_size"},
      {"MalformedPageToken",
       list([](trainer::v1::ListJobsRequest& r) { r.set_page_token("garbage"); }), "page_token"},
      {"PageTokenOfAnotherFilter", list([](trainer::v1::ListJobsRequest& r) {
         r.set_page_token("2/");  // Offset 2 of the unfiltered list.
         r.add_states(trainer::v1::JOB_STATE_RUNNING);
       }),
       "page_token"},
      {"UnspecifiedState", list([](trainer::v1::ListJobsRequest& r) {
         r.add_states(trainer::v1::JOB_STATE_UNSPECIFIED);
       }),
       "states[0]"},
      {"UnknownState", list([](trainer::v1::ListJobsRequest& r) {
         r.add_states(trainer::v1::JOB_STATE_RUNNING);
         r.add_states(static_cast<trainer::v1::JobState>(99));
       }),
       "states[1]"},
  };
  ExpectEachRefusedWithDetails(cases);
}

}  // namespace
}  // namespace tandem::trainer
