// The engine on a GPU against the same engine on the CPU and against PyTorch: forward,
// forward + backward (into the LoRA) and greedy generation tokens/s of the services' GPU engines
// (engine/cuda/device_engines.h: the one model graph over the CUDA backend) on a random model of
// the default architecture (sizes from the flags), with the CPU Transformer's figures and
// its logits as the check. --out_dir writes the model, adapter, batch and GPU logits (CPU logits
// without a GPU) for tools/torch_reference/moe_reference.py, which checks them and times PyTorch
// eager on the same work.

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "engine/cuda/device_engines.h"
#include "engine/generator.h"
#include "engine/model.h"
#include "engine/transformer.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cuda/device.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(int, d_model, 0, "Hidden size (0: the default config's); FFN widths and heads scale.");
ABSL_FLAG(int, num_layers, 0, "Layers (0: the default config's).");
ABSL_FLAG(int, num_experts, 0, "Routed experts per MoE layer (0: the default config's).");
ABSL_FLAG(int, top_k, 0, "Experts per token (0: the default config's).");
ABSL_FLAG(int, sequences, 64, "Sequences per batch, each max_seq_len tokens long.");
ABSL_FLAG(bool, cpu, true, "Also time the CPU Transformer (slow for large models).");
ABSL_FLAG(std::string, out_dir, "", "Write the model, adapter, batch and logits here.");

namespace tandem::engine {
namespace {

// Seconds per call of `step`, after one warm-up call.
double SecondsPerCall(const std::function<bool()>& step, int calls = 5) {
  if (!step()) return -1;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) {
    if (!step()) return -1;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / calls;
}

// Greedy generation of the rest of each sequence from its first kPromptTokens tokens.
constexpr int kPromptTokens = 8;

std::vector<GenerationRequest> GenerationRequests(const TokenBatch& batch, int length) {
  std::vector<GenerationRequest> requests;
  for (int s = 0; s < batch.num_sequences(); ++s) {
    GenerationRequest request;
    request.prompt.assign(batch.tokens.begin() + int64_t{s} * length,
                          batch.tokens.begin() + int64_t{s} * length + kPromptTokens);
    request.max_new_tokens = length - kPromptTokens;
    request.sampling.temperature = 0;
    requests.push_back(std::move(request));
  }
  return requests;
}

// New tokens per second of generating `requests` (prefill and decode, after a warm-up run),
// keeping the sequences generated.
double GenerationTokensPerSecond(DecodeEngine& engine,
                                 const std::vector<GenerationRequest>& requests,
                                 std::vector<std::vector<int>>& generated) {
  absl::StatusOr<std::vector<GeneratedSample>> samples = Generate(engine, requests);
  if (!samples.ok()) return -1;
  const auto start = std::chrono::steady_clock::now();
  samples = Generate(engine, requests);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!samples.ok()) return -1;
  double new_tokens = 0;
  generated.clear();
  for (const GeneratedSample& sample : *samples) {
    new_tokens += static_cast<double>(sample.logprobs.size());
    generated.push_back(sample.tokens);
  }
  return new_tokens / seconds;
}

// Forward and forward + backward tokens/s of `training` and greedy generation tokens/s of
// `decoding`, printed under `name`. False if any of them failed (the error is printed).
bool Report(const char* name, TrainingEngine& training, DecodeEngine& decoding,
            const TokenBatch& batch, const std::vector<float>& dlogits, std::vector<float>* logits,
            std::vector<std::vector<int>>& generated) {
  const auto forward = [&] {
    absl::StatusOr<const float*> result = training.Forward(batch, nullptr);
    if (!result.ok())
      std::fprintf(stderr, "%s forward: %s\n", name, result.status().ToString().c_str());
    if (result.ok() && logits != nullptr) logits->assign(*result, *result + dlogits.size());
    return result.ok();
  };
  const auto train = [&] {
    if (!training.Forward(batch, nullptr).ok()) return false;
    const absl::Status status = training.Backward(dlogits.data(), nullptr);
    if (!status.ok()) std::fprintf(stderr, "%s backward: %s\n", name, status.ToString().c_str());
    return status.ok();
  };
  const double tokens = batch.num_tokens();
  const double forward_s = SecondsPerCall(forward);
  const double train_s = SecondsPerCall(train);
  const double generation = GenerationTokensPerSecond(
      decoding, GenerationRequests(batch, decoding.config().max_seq_len), generated);
  std::printf(
      "%-6s forward %10.0f tokens/s   forward+backward %10.0f tokens/s   generation %10.0f "
      "new tokens/s\n",
      name, tokens / forward_s, tokens / train_s, generation);
  return forward_s > 0 && train_s > 0 && generation > 0;
}

// The services' engines on `device` (fp32), timed by Report.
bool ReportDevice(const char* device, BaseModel& model, LoraAdapter& lora, const TokenBatch& batch,
                  const std::vector<float>& dlogits, std::vector<float>& logits,
                  std::vector<std::vector<int>>& generated) {
  absl::StatusOr<TrainingEngines> training = MakeTrainingEngines(device, model, lora);
  absl::StatusOr<DecodeEngineMaker> maker = MakeDecodeEngineMaker(device, Precision::kF32);
  absl::StatusOr<std::unique_ptr<DecodeEngine>> decoding =
      maker.ok() ? (*maker)(model, &lora)
                 : absl::StatusOr<std::unique_ptr<DecodeEngine>>(maker.status());
  for (const absl::Status& status : {training.status(), decoding.status()}) {
    if (!status.ok()) {
      std::fprintf(stderr, "engine_cuda_bench: %s: %s\n", device, status.ToString().c_str());
      return false;
    }
  }
  return Report(device, *training->policy, **decoding, batch, dlogits, &logits, generated);
}

absl::Status WriteFloats(const std::string& path, const std::vector<float>& values) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  return out ? absl::OkStatus() : absl::InternalError("cannot write " + path);
}

