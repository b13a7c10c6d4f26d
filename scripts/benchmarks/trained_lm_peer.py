"""Torch-Pruning's LLM example method on a transformers LLaMA folder (runs in the peer's own venv).

Follows VainF/Torch-Pruning examples/LLMs/prune_llm.py (v1.6): BasePruner with
GroupMagnitudeImportance(p=2, mean), local (uniform) pruning of the hidden size, the
heads (prune_num_heads, not head dims, so RoPE is untouched) and the FFN at one ratio,
lm_head ignored, round_to=4, traced on the text "Hello world.". The method is data-free
(weight magnitudes), so it takes no calibration text. To meet a parameter count this
bisects the ratio on the real count of pruned copies (the count is reported).

Usage (peer venv, no headprune needed):
  python scripts/benchmarks/trained_lm_peer.py HF_FOLDER --keep 0.8 -o OUT_FOLDER
Prints {"ratio", "parameters", "baseline_parameters", "config"} as JSON.
"""

from __future__ import annotations

import argparse
import json


def traceable_rotary() -> None:
    """Swap transformers' LLaMA `rotate_half` for an exactly equal form Torch-Pruning can trace.

    rotate_half slices the head dimension in two and concatenates [-x2, x1]; in the graph
    Torch-Pruning 1.6.1 traces (torch 2.13, transformers 4.46 and 5.24 alike) those slice and
    concat nodes form a cycle whose index mapping shifts on every pass, so building the
    pruning groups never ends (upstream: VainF/Torch-Pruning issue #527, still open). A roll
    by half the width times a sign vector is the same function, bit for bit (a permutation
    and a negation), and traces as element-wise ops. The pruning method is unchanged.
    """
    import torch
    import transformers.models.llama.modeling_llama as llama

    def rotate_half(x):
        half = x.shape[-1] // 2
        sign = torch.cat([-torch.ones(half, dtype=x.dtype), torch.ones(half, dtype=x.dtype)])
        return torch.roll(x, half, -1) * sign

    probe = torch.randn(2, 3, 8)
    assert torch.equal(llama.rotate_half(probe), rotate_half(probe))
    llama.rotate_half = rotate_half


def prune(model, ratio: float, example):
    import torch_pruning as tp

    num_heads = {}
    for name, m in model.named_modules():
        if name.endswith("self_attn"):
            num_heads[m.q_proj] = model.config.num_attention_heads
            num_heads[m.k_proj] = model.config.num_key_value_heads
            num_heads[m.v_proj] = model.config.num_key_value_heads
    gqa = model.config.num_attention_heads != model.config.num_key_value_heads
    pruner = tp.pruner.BasePruner(
        model,
        example_inputs=example,
        importance=tp.importance.GroupMagnitudeImportance(p=2, group_reduction="mean"),
        global_pruning=False,
        output_transform=lambda x: x.logits,
        pruning_ratio=ratio,
        ignored_layers=[model.lm_head],
        num_heads=num_heads,
        prune_num_heads=True,
        prune_head_dims=False,
        head_pruning_ratio=ratio,
        round_to=4,
    )
    for group in pruner.step(interactive=True):
        group.prune()
    # The attribute updates of prune_llm.py, for transformers' LlamaAttention / LlamaMLP.
    model.config.hidden_size = model.lm_head.in_features
    for name, m in model.named_modules():
        if name.endswith("self_attn"):
            heads = m.q_proj.out_features // m.head_dim
            kv = m.k_proj.out_features // m.head_dim
            model.config.num_attention_heads = heads
            model.config.num_key_value_heads = kv if gqa else heads
            if hasattr(m, "num_key_value_groups"):
                m.num_key_value_groups = heads // model.config.num_key_value_heads
        elif name.endswith("mlp"):
            model.config.intermediate_size = m.gate_proj.out_features
    return model


def count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def bisect_ratio(base, target: float, example, steps: int = 12):
    """The smallest ratio whose pruned copy has at most `target` parameters, found by
    pruning copies (seconds each at this size): the method's own rounding (round_to=4,
    whole heads) decides the real count, which no closed form predicts well."""
    import copy

    low, high, best = 0.0, 0.95, None
    for _ in range(steps):
        ratio = round((low + high) / 2, 4)
        model = prune(copy.deepcopy(base), ratio, example)
        if count(model) <= target:
            high, best = ratio, (ratio, model)
        else:
            low = ratio
    if best is None:
        raise SystemExit(f"no ratio up to {high} reaches {target:.0f} parameters")
    return best


def main() -> None:
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--keep", type=float, required=True, help="fraction of the parameters to keep")
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    traceable_rotary()
    base = AutoModelForCausalLM.from_pretrained(args.folder, local_files_only=True).eval()
    tokenizer = Tokenizer.from_file(f"{args.folder}/tokenizer.json")
    example = torch.tensor([tokenizer.encode("Hello world.").ids])
    baseline = count(base)
    ratio, model = bisect_ratio(base, args.keep * baseline, example)
    model.save_pretrained(args.output)
    print(
        json.dumps(
            {
                "ratio": ratio,
                "parameters": count(model),
                "baseline_parameters": baseline,
                "config": {
                    k: getattr(model.config, k)
                    for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size")
                },
            }
        )
    )


if __name__ == "__main__":
    main()
