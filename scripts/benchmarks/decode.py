"""Serving a causal LM with half of its KV groups removed: KV cache, prefill and decode, each beside its prediction.

Usage:
  nice python -m scripts.benchmarks.decode                       # LLaMA shape, context 1024, batch 1 and 8
  nice python -m scripts.benchmarks.decode --batches 1 --repeats 3 --json decode.json
  nice python -m scripts.benchmarks.suite --only decode           # the same, into BENCHMARKS.md's decode block
  python -m scripts.benchmarks.decode --quick                    # a tiny LLaMA, seconds (the test suite)

A LLaMA-shaped model (hidden 1024, 16 query heads sharing 4 key/value heads, head_dim 64,
random weights: speed does not depend on values) and a copy without the last 2 of the 4
KV groups of every layer (`select --uniform` would keep the same count per layer) are
measured side by side, interleaved in alternating order after warm-up
(headprune_cli.latency.measure_runs):
- prefill: one forward over the `context`-token prompt with the KV cache on (output head
  for the last position only, as a server runs it);
- decode: `tokens` greedy steps after a `context`-token cache. The cache is filled with
  random keys and values of the exact shapes a prefill leaves (decode time does not
  depend on their values; a batch-8 prefill is minutes on 2 shared cores); every timed
  run crops it back to `context` and decodes again, so a sample never pays for a prefill.
  The KV bytes per token that a real prefill leaves in transformers' cache are measured
  separately, as the check on the prediction.
Predictions are the report's own (headprune_cli.serving.decode_prediction):
prefill from FLOPs, decode from bytes read per generated token; KV bytes per token are
exact from the layout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path

import torch

from headprune_cli import latency, serving

from .speed import llama_shaped, remove_fraction

HEADER = (
    "| batch | KV cache B/token: baseline → pruned, predicted (measured in the cache) | prefill ms: "
    "baseline / pruned | prefill speedup: predicted / measured "
    "| decode tokens/s: baseline / pruned | decode speedup: predicted (bytes) / measured | decode FLOP ratio |\n"
    "|---:|---|---|---|---|---|---:|"
)


def _prefill_ms(model, ids) -> dict[str, float]:
    start = time.perf_counter()
    latency.prefill(model, ids)
    return {"prefill": (time.perf_counter() - start) * 1000.0}


def synthetic_cache(model, batch: int, context: int):
    """A DynamicCache holding `context` tokens of random keys and values in every layer, as a
    prefill would leave it (decode time does not depend on the values): a batch-8 prefill of
    1024 tokens costs minutes on 2 shared cores and is timed on its own anyway."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    gen = torch.Generator().manual_seed(0)
    for index, block in enumerate(model.model.layers):  # LLaMA-shaped: the KV heads are k_proj's rows
        attention = block.self_attn
        shape = (batch, attention.k_proj.out_features // attention.head_dim, context, attention.head_dim)
        dtype = attention.o_proj.weight.dtype
        cache.update(torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype), index)
    return cache


def real_kv_bytes_per_token(model, prompt: int = 8) -> float:
    """Bytes transformers' own cache holds per token after a real prefill: the check on the prediction."""
    with torch.inference_mode():
        cache, _ = latency.prefill(model, latency.prompt_ids(model, 1, prompt))
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)) / prompt


class Decoder:
    """One model's cache at `context` tokens; each call decodes `tokens` steps from it again."""

    def __init__(self, model, batch: int, context: int, tokens: int):
        self.model, self.context, self.tokens = model, context, tokens
        self.cache = synthetic_cache(model, batch, context)
        self.first = latency.prompt_ids(model, batch, 1, seed=1)

    def __call__(self) -> dict[str, float]:
        # Back to the context (crop takes the count to drop, negative): every run decodes the same positions.
        self.cache.crop(self.context - self.cache.get_seq_length())
        start = time.perf_counter()
        latency.decode(self.model, self.cache, self.first, self.tokens)
        return {"decode": (time.perf_counter() - start) * 1000.0}


