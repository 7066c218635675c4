#!/usr/bin/env python3
"""The engine computes Hugging Face MoE checkpoints as transformers does.

For each architecture, tiny random checkpoints in HF layout (one file or sharded with an index;
F32, BF16 or F16) go through the engine (`hf_forward`, fp32) and through the independent NumPy
forward of hf_models.py (float64 over the same stored weights): logits must agree to 1e-4
relative and the top-k routes of every token and MoE layer must be identical. Damaged or
unsupported checkpoints must fail naming the tensor or the config field.

Usage: hf_reference_test.py HF_FORWARD_BINARY
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_models  # noqa: E402

HF_FORWARD = None
TOKENS = [3, 17, 42, 5, 88, 1, 60, 23, 9, 71, 30, 2]


def run_engine(directory, tokens=TOKENS):
    result = subprocess.run(
        [HF_FORWARD, f"--model={directory}", "--tokens=" + ",".join(map(str, tokens))],
        capture_output=True, text=True, check=False)
    return result


class ReferenceForwardTest(unittest.TestCase):
    def check(self, config, dtype, shards, seed=1, arch_class=hf_models.Arch):
        arch = arch_class(config)
        tensors = arch.random_tensors(seed)
        with tempfile.TemporaryDirectory() as directory:
            hf_models.write_checkpoint(directory, config, tensors, dtype, shards)
            result = run_engine(directory)
        stored = {name: hf_models.stored_values(value, dtype) for name, value in tensors.items()}
        self.compare(arch, stored, result, f"{dtype} x{shards}")

    def compare(self, arch, tensors, result, label):
        self.assertEqual(result.returncode, 0, result.stderr)
        ours = json.loads(result.stdout)
        logits, routes = hf_models.forward(arch, tensors, TOKENS)
        our_logits = np.array(ours["logits"])
        scale = np.abs(logits).max()
        worst = np.abs(our_logits - logits).max() / scale
        self.assertLess(worst, 1e-4, f"logits differ by {worst:.2e} of their largest magnitude")
        np.testing.assert_array_equal(np.array(ours["routes"]), routes)
        self.assertEqual(ours["moe_layers"],
                         [layer for layer in range(arch.layers) if arch.is_moe(layer)])
        print(f"{arch.kind} {label}: logits within {worst:.1e}, "
              f"{routes.size} routed ids identical")

    def test_qwen3_moe_f32_gqa(self):
        self.check(hf_models.qwen3_moe_config(), "F32", 1)

    def test_qwen3_moe_bf16_sharded_sparse_step_tied(self):
        config = hf_models.qwen3_moe_config(decoder_sparse_step=2, mlp_only_layers=[3],
                                            num_hidden_layers=5, norm_topk_prob=False,
                                            tie_word_embeddings=True)
        self.check(config, "BF16", 3)

    def test_qwen3_moe_yarn(self):
        scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
        self.check(hf_models.qwen3_moe_config(rope_scaling=scaling), "F32", 1, seed=6)
        scaling = {"type": "yarn", "factor": 8.0, "beta_fast": 16, "mscale": 0.8,
                   "mscale_all_dim": 0.5}
        self.check(hf_models.olmoe_config(rope_scaling=scaling), "F32", 2, seed=7)

    def test_qwen3_moe_f16(self):
        self.check(hf_models.qwen3_moe_config(num_key_value_heads=4), "F16", 2, seed=2)

    def test_mixtral_f32_sharded(self):
        self.check(hf_models.mixtral_config(), "F32", 2)

    def test_mixtral_bf16(self):
        self.check(hf_models.mixtral_config(num_key_value_heads=2), "BF16", 1, seed=3)

    def test_olmoe_bf16(self):
        self.check(hf_models.olmoe_config(), "BF16", 1)

    def test_olmoe_f32_gqa_sharded(self):
        self.check(hf_models.olmoe_config(num_key_value_heads=2, norm_topk_prob=True), "F32", 4)

    def test_deepseek_v3(self):
        """Multi-head latent attention (low-rank queries or q_proj, interleaved rotary pairs or
        not, YaRN with mscale_all_dim) and DeepSeek's MoE block, in HF layout."""
        self.check(hf_models.deepseek_v3_config(), "BF16", 2, arch_class=hf_models.DeepseekV3Arch)
        config = hf_models.deepseek_v3_config(q_lora_rank=None, rope_interleave=False,
                                              rope_scaling=None, norm_topk_prob=False,
                                              rms_norm_eps=1e-2)
        self.check(config, "F32", 1, seed=8, arch_class=hf_models.DeepseekV3Arch)

    def test_deepseek_v3_moe_block(self):
        """DeepSeek-V3's MoE block (sigmoid scores, selection-only bias, group-limited top-k,
        routed_scaling_factor, shared experts, a leading dense layer) in an engine-format model,
        since the engine does not compute DeepSeek's latent attention."""
        for overrides in ({}, {"norm_topk_prob": False, "kept_expert_groups": 1}):
            config = hf_models.deepseek_moe_engine_config(**overrides)
            arch = hf_models.DeepseekMoeArch(config)
            tensors = arch.random_tensors(5)
            with tempfile.TemporaryDirectory() as directory:
                path = os.path.join(directory, "model.safetensors")
                hf_models.write_engine_model(path, config, tensors)
                result = run_engine(path)
            self.compare(arch, tensors, result, f"engine file {overrides}")


