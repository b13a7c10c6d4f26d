"""Prefill and decode of the 1.1 B LLaMA shape in llama.cpp: unpruned vs uniform vs non-uniform cuts.

TinyLlama's shape (22 layers, hidden 2048, 32 query / 4 KV heads of 64, SwiGLU 5632), random bf16
weights (speed does not depend on what the weights learned) and a byte-level BPE trained on --text
(llama.cpp needs the tokenizer inside the file; the vocabulary is the BPE's size, up to 32,000).
Two cuts by headprune's own surgery, each keeping half of the KV groups and half of the FFN
neurons over the model:
- uniform: every layer keeps 2 of 4 KV groups and 2816 of 5632 neurons (`llama` in the file);
- non-uniform: layers keep 1, 2, 3, 2, ... KV groups and 1408, 2816, 4224, 2816, ... neurons,
  the same totals (`deci`).
Each is exported by the CLI (`export --gguf --gguf-type T`) and timed in llama.cpp's environment
(scripts/engines/llama_cpp.sh) in a process of its own: a --prompt-token prefill in one batch,
then --decode tokens one at a time, medians of --repeats. No perplexity: the weights are random.

Usage: python -m scripts.benchmarks.gguf_large_decode --text FILE --work DIR [--types f16,q4_0]
Prints a Markdown table on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_ENGINE = ROOT / ".engines" / "llama-cpp" / "bin" / "python"
GROUPS, QUERIES_PER_GROUP, FFN = 4, 8, 5632
LAYERS = 22
# Per-layer KV groups kept by the non-uniform cut: mean 2 over the 22 layers, as the uniform cut.
NON_UNIFORM_GROUPS = [1, 2, 3, 2] * 5 + [1, 3]
FFN_KEPT = {1: 1408, 2: 2816, 3: 4224}  # multiples of 32, so q4_0 quantizes every FFN matrix

SPEED = r"""
import json, sys, time
from llama_cpp import Llama

path, threads, prompt_len, decode_n, repeats = sys.argv[1], *map(int, sys.argv[2:6])
llm = Llama(model_path=path, n_ctx=prompt_len + decode_n + 8, n_batch=prompt_len, n_threads=threads, verbose=False)
ids = [100 + (7 * i) % 3000 for i in range(prompt_len + decode_n)]  # any tokens: a step costs the same
prefill, decode = [], []
for _ in range(repeats + 1):  # the first pass warms up and is dropped
    llm.reset()
    start = time.perf_counter()
    llm.eval(ids[:prompt_len])
    mid = time.perf_counter()
    for token in ids[prompt_len:]:
        llm.eval([token])
    end = time.perf_counter()
    prefill.append(prompt_len / (mid - start))
    decode.append(decode_n / (end - mid))
print(json.dumps({"prefill_tok_s": prefill[1:], "decode_tok_s": decode[1:]}))
"""


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def tokenizer(text: Path, lines: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=32000,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(text.read_text(encoding="utf-8").splitlines()[:lines], trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tok


def unpruned(tok):
    import torch
    import transformers as T

    from headprune_cli import info_of

    torch.manual_seed(0)
    config = T.LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=2048,
        num_hidden_layers=LAYERS,
        num_attention_heads=GROUPS * QUERIES_PER_GROUP,
        num_key_value_heads=GROUPS,
        intermediate_size=FFN,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    model = T.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    info = info_of(model)
    info.tokenizer = tok.to_str()
    info.tokenizer_config = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
    return model


def plan(groups_kept: list[int]) -> tuple[dict, list, dict]:
    """Remove the last KV groups (their query heads) and the last FFN neurons of each layer."""
    heads = {
        layer: list(range(kept * QUERIES_PER_GROUP, GROUPS * QUERIES_PER_GROUP))
        for layer, kept in enumerate(groups_kept)
    }
    ffn = {layer: list(range(FFN_KEPT[kept], FFN)) for layer, kept in enumerate(groups_kept)}
    return heads, [], ffn


def checkpoints(work: Path, text: Path, lines: int) -> dict[str, Path]:
    import headprune_cli
    from headprune_cli import apply_plan

    paths = {name: work / f"{name}.safetensors" for name in ("unpruned", "uniform", "non-uniform")}
    if all(p.is_file() for p in paths.values()):
        return paths
    tok = tokenizer(text, lines)
    log(f"tokenizer: {tok.get_vocab_size()} tokens")
    for name, kept in (("unpruned", None), ("uniform", [2] * LAYERS), ("non-uniform", NON_UNIFORM_GROUPS)):
        model = unpruned(tok)  # the same seed: the cuts are of the same weights
        if kept is not None:
            apply_plan(model, *plan(kept))
        headprune_cli.save(model, paths[name])
        log(f"{name}: {sum(p.numel() for p in model.parameters()):,} parameters")
        del model
    return paths


def export(checkpoint: Path, out: Path, kind: str) -> None:
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "headprune_cli", "export", str(checkpoint), "--gguf", str(out)]
    done = subprocess.run([*command, "--gguf-type", kind, "--force"], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"export {checkpoint.name} {kind} failed: {done.stderr.strip()[-600:]}")


def speed(engine: str, gguf: Path, args) -> dict:
    argv = [str(gguf), str(args.threads), str(args.prompt), str(args.decode), str(args.repeats)]
    done = subprocess.run([engine, "-I", "-c", SPEED, *argv], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"llama.cpp on {gguf.name} failed (rc {done.returncode}): {done.stderr.strip()[-600:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", type=Path, required=True, help="text to train the BPE on (one document a line)")
    parser.add_argument("--lines", type=int, default=20000, help="lines of --text the BPE trains on")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--types", default="f16,q4_0")
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--decode", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--engine-python", default=str(DEFAULT_ENGINE))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    paths = checkpoints(args.work, args.text, args.lines)
    rows = []
    for kind in args.types.split(","):
        for name, checkpoint in paths.items():
            gguf = args.work / f"{name}-{kind}.gguf"
            export(checkpoint, gguf, kind)
            started = time.perf_counter()
            got = speed(args.engine_python, gguf, args)
            row = {"model": name, "type": kind, "bytes": gguf.stat().st_size, **got}
            row["prefill"] = statistics.median(got["prefill_tok_s"])
            row["decode"] = statistics.median(got["decode_tok_s"])
            rows.append(row)
            log(
                f"{name:12s} {kind:5s} {row['bytes'] / 1e9:5.2f} GB  prefill {row['prefill']:7.1f} tok/s  "
                f"decode {row['decode']:6.2f} tok/s  ({time.perf_counter() - started:.0f} s)"
            )
            gguf.unlink()  # gigabytes each: only the numbers are kept
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1))
    print("| cut | type | file GB | prefill tok/s | decode tok/s | prefill vs unpruned | decode vs unpruned |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for row in rows:
        base = next(r for r in rows if r["model"] == "unpruned" and r["type"] == row["type"])
        print(
            f"| {row['model']} | {row['type']} | {row['bytes'] / 1e9:.2f} | {row['prefill']:.1f} | "
            f"{row['decode']:.2f} | {row['prefill'] / base['prefill']:.2f}x | {row['decode'] / base['decode']:.2f}x |"
        )


if __name__ == "__main__":
    main()
