// Throughput of the embedded engine on the default config: prefill, decode and LoRA
// training tokens/s, KV-cache bytes per token, and, on a trained base model, how often bf16 and
// FP8 rollout routing disagrees with fp32 training routing and the resulting log-prob mismatch.
// Prints its figures.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "engine/cpu_model_ops.h"
#include "engine/generator.h"
#include "engine/hf/hf_model.h"
#include "engine/model.h"
#include "engine/sft.h"
#include "engine/tasks.h"
#include "engine/tokenizer.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/loss.h"

ABSL_FLAG(std::string, base_model, "",
          "Trained base model (make_base_model) or HF directory; empty: a random model of the "
          "default config, resized by the flags below.");
ABSL_FLAG(int, d_model, 0, "Random model: hidden size (0: the default config's).");
ABSL_FLAG(int, num_layers, 0, "Random model: layers (0: the default config's).");
ABSL_FLAG(int, num_experts, 0, "Random model: routed experts per MoE layer (0: default).");
ABSL_FLAG(int, top_k, 0, "Random model: experts per token (0: the default config's).");
ABSL_FLAG(int, threads, 1, "OpenBLAS threads.");
ABSL_FLAG(int, sequences, 64, "Sequences per batch.");

namespace tandem::engine {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::vector<GenerationRequest> Requests(const Task& task, int count) {
  std::vector<GenerationRequest> requests;
  int index = 0;
  for (const Sample& sample : GeneratePrompts(task, count, 7)) {
    GenerationRequest request;
    request.prompt = *PromptTokens(sample.prompt);
    request.max_new_tokens = 24;  // No stop token: every sequence decodes the full length.
    request.seed = MixSeed(7, index++);
    requests.push_back(std::move(request));
  }
  return requests;
}

void BenchGeneration(Transformer& transformer, const std::vector<GenerationRequest>& requests) {
  GenerationBatch batch(transformer);
  int64_t prompt_tokens = 0;
  auto start = std::chrono::steady_clock::now();
  for (const GenerationRequest& request : requests) {
    batch.Admit(request).IgnoreError();
    prompt_tokens += static_cast<int64_t>(request.prompt.size());
  }
  const double prefill_seconds = SecondsSince(start);
  start = std::chrono::steady_clock::now();
  int64_t decoded = 0;
  while (batch.active() > 0) {
    decoded += batch.active();
    batch.Step().IgnoreError();  // The CPU engine's steps do not fail.
  }
  const double decode_seconds = SecondsSince(start);
  std::printf("prefill: %8.0f tokens/s (%lld prompt tokens)\n", prompt_tokens / prefill_seconds,
              static_cast<long long>(prompt_tokens));
  std::printf("decode:  %8.0f tokens/s (batch %zu, %lld tokens)\n", decoded / decode_seconds,
              requests.size(), static_cast<long long>(decoded));
  std::printf("kv cache: %lld bytes per token\n",
              static_cast<long long>(batch.kv_bytes_per_token()));
}

void BenchTraining(BaseModel& model, const std::vector<GeneratedSample>& samples) {
  LoraAdapter adapter = *LoraAdapter::Create(model.config(), LoraConfig{}, 3);
  adapter.parameters().EnableGradients();
  Transformer transformer(model, &adapter, std::make_unique<CpuModelOps>(model.config()));
  TokenBatch batch;
  for (const GeneratedSample& sample : samples) {
    batch.Add(std::vector<int>(sample.tokens.begin(), sample.tokens.end() - 1));
  }
  std::vector<float> dlogits(static_cast<size_t>(batch.num_tokens()) * model.config().vocab_size,
                             1e-3f);
  constexpr int kRepeats = 5;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kRepeats; ++i) {
    transformer.Forward(batch, nullptr).IgnoreError();
    transformer.Backward(dlogits.data()).IgnoreError();  // The CPU backend cannot fail.
  }
  std::printf("train (LoRA forward+backward): %8.0f tokens/s (%d tokens per batch)\n",
              kRepeats * batch.num_tokens() / SecondsSince(start), batch.num_tokens());
}

