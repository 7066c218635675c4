// Writes the seed corpora of the fuzz targets (tools/bazel/fuzz.bzl) into the source tree, each
// input made by the project's own writers so seeds stay valid as formats evolve:
//   bazel run //tools/fuzz:write_seeds -- "$PWD"
// Seeds start each fuzz run deep inside the format; libFuzzer mutates from there.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/checksummed_message.h"
#include "common/dtype.h"
#include "common/safetensors.h"
#include "common/tensor.h"
#include "google/protobuf/text_format.h"
#include "tandem/rollout/v1/rollout.pb.h"
#include "tandem/trainer/v1/trainer.pb.h"
#include "tandem/weightstore/v1/weight_store.pb.h"
#include "tools/cli/spec_file.h"
#include "transfer/lora_testing.h"

namespace tandem {
namespace {

class CorpusWriter {
 public:
  CorpusWriter(const std::string& root, const std::string& corpus) : dir_(root + "/" + corpus) {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void Write(const std::string& name, const std::string& bytes) const {
    std::ofstream(dir_ + "/" + name, std::ios::binary) << bytes;
  }

 private:
  std::string dir_;
};

template <typename Message>
Message FromText(const std::string& text) {
  Message message;
  if (!google::protobuf::TextFormat::ParseFromString(text, &message)) {
    std::fprintf(stderr, "bad seed text: %s\n", text.c_str());
    std::exit(1);
  }
  return message;
}

template <typename T>
Tensor TensorOf(DType dtype, std::vector<int64_t> shape, const std::vector<T>& values) {
  return *Tensor::FromBytes(dtype, std::move(shape),
                            absl::MakeConstSpan(reinterpret_cast<const std::byte*>(values.data()),
                                                values.size() * sizeof(T)));
}

void WriteSafetensorsSeeds(const std::string& root) {
  CorpusWriter corpus(root, "common/testdata/safetensors_corpus");
  SafetensorsFile every;
  every.metadata["format"] = "pt";
  every.tensors["f32"] = TensorOf<float>(DType::kF32, {2, 2}, {1.5f, -2.0f, 0.0f, 3e38f});
  every.tensors["bf16"] = TensorOf<uint16_t>(DType::kBF16, {3}, {0x3f80, 0xc000, 0x0001});
  every.tensors["f16"] = TensorOf<uint16_t>(DType::kF16, {1}, {0x3c00});
  every.tensors["i16"] = TensorOf<int16_t>(DType::kI16, {2}, {-1, 7});
  every.tensors["i32"] = TensorOf<int32_t>(DType::kI32, {}, {5});
  every.tensors["empty"] = TensorOf<float>(DType::kF32, {0, 4}, {});
  corpus.Write("every_dtype", *SerializeSafetensors(every));
  corpus.Write("no_tensors", *SerializeSafetensors(SafetensorsFile()));
}

// route_codec_fuzz input: shape byte, top_k byte, experts byte, mode byte, rows, damage.
std::string RouteInput(uint8_t layers, uint8_t top_k, uint8_t experts, uint8_t mode,
                       const std::vector<int16_t>& rows, const std::string& damage = "") {
  std::string input = {static_cast<char>(layers), static_cast<char>(top_k),
                       static_cast<char>(experts), static_cast<char>(mode)};
  input.append(reinterpret_cast<const char*>(rows.data()), rows.size() * sizeof(int16_t));
  return input + damage;
}

void WriteRouteSeeds(const std::string& root) {
  CorpusWriter corpus(root, "services/router_replay/testdata/route_codec_corpus");
  // 2 layers, top-2 of 8 experts; 3 rows.
  const std::vector<int16_t> rows = {0, 1, 2, 3, 4, 5, 6, 7, 7, 0, 3, 1};
  corpus.Write("packed", RouteInput(1, 1, 6, 0, rows));
  corpus.Write("missing_cells", RouteInput(1, 1, 6, 0, {0, 1, -1, -1, 4, 5, 6, 7}));
  std::vector<int16_t> skewed;
  for (int r = 0; r < 64; ++r) skewed.insert(skewed.end(), {1, 2, 1, 2});
  corpus.Write("zstd", RouteInput(1, 1, 6, 1, skewed));
  corpus.Write("nine_bit_ids", RouteInput(0, 0, 40, 0x80, {300, 12, 0, 296}));
  corpus.Write("damaged", RouteInput(1, 1, 6, 1 | (2 << 2), skewed, "\x02\x40\x09\xff"));
}

void WriteManifestSeeds(const std::string& root) {
  CorpusWriter corpus(root, "services/weight_store/testdata/manifest_corpus");
  const transfer::TestAdapter per_expert = transfer::MakeTestAdapter("policy", 3, 1);
  const std::string file = EncodeChecksummed("TMAN", per_expert.manifest);
  corpus.Write("canonical_tp1", std::string(1, '\x00') + file);
  corpus.Write("tp2_ep2_fused_stacked", std::string(1, '\x1f') + file);
  corpus.Write("engine_native", std::string(1, '\x24') + file);
  corpus.Write("unframed", std::string(1, '\x01') + per_expert.manifest.SerializeAsString());
  const transfer::TestAdapter single =
      transfer::MakeTestAdapter("policy", 4, 2, {.tp_size = 1, .ep_size = 1});
  corpus.Write("one_shard", std::string(1, '\x05') + EncodeChecksummed("TMAN", single.manifest));
}

void WriteJobSeeds(const std::string& root) {
  CorpusWriter specs(root, "services/trainer/testdata/job_spec_corpus");
  CorpusWriter records(root, "services/trainer/testdata/job_record_corpus");
  CorpusWriter files(root, "tools/cli/testdata/spec_file_corpus");
  std::ifstream demo_file(root + "/jobs/demo.yaml");
  const std::string demo_yaml((std::istreambuf_iterator<char>(demo_file)), {});
  const trainer::v1::JobSpec demo = *cli::ParseJobSpec(demo_yaml, /*yaml=*/true);
  files.Write("demo_yaml", "\x01" + demo_yaml);
  files.Write("json", std::string("\x00", 1) +
                          R"({"display_name": "x", "task": {"name": "addition"}, "num_steps": 3,)"
                          R"( "sampling": {"temperature": 0.6}, "algorithm": "ALGORITHM_GRPO"})");
  specs.Write("demo", demo.SerializeAsString());
  trainer::v1::JobSpec ppo = demo;
  ppo.set_algorithm(trainer::v1::ALGORITHM_PPO);
  ppo.set_routing_replay(trainer::v1::ROUTING_REPLAY_MODE_R2);
  ppo.mutable_is_correction()->set_mode(trainer::v1::IS_CORRECTION_MODE_ICEPOP);
  specs.Write("ppo_r2_icepop", ppo.SerializeAsString());

  trainer::v1::Job job = FromText<trainer::v1::Job>(R"pb(
    id: "job-1"
    state: JOB_STATE_RUNNING
    current_step: 12
    policy_version: 12
    error_message: ""
    latest_metrics { step: 12 policy_version: 12 })pb");
  *job.mutable_spec() = demo;
  records.Write("running", EncodeChecksummed("TJOB", job));
  job.set_state(trainer::v1::JOB_STATE_FAILED);
  job.set_error_message("step 13: loss is NaN");
  records.Write("failed", EncodeChecksummed("TJOB", job));
  records.Write("unframed", job.SerializeAsString());
}

void WriteGenerateSeeds(const std::string& root) {
  CorpusWriter corpus(root, "services/rollout/testdata/generate_request_corpus");
  corpus.Write("text", FromText<rollout::v1::GenerateRequest>(R"pb(
                         request_id: "r1"
                         group_size: 2
                         prompts { text: "3+4=" prompt_id: "p0" }
                         prompts { text: "12+5=" }
                         sampling { temperature: 0.6 top_p: 0.9 max_new_tokens: 4 seed: 7 })pb")
                           .SerializeAsString());
  corpus.Write("tokens", FromText<rollout::v1::GenerateRequest>(R"pb(
                           request_id: "r2"
                           group_size: 1
                           prompts { token_ids { ids: [ 1, 6, 13, 7 ] } }
                           sampling {
                             top_k: 5
                             max_new_tokens: 8
                             stop_token_ids: [ 2, 24 ]
                           }
                           adapter { adapter_name: "job-1" exact_version: 3 }
                           allow_version_switch: true
                           routes { enabled: true job_id: "job-1" attempt: 1 })pb")
                             .SerializeAsString());
}

void WriteTokenizerSeeds(const std::string& root) {
  CorpusWriter corpus(root, "engine/testdata/tokenizer_corpus");
  corpus.Write("addition", "12+34=46");
  corpus.Write("words", "sort: b a c | abc");
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: write_seeds WORKSPACE_ROOT\n");
    return 2;
  }
  const std::string root = argv[1];
  tandem::WriteSafetensorsSeeds(root);
  tandem::WriteRouteSeeds(root);
  tandem::WriteManifestSeeds(root);
  tandem::WriteJobSeeds(root);
  tandem::WriteGenerateSeeds(root);
  tandem::WriteTokenizerSeeds(root);
  return 0;
}
