"""lstsq compensation: the streaming algorithm vs the earlier whole-model one, side by side.

A random-weight LLaMA built from a config (no download), a head removed in every layer,
the same calibration batches; the two algorithms run interleaved (old, new, new, old, ...)
and the medians are compared. Also counts completed block forwards and checks that both
give the same weights. Prints a Markdown section for BENCHMARKS.md.

    OMP_NUM_THREADS=2 python -m scripts.benchmarks.compensation --layers 16 --repeats 3
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import transformers as T

from headprune_cli.model.arch import adapter_for
from headprune_cli.stages.prune.compensation import compensate
from tests.support.compensation_reference import compensate_old  # the earlier algorithm, kept for tests


def build(layers: int, hidden: int) -> torch.nn.Module:
    torch.manual_seed(0)
    config = T.LlamaConfig(
        vocab_size=1000,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=8,
        intermediate_size=2 * hidden,
        pad_token_id=0,
    )
    return T.LlamaForCausalLM(config).eval()


def calibration(batches: int, batch: int, seq: int) -> list[dict]:
    gen = torch.Generator().manual_seed(1)
    ids = [torch.randint(1, 1000, (batch, seq), generator=gen) for _ in range(batches)]
    return [{"input_ids": x, "attention_mask": torch.ones_like(x)} for x in ids]


def run(fn, base, remove, data) -> tuple[float, int, torch.nn.Module]:
    model = copy.deepcopy(base)
    count = [0]
    hooks = [
        b.register_forward_hook(lambda *_: count.__setitem__(0, count[0] + 1))
        for b in adapter_for(model).layer_list(model)
    ]
    start = time.perf_counter()
    fn(model, remove, [], data, method="lstsq")
    seconds = time.perf_counter() - start
    for h in hooks:
        h.remove()
    return seconds, count[0], model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(2)
    base = build(args.layers, args.hidden)
    data = calibration(args.batches, 8, 64)
    remove = {layer: [0, 5] for layer in range(args.layers)}
    times = {"old": [], "new": []}
    for repeat in range(args.repeats):
        for name in ("old", "new") if repeat % 2 == 0 else ("new", "old"):
            seconds, blocks, model = run(compensate_old if name == "old" else compensate, base, remove, data)
            times[name].append(seconds)
            if name == "old":
                old_blocks, old_model = blocks, model
            else:
                new_blocks, new_model = blocks, model
    diff = max((a - b).abs().max().item() for a, b in zip(old_model.parameters(), new_model.parameters()))
    old_s, new_s = statistics.median(times["old"]), statistics.median(times["new"])
    print("## Compensation (lstsq): streaming vs whole-model\n")
    print(
        f"Random-weight LLaMA, {args.layers} layers, hidden {args.hidden}, 8 heads (2 removed in every layer), "
        f"{args.batches} batches of 8x64 tokens, 2 threads; medians of {args.repeats} interleaved runs. "
        f"Command: `OMP_NUM_THREADS=2 python -m scripts.benchmarks.compensation --layers {args.layers} "
        f"--hidden {args.hidden} --batches {args.batches} --repeats {args.repeats}`.\n"
    )
    print("| algorithm | block forwards | seconds (median) |")
    print("|---|---:|---:|")
    print(f"| whole-model per pruned layer (before) | {old_blocks} | {old_s:.2f} |")
    print(f"| streaming, block by block (now) | {new_blocks} | {new_s:.2f} |")
    print(
        f"\nRatio old/new: {old_blocks / new_blocks:.2f}x block forwards, {old_s / new_s:.2f}x wall time; "
        f"largest weight difference {diff:.1e}."
    )


if __name__ == "__main__":
    main()
