"""Torch-Pruning's LLM example method on a transformers LLaMA folder (runs in the peer's own venv).

Follows VainF/Torch-Pruning examples/LLMs/prune_llm.py (v1.6): BasePruner with
GroupMagnitudeImportance(p=2, mean), local (uniform) pruning of the hidden size, the
heads (prune_num_heads, not head dims, so RoPE is untouched) and the FFN at one ratio,
lm_head ignored, round_to=4, traced on the text "Hello world.". The method is data-free
(weight magnitudes), so it takes no calibration text. To meet a parameter count this
bisects the ratio on the predicted count, then prunes once (the real count is reported).

Usage (peer venv, no headprune needed):
  python scripts/benchmarks/trained_lm_peer.py HF_FOLDER --keep 0.8 -o OUT_FOLDER
Prints {"ratio", "parameters", "baseline_parameters", "config"} as JSON.
"""

from __future__ import annotations

import argparse
import json


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
        model, example_inputs=example, importance=tp.importance.GroupMagnitudeImportance(p=2, group_reduction="mean"),
        global_pruning=False, output_transform=lambda x: x.logits, pruning_ratio=ratio,
        ignored_layers=[model.lm_head], num_heads=num_heads, prune_num_heads=True, prune_head_dims=False,
        head_pruning_ratio=ratio, round_to=4,
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


def predicted_count(config, ratio: float) -> int:
    """Parameters after removing `ratio` of the hidden width, KV groups and FFN channels."""
    def round4(n: float) -> int:
        return max(4, int(round(n / 4)) * 4)

    hidden, ffn = round4(config.hidden_size * (1 - ratio)), round4(config.intermediate_size * (1 - ratio))
    kv = max(1, round(config.num_key_value_heads * (1 - ratio)))
    q = kv * (config.num_attention_heads // config.num_key_value_heads)
    head_dim = config.head_dim
    layer = hidden * q * head_dim * 2 + 2 * hidden * kv * head_dim + 3 * hidden * ffn + 2 * hidden
    return config.num_hidden_layers * layer + 2 * config.vocab_size * hidden + hidden


def count(model) -> int:
    return sum(p.numel() for p in model.parameters())


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
    base = AutoModelForCausalLM.from_pretrained(args.folder, local_files_only=True).eval()
    tokenizer = Tokenizer.from_file(f"{args.folder}/tokenizer.json")
    example = torch.tensor([tokenizer.encode("Hello world.").ids])
    target = args.keep * count(base)
    # Building Torch-Pruning's dependency graph of a LLaMA takes minutes on 2 shared
    # cores (every layer shares the residual width), so the ratio is found on the
    # predicted count and the model pruned once; the JSON reports the real count.
    low, high = 0.0, 0.95
    for _ in range(30):
        ratio = (low + high) / 2
        low, high = (ratio, high) if predicted_count(base.config, ratio) > target else (low, ratio)
    ratio = round((low + high) / 2, 4)
    best = (None, ratio, prune(base, ratio, example))
    _, ratio, model = best
    model.save_pretrained(args.output)
    print(json.dumps({"ratio": ratio, "parameters": count(model), "baseline_parameters": count(base),
                      "config": {k: getattr(model.config, k) for k in ("hidden_size", "num_attention_heads",
                                                                        "num_key_value_heads", "intermediate_size")}}))


if __name__ == "__main__":
    main()
