"""Tiny random Hugging Face MoE checkpoints and an independent NumPy forward pass over them.

Written from the math of transformers' modelling files (modeling_qwen3_moe.py,
modeling_mixtral.py, modeling_olmoe.py), not from Tandem's C++: every architecture is a
decoder with RMSNorm, rotate-half RoPE, causal grouped-query attention and a top-k MoE of SwiGLU
experts; they differ in where the q/k norms sit, how router probabilities become gate weights,
which layers are sparse and what the tensors are called. The forward runs in float64, so the
engine's float32 result is compared with the exact value of the same weights.
"""

import json
import math
import os

import numpy as np


# ---------------------------------------------------------------------------------------------
# safetensors, written by hand (the format is an 8-byte little-endian header length, a JSON
# header {name: {dtype, shape, data_offsets}}, then the bytes).

def to_bf16_bits(values):
    """float32 -> bfloat16 bit patterns, rounding to nearest even (as torch does)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def from_bf16_bits(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def stored_values(values, dtype):
    """What a tensor reads back as once stored in `dtype`."""
    values = np.asarray(values, dtype=np.float32)
    if dtype == "BF16":
        return from_bf16_bits(to_bf16_bits(values)).reshape(values.shape)
    if dtype == "F16":
        return values.astype(np.float16).astype(np.float32)
    return values


def encode(values, dtype):
    values = np.asarray(values, dtype=np.float32)
    if dtype == "BF16":
        return to_bf16_bits(values).tobytes()
    if dtype == "F16":
        return values.astype(np.float16).tobytes()
    return values.astype("<f4").tobytes()


def write_safetensors(path, tensors, dtype, metadata=None):
    header = {"__metadata__": metadata or {"format": "pt"}}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        blob = encode(tensors[name], dtype)
        header[name] = {"dtype": dtype, "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    header_bytes = json.dumps(header).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)
    with open(path, "wb") as out:
        out.write(len(header_bytes).to_bytes(8, "little"))
        out.write(header_bytes)
        for blob in blobs:
            out.write(blob)


def write_checkpoint(directory, config, tensors, dtype, shards):
    """A model directory as save_pretrained writes it: one file, or `shards` files + index."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as out:
        json.dump(config, out, indent=2)
    if shards == 1:
        write_safetensors(os.path.join(directory, "model.safetensors"), tensors, dtype)
        return
    names = sorted(tensors)
    weight_map = {}
    for shard in range(shards):
        file = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        part = {name: tensors[name] for name in names[shard::shards]}
        write_safetensors(os.path.join(directory, file), part, dtype)
        weight_map.update({name: file for name in part})
    total = sum(len(encode(value, dtype)) for value in tensors.values())
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as out:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, out, indent=2)


# ---------------------------------------------------------------------------------------------
# The architectures: config.json, tensor names and shapes.

def qwen3_moe_config(**overrides):
    config = {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "vocab_size": 97, "hidden_size": 48, "intermediate_size": 80,
        "moe_intermediate_size": 24, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "num_experts": 8, "num_experts_per_tok": 2,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
        "tie_word_embeddings": False, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "max_position_embeddings": 128, "hidden_act": "silu", "attention_bias": False,
        "use_sliding_window": False, "rope_scaling": None, "torch_dtype": "bfloat16",
    }
    config.update(overrides)
    return config


def mixtral_config(**overrides):
    config = {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
        "vocab_size": 89, "hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 1, "num_local_experts": 6,
        "num_experts_per_tok": 2, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0,
        "max_position_embeddings": 128, "hidden_act": "silu", "sliding_window": None,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }
    config.update(overrides)
    return config


def olmoe_config(**overrides):
    config = {
        "architectures": ["OlmoeForCausalLM"], "model_type": "olmoe",
        "vocab_size": 101, "hidden_size": 32, "intermediate_size": 20, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 4, "num_experts": 8,
        "num_experts_per_tok": 3, "norm_topk_prob": False, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "max_position_embeddings": 128, "hidden_act": "silu",
        "clip_qkv": None, "attention_bias": False, "rope_scaling": None,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }
    config.update(overrides)
    return config


