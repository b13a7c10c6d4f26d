"""Peak memory of `finetune` (and `learn`) on a 1.1 B-parameter bf16 LLaMA: full AdamW, LoRA, LoRA + recompute, FSDP.

Builds the same random-weight LLaMA as scripts/benchmarks/large.py (TinyLlama's shape: 22
layers, hidden 2048, 16 query / 4 KV heads, intermediate 5632, bf16) and imports it, then
runs `headprune finetune --steps 1` once per variant, each in a fresh process, and reads
that process's peak RSS (wait4's ru_maxrss): load, one optimizer step (forward, backward,
AdamW) and the atomic write of the output; the FSDP variant runs under torchrun with 2
processes (gloo) and reports the largest one. Ratios are against the checkpoint's size; the
goal for LoRA + recompute is <= 1.6x.

    OMP_NUM_THREADS=2 nice python -m scripts.benchmarks.finetune_memory [--work /tmp/bench_ft] [--json out.json]
(--layers 2 --hidden 256 --intermediate 512 --vocab 1000 gives a quick smoke run.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from scripts.benchmarks.large import ROOT, make_model, measure
from scripts.benchmarks.shape import add_llama_shape

# One gate step, then the closing, the cut and the write (a tolerance of 1: one step cannot reach the target).
GATES = ["--target-flops", "0.5", "--gate-ffn", "--gate-layers", "--gate-tolerance", "1"]
VARIANTS = {
    "full AdamW": ["--no-recompute"],
    "full AdamW + recompute": ["--recompute"],
    "LoRA r=8": ["--lora", "--no-recompute"],
    "LoRA r=8 + recompute": ["--lora", "--recompute"],
    "learned gates, heads + FFN + layers": [*GATES, "--no-recompute"],
    # The same gates beside LoRA adapters, the base frozen (recomputation on by default at this size).
    "learned gates + LoRA r=8": [*GATES, "--lora"],
    # The real use: distilled from the unpruned model itself (streamed), with layer distillation.
    "learned gates + LoRA r=8, --teacher auto": [*GATES, "--lora", "--teacher", "auto"],
}
COMMAND = {name: "learn" for name in VARIANTS if name.startswith("learned")}  # the others are `finetune`
# Under torchrun --nproc-per-node 2: wait4's ru_maxrss is the largest process of the tree,
# so the figure is per process.
SHARDED = {"FSDP full AdamW, 2 processes": ["--fsdp", "--no-recompute"]}
GOAL = {"LoRA r=8 + recompute": 1.6, "learned gates + LoRA r=8": 1.8}


def _tensor_set(path: Path, vocab: int, rows: int, seq: int) -> None:
    import torch
    from safetensors.torch import save_file

    ids = torch.randint(4, vocab, (rows, seq), generator=torch.Generator().manual_seed(0))
    save_file({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, str(path))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench_ft"))
    add_llama_shape(parser)
    parser.add_argument("--rows", type=int, default=2, help="rows in the one training batch")
    parser.add_argument("--seq", type=int, default=64, help="tokens per row")
    parser.add_argument(
        "--only", action="append", choices=sorted({**VARIANTS, **SHARDED}), help="run only these variants"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    work = args.work
    ckpt = work / "model.safetensors"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    hp = [sys.executable, "-m", "headprune_cli"]
    if not ckpt.is_file():  # the model is reused between runs of the script
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        make_model(args, work / "hf")
        measure("headprune import", hp + ["import", str(work / "hf"), "-o", str(ckpt)], env)
        shutil.rmtree(work / "hf")
    data = work / "ids.safetensors"
    _tensor_set(data, args.vocab, args.rows, args.seq)
    size = ckpt.stat().st_size
    common = ["--data", str(data), "--steps", "1", "--batch-size", str(args.rows), "--max-length", str(args.seq)]
    results = []
    for name, flags in VARIANTS.items():
        if args.only and name not in args.only:
            continue
        out = work / "out.safetensors"
        command = COMMAND.get(name, "finetune")
        result = measure(name, hp + [command, str(ckpt), *common, *flags, "-o", str(out), "--force"], env)
        result["of_checkpoint"] = round(result["peak_rss_bytes"] / size, 3)
        result["goal"] = GOAL.get(name)
        results.append(result)
        print(f"{name:28s} {result['of_checkpoint']:.3f}x the checkpoint", file=sys.stderr)
    torchrun = [
        str(Path(sys.executable).parent / "torchrun"),
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "headprune_cli",
    ]
    for name, flags in SHARDED.items():
        if args.only and name not in args.only:
            continue
        out = work / "out.safetensors"
        result = measure(name, torchrun + ["finetune", str(ckpt), *common, *flags, "-o", str(out), "--force"], env)
        result["of_checkpoint"] = round(result["peak_rss_bytes"] / size, 3)
        results.append(result)
        print(f"{name:28s} {result['of_checkpoint']:.3f}x the checkpoint (per process)", file=sys.stderr)
    summary = {"checkpoint_bytes": size, "rows": args.rows, "seq": args.seq, "results": results}
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
