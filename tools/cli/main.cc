// tandem-cli: submit, list, watch and cancel jobs on the trainer; measure greedy accuracy of an
// adapter version through a rollout replica; export a version as a PEFT adapter. Exits non-zero
// with a message on any error.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/channel.h"
#include "common/peer_tls.h"
#include "common/server_options.h"
#include "common/status.h"
#include "engine/tasks.h"
#include "google/protobuf/util/json_util.h"
#include "services/rollout/client/task_accuracy.h"
#include "services/weight_store/client/peft_export.h"
#include "tandem/rollout/v1/rollout.grpc.pb.h"
#include "tandem/trainer/v1/trainer.grpc.pb.h"
#include "tandem/weightstore/v1/weight_store.grpc.pb.h"
#include "tools/cli/spec_file.h"
#include "tools/cli/step_metrics_tsv.h"

ABSL_FLAG(std::string, trainer, "127.0.0.1:50051", "Trainer address.");
ABSL_FLAG(std::string, rollout, "127.0.0.1:50052", "Rollout address (eval).");
ABSL_FLAG(std::string, spec, "", "submit: job spec file (.json, .yaml or .yml).");
ABSL_FLAG(std::string, request_id, "", "submit: idempotency key; empty: derived from the spec.");
ABSL_FLAG(bool, watch, false, "submit: watch the job until it ends.");
ABSL_FLAG(std::string, metrics_tsv, "",
          "watch (and submit --watch): also write every step's StepMetrics to this file as "
          "tab-separated values, a header naming the fields, then a row per step.");
ABSL_FLAG(std::string, state, "", "list: only jobs in this state (e.g. RUNNING).");
ABSL_FLAG(std::string, adapter, "", "eval: adapter name; empty: the base model.");
ABSL_FLAG(int64_t, version, 0, "eval: adapter version; export: version, 0 for the newest.");
ABSL_FLAG(std::string, out, "", "export: directory to write the PEFT adapter into.");
ABSL_FLAG(std::string, weight_store, "127.0.0.1:50053", "export: weight-store address.");
ABSL_FLAG(std::string, base_model_name, "",
          "export: base_model_name_or_path to write; empty: the job's base_model_path.");
ABSL_FLAG(std::string, task, "addition", "eval: task.");
ABSL_FLAG(int, digits, 2, "eval: task digits.");
ABSL_FLAG(int, prompts, 200, "eval: prompts.");
ABSL_FLAG(double, temperature, 0, "eval: sampling temperature; 0 answers greedily.");

// Defined with the servers' flags: the bearer token file (empty: $TANDEM_AUTH_TOKEN).
ABSL_DECLARE_FLAG(std::string, auth_token_file);