def deepseek_moe_engine_config(**overrides):
    """An engine-format model (ModelConfig JSON) whose MoE layers are DeepSeek-V3's MoE block
    (the attention is the plain grouped-query kind: the engine does not compute MLA)."""
    config = {
        "vocab_size": 103, "d_model": 32, "num_heads": 4, "num_kv_heads": 2,
        "attention_head_dim": 8, "qk_norm": "none", "num_layers": 3, "num_dense_layers": 1,
        "dense_ffn_dim": 48, "num_experts": 16, "top_k": 4, "expert_ffn_dim": 12,
        "num_shared_experts": 2, "scoring": "sigmoid", "num_expert_groups": 4,
        "kept_expert_groups": 2, "routed_scaling_factor": 2.5, "norm_topk_prob": True,
        "tie_word_embeddings": False, "max_seq_len": 64, "rope_theta": 10000.0,
        "norm_eps": 1e-6,
    }
    config.update(overrides)
    return config


def write_engine_model(path, config, tensors):
    write_safetensors(path, tensors, "F32", {"tandem.model_config": json.dumps(config)})


class Arch:
    """How one architecture names its tensors and computes what differs between them."""

    def __init__(self, config):
        self.config = config
        c = config
        self.kind = c["architectures"][0]
        self.hidden = c["hidden_size"]
        self.heads = c["num_attention_heads"]
        self.kv_heads = c.get("num_key_value_heads") or self.heads
        self.head_dim = c.get("head_dim") or self.hidden // self.heads
        self.layers = c["num_hidden_layers"]
        self.eps = c["rms_norm_eps"]
        if self.kind == "MixtralForCausalLM":
            self.experts = c["num_local_experts"]
            self.expert_ffn = c["intermediate_size"]
            self.mlp = "block_sparse_moe"
            self.projections = {"gate": "w1", "up": "w3", "down": "w2"}
        else:
            self.experts = c["num_experts"]
            self.expert_ffn = c.get("moe_intermediate_size", c["intermediate_size"])
            self.mlp = "mlp"
            self.projections = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
        self.top_k = c["num_experts_per_tok"]

    def is_moe(self, layer):
        c = self.config
        if self.kind != "Qwen3MoeForCausalLM":
            return layer >= c.get("first_k_dense_replace", 0)
        return layer not in c["mlp_only_layers"] and (layer + 1) % c["decoder_sparse_step"] == 0

    def shared_experts(self, h, w, prefix):
        return 0.0  # Only DeepSeek's MoE block has them.

    def attention_inputs(self, h, w, prefix):
        """Roped queries [T, H, D], keys and values [T, KV, D] and the score scale."""
        t = h.shape[0]
        q = h @ w[prefix + "q_proj.weight"].T
        k = h @ w[prefix + "k_proj.weight"].T
        v = h @ w[prefix + "v_proj.weight"].T
        if self.kind == "OlmoeForCausalLM":  # Norms over the whole projection, before heads.
            q = rms_norm(q, w[prefix + "q_norm.weight"], self.eps)
            k = rms_norm(k, w[prefix + "k_norm.weight"], self.eps)
        q = q.reshape(t, self.heads, self.head_dim)
        k = k.reshape(t, self.kv_heads, self.head_dim)
        v = v.reshape(t, self.kv_heads, self.head_dim)
        if self.kind == "Qwen3MoeForCausalLM":  # Norms per head.
            q = rms_norm(q, w[prefix + "q_norm.weight"], self.eps)
            k = rms_norm(k, w[prefix + "k_norm.weight"], self.eps)
        return rope(q, self.config), rope(k, self.config), v, 1.0 / np.sqrt(self.head_dim)

    # Gate weights from the router logits of one token: transformers' routing per model.
    def gates(self, logits, w, prefix):
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        order = np.argsort(-probs, kind="stable")[: self.top_k]
        weights = probs[order]
        renormalize = self.kind == "MixtralForCausalLM" or self.config.get("norm_topk_prob")
        if renormalize:
            weights = weights / weights.sum()
        return order, weights

    def shapes(self):
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        shapes = {"model.embed_tokens.weight": (self.config["vocab_size"], h),
                  "model.norm.weight": (h,)}
        if not self.config["tie_word_embeddings"]:
            shapes["lm_head.weight"] = (self.config["vocab_size"], h)
        for layer in range(self.layers):
            p = f"model.layers.{layer}."
            shapes[p + "input_layernorm.weight"] = (h,)
            shapes[p + "post_attention_layernorm.weight"] = (h,)
            shapes[p + "self_attn.q_proj.weight"] = (q, h)
            shapes[p + "self_attn.k_proj.weight"] = (kv, h)
            shapes[p + "self_attn.v_proj.weight"] = (kv, h)
            shapes[p + "self_attn.o_proj.weight"] = (h, q)
            if self.kind == "Qwen3MoeForCausalLM":
                shapes[p + "self_attn.q_norm.weight"] = (self.head_dim,)
                shapes[p + "self_attn.k_norm.weight"] = (self.head_dim,)
            elif self.kind == "OlmoeForCausalLM":
                shapes[p + "self_attn.q_norm.weight"] = (q,)
                shapes[p + "self_attn.k_norm.weight"] = (kv,)
            if not self.is_moe(layer):
                ffn = self.config["intermediate_size"]
                shapes[p + "mlp.gate_proj.weight"] = (ffn, h)
                shapes[p + "mlp.up_proj.weight"] = (ffn, h)
                shapes[p + "mlp.down_proj.weight"] = (h, ffn)
                continue
            shapes[p + f"{self.mlp}.gate.weight"] = (self.experts, h)
            shapes.update(self.extra_moe_shapes(p))
            for e in range(self.experts):
                at = p + f"{self.mlp}.experts.{e}."
                shapes[at + self.projections["gate"] + ".weight"] = (self.expert_ffn, h)
                shapes[at + self.projections["up"] + ".weight"] = (self.expert_ffn, h)
                shapes[at + self.projections["down"] + ".weight"] = (h, self.expert_ffn)
        return shapes

    def extra_moe_shapes(self, prefix):
        return {}

    def random_tensors(self, seed):
        rng = np.random.default_rng(seed)
        tensors = {}
        for name, shape in sorted(self.shapes().items()):
            if name.endswith("norm.weight"):
                tensors[name] = 1.0 + 0.1 * rng.standard_normal(shape)
            elif name.endswith("embed_tokens.weight"):
                tensors[name] = rng.standard_normal(shape)
            else:
                tensors[name] = rng.standard_normal(shape) / np.sqrt(shape[-1])
        return {name: value.astype(np.float32) for name, value in tensors.items()}