// Log-probabilities of each sequence's next tokens, from logits [tokens, vocab] of `batch`.
std::vector<double> NextTokenLogprobs(const float* logits, const TokenBatch& batch,
                                      const std::vector<GeneratedSample>& samples, int vocab) {
  std::vector<float> logp(static_cast<size_t>(batch.num_tokens()) * vocab);
  cpu::LogSoftmax(logits, logp.data(), batch.num_tokens(), vocab);
  std::vector<double> next;
  for (int s = 0; s < batch.num_sequences(); ++s) {
    for (int t = batch.sequence_starts[s]; t < batch.sequence_starts[s + 1]; ++t) {
      const int next_token = samples[s].tokens[t - batch.sequence_starts[s] + 1];
      next.push_back(logp[static_cast<size_t>(t) * vocab + next_token]);
    }
  }
  return next;
}

// Mean k3 = exp(-d) + d - 1 of d = log p_trainer - log p_rollout over the tokens.
double MismatchK3(const std::vector<double>& trainer, const std::vector<double>& rollout) {
  double sum = 0;
  for (size_t i = 0; i < trainer.size(); ++i) {
    const double d = trainer[i] - rollout[i];
    sum += std::exp(-d) + d - 1;
  }
  return sum / static_cast<double>(trainer.size());
}

// How a rollout of each reduced precision disagrees with fp32 training on the same sequences:
// routing decisions, and the log-prob mismatch (k3) without replay and with R3.
void ReportRolloutMismatch(BaseModel& model, const std::vector<GeneratedSample>& samples) {
  TokenBatch batch;
  for (const GeneratedSample& sample : samples) {
    batch.Add(std::vector<int>(sample.tokens.begin(), sample.tokens.end() - 1));
  }
  const int vocab = model.config().vocab_size;
  Transformer trainer(model, nullptr, std::make_unique<CpuModelOps>(model.config()));
  const std::vector<double> live =
      NextTokenLogprobs(*trainer.Forward(batch, nullptr), batch, samples, vocab);
  for (const auto& [precision, name] :
       {std::pair{Precision::kBF16, "bf16"}, std::pair{Precision::kFP8, "fp8 "},
        std::pair{Precision::kInt8, "int8"}}) {
    BaseModel served = model.ForPrecision(precision);
    Transformer rollout(served, nullptr, std::make_unique<CpuModelOps>(served.config()), precision);
    const std::vector<double> rollout_logp =
        NextTokenLogprobs(*rollout.Forward(batch, nullptr), batch, samples, vocab);
    const std::vector<int16_t> rollout_routes = rollout.routes();
    const std::vector<double> replayed =
        NextTokenLogprobs(*trainer.Forward(batch, &rollout_routes), batch, samples, vocab);
    const RoutingStats& stats = trainer.routing_stats();
    std::printf(
        "%s rollout vs fp32 training: %.2f%% of token×layer routing decisions differ (%.2f%% of "
        "tokens in some layer); mismatch k3 %.2e without replay, %.2e with R3\n",
        name, 100 * stats.decision_disagreement(), 100 * stats.token_disagreement(),
        MismatchK3(live, rollout_logp), MismatchK3(replayed, rollout_logp));
  }
}

int Main() {
  cpu::SetBlasThreads(absl::GetFlag(FLAGS_threads));
  const std::string path = absl::GetFlag(FLAGS_base_model);
  const ModelConfig random_config =
      ScaledDefaultModelConfig(absl::GetFlag(FLAGS_d_model), absl::GetFlag(FLAGS_num_layers),
                               absl::GetFlag(FLAGS_num_experts), absl::GetFlag(FLAGS_top_k));
  auto model = path.empty() ? BaseModel::Create(random_config, 1) : hf::LoadBaseModel(path);
  if (!model.ok()) {
    std::fprintf(stderr, "engine_bench: %s\n", model.status().ToString().c_str());
    return 1;
  }
  const ModelConfig& config = model->config();
  std::printf("model: %lld parameters, %s; d_model %d, %d layers, top-%d of %d experts\n",
              static_cast<long long>(model->parameters().num_elements()),
              path.empty() ? "random" : path.c_str(), config.d_model, config.num_layers,
              config.top_k, config.num_experts);
  auto task = MakeTask("addition", 2);
  const std::vector<GenerationRequest> requests = Requests(**task, absl::GetFlag(FLAGS_sequences));
  Transformer transformer(*model, nullptr, std::make_unique<CpuModelOps>(model->config()));
  BenchGeneration(transformer, requests);
  auto samples = Generate(transformer, requests);
  if (!samples.ok()) return 1;
  BenchTraining(*model, *samples);
  ReportRolloutMismatch(*model, *samples);
  return 0;
}

}  // namespace
}  // namespace tandem::engine

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tandem::engine::Main();
}
