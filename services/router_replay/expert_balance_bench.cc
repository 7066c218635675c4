// Expert-parallel load balance of six placement planners on three routing traces, per
// micro-batch and MoE layer: max / mean of the tokens each EP rank's experts compute (1.00 is
// perfect), and what each planner sends to get there (experts' weights per step and layer).
//
//   bazel run -c opt //services/router_replay:expert_balance_bench -- \
//       --demo_model=$PWD/.tandem/base_model_addition1.safetensors
//
// Planners, each given the same replica budget (2 extra expert slots per rank), but eplb-budget:
//   static      expert e on rank e * ranks / experts, no replicas;
//   eplb-hist   DeepSeek's EPLB (router-replay's PlanPlacement) on the previous step's loads;
//   eplb-oracle EPLB on the step's own loads;
//   eplb-budget EPLB on the step's own loads with as many replica slots as relibra made copies;
//   reorder     routing-guided reordering only (PlanBalance's homes, no replicas);
//   relibra     reordering + per-micro-batch replication within a node (PlanBalance).
// Traces: the drifting synthetic trace (drifting_trace.h: 256 experts, top-8, 16 micro-batches
// of 4,096 tokens per step); the routes the demo model takes on the demo task (prompts and
// answers, as rollout records them); and those of a random 1024-wide, 8-layer, 32-expert model
// (engine_bench's larger config) on random tokens. Every MoE layer is planned on its own. Step 0
// of each trace only seeds the history; the figures are over the later steps.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "engine/config.h"
#include "engine/cpu_model_ops.h"
#include "engine/hf/hf_model.h"
#include "engine/model.h"
#include "engine/tasks.h"
#include "engine/text/text_codec.h"
#include "engine/transformer.h"
#include "placement/balance_planner.h"
#include "placement/drifting_trace.h"
#include "placement/eplb.h"

ABSL_FLAG(std::string, demo_model, ".tandem/base_model_addition1.safetensors",
          "The demo's base model (./tandem demo makes it); its trace is skipped when missing.");
ABSL_FLAG(int, random_d_model, 1024, "The random model's width (0: skip its trace).");
ABSL_FLAG(int, ranks_per_node, 4, "EP ranks per node (replicas stay within a node).");
ABSL_FLAG(int, replica_slots, 2, "Extra expert slots per rank for replicas.");
ABSL_FLAG(double, expert_mb, 9.44,
          "MB one expert's weights take on the wire (default: a Qwen3-30B-A3B expert in bf16, "
          "3 x 2048 x 768 x 2 bytes), to price what each planner moves.");
ABSL_FLAG(int, step_layers, 58, "MoE layers one step plans (the planning time's size).");