# ---------------------------------------------------------------------------------------------
# The forward pass, float64.

class DeepseekMoeArch(Arch):
    """The engine-format model of deepseek_moe_engine_config: plain grouped-query attention and
    modeling_deepseek_v3.py's DeepseekV3TopkRouter + DeepseekV3MoE in the MoE layers."""

    def __init__(self, engine_config):
        c = engine_config
        super().__init__({
            "architectures": ["DeepseekMoeBlock"], "vocab_size": c["vocab_size"],
            "hidden_size": c["d_model"], "num_attention_heads": c["num_heads"],
            "num_key_value_heads": c["num_kv_heads"], "head_dim": c["attention_head_dim"],
            "num_hidden_layers": c["num_layers"], "rms_norm_eps": c["norm_eps"],
            "rope_theta": c["rope_theta"], "num_experts": c["num_experts"],
            "moe_intermediate_size": c["expert_ffn_dim"], "intermediate_size": c["dense_ffn_dim"],
            "num_experts_per_tok": c["top_k"], "first_k_dense_replace": c["num_dense_layers"],
            "tie_word_embeddings": c["tie_word_embeddings"]})
        self.engine_config = c
        self.routing = {"n_group": c["num_expert_groups"], "topk_group": c["kept_expert_groups"],
                        "norm_topk_prob": c["norm_topk_prob"],
                        "routed_scaling_factor": c["routed_scaling_factor"],
                        "n_shared_experts": c["num_shared_experts"]}

    # DeepseekV3TopkRouter.
    def gates(self, logits, w, prefix):
        r = self.routing
        scores = 1.0 / (1.0 + np.exp(-logits))
        choice = scores + w[prefix + "mlp.gate.e_score_correction_bias"]
        groups = choice.reshape(r["n_group"], -1)
        group_scores = np.sort(groups, axis=1)[:, -2:].sum(axis=1)
        kept = np.argsort(-group_scores, kind="stable")[: r["topk_group"]]
        mask = np.zeros_like(groups, dtype=bool)
        mask[kept] = True
        choice = np.where(mask.reshape(-1), choice, 0.0)
        ids = np.argsort(-choice, kind="stable")[: self.top_k]
        weights = scores[ids]
        if r["norm_topk_prob"]:
            weights = weights / (weights.sum() + 1e-20)
        return ids, weights * r["routed_scaling_factor"]

    def shared_experts(self, h, w, prefix):
        return swiglu(h, w, prefix + "mlp.shared_experts.", ("gate_proj", "up_proj", "down_proj"))

    def extra_moe_shapes(self, prefix):
        shared = self.routing["n_shared_experts"] * self.expert_ffn
        return {prefix + "mlp.gate.e_score_correction_bias": (self.experts,),
                prefix + "mlp.shared_experts.gate_proj.weight": (shared, self.hidden),
                prefix + "mlp.shared_experts.up_proj.weight": (shared, self.hidden),
                prefix + "mlp.shared_experts.down_proj.weight": (self.hidden, shared)}


