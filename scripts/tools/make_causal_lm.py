"""Make the small LLaMA-family causal LM with grouped-query attention used by configs/causal-lm.yaml.

Built from a config (4 layers, 8 query heads sharing 2 key/value heads, hidden 64), with
a word-level tokenizer over a text file, then trained briefly on that text so that its
perplexity means something and pruning has something to lose. Deterministic (seeded,
1 thread). Takes about a minute on 2 cores with the default 300 steps.

Usage: python scripts/tools/make_causal_lm.py [--out out/causal-lm/model.safetensors]
       [--text examples/minilm_text.txt] [--steps 300]
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, normalizers
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import LlamaConfig, LlamaForCausalLM

import headprune_cli
from headprune_cli import info_of

ROOT = Path(__file__).resolve().parents[2]
SPECIAL = ["[PAD]", "[UNK]", "[BOS]"]


def make_tokenizer(lines: list[str]) -> Tokenizer:
    probe = Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    probe.normalizer = normalizers.Lowercase()
    probe.pre_tokenizer = Whitespace()
    words = sorted({w for line in lines for w, _ in probe.pre_tokenizer.pre_tokenize_str(line.lower())})
    tokenizer = Tokenizer(WordLevel({w: i for i, w in enumerate(SPECIAL + words)}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = Whitespace()
    return tokenizer


def build(vocab_size: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,  # GQA: groups of 4 query heads share one K/V head
        head_dim=8,
        intermediate_size=128,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def train(model, tokenizer, lines: list[str], steps: int, batch: int, seed: int) -> None:
    encoded = [tokenizer.encode(line).ids[:64] for line in lines if line.strip()]
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    model.train()
    start = time.perf_counter()
    for step in range(1, steps + 1):
        rows = rng.sample(encoded, min(batch, len(encoded)))
        width = max(len(r) for r in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
        labels = ids.masked_fill(mask == 0, -100)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == steps:
            print(f"step {step:4d}  loss {loss.item():.3f}  {time.perf_counter() - start:.0f}s", flush=True)
    model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "causal-lm" / "model.safetensors")
    parser.add_argument("--text", type=Path, default=ROOT / "examples" / "minilm_text.txt")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    lines = args.text.read_text(encoding="utf-8").splitlines()
    tokenizer = make_tokenizer(lines)
    model = build(tokenizer.get_vocab_size())
    if args.steps > 0:
        train(model, tokenizer, lines, args.steps, args.batch, args.seed)
    info = info_of(model)
    info.tokenizer = tokenizer.to_str()
    info.tokenizer_config = {"pad_token": "[PAD]", "unk_token": "[UNK]", "bos_token": "[BOS]"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    sha = headprune_cli.save(model, args.out, overwrite=True)  # a generator: reruns replace its own output
    print(f"wrote {args.out} (sha256 {sha[:12]}; vocab {tokenizer.get_vocab_size()})")


if __name__ == "__main__":
    main()