class RefusedCheckpointTest(unittest.TestCase):
    """What the engine cannot compute exactly fails, naming the tensor or the field."""

    def refused(self, config, edit_tensors=None, edit_directory=None, shards=2):
        arch = hf_models.Arch(config)
        tensors = arch.random_tensors(4)
        if edit_tensors:
            edit_tensors(tensors)
        with tempfile.TemporaryDirectory() as directory:
            hf_models.write_checkpoint(directory, config, tensors, "BF16", shards)
            if edit_directory:
                edit_directory(directory)
            result = run_engine(directory)
        self.assertNotEqual(result.returncode, 0, "expected a refusal")
        return result.stderr

    def test_a_missing_tensor_is_named(self):
        name = "model.layers.1.mlp.experts.3.down_proj.weight"
        stderr = self.refused(hf_models.qwen3_moe_config(), lambda t: t.pop(name), shards=1)
        self.assertIn(name, stderr)

    def test_a_wrong_shape_is_named(self):
        name = "model.layers.2.self_attn.k_proj.weight"

        def reshape(tensors):
            tensors[name] = np.zeros((8, 48), np.float32)
        stderr = self.refused(hf_models.qwen3_moe_config(), reshape)
        self.assertIn(name, stderr)
        self.assertIn("[8,48]", stderr)

    def test_a_truncated_shard_is_named(self):
        def truncate(directory):
            shard = os.path.join(directory, "model-00002-of-00002.safetensors")
            os.truncate(shard, os.path.getsize(shard) - 100)
        stderr = self.refused(hf_models.mixtral_config(), edit_directory=truncate)
        self.assertIn("model-00002-of-00002.safetensors", stderr)

    def test_deepseek_v3s_multi_token_prediction_layer_is_ignored(self):
        """DeepSeek-V3 checkpoints hold layer num_hidden_layers (MTP), which transformers drops."""
        config = hf_models.deepseek_v3_config()
        arch = hf_models.DeepseekV3Arch(config)
        tensors = arch.random_tensors(9)
        extra = {name.replace("model.layers.2.", "model.layers.3."): value
                 for name, value in tensors.items() if name.startswith("model.layers.2.")}
        with tempfile.TemporaryDirectory() as directory:
            hf_models.write_checkpoint(directory, config, {**tensors, **extra}, "F32", 2)
            result = run_engine(directory)
        ReferenceForwardTest.compare(self, arch, tensors, result, "with an MTP layer")

    def test_an_unknown_architecture_is_named(self):
        config = hf_models.qwen3_moe_config(architectures=["GptOssForCausalLM"])
        self.assertIn("GptOssForCausalLM", self.refused(config))

    def test_rope_scaling_is_refused_by_name(self):
        config = hf_models.qwen3_moe_config(rope_scaling={"rope_type": "longrope", "factor": 4.0})
        self.assertIn("rope_scaling.rope_type", self.refused(config))
        config = hf_models.qwen3_moe_config(
            rope_scaling={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32})
        self.assertIn("rope_scaling.factor", self.refused(config))

    def test_a_sliding_window_is_refused_by_name(self):
        self.assertIn("sliding_window", self.refused(hf_models.mixtral_config(sliding_window=16)))

    def test_olmoe_clip_qkv_is_refused_by_name(self):
        self.assertIn("clip_qkv", self.refused(hf_models.olmoe_config(clip_qkv=8.0)))


if __name__ == "__main__":
    HF_FORWARD = sys.argv.pop(1)
    unittest.main(verbosity=2)