def deepseek_v3_config(**overrides):
    config = {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "vocab_size": 97, "hidden_size": 32, "intermediate_size": 40,
        "moe_intermediate_size": 12, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 4, "n_shared_experts": 1, "n_routed_experts": 8,
        "routed_scaling_factor": 2.5, "kv_lora_rank": 8, "q_lora_rank": 6,
        "qk_rope_head_dim": 4, "v_head_dim": 5, "qk_nope_head_dim": 6, "n_group": 4,
        "topk_group": 2, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
        "norm_topk_prob": True, "rope_interleave": True, "topk_method": "noaux_tc",
        "scoring_func": "sigmoid", "max_position_embeddings": 128, "rope_theta": 10000.0,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                         "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                         "mscale_all_dim": 1.0},
        "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": False,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }
    config.update(overrides)
    return config


class DeepseekV3Arch(DeepseekMoeArch):
    """modeling_deepseek_v3.py: DeepseekV3Attention (multi-head latent attention) and the MoE
    block of DeepseekMoeArch."""

    def __init__(self, config):
        Arch.__init__(self, dict(config, num_experts=config["n_routed_experts"]))
        self.config = config
        self.routing = config
        self.nope, self.rope_d = config["qk_nope_head_dim"], config["qk_rope_head_dim"]
        self.v_dim, self.q_rank = config["v_head_dim"], config.get("q_lora_rank")

    def shapes(self):
        shapes = super().shapes()
        c, h, heads = self.config, self.hidden, self.heads
        qk = self.nope + self.rope_d
        for layer in range(self.layers):
            p = f"model.layers.{layer}.self_attn."
            for name in ("q_proj", "k_proj", "v_proj"):
                del shapes[p + name + ".weight"]
            if self.q_rank:
                shapes[p + "q_a_proj.weight"] = (self.q_rank, h)
                shapes[p + "q_a_layernorm.weight"] = (self.q_rank,)
                shapes[p + "q_b_proj.weight"] = (heads * qk, self.q_rank)
            else:
                shapes[p + "q_proj.weight"] = (heads * qk, h)
            shapes[p + "kv_a_proj_with_mqa.weight"] = (c["kv_lora_rank"] + self.rope_d, h)
            shapes[p + "kv_a_layernorm.weight"] = (c["kv_lora_rank"],)
            shapes[p + "kv_b_proj.weight"] = (heads * (self.nope + self.v_dim), c["kv_lora_rank"])
            shapes[p + "o_proj.weight"] = (h, heads * self.v_dim)
        return shapes

    def attention_inputs(self, h, w, prefix):
        c, t, heads = self.config, h.shape[0], self.heads
        if self.q_rank:
            # DeepseekV3RMSNorm(q_lora_rank) and (kv_lora_rank): their default eps, 1e-6.
            q = rms_norm(h @ w[prefix + "q_a_proj.weight"].T, w[prefix + "q_a_layernorm.weight"],
                         1e-6) @ w[prefix + "q_b_proj.weight"].T
        else:
            q = h @ w[prefix + "q_proj.weight"].T
        q = q.reshape(t, heads, self.nope + self.rope_d)
        q_pass, q_rot = q[..., : self.nope], q[..., self.nope:]
        compressed = h @ w[prefix + "kv_a_proj_with_mqa.weight"].T
        k_pass, k_rot = compressed[:, : c["kv_lora_rank"]], compressed[:, c["kv_lora_rank"]:]
        k_pass = rms_norm(k_pass, w[prefix + "kv_a_layernorm.weight"], 1e-6)
        kv = (k_pass @ w[prefix + "kv_b_proj.weight"].T).reshape(t, heads, self.nope + self.v_dim)
        k_pass, v = kv[..., : self.nope], kv[..., self.nope:]
        k_rot = k_rot.reshape(t, 1, self.rope_d)
        if c.get("rope_interleave", True):  # apply_rotary_pos_emb_interleave's reordering.
            q_rot = q_rot.reshape(t, heads, -1, 2).transpose(0, 1, 3, 2).reshape(t, heads, -1)
            k_rot = k_rot.reshape(t, 1, -1, 2).transpose(0, 1, 3, 2).reshape(t, 1, -1)
        q_rot, k_rot = rope(q_rot, c), rope(k_rot, c)
        k_rot = np.broadcast_to(k_rot, (t, heads, self.rope_d))
        scale = (self.nope + self.rope_d) ** -0.5
        scaling = c.get("rope_scaling")
        if scaling and scaling.get("mscale_all_dim"):
            mscale = 0.1 * scaling["mscale_all_dim"] * math.log(scaling["factor"]) + 1.0
            scale *= mscale * mscale
        return (np.concatenate([q_pass, q_rot], axis=-1), np.concatenate([k_pass, k_rot], axis=-1),
                v, scale)


def rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rope_frequencies(config, d):
    """inv_freq and the cos/sin scale, as modeling_rope_utils.py computes them ("default" and
    "yarn" rope types)."""
    theta = config["rope_theta"]
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    scaling = config.get("rope_scaling")
    if not scaling:
        return inv_freq, 1.0
    assert scaling.get("rope_type", scaling.get("type")) == "yarn"
    factor = scaling["factor"]
    original = scaling.get("original_max_position_embeddings") or config["max_position_embeddings"]

    def get_mscale(scale, mscale=1.0):
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        if scaling.get("mscale") and scaling.get("mscale_all_dim"):
            attention_factor = get_mscale(factor, scaling["mscale"]) / get_mscale(
                factor, scaling["mscale_all_dim"])
        else:
            attention_factor = get_mscale(factor)

    def correction_dim(rotations):
        return d * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = math.floor(correction_dim(scaling.get("beta_fast") or 32))
    high = math.ceil(correction_dim(scaling.get("beta_slow") or 1))
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(d // 2) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    inv_freq = inv_freq / factor * (1 - extrapolation) + inv_freq * extrapolation
    return inv_freq, attention_factor


def rope(x, config):
    """x [T, heads, D]; rotate_half: element i pairs with i + D/2."""
    t, _, d = x.shape
    inv_freq, scale = rope_frequencies(config, d)
    angles = np.outer(np.arange(t, dtype=np.float64), inv_freq)
    cos = scale * np.cos(np.concatenate([angles, angles], axis=-1))[:, None, :]
    sin = scale * np.sin(np.concatenate([angles, angles], axis=-1))[:, None, :]
    rotated = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], axis=-1)
    return x * cos + rotated * sin


def silu(x):
    return x / (1.0 + np.exp(-x))


def forward(arch, tensors, tokens):
    """Logits [T, vocab] and routes [T, moe layers, top_k] (descending score) of one sequence."""
    w = {name: value.astype(np.float64) for name, value in tensors.items()}
    c = arch.config
    t = len(tokens)
    x = w["model.embed_tokens.weight"][tokens]
    routes = []
    mask = np.triu(np.full((t, t), -np.inf), k=1)
    for layer in range(arch.layers):
        p = f"model.layers.{layer}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], arch.eps)
        q, k, v, scale = arch.attention_inputs(h, w, p + "self_attn.")
        group = q.shape[1] // k.shape[1]
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) * scale + mask
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        attention = np.einsum("hts,shd->thd", probs, v).reshape(t, -1)
        x = x + attention @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], arch.eps)
        if not arch.is_moe(layer):
            x = x + swiglu(h, w, p + "mlp.", ("gate_proj", "up_proj", "down_proj"))
            continue
        logits = h @ w[p + f"{arch.mlp}.gate.weight"].T
        out = np.zeros_like(h)
        layer_routes = []
        for i in range(t):
            ids, gates = arch.gates(logits[i], w, p)
            layer_routes.append(ids)
            for expert, gate in zip(ids, gates):
                at = p + f"{arch.mlp}.experts.{expert}."
                names = (arch.projections["gate"], arch.projections["up"], arch.projections["down"])
                out[i] += gate * swiglu(h[i : i + 1], w, at, names)[0]
        routes.append(layer_routes)
        x = x + out + arch.shared_experts(h, w, p)
    x = rms_norm(x, w["model.norm.weight"], arch.eps)
    head = w["model.embed_tokens.weight" if c["tie_word_embeddings"] else "lm_head.weight"]
    return x @ head.T, np.array(routes, dtype=np.int64).transpose(1, 0, 2)


def swiglu(x, w, prefix, names):
    gate, up, down = (w[prefix + name + ".weight"] for name in names)
    return (silu(x @ gate.T) * (x @ up.T)) @ down.T
