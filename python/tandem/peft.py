"""A PEFT LoRA directory (adapter_config.json + adapter_model.safetensors) from a version.

The same files `tandem-cli export` writes, so Hugging Face PEFT and vLLM load them: tensors
under "base_model.model." + their PEFT name (Mixtral's block_sparse_moe/w1/w3/w2 where the
version's architecture label says Mixtral), a LoRA side shared by all experts written to each
expert, and a config with r, lora_alpha and target_modules.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
from typing import Dict, Mapping

import numpy as np

from tandem import safetensors
from tandem.weightstore.v1 import weight_store_pb2

NUM_EXPERTS_LABEL = "num_experts"
ARCHITECTURE_LABEL = "architecture"
_ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
_CANONICAL_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
_SHARED_EXPERT_SIDE = re.compile(r"^(.*\.mlp\.experts\.)((gate|up|down)_proj\.lora_[AB]\.weight)$")


class ModuleNames:
    """How an architecture names its MoE modules (engine/module_names.h)."""

    def __init__(self, architecture: str):
        mixtral = architecture == "MixtralForCausalLM"
        self.block = "block_sparse_moe" if mixtral else "mlp"
        self.projections = ("w1", "w3", "w2") if mixtral else _CANONICAL_PROJECTIONS

    def module(self, canonical: str) -> str:
        if canonical in _CANONICAL_PROJECTIONS:
            return self.projections[_CANONICAL_PROJECTIONS.index(canonical)]
        return canonical

    def from_canonical(self, name: str) -> str:
        if ".mlp.gate." not in name and ".mlp.experts." not in name:
            return name  # Attention, norms and dense MLPs keep their names.
        name = name.replace(".mlp.", f".{self.block}.")
        for canonical, own in zip(_CANONICAL_PROJECTIONS, self.projections):
            name = name.replace(f".{canonical}.", f".{own}.")
        return name


def num_experts(manifest: weight_store_pb2.Manifest) -> int:
    """Experts per MoE layer, which a side shared by all experts needs to be copied to each."""
    count = max((t.num_experts for t in manifest.tensors), default=0)
    shared_sides = any(".mlp.experts." in t.spec.name and t.num_experts == 0
                       for t in manifest.tensors)
    if count > 0 or not shared_sides:
        return count
    label = manifest.labels.get(NUM_EXPERTS_LABEL, "")
    if not label.isdigit() or int(label) < 1:
        raise ValueError(f"version {manifest.version} shares LoRA sides between experts but does "
                         f"not say how many experts there are (label '{NUM_EXPERTS_LABEL}')")
    return int(label)


def write_directory(directory: os.PathLike, manifest: weight_store_pb2.Manifest,
                    canonical: Mapping[str, np.ndarray], base_model_name_or_path: str) -> None:
    """Writes the PEFT files of `manifest`'s version, whose tensors (canonical names, float32)
    are `canonical`, into `directory` (created if missing)."""
    names = ModuleNames(manifest.labels.get(ARCHITECTURE_LABEL, ""))
    experts = num_experts(manifest)
    tensors: Dict[str, np.ndarray] = {}
    for name, tensor in canonical.items():
        shared = _SHARED_EXPERT_SIDE.match(name)
        per_expert = ([f"{shared.group(1)}{e}.{shared.group(2)}" for e in range(experts)]
                      if shared else [name])
        for each in per_expert:
            tensors["base_model.model." + names.from_canonical(each)] = tensor
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    safetensors.write(directory / "adapter_model.safetensors", tensors, {"format": "pt"})
    config_path = directory / "adapter_config.json"
    temporary = config_path.with_name(config_path.name + ".tmp")
    temporary.write_text(json.dumps(_config(manifest, names, base_model_name_or_path), indent=2)
                         + "\n")
    os.replace(temporary, config_path)


def _config(manifest: weight_store_pb2.Manifest, names: ModuleNames, base_model: str) -> dict:
    lora = manifest.lora
    targets = list(lora.target_modules) or _ALL_TARGETS
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
            "r": lora.rank, "lora_alpha": lora.alpha or float(lora.rank),
            "target_modules": [names.module(t) for t in targets], "lora_dropout": 0.0,
            "bias": "none", "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
            "inference_mode": True, "init_lora_weights": True, "modules_to_save": None,
            "layers_to_transform": None, "layers_pattern": None, "rank_pattern": {},
            "alpha_pattern": {}}