def bench_batch(
    models: dict,
    batch: int,
    context: int,
    tokens: int,
    threads: int,
    repeats: int,
    prefill_repeats: int,
    warmup: int,
    measure_prefill: bool = True,
) -> dict:
    predicted = serving.decode_prediction(
        models["baseline"], models["pruned"], serving.Generation(batch, context, tokens)
    )
    ids = {name: latency.prompt_ids(model, batch, context) for name, model in models.items()}
    torch.set_num_threads(threads)
    decoders = {name: Decoder(model, batch, context, tokens) for name, model in models.items()}
    timed_decode = latency.measure_runs(decoders, repeats, warmup, threads)
    decode_ms = {name: t["decode"] for name, t in timed_decode.items()}
    prefill_ms = None
    if measure_prefill:
        prefill_runs = {name: partial(_prefill_ms, model, ids[name]) for name, model in models.items()}
        timed_prefill = latency.measure_runs(prefill_runs, prefill_repeats, min(warmup, 1), threads)
        prefill_ms = {name: t["prefill"] for name, t in timed_prefill.items()}
    kv = serving.kv_section(models["baseline"], models["pruned"])
    row = {
        "batch": batch,
        "context": context,
        "tokens": tokens,
        "threads": threads,
        "repeats": repeats,
        "prefill_repeats": prefill_repeats,
        "warmup": warmup,
        "kv_bytes_per_token": {"baseline": kv["baseline"]["total"], "pruned": kv["pruned"]["total"]},
        "kv_ratio": kv["ratio"],
        "kv_measured": {name: real_kv_bytes_per_token(model) for name, model in models.items()},
        "prefill_ms": prefill_ms and {name: lat.to_dict() for name, lat in prefill_ms.items()},
        "decode_ms": {name: lat.to_dict() for name, lat in decode_ms.items()},
        "decode_tokens_per_s": {name: batch * tokens * 1000.0 / lat.median_ms for name, lat in decode_ms.items()},
        "predicted_prefill": predicted["predicted_prefill_speedup"],
        "predicted_decode": predicted["predicted_decode_speedup"],
        "decode_flops_speedup": predicted["decode_flops_speedup"],
        "measured_prefill": prefill_ms and prefill_ms["baseline"].median_ms / prefill_ms["pruned"].median_ms,
        "measured_decode": decode_ms["baseline"].median_ms / decode_ms["pruned"].median_ms,
        "costs": {name: predicted[name] for name in ("baseline", "pruned")},
    }
    print(markdown_row(row), file=sys.stderr, flush=True)
    return row


def decode_rows(
    quick: bool,
    threads: int = 2,
    repeats: int = 5,
    prefill_repeats: int = 3,
    warmup: int = 1,
    layers: int = 4,
    context: int = 1024,
    tokens: int = 16,
    batches: tuple[int, ...] = (1, 8),
    prefill_batches: tuple[int, ...] | None = None,
) -> dict:
    """`prefill_batches`: the batches whose prefill is timed too (default: all of `batches`)."""
    torch.manual_seed(0)
    if quick:
        baseline, layers, context, tokens, batches = llama_shaped(1, 8, 100), 1, 32, 4, (1, 2)
        name = "tiny LLaMA shape (128d, 16q/4kv heads), 1 layer"
    else:
        baseline = llama_shaped(layers)
        name = f"LLaMA shape (1024d, 16q/4kv heads, head_dim 64, vocab 32000), {layers} layers, fp32"
    models = {"baseline": baseline, "pruned": remove_fraction(baseline, 0.5)}
    print(HEADER, file=sys.stderr)
    timed = batches if prefill_batches is None else prefill_batches
    rows = [
        bench_batch(models, b, context, tokens, threads, repeats, prefill_repeats, warmup, b in timed) for b in batches
    ]
    return {"model": name, "removed": "2 of 4 KV groups (8 of 16 query heads) in every layer", "rows": rows}


def markdown_row(r: dict) -> str:
    kv, pf, tps, real = r["kv_bytes_per_token"], r["prefill_ms"], r["decode_tokens_per_s"], r["kv_measured"]
    return (
        f"| {r['batch']} | {kv['baseline']:,} → {kv['pruned']:,} ({real['baseline']:,.0f} → {real['pruned']:,.0f}), "
        f"-{1 - r['kv_ratio']:.0%} | "
        + (
            f"{pf['baseline']['median_ms']:.0f} / {pf['pruned']['median_ms']:.0f} | "
            f"{r['predicted_prefill']:.2f}x / **{r['measured_prefill']:.2f}x** | "
            if pf
            else f"not timed | {r['predicted_prefill']:.2f}x / not timed | "
        )
        + f"{tps['baseline']:.1f} / {tps['pruned']:.1f} | "
        f"{r['predicted_decode']:.2f}x / **{r['measured_decode']:.2f}x** | {r['decode_flops_speedup']:.2f}x |"
    )


def markdown(result: dict) -> list[str]:
    first = result["rows"][0]
    return [
        f"{result['model']}; {result['removed']}. Context {first['context']} tokens: prefill = one forward over a "
        f"{first['context']}-token prompt; decode = {first['tokens']} steps after a {first['context']}-token KV cache; "
        f"{first['threads']} threads; medians of {first['repeats']} interleaved decode runs and "
        f"{first['prefill_repeats']} interleaved prefill runs after warm-up.",
        "",
        HEADER,
        *map(markdown_row, result["rows"]),
        "",
    ]


def main(argv: list[str] | None = None) -> int:

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny LLaMA: seconds, the same code path")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="timed decode runs per model")
    parser.add_argument("--prefill-repeats", type=int, default=2, help="timed prefill runs per model")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--prefill-batches", help="batches whose prefill is timed too (default: every batch)")
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    args = parser.parse_args(argv)
    prefill_batches = tuple(int(b) for b in args.prefill_batches.split(",")) if args.prefill_batches else None
    result = decode_rows(
        args.quick,
        args.threads,
        args.repeats,
        args.prefill_repeats,
        args.warmup,
        args.layers,
        args.context,
        args.tokens,
        tuple(int(b) for b in args.batches.split(",")),
        prefill_batches,
    )
    print("\n".join(markdown(result)))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