namespace tandem::cli {
namespace {

constexpr char kUsage[] =
    "tandem-cli COMMAND [flags]\n"
    "  submit --spec=FILE [--watch]   create a job from a JSON or YAML JobSpec\n"
    "  list [--state=RUNNING]         list jobs, newest first\n"
    "  get JOB_ID                     print a job as JSON\n"
    "  watch JOB_ID                   follow a job's progress until it ends\n"
    "                                 (--metrics_tsv=FILE: every step's metrics as TSV)\n"
    "  cancel JOB_ID                  cancel a job\n"
    "  eval --adapter=A --version=N   accuracy of a version through rollout (greedy, or\n"
    "                                 sampled at --temperature)\n"
    "  export JOB_ID --out=DIR        write a version of the job's adapter (--version, default\n"
    "                                 the newest) as a PEFT LoRA directory";

absl::StatusOr<std::shared_ptr<grpc::Channel>> Channel(const std::string& target,
                                                       const std::string& service) {
  auto token = ReadAuthToken(absl::GetFlag(FLAGS_auth_token_file));
  if (!token.ok()) return token.status();
  auto tls = PeerTlsFromFlags();  // --peer_tls_*: the services speak TLS.
  if (!tls.ok()) return tls.status();
  return CreateChannel(
      {.target = target, .service_name = service, .auth_token = *token, .tls = *std::move(tls)});
}

absl::StatusOr<std::unique_ptr<trainer::v1::JobService::Stub>> Trainer() {
  auto channel = Channel(absl::GetFlag(FLAGS_trainer), "tandem.trainer.v1.JobService");
  if (!channel.ok()) return channel.status();
  return trainer::v1::JobService::NewStub(*channel);
}

// The call's status, its error details (field violations) kept.
absl::Status Check(const grpc::Status& status) { return FromGrpcStatus(status); }

// A job operand is its id or its resource name, "jobs/{id}".
template <typename Request>
void NameJob(const std::string& operand, Request& request) {
  if (absl::StartsWith(operand, "jobs/")) {
    request.set_name(operand);
  } else {
    request.set_job_id(operand);
  }
}

std::string ShortState(trainer::v1::JobState state) {
  return trainer::v1::JobState_Name(state).substr(10);
}

std::string ProgressLine(const trainer::v1::Job& job) {
  constexpr int kWidth = 24;
  const int64_t steps = std::max<int64_t>(job.spec().num_steps(), 1);
  const int filled = static_cast<int>(kWidth * job.current_step() / steps);
  std::string line =
      absl::StrFormat("[%s%s] %lld/%lld %s", std::string(filled, '#'),
                      std::string(kWidth - filled, '.'), static_cast<long long>(job.current_step()),
                      static_cast<long long>(steps), ShortState(job.state()));
  if (job.has_latest_metrics()) {
    const trainer::v1::StepMetrics& m = job.latest_metrics();
    absl::StrAppendFormat(&line,
                          "  reward %.3f  acc %.3f  len %.1f  route-disagree %.2f%%  "
                          "mismatch-k3 %.5f  grad %.3f  %.2f s/step (gen %.2f train %.2f "
                          "publish %.3f swap %.3f)",
                          m.reward_mean(), m.accuracy(), m.response_length_mean(),
                          100 * m.routing_disagreement_token_layer(), m.mismatch_kl_k3(),
                          m.grad_norm(), m.step_seconds(), m.generation_seconds(),
                          m.training_seconds(), m.publish_seconds(), m.swap_seconds());
    if (m.ranks_size() > 1) {
      absl::StrAppendFormat(&line, "  %d ranks (collectives %.3f s, %.2f MB)", m.ranks_size(),
                            m.collective_seconds(), m.collective_bytes() / 1e6);
    }
  }
  return line;
}

// Means over the steps a watch saw (consecutive steps may be coalesced by the server).
struct StepTotals {
  int steps = 0;
  double disagreement = 0, mismatch = 0, refit = 0, tokens = 0, seconds = 0;

  void Add(const trainer::v1::StepMetrics& m) {
    ++steps;
    disagreement += m.routing_disagreement_token_layer();
    mismatch += m.mismatch_kl_k3();
    refit += m.publish_seconds() + m.swap_seconds();
    tokens += static_cast<double>(m.response_tokens());
    seconds += m.step_seconds();
  }

