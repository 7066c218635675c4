#!/usr/bin/env python3
"""Tandem's MoE + LoRA model written plainly in PyTorch (eager), the yardstick of the CUDA engine.

Reads what `engine_cuda_bench --out_dir=DIR` wrote (config.json, model.safetensors,
adapter.safetensors, batch.json, logits.f32), checks its own logits and greedy generations
(with a key/value cache) against the engine's, then times the same work the bench timed:
forward, forward + backward into the LoRA weights, and generation, in tokens per second on the
same GPU. Covers the architectures the CUDA backend runs: standard
grouped-query attention without q/k norms, softmax or sigmoid routing with top-k (no group limit),
dense and MoE layers, shared experts, per-expert LoRA on every projection.

Usage (on the GPU machine; tools/gpu_check run calls it): moe_reference.py DIR [--device cuda]
Exits non-zero when the logits differ from the engine's by more than --tolerance, or fewer
than --min_identical of the greedy generations equal the engine's.
"""

import argparse
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn.functional as F


def read_safetensors(path, device):
    """Tensors of a safetensors file (F32 only), without the safetensors package."""
    with open(path, "rb") as f:
        (header_size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_size))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise ValueError(f"{name}: dtype {info['dtype']}, expected F32")
        begin, end = info["data_offsets"]
        values = torch.frombuffer(bytearray(data[begin:end]), dtype=torch.float32)
        tensors[name] = values.reshape(info["shape"]).to(device)
    return tensors


def causal_attention(q, k, v, past=0):
    """softmax(q kᵀ / sqrt(d) + causal mask) v over [B, H, T, D], the queries being the last
    T of past + T positions: PyTorch's fused SDPA where it exists (2.0 and later), else the
    same in plain operations."""
    T = q.shape[-2]
    if hasattr(F, "scaled_dot_product_attention") and (past == 0 or T == 1):
        return F.scaled_dot_product_attention(q, k, v, is_causal=past == 0)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    mask = torch.ones(T, past + T, dtype=torch.bool, device=q.device).triu(past + 1)
    return scores.masked_fill(mask, float("-inf")).softmax(-1) @ v


class Model:
    def __init__(self, config, base, adapter, lora_scale):
        if config["qk_norm"] != "none" or config["kv_lora_rank"] > 0:
            raise ValueError("the reference covers standard attention without q/k norms")
        if config["num_expert_groups"] > 1 or config["yarn_original_max_position"] > 0:
            raise ValueError("the reference covers top-k routing without groups, plain RoPE")
        self.c = config
        self.base = base
        self.adapter = adapter
        self.scale = lora_scale
        d = config["d_model"]
        self.heads = config["num_heads"]
        self.kv_heads = config["num_kv_heads"] or self.heads
        self.head_dim = config["attention_head_dim"] or d // self.heads
        half = self.head_dim // 2
        device = next(iter(base.values())).device
        exponents = -2.0 * torch.arange(half, dtype=torch.float64, device=device) / self.head_dim
        self.inv_freq = config["rope_theta"] ** exponents

    def is_moe(self, layer):
        c = self.c
        return (layer >= c["num_dense_layers"] and (layer + 1) % c["decoder_sparse_step"] == 0
                and layer not in c["mlp_only_layers"])

    def project(self, x, weight_name):
        """x · Wᵀ plus the LoRA of that projection when the adapter has one."""
        y = x @ self.base[weight_name].T
        stem = weight_name[: -len(".weight")]
        a = self.adapter.get(stem + ".lora_A.weight")
        if a is not None:
            y = y + self.scale * ((x @ a.T) @ self.adapter[stem + ".lora_B.weight"].T)
        return y

    def rms_norm(self, x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.c["norm_eps"]) * weight

    def rope(self, x, positions):
        # x [B, T, H, D]; pairs (i, i + D/2) as the engine rotates them.
        angles = positions[:, None].double() * self.inv_freq[None, :]
        cos, sin = angles.cos().float(), angles.sin().float()
        cos, sin = cos[None, :, None, :], sin[None, :, None, :]
        half = self.head_dim // 2
        a, b = x[..., :half], x[..., half:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

    def attention(self, layer, x, positions, cache=None):
        """Self-attention of x [B, T] at `positions`; with a cache (a dict kept across calls),
        the keys and values of earlier calls come first and these join them."""
        B, T, _ = x.shape
        p = f"model.layers.{layer}.self_attn."
        q = self.project(x, p + "q_proj.weight").view(B, T, self.heads, self.head_dim)
        k = self.project(x, p + "k_proj.weight").view(B, T, self.kv_heads, self.head_dim)
        v = self.project(x, p + "v_proj.weight").view(B, T, self.kv_heads, self.head_dim)
        q, k = self.rope(q, positions), self.rope(k, positions)
        past = 0
        if cache is not None:
            if layer in cache:
                past = cache[layer][0].shape[1]
                k = torch.cat([cache[layer][0], k], dim=1)
                v = torch.cat([cache[layer][1], v], dim=1)
            cache[layer] = (k, v)
        group = self.heads // self.kv_heads
        k = k.repeat_interleave(group, dim=2)
        v = v.repeat_interleave(group, dim=2)
        out = causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), past)
        out = out.transpose(1, 2).reshape(B, T, self.heads * self.head_dim)
        return self.project(out, p + "o_proj.weight")

    def mlp(self, x, prefix):
        gate = self.project(x, prefix + "gate_proj.weight")
        up = self.project(x, prefix + "up_proj.weight")
        return self.project(F.silu(gate) * up, prefix + "down_proj.weight")

    def moe(self, layer, x):
        c = self.c
        p = f"model.layers.{layer}.mlp."
        logits = x @ self.base[p + "gate.weight"].T
        scores = logits.softmax(-1) if c["scoring"] == "softmax" else logits.sigmoid()
        bias = self.base.get(p + "gate.e_score_correction_bias")
        keys = scores if bias is None else scores + bias
        ids = keys.topk(c["top_k"], dim=-1).indices
        gates = scores.gather(-1, ids)
        if c["norm_topk_prob"]:
            gates = gates / gates.sum(-1, keepdim=True)
        gates = gates * c["routed_scaling_factor"]
        out = torch.zeros_like(x)
        for e in range(c["num_experts"]):
            token, slot = torch.where(ids == e)
            if token.numel() == 0:
                continue
            y = self.mlp(x[token], f"{p}experts.{e}.")
            out.index_add_(0, token, y * gates[token, slot, None])
        if c["num_shared_experts"] > 0:
            out = out + self.mlp(x, p + "shared_experts.")
        return out, ids

    def forward(self, tokens, start=0, cache=None):
        """tokens [B, T] at positions start.. -> logits [B, T, vocab]; `cache` as attention's."""
        c = self.c
        x = self.base["model.embed_tokens.weight"][tokens]
        B, T, d = x.shape
        positions = torch.arange(start, start + T, device=x.device)
        for layer in range(c["num_layers"]):
            p = f"model.layers.{layer}."
            h = self.rms_norm(x, self.base[p + "input_layernorm.weight"])
            x = x + self.attention(layer, h, positions, cache)
            h = self.rms_norm(x, self.base[p + "post_attention_layernorm.weight"])
            if self.is_moe(layer):
                y, _ = self.moe(layer, h.reshape(B * T, d))
                x = x + y.view(B, T, d)
            else:
                x = x + self.mlp(h, p + "mlp.")
        x = self.rms_norm(x, self.base["model.norm.weight"])
        head = "model.embed_tokens.weight" if c["tie_word_embeddings"] else "lm_head.weight"
        return x @ self.base[head].T

    def generate(self, prompts, max_new_tokens):
        """Greedy continuation of prompts [B, P] with a key/value cache -> [B, P + new]."""
        cache = {}
        with torch.no_grad():
            logits = self.forward(prompts, 0, cache)
            tokens = [prompts, logits[:, -1].argmax(-1, keepdim=True)]
            for step in range(max_new_tokens - 1):
                logits = self.forward(tokens[-1], prompts.shape[1] + step, cache)
                tokens.append(logits[:, -1].argmax(-1, keepdim=True))
        return torch.cat(tokens, dim=1)