absl::Status WriteReferenceInputs(const std::string& dir, const BaseModel& model,
                                  const LoraAdapter& lora, const TokenBatch& batch,
                                  const std::vector<float>& logits,
                                  const std::vector<std::vector<int>>& generated) {
  if (absl::Status status = model.Save(dir + "/model.safetensors"); !status.ok()) return status;
  if (absl::Status status = lora.Save(dir + "/adapter.safetensors"); !status.ok()) return status;
  std::ofstream(dir + "/config.json") << model.config().ToJson();
  const int length = model.config().max_seq_len;
  nlohmann::json sequences = nlohmann::json::array();
  for (int s = 0; s < batch.num_sequences(); ++s) {
    sequences.push_back(std::vector<int>(batch.tokens.begin() + s * length,
                                         batch.tokens.begin() + (s + 1) * length));
  }
  std::ofstream(dir + "/batch.json") << nlohmann::json{
      {"tokens", sequences},
      {"lora_scale", lora.config().scale()},
      {"prompt_tokens", kPromptTokens},
      {"generated", generated}}.dump();
  return WriteFloats(dir + "/logits.f32", logits);
}

int Main() {
  const bool gpu_visible = ::tandem::cuda::VisibleDeviceCount() > 0;
  if (!gpu_visible) std::printf("engine_cuda_bench: no GPU visible; CPU figures only\n");
  // The CPU figure with every core: the machine's best, not a handicapped baseline.
  cpu::SetBlasThreads(static_cast<int>(std::thread::hardware_concurrency()));
  const ModelConfig config =
      ScaledDefaultModelConfig(absl::GetFlag(FLAGS_d_model), absl::GetFlag(FLAGS_num_layers),
                               absl::GetFlag(FLAGS_num_experts), absl::GetFlag(FLAGS_top_k));
  absl::StatusOr<BaseModel> model = BaseModel::Create(config, 1);
  absl::StatusOr<LoraAdapter> lora = LoraAdapter::Create(config, LoraConfig{}, 2);
  if (!model.ok() || !lora.ok()) return 1;
  std::mt19937_64 rng(3);
  for (const std::string& name : lora->parameters().names()) {  // B = 0 would hide the LoRA.
    ParameterSet::FillNormal(*lora->parameters().Find(name), 0.05f, rng);
  }
  lora->parameters().EnableGradients();
  std::uniform_int_distribution<int> token(0, config.vocab_size - 1);
  TokenBatch batch;
  for (int s = 0; s < absl::GetFlag(FLAGS_sequences); ++s) {
    std::vector<int> sequence(config.max_seq_len);
    for (int& t : sequence) t = token(rng);
    batch.Add(sequence);
  }
  std::vector<float> dlogits(static_cast<size_t>(batch.num_tokens()) * config.vocab_size);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  for (float& d : dlogits) d = normal(rng);
  std::printf(
      "model: %lld parameters; d_model %d, %d layers, top-%d of %d experts; %d x %d tokens\n",
      static_cast<long long>(model->parameters().num_elements()), config.d_model, config.num_layers,
      config.top_k, config.num_experts, batch.num_sequences(), config.max_seq_len);

  std::vector<float> gpu_logits, cpu_logits;
  std::vector<std::vector<int>> gpu_generated, cpu_generated;
  if (gpu_visible &&
      !ReportDevice("cuda", *model, *lora, batch, dlogits, gpu_logits, gpu_generated)) {
    return 1;
  }
  if ((absl::GetFlag(FLAGS_cpu) || !gpu_visible) &&
      !ReportDevice("cpu", *model, *lora, batch, dlogits, cpu_logits, cpu_generated)) {
    return 1;
  }
  if (!gpu_logits.empty() && !cpu_logits.empty()) {
    float largest = 0;
    for (size_t i = 0; i < gpu_logits.size(); ++i) {
      largest = std::max(largest, std::abs(gpu_logits[i] - cpu_logits[i]));
    }
    std::printf("max |logit difference| cuda vs cpu: %.3g\n", largest);
  }
  const std::string dir = absl::GetFlag(FLAGS_out_dir);
  if (dir.empty()) return 0;
  const absl::Status written =
      WriteReferenceInputs(dir, *model, *lora, batch, gpu_visible ? gpu_logits : cpu_logits,
                           gpu_visible ? gpu_generated : cpu_generated);
  if (!written.ok()) std::fprintf(stderr, "engine_cuda_bench: %s\n", written.ToString().c_str());
  return written.ok() ? 0 : 1;
}

}  // namespace
}  // namespace tandem::engine

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tandem::engine::Main();
}
