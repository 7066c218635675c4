#!/usr/bin/env python3
"""Tandem's MoE + LoRA model written plainly in PyTorch (eager), the yardstick of the CUDA engine.

Reads what `engine_cuda_bench --out_dir=DIR` wrote (config.json, model.safetensors,
adapter.safetensors, batch.json, logits.f32), checks its own logits against the engine's, then
times the same work the bench timed: forward, and forward + backward into the LoRA weights, in
tokens per second on the same GPU. Covers the architectures CudaTransformer runs: standard
grouped-query attention without q/k norms, softmax or sigmoid routing with top-k (no group limit),
dense and MoE layers, shared experts, per-expert LoRA on every projection.

Usage (on the GPU machine; tools/gpu_check run calls it): moe_reference.py DIR [--device cuda]
Exits non-zero when the logits differ from the engine's by more than --tolerance.
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


def causal_attention(q, k, v):
    """softmax(q kᵀ / sqrt(d) + causal mask) v over [B, H, T, D]: PyTorch's fused SDPA where it
    exists (2.0 and later), else the same in plain operations."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[-2]
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
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

    def attention(self, layer, x):
        B, T, _ = x.shape
        p = f"model.layers.{layer}.self_attn."
        q = self.project(x, p + "q_proj.weight").view(B, T, self.heads, self.head_dim)
        k = self.project(x, p + "k_proj.weight").view(B, T, self.kv_heads, self.head_dim)
        v = self.project(x, p + "v_proj.weight").view(B, T, self.kv_heads, self.head_dim)
        positions = torch.arange(T, device=x.device)
        q, k = self.rope(q, positions), self.rope(k, positions)
        group = self.heads // self.kv_heads
        k = k.repeat_interleave(group, dim=2)
        v = v.repeat_interleave(group, dim=2)
        out = causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
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

    def forward(self, tokens):
        """tokens [B, T] -> logits [B, T, vocab]."""
        c = self.c
        x = self.base["model.embed_tokens.weight"][tokens]
        B, T, d = x.shape
        for layer in range(c["num_layers"]):
            p = f"model.layers.{layer}."
            x = x + self.attention(layer, self.rms_norm(x, self.base[p + "input_layernorm.weight"]))
            h = self.rms_norm(x, self.base[p + "post_attention_layernorm.weight"])
            if self.is_moe(layer):
                y, _ = self.moe(layer, h.reshape(B * T, d))
                x = x + y.view(B, T, d)
            else:
                x = x + self.mlp(h, p + "mlp.")
        x = self.rms_norm(x, self.base["model.norm.weight"])
        head = "model.embed_tokens.weight" if c["tie_word_embeddings"] else "lm_head.weight"
        return x @ self.base[head].T


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

    tokens_per_step = B * T
    forward_s = timed(forward, args.device)
    train_s = timed(train_step, args.device)
    print(f"torch_reference ({args.device}, eager, fp32): forward {tokens_per_step / forward_s:,.0f} "
          f"tokens/s, forward+backward {tokens_per_step / train_s:,.0f} tokens/s "
          f"({B} x {T} tokens)")
    return 0 if difference <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
