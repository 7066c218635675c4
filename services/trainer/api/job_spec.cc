#include "services/trainer/api/job_spec.h"

#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/checksum.h"
#include "common/identifier.h"
#include "common/status.h"
#include "common/string_limits.h"
#include "engine/tasks.h"
#include "engine/verifiers/verifier.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "services/rollout/client/sampling_rules.h"
#include "services/trainer/update/policy_update_config.h"
#include "transfer/lora_layout.h"

namespace tandem::trainer {
namespace {

// TaskSpec.params' one key.
constexpr char kTaskDigits[] = "digits";

// The dotted path a message starts with: "spec.algorithm_config.learning_rate" of
// "spec.algorithm_config.learning_rate is -1; ...".
absl::string_view LeadingFieldPath(absl::string_view message) {
  const size_t end = message.find_first_not_of(
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.[]");
  return absl::StripSuffix(message.substr(0, end), ".");
}

// INVALID_ARGUMENT "spec.<parts>", whose details name the field the message starts with.
absl::Status Invalid(auto&&... parts) {
  const std::string message = absl::StrCat("spec.", parts...);
  return InvalidField(LeadingFieldPath(message), message);
}

// As Invalid, for a message that does not start with the field's path: a map entry
// (`spec.task.params["digits"]`), one of two fields a rule compares.
absl::Status InvalidAt(absl::string_view path, auto&&... parts) {
  return InvalidField(path, absl::StrCat("spec.", parts...));
}

std::string TaskParamPath(absl::string_view key) { return KeyPath("spec.task.params", key); }

// transfer::ValidateLoraConfig's error, "lora.rank: 0 not in 1..1024", as "spec.lora: <it>"
// naming the field it starts with; a refused target module is named by its index.
absl::Status LoraError(const type::v1::LoraConfig& lora, const absl::Status& status) {
  const absl::string_view message = status.message();
  const absl::string_view field = message.substr(0, message.find(':'));
  std::string path = "spec.lora";
  if (absl::StartsWith(field, "lora.") &&
      field.find_first_not_of("abcdefghijklmnopqrstuvwxyz_.") == absl::string_view::npos) {
    path = absl::StrCat("spec.", field);
  }
  if (field == "lora.target_modules") {
    // The first module that is no LoRA target or repeats one before it.
    type::v1::LoraConfig one;
    one.set_rank(1);
    one.set_expert_layout(type::v1::EXPERT_LAYOUT_PER_EXPERT);
    one.add_target_modules();
    absl::flat_hash_set<absl::string_view> seen;
    for (int i = 0; i < lora.target_modules_size(); ++i) {
      one.set_target_modules(0, lora.target_modules(i));
      if (!transfer::ValidateLoraConfig(one).ok() || !seen.insert(lora.target_modules(i)).second) {
        path = IndexPath(path, i);
        break;
      }
    }
  }
  return InvalidAt(path, "lora: ", message);
}

// Comparisons that NaN fails: a NaN hyperparameter is refused, never silently clipped.
bool AtLeast(double value, double low) { return value >= low; }
bool Within(double value, double low, double high) { return value >= low && value <= high; }

// The trainer computes in float: a value that float rounds to infinity or to zero would fail at
// the first step or silently switch its term off. Nonzero values must narrow to a normal float.
absl::Status CheckFloatRange(const char* field, double value) {
  const double magnitude = std::abs(value);
  if (value == 0 || (magnitude >= std::numeric_limits<float>::min() &&
                     magnitude <= std::numeric_limits<float>::max())) {
    return absl::OkStatus();
  }
  return Invalid("algorithm_config.", field, " is ", value, "; the trainer computes in float, ",
                 "which holds magnitudes ", std::numeric_limits<float>::min(), "..",
                 std::numeric_limits<float>::max(), " (or 0 where 0 is allowed)");
}

// An enum field holding a number its enum does not define (a newer client, a typo in JSON).
absl::Status CheckEnum(const char* field, int value, bool (*is_valid)(int)) {
  if (is_valid(value)) return absl::OkStatus();
  return Invalid(field, " is ", value, ", which is no value of its enum");
}

absl::Status CheckData(trainer::v1::JobSpec& spec) {
  switch (spec.data_case()) {
    case trainer::v1::JobSpec::kTask: {
      trainer::v1::TaskSpec& task = *spec.mutable_task();
      for (const auto& [key, value] : task.params()) {
        if (key != kTaskDigits) {
          return InvalidAt(TaskParamPath(key), "task.params: unknown key '", key, "'");
        }
      }
      auto& params = *task.mutable_params();
      params.try_emplace(kTaskDigits, absl::StrCat(engine::kDefaultTaskDigits));
      int digits = 0;
      if (!absl::SimpleAtoi(params.at(kTaskDigits), &digits)) {
        return InvalidAt(TaskParamPath(kTaskDigits), "task.params.digits: '",
                         params.at(kTaskDigits), "' is not a number");
      }
      auto made = engine::MakeTask(task.name(), digits);
      if (!made.ok()) {
        // An unknown task is NOT_FOUND to the engine, digits out of range INVALID_ARGUMENT.
        return InvalidAt(absl::IsNotFound(made.status()) ? std::string("spec.task.name")
                                                         : TaskParamPath(kTaskDigits),
                         "task: ", made.status().message());
      }
      return absl::OkStatus();
    }
    case trainer::v1::JobSpec::kDataset: {
      trainer::v1::DatasetSpec& dataset = *spec.mutable_dataset();
      if (dataset.path().empty()) return Invalid("dataset.path is required");
      if (auto verifier = engine::FindVerifier(dataset.verifier()); !verifier.ok()) {
        return Invalid("dataset.verifier: ", verifier.status().message());
      }
      if (dataset.prompt_field().empty()) dataset.set_prompt_field("prompt");
      if (dataset.answer_field().empty()) dataset.set_answer_field("answer");
      if (dataset.messages_field().empty()) dataset.set_messages_field("messages");
      return absl::OkStatus();
    }
    default:
      return Invalid("task or dataset is required");
  }
}

absl::Status CheckAlgorithm(trainer::v1::JobSpec& spec) {
  switch (spec.algorithm()) {
    case trainer::v1::ALGORITHM_GRPO:
    case trainer::v1::ALGORITHM_DR_GRPO:
      if (spec.group_size() < 2) {
        return Invalid("group_size: ", trainer::v1::Algorithm_Name(spec.algorithm()),
                       " needs >= 2");
      }
      break;
    case trainer::v1::ALGORITHM_PPO:
      break;
    default:
      return Invalid("algorithm is required (GRPO, DR_GRPO or PPO)");
  }
  trainer::v1::AlgorithmConfig& config = *spec.mutable_algorithm_config();
  if (!(config.learning_rate() > 0) || !std::isfinite(config.learning_rate())) {
    return Invalid("algorithm_config.learning_rate is ", config.learning_rate(),
                   "; must be > 0 and finite");
  }
  if (!AtLeast(config.weight_decay(), 0) || !std::isfinite(config.weight_decay())) {
    return Invalid("algorithm_config.weight_decay is ", config.weight_decay(),
                   "; must be >= 0 and finite");
  }
  if (!config.has_max_grad_norm()) config.set_max_grad_norm(PolicyUpdateConfig{}.max_grad_norm);
  if (!AtLeast(config.max_grad_norm(), 0)) {
    return Invalid("algorithm_config.max_grad_norm is ", config.max_grad_norm(), "; must be >= 0");
  }
  for (const auto& [name, value] : {std::pair{"learning_rate", config.learning_rate()},
                                    std::pair{"weight_decay", config.weight_decay()},
                                    std::pair{"max_grad_norm", config.max_grad_norm()}}) {
    if (absl::Status status = CheckFloatRange(name, value); !status.ok()) return status;
  }
  if (!config.has_clip_eps_low()) config.set_clip_eps_low(PolicyLossConfig{}.clip_low);
  if (!(config.clip_eps_low() >= 0 && config.clip_eps_low() < 1)) {
    return Invalid("algorithm_config.clip_eps_low is ", config.clip_eps_low(),
                   "; must be in [0, 1)");
  }
  if (!config.has_clip_eps_high()) config.set_clip_eps_high(config.clip_eps_low());
  if (!AtLeast(config.clip_eps_high(), 0) || !std::isfinite(config.clip_eps_high())) {
    return Invalid("algorithm_config.clip_eps_high is ", config.clip_eps_high(),
                   "; must be >= 0 and finite");
  }
  if (!config.has_dual_clip_c()) config.set_dual_clip_c(PolicyLossConfig{}.dual_clip_c);
  if (config.dual_clip_c() != 0 &&
      !(config.dual_clip_c() > 1 && std::isfinite(config.dual_clip_c()))) {
    return Invalid("algorithm_config.dual_clip_c is ", config.dual_clip_c(),
                   "; must be > 1 and finite (or 0 to disable)");
  }
  if (!AtLeast(config.kl_coef(), 0) || !std::isfinite(config.kl_coef())) {
    return Invalid("algorithm_config.kl_coef is ", config.kl_coef(), "; must be >= 0 and finite");
  }
  if (absl::Status status = CheckEnum("algorithm_config.kl_estimator", config.kl_estimator(),
                                      trainer::v1::KlEstimator_IsValid);
      !status.ok()) {
    return status;
  }
  if (config.kl_estimator() == trainer::v1::KL_ESTIMATOR_UNSPECIFIED) {
    config.set_kl_estimator(trainer::v1::KL_ESTIMATOR_K3);
  }
  if (!config.has_gamma()) config.set_gamma(CriticConfig{}.gamma);
  if (!config.has_gae_lambda()) config.set_gae_lambda(CriticConfig{}.lambda);
  if (!Within(config.gamma(), 0, 1) || !Within(config.gae_lambda(), 0, 1)) {
    return InvalidAt(Within(config.gamma(), 0, 1) ? "spec.algorithm_config.gae_lambda"
                                                  : "spec.algorithm_config.gamma",
                     "algorithm_config.gamma and gae_lambda must be in [0, 1]; gamma is ",
                     config.gamma(), ", gae_lambda ", config.gae_lambda());
  }
  const bool ppo = spec.algorithm() == trainer::v1::ALGORITHM_PPO;
  if (!config.has_whiten_advantages()) config.set_whiten_advantages(ppo);
  if (!config.has_value_loss_coef()) config.set_value_loss_coef(CriticConfig{}.loss_coef);
  if (!config.has_value_clip()) config.set_value_clip(CriticConfig{}.value_clip);
  if (!config.has_value_learning_rate()) {
    config.set_value_learning_rate(kCriticLearningRateFactor * config.learning_rate());
  }
  if (!(config.value_learning_rate() > 0) || !std::isfinite(config.value_learning_rate())) {
    return Invalid("algorithm_config.value_learning_rate is ", config.value_learning_rate(),
                   "; must be > 0 and finite");
  }
  if (absl::Status status = CheckFloatRange("value_learning_rate", config.value_learning_rate());
      !status.ok()) {
    return status;
  }
  for (const auto& [name, value] : {std::pair{"value_loss_coef", config.value_loss_coef()},
                                    std::pair{"value_clip", config.value_clip()}}) {
    if (!AtLeast(value, 0) || !std::isfinite(value)) {
      return Invalid("algorithm_config.", name, " is ", value, "; must be >= 0 and finite");
    }
  }
  if (absl::Status status =
          CheckEnum("algorithm_config.loss_aggregation", config.loss_aggregation(),
                    trainer::v1::LossAggregation_IsValid);
      !status.ok()) {
    return status;
  }
  if (config.loss_aggregation() == trainer::v1::LOSS_AGGREGATION_UNSPECIFIED) {
    config.set_loss_aggregation(trainer::v1::LOSS_AGGREGATION_TOKEN_MEAN);
  }
  if (config.updates_per_step() == 0) {
    config.set_updates_per_step(PolicyUpdateConfig{}.updates_per_step);
  }
  if (config.updates_per_step() < 1 || spec.prompts_per_step() % config.updates_per_step() != 0) {
    return Invalid("algorithm_config.updates_per_step must be >= 1 and divide prompts_per_step");
  }
  return absl::OkStatus();
}

absl::Status CheckParallelism(trainer::v1::JobSpec& spec) {
  trainer::v1::Parallelism& parallelism = *spec.mutable_parallelism();
  if (parallelism.data_parallel() == 0) parallelism.set_data_parallel(1);
  if (parallelism.expert_parallel() == 0) parallelism.set_expert_parallel(1);
  const int64_t data = parallelism.data_parallel(), experts = parallelism.expert_parallel();
  if (data < 1 || data > kMaxDataParallel) {
    return Invalid("parallelism.data_parallel is ", data, "; must be in 1..", kMaxDataParallel);
  }
  if (experts < 1 || data * experts > kMaxDataParallel) {
    return Invalid("parallelism.expert_parallel is ", experts,
                   "; must be >= 1 with data_parallel x expert_parallel at most ",
                   kMaxDataParallel);
  }
  if (experts > 1 && spec.algorithm() == trainer::v1::ALGORITHM_PPO) {
    return Invalid("parallelism.expert_parallel ", experts,
                   ": a critic (ALGORITHM_PPO) does not train expert-parallel yet");
  }
  // Each rank trains whole groups of every mini-batch (DataParallelShare).
  const int64_t ranks = data * experts;
  const int groups_per_update =
      spec.prompts_per_step() / spec.algorithm_config().updates_per_step();
  if (groups_per_update % ranks != 0) {
    return Invalid("parallelism.data_parallel x expert_parallel (", ranks,
                   " ranks) must divide the ", groups_per_update,
                   " prompt groups of each update (prompts_per_step / updates_per_step)");
  }
  return absl::OkStatus();
}

// Balancing experts needs ranks to move them between and the step's routes to plan with.
absl::Status CheckExpertBalance(trainer::v1::JobSpec& spec) {
  if (!spec.parallelism().balance_experts()) return absl::OkStatus();
  if (spec.parallelism().expert_parallel() < 2) {
    return Invalid("parallelism.balance_experts needs parallelism.expert_parallel >= 2");
  }
  if (spec.routing_replay() != trainer::v1::ROUTING_REPLAY_MODE_R3) {
    return Invalid(
        "parallelism.balance_experts plans with the routes a step replays: it needs "
        "routing_replay R3");
  }
  return absl::OkStatus();
}

absl::Status CheckSchedule(trainer::v1::JobSpec& spec) {
  trainer::v1::LearningRateSchedule& schedule =
      *spec.mutable_algorithm_config()->mutable_lr_schedule();
  if (absl::Status status = CheckEnum("algorithm_config.lr_schedule.decay", schedule.decay(),
                                      trainer::v1::LrDecay_IsValid);
      !status.ok()) {
    return status;
  }
  if (schedule.decay() == trainer::v1::LR_DECAY_UNSPECIFIED)
    schedule.set_decay(trainer::v1::LR_DECAY_CONSTANT);
  const int64_t updates = spec.num_steps() * spec.algorithm_config().updates_per_step();
  if (schedule.warmup_updates() < 0 || schedule.warmup_updates() > updates) {
    return Invalid("algorithm_config.lr_schedule.warmup_updates is ", schedule.warmup_updates(),
                   "; must be in 0..num_steps * updates_per_step = ", updates);
  }
  if (!Within(schedule.min_lr_ratio(), 0, 1)) {
    return Invalid("algorithm_config.lr_schedule.min_lr_ratio is ", schedule.min_lr_ratio(),
                   "; must be in [0, 1]");
  }
  return absl::OkStatus();
}

absl::Status CheckCorrection(trainer::v1::JobSpec& spec) {
  trainer::v1::IsCorrection& correction = *spec.mutable_is_correction();
  if (absl::Status status =
          CheckEnum("is_correction.mode", correction.mode(), trainer::v1::IsCorrectionMode_IsValid);
      !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckEnum("is_correction.rejection_level", correction.rejection_level(),
                                      trainer::v1::RejectionLevel_IsValid);
      !status.ok()) {
    return status;
  }
  if (correction.mode() == trainer::v1::IS_CORRECTION_MODE_UNSPECIFIED) {
    correction.set_mode(trainer::v1::IS_CORRECTION_MODE_NONE);
  }
  const trainer::v1::IsCorrectionMode mode = correction.mode();
  const bool icepop = mode == trainer::v1::IS_CORRECTION_MODE_ICEPOP;
  if (!correction.has_upper_bound()) {
    correction.set_upper_bound(icepop ? kIcePopUpper : IsConfig{}.upper);
  }
  if (!correction.has_lower_bound()) correction.set_lower_bound(IsConfig{}.lower);
  if (!(correction.upper_bound() > 0) || !AtLeast(correction.lower_bound(), 0) ||
      correction.upper_bound() < correction.lower_bound()) {
    // The bound to change: a lower bound below 0; else the upper one (<= 0, or below lower).
    return InvalidAt(AtLeast(correction.lower_bound(), 0) ? "spec.is_correction.upper_bound"
                                                          : "spec.is_correction.lower_bound",
                     "is_correction: need upper_bound > 0, lower_bound >= 0, upper >= lower; "
                     "upper_bound is ",
                     correction.upper_bound(), ", lower_bound ", correction.lower_bound());
  }
  if (correction.rejection_level() == trainer::v1::REJECTION_LEVEL_UNSPECIFIED) {
    correction.set_rejection_level(trainer::v1::REJECTION_LEVEL_TOKEN);
  }
  return absl::OkStatus();
}

// Every string of the spec against its size class (string_limits.h), before any other check
// repeats a value in its message.
absl::Status CheckStringSizes(trainer::v1::JobSpec& spec) {
  // The field's name in messages, the value, its limit, and its path from the request root.
  std::vector<std::tuple<std::string, absl::string_view, size_t, std::string>> strings = {
      {"display_name", spec.display_name(), kMaxNameBytes, "spec.display_name"},
      {"base_model_path", spec.base_model_path(), kMaxPathBytes, "spec.base_model_path"},
      {"output_dir", spec.output_dir(), kMaxPathBytes, "spec.output_dir"},
      {"initial_adapter_path", spec.initial_adapter_path(), kMaxPathBytes,
       "spec.initial_adapter_path"},
      {"initial_checkpoint_dir", spec.initial_checkpoint_dir(), kMaxPathBytes,
       "spec.initial_checkpoint_dir"},
      {"task.name", spec.task().name(), kMaxNameBytes, "spec.task.name"},
      {"dataset.path", spec.dataset().path(), kMaxPathBytes, "spec.dataset.path"},
      {"dataset.prompt_field", spec.dataset().prompt_field(), kMaxNameBytes,
       "spec.dataset.prompt_field"},
      {"dataset.answer_field", spec.dataset().answer_field(), kMaxNameBytes,
       "spec.dataset.answer_field"},
      {"dataset.messages_field", spec.dataset().messages_field(), kMaxNameBytes,
       "spec.dataset.messages_field"},
      {"dataset.verifier", spec.dataset().verifier(), kMaxNameBytes, "spec.dataset.verifier"}};
  for (const auto& [key, value] : spec.task().params()) {
    strings.emplace_back("task.params key", key, kMaxNameBytes, TaskParamPath(key));
    strings.emplace_back("task.params value", value, kMaxNameBytes, TaskParamPath(key));
  }
  for (const auto& [field, value, max_bytes, path] : strings) {
    if (absl::Status status = CheckMaxBytes(absl::StrCat("spec.", field), value, max_bytes);
        !status.ok()) {
      return WithFieldPath(status, path);
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSizes(trainer::v1::JobSpec& spec) {
  if (spec.base_model_path().empty()) return Invalid("base_model_path is required");
  if (!spec.initial_adapter_path().empty() && !spec.initial_checkpoint_dir().empty()) {
    return Invalid(
        "initial_adapter_path and initial_checkpoint_dir are exclusive; a job starts from one");
  }
  if (spec.prompts_per_step() < 1 || spec.prompts_per_step() > 65536) {
    return Invalid("prompts_per_step must be in 1..65536");
  }
  if (spec.group_size() < 1 || spec.group_size() > 256) {
    return Invalid("group_size must be in 1..256");
  }
  if (spec.num_steps() < 1 || spec.num_steps() > 10'000'000) {
    return Invalid("num_steps must be in 1..10^7");
  }
  if (spec.micro_batch_size() == 0) {
    spec.set_micro_batch_size(PolicyUpdateConfig{}.micro_batch_size);
  }
  if (spec.micro_batch_size() < 1 || spec.micro_batch_size() > 65536) {
    return Invalid("micro_batch_size is ", spec.micro_batch_size(), "; must be in 1..65536");
  }
  // The rollout's own rules, checked here so a job does not fail at its first step instead.
  // The vocabulary is the base model's, which is read when the job starts (JobRun::Init
  // checks top_k and the stop tokens against it then); here any size.
  if (spec.sampling().has_seed()) {
    return Invalid("sampling.seed is ", spec.sampling().seed(),
                   "; set spec.seed: the job derives every step's sampling seed from it");
  }
  *spec.mutable_sampling() = rollout::WithSamplingDefaults(spec.sampling());
  if (absl::Status status = rollout::ValidateSampling(
          spec.sampling(), std::numeric_limits<int>::max(), "spec.sampling");
      !status.ok()) {
    return Annotate(status, "spec.");
  }
  if (spec.checkpoint_every() < 0) return Invalid("checkpoint_every must be >= 0");
  return absl::OkStatus();
}

absl::Status CheckModes(trainer::v1::JobSpec& spec) {
  if (absl::Status status = CheckEnum("routing_replay", spec.routing_replay(),
                                      trainer::v1::RoutingReplayMode_IsValid);
      !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckEnum("sync_mode", spec.sync_mode(), trainer::v1::SyncMode_IsValid);
      !status.ok()) {
    return status;
  }
  if (spec.routing_replay() == trainer::v1::ROUTING_REPLAY_MODE_UNSPECIFIED) {
    spec.set_routing_replay(trainer::v1::ROUTING_REPLAY_MODE_R3);
  }
  if (spec.sync_mode() == trainer::v1::SYNC_MODE_UNSPECIFIED)
    spec.set_sync_mode(trainer::v1::SYNC_MODE_SYNC);
  if (spec.sync_mode() == trainer::v1::SYNC_MODE_SYNC && spec.max_staleness() != 0) {
    return Invalid("max_staleness must be 0 in SYNC");
  }
  if (spec.partial_rollouts() && spec.sync_mode() != trainer::v1::SYNC_MODE_ASYNC) {
    return Invalid(
        "partial_rollouts needs sync_mode ASYNC (in SYNC no version is published while "
        "samples generate)");
  }
  if (spec.sync_mode() == trainer::v1::SYNC_MODE_ASYNC) {
    if (spec.max_staleness() == 0) spec.set_max_staleness(1);
    if (spec.max_staleness() < 1 || spec.max_staleness() > 16) {
      return Invalid("max_staleness must be in 1..16");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<trainer::v1::JobSpec> ResolveJobSpec(const trainer::v1::JobSpec& original,
                                                    const std::string& job_id,
                                                    const std::string& default_output_dir) {
  trainer::v1::JobSpec spec = original;
  for (absl::Status (*check)(trainer::v1::JobSpec&) :
       {CheckStringSizes, CheckData, CheckSizes, CheckAlgorithm, CheckParallelism, CheckSchedule,
        CheckCorrection, CheckModes, CheckExpertBalance}) {
    if (absl::Status status = check(spec); !status.ok()) return status;
  }
  if (!spec.has_lora() || spec.lora().rank() < 1) return Invalid("lora.rank is required");
  *spec.mutable_lora() = transfer::WithLoraDefaults(spec.lora());
  if (absl::Status status = transfer::ValidateLoraConfig(spec.lora()); !status.ok()) {
    return LoraError(spec.lora(), status);
  }
  if (spec.adapter_name().empty()) spec.set_adapter_name(job_id);
  if (absl::Status status = ValidateIdentifier("spec.adapter_name", spec.adapter_name());
      !status.ok()) {
    return status;
  }
  if (spec.output_dir().empty()) spec.set_output_dir(default_output_dir);
  return spec;
}

std::string SpecFingerprint(const trainer::v1::JobSpec& original) {
  // A checkpoint holds the ranks' replicated state once: any number of ranks may resume it.
  trainer::v1::JobSpec spec = original;
  spec.clear_parallelism();
  std::string bytes;
  google::protobuf::io::StringOutputStream stream(&bytes);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  spec.SerializeToCodedStream(&coded);
  coded.Trim();
  return ChecksumToHex(Xxh3Checksum(absl::string_view(bytes)));
}

}  // namespace tandem::trainer
