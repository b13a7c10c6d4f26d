"""Measured vs FLOP-predicted speedup of head pruning on CPU.

Usage:
  python -m scripts.benchmarks.speed                  # MiniLM + GPT-2-small + LLaMA shaped
  python -m scripts.benchmarks.speed --only minilm --repeats 15

For each model: the baseline and copies with 25/50/75% of the heads removed (the same
count in every layer; whole key/value groups for grouped-query attention) are timed
interleaved in one loop (headprune_cli.measure_latency, alternating order), after
warm-up, at a fixed batch, sequence length and thread count. Measured speedup is the
ratio of median latencies; predicted speedup the ratio of analytic FLOPs per token
(headprune_cli.flops_per_token). Weights are random for the GPT-2 and LLaMA shapes (speed does not
depend on values); MiniLM is the real all-MiniLM-L6-v2.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import sys

import torch
import transformers as T

from headprune_cli import apply_plan, flops_per_token, info_of, synthetic_inputs
from headprune_cli import measure_latency as measure

from .common import minilm, tiny_bert

FRACTIONS = (0.25, 0.5, 0.75)
HEADER = (
    "| model | heads removed | batch x seq | baseline ms (IQR) | pruned ms (IQR) | predicted | measured | "
    "measured/predicted |\n|---|---|---|---:|---:|---:|---:|---:|"
)


def gpt2_small(layers: int, width: int = 768, vocab: int = 50257):
    config = T.GPT2Config(n_layer=layers, n_embd=width, n_head=12, n_positions=1024, vocab_size=vocab)
    return T.GPT2LMHeadModel(config).eval()


def llama_shaped(layers: int, head_dim: int = 64, vocab: int = 32000):
    config = T.LlamaConfig(
        hidden_size=16 * head_dim,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=head_dim,
        intermediate_size=44 * head_dim,
        num_hidden_layers=layers,
        vocab_size=vocab,
        max_position_embeddings=2048,
    )
    return T.LlamaForCausalLM(config).eval()


def speed_models(quick: bool, layers: int = 4) -> list[tuple[str, object, int, int]]:
    """(name, model, batch, seq) for each benchmarked shape; quick: tiny widths, same code path."""
    T.utils.logging.set_verbosity_error()
    torch.manual_seed(0)
    if quick:
        return [
            ("tiny BERT (random)", tiny_bert(), 4, 16),
            ("tiny GPT-2 shape", gpt2_small(1, 96, 100), 1, 32),
            ("tiny LLaMA shape (16q/4kv)", llama_shaped(1, 8, 100), 1, 32),
        ]
    return [
        ("all-MiniLM-L6-v2", minilm(), 32, 128),
        (f"GPT-2-small shape, {layers} layers", gpt2_small(layers), 1, 512),
        (f"LLaMA shape (1024d, 16q/4kv heads), {layers} layers", llama_shaped(layers), 1, 512),
    ]


def remove_fraction(model, fraction: float):
    """A copy without the last `fraction` of each layer's heads (whole KV groups)."""
    pruned = copy.deepcopy(model)
    layout = info_of(pruned).layout
    plan = {}
    for layer in layout.layers:
        heads, kv = layout.num_heads[layer], layout.num_kv_heads[layer]
        group = heads // kv
        drop_groups = round(kv * fraction)
        plan[layer] = list(range(heads - drop_groups * group, heads))
    apply_plan(pruned, plan, [])
    return pruned


def bench(name: str, model, batch: int, seq: int, threads: int, repeats: int, warmup: int) -> list[dict]:
    info_of(model)
    models = {"baseline": model}
    for fraction in FRACTIONS:
        models[f"{fraction:.0%}"] = remove_fraction(model, fraction)
    inputs = {key: synthetic_inputs(m, batch, seq)[0] for key, m in models.items()}
    timed = measure(models, inputs, repeats=repeats, warmup=warmup, threads=threads)
    base_flops = flops_per_token(model, seq)
    rows = []
    for key, m in models.items():
        if key == "baseline":
            continue
        layout = info_of(m).layout
        predicted = base_flops / flops_per_token(m, seq)
        measured = timed["baseline"].median_ms / timed[key].median_ms
        rows.append(
            {
                "model": name,
                "removed": key,
                "heads": f"{sum(map(len, layout.heads))}/{sum(layout.num_heads)}",
                "batch": batch,
                "seq": seq,
                "threads": threads,
                "repeats": repeats,
                "baseline_ms": timed["baseline"].median_ms,
                "baseline_iqr": [timed["baseline"].q1_ms, timed["baseline"].q3_ms],
                "pruned_ms": timed[key].median_ms,
                "pruned_iqr": [timed[key].q1_ms, timed[key].q3_ms],
                "predicted": predicted,
                "measured": measured,
                "ratio": measured / predicted,
            }
        )
        print(markdown_row(rows[-1]), file=sys.stderr, flush=True)
    return rows


def markdown_row(r: dict) -> str:
    return (
        f"| {r['model']} | {r['removed']} ({r['heads']}) | {r['batch']}x{r['seq']}, {r['threads']} thr | "
        f"{r['baseline_ms']:.1f} ({r['baseline_iqr'][0]:.1f}–{r['baseline_iqr'][1]:.1f}) | "
        f"{r['pruned_ms']:.1f} ({r['pruned_iqr'][0]:.1f}–{r['pruned_iqr'][1]:.1f}) | "
        f"{r['predicted']:.3f}x | {r['measured']:.3f}x | {r['ratio']:.3f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["minilm", "gpt2", "llama"], action="append")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--layers", type=int, default=4, help="layers of the GPT-2 and LLaMA shapes")
    parser.add_argument("--json", help="also write the rows as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    chosen = args.only or ["minilm", "gpt2", "llama"]
    print(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, {args.threads} threads",
        file=sys.stderr,
    )
    header = HEADER
    print(header, file=sys.stderr)
    rows = []
    for key, (name, model, batch, seq) in zip(("minilm", "gpt2", "llama"), speed_models(False, args.layers)):
        if key in chosen:
            rows += bench(name, model, batch, seq, args.threads, args.repeats, args.warmup)
    print(header)
    for row in rows:
        print(markdown_row(row))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=2)


if __name__ == "__main__":
    main()