  std::string Summary() const {
    const double n = std::max(steps, 1);
    return absl::StrFormat(
        "summary: steps %d  routing-disagreement %.4f  mismatch-k3 %.6f  refit-seconds %.4f  "
        "tokens-per-second %.0f",
        steps, disagreement / n, mismatch / n, refit / n, seconds > 0 ? tokens / seconds : 0.0);
  }
};

absl::Status Watch(const std::string& job_id) {
  auto trainer = Trainer();
  if (!trainer.ok()) return trainer.status();
  const std::string tsv_path = absl::GetFlag(FLAGS_metrics_tsv);
  std::ofstream tsv;
  if (!tsv_path.empty()) {
    tsv.open(tsv_path);
    if (!(tsv << StepMetricsTsvHeader() << "\n")) {
      return absl::PermissionDeniedError(absl::StrCat("cannot write ", tsv_path));
    }
  }
  grpc::ClientContext context;
  trainer::v1::WatchJobRequest request;
  NameJob(job_id, request);
  auto reader = (*trainer)->WatchJob(&context, request);
  trainer::v1::WatchJobResponse event;
  trainer::v1::Job last;
  StepTotals totals;
  while (reader->Read(&event)) {
    last = event.job();
    if (event.type() == trainer::v1::WATCH_EVENT_TYPE_STEP_COMPLETED) {
      totals.Add(last.latest_metrics());
      if (tsv.is_open()) tsv << StepMetricsTsvRow(last.latest_metrics()) << std::endl;
    }
    std::printf("%s\n", ProgressLine(last).c_str());
    std::fflush(stdout);
  }
  if (absl::Status status = Check(reader->Finish()); !status.ok()) return status;
  std::printf("%s\n", totals.Summary().c_str());
  if (last.state() == trainer::v1::JOB_STATE_SUCCEEDED) return absl::OkStatus();
  return absl::AbortedError(absl::StrCat("job ", job_id, " ended ", ShortState(last.state()),
                                         last.error_message().empty() ? "" : ": ",
                                         last.error_message()));
}

absl::Status Submit() {
  auto spec = ReadJobSpec(absl::GetFlag(FLAGS_spec));
  if (!spec.ok()) return spec.status();
  auto trainer = Trainer();
  if (!trainer.ok()) return trainer.status();
  trainer::v1::CreateJobRequest request;
  std::string request_id = absl::GetFlag(FLAGS_request_id);
  if (request_id.empty()) {
    request_id = absl::StrFormat("cli-%016x", std::hash<std::string>()(spec->SerializeAsString()));
  }
  request.set_request_id(request_id);
  *request.mutable_spec() = *std::move(spec);
  trainer::v1::Job response;
  grpc::ClientContext context;
  SetTimeout(context, absl::Seconds(30));
  if (absl::Status status = Check((*trainer)->CreateJob(&context, request, &response));
      !status.ok()) {
    return status;
  }
  std::printf("%s\n", response.id().c_str());
  std::fflush(stdout);
  return absl::GetFlag(FLAGS_watch) ? Watch(response.id()) : absl::OkStatus();
}

absl::Status List() {
  auto trainer = Trainer();
  if (!trainer.ok()) return trainer.status();
  trainer::v1::ListJobsRequest request;
  if (const std::string state = absl::GetFlag(FLAGS_state); !state.empty()) {
    trainer::v1::JobState parsed;
    if (!trainer::v1::JobState_Parse("JOB_STATE_" + state, &parsed)) {
      return absl::InvalidArgumentError(absl::StrCat("--state=", state, " is not a job state"));
    }
    request.add_states(parsed);
  }
  std::printf("%-18s %-10s %-9s %-8s %s\n", "JOB", "STATE", "STEP", "VERSION", "NAME");
  do {
    trainer::v1::ListJobsResponse response;
    grpc::ClientContext context;
    SetTimeout(context, absl::Seconds(30));
    if (absl::Status status = Check((*trainer)->ListJobs(&context, request, &response));
        !status.ok()) {
      return status;
    }
    for (const trainer::v1::Job& job : response.jobs()) {
      std::printf("%-18s %-10s %4lld/%-4lld %-8lld %s\n", job.id().c_str(),
                  ShortState(job.state()).c_str(), static_cast<long long>(job.current_step()),
                  static_cast<long long>(job.spec().num_steps()),
                  static_cast<long long>(job.policy_version()), job.spec().display_name().c_str());
    }
    request.set_page_token(response.next_page_token());
  } while (!request.page_token().empty());
  return absl::OkStatus();
}

absl::StatusOr<trainer::v1::Job> GetJob(trainer::v1::JobService::StubInterface& trainer,
                                        const std::string& job_id) {
  grpc::ClientContext context;
  SetTimeout(context, absl::Seconds(30));
  trainer::v1::GetJobRequest request;
  NameJob(job_id, request);
  trainer::v1::Job response;
  if (absl::Status status = Check(trainer.GetJob(&context, request, &response)); !status.ok()) {
    return status;
  }
  return response;
}

absl::Status Export(const std::string& job_id) {
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) return absl::InvalidArgumentError("export needs --out=DIR");
  auto trainer = Trainer();
  if (!trainer.ok()) return trainer.status();
  auto job = GetJob(**trainer, job_id);
  if (!job.ok()) return job.status();
  const std::string store_address = absl::GetFlag(FLAGS_weight_store);
  std::string base_model = absl::GetFlag(FLAGS_base_model_name);
  if (base_model.empty()) base_model = job->spec().base_model_path();
  auto channel = Channel(store_address, "tandem.weightstore.v1.WeightStoreService");
  if (!channel.ok()) return channel.status();
  weight_store::WeightStoreStubs store(*channel);
  auto version = weight_store::ExportPeftAdapter(store, job->spec().adapter_name(),
                                                 absl::GetFlag(FLAGS_version), out, base_model);
  if (!version.ok()) return version.status();
  std::printf("exported %s version %lld to %s\n", job->spec().adapter_name().c_str(),
              static_cast<long long>(*version), out.c_str());
  return absl::OkStatus();
}

absl::Status GetOrCancel(const std::string& command, const std::string& job_id) {
  auto trainer = Trainer();
  if (!trainer.ok()) return trainer.status();
  trainer::v1::Job job;
  if (command == "get") {
    auto got = GetJob(**trainer, job_id);
    if (!got.ok()) return got.status();
    job = *std::move(got);
  } else {
    grpc::ClientContext context;
    SetTimeout(context, absl::Seconds(30));
    trainer::v1::CancelJobRequest request;
    NameJob(job_id, request);
    trainer::v1::Job response;
    if (absl::Status status = Check((*trainer)->CancelJob(&context, request, &response));
        !status.ok()) {
      return status;
    }
    job = response;
  }
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  (void)google::protobuf::util::MessageToJsonString(job, &json, options);
  std::printf("%s", json.c_str());
  return absl::OkStatus();
}

absl::Status Eval() {
  auto task = engine::MakeTask(absl::GetFlag(FLAGS_task), absl::GetFlag(FLAGS_digits));
  if (!task.ok()) return task.status();
  auto channel = Channel(absl::GetFlag(FLAGS_rollout), "tandem.rollout.v1.RolloutService");
  if (!channel.ok()) return channel.status();
  auto rollout = rollout::v1::RolloutService::NewStub(*channel);
  auto accuracy = rollout::MeasureAccuracy(
      *rollout, **task,
      {.adapter = absl::GetFlag(FLAGS_adapter),
       .version = absl::GetFlag(FLAGS_version),
       .prompts = absl::GetFlag(FLAGS_prompts),
       .prompt_seed = 0x5eed0fe7a1,  // No training step uses it (steps mix job seed and step).
       .max_new_tokens = absl::GetFlag(FLAGS_digits) + 3,
       .temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature))});
  if (!accuracy.ok()) return accuracy.status();
  std::printf("accuracy %.3f (%d/%d)\n", accuracy->share(), accuracy->correct, accuracy->total);
  return absl::OkStatus();
}

