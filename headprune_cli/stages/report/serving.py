"""What a pruned causal LM costs to serve: KV-cache bytes per token, prefill and decode speed.

Removing whole key/value groups shrinks the KV cache, and decode reads that cache at
every step, so a forward pass with `use_cache=False` hides the main gain. The report
therefore adds, for causal LMs only:
- `kv_cache`: bytes per token per layer and in total, baseline and pruned (cost.kv_cache_bytes);
- `cost.decode`: the predictions: prefill from FLOPs (cost.prefill_flops), decode from
  the bytes one generated token reads (cost.decode_cost: weights once per step, shared
  by the batch, plus the sequence's KV cache);
- `measured.decode`: prefill latency and decode tokens/s, timed interleaved
  (latency.measure_generation) beside those predictions.
Encoders have no KV cache and no decode: the three are null.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from headprune_cli.errors import UsageError
from headprune_cli.model.cost import decode_cost, kv_cache_bytes, prefill_flops
from headprune_cli.model.layout import info_of
from headprune_cli.stages.model_latency import max_sequence, measure_generation

DEFAULT_PROMPT = 128
DEFAULT_TOKENS = 32
DEFAULT_BATCH = 1
DECODE_MODEL = (
    "decode: bytes read per generated token (weights once per step / batch + KV cache x context); prefill: FLOPs"
)


@dataclass
class Generation:
    batch: int
    prompt: int
    tokens: int


def kv_section(baseline: nn.Module, pruned: nn.Module) -> dict | None:
    """KV-cache bytes per token before and after, and the reduction; None for encoders."""
    before, after = kv_cache_bytes(baseline), kv_cache_bytes(pruned)
    if before is None or after is None:
        return None
    ratio = after["total"] / before["total"]
    return {
        "dtype": after["dtype"],
        "baseline": {"per_layer": before["per_layer"], "total": before["total"]},
        "pruned": {"per_layer": after["per_layer"], "total": after["total"]},
        "ratio": ratio,
        "reduction": 1.0 - ratio,
    }


def generation(model: nn.Module, batch: int, prompt: int | None, tokens: int) -> Generation | None:
    """The decode setting to measure, or None (an encoder, or --decode-tokens 0).

    The default prompt shrinks to fit the model's positions; an explicit one that does
    not fit is a usage error."""
    if info_of(model).task != "causal-lm" or tokens == 0:
        return None
    limit = max_sequence(model)
    if prompt is None:
        prompt = DEFAULT_PROMPT if limit is None else min(DEFAULT_PROMPT, limit - tokens)
        if prompt < 1:
            raise UsageError(f"--decode-tokens {tokens} leaves no room for a prompt in the model's {limit} positions")
    elif limit is not None and prompt + tokens > limit:
        raise UsageError(
            f"--decode-prompt {prompt} + --decode-tokens {tokens} exceed the model's maximum of {limit} positions"
        )
    return Generation(batch, prompt, tokens)


def decode_prediction(baseline: nn.Module, pruned: nn.Module, gen: Generation) -> dict:
    """Costs of both models and the predicted prefill and decode speedups."""
    sides = {}
    for name, model in (("baseline", baseline), ("pruned", pruned)):
        sides[name] = {
            "prefill_flops": prefill_flops(model, gen.prompt),
            **decode_cost(model, gen.prompt, gen.tokens, gen.batch),
        }
    base, new = sides["baseline"], sides["pruned"]
    return {
        "batch": gen.batch,
        "prompt": gen.prompt,
        "tokens": gen.tokens,
        "model": DECODE_MODEL,
        **sides,
        "predicted_prefill_speedup": base["prefill_flops"] / new["prefill_flops"],
        "predicted_decode_speedup": base["bytes_per_token"] / new["bytes_per_token"],
        "decode_flops_speedup": base["flops_per_token"] / new["flops_per_token"],
    }


def measure_decode(
    baseline: nn.Module, pruned: nn.Module, predicted: dict, threads: int, repeats: int, warmup: int
) -> dict:
    """Prefill ms and decode tokens/s of both models, interleaved, beside the predictions."""
    batch, prompt, tokens = predicted["batch"], predicted["prompt"], predicted["tokens"]
    timed = measure_generation(
        {"baseline": baseline, "pruned": pruned}, batch, prompt, tokens, repeats, warmup, threads
    )
    prefill = {name: phases["prefill"] for name, phases in timed.items()}
    decode = {name: phases["decode"] for name, phases in timed.items()}
    prefill_speedup = prefill["baseline"].median_ms / prefill["pruned"].median_ms
    decode_speedup = decode["baseline"].median_ms / decode["pruned"].median_ms
    return {
        "batch": batch,
        "prompt": prompt,
        "tokens": tokens,
        "threads": threads,
        "repeats": repeats,
        "warmup": warmup,
        "order": "interleaved, alternating",
        "prefill_ms": {name: lat.to_dict() for name, lat in prefill.items()},
        "decode_ms": {name: lat.to_dict() for name, lat in decode.items()},
        "decode_tokens_per_s": {name: batch * tokens * 1000.0 / lat.median_ms for name, lat in decode.items()},
        "prefill_speedup": prefill_speedup,
        "decode_speedup": decode_speedup,
        "prefill_vs_predicted": prefill_speedup / predicted["predicted_prefill_speedup"],
        "decode_vs_predicted": decode_speedup / predicted["predicted_decode_speedup"],
    }
