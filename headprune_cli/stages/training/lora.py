"""`finetune --lora`: low-rank adapters (peft) on the kept projections, merged back at the end.

Full fine-tuning keeps weights, gradients and two AdamW moments per parameter (16 bytes
each in fp32): a 7-8 B model needs over 110 GB. LoRA trains two small matrices beside each
targeted projection instead and freezes the rest, so gradients and optimizer state shrink
to the adapters'. The targets default to every block's attention and FFN projections, found
through the family's adapter views (q/k/v/o and gate/up/down for LLaMA; query/key/value,
attention.output.dense, intermediate.dense, output.dense for BERT; fused c_attn for GPT-2):
after pruning those are exactly the kept heads' and neurons' weights, whatever their widths.

peft wraps the model in place (the headprune model object and its metadata stay), and
`merge` folds each adapter into its dense weight and removes the wrappers, so the output is
an ordinary checkpoint at the pruned layout that serves without peft. `save_adapter` writes
the unmerged adapter in peft's own format (adapter_config.json + adapter_model.safetensors)
for engines that serve adapters; it applies to the input checkpoint.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch
from torch import nn

from headprune_cli.errors import UsageError
from headprune_cli.files.outputs import check_folder, check_parent
from headprune_cli.files.staged import stage_folder
from headprune_cli.model.arch import adapter_for
from headprune_cli.model.arch.base import is_conv1d
from headprune_cli.stages.options import LoraSpec

# LoRA's default rate, as a multiple of full training's default (train.default_lr): of 1x, 10x and
# 30x, 10x recovered the most on both Debian classifiers after the same cut (BENCHMARKS.md §27).
LORA_LR_FACTOR = 10.0


def projections(model: nn.Module) -> dict[str, nn.Module]:
    """Every block's attention and FFN projections by their full module names, in model order."""
    adapter = adapter_for(model)
    wanted: set[int] = set()
    for layer in adapter.layer_list(model):
        attn = adapter.attention(layer)
        wanted.update(id(m) for m in (attn.q, attn.k, attn.v, attn.o, attn.fused_qkv) if m is not None)
        ffn = adapter.ffn(layer)
        wanted.update(id(m) for m in (*ffn.ups, ffn.down))
    return {name: module for name, module in model.named_modules() if id(module) in wanted}


def short_names(names) -> list[str]:
    """The projections' names inside a block (`self_attn.q_proj`, `attention.output.dense`), each once."""
    out: list[str] = []
    for name in names:
        parts = name.split(".")
        index = next(i for i, part in enumerate(parts) if part.isdigit())  # the layer number
        inner = ".".join(parts[index + 1 :])
        if inner not in out:
            out.append(inner)
    return out


def resolve_targets(model: nn.Module, targets: tuple[str, ...] | None) -> dict[str, nn.Module]:
    """The projections LoRA adapts: all of them, or those whose name is or ends with a target.

    Every one is a Linear or a GPT-2 Conv1D at least one wide: surgery keeps a head and a
    neuron in every layer it keeps, and at least one layer (model/surgery.py, model/ffn.py).
    """
    candidates = projections(model)
    if targets is None:
        return candidates
    unmatched = [t for t in targets if not any(_matches(n, t) for n in candidates)]
    if unmatched:
        raise UsageError(
            f"--lora-targets {','.join(unmatched)} matches none of the model's attention/FFN projections "
            f"(available: {', '.join(short_names(candidates))})"
        )
    return {n: m for n, m in candidates.items() if any(_matches(n, t) for t in targets)}


def _matches(name: str, target: str) -> bool:
    return name == target or name.endswith("." + target)


def _width(module: nn.Module) -> int:
    """The narrower side of a Linear or a GPT-2 Conv1D: the highest rank an adapter there can have."""
    return min(module.get_parameter("weight").shape)


def check(model: nn.Module, spec: LoraSpec) -> dict[str, nn.Module]:
    """Refuse a spec that cannot adapt this model, before anything is trained or written."""
    if not (spec.dropout >= 0.0 and spec.dropout < 1.0):
        raise UsageError(f"--lora-dropout {spec.dropout} is outside [0, 1)")
    if spec.alpha is not None and not spec.alpha > 0:
        raise UsageError(f"--lora-alpha must be positive (got {spec.alpha})")
    targets = resolve_targets(model, spec.targets)
    narrowest_name, narrowest = min(targets.items(), key=lambda item: _width(item[1]))
    width = _width(narrowest)
    if not 1 <= spec.rank <= width:
        raise UsageError(
            f"--lora-rank {spec.rank} is outside 1..{width} "
            f"(the narrowest targeted projection, {narrowest_name}, is {width} wide)"
        )
    return targets


def attach(model: nn.Module, spec: LoraSpec, seed: int):
    """Wrap the targeted projections of `model` (in place) with fresh adapters; returns the PeftModel.

    Only the adapters train afterwards. Their initialisation draws from a generator of its
    own, so the same seed gives the same adapters and the caller's random stream is untouched.
    """
    try:
        from peft import LoraConfig, get_peft_model  # noqa: PLC0415 (peft: an optional extra)
    except ImportError:
        raise UsageError("--lora needs peft: pip install 'headprune[lora]' (or pip install peft)") from None
    targets = check(model, spec)
    config = LoraConfig(
        r=spec.rank,
        # peft annotates lora_alpha as int but only divides by it (scaling = alpha / r): --lora-alpha may be fractional
        lora_alpha=spec.scale_alpha,  # type: ignore[arg-type]
        lora_dropout=spec.dropout,
        target_modules=list(targets),
        fan_in_fan_out=any(is_conv1d(m) for m in targets.values()),  # GPT-2's Conv1D stores W transposed
        bias="none",
    )
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # peft reads transformers' deprecated `is_gradient_checkpointing`: a FutureWarning about
        # peft's code on every --lora run, nothing the user can act on.
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        torch.manual_seed(seed)
        return get_peft_model(model, config)


def merge(peft_model) -> nn.Module:
    """Fold every adapter into its dense weight and drop the wrappers: the plain model again."""
    model = peft_model.merge_and_unload()
    for param in model.parameters():
        param.requires_grad_(True)
    return model


def check_adapter_folder(folder: Path, force: bool, inputs) -> Path:
    """`--keep-adapter DIR`: new, or (with --force) a folder headprune wrote; refused otherwise."""

    out = check_folder(folder, inputs, "--keep-adapter folder", force)
    if os.path.lexists(out) and not force:
        raise UsageError(f"{out} exists; pass --force to overwrite it")
    check_parent(out)
    return out


def save_adapter(peft_model, folder: Path) -> None:
    """Write the unmerged adapter in peft's format into `folder`: built complete beside it, and
    renamed onto it together with the command's main output (files/staged.py)."""

    stage_folder(folder, lambda tmp: peft_model.save_pretrained(str(tmp), safe_serialization=True))