def timed(fn, device, iterations=10):
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iterations):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / iterations


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tolerance", type=float, default=1e-3,
                        help="largest |logit difference| from the engine that passes")
    parser.add_argument("--min_identical", type=float, default=0.9,
                        help="smallest share of greedy generations equal to the engine's that "
                             "passes (rounding may flip a near tie on another device)")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 as the engine computes.
    torch.backends.cudnn.allow_tf32 = False
    with open(os.path.join(args.dir, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(args.dir, "batch.json")) as f:
        batch = json.load(f)
    base = read_safetensors(os.path.join(args.dir, "model.safetensors"), args.device)
    adapter = read_safetensors(os.path.join(args.dir, "adapter.safetensors"), args.device)
    for tensor in adapter.values():
        tensor.requires_grad_(True)
    model = Model(config, base, adapter, batch["lora_scale"])
    tokens = torch.tensor(batch["tokens"], device=args.device)
    B, T = tokens.shape

    with torch.no_grad():
        logits = model.forward(tokens)
    with open(os.path.join(args.dir, "logits.f32"), "rb") as f:
        engine = torch.frombuffer(bytearray(f.read()), dtype=torch.float32).reshape(B, T, -1)
    difference = (logits.float().cpu() - engine).abs().max().item()
    print(f"torch_reference: max |logit difference| vs the engine {difference:.3g}")

    def forward():
        with torch.no_grad():
            model.forward(tokens)

    dlogits = torch.randn(B, T, config["vocab_size"], device=args.device)

    def train_step():
        for tensor in adapter.values():
            tensor.grad = None
        (model.forward(tokens) * dlogits).sum().backward()

    prompt_tokens = batch["prompt_tokens"]
    prompts = tokens[:, :prompt_tokens]
    new_tokens = T - prompt_tokens
    generated = model.generate(prompts, new_tokens)
    engine_generated = torch.tensor(batch["generated"], device=args.device)
    identical = (generated == engine_generated).all(dim=1).float().mean().item()
    print(f"torch_reference: greedy generations identical to the engine's: {identical:.0%}")

    tokens_per_step = B * T
    forward_s = timed(forward, args.device)
    train_s = timed(train_step, args.device)
    generate_s = timed(lambda: model.generate(prompts, new_tokens), args.device, iterations=2)
    print(f"torch_reference ({args.device}, eager, fp32): forward {tokens_per_step / forward_s:,.0f} "
          f"tokens/s, forward+backward {tokens_per_step / train_s:,.0f} tokens/s, generation "
          f"{B * new_tokens / generate_s:,.0f} new tokens/s ({B} x {T} tokens)")
    return 0 if difference <= args.tolerance and identical >= args.min_identical else 1


if __name__ == "__main__":
    sys.exit(main())
