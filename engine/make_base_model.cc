// Builds the demo's base model: the default MoE config trained supervised on a task until
// greedy accuracy is partial, then saved as safetensors. Prints progress and timing.
#include <chrono>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "engine/config.h"
#include "engine/model.h"
#include "engine/sft.h"
#include "engine/tasks.h"
#include "kernels/cpu/gemm.h"

ABSL_FLAG(std::string, task, "addition", "Task to learn: addition, reverse or sort.");
ABSL_FLAG(int, digits, 2, "Digits per operand of the task, 1..9.");
ABSL_FLAG(std::string, out, ".tandem/base_model.safetensors", "Where to write the model.");
ABSL_FLAG(double, stop_accuracy, 0.3, "Stop once greedy accuracy reaches this.");
ABSL_FLAG(int, max_steps, 4000, "Upper bound on optimizer steps.");
ABSL_FLAG(int, batch_size, 32, "Sequences per step.");
ABSL_FLAG(uint64_t, seed, 1, "Seed of initialization and data.");
ABSL_FLAG(int, threads, 2, "OpenBLAS threads.");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Trains and saves the demo's base model.");
  absl::ParseCommandLine(argc, argv);
  tandem::cpu::SetBlasThreads(absl::GetFlag(FLAGS_threads));
  auto task = tandem::engine::MakeTask(absl::GetFlag(FLAGS_task), absl::GetFlag(FLAGS_digits));
  if (!task.ok()) {
    std::fprintf(stderr, "make_base_model: %s\n", task.status().ToString().c_str());
    return 2;
  }
  tandem::engine::SftConfig config;
  config.stop_accuracy = absl::GetFlag(FLAGS_stop_accuracy);
  config.max_steps = absl::GetFlag(FLAGS_max_steps);
  config.batch_size = absl::GetFlag(FLAGS_batch_size);
  config.seed = absl::GetFlag(FLAGS_seed);
  auto model = tandem::engine::BaseModel::Create(tandem::engine::DefaultModelConfig(), config.seed);
  if (!model.ok()) {
    std::fprintf(stderr, "make_base_model: %s\n", model.status().ToString().c_str());
    return 2;
  }
  std::printf("base model: %lld parameters, config %s\n",
              static_cast<long long>(model->parameters().num_elements()),
              model->config().ToJson().c_str());
  const auto start = std::chrono::steady_clock::now();
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  auto result = tandem::engine::TrainSupervised(
      *model, **task, config, [&](const tandem::engine::SftProgress& progress) {
        std::printf("step %5d  loss %.4f  greedy accuracy %5.1f%%  (%.0f s)\n", progress.step,
                    progress.loss, 100 * progress.accuracy, seconds());
        std::fflush(stdout);
      });
  if (!result.ok()) {
    std::fprintf(stderr, "make_base_model: %s\n", result.status().ToString().c_str());
    return 1;
  }
  if (absl::Status saved = model->Save(absl::GetFlag(FLAGS_out)); !saved.ok()) {
    std::fprintf(stderr, "make_base_model: %s\n", saved.ToString().c_str());
    return 1;
  }
  std::printf("saved %s after %d steps in %.1f s: greedy accuracy %.1f%%\n",
              absl::GetFlag(FLAGS_out).c_str(), result->step, seconds(), 100 * result->accuracy);
  return 0;
}