namespace tandem::router_replay {
namespace {

// One MoE layer's steps.
using LayerTrace = std::vector<placement::StepLoad>;

struct Trace {
  std::string name;
  std::vector<LayerTrace> layers;
};

// The routes of `batches` micro-batches x `steps` steps of token sequences through `model`,
// counted per MoE layer: routes() is [tokens, MoE layers, top_k].
Trace RoutesOf(const std::string& name, engine::BaseModel& model,
               const std::function<std::vector<int>()>& next_sequence, int steps, int batches,
               int tokens_per_batch) {
  const engine::ModelConfig& config = model.config();
  const int layers = config.num_moe_layers(), top_k = config.top_k, experts = config.num_experts;
  Trace trace{.name = name, .layers = std::vector<LayerTrace>(layers)};
  engine::Transformer transformer(model, nullptr,
                                  std::make_unique<engine::CpuModelOps>(model.config()));
  for (int s = 0; s < steps; ++s) {
    for (LayerTrace& layer : trace.layers) {
      layer.push_back({.micro_batches = batches,
                       .experts = experts,
                       .tokens = std::vector<int64_t>(static_cast<size_t>(batches) * experts)});
    }
    for (int m = 0; m < batches; ++m) {
      engine::TokenBatch batch;
      while (batch.num_tokens() < tokens_per_batch) batch.Add(next_sequence());
      if (!transformer.Forward(batch).ok()) std::abort();
      const std::vector<int16_t>& routes = transformer.routes();
      for (size_t row = 0; row * layers * top_k < routes.size(); ++row) {
        for (int l = 0; l < layers; ++l) {
          for (int k = 0; k < top_k; ++k) {
            const int expert = routes[(row * layers + l) * top_k + k];
            ++trace.layers[l][s].tokens[static_cast<size_t>(m) * experts + expert];
          }
        }
      }
    }
  }
  return trace;
}

std::optional<Trace> DemoTrace() {
  const std::string path = absl::GetFlag(FLAGS_demo_model);
  auto model = engine::hf::LoadBaseModel(path);
  auto codec = engine::text::TextCodecFor(path);
  auto task = engine::MakeTask("addition", 1);
  if (!model.ok() || !codec.ok() || !task.ok()) {
    std::printf("(no demo model at %s: run ./tandem demo first; its trace is skipped)\n",
                path.c_str());
    return std::nullopt;
  }
  uint64_t seed = 0;
  std::vector<engine::Sample> pending;
  auto next = [&] {
    if (pending.empty()) pending = engine::GeneratePrompts(**task, 256, ++seed);
    const engine::Sample sample = pending.back();
    pending.pop_back();
    return *(*codec)->EncodePrompt(sample.prompt + sample.answer);
  };
  return RoutesOf("demo model, demo task", *model, next, 4, 16, 256);
}

std::optional<Trace> RandomModelTrace() {
  const int d_model = absl::GetFlag(FLAGS_random_d_model);
  if (d_model == 0) return std::nullopt;
  auto model = engine::BaseModel::Create(engine::ScaledDefaultModelConfig(d_model, 8, 32, 0), 1);
  if (!model.ok()) std::abort();
  std::mt19937_64 rng(7);
  const int vocab = model->config().vocab_size;
  auto next = [&] {
    std::vector<int> ids(32);
    for (int& id : ids) id = static_cast<int>(rng() % vocab);
    return ids;
  };
  return RoutesOf(
      absl::StrFormat("random %d-wide model, top-%d of 32", d_model, model->config().top_k), *model,
      next, 3, 16, 256);
}

Trace SyntheticTrace() {
  return {.name = "drifting synthetic, top-8 of 256", .layers = {placement::DriftingTrace({})}};
}

// Per-rank tokens of a micro-batch under an EPLB plan: an expert's tokens split evenly over its
// replicas; physical slot p on rank p / (slots / ranks).
std::vector<double> EplbRankTokens(const placement::PlacementPlan& plan,
                                   const placement::StepLoad& load, int m, int ranks) {
  std::vector<double> rank_tokens(ranks, 0);
  const int per_rank = plan.num_replicas / ranks;
  for (int e = 0; e < load.experts; ++e) {
    const int copies = plan.logcnt[e];
    for (int r = 0; r < copies; ++r) {
      const int slot = plan.log2phy[static_cast<size_t>(e) * plan.max_replicas + r];
      rank_tokens[slot / per_rank] += static_cast<double>(load.at(m, e)) / copies;
    }
  }
  return rank_tokens;
}

// EPLB's plan of one layer for `load` with `extra_slots` replica slots per rank.
placement::PlacementPlan Eplb(const placement::StepLoad& load,
                              const placement::EpTopology& topology, int extra_slots) {
  placement::PlacementRequest request{.num_layers = 1,
                                      .num_experts = load.experts,
                                      .load = std::vector<double>(load.experts, 0),
                                      .num_replicas = load.experts + extra_slots * topology.ranks,
                                      .num_groups = topology.ranks / topology.ranks_per_node,
                                      .num_nodes = topology.ranks / topology.ranks_per_node,
                                      .num_gpus = topology.ranks};
  for (int m = 0; m < load.micro_batches; ++m) {
    for (int e = 0; e < load.experts; ++e) request.load[e] += static_cast<double>(load.at(m, e));
  }
  auto plan = placement::PlanPlacement(request);
  if (!plan.ok()) {
    std::fprintf(stderr, "EPLB: %s\n", plan.status().ToString().c_str());
    std::abort();
  }
  return *std::move(plan);
}

// Experts each rank holds under `next` that it did not hold under `previous` (slot p on rank
// p / (slots / ranks)), over all ranks: the experts' weights that travel to take up the plan,
// however EPLB orders the slots within a rank.
int NewlyHeld(const placement::PlacementPlan& previous, const placement::PlacementPlan& next,
              int ranks) {
  const auto held = [ranks](const placement::PlacementPlan& plan) {
    std::vector<std::set<int>> by_rank(ranks);
    const int per_rank = plan.num_replicas / ranks;
    for (int p = 0; p < plan.num_replicas; ++p) by_rank[p / per_rank].insert(plan.phy2log[p]);
    return by_rank;
  };
  const std::vector<std::set<int>> before = held(previous), after = held(next);
  int arrived = 0;
  for (int r = 0; r < ranks; ++r) {
    for (int expert : after[r]) arrived += !before[r].contains(expert);
  }
  return arrived;
}

// The static placement as EPLB's slots: slot p holds expert p, no replica slots.
placement::PlacementPlan StaticSlots(int experts) {
  placement::PlacementPlan plan{.num_layers = 1, .num_experts = experts, .num_replicas = experts};
  plan.phy2log.resize(experts);
  std::iota(plan.phy2log.begin(), plan.phy2log.end(), 0);
  return plan;
}

// Replicas a ReLibra plan makes in the step: every copy of an expert away from its home, in
// each micro-batch.
int ReplicaCopies(const placement::BalancePlan& plan) {
  int copies = 0;
  for (const placement::MicroBatchPlan& batch : plan.micro_batches) {
    for (const placement::ExpertCopy& copy : batch.copies)
      copies += copy.rank != plan.home[copy.expert];
  }
  return copies;
}

const char* const kPlanners[] = {"static",      "eplb-hist", "eplb-oracle",
                                 "eplb-budget", "reorder",   "relibra"};

// One planner's figures over a trace: max / mean per micro-batch and layer, and the experts'
// weights it sends per step and layer (moves to new homes, replicas, re-filled EPLB slots).
struct Figures {
  double sum = 0, worst = 0;
  int count = 0;
  double sent = 0;  // Experts' weights sent, over all steps and layers.
  int steps = 0;
  void Add(double value) { sum += value, worst = std::max(worst, value), ++count; }
  double sent_per_step() const { return steps > 0 ? sent / steps : 0; }
};

// Each planner's figures on `trace` at `ranks` EP ranks. eplb-budget is EPLB on the step's own
// loads given, each step, as many replica slots as ReLibra made copies in it (rounded up to whole
// slots per rank): the same per-step copy budget.
std::map<std::string, Figures> Measure(const Trace& trace, const placement::EpTopology& topology) {
  std::map<std::string, Figures> figures;
  const int slots = topology.replica_slots_per_rank;
  for (const LayerTrace& layer : trace.layers) {
    std::vector<int> homes = placement::ContiguousHomes(layer[0].experts, topology.ranks);
    // Every planner starts from the static placement, as a job does.
    placement::PlacementPlan last_history = StaticSlots(layer[0].experts);
    placement::PlacementPlan last_oracle = last_history, last_budget = last_history;
    for (size_t s = 1; s < layer.size(); ++s) {
      const placement::StepLoad& load = layer[s];
      const placement::PlacementPlan history = Eplb(layer[s - 1], topology, slots);
      const placement::PlacementPlan oracle = Eplb(load, topology, slots);
      // One expert's move priced at a tenth of an expert's mean step load.
      const double mean_expert_load =
          static_cast<double>(std::accumulate(load.tokens.begin(), load.tokens.end(), int64_t{0})) /
          load.experts;
      auto plan = placement::PlanBalance(load, topology, homes,
                                         {.move_cost_tokens = mean_expert_load / 10});
      if (!plan.ok()) std::abort();
      const int copies = ReplicaCopies(*plan);
      const int budget_slots =
          std::min(load.experts / topology.ranks, (copies + topology.ranks - 1) / topology.ranks);
      const placement::PlacementPlan budget = Eplb(load, topology, budget_slots);
      const auto step = [&figures](const char* planner, double sent) {
        figures[planner].sent += sent;
        ++figures[planner].steps;
      };
      step("static", 0);
      step("eplb-hist", NewlyHeld(last_history, history, topology.ranks));
      step("eplb-oracle", NewlyHeld(last_oracle, oracle, topology.ranks));
      step("eplb-budget", NewlyHeld(last_budget, budget, topology.ranks));
      step("reorder", plan->experts_moved);
      step("relibra", plan->experts_moved + copies);
      last_history = history, last_oracle = oracle, last_budget = budget;
      homes = plan->home;
      const std::vector<int> contiguous = placement::ContiguousHomes(load.experts, topology.ranks);
      for (int m = 0; m < load.micro_batches; ++m) {
        figures["static"].Add(
            placement::MaxOverMean(placement::HomeRankTokens(load, m, contiguous, topology.ranks)));
        figures["eplb-hist"].Add(
            placement::MaxOverMean(EplbRankTokens(history, load, m, topology.ranks)));
        figures["eplb-oracle"].Add(
            placement::MaxOverMean(EplbRankTokens(oracle, load, m, topology.ranks)));
        figures["eplb-budget"].Add(
            placement::MaxOverMean(EplbRankTokens(budget, load, m, topology.ranks)));
        figures["reorder"].Add(
            placement::MaxOverMean(placement::HomeRankTokens(load, m, plan->home, topology.ranks)));
        figures["relibra"].Add(placement::MaxOverMean(plan->micro_batches[m].rank_tokens));
      }
    }
  }
  return figures;
}

void PrintTable(const std::vector<Trace>& traces) {
  std::printf(
      "\nmax/mean tokens per EP rank per micro-batch and MoE layer: mean (worst) | experts' "
      "weights sent per step and layer (MB at %.2f MB each)\n",
      absl::GetFlag(FLAGS_expert_mb));
  std::printf("%-36s %5s", "trace", "ranks");
  for (const char* planner : kPlanners) std::printf(" %24s", planner);
  std::printf("\n");
  for (const Trace& trace : traces) {
    for (const int ranks : {4, 8}) {
      if (trace.layers[0][0].experts % ranks != 0) continue;
      const placement::EpTopology topology{
          .ranks = ranks,
          .ranks_per_node = std::min(ranks, absl::GetFlag(FLAGS_ranks_per_node)),
          .replica_slots_per_rank = absl::GetFlag(FLAGS_replica_slots)};
      const std::map<std::string, Figures> figures = Measure(trace, topology);
      std::printf("%-36s %5d", trace.name.c_str(), ranks);
      for (const char* planner : kPlanners) {
        const Figures& f = figures.at(planner);
        std::printf("  %4.2f (%4.2f) | %5.1f %5.0f", f.sum / f.count, f.worst, f.sent_per_step(),
                    f.sent_per_step() * absl::GetFlag(FLAGS_expert_mb));
      }
      std::printf("\n");
    }
  }
  std::printf(
      "(sent: relibra's moves to new homes plus its replicas in every micro-batch; reorder's "
      "moves; experts an EPLB rank holds that it did not hold the step before)\n");
}

// Planning time at the goal's size: 256 experts x 8 ranks, for every MoE layer of a step
// (--step_layers, one after the other on one core), with the trace's 16 micro-batches and with
// the step's load as one micro-batch (as the trainer plans it).
void TimePlanning(const Trace& synthetic) {
  const placement::StepLoad& load = synthetic.layers[0][1];
  placement::StepLoad whole_step{.micro_batches = 1, .experts = load.experts};
  whole_step.tokens.assign(load.experts, 0);
  for (int m = 0; m < load.micro_batches; ++m) {
    for (int e = 0; e < load.experts; ++e) whole_step.tokens[e] += load.at(m, e);
  }
  const placement::EpTopology topology{
      .ranks = 8, .ranks_per_node = 4, .replica_slots_per_rank = 2};
  const std::vector<int> homes = placement::ContiguousHomes(load.experts, 8);
  const int layers = absl::GetFlag(FLAGS_step_layers);
  for (const placement::StepLoad* step :
       {&load, static_cast<const placement::StepLoad*>(&whole_step)}) {
    constexpr int kRuns = 20;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kRuns * layers; ++i) {
      if (!placement::PlanBalance(*step, topology, homes).ok()) std::abort();
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::printf(
        "planning (256 experts x 8 ranks x %d micro-batches, %d layers, one core): "
        "%.3f ms per step, %.3f ms per layer (goal <= 5 ms per step)\n",
        step->micro_batches, layers, ms / kRuns, ms / kRuns / layers);
  }
}

int Main() {
  std::vector<Trace> traces = {SyntheticTrace()};
  if (std::optional<Trace> demo = DemoTrace()) traces.push_back(*std::move(demo));
  if (std::optional<Trace> random = RandomModelTrace()) traces.push_back(*std::move(random));
  TimePlanning(traces[0]);
  PrintTable(traces);
  return 0;
}

}  // namespace
}  // namespace tandem::router_replay

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tandem::router_replay::Main();
}