absl::Status RunCommand(const std::vector<char*>& args) {
  if (args.size() < 2) return absl::InvalidArgumentError(kUsage);
  const std::string command = args[1];
  const std::string operand = args.size() > 2 ? args[2] : "";
  if (command == "submit") return Submit();
  if (command == "list") return List();
  if (command == "eval") return Eval();
  if (command == "get" || command == "cancel" || command == "watch" || command == "export") {
    if (operand.empty())
      return absl::InvalidArgumentError(absl::StrCat(command, " needs a JOB_ID"));
    if (command == "export") return Export(operand);
    return command == "watch" ? Watch(operand) : GetOrCancel(command, operand);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown command '", command, "'\n", kUsage));
}

}  // namespace
}  // namespace tandem::cli

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(tandem::cli::kUsage);
  const std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  const absl::Status status = tandem::cli::RunCommand(args);
  if (!status.ok()) {
    std::fprintf(stderr, "tandem-cli: %s\n", std::string(status.message()).c_str());
    // The fields the server named as wrong, read from the error's details.
    for (const tandem::FieldViolation& violation : tandem::FieldViolations(status)) {
      std::fprintf(stderr, "tandem-cli: field %s: %s\n", violation.field.c_str(),
                   violation.description.c_str());
    }
    return 1;
  }
  return 0;
}
